"""Batched seeds under `accelerate launch` (2 CPU processes, gloo) equal batched seeds in 1 process,
including a stop and a resume under 2 processes and a nonfinite loss seen by one rank only.

grad_accum=4 over 2 processes: each rank runs micro-batches 0, 2 (rank 0) or 1, 3 (rank 1) of every
run at every step and the stacked LoRA gradients are summed over the ranks. tau sits between the two
runs' first pre-clip norms, so at step 1 exactly one run clips: a norm taken over both runs, or
a norm of one rank's partial gradient, would clip differently. The 2-process run is stopped after
step 3 is logged (states at step 2) and resumed by a second launch; a third launch poisons one
rank's micro-batch. Slow (three launches, ~1-3 min on 2 cores): `make test-slow`."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _sft_helpers import prepared, small_recipe
from probeselect.sft.batched import train_seeds

TESTS = Path(__file__).resolve().parent
SEEDS, STEPS, ACCUM = [0, 1], 6, 4
# float32 tolerance of 2 processes vs 1 (measured: see bench/README.md, batched seeds). Each rank
# packs other micro-batches into its forward and the gradients are summed in another order, so the
# numbers agree to rounding: losses, pre-clip norms, clip coefficients, update norms and held-out
# losses asserted at 1e-5 relative; weights at lr / 100 absolute per coordinate (AdamW divides by each
# coordinate's own gradient RMS, so a near-zero gradient turns rounding into part of an lr step).
REL = 1e-5

WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    import torch
    from _sft_helpers import prepared, small_recipe
    from probeselect.sft import batched
    ladder, out, tau, stop = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    poison = sys.argv[5]  # "RANK:CALL": that rank's CALL-th rows_nll makes the last run's NLL infinite
    seeds = {seeds!r}
    rank = os.environ.get("RANK", "0")
    calls = [0]
    real = batched.rows_nll
    def counted(model, batch, groups):
        calls[0] += 1
        out = real(model, batch, groups)
        if poison == f"{{rank}}:{{calls[0] - 1}}":
            out = out * torch.tensor([float("inf") if k == len(seeds) - 1 else 1.0 for k, _ in groups])
        return out
    batched.rows_nll = counted
    recipe = small_recipe(ladder, seeds=seeds, budget={{"optimizer_steps": {steps}}}, optimizer__grad_accum={accum},
                          optimizer__clip={{"max_norm": tau}}, eval={{"every": 3, "max_items": 16}})
    preps = [prepared(ladder, recipe, seed=s) for s in seeds]
    base, tok, ex, _ = preps[0]
    from probeselect.sft.data import encode_rows, load_rows
    heldout = encode_rows(load_rows(recipe.transfer["heldout"])[:16], tok, max_length=recipe.max_length)
    def on_step(seed, step, row):
        if step == stop and seed == seeds[-1]:  # every run's step `stop` logged, its state of step stop - 1 saved
            (out / f"stopped-rank{{rank}}.json").write_text(json.dumps(calls[0]))
            sys.exit(0)
    res = batched.train_seeds(base.path, recipe, seeds, [out / f"seed{{s}}" for s in seeds],
                              manifests=[p[3] for p in preps], examples=ex, pad_id=tok.pad_token_id,
                              base_fingerprint=base.fingerprint, heldout=heldout, device="cpu", progress=False,
                              on_step=on_step)
    (out / f"calls-rank{{rank}}.json").write_text(json.dumps(calls[0]))
    (out / f"results-rank{{rank}}.json").write_text(json.dumps(
        {{s: type(r).__name__ if isinstance(r, BaseException) else r.is_main for s, r in res.items()}}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_process(ladder, out, tau, steps=STEPS):
    recipe = small_recipe(ladder, seeds=SEEDS, budget={"optimizer_steps": steps}, optimizer__grad_accum=ACCUM,
                          optimizer__clip={"max_norm": tau}, eval={"every": 3, "max_items": 16})
    from probeselect.sft.data import encode_rows, load_rows

    preps = [prepared(ladder, recipe, seed=s) for s in SEEDS]
    base, tok, ex, _ = preps[0]
    heldout = encode_rows(load_rows(recipe.transfer["heldout"])[:16], tok, max_length=recipe.max_length)
    return train_seeds(base.path, recipe, SEEDS, [out / f"seed{s}" for s in SEEDS], manifests=[p[3] for p in preps],
                       examples=ex, pad_id=tok.pad_token_id, base_fingerprint=base.fingerprint, heldout=heldout,
                       device="cpu", progress=False)


def _rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


@pytest.mark.slow
def test_batched_seeds_two_processes_match_one_with_resume(tiny_ladder, tmp_path):
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if launcher is None:
        pytest.skip("accelerate CLI not installed")
    probe = _one_process(tiny_ladder, tmp_path / "probe", None, 1)
    first = {s: r.rows[0]["grad_norm_preclip"] for s, r in probe.items()}
    assert _rel(first[0], first[1]) > 0.05, first
    tau = math.sqrt(first[0] * first[1])  # at step 1 exactly one run clips
    lr = small_recipe(tiny_ladder).optimizer.lr
    one = _one_process(tiny_ladder, tmp_path / "one", tau)
    assert sorted(one[s].rows[0]["clipped"] for s in SEEDS) == [False, True]

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), seeds=SEEDS, steps=STEPS, accum=ACCUM))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", None)
    ddp = tmp_path / "ddp"

    def launch(out, stop, poison="-"):
        # `--multi_gpu` selects accelerate's torch.distributed launcher; without CUDA it runs MULTI_CPU (gloo)
        cmd = [launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
               "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()), str(script), str(tiny_ladder),
               str(out), repr(tau), str(stop), poison]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]

    launch(ddp, 3)  # stopped after step 3 is logged on both ranks
    assert all((ddp / f"stopped-rank{r}.json").is_file() for r in (0, 1))
    for s in SEEDS:
        logged = [json.loads(x) for x in (ddp / f"seed{s}" / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in logged] == [1, 2, 3]
        assert json.loads((ddp / f"seed{s}" / "state" / "latest.json").read_text())["step"] == 2
    launch(ddp, 0)  # resumes every run from its state of step 2
    # steps 3-6 resumed: 4 steps x 2 of the 4 micro-batches per rank; held-out (1 call at steps 3, 6) on rank 0 only
    assert [json.loads((ddp / f"calls-rank{r}.json").read_text()) for r in (0, 1)] == [4 * 2 + 2, 4 * 2]
    assert [json.loads((ddp / f"results-rank{r}.json").read_text()) for r in (0, 1)] == \
        [{str(s): True for s in SEEDS}, {str(s): False for s in SEEDS}]  # TrainResult.is_main

    worst = {}
    for s in SEEDS:
        a = one[s].rows
        b = [json.loads(x) for x in (ddp / f"seed{s}" / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in b] == list(range(1, STEPS + 1)) and [r["segment"] for r in b] == [0, 0, 1, 1, 1, 1]
        for key in ("clipped", "sup_tokens", "lr", "nonfinite", "skipped"):
            assert [r[key] for r in a] == [r[key] for r in b], key
        for key in ("loss", "grad_norm_preclip", "clip_coef", "update_norm", "heldout_loss"):
            vals = [_rel(x[key], y[key]) for x, y in zip(a, b) if key in x]
            assert [key in x for x in a] == [key in y for y in b] and len(vals) == (2 if key == "heldout_loss" else 6)
            worst[key] = max(worst.get(key, 0.0), *vals)
            assert max(vals) < REL, (s, key, vals)
        sd, bd = tmp_path / "one" / f"seed{s}", ddp / f"seed{s}"
        manifests = [json.loads((d / "data_manifest.json").read_text()) for d in (sd, bd)]
        assert manifests[0] == manifests[1]
        final = f"state/step-{STEPS:06d}"
        wa, wb = (load_file(str(d / final / "trainable.safetensors")) for d in (sd, bd))
        assert wa.keys() == wb.keys() and wa
        for n in wa:
            torch.testing.assert_close(wb[n], wa[n], rtol=0, atol=lr / 100)
        worst["weights_abs"] = max(worst.get("weights_abs", 0.0), max(float((wa[n] - wb[n]).abs().max()) for n in wa))
        assert sorted(p.name for p in (bd / final).iterdir()) == sorted(
            [p.name for p in (sd / final).iterdir()] + ["rng-rank1.pt"])  # each rank's RNG streams
        seg = json.loads((bd / "lineage.json").read_text())["segments"]
        assert [(x["status"], x["world_size"], x["start_step"], x["end_step"]) for x in seg] == \
            [("interrupted", 2, 0, 2), ("complete", 2, 2, 6)]
        assert seg[1]["parent_state"].endswith("step-000002") and seg[1]["discarded_log_rows"] == 1
        assert seg[1]["batched_seeds"] == SEEDS and seg[1]["packed"] is True
    print("max relative difference 2 processes vs 1:", worst)

    # A nonfinite NLL of the last run in rank 1's first micro-batch of step 2 (its 3rd rows_nll call)
    # only: rank 0's own gradient is finite, the summed one is not, and both ranks fail that run alone.
    bad = tmp_path / "nonfinite"
    launch(bad, 0, poison="1:2")
    assert [json.loads((bad / f"results-rank{r}.json").read_text()) for r in (0, 1)] == \
        [{"0": True, "1": "NonfiniteGradientError"}, {"0": False, "1": "NonfiniteGradientError"}]
    failed = bad / f"seed{SEEDS[-1]}"
    assert json.loads((failed / "nonfinite_batch.json").read_text())["step"] == 2
    assert sorted(p.name for p in (failed / "state" / "nonfinite-step-000002").glob("rng-rank*.pt")) == \
        ["rng-rank0.pt", "rng-rank1.pt"]
    assert json.loads((failed / "lineage.json").read_text())["segments"][-1]["status"] == "failed"
    kept = [json.loads(x) for x in (bad / f"seed{SEEDS[0]}" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == list(range(1, STEPS + 1)) and not any(r["nonfinite"] for r in kept)
    for x, y in zip(one[SEEDS[0]].rows, kept):  # the other run trained on as if alone
        assert _rel(x["loss"], y["loss"]) < REL and _rel(x["grad_norm_preclip"], y["grad_norm_preclip"]) < REL
        assert x["clipped"] == y["clipped"]
