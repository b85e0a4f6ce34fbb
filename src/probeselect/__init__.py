"""probeselect: choose which saved pretraining checkpoint to post-train.

The public API is small; implementation modules may change.

>>> from probeselect import discover_checkpoints, score_checkpoints

Names are imported lazily so that ``probeselect --help`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "Checkpoint": "checkpoints",
    "discover_checkpoints": "checkpoints",
    "CheckpointError": "errors",
    "ProbeselectError": "errors",
    "ProbeSpecError": "errors",
    "ScoringError": "errors",
    "TokenizerMismatchError": "errors",
    "FamilySpec": "probes",
    "ProbeItem": "probes",
    "generate_items": "probes",
    "load_spec": "probes",
    "ScoreResult": "score",
    "score_checkpoints": "score",
    "build_toy_ladder": "toy.ladder",
    "compute_dynamics": "dynamics",
    "average_checkpoints": "average",
    "compare_averaging": "average",
    "shortlist": "shortlist",
    "write_report": "report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'probeselect' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .checkpoints import Checkpoint, discover_checkpoints
    from .errors import CheckpointError, ProbeselectError, ProbeSpecError, ScoringError, TokenizerMismatchError
    from .probes import FamilySpec, ProbeItem, generate_items, load_spec
    from .score import ScoreResult, score_checkpoints
    from .toy.ladder import build_toy_ladder
    from .average import average_checkpoints, compare_averaging
    from .dynamics import compute_dynamics
    from .report import write_report
    from .shortlist import shortlist
