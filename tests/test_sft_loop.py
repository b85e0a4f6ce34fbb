"""The training loop: token-weighted accumulation, clipping, logging, nonfinite handling and
resume-after-kill equivalence."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _sft_helpers import prepared, small_recipe
from probeselect.errors import ManifestMismatchError, NonfiniteGradientError, RecipeError, ResumeError
from probeselect.sft import loop as loop_mod
from probeselect.sft.data import collate
from probeselect.sft.diagnostics import SpikeDetector
from probeselect.sft.loop import lr_factor, train


def _train(ladder, run_dir, recipe, **kw):
    base, tok, ex, m = prepared(ladder, recipe)
    return train(base.path, recipe, 0, run_dir, manifest=m, examples=ex, pad_id=tok.pad_token_id,
                 base_fingerprint=base.fingerprint, device="cpu", progress=False, **kw), (base, tok, ex, m)


def test_loss_and_gradient_are_token_weighted_over_the_window(tiny_ladder, tmp_path):
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 1}, optimizer__clip={"max_norm": None})
    # a data seed whose first window splits into micro-batches with different supervised-token counts,
    # so a mean of micro-batch means (the 2024 accumulation bug) differs from the token-weighted mean
    for seed in range(20):
        base, tok, ex, m = prepared(tiny_ladder, recipe, seed=seed)
        ids = m["steps"][0]["ids"]
        halves = [ids[:4], ids[4:]]
        if sum(ex[i].n_sup for i in halves[0]) != sum(ex[i].n_sup for i in halves[1]):
            break
    n_half = [sum(ex[i].n_sup for i in h) for h in halves]
    assert n_half[0] != n_half[1], "no data seed in 0..19 gives unequal micro-batch token counts"
    res = train(base.path, recipe, seed, tmp_path / "run", manifest=m, examples=ex, pad_id=tok.pad_token_id,
                base_fingerprint=base.fingerprint, device="cpu", progress=False)
    row = res.rows[0]
    n_sup = m["steps"][0]["sup_tokens"]
    # Reference: the same initial model, the whole window in one batch, sum NLL / supervised tokens.
    ref = loop_mod._build_model(base.path, recipe, seed, torch.device("cpu"))
    batch = collate([ex[i] for i in ids], tok.pad_token_id)
    (loop_mod.microbatch_nll(ref, batch) / n_sup).backward()
    with torch.no_grad():
        ref_loss = float(loop_mod.microbatch_nll(ref, batch)) / n_sup
    ref_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in ref.parameters() if p.grad is not None))
    assert row["loss"] == pytest.approx(ref_loss, abs=1e-5)
    assert row["grad_norm_preclip"] == pytest.approx(ref_norm, rel=1e-4)
    assert row["sup_tokens"] == n_sup == sum(ex[i].n_sup for i in ids) == sum(n_half)
    with torch.no_grad():
        naive = sum(float(loop_mod.microbatch_nll(ref, collate([ex[i] for i in h], tok.pad_token_id))) / n
                    for h, n in zip(halves, n_half)) / 2
    print(f"token-weighted loss {row['loss']:.6f} vs mean of micro-batch means {naive:.6f} ({n_half} tokens)")
    assert abs(naive - row["loss"]) > 1e-4


def test_clipping_logging_and_schedule(tiny_ladder, tmp_path):
    recipe = small_recipe(tiny_ladder, optimizer__clip={"rule": "global_norm", "max_norm": 0.05})
    seen = []  # global norm of the gradients that reach optimizer.step

    def pre_step(opt, args, kwargs):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        seen.append(float(torch.nn.utils.get_total_norm(grads, 2.0)))

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(pre_step)
    try:
        res, _ = _train(tiny_ladder, tmp_path / "run", recipe)
    finally:
        handle.remove()
    rows = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert len(seen) == 6 and sum(r["clipped"] for r in rows) >= 1
    for r, n in zip(rows, seen):
        assert n == pytest.approx(0.05 if r["clipped"] else r["grad_norm_preclip"], abs=1e-5)
    assert rows == json.loads(json.dumps(res.rows)) and [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        assert r["clipped"] == (r["grad_norm_preclip"] > 0.05)
        if r["clipped"]:
            assert r["clip_coef"] == pytest.approx(0.05 / (r["grad_norm_preclip"] + 1e-6), rel=1e-9)
        assert r["update_norm"] > 0 and not r["nonfinite"] and r["layer_grad_norms"]["argmax"].startswith("layers.")
        lg = r["layer_grad_norms"]
        assert lg["min"] <= lg["median"] <= lg["max"] <= r["grad_norm_preclip"] + 1e-9
    assert [r["lr"] for r in rows] == pytest.approx([2e-3 * lr_factor(s, 6, 2, "cosine") for s in range(6)])
    assert res.summary["clip_fraction"] == pytest.approx(sum(r["clipped"] for r in rows) / 6)
    lineage = json.loads((tmp_path / "run" / "lineage.json").read_text())["segments"]
    assert len(lineage) == 1 and lineage[0]["status"] == "complete" and lineage[0]["parent_state"] is None


def test_lr_schedule_and_spike_detector():
    assert lr_factor(0, 10, 2, "cosine") == pytest.approx(0.5)
    assert lr_factor(2, 10, 2, "cosine") == pytest.approx(1.0)
    assert lr_factor(6, 10, 2, "linear") == pytest.approx(0.5)
    assert lr_factor(9, 10, 0, "constant") == 1.0
    det = SpikeDetector(window=3, threshold=0.1, min_history=2)
    flags = [det.update(x)[0] for x in [1.0, 1.0, 1.05, 1.2, 1.0, 1.15, 1.16]]
    # medians of the previous <=3 losses: -, -, 1.0, 1.0, 1.05, 1.05, 1.15
    assert flags == [False, False, False, True, False, False, False]


_RUNNER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from _sft_helpers import prepared, small_recipe
from probeselect.sft.loop import train

ladder, run_dir, marker = Path({ladder!r}), Path({run_dir!r}), Path({marker!r})
recipe = small_recipe(ladder, method={{"type": "lora", "r": 4, "alpha": 8, "dropout": 0.1}})
base, tok, ex, m = prepared(ladder, recipe)

def on_step(step, row):
    if step == 5:  # the state of step 4 and the log row of step 5 are on disk: wait here to be SIGKILLed
        marker.write_text(str(step))
        time.sleep(300)

train(base.path, recipe, 0, run_dir, manifest=m, examples=ex, pad_id=tok.pad_token_id,
      base_fingerprint=base.fingerprint, device="cpu", progress=False, on_step=on_step)
"""


