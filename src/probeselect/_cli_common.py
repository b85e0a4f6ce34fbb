"""Helpers shared by the command modules (``cli``, ``sft._cli``, ``_select_cli``).

The command modules import from here and never from each other, so ``cli`` can
register their subcommands without an import circle.
"""

from __future__ import annotations

import os

# The one wording of --device for every subcommand that loads a model (score, pilot, confirm, run).
DEVICE_HELP = "auto (CUDA if available, else CPU), cpu, cuda or cuda:N (default auto)"


def check_device(device: str) -> None:
    """Refuse a device this machine lacks before any training; ``cuda:N`` selects GPU N for
    a single-process run (under ``accelerate launch`` each rank uses its own GPU)."""
    if device == "auto":
        return
    from .score import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        import torch

        torch.cuda.set_device(dev.index)
