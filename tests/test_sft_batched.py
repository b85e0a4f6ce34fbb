"""Batched seeds (probeselect.sft.batched): the seeds of one LoRA base trained together equal the
single-run reference path per seed; clipping, nonfinite handling and resume stay per run."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from _sft_helpers import prepared, small_recipe
from probeselect.errors import NonfiniteGradientError, RecipeError
from probeselect.pilot import deterministic_torch
from probeselect.sft import batched as batched_mod
from probeselect.sft.batched import NotBatchable, not_batchable_reason, train_seeds
from probeselect.sft.loop import train

SEEDS = [0, 1]
# float32 tolerance of the batched path vs the single-run path. The base forward runs on the
# runs' micro-batches padded to a common length and the LoRA matmuls are batched (bmm), so sums
# are rounded in another order: losses, pre-clip norms, clip coefficients, update norms and
# held-out losses agree to ~1e-7 relative (asserted at 1e-5). Weights: AdamW divides each
# coordinate's gradient by its own running RMS, so a coordinate whose gradient is ~0 turns a
# 1e-7 rounding difference into a visible step difference; the weights agree to a small
# fraction of one learning-rate step (asserted: atol = lr / 100 per coordinate).
REL = 1e-5
# The device these tests train on: cpu in CI; PROBESELECT_TEST_DEVICE=cuda runs the same equality,
# packing and resume checks on a GPU (bench/gpu_check.sh; the figures are in bench/README.md).
DEVICE = os.environ.get("PROBESELECT_TEST_DEVICE", "cpu")


_ENCODED: dict = {}


def _prepared(ladder, recipe, seed):
    """``prepared`` with the tokenizer and encoded examples cached per ladder (encoding dominates)."""
    from probeselect.sft.data import data_hash
    from probeselect.sft.manifest import build_data_manifest

    key = (str(ladder), str(recipe.train_path), recipe.max_length)
    if key not in _ENCODED:
        _ENCODED[key] = prepared(ladder, recipe, seed=seed)[:3] + (data_hash(recipe.train_path),)
    base, tok, ex, d_hash = _ENCODED[key]
    m = build_data_manifest(list(ex.values()), recipe, seed=seed, tokenizer_hash=base.tokenizer_hash,
                            data_sha256=d_hash)
    return base, tok, ex, m


def _setup(ladder, recipe):
    preps = {s: _prepared(ladder, recipe, s) for s in SEEDS}
    base, tok, ex, _ = preps[SEEDS[0]]
    return base, tok, ex, {s: p[3] for s, p in preps.items()}


def _heldout(recipe, tok):
    from probeselect.sft.data import encode_rows, load_rows

    if not recipe.eval_every:
        return None
    return encode_rows(load_rows(recipe.transfer["heldout"])[: recipe.eval_max_items], tok,
                       max_length=recipe.max_length)


def _batched(ladder, out, recipe, **kw):
    base, tok, ex, mans = _setup(ladder, recipe)
    kw.setdefault("heldout", _heldout(recipe, tok))
    return train_seeds(base.path, recipe, SEEDS, [out / f"seed{s}" for s in SEEDS], manifests=[mans[s] for s in SEEDS],
                       examples=ex, pad_id=tok.pad_token_id, base_fingerprint=base.fingerprint, device=DEVICE,
                       progress=False, **kw)


def _single(ladder, out, recipe, seed):
    base, tok, ex, m = _prepared(ladder, recipe, seed)
    return train(base.path, recipe, seed, out / f"seed{seed}", manifest=m, examples=ex, pad_id=tok.pad_token_id,
                 base_fingerprint=base.fingerprint, device=DEVICE, progress=False, heldout=_heldout(recipe, tok))


def _rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def test_batched_seeds_equal_single_runs_with_per_run_clipping(tiny_ladder, tmp_path):
    # tau between the two runs' first pre-clip norms: at step 1 exactly one run clips. A joint
    # norm over both runs' parameters would clip both or neither.
    probe = small_recipe(tiny_ladder, budget={"optimizer_steps": 1}, seeds=SEEDS, optimizer__clip={"max_norm": None})
    first = {s: r.rows[0]["grad_norm_preclip"] for s, r in _batched(tiny_ladder, tmp_path / "probe", probe).items()}
    assert _rel(first[0], first[1]) > 0.05, first
    tau = math.sqrt(first[0] * first[1])
    recipe = small_recipe(tiny_ladder, seeds=SEEDS, optimizer__clip={"max_norm": tau},
                          eval={"every": 3, "max_items": 16})
    single = {s: _single(tiny_ladder, tmp_path / "single", recipe, s) for s in SEEDS}
    bat = _batched(tiny_ladder, tmp_path / "batched", recipe)
    assert [bat[s].rows[0]["clipped"] for s in SEEDS] == [first[s] > tau for s in SEEDS]
    assert sorted(bat[s].rows[0]["clipped"] for s in SEEDS) == [False, True]
    worst = {}
    for s in SEEDS:
        a, b = single[s].rows, bat[s].rows
        assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6] and b[0]["clipped"] == a[0]["clipped"]
        assert [r["clipped"] for r in a] == [r["clipped"] for r in b]
        assert [r["sup_tokens"] for r in a] == [r["sup_tokens"] for r in b]
        assert [r["lr"] for r in a] == [r["lr"] for r in b]
        for key in ("loss", "grad_norm_preclip", "clip_coef", "update_norm", "heldout_loss"):
            vals = [_rel(x[key], y[key]) for x, y in zip(a, b) if key in x]
            assert len(vals) == (2 if key == "heldout_loss" else 6) and [key in x for x in a] == [key in y for y in b]
            worst[key] = max(worst.get(key, 0.0), *vals)
            assert max(vals) < REL, (s, key, vals)
        for x, y in zip(a, b):
            for k in ("min", "median", "max"):
                assert _rel(x["layer_grad_norms"][k], y["layer_grad_norms"][k]) < REL
            assert x["layer_grad_norms"]["argmax"] == y["layer_grad_norms"]["argmax"]
        ref = {n: p for n, p in single[s].model.named_parameters() if p.requires_grad}
        got = {n: p for n, p in bat[s].get_model().named_parameters() if p.requires_grad}
        assert ref.keys() == got.keys() and ref
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=recipe.optimizer.lr / 100)
        worst["weights_abs"] = max(worst.get("weights_abs", 0.0), max(float((got[n] - ref[n]).abs().max()) for n in ref))
        # same files: manifest, state layout, tensor names, optimizer layout
        sd, bd = tmp_path / "single" / f"seed{s}", tmp_path / "batched" / f"seed{s}"
        assert json.loads((sd / "data_manifest.json").read_text()) == json.loads((bd / "data_manifest.json").read_text())
        assert sorted(p.relative_to(sd) for p in (sd / "state").rglob("*")) == \
            sorted(p.relative_to(bd) for p in (bd / "state").rglob("*"))
        oa = torch.load(sd / "state" / "step-000006" / "optimizer.pt", weights_only=True)
        ob = torch.load(bd / "state" / "step-000006" / "optimizer.pt", weights_only=True)
        assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
        ra = torch.load(sd / "state" / "step-000006" / "rng-rank0.pt", weights_only=True)
        rb = torch.load(bd / "state" / "step-000006" / "rng-rank0.pt", weights_only=True)
        assert torch.equal(ra["torch"], rb["torch"])
        seg = json.loads((bd / "lineage.json").read_text())["segments"]
        assert seg[0]["batched_seeds"] == SEEDS and seg[0]["status"] == "complete"
        # one log-row and segment layout (key order included) on both paths; batched adds two segment keys
        assert [list(r) for r in a] == [list(r) for r in b]
        assert [k for k in bat[s].lineage[0] if k not in ("batched_seeds", "packed")] == list(single[s].lineage[0])
        assert seg[0]["packed"] is True  # the default layout was used (not the padded fallback)
    print("max relative difference batched vs single:", worst)


def _poison_group(monkeypatch, seed_pos: int, calls: set[int]):
    """Make run ``SEEDS[seed_pos]``'s NLL infinite on the given rows_nll calls (0-based)."""
    real = batched_mod.rows_nll
    n = [0]

    def nll(model, batch, groups):
        out = real(model, batch, groups)
        i, n[0] = n[0], n[0] + 1
        if i in calls:
            # x inf on that run's entry, x 1 elsewhere (its backward multiplies by the same factors)
            out = out * torch.tensor([float("inf") if k == seed_pos else 1.0 for k, _ in groups], device=out.device)
        return out

    monkeypatch.setattr(batched_mod, "rows_nll", nll)