def _spy_batches(monkeypatch):
    """Record (sample ids, supervised label tokens) of every micro-batch the loop collates."""
    seen = []
    real = loop_mod.collate

    def spy(examples, pad_id):
        batch = real(examples, pad_id)
        seen.append(([e.id for e in examples], int((batch["labels"] != -100).sum())))
        return batch

    monkeypatch.setattr(loop_mod, "collate", spy)
    return seen


def test_resume_after_sigkill_replays_the_uninterrupted_run(tiny_ladder, tmp_path, monkeypatch):
    """A real `train` in a subprocess is SIGKILLed after step 5 is logged (its last state is step 4); the
    resumed run must then train on the same sample ids with the same supervised token counts, and match the
    uninterrupted run: losses, pre-clip gradient norms and final weights BITWISE (same CPU, one thread), the
    update norms to rel 1e-6 (they are computed from differences of weights, whose float32 rounding depends
    on the order of the fused norm kernels). docs/pilot-sft.md (the `state/step-<N>/` bullet) states exactly this."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.1})
        seen = _spy_batches(monkeypatch)
        full, _ = _train(tiny_ladder, tmp_path / "full", recipe)
        full_batches = list(seen)

        cut, marker = tmp_path / "cut", tmp_path / "killed-at"
        code = _RUNNER.format(tests=str(Path(__file__).parent), ladder=str(tiny_ladder), run_dir=str(cut),
                              marker=str(marker))
        proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 600
            while not marker.exists():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "the runner never reached step 5"
                time.sleep(0.2)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        logged = [json.loads(x) for x in (cut / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in logged] == [1, 2, 3, 4, 5]          # row 5 is after the last state (step 4)
        assert json.loads((cut / "state" / "latest.json").read_text())["step"] == 4

        seen.clear()
        resumed, _ = _train(tiny_ladder, cut, recipe)
        # the same samples in the same micro-batches with the same supervised tokens for steps 5-6
        assert seen == full_batches[-len(seen):] and len(seen) == 2 * recipe.optimizer.grad_accum
        a, b = full.rows, resumed.rows
        assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6] and [r["segment"] for r in b] == [0, 0, 0, 0, 1, 1]
        assert [r["sup_tokens"] for r in a] == [r["sup_tokens"] for r in b]
        assert [r["loss"] for r in a] == [r["loss"] for r in b]                            # bitwise
        assert [r["grad_norm_preclip"] for r in a] == [r["grad_norm_preclip"] for r in b]  # bitwise
        assert [x["update_norm"] for x in a] == pytest.approx([y["update_norm"] for y in b], rel=1e-6)
        for p, q in zip(full.model.parameters(), resumed.model.parameters()):
            assert torch.equal(p, q)                                                       # bitwise
        seg = json.loads((cut / "lineage.json").read_text())["segments"]
        assert [s["status"] for s in seg] == ["interrupted", "complete"]  # the killed segment, closed on resume
        assert seg[1]["start_step"] == 4 and seg[1]["parent_state"].endswith("step-000004")
        assert seg[1]["discarded_log_rows"] == 1 and resumed.summary["resumes"] == 1
        # a state never loads into a different run
        other = small_recipe(tiny_ladder, optimizer__lr=1e-3)
        (cut / "state" / "latest.json").write_text('{"step": 6, "dir": "step-000006"}')
        with pytest.raises(ResumeError, match="train_sha256"):
            _train(tiny_ladder, cut, other)
    finally:
        torch.set_num_threads(threads)


def _poison(monkeypatch, bad_id):
    real = loop_mod.microbatch_nll

    def nll(model, batch, _ids=None):
        out = real(model, batch)
        return out * float("inf") if getattr(nll, "hit", False) else out

    orig_collate = loop_mod.collate

    def collate_spy(examples, pad_id):
        nll.hit = any(e.id == bad_id for e in examples)
        return orig_collate(examples, pad_id)

    monkeypatch.setattr(loop_mod, "microbatch_nll", nll)
    monkeypatch.setattr(loop_mod, "collate", collate_spy)


def test_nonfinite_fails_fast_with_batch_ids_and_state(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.1})
    _, _, _, m = prepared(tiny_ladder, recipe)
    bad = m["steps"][2]["ids"][0]
    assert all(bad not in s["ids"] for s in m["steps"][:2])
    _poison(monkeypatch, bad)
    with pytest.raises(NonfiniteGradientError, match=r"optimizer step 3: nonfinite loss.*nonfinite_batch.json"):
        _train(tiny_ladder, tmp_path / "run", recipe)
    state = tmp_path / "run" / "state"
    info = json.loads((tmp_path / "run" / "nonfinite_batch.json").read_text())
    assert info["step"] == 3 and info["ids"] == m["steps"][2]["ids"]
    assert info["state"] == str(state / "nonfinite-step-000003")
    # latest.json still names the regular checkpoint; the failure state is the state before step 3
    assert json.loads((state / "latest.json").read_text()) == {"step": 2, "dir": "step-000002"}
    meta = json.loads((state / "nonfinite-step-000003" / "meta.json").read_text())
    assert meta["cursor"] == 2 and meta["failed_step"] == 3 and meta["reason"] == "nonfinite"
    fail_rng = torch.load(state / "nonfinite-step-000003" / "rng-rank0.pt", weights_only=True)
    reg_rng = torch.load(state / "step-000002" / "rng-rank0.pt", weights_only=True)
    assert torch.equal(fail_rng["torch"], reg_rng["torch"])  # dropout draws of step 3 undone
    from safetensors.torch import load_file
    a = load_file(str(state / "nonfinite-step-000003" / "trainable.safetensors"))
    b = load_file(str(state / "step-000002" / "trainable.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nonfinite_skip_mode_counts_skips(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, diagnostics={"nonfinite": "skip"})
    _, _, _, m = prepared(tiny_ladder, recipe)
    bad = m["steps"][2]["ids"][0]
    _poison(monkeypatch, bad)
    res, _ = _train(tiny_ladder, tmp_path / "run", recipe)
    flagged = [r["step"] for r in res.rows if r["skipped"]]
    assert 3 in flagged and res.summary["skipped"] == len(flagged) == res.summary["nonfinite"]
    assert all(r["update_norm"] == 0.0 for r in res.rows if r["skipped"])
    assert res.summary["optimizer_updates"] == 6 - len(flagged)


# ---- fp16 loss scaling (a real GradScaler on CPU, injected through the accelerator) ----

class _InfGrad(torch.autograd.Function):
    """Identity forward (finite loss), infinite gradient backward: a loss-scale overflow."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


