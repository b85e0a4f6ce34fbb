"""Helpers shared by the command modules (``cli``, ``sft._cli``, ``_select_cli``, ``_watch_cli``).

The command modules import from here and never from each other, so ``cli`` can
register their subcommands without an import circle.
"""

from __future__ import annotations

# The one wording of --device for every subcommand that loads a model (score, pilot, confirm, run).
DEVICE_HELP = "auto (CUDA if available, else CPU), cpu, cuda or cuda:N (default auto)"


def check_device(device: str) -> None:
    """Refuse a device this machine lacks before any training; ``cuda:N`` selects GPU N for
    a single-process run (under ``accelerate launch`` each rank uses its own GPU)."""
    if device == "auto":
        return
    from .score import use_device

    use_device(device)


def add_scoring_options(p) -> None:
    """The model and scoring options that ``score`` and ``watch`` share (one definition, so
    their names, defaults and help cannot drift apart): --seeds, --dtype, --device,
    --max-batch-tokens, --heldout, --heldout-stride, --audit-items."""
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3], help="evaluation seeds (default 0 1 2 3)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="model dtype (default float32; float16 needs CUDA)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--max-batch-tokens", type=int, default=8192,
                   help="padded tokens per forward pass; halves automatically on out-of-memory (default 8192)")
    p.add_argument("--heldout", default=None, metavar="FILE",
                   help="held-out text for the bits-per-byte track (.txt one document per line, .jsonl "
                        "with `text`, or a saved datasets folder); e.g. <toy ladder>/data/heldout.txt")
    p.add_argument("--heldout-stride", type=int, default=None,
                   help="tokens between rolling windows (default: the context length, disjoint windows as in lm-eval)")
    p.add_argument("--audit-items", type=int, default=50,
                   help="items per family for the greedy generative audit (evaluation seed = first seed; 0 disables; "
                        "default 50)")