def test_nonfinite_in_one_run_fails_or_skips_only_that_run(tiny_ladder, tmp_path, monkeypatch):
    recipe = small_recipe(tiny_ladder, seeds=SEEDS)
    ref = _batched(tiny_ladder, tmp_path / "ref", recipe)
    _poison_group(monkeypatch, 1, {4})  # step 3, first micro-batch (2 micro-batches a step, no eval)
    res = _batched(tiny_ladder, tmp_path / "fail", recipe)
    assert isinstance(res[1], NonfiniteGradientError) and "optimizer step 3: nonfinite loss" in str(res[1])
    bad = tmp_path / "fail" / "seed1"
    info = json.loads((bad / "nonfinite_batch.json").read_text())
    assert info["step"] == 3 and (bad / "state" / "nonfinite-step-000003").is_dir()
    assert json.loads((bad / "state" / "latest.json").read_text())["step"] == 2
    assert json.loads((bad / "lineage.json").read_text())["segments"][-1]["status"] == "failed"
    ok = res[0]
    assert not (tmp_path / "fail" / "seed0" / "nonfinite_batch.json").exists()
    assert [r["step"] for r in ok.rows] == [1, 2, 3, 4, 5, 6] and not any(r["nonfinite"] for r in ok.rows)
    for x, y in zip(ref[0].rows, ok.rows):  # seed 0 trained on as if seed 1 had never been there
        assert _rel(x["loss"], y["loss"]) < REL and _rel(x["grad_norm_preclip"], y["grad_norm_preclip"]) < REL

    monkeypatch.undo()
    skip = small_recipe(tiny_ladder, seeds=SEEDS, diagnostics={"nonfinite": "skip"})
    ref = _batched(tiny_ladder, tmp_path / "ref-skip", skip)
    _poison_group(monkeypatch, 0, {4})
    res = _batched(tiny_ladder, tmp_path / "skip", skip)
    assert [r["skipped"] for r in res[0].rows] == [False, False, True, False, False, False]
    assert res[0].rows[2]["update_norm"] == 0.0 and res[0].summary["optimizer_updates"] == 5
    assert not any(r["skipped"] or r["nonfinite"] for r in res[1].rows)
    for x, y in zip(ref[1].rows, res[1].rows):
        assert _rel(x["loss"], y["loss"]) < REL and _rel(x["update_norm"], y["update_norm"]) < REL


