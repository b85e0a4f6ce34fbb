"""Toy world, corpus, data and a CPU-trainable Llama checkpoint ladder.

Main entry points: :class:`ToyWorld` (``world.py``), :func:`build_toy_ladder` and
:func:`arith_accuracy` (``ladder.py``), :func:`write_toy_data` (``data.py``).

Names are imported lazily: probe families import ``toy.world`` (plain Python), which
must not pull in torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ARITH_TEMPLATES": "world",
    "Person": "world",
    "ToyWorld": "world",
    "CheckpointInfo": "ladder",
    "LadderInfo": "ladder",
    "TrainConfig": "ladder",
    "arith_accuracy": "ladder",
    "build_toy_ladder": "ladder",
    "train_tokenizer": "ladder",
    "write_toy_data": "data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'probeselect.toy' has no attribute {name!r}")
