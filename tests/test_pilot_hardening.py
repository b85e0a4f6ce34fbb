"""Hardening of the pilot and selection stages (issue 25): nonfinite values, one writer per
pilot folder, sticky POST-HOC, truthful manifests, tokenizer vs embeddings, literal path
overrides, chat roles and noise-relative loss spikes. Tiny budgets throughout."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _selection_fakes import PLAN, make_score_run, write_fake_pilot
from _sft_helpers import small_recipe

from probeselect._io import RunLock, sha256_file
from probeselect.errors import (NonfiniteGradientError, PostHocError, ResumeError, SelectionError, SFTDataError,
                                TokenizerMismatchError, UsageError)
from probeselect.pilot import run_pilot


def _nan_copy(src: Path, dest: Path) -> Path:
    """A copy of checkpoint ``src`` with one NaN weight (an attention projection of layer 0)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    f = dest / "model.safetensors"
    sd = load_file(str(f))
    name = next(k for k in sd if "q_proj" in k)
    sd[name][0, 0] = float("nan")
    save_file(sd, str(f), metadata={"format": "pt"})
    return dest


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): (sha256_file(p) if p.is_file() else "dir") for p in sorted(folder.rglob("*"))}


# -- 1. nonfinite is never a number ----------------------------------------------------------------------


def test_all_steps_skipped_is_a_failed_run_naming_the_broken_base(tiny_ladder, ladder_checkpoints, tmp_path):
    base = _nan_copy(ladder_checkpoints[-1], tmp_path / "checkpoint-99")
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3}, diagnostics={"nonfinite": "skip"})
    out = tmp_path / "pilot"
    with pytest.raises(NonfiniteGradientError, match="base's own forward pass is nonfinite before any update.*"
                                                     "hold NaN/inf"):
        run_pilot([base], recipe, out, progress=False, device="cpu")
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "failed" and "NonfiniteGradientError" in man["error"]
    assert not (out / "transfer.csv").exists()  # no table holds the broken base's numbers


def test_fail_fast_says_the_base_forward_is_nonfinite(tiny_ladder, ladder_checkpoints, tmp_path):
    base = _nan_copy(ladder_checkpoints[-1], tmp_path / "checkpoint-99")
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3})
    with pytest.raises(NonfiniteGradientError, match="optimizer step 1: the base's own forward pass is nonfinite "
                                                     "before any update.*The batch is not the cause"):
        run_pilot([base], recipe, tmp_path / "pilot", progress=False, device="cpu")


def test_skip_mode_with_every_step_nonfinite_is_failed(tiny_ladder, ladder_checkpoints, tmp_path, monkeypatch):
    """Finite weights, but every step nonfinite: after all steps are skipped the run is failed, not complete."""
    import probeselect.sft.loop as loop

    real = loop.microbatch_nll
    monkeypatch.setattr(loop, "microbatch_nll", lambda model, batch: real(model, batch) * float("nan"))
    monkeypatch.setattr(loop, "_base_forward_nonfinite", lambda *a: (False, "finite weights"))
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3}, diagnostics={"nonfinite": "skip"})
    out = tmp_path / "pilot"
    with pytest.raises(NonfiniteGradientError, match="all 3 optimizer steps were nonfinite and skipped"):
        run_pilot([ladder_checkpoints[-1]], recipe, out, progress=False, device="cpu")
    lineage = json.loads((out / ladder_checkpoints[-1].name / "seed0" / "lineage.json").read_text())
    assert lineage["segments"][-1]["status"] == "failed"
    assert json.loads((out / "manifest.json").read_text())["status"] == "failed"


def test_a_nan_item_makes_the_metric_nan_not_a_smaller_number():
    from probeselect.transfer import summarize_transfer

    items = pd.DataFrame({"metric": ["heldout_loss"] * 3, "value": [2.0, float("nan"), 3.0],
                          "weight": [1.0, 1.0, 1.0]})
    v = summarize_transfer(items).set_index("metric").loc["heldout_loss", "value"]
    assert np.isnan(v)  # was (2 + 0 + 3) / 3 = 1.67: a broken run looked better
    items["value"] = [2.0, float("inf"), 3.0]
    assert np.isinf(summarize_transfer(items)["value"].iloc[0])