_RUNNER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from _sft_helpers import prepared, small_recipe
from probeselect.sft.batched import train_seeds

ladder, out, marker = Path({ladder!r}), Path({out!r}), Path({marker!r})
seeds = {seeds!r}
recipe = small_recipe(ladder, seeds=seeds)
preps = [prepared(ladder, recipe, seed=s) for s in seeds]
base, tok, ex, _ = preps[0]

def on_step(seed, step, row):
    if step == 5 and seed == seeds[-1]:  # every run's state of step 4 and log row of step 5 are on disk
        marker.write_text(str(step))
        time.sleep(300)

train_seeds(base.path, recipe, seeds, [out / f"seed{{s}}" for s in seeds], manifests=[p[3] for p in preps],
            examples=ex, pad_id=tok.pad_token_id, base_fingerprint=base.fingerprint, device={device!r}, progress=False,
            on_step=on_step)
"""


def test_batched_resume_after_sigkill_equals_the_uninterrupted_run(tiny_ladder, tmp_path):
    """A real batched run in a subprocess is SIGKILLed after step 5 is logged (states at step 4); the
    resumed batched run equals the uninterrupted batched run: losses, pre-clip norms and final weights
    bitwise (same CPU, one thread, same batch composition), update norms to rel 1e-6."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recipe = small_recipe(tiny_ladder, seeds=SEEDS)
        full = _batched(tiny_ladder, tmp_path / "full", recipe)
        cut, marker = tmp_path / "cut", tmp_path / "killed-at"
        code = _RUNNER.format(tests=str(Path(__file__).parent), ladder=str(tiny_ladder), out=str(cut),
                              marker=str(marker), seeds=SEEDS, device=DEVICE)
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
        for s in SEEDS:
            logged = [json.loads(x) for x in (cut / f"seed{s}" / "train_log.jsonl").read_text().splitlines()]
            assert [r["step"] for r in logged] == [1, 2, 3, 4, 5]
            assert json.loads((cut / f"seed{s}" / "state" / "latest.json").read_text())["step"] == 4
        resumed = _batched(tiny_ladder, cut, recipe)
        for s in SEEDS:
            a, b = full[s].rows, resumed[s].rows
            assert resumed[s].steps_trained == 2
            assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6] and [r["segment"] for r in b] == [0, 0, 0, 0, 1, 1]
            assert [r["sup_tokens"] for r in a] == [r["sup_tokens"] for r in b]
            assert [r["loss"] for r in a] == [r["loss"] for r in b]                            # bitwise
            assert [r["grad_norm_preclip"] for r in a] == [r["grad_norm_preclip"] for r in b]  # bitwise
            assert [x["update_norm"] for x in a] == pytest.approx([y["update_norm"] for y in b], rel=1e-6)
            wa, wb = full[s].get_model(), resumed[s].get_model()
            for (n, p), (m, q) in zip(wa.named_parameters(), wb.named_parameters()):
                assert n == m and torch.equal(p, q)                                            # bitwise
            seg = json.loads((cut / f"seed{s}" / "lineage.json").read_text())["segments"]
            assert [x["status"] for x in seg] == ["interrupted", "complete"]
            assert seg[1]["start_step"] == 4 and seg[1]["parent_state"].endswith("step-000004")
            assert seg[1]["discarded_log_rows"] == 1 and resumed[s].summary["resumes"] == 1
    finally:
        torch.set_num_threads(threads)


