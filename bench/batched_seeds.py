"""Batched seeds vs one seed at a time: wall time of the pilot and confirmation stages (issue 26).

Run: python bench/batched_seeds.py LADDER [--pilot-steps 150] [--confirm-steps 300] [--rounds 2]
     [--out /tmp/bench-batched]

LADDER is a toy ladder folder (`probeselect toy-ladder DIR`; the model is the demo's: Llama,
hidden 64, 3 layers). The pilot stage is `run_pilot` with recipes/pilot.yaml on the last 3
checkpoints, 3 seeds; the confirmation stage is `run_pilot` with recipes/confirm.yaml on the
last 2 checkpoints, 3 seeds - the demo's shapes (data and transfer paths pointed at LADDER/data,
budgets from the flags). Each stage runs with ``batch_seeds=false`` (the single-run loop, the
reference) and ``batch_seeds=true``, interleaved (false, true, false, true, ...) into fresh
folders, so both see the same machine load; the 1-minute load average is printed before and
after each run. Reported per run: stage wall time (training + transfer evaluation + outputs)
and the training seconds summed from diagnostics.csv (batched steps are split evenly among
their seeds, so the sum is the batched wall time of training). One torch thread per process, as a
pilot. Variants: ``single`` (batch_seeds=false), ``batched`` (seeds batched, padded rows: the path
before bounded packing), ``packed`` (the default: seeds batched, packed rows), ``jobsN`` (the default
with ``jobs=N``, e.g. ``jobs2``: N bases at once in N worker processes, which always run the default
packed path; its train_s sums the processes' training time, so compare wall_s; ``--pilot-jobs M`` gives
the pilot stage M instead). Stages run one after the other in this one process, as in ``probeselect run``:
with the forkserver start method (the default on Linux) the worker server started by the first stage
serves the later ones, so compare whole commands with ``--rounds 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stage(ladder: Path, recipe: str, bases: list[Path], steps: int, batch, out: Path, jobs: int = 1,
           device: str = "cpu") -> dict:
    from probeselect.pilot import run_pilot
    from probeselect.sft import batched

    batched.PACKED = batch == "packed"

    d = ladder / "data"
    over = [f"data.train={d / 'sft.jsonl'}", f"transfer.tasks={d / 'transfer.jsonl'}",
            f"transfer.robustness={d / 'robustness.jsonl'}", f"transfer.heldout={d / 'sft_heldout.jsonl'}",
            f"budget.optimizer_steps={steps}", f"batch_seeds={'true' if batch else 'false'}"]
    shutil.rmtree(out, ignore_errors=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = run_pilot(bases, REPO / "recipes" / recipe, out, progress=False, device=device, overrides=over, jobs=jobs)
    wall = time.perf_counter() - t0
    return {"recipe": recipe, "steps": steps, "batch_seeds": batch, "jobs": jobs, "device": device, "wall_s": round(wall, 1),
            "train_s": round(float(res.diagnostics["seconds"].sum()), 1), "runs": len(res.diagnostics),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "final_loss_mean": float(res.diagnostics["final_loss"].mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("--pilot-steps", type=int, default=150)
    ap.add_argument("--confirm-steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-batched"))
    ap.add_argument("--stages", default="pilot,confirm")
    ap.add_argument("--pilot-jobs", type=int, default=None,
                    help="jobs of the pilot stage in a jobsN variant (default N), e.g. 3 for 3 bases on 2 cores")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the stages train and evaluate on one GPU (jobsN: N worker processes share it)")
    ap.add_argument("--variants", default="single,batched",
                    help="comma list of single, batched, packed, jobsN (the default packed path, N bases at once "
                         "in N processes, e.g. jobs2, jobs3)")
    args = ap.parse_args(argv)
    from probeselect.checkpoints import discover_checkpoints

    ckpts = [c.path for c in discover_checkpoints(args.ladder)]
    rows = []
    for r in range(args.rounds):
        for recipe, bases, steps in (("pilot.yaml", ckpts[-3:], args.pilot_steps),
                                     ("confirm.yaml", ckpts[-2:], args.confirm_steps)):
            if recipe.split(".")[0] not in args.stages.split(","):
                continue
            for v in args.variants.split(","):
                jobs = int(v[4:]) if v.startswith("jobs") else 1
                if jobs > 1 and recipe == "pilot.yaml" and args.pilot_jobs:
                    jobs = args.pilot_jobs
                batch = "packed" if jobs > 1 else {"single": False, "batched": True, "packed": "packed"}[v]
                row = _stage(args.ladder, recipe, bases, steps, batch, args.out / f"r{r}-{recipe}-{v}", jobs=jobs,
                             device=args.device)
                row["round"], row["variant"] = r, v
                rows.append(row)
                print(json.dumps(row), flush=True)
    for recipe in ("pilot.yaml", "confirm.yaml"):
        for key in ("wall_s", "train_s"):
            a = [x[key] for x in rows if x["recipe"] == recipe and x["variant"] == "single"]
            for v in dict.fromkeys(x["variant"] for x in rows if x["variant"] != "single"):
                b = [x[key] for x in rows if x["recipe"] == recipe and x["variant"] == v]
                if a and b:
                    print(f"{recipe} {key}: one seed at a time {a} | {v} {b} | speed-up per round "
                          f"{[round(x / y, 2) for x, y in zip(a, b)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