def test_select_refuses_nonfinite_transfer_values(tmp_path):
    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    from probeselect.plan import lock_plan
    from probeselect.select import select
    from probeselect.shortlist import shortlist

    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    names = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
    write_fake_pilot(d / "pilot", {b: {"task_accuracy": a, "termination": 0.9} for b, a in zip(names, (.4, .8, .5))})
    t = pd.read_csv(d / "pilot" / "transfer.csv")
    t.loc[(t["base"] == "checkpoint-40") & (t["metric"] == "task_accuracy"), "value"] = float("nan")
    t.to_csv(d / "pilot" / "transfer.csv", index=False, na_rep="nan")
    with pytest.raises(SelectionError, match=r"3 transfer value\(s\) are invalid.*checkpoint-40 seed 0 task_accuracy"):
        select(d)


def test_score_warns_and_records_a_checkpoint_with_nan_weights(ladder_checkpoints, arith_spec, tmp_path, caplog):
    from probeselect.score import score_checkpoints

    bad = _nan_copy(ladder_checkpoints[-1], tmp_path / "ladder" / "checkpoint-99")
    shutil.copytree(ladder_checkpoints[-2], tmp_path / "ladder" / ladder_checkpoints[-2].name)
    with caplog.at_level(logging.WARNING):
        res = score_checkpoints(tmp_path / "ladder", [arith_spec], seeds=[0], out=tmp_path / "run", progress=False,
                                device="cpu")
    text = caplog.text
    assert f"{bad}: 1 weight tensor(s) hold NaN/inf" in text and "checkpoint-99:" in text
    flags = {f["checkpoint"]: f for f in res.manifest["nonfinite"]}
    assert list(flags) == ["checkpoint-99"] and flags["checkpoint-99"]["n_weights"] == 1
    assert flags["checkpoint-99"]["nonfinite_scores"] > 0
    saved = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert saved["nonfinite"] == res.manifest["nonfinite"]


def test_report_flags_nonfinite_scored_checkpoints(tmp_path):
    from _selection_fakes import lock_for

    from probeselect._io import atomic_write_json
    from probeselect.final_report import _run_correctness
    from probeselect._live_selection import live_selection

    d = make_score_run(tmp_path / "run")
    man = json.loads((d / "manifest.json").read_text())
    man["nonfinite"] = [{"checkpoint": "checkpoint-99", "weights": ["w"], "n_weights": 1, "nonfinite_scores": 12}]
    atomic_write_json(d / "manifest.json", man)
    sel = live_selection(d, lock_for(d, {"post_hoc": False, "lock": {}}))
    text = " ".join(_run_correctness(sel, None, None))
    assert "`checkpoint-99` is invalid: 1 weight tensor(s) hold NaN/inf and 12 score row(s) are NaN/inf" in text


# -- 2. one writer per pilot folder ----------------------------------------------------------------------


def test_a_second_pilot_writer_is_refused_and_changes_nothing(tiny_ladder, ladder_checkpoints, tmp_path):
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 2})
    out = tmp_path / "pilot"
    run_pilot([ladder_checkpoints[-1]], recipe, out, progress=False, device="cpu")
    before = _snapshot(out)
    with RunLock(out, error_cls=UsageError):  # the first writer, still running
        other = small_recipe(tiny_ladder, budget={"optimizer_steps": 3}, optimizer__lr=1e-3)
        with pytest.raises(UsageError, match=f"another probeselect process is writing {out}"):
            run_pilot([ladder_checkpoints[-1]], other, out, progress=False, device="cpu")
        assert _snapshot(out) == before


def test_a_folder_mixed_by_two_writers_names_the_files_to_remove(tiny_ladder, ladder_checkpoints, tmp_path):
    base = ladder_checkpoints[-1]
    a = small_recipe(tiny_ladder, budget={"optimizer_steps": 2})
    b = small_recipe(tiny_ladder, budget={"optimizer_steps": 2}, optimizer__lr=1e-3)
    run_pilot([base], a, tmp_path / "a", progress=False, device="cpu")
    run_pilot([base], b, tmp_path / "b", progress=False, device="cpu")
    # what two unlocked writers left (older probeselect): A's data manifest/lineage/log, B's done.json, adapter, state
    ra, rb = tmp_path / "a" / base.name / "seed0", tmp_path / "b" / base.name / "seed0"
    for name in ("done.json", "adapter", "state"):
        (shutil.rmtree if (ra / name).is_dir() else Path.unlink)(ra / name)
        (shutil.copytree if (rb / name).is_dir() else shutil.copy)(rb / name, ra / name)
    with pytest.raises(ResumeError, match="holds files of different runs.*Remove these and re-run") as e:
        run_pilot([base], a, tmp_path / "a", progress=False, device="cpu")
    msg = str(e.value)
    for name in ("done.json", "state/", "adapter/", "lineage.json", "train_log.jsonl", "data_manifest.json"):
        assert f"'{ra / name.rstrip('/')}'" in msg or f"'{ra / name}'" in msg, name
    for p in ra.iterdir():  # doing what it says works
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    res = run_pilot([base], a, tmp_path / "a", progress=False, device="cpu")
    assert res.trained == [(base.name, 0)]