def _cpu_scaler(monkeypatch, init_scale=2.0 ** 10):
    real = loop_mod._make_accelerator
    scalers = []

    def make(device, precision):
        acc = real(device, precision)
        acc.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        scalers.append(acc.scaler)
        return acc

    monkeypatch.setattr(loop_mod, "_make_accelerator", make)
    return scalers


def _overflow_calls(monkeypatch, calls):
    """Make the gradients of the given microbatch_nll calls (0-based, counted over the run) overflow."""
    real = loop_mod.microbatch_nll
    n = [0]

    def nll(model, batch):
        out = real(model, batch)
        i, n[0] = n[0], n[0] + 1
        return _InfGrad.apply(out) if i in calls else out

    monkeypatch.setattr(loop_mod, "microbatch_nll", nll)


def test_fp16_overflow_redoes_the_same_step_at_a_lower_scale(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.1})
    scalers = _cpu_scaler(monkeypatch)
    ref, _ = _train(tiny_ladder, tmp_path / "ref", recipe)
    _overflow_calls(monkeypatch, {4})  # step 3, first micro-batch of the first attempt (2 micro-batches a step)
    res, _ = _train(tiny_ladder, tmp_path / "run", recipe)
    assert [r["scaler_retries"] for r in res.rows] == [0, 0, 1, 0, 0, 0]
    assert not any(r["skipped"] or r["nonfinite"] for r in res.rows) and res.summary["optimizer_updates"] == 6
    assert res.summary["scaler_retries"] == 1
    assert scalers[0].get_scale() == 2.0 ** 10 and scalers[1].get_scale() == 2.0 ** 9  # lowered once
    # the redo used the same examples and dropout draws: the run equals one without the overflow
    for a, b in zip(ref.rows, res.rows):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm_preclip"] == pytest.approx(a["grad_norm_preclip"], rel=1e-5)
        assert b["update_norm"] == pytest.approx(a["update_norm"], rel=1e-5)
    for p, q in zip(ref.model.parameters(), res.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_fp16_persistent_overflow_and_nonfinite_loss_fail_fast(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3})
    _cpu_scaler(monkeypatch)
    _overflow_calls(monkeypatch, set(range(4, 1000)))  # every attempt of step 3 overflows
    with pytest.raises(NonfiniteGradientError,
                       match=rf"step 3: nonfinite gradient after {loop_mod.MAX_SCALER_RETRIES} loss-scale reductions"):
        _train(tiny_ladder, tmp_path / "run", recipe)
    info = json.loads((tmp_path / "run" / "nonfinite_batch.json").read_text())
    assert info["scaler_retries"] == loop_mod.MAX_SCALER_RETRIES
    saved = torch.load(tmp_path / "run" / "state" / "nonfinite-step-000003" / "scaler.pt", weights_only=True)
    assert saved["scale"] == 2.0 ** 10  # the pre-step scale, not the lowered one
    # a nonfinite *loss* is the data's fault: with a scaler it fails fast too (it used to be skipped)
    monkeypatch.undo()
    _cpu_scaler(monkeypatch)
    recipe = small_recipe(tiny_ladder)
    _, _, _, m = prepared(tiny_ladder, recipe)
    _poison(monkeypatch, m["steps"][2]["ids"][0])
    with pytest.raises(NonfiniteGradientError, match=r"optimizer step 3: nonfinite loss"):
        _train(tiny_ladder, tmp_path / "run2", recipe)


