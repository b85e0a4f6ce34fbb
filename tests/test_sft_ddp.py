"""Multi-process training under `accelerate launch` (2 CPU processes, gloo): the per-step loss
and the pre-clip global norm equal a 1-process run with the same effective batch.

grad_accum=4 over 2 processes: each rank runs 2 micro-batches per optimizer step, the first
under ``no_sync``, so accumulation under DDP is exercised; tau sits between the observed
pre-clip norms so some steps clip and some do not (a norm summed over ranks would clip
differently)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from _sft_helpers import prepared, small_recipe
from probeselect.sft.loop import train

TESTS = Path(__file__).resolve().parent
STEPS, ACCUM = 6, 4

WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from _sft_helpers import prepared, small_recipe
    from probeselect.sft import loop
    ladder, out, tau = sys.argv[1], sys.argv[2], float(sys.argv[3])
    calls = [0]
    real = loop.microbatch_nll
    def counted(model, batch):
        calls[0] += 1
        return real(model, batch)
    loop.microbatch_nll = counted
    recipe = small_recipe(ladder, budget={{"optimizer_steps": {steps}}}, optimizer__grad_accum={accum},
                          optimizer__clip={{"max_norm": tau}})
    base, tok, ex, m = prepared(ladder, recipe)
    res = loop.train(base.path, recipe, 0, out, manifest=m, examples=ex, pad_id=tok.pad_token_id,
                     base_fingerprint=base.fingerprint, device="cpu", progress=False)
    with open(os.path.join(out, "calls-rank" + os.environ.get("RANK", "0") + ".json"), "w") as f:
        json.dump(calls[0], f)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_process(ladder, out, tau):
    recipe = small_recipe(ladder, budget={"optimizer_steps": STEPS}, optimizer__grad_accum=ACCUM,
                          optimizer__clip={"max_norm": tau})
    base, tok, ex, m = prepared(ladder, recipe)
    return train(base.path, recipe, 0, out, manifest=m, examples=ex, pad_id=tok.pad_token_id,
                 base_fingerprint=base.fingerprint, device="cpu", progress=False).rows


def test_two_processes_match_one(tiny_ladder, tmp_path):
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if launcher is None:
        pytest.skip("accelerate CLI not installed")
    # tau between the observed pre-clip norms: clipping engages on some steps only
    free = [r["grad_norm_preclip"] for r in _one_process(tiny_ladder, tmp_path / "free", None)]
    for q in (0.5, 0.33, 0.67):
        tau = float(np.quantile(free, q))
        one = _one_process(tiny_ladder, tmp_path / f"one-{q}", tau)
        if 0 < sum(r["clipped"] for r in one) < STEPS:
            break
    clipped = [r["clipped"] for r in one]
    print(f"tau {tau:.4f} (unclipped norms {np.round(free, 4).tolist()}); clipped {clipped}")
    assert any(clipped) and not all(clipped)

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), steps=STEPS, accum=ACCUM))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", None)
    # `--multi_gpu` selects accelerate's torch.distributed launcher; without CUDA it runs MULTI_CPU
    # (gloo). (`--cpu --num_processes 2` would start a single process.)
    cmd = [launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(_free_port()), str(script), str(tiny_ladder),
           str(tmp_path / "ddp"), repr(tau)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = [json.loads(line) for line in (tmp_path / "ddp" / "train_log.jsonl").read_text().splitlines()]
    seg = json.loads((tmp_path / "ddp" / "lineage.json").read_text())["segments"]
    assert seg[0]["world_size"] == 2
    # each rank ran ACCUM / 2 = 2 micro-batches per optimizer step
    assert [json.loads((tmp_path / "ddp" / f"calls-rank{r}.json").read_text()) for r in (0, 1)] == [2 * STEPS] * 2

    assert [r["sup_tokens"] for r in ddp] == [r["sup_tokens"] for r in one]
    d_loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(ddp, one))
    d_norm = max(abs(a["grad_norm_preclip"] - b["grad_norm_preclip"]) / b["grad_norm_preclip"] for a, b in zip(ddp, one))
    print(f"2-process vs 1-process: max |dloss| {d_loss:.2e}, max rel |dnorm| {d_norm:.2e}")
    assert len(ddp) == len(one) == STEPS
    assert d_loss <= 1e-5 and d_norm <= 1e-4
    # a norm summed over ranks instead of counted once would be sqrt(2) or 2 times larger
    assert [r["clipped"] for r in ddp] == clipped
    assert [r["update_norm"] for r in ddp] == pytest.approx([r["update_norm"] for r in one], rel=1e-4)