# -- 4. truthful manifests, full disk, staging -----------------------------------------------------------


def test_interrupted_pilot_manifest_says_interrupted(tiny_ladder, ladder_checkpoints, tmp_path):
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3})

    def stop(name, seed, step, row):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pilot([ladder_checkpoints[-1]], recipe, tmp_path / "pilot", progress=False, device="cpu", on_step=stop)
    man = json.loads((tmp_path / "pilot" / "manifest.json").read_text())
    assert man["status"] == "interrupted" and "re-run the same command" in man["error"]
    res = run_pilot([ladder_checkpoints[-1]], recipe, tmp_path / "pilot", progress=False, device="cpu")
    assert res.manifest["status"] == "complete"
    assert json.loads((tmp_path / "pilot" / "manifest.json").read_text())["status"] == "complete"


def test_full_disk_names_the_path_and_cleans_staging(tiny_ladder, ladder_checkpoints, tmp_path, monkeypatch):
    import probeselect.sft.state as state

    def full(tensors, filename, *a, **k):
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state, "save_file", full)
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 2})
    out = tmp_path / "pilot"
    with pytest.raises(UsageError, match=f"{out}: no space left on device.*while writing the pilot folder {out}"):
        run_pilot([ladder_checkpoints[-1]], recipe, out, progress=False, device="cpu")
    assert not [p for p in out.rglob(".tmp-*")] and not [p for p in out.rglob(".*.tmp")]
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "failed" and "no space left on device" in man["error"]


# -- 5. tokenizer vs embeddings --------------------------------------------------------------------------


def _bigger_tokenizer(src: Path, dest: Path) -> Path:
    from probeselect.score import load_tokenizer

    shutil.copytree(src, dest)
    tok = load_tokenizer(dest)
    tok.add_tokens(["zqxword"])
    tok.save_pretrained(str(dest))
    return dest


def test_tokenizer_larger_than_embeddings(tiny_ladder, ladder_checkpoints, tmp_path):
    base = _bigger_tokenizer(ladder_checkpoints[-1], tmp_path / "checkpoint-99")
    # the extra id never occurs in the data: a stated warning, recorded in the manifest
    res = run_pilot([base], small_recipe(tiny_ladder, budget={"optimizer_steps": 1}), tmp_path / "ok", progress=False,
                    device="cpu")
    (w,) = res.manifest["warnings"]
    assert "the tokenizer has" in w and "1 extra id(s) never occur in the encoded SFT data" in w
    # it occurs in one example: an error naming it, before anything is written
    rows = [json.loads(x) for x in (tiny_ladder / "data" / "sft.jsonl").read_text().splitlines()]
    rows[3]["response"] += " zqxword"
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 1}, data={"train": str(data), "max_length": 128})
    with pytest.raises(TokenizerMismatchError, match=f"example {rows[3]['id']} uses token id .* has only .* "
                                                     "embedding rows"):
        run_pilot([base], recipe, tmp_path / "bad", progress=False, device="cpu")
    assert not (tmp_path / "bad").exists()


# -- 6. literal path overrides -----------------------------------------------------------------------------


def _recipe_file(tmp_path: Path) -> Path:
    f = tmp_path / "recipe.yaml"
    f.write_text("name: t\ndata: {train: x.jsonl, max_length: 64}\nbudget: {optimizer_steps: 2}\n"
                 "optimizer: {lr: 1.0e-2, micro_batch_size: 2}\nseeds: [0]\n"
                 "transfer: {tasks: t.jsonl, heldout: h.jsonl}\n")
    return f


