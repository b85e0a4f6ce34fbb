"""``probeselect watch`` and ``probeselect export``: argument parsing and the thin commands."""

from __future__ import annotations

import argparse
import sys

from ._cli_common import add_scoring_options

#: = probeselect.export.FORMATS (not imported here: --help must not load pandas)
EXPORT_FORMATS = ("csv", "tensorboard", "wandb-offline")


def _cmd_watch(args: argparse.Namespace) -> int:
    from .watch import Watcher

    w = Watcher(args.ckpt_dir, args.probes, args.out, every=args.every, until_step=args.until_step,
                idle_exit=args.idle_exit, on_alert=args.on_alert, bpb_tolerance=args.bpb_tolerance,
                report=not args.no_report, lineage=args.lineage, seeds=args.seeds, heldout=args.heldout, heldout_stride=args.heldout_stride,
                device=args.device, dtype=args.dtype, audit_items=args.audit_items,
                max_batch_tokens=args.max_batch_tokens)
    print(f"[watch] watching {args.ckpt_dir} every {args.every:g}s -> {args.out} (Ctrl-C stops; the same command "
          "resumes)", file=sys.stderr, flush=True)
    res = w.run()
    print(f"[watch] stopped ({res.stop_reason}): {len(res.processed)} checkpoint(s) processed, "
          f"{len(res.model_scored)} scored now, {len(res.alerts)} alert(s) (alerts.jsonl), {len(res.failed)} failed, "
          f"{len(res.vanished)} deleted before scoring", file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_run

    path = export_run(args.run_dir, fmt=args.format, out=args.out)
    print(f"export: {path}")
    return 0


def add_parsers(sub) -> None:
    w = sub.add_parser("watch", help="score checkpoints as a training run saves them, with alerts",
                       description="Poll CKPT_DIR; score every complete new checkpoint into the run folder --out "
                                   "(earlier ones come from the cache), update summary.csv, dynamics/ and the "
                                   "report, print one line per checkpoint and append alerts (a hop or an undone gain "
                                   "beyond the noise threshold of dynamics.csv, held-out bpb worsening) to "
                                   "OUT/alerts.jsonl. Ctrl-C stops; the same command resumes.")
    w.add_argument("ckpt_dir", metavar="CKPT_DIR", help="the folder the training run saves checkpoints into")
    w.add_argument("--probes", nargs="+", required=True, metavar="SPEC", help="probe spec YAML files")
    w.add_argument("--out", required=True, help="run folder (one per watched run)")
    add_scoring_options(w)  # the same as `score`'s
    w.add_argument("--every", type=float, default=60.0, metavar="SECONDS",
                   help="poll interval in seconds (default 60); a checkpoint without a trainer marker must be "
                        "unchanged across two polls")
    stop = w.add_mutually_exclusive_group()
    stop.add_argument("--until-step", type=int, default=None, metavar="S",
                      help="stop after scoring a checkpoint at step S or later")
    stop.add_argument("--idle-exit", type=float, default=None, metavar="MINUTES",
                      help="stop when no new checkpoint was scored for MINUTES")
    w.add_argument("--on-alert", default=None, metavar="CMD",
                   help="shell command run once per alert with the alert's JSON on stdin")
    w.add_argument("--bpb-tolerance", type=float, default=0.0, metavar="BITS",
                   help="held-out bits per byte may rise by this much before an alert (default 0)")
    w.add_argument("--lineage", default=None, metavar="FILE",
                   help="data windows for the alerts: data_lineage.json or a CSV start_step,end_step,window[,planted] "
                        "(default: data_lineage.json next to the checkpoints, once it exists)")
    w.add_argument("--no-report", action="store_true", help="update only dynamics/ (no report.md/html)")
    w.set_defaults(func=_cmd_watch)

    e = sub.add_parser("export", help="export a run's probe series (csv, TensorBoard event files, W&B offline run)",
                       description="Write the probe series of RUN_DIR (summary.csv) as steps: a long CSV "
                                   "(step, tag, value), TensorBoard event files with tags "
                                   "probes/<family>/<variant>/<metric> (needs the tensorboard package: "
                                   "pip install 'probeselect[tensorboard]'), or a Weights & Biases offline run "
                                   "with the same tags at the same steps, written without network "
                                   "(`wandb sync` uploads it; needs pip install 'probeselect[wandb]').")
    e.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `probeselect score` or `watch`")
    e.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    e.add_argument("--out", default=None, help="output file/folder (default RUN_DIR/export/...)")
    e.set_defaults(func=_cmd_export)