def test_batch_seeds_key_default_and_fallbacks(tiny_ladder, tmp_path):
    base = small_recipe(tiny_ladder)
    assert base.batch_seeds is None and base.batch_seeds_effective and "batch_seeds" not in base.raw
    off = small_recipe(tiny_ladder, batch_seeds=False)
    assert off.batch_seeds is False and not off.batch_seeds_effective
    # an execution strategy: not part of the recipe or training hash (states resume across both paths)
    assert off.sha256 == base.sha256 and off.train_sha256 == base.train_sha256
    assert not_batchable_reason(off) == "batch_seeds: false"
    assert "full fine-tuning" in not_batchable_reason(small_recipe(tiny_ladder, method={"type": "full"}))
    assert "dropout" in not_batchable_reason(small_recipe(tiny_ladder, method={"type": "lora", "dropout": 0.1}))
    assert not_batchable_reason(base) is None  # several processes batch too (tests/test_sft_batched_ddp.py)
    with pytest.raises(RecipeError, match="batch_seeds: expected true, false or null"):
        small_recipe(tiny_ladder, batch_seeds="yes")
    with pytest.raises(NotBatchable, match="method.dropout"):
        _batched(tiny_ladder, tmp_path / "x", small_recipe(tiny_ladder, seeds=SEEDS,
                                                           method={"type": "lora", "dropout": 0.1}))
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_batched_lora_init_is_the_single_run_init(tiny_ladder, ladder_checkpoints):
    from probeselect.score import load_model
    from probeselect.sft.loop import _build_model

    recipe = small_recipe(tiny_ladder)
    loaded = load_model(ladder_checkpoints[-1], torch.float32, torch.device(DEVICE))
    for seed in SEEDS:
        torch.manual_seed(999)  # the global RNG state before must not matter
        named, scaling = batched_mod._peft_init(ladder_checkpoints[-1], recipe, seed, torch.device(DEVICE), loaded)
        ref = [(n, p) for n, p in _build_model(ladder_checkpoints[-1], recipe, seed, torch.device(DEVICE))
               .named_parameters() if p.requires_grad]
        assert [n for n, _ in named] == [n for n, _ in ref] and len(scaling) * 2 == len(ref)
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named, ref))
    assert not any("lora" in n for n, _ in loaded.named_parameters())  # the loaded base is left as it was


