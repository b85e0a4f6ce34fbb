"""Matched pilot SFT: recipes, data manifests, the training loop and full-state checkpoints.

>>> from probeselect.sft import load_recipe, train

Names are imported lazily so that the CLI can register ``pilot`` without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EncodedExample": "data",
    "encode_rows": "data",
    "load_rows": "data",
    "SpikeDetector": "diagnostics",
    "summarize_train_log": "diagnostics",
    "TrainResult": "loop",
    "train": "loop",
    "build_data_manifest": "manifest",
    "compare_manifests": "manifest",
    "manifest_hash": "manifest",
    "require_same_manifest": "manifest",
    "Recipe": "recipe",
    "load_recipe": "recipe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'probeselect.sft' has no attribute {name!r}")