@pytest.mark.parametrize("folder", ["lad #1", "a: b", "with  spaces"])
def test_path_overrides_are_taken_literally(tiny_ladder, tmp_path, folder):
    from probeselect.sft.recipe import load_recipe

    d = tmp_path / folder
    d.mkdir()
    shutil.copy(tiny_ladder / "data" / "sft.jsonl", d / "sft.jsonl")
    rec = _recipe_file(tmp_path)
    r = load_recipe(rec, [f"data.train={d}/sft.jsonl", f"transfer.heldout={d}/sft.jsonl", "optimizer.lr=1e-3"],
                    check_files=False)
    assert r.train_path == (d / "sft.jsonl").resolve() and r.transfer["heldout"] == f"{d}/sft.jsonl"
    assert r.optimizer.lr == pytest.approx(1e-3)  # other values are still YAML


def test_run_substitutes_ladder_into_recipe_overrides_safely(tmp_path):
    from probeselect.run import RunConfigError, load_run_config
    from probeselect.sft.recipe import load_recipe

    lad = tmp_path / "lad #1: x"
    cfg = tmp_path / "run.yaml"
    cfg.write_text("out: OUT\nladder: LAD\nscore: {probes: [p.yaml]}\nplan: plan.yaml\n"
                   "pilot: {recipe: recipes/pilot.yaml, overrides: ['data.train={ladder}/data/sft.jsonl']}\n")
    c = load_run_config(cfg, [f"ladder={lad}", f"out={tmp_path / 'o #2'}"])
    assert c["_paths"]["ladder"] == str(lad) and c["_paths"]["out"] == str(tmp_path / "o #2")
    r = load_recipe(_recipe_file(tmp_path), c["pilot"]["overrides"], check_files=False)
    assert r.train_path == (lad / "data" / "sft.jsonl").resolve()
    # a YAML-valued override that the path would cut is refused, not silently cut
    cfg.write_text(cfg.read_text().replace("'data.train={ladder}/data/sft.jsonl'",
                                           "'transfer.probe_items=[{ladder}/items.jsonl]'"))
    with pytest.raises(RunConfigError, match="after substituting the path .*no longer reads as written"):
        load_run_config(cfg, [f"ladder={lad}"])


# -- 7. chat roles -----------------------------------------------------------------------------------------


