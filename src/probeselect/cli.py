"""The ``probeselect`` command line: one subcommand per stage, each a thin wrapper over
a public function that can also be called from Python."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from . import __version__
from .errors import ProbeselectError


def _cmd_toy_ladder(args: argparse.Namespace) -> int:
    from .toy.ladder import build_toy_ladder

    t0 = time.perf_counter()
    info = build_toy_ladder(
        args.out_dir, seed=args.seed, steps=args.steps, save_every=args.save_every, progress=not args.no_progress
    )
    acc = getattr(info, "final_accuracy", None)
    print(f"toy ladder written to {args.out_dir} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if acc is not None:
        print(f"final checkpoint held-out arithmetic accuracy: {acc:.1%}", file=sys.stderr)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from .score import score_checkpoints

    out = Path(args.out) if args.out else Path("results") / Path(args.ckpt_dir).resolve().name
    t0 = time.perf_counter()
    res = score_checkpoints(
        args.ckpt_dir,
        args.probes,
        seeds=args.seeds,
        out=out,
        dtype=args.dtype,
        device=args.device,
        batch_size=args.batch_size,
        max_length=args.max_length,
        tokenizer=args.tokenizer,
        allow_tokenizer_mismatch=args.allow_tokenizer_mismatch,
        progress=not args.no_progress,
    )
    n_ckpt = res.scores["checkpoint"].nunique()
    if not res.scored:
        print(f"all {n_ckpt} checkpoints were already scored (cache hit); no model work done.", file=sys.stderr)
    else:
        print(f"scored {len(res.scored)} of {n_ckpt} checkpoints in {time.perf_counter() - t0:.1f}s "
              f"({n_ckpt - len(res.scored)} from cache).", file=sys.stderr)
    cols = ["checkpoint", "step", "family", "variant", "mean_margin", "seed_sd", "accuracy", "candidate_accuracy"]
    with __import__("pandas").option_context("display.width", 160, "display.max_rows", 200):
        print(res.summary[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {out}/ (summary.csv, scores.parquet, items.jsonl, manifest.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="probeselect",
        description="Choose which saved pretraining checkpoint to post-train.",
    )
    p.add_argument("--version", action="version", version=f"probeselect {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("toy-ladder", help="pretrain the built-in toy checkpoint ladder on CPU",
                       description="Pretrain a small Llama-architecture LM on the synthetic toy world and save "
                                   "checkpoint-<step> folders plus SFT/transfer/held-out data under OUT_DIR/data/.")
    t.add_argument("out_dir", metavar="OUT_DIR", help="where to write checkpoint-<step>/ folders and data/")
    t.add_argument("--seed", type=int, default=0, help="world, data and init seed (default 0)")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the built-in schedule)")
    t.add_argument("--save-every", type=int, default=None, help="save a checkpoint every K steps (default: steps/8)")
    t.add_argument("--no-progress", action="store_true", help="hide progress bars")
    t.set_defaults(func=_cmd_toy_ladder)

    s = sub.add_parser("score", help="score a directory of checkpoints with conflict probes",
                       description="Score every checkpoint in CKPT_DIR with the given probe specs under each "
                                   "evaluation seed; writes items.jsonl, scores.parquet, summary.csv and "
                                   "manifest.json to --out. Re-runs reuse cached per-checkpoint scores.")
    s.add_argument("ckpt_dir", metavar="CKPT_DIR", help="a folder of checkpoints, or one model folder")
    s.add_argument("--probes", nargs="+", required=True, metavar="SPEC", help="probe spec YAML files (probes/*.yaml)")
    s.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3], help="evaluation seeds (default 0 1 2 3)")
    s.add_argument("--out", default=None, help="run folder (default results/<CKPT_DIR name>)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="model dtype (default float32; float16 needs CUDA)")
    s.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1, ...")
    s.add_argument("--batch-size", type=int, default=16, help="requests per forward pass (default 16)")
    s.add_argument("--max-length", type=int, default=None, help="context limit in tokens (default: the model's)")
    s.add_argument("--tokenizer", default=None, help="tokenizer folder, for checkpoints saved without one")
    s.add_argument("--allow-tokenizer-mismatch", action="store_true",
                   help="score checkpoints even if their tokenizers differ")
    s.add_argument("--no-progress", action="store_true", help="hide progress bars")
    s.set_defaults(func=_cmd_score)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ProbeselectError as exc:
        print(f"probeselect {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
