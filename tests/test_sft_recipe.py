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


def test_every_field_is_read_from_its_own_key(tmp_path):
    """A recipe with no default left: each Recipe field comes from its own key."""
    raw = _minimal(tmp_path)
    raw.update(data={"train": raw["data"]["train"], "chat_template": "{{ m }}", "max_length": 64},
               masking={"loss_on": "all"}, budget={"supervised_tokens": 900}, seeds=[3, 1], precision="bf16",
               optimizer={"lr": 2e-3, "micro_batch_size": 2, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
                          "warmup_steps": 4, "schedule": "linear", "min_lr_ratio": 0.2, "clip": {"max_norm": 2.5},
                          "grad_accum": 3},
               method={"r": 4, "alpha": 8, "dropout": 0.25, "target_modules": ["q_proj", "v_proj"]},
               eval={"every": 0, "max_items": 7}, checkpointing={"every": 5, "keep": 3}, batch_seeds=False,
               diagnostics={"spike_window": 11, "spike_threshold": 0.3, "spike_min_history": 4, "spike_z": 2.5,
                            "nonfinite": "skip"})
    r = recipe_from_dict(raw, source="my.yaml")
    assert (r.name, r.train_path, r.chat_template, r.max_length, r.loss_on) == (
        "t", Path(raw["data"]["train"]).resolve(), "{{ m }}", 64, "all")
    assert (r.optimizer_steps, r.supervised_tokens, r.seeds, r.precision, r.source) == (None, 900, (3, 1), "bf16",
                                                                                          "my.yaml")
    o = r.optimizer
    assert (o.lr, o.betas, o.eps, o.weight_decay, o.warmup_steps, o.schedule, o.min_lr_ratio, o.clip_rule,
            o.max_norm, o.micro_batch_size, o.grad_accum) == (2e-3, (0.8, 0.95), 1e-6, 0.1, 4, "linear", 0.2,
                                                              "global_norm", 2.5, 2, 3)
    assert r.method == type(r.method)("lora", r=4, alpha=8.0, dropout=0.25, target_modules=("q_proj", "v_proj"))
    assert (r.eval_every, r.eval_max_items, r.checkpoint_every, r.checkpoint_keep) == (0, 7, 5, 3)
    assert (r.spike_window, r.spike_threshold, r.spike_min_history, r.spike_z, r.nonfinite) == (11, 0.3, 4, 2.5, "skip")
    assert r.batch_seeds is False and "batch_seeds" not in r.raw and r.transfer == {} and r.raw["transfer"] == {}
    assert recipe_from_dict(dict(raw, transfer=None)).sha256 == r.sha256  # transfer: null reads as {}
    assert recipe_from_dict(dict(raw, method={"type": "full"})).method == type(r.method)("full")
    assert recipe_from_dict(dict(raw, method={"target_modules": "all-linear"})).method.target_modules == ("all-linear",)


def _set(path: str, value):
    def mutate(r):
        *parents, last = path.split(".")
        d = r
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return mutate


def _all(*mutations):
    def mutate(r):
        for m in mutations:
            m(r)
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_set("batch_seeds", "yes"), "batch_seeds: expected true, false or null (the default: true for LoRA), got 'yes'."),
    (_all(_set("name", ""), _set("data.train", "")), "name: expected a non-empty string."),
    (_all(_set("data.train", 3), _set("data.max_length", 1)),
     "data.train: required: path to a JSONL, parquet or saved datasets folder."),
    (_set("data.chat_template", 3), "data.chat_template: expected a Jinja template string or null."),
    (_all(_set("data.max_length", 1), _set("masking.loss_on", "x")), "data.max_length: must be >= 2, got 1."),
    (_set("masking.loss_on", "x"), "masking.loss_on: 'x' is not one of response, all."),
    (_all(_set("budget", {}), _set("optimizer.lr", 0)), "budget: give exactly one of optimizer_steps or supervised_tokens."),
    (_set("budget", {"supervised_tokens": 0}), "budget.supervised_tokens: must be >= 1, got 0."),
    (lambda r: r["optimizer"].pop("lr"), "optimizer.lr: required."),
    (_set("optimizer.betas", [0.9]), "optimizer.betas: expected [beta1, beta2], got [0.9]."),
    (_set("optimizer.betas", [0.9, 1.0]), "optimizer.betas: each beta must be < 1."),
    (_all(_set("optimizer.clip", {"max_norm": 0}), _set("optimizer.lr", 0)),
     "optimizer.clip.max_norm: must be > 0, got 0.0."),
    (_all(_set("optimizer.lr", 0), _set("optimizer.eps", 0)), "optimizer.lr: must be > 0, got 0.0."),
    (_all(_set("optimizer.grad_accum", 0), _set("method.type", "qlora")), "optimizer.grad_accum: must be >= 1, got 0."),
    (_all(_set("method.type", "qlora"), _set("seeds", [])), "method.type: 'qlora' is not one of lora, full."),
    (_set("method.target_modules", []), "method.target_modules: expected `all-linear`"),
    (_all(_set("method.r", 0), _set("method.alpha", 0)), "method.r: must be >= 1, got 0."),
    (_set("method.dropout", 1.0), "method.dropout: must be < 1."),
    (_all(_set("seeds", [True]), _set("transfer", [1])), "seeds: expected a non-empty list of integers, got [True]."),
    (_all(_set("transfer", [1]), _set("eval.every", -1)),
     "transfer: expected a mapping (tasks, robustness, heldout, max_new_tokens, ...)."),
    (_all(_set("eval.every", -1), _set("eval.max_items", 0)), "eval.every: must be >= 0, got -1."),
    (_all(_set("eval.max_items", 0), _set("precision", "fp8")), "eval.max_items: must be >= 1, got 0."),
    (_all(_set("diagnostics.spike_z", -1), _set("diagnostics.nonfinite", "x")), "diagnostics.spike_z: must be >= 0.0"),
    (_all(_set("diagnostics.nonfinite", "x"), _set("checkpointing.keep", 0)), "diagnostics.nonfinite: 'x' is not one of"),
    (_all(_set("checkpointing.keep", 0), _set("precision", "fp8")), "checkpointing.keep: must be >= 1, got 0."),
    (_all(_set("precision", "fp8"), _set("data.train", "/nonexistent/sft.jsonl")), "precision: 'fp8' is not one of"),
])
def test_validation_reports_the_first_problem_in_section_order(tmp_path, mutate, message):
    """With several problems the first one in the recipe's section order is reported, whole."""
    raw = _minimal(tmp_path)
    mutate(raw)
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(raw, source="my.yaml")
    assert str(e.value).startswith("my.yaml: " + message), str(e.value)