def test_unknown_chat_role_is_an_error_naming_file_and_line(tmp_path):
    from probeselect.sft.data import load_rows

    f = tmp_path / "chat.jsonl"
    ok = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       {"role": "assistant", "content": "a"}]}
    bad = {"id": "r2", "messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "t"},
                                    {"role": "assistant", "content": "a"}]}
    f.write_text(json.dumps(ok) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(SFTDataError, match=f"{f}: line 3 \\(id 'r2'\\): message 1 has role 'tool'; supported roles "
                                           "are system, user, assistant"):
        load_rows(f)
    f.write_text(json.dumps(ok) + "\n")
    assert len(load_rows(f)) == 1


# -- 8. spikes relative to the run's own noise -------------------------------------------------------------


def _noisy_run(seed: int, n: int = 150, sd: float = 0.08) -> list[float]:
    """A healthy SFT loss curve: a quick fall to a plateau plus batch noise of ``sd`` nats (the toy pilot's is 0.07-0.09)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return list(1.0 + 1.5 * np.exp(-t / 5) + rng.normal(0, sd, n))  # falls within ~20 steps, then a plateau


def test_healthy_noise_flags_no_spike_and_a_planted_spike_is_found():
    from probeselect.sft.diagnostics import SpikeDetector

    for seed in range(9):  # the demo's 3 bases x 3 seeds
        det = SpikeDetector(201, 0.1, 10)
        assert sum(det.update(x)[0] for x in _noisy_run(seed)) == 0, seed
    losses = _noisy_run(0)
    losses[100] += 1.0  # a real spike: 12 noise widths
    det = SpikeDetector(201, 0.1, 10)
    flags = [det.update(x)[0] for x in losses]
    assert [i for i, f in enumerate(flags) if f] == [100]


def test_training_logs_the_spike_margin_and_flags_a_planted_spike(tiny_ladder, ladder_checkpoints, tmp_path,
                                                                   monkeypatch):
    """A real run: the loss of step 14 is made 3 nats larger (a corrupted batch); it alone is flagged."""
    import probeselect.sft.loop as loop

    real, calls = loop.microbatch_nll, {"n": 0}
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 16}, checkpointing={"every": 0, "keep": 1},
                          transfer=None)

    def nll(model, batch):
        calls["n"] += 1
        out = real(model, batch)
        # grad_accum 2: micro-batches 27 and 28 are step 14
        return out * 3.0 if calls["n"] in (27, 28) else out

    monkeypatch.setattr(loop, "microbatch_nll", nll)
    res = run_pilot([ladder_checkpoints[-1]], recipe, tmp_path / "pilot", progress=False, device="cpu")
    rows = [json.loads(x) for x in (tmp_path / "pilot" / ladder_checkpoints[-1].name / "seed0" /
                                    "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["spike"]] == [14]
    assert all(r["spike_margin"] is None for r in rows[:10]) and rows[13]["spike_margin"] >= 0.1
    assert int(res.diagnostics["spikes"].iloc[0]) == 1


# -- 3. POST-HOC is sticky ---------------------------------------------------------------------------------


@pytest.fixture
def run(tmp_path):
    from probeselect.plan import lock_plan
    from probeselect.shortlist import shortlist

    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    names = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
    write_fake_pilot(d / "pilot", {b: {"task_accuracy": a, "termination": 0.9} for b, a in zip(names, (.85, .45, .4))})
    return d, plan


def test_post_hoc_survives_restoring_the_plan_bytes(run):
    from probeselect.select import select

    d, plan = run
    assert not select(d).post_hoc
    plan.write_text(PLAN.replace("tie_margin: 0.02", "tie_margin: 0.0"))
    assert select(d, allow_post_hoc=True).post_hoc
    plan.write_text(PLAN)  # the original bytes again
    with pytest.raises(PostHocError, match="an earlier selection of this run was POST-HOC"):
        select(d)
    res = select(d, allow_post_hoc=True)
    js = json.loads((d / "selection.json").read_text())
    assert res.post_hoc and js["status"] == "POST-HOC"
    hist = js["plan_history"]
    assert [(h["event"], h.get("post_hoc")) for h in hist] == [
        ("locked", None), ("select", False), ("select", True), ("select_refused", True), ("select", True)]
    shas = [h["plan_sha256"] for h in hist]
    assert shas[0] == shas[1] == shas[3] == shas[4] == sha256_file(plan) != shas[2]
    from probeselect.report import write_report

    text = write_report(d).md.read_text()
    assert text.startswith("# POST-HOC") and "an earlier selection of this run was POST-HOC" in text


def test_refused_select_leaves_no_stale_predeclared_selection(run):
    from probeselect.report import write_report
    from probeselect.select import select

    d, plan = run
    select(d)
    plan.write_text(PLAN.replace("tie_margin: 0.02", "tie_margin: 0.0"))
    with pytest.raises(PostHocError, match="previous selection was moved to .*superseded.*selection.json so that no report presents it"):
        select(d)
    assert not (d / "selection.json").exists() and not (d / "selection.csv").exists()
    assert len(list((d / "superseded").glob("*/selection.json"))) == 1
    text = write_report(d).md.read_text()  # the probe report: no selection is presented
    assert "Predeclared" not in text and "Recommended base" not in text and "checkpoint-40`**" not in text


def test_report_predeclared_line_comes_from_the_lock_and_current_plan(run):
    from probeselect.report import write_report
    from probeselect.select import select

    d, plan = run
    select(d)
    assert "**Predeclared**" in write_report(d).md.read_text()
    plan.write_text(PLAN.replace("tie_margin: 0.02", "tie_margin: 0.0"))  # edited; select not re-run
    text = write_report(d).md.read_text()
    decision = text[text.index("## Decision"):text.index("## Pilot transfer")]
    assert text.startswith("# POST-HOC") and "**Predeclared**" not in decision
    assert "changed after it was locked" in decision and sha256_file(plan)[:12] in decision


def test_a_second_run_on_one_out_folder_is_refused(tmp_path):
    from probeselect.run import RunConfigError, run_pipeline

    cfg = tmp_path / "run.yaml"
    out = tmp_path / "out"
    cfg.write_text(f"out: {out}\nladder: {tmp_path / 'lad'}\nscore: {{probes: [p.yaml]}}\nplan: plan.yaml\n"
                   "pilot: {recipe: recipes/pilot.yaml}\n")
    out.mkdir()
    with RunLock(out, error_cls=UsageError):
        with pytest.raises(RunConfigError, match=f"another probeselect process is writing {out}"):
            run_pipeline(cfg, progress=False, log=lambda m: None)
    assert sorted(p.name for p in out.iterdir()) == [".probeselect.lock"]