# ---- accelerate setup guard, reloads, stale manifests, LoRA init ----

def test_refuses_accelerate_accumulation_and_sharded_setups(tiny_ladder, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    recipe = small_recipe(tiny_ladder)
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    with pytest.raises(RecipeError, match=r"gradient_accumulation_steps=4 \(ACCELERATE_GRADIENT_ACCUMULATION_STEPS"):
        _train(tiny_ladder, tmp_path / "run", recipe)
    assert not (tmp_path / "run").exists()
    monkeypatch.delenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    for kind in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        with pytest.raises(RecipeError, match=f"configured for {kind.value}.*sharded"):
            loop_mod._check_accelerate_setup(SimpleNamespace(distributed_type=kind, gradient_accumulation_steps=1),
                                             recipe)
    for kind in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        loop_mod._check_accelerate_setup(SimpleNamespace(distributed_type=kind, gradient_accumulation_steps=1), recipe)


def test_finished_run_reloads_without_a_segment_and_stale_manifest_is_replaced(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 2})
    run = tmp_path / "run"
    run.mkdir()
    _, _, _, other = prepared(tiny_ladder, recipe, seed=1)
    (run / "data_manifest.json").write_text(json.dumps(other))  # left over, no state: stale
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    first, (_, _, _, m) = _train(tiny_ladder, run, recipe)
    assert json.loads((run / "data_manifest.json").read_text()) == m
    again, _ = _train(tiny_ladder, run, recipe)
    assert first.steps_trained == 2 and again.steps_trained == 0
    assert [r["loss"] for r in again.rows] == [r["loss"] for r in first.rows]
    seg = json.loads((run / "lineage.json").read_text())["segments"]
    assert len(seg) == 1 and seg[0]["status"] == "complete" and again.summary["resumes"] == 0
    for p, q in zip(first.model.parameters(), again.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    # states load onto any device: every torch.load maps to the CPU and stays weights-only
    assert loads and all(k.get("map_location") == "cpu" and k.get("weights_only") is True for k in loads)
    # with a state, a data_manifest.json that no longer matches is refused, not overwritten
    (run / "data_manifest.json").write_text(json.dumps(other))
    with pytest.raises(ManifestMismatchError, match="data_manifest.json: differs .* file was modified"):
        _train(tiny_ladder, run, recipe)


def test_lora_init_depends_on_the_seed_only(tiny_ladder, ladder_checkpoints):
    import numpy as np

    recipe = small_recipe(tiny_ladder)
    _, _, _, m0 = prepared(tiny_ladder, recipe, seed=0)

    def lora_a(ckpt, seed):
        torch.manual_seed(12345 + seed)  # global RNG state before the build must not matter
        model = loop_mod._build_model(ckpt, recipe, seed, torch.device("cpu"))
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}

    a0, b0 = lora_a(ladder_checkpoints[0], 0), lora_a(ladder_checkpoints[-1], 0)
    assert a0 and a0.keys() == b0.keys() and all(torch.equal(a0[k], b0[k]) for k in a0)
    a1 = lora_a(ladder_checkpoints[0], 1)
    assert all(not torch.equal(a0[k], a1[k]) for k in a0)
    # the init stream leaves the data order alone: the manifest does not depend on model builds or RNG state
    np.random.seed(7)
    _, _, _, again = prepared(tiny_ladder, recipe, seed=0)
    assert again == m0
    assert loop_mod.init_seed(0) != loop_mod.init_seed(1)


