"""Toy world, corpus, data and a CPU-trainable Llama checkpoint ladder.

Main entry points: :class:`ToyWorld` (``world.py``), :func:`build_toy_ladder` and
:func:`arith_accuracy` (``ladder.py``), :func:`write_toy_data` (``data.py``).
"""

from .world import ARITH_TEMPLATES, Person, ToyWorld
from .ladder import (
    CheckpointInfo,
    LadderInfo,
    TrainConfig,
    arith_accuracy,
    build_toy_ladder,
    train_tokenizer,
)
from .data import write_toy_data

__all__ = [
    "ARITH_TEMPLATES",
    "CheckpointInfo",
    "LadderInfo",
    "Person",
    "ToyWorld",
    "TrainConfig",
    "arith_accuracy",
    "build_toy_ladder",
    "train_tokenizer",
    "write_toy_data",
]
