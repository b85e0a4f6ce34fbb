"""Shared helper for the tests of bench/ scripts (not a package: loaded by file path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_bench(name: str):
    """The module ``bench/<name>.py``, registered in ``sys.modules`` under ``name`` (dataclasses and pickling
    need it there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
