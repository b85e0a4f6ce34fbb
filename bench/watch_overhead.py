"""Training slowdown of ProbeCallback (issue 27): a short HF Trainer run on a toy-ladder
checkpoint, without the callback, with it in background mode, and with it in-process.

    PYTHONPATH=src python bench/watch_overhead.py --ladder LADDER --steps 60 --save-steps 20 --repeats 3

LADDER is a toy ladder (``probeselect toy-ladder``); training starts from its last
checkpoint on random token sequences. "train wall" is ``trainer.train()`` with
``wait_at_end=False`` (the loop's own time); "drain" is the wait for background scoring
still running when training ended. The modes are interleaved: repeat r runs every mode
once, in an order rotated by r (so no mode always runs first or after the same one); the
slowdown is of the medians. Training uses ``--train-threads`` torch threads and the
background scoring child ``--child-threads`` (``OMP_NUM_THREADS`` of the child; the
in-process mode scores with the training's threads). Prints every run, then one markdown
row per mode, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of every mode (default 1)")
    ap.add_argument("--train-threads", type=int, default=1, help="torch threads of the training (default 1)")
    ap.add_argument("--child-threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the background scoring child (default 1)")
    a = ap.parse_args()
    torch.set_num_threads(a.train_threads)
    os.environ["OMP_NUM_THREADS"] = str(a.child_threads)  # inherited by the scoring child only
    work = Path(tempfile.mkdtemp(prefix="watch_overhead_"))
    runs: dict[str, list] = {m: [] for m in a.modes}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)",
          flush=True)
    for r in range(a.repeats):
        order = a.modes[r % len(a.modes):] + a.modes[: r % len(a.modes)]
        for mode in order:
            res = _run(Path(a.ladder), a.probes, a.steps, a.save_steps, mode, work, a.batch, a.length)
            runs[mode].append(res)
            print(f"repeat {r} {mode}: train wall {res[0]:.2f} s, blocked {res[2]:.2f} s, drain {res[1]:.1f} s, "
                  f"{res[3]} scored; load average {os.getloadavg()[0]:.2f}", flush=True)
    med = {m: [statistics.median(x[i] for x in rs) for i in range(3)] + [rs[0][3]] for m, rs in runs.items()}
    base = med["none"][0] if "none" in med else None
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"| mode | train wall (s), median of {a.repeats} [min-max] | slowdown vs none | blocked in callback (s) "
          "| drain after train (s) | checkpoints scored |")
    print("|---|---|---|---|---|---|")
    for mode, (wall, drain, blocked, n) in med.items():
        slow = f"{(wall / base - 1) * 100:+.1f}%" if base else "n/a"
        lo, hi = min(x[0] for x in runs[mode]), max(x[0] for x in runs[mode])
        print(f"| {mode} | {wall:.2f} [{lo:.2f}-{hi:.2f}] | {slow} | {blocked:.2f} | {drain:.1f} | {n} |")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