def test_fused_diagnostics_equal_the_per_run_ones_bitwise():
    from probeselect.sft.diagnostics import UpdateNorms, grad_norms, grad_norms_many

    g = torch.Generator().manual_seed(0)
    runs = []
    for r in range(3):
        named = []
        for name in ("model.layers.0.q.lora_A", "model.layers.0.q.lora_B", "model.layers.1.q.lora_A", "lm_head.x"):
            p = torch.nn.Parameter(torch.randn(5, 7, generator=g) * (r + 1))
            p.grad = torch.randn(5, 7, generator=g) * 10 ** r
            named.append((f"run{r}.{name}", p))
        runs.append(named)
    runs[1][2][1].grad = None  # a parameter without a gradient is skipped, as in grad_norms
    assert grad_norms_many(runs) == [grad_norms(named) for named in runs]  # bitwise, layer groups included
    assert {k for k in grad_norms_many(runs)[0][1]} == {"layers.0", "layers.1", "run0"}

    params = [p for _, p in runs[0]]
    upd = UpdateNorms(params)
    before = [p.detach().clone() for p in params]
    upd.before()
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    ref = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(
        torch._foreach_sub([p.detach() for p in params], before), 2.0, dtype=torch.float32)))
    assert float(upd.after()) == float(ref) > 0  # bitwise the clone-and-subtract norm


def test_packed_examples_do_not_attend_to_each_other(tiny_ladder, ladder_checkpoints):
    """Three examples packed into one row give, at every position of every example, the logits of
    that example run alone. A control run of the same packed row with a plain attention mask (so one
    example can see the previous ones) must differ: the comparison can fail."""
    from probeselect.score import load_model

    recipe = small_recipe(tiny_ladder)
    _, tok, ex, m = _prepared(tiny_ladder, recipe, 0)
    exs = [ex[i] for i in m["steps"][0]["ids"][:3]]
    model = load_model(ladder_checkpoints[-1], torch.float32, torch.device(DEVICE)).eval()
    batch = {k: v.to(DEVICE) for k, v in batched_mod.pack([exs], tok.pad_token_id).items()}
    assert batch["position_ids"][0].tolist()[: sum(len(e.input_ids) for e in exs)] == \
        [i for e in exs for i in range(len(e.input_ids))]
    with torch.no_grad():
        # use_cache=False as in training: with a cache transformers does not look for packed sequences
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                      attention_mask=torch.ones_like(batch["input_ids"])).logits[0]
        start, worst, leak = 0, 0.0, 0.0
        for e in exs:
            alone = model(input_ids=torch.tensor([e.input_ids], device=DEVICE)).logits[0]
            k = len(e.input_ids)
            worst = max(worst, float((packed[start: start + k] - alone).abs().max()))
            leak = max(leak, float((leaky[start: start + k] - alone).abs().max()))
            start += k
    assert worst < 1e-4, worst
    assert leak > 1e-2, leak  # the control sees across examples and differs
    # the guard run before packed training: true here, false for a model that lets examples see each other

    class Leaky(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, **kw):
            return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kw)

    assert batched_mod.packing_isolates(model, exs, tok.pad_token_id)
    assert not batched_mod.packing_isolates(Leaky(model), exs, tok.pad_token_id)
    # the loss of the packed row is the sum of the examples' own losses (labels[0] of each is IGNORE)
    groups = [(0, 1)]
    with torch.no_grad():
        total = float(batched_mod._rows_nll(model, batch, groups)[0])
        alone = sum(float(batched_mod._rows_nll(model, collate_one(e, tok.pad_token_id), groups)[0]) for e in exs)
    assert total == pytest.approx(alone, rel=1e-5)


def collate_one(e, pad_id):
    from probeselect.sft.data import collate

    return {k: v.to(DEVICE) for k, v in collate([e], pad_id).items()}


def test_padded_batched_seeds_equal_single_runs(tiny_ladder, tmp_path):
    """The other layout of batched seeds (packed=False: every example right-padded to the longest of
    all runs' micro-batches; the default, packed, is covered by the tests above)."""
    assert batched_mod.PACKED  # the default
    recipe = small_recipe(tiny_ladder, seeds=SEEDS, budget={"optimizer_steps": 3})
    single = {s: _single(tiny_ladder, tmp_path / "single", recipe, s) for s in SEEDS}
    bat = _batched(tiny_ladder, tmp_path / "padded", recipe, packed=False)
    for s in SEEDS:
        for x, y in zip(single[s].rows, bat[s].rows):
            for key in ("loss", "grad_norm_preclip", "clip_coef", "update_norm"):
                assert _rel(x[key], y[key]) < REL, (s, key, x[key], y[key])
            assert x["sup_tokens"] == y["sup_tokens"]


