"""``probeselect pilot``: a thin wrapper over :func:`probeselect.pilot.run_pilot`."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .._cli_common import DEVICE_HELP, check_device


def _cmd_pilot(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..pilot import run_pilot

    from pathlib import Path

    # `--bases A B key=v` swallows trailing overrides; give back anything that is not a path.
    bases = [b for b in args.bases if "=" not in b or Path(b).exists()]
    overrides = [b for b in args.bases if b not in bases] + list(args.overrides)
    check_device(args.device)
    t0 = time.perf_counter()
    res = run_pilot(bases, args.recipe, args.out, progress=not args.no_progress, merged=args.merged,
                    device=args.device, ladder=args.ladder, overrides=overrides, jobs=args.jobs)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    n = len(res.trained) + len(res.reused) + len(res.reevaluated)
    re_eval = f"{len(res.reevaluated)} re-evaluated, " if res.reevaluated else ""
    print(f"pilot: {n} runs ({len(res.trained)} trained, {re_eval}{len(res.reused)} already done) in "
          f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        if len(res.transfer):
            wide = res.transfer.pivot_table(index=["base", "seed"], columns="metric", values="value")
            print(wide.to_string(float_format=lambda x: f"{x:.3f}"))
        cols = ["base", "seed", "steps", "clip_fraction", "grad_norm_p50", "grad_norm_p90", "grad_norm_max",
                "nonfinite", "skipped", "spikes", "resumes", "tokens_per_s", "final_loss"]
        print(res.diagnostics[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {res.out_dir}/ (transfer.csv, transfer_items.parquet, diagnostics.csv, manifest.json, "
          "<base>/seed<S>/)")
    return 0


def add_parsers(sub) -> None:
    """Register ``pilot`` on the top-level subparsers."""
    p = sub.add_parser(
        "pilot", help="matched pilot SFT of shortlisted bases, then held-out transfer evaluation",
        description="Train every base under every recipe seed on one data manifest per seed (identical examples "
                    "and order for every base), log per-step run diagnostics, save peft adapters and evaluate the "
                    "recipe's transfer suite. Resumable: finished (base, seed) pairs are skipped and unfinished "
                    "ones resume from their last full state. Works under `accelerate launch` (DDP).")
    p.add_argument("--bases", nargs="+", required=True, metavar="BASE",
                   help="checkpoint folders, a shortlist.csv (selected rows) or a score run folder holding one")
    p.add_argument("--recipe", required=True, help="SFT recipe YAML, e.g. recipes/pilot.yaml")
    p.add_argument("--out", required=True, help="output folder, e.g. RUN_DIR/pilot")
    p.add_argument("--ladder", default=None, metavar="DIR",
                   help="folder holding the shortlisted checkpoints (default: from the score manifest beside the csv)")
    p.add_argument("--merged", action="store_true", help="also save a merged copy of each LoRA model (merged/)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--jobs", default=None, metavar="N",
                   help="train N bases at once in N worker processes, on the CPU or sharing one CUDA device (each "
                        "with the pilot's fixed thread count; the numbers do not change). Default: "
                        "PROBESELECT_JOBS, else 1. E.g. 2 on 2 cores.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="recipe overrides with dotted keys and YAML values, e.g. optimizer.lr=1e-3 seeds=[0,1,2]")
    p.set_defaults(func=_cmd_pilot)
