"""Recipe loading, validation and key=value overrides (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probeselect.errors import RecipeError
from probeselect.sft.recipe import apply_overrides, load_recipe, recipe_from_dict

REPO = Path(__file__).resolve().parents[1]


def _minimal(tmp_path: Path) -> dict:
    data = tmp_path / "sft.jsonl"
    data.write_text('{"id": "a", "prompt": "q", "response": " r"}\n')
    return {"name": "t", "data": {"train": str(data)}, "budget": {"optimizer_steps": 3},
            "optimizer": {"lr": 1e-3, "micro_batch_size": 2}, "seeds": [0]}


@pytest.mark.parametrize("name", ["pilot.yaml", "confirm.yaml"])
def test_shipped_recipes_validate_and_confirm_is_larger(name):
    r = load_recipe(REPO / "recipes" / name, check_files=False)
    assert r.method.type == "lora" and r.loss_on == "response"
    # tau above the typical pre-clip norm on the toy ladder: clipping engages on <~10% of steps
    assert r.optimizer.effective_batch == 16 and r.optimizer.max_norm == 5.0
    pilot = load_recipe(REPO / "recipes" / "pilot.yaml", check_files=False)
    assert pilot.optimizer_steps == 150
    if name == "confirm.yaml":
        assert r.optimizer_steps == 2 * pilot.optimizer_steps  # "2x the budget" (recipes/confirm.yaml header)
        assert (r.optimizer.lr, r.optimizer.max_norm) == (pilot.optimizer.lr, pilot.optimizer.max_norm)
    assert "probe_items" in (REPO / "recipes" / name).read_text()  # leakage-guard guidance
    text = (REPO / "recipes" / name).read_text()
    assert f"--recipe recipes/{name}" in text.splitlines()[2]  # the header shows the command


def test_defaults_hash_and_overrides(tmp_path):
    raw = _minimal(tmp_path)
    r = recipe_from_dict(raw)
    assert r.optimizer.grad_accum == 1 and r.optimizer.schedule == "cosine" and r.nonfinite == "fail"
    assert r.method.r == 8 and r.spike_window == 201 and r.spike_threshold == pytest.approx(0.1)
    r2 = recipe_from_dict(apply_overrides(raw, ["optimizer.lr=5e-4", "seeds=[1, 2]", "method.type=full"]))
    assert r2.optimizer.lr == pytest.approx(5e-4) and r2.seeds == (1, 2) and r2.method.type == "full"
    assert r2.sha256 != r.sha256 and recipe_from_dict(raw).sha256 == r.sha256
    # the training hash ignores eval/transfer/diagnostic-cadence/checkpointing settings and the seeds list
    r3 = recipe_from_dict(apply_overrides(raw, ["eval.max_items=3", "checkpointing.every=5", "seeds=[4]",
                                                "diagnostics.spike_threshold=0.5", "name=other"]))
    assert r3.sha256 != r.sha256 and r3.train_sha256 == r.train_sha256
    for ov in ("optimizer.lr=5e-4", "budget.optimizer_steps=4", "data.max_length=32", "method.r=4",
               "precision=bf16", "masking.loss_on=all", "diagnostics.nonfinite=skip"):
        assert recipe_from_dict(apply_overrides(raw, [ov])).train_sha256 != r.train_sha256, ov


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.update(optimzer={}), r"unknown top-level key 'optimzer'.*Did you mean \"optimizer\""),
    (lambda r: r["optimizer"].update(lr="fast"), r"optimizer.lr: expected a finite number, got 'fast'"),
    (lambda r: r["optimizer"].update(micro_batch_size=0), r"optimizer.micro_batch_size: must be >= 1"),
    (lambda r: r["optimizer"].update(clip={"rule": "value", "max_norm": 1}), r"clip.rule: 'value' is not one of"),
    (lambda r: r.update(budget={"optimizer_steps": 3, "supervised_tokens": 9}), r"exactly one of"),
    (lambda r: r["data"].update(train="/nonexistent/sft.jsonl"), r"data.train: file not found: /nonexistent"),
    (lambda r: r.update(method={"type": "full", "r": 4}), r"apply to LoRA only"),
    (lambda r: r.update(seeds=[0, 0]), r"duplicate seeds"),
    (lambda r: r.update(eval={"every": 5}), r"needs transfer.heldout"),
    (lambda r: r.pop("budget"), r"missing required key 'budget'"),
])
def test_bad_recipes_name_the_problem(tmp_path, mutate, match):
    raw = _minimal(tmp_path)
    mutate(raw)
    with pytest.raises(RecipeError, match=match):
        recipe_from_dict(raw, source="my.yaml")


def test_bad_override_and_duplicate_yaml_key(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown recipe key 'optimiser'"):
        apply_overrides({}, ["optimiser.lr=1"])
    with pytest.raises(RecipeError, match="expected key=value"):
        apply_overrides({}, ["optimizer.lr"])
    f = tmp_path / "dup.yaml"
    f.write_text("name: a\nname: b\n")
    with pytest.raises(RecipeError, match=r"dup.yaml: invalid YAML.*duplicate key 'name'"):
        load_recipe(f)