def test_batched_kill_resume_reload_manifests_and_all_skipped(tiny_ladder, tmp_path, monkeypatch):
    """Per-run bookkeeping of the batched path, in process: a stop inside step 3's ``on_step`` resumes
    into rows equal to an uninterrupted run's (spike fields from the kept rows' losses included); a
    finished run reloads without a segment; a data_manifest.json left without a state is replaced, one
    that no longer matches its state is refused; a run whose every step is skipped is failed alone."""
    from probeselect.errors import ManifestMismatchError

    # as the pilot trains (pilot.deterministic_torch): one thread, deterministic kernels. On CUDA the per-layer
    # gradient norms' index_add_ is deterministic only in that mode (a GPU run without it found
    # layer_grad_norms differing in the last bits between two identical runs; bench/README.md, tenth session)
    with deterministic_torch(1):
        recipe = small_recipe(tiny_ladder, seeds=SEEDS, diagnostics={"spike_window": 4, "spike_min_history": 2,
                                                                     "spike_threshold": 0.001, "spike_z": 0.5})
        _, _, _, mans = _setup(tiny_ladder, recipe)
        stale = tmp_path / "full" / "seed0" / "data_manifest.json"
        stale.parent.mkdir(parents=True)
        stale.write_text(json.dumps(mans[1]))  # left over, no state: replaced
        full = _batched(tiny_ladder, tmp_path / "full", recipe, heldout=None)
        assert json.loads(stale.read_text()) == mans[0]
        assert any(r["spike_margin"] is not None for r in full[0].rows[2:4])

        def kill(seed, step, row):
            if step == 3 and seed == SEEDS[-1]:
                raise KeyboardInterrupt

        cut = tmp_path / "cut"
        with pytest.raises(KeyboardInterrupt):
            _batched(tiny_ladder, cut, recipe, heldout=None, on_step=kill)
        resumed = _batched(tiny_ladder, cut, recipe, heldout=None)
        for s in SEEDS:
            a, b = full[s], resumed[s]
            differ = [(x["step"], k) for x, y in zip(a.rows, b.rows) for k in x if k != "segment" and x[k] != y.get(k)]
            assert not differ, differ  # (step, field) pairs that differ: every field is bitwise equal
            assert [{k: v for k, v in r.items() if k != "segment"} for r in b.rows] == \
                [{k: v for k, v in r.items() if k != "segment"} for r in a.rows]
            assert [r["segment"] for r in b.rows] == [0, 0, 1, 1, 1, 1] and b.steps_trained == 4
            logged = [json.loads(x) for x in (cut / f"seed{s}" / "train_log.jsonl").read_text().splitlines()]
            assert logged == b.rows and [list(r) for r in logged] == [list(r) for r in a.rows]
            seg = json.loads((cut / f"seed{s}" / "lineage.json").read_text())["segments"]
            assert [(x["status"], x["end_step"]) for x in seg] == [("interrupted", 2), ("complete", 6)]
            assert seg[1]["start_step"] == 2 and seg[1]["discarded_log_rows"] == 1
            assert seg[1]["parent_state"] == str(cut / f"seed{s}" / "state" / "step-000002")
            assert list(b.lineage[1]) == list(a.lineage[0]) and b.summary["resumes"] == 1
        again = _batched(tiny_ladder, cut, recipe, heldout=None)
        for s in SEEDS:
            assert again[s].steps_trained == 0 and again[s].rows == resumed[s].rows
            assert again[s].lineage == json.loads((cut / f"seed{s}" / "lineage.json").read_text())["segments"]
            assert len(again[s].lineage) == 2 and again[s].summary == resumed[s].summary
            torch.testing.assert_close(dict(again[s].get_model().named_parameters()),
                                       dict(resumed[s].get_model().named_parameters()), rtol=0, atol=0)
        (cut / "seed1" / "data_manifest.json").write_text(json.dumps(mans[0]))
        with pytest.raises(ManifestMismatchError, match="seed1/data_manifest.json: differs .* file was modified"):
            _batched(tiny_ladder, cut, recipe, heldout=None)

        skip = small_recipe(tiny_ladder, seeds=SEEDS, budget={"optimizer_steps": 3}, diagnostics={"nonfinite": "skip"})
        _poison_group(monkeypatch, 0, set(range(1000)))
        res = _batched(tiny_ladder, tmp_path / "allskip", skip, heldout=None)
        assert isinstance(res[0], NonfiniteGradientError) and "all 3 optimizer steps were nonfinite" in str(res[0])
        seg = json.loads((tmp_path / "allskip" / "seed0" / "lineage.json").read_text())["segments"]
        assert [(x["status"], x["end_step"]) for x in seg] == [("failed", 3)]
        assert [r["step"] for r in res[1].rows] == [1, 2, 3] and not any(r["skipped"] for r in res[1].rows)
        assert json.loads((tmp_path / "allskip" / "seed1" / "lineage.json").read_text())["segments"][0]["status"] \
            == "complete"


