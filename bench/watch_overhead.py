"""Training slowdown of ProbeCallback (issue 27): a short HF Trainer run on a toy-ladder
checkpoint, without the callback, with it in background mode, and with it in-process.

    PYTHONPATH=src python bench/watch_overhead.py --ladder LADDER --steps 60 --save-steps 20

LADDER is a toy ladder (``probeselect toy-ladder``); training starts from its last
checkpoint on random token sequences. "train wall" is ``trainer.train()`` with
``wait_at_end=False`` (the loop's own time); "drain" is the wait for background scoring
still running when training ended. Prints one markdown row per mode.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _run(ladder: Path, probes, steps: int, save_steps: int, mode: str, work: Path, batch: int, length: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from probeselect.checkpoints import discover_checkpoints
    from probeselect.integrations import add_probe_callback

    ckpt = discover_checkpoints(ladder)[-1].path
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(3, len(tok), (steps * batch, length), generator=g)
    ds = [{"input_ids": x, "labels": x.clone()} for x in data]
    out = work / mode
    shutil.rmtree(out, ignore_errors=True)
    args = TrainingArguments(output_dir=str(out / "train"), max_steps=steps, save_steps=save_steps,
                             save_strategy="steps", per_device_train_batch_size=batch, logging_steps=10, report_to=[],
                             use_cpu=True, disable_tqdm=True, save_only_model=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    cb = None
    if mode != "none":
        cb = add_probe_callback(trainer, probes, out / "run", background=(mode == "background"), wait_at_end=False,
                                seeds=(0, 1), audit_items=0, plots=False, device="cpu")
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    if cb is not None and cb.background:
        cb._pump(trainer.state, wait=True)
    drain = time.perf_counter() - t1
    n_scored = len(cb.logged) if cb is not None else 0
    return wall, drain, (cb.blocked_s if cb else 0.0), n_scored


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ladder", required=True)
    ap.add_argument("--probes", nargs="+", default=["probes/arith_pattern.yaml"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["none", "background", "inprocess"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="watch_overhead_"))
    rows = {}
    for mode in a.modes:
        rows[mode] = _run(Path(a.ladder), a.probes, a.steps, a.save_steps, mode, work, a.batch, a.length)
    base = rows.get("none", (None,))[0]
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("| mode | train wall (s) | slowdown vs none | blocked in callback (s) | drain after train (s) | checkpoints scored |")
    print("|---|---|---|---|---|---|")
    for mode, (wall, drain, blocked, n) in rows.items():
        slow = f"{(wall / base - 1) * 100:+.1f}%" if base else "n/a"
        print(f"| {mode} | {wall:.1f} | {slow} | {blocked:.2f} | {drain:.1f} | {n} |")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