def test_in_process_kill_resumes_with_the_kept_rows_spike_history(tiny_ladder, tmp_path):
    """A run stopped inside step 3's ``on_step`` (row 3 logged, state at step 2, its segment still
    "running" on disk) resumes into rows equal to an uninterrupted run's, spike fields included: the
    resumed SpikeDetector is seeded with the losses of the kept rows (1-2), the discarded row 3 is
    counted, and the killed segment is closed as interrupted."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recipe = small_recipe(tiny_ladder, diagnostics={"spike_window": 4, "spike_min_history": 2,
                                                        "spike_threshold": 0.001, "spike_z": 0.5})
        full, _ = _train(tiny_ladder, tmp_path / "full", recipe)
        assert any(r["spike_margin"] is not None for r in full.rows[2:4])  # history matters from step 3 on

        def kill(step, row):
            if step == 3:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            _train(tiny_ladder, tmp_path / "cut", recipe, on_step=kill)
        cut = tmp_path / "cut"
        seg = json.loads((cut / "lineage.json").read_text())["segments"]
        assert [(s["status"], s["end_step"]) for s in seg] == [("running", 2)]  # written at the step-2 checkpoint
        assert len((cut / "train_log.jsonl").read_text().splitlines()) == 3
        resumed, _ = _train(tiny_ladder, cut, recipe)
        strip = [{k: v for k, v in r.items() if k != "segment"} for r in full.rows]
        assert [{k: v for k, v in r.items() if k != "segment"} for r in resumed.rows] == strip
        assert [r["segment"] for r in resumed.rows] == [0, 0, 1, 1, 1, 1] and resumed.steps_trained == 4
        seg = json.loads((cut / "lineage.json").read_text())["segments"]
        assert [s["status"] for s in seg] == ["interrupted", "complete"] and seg[0]["end_step"] == 2
        assert seg[1]["start_step"] == 2 and seg[1]["discarded_log_rows"] == 1
        assert seg[1]["parent_state"] == str(cut / "state" / "step-000002")
        assert list(resumed.lineage[1]) == list(full.lineage[0])  # one segment layout, resumed or not
        logged = [json.loads(x) for x in (cut / "train_log.jsonl").read_text().splitlines()]
        assert logged == resumed.rows and [list(r) for r in logged] == [list(r) for r in full.rows]  # key order too
        assert resumed.summary["resumes"] == 1 and full.summary["resumes"] == 0
    finally:
        torch.set_num_threads(threads)