def test_grad_accum_not_split_by_the_process_count_is_the_single_run_error(tiny_ladder, tmp_path, monkeypatch):
    """Under W processes each rank takes micro-batches rank::W of every run: grad_accum must be a multiple
    of W, refused with the single-run loop's own RecipeError before anything is written."""
    from probeselect.sft import loop as loop_mod

    real = loop_mod._make_accelerator

    class TwoProcesses:  # the accelerator a 2-process launch would give, as far as the check reads it
        num_processes = 2

        def __init__(self, acc):
            self._acc = acc

        def __getattr__(self, name):
            return getattr(self._acc, name)

    fake = lambda device, precision: TwoProcesses(real(device, precision))  # noqa: E731
    monkeypatch.setattr(loop_mod, "_make_accelerator", fake)
    monkeypatch.setattr(batched_mod, "_make_accelerator", fake)
    recipe = small_recipe(tiny_ladder, seeds=SEEDS, optimizer__grad_accum=3)
    with pytest.raises(RecipeError, match=r"grad_accum=3 must be a multiple of the process count \(2\)") as single:
        _single(tiny_ladder, tmp_path / "single", recipe, SEEDS[0])
    with pytest.raises(RecipeError) as bat:
        _batched(tiny_ladder, tmp_path / "batched", recipe)
    assert str(bat.value) == str(single.value)
    assert not (tmp_path / "batched").exists()


def test_bounded_packing_keeps_rows_short_and_examples_apart(tiny_ladder, ladder_checkpoints):
    """``pack_rows`` with a bound: every row holds at most ``row_len`` tokens, every example of a run
    lands exactly once in that run's consecutive rows, and each example's logits there equal its
    logits alone (several examples per row, several rows per run). The one-row layout is the control:
    its rows exceed the bound, so the bound is what shortens them."""
    from probeselect.score import load_model

    recipe = small_recipe(tiny_ladder)
    _, tok, ex, m = _prepared(tiny_ladder, recipe, 0)
    ids = m["steps"][0]["ids"]
    runs = [[ex[i] for i in ids[:8]], [ex[i] for i in ids[8:13]]]
    bound = max(len(e.input_ids) for r in runs for e in r)
    batch, counts = batched_mod.pack_rows(runs, tok.pad_token_id, bound)
    one_row, ones = batched_mod.pack_rows(runs, tok.pad_token_id)
    assert ones == [1, 1] and one_row["input_ids"].shape[1] > bound  # the control is longer than the bound
    assert batch["input_ids"].shape[0] == sum(counts) and batch["input_ids"].shape[1] <= bound
    assert counts[0] >= 2 and len(counts) == 2
    model = load_model(ladder_checkpoints[-1], torch.float32, torch.device(DEVICE)).eval()
    batch = {k: v.to(DEVICE) for k, v in batch.items()}
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        row, multi = 0, 0
        for run, n_rows in zip(runs, counts):
            seen = []
            for r in range(row, row + n_rows):
                pos = batch["position_ids"][r].tolist()
                starts = [i for i, p in enumerate(pos) if p == 0]
                used = int((batch["labels"][r] != -100).sum())
                assert used > 0
                found = 0
                for s in starts:
                    e = next((e for e in run if batch["input_ids"][r, s: s + len(e.input_ids)].tolist()
                              == list(e.input_ids) and all(x is not e for x in seen)), None)
                    if e is None:
                        continue  # the pad tail restarts its own position run
                    seen.append(e)
                    found += 1
                    alone = model(input_ids=torch.tensor([e.input_ids], device=DEVICE)).logits[0]
                    assert float((logits[r, s: s + len(e.input_ids)] - alone).abs().max()) < 1e-4
                multi = max(multi, found)
            assert sorted(map(id, seen)) == sorted(map(id, run))  # each example exactly once
            row += n_rows
    assert multi >= 2  # some row holds several examples, so isolation inside a row is tested
