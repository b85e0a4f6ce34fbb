"""Shared fixtures: one tiny toy ladder per test session, reused by every test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_ladder(tmp_path_factory) -> Path:
    """A tiny toy ladder (8 checkpoints, seconds to build). Treat it as read-only."""
    from probeselect.toy.ladder import build_toy_ladder

    out = tmp_path_factory.mktemp("ladder") / "toy"
    build_toy_ladder(out, seed=0, steps=24, save_every=3, progress=False)
    return out


@pytest.fixture(scope="session")
def ladder_checkpoints(tiny_ladder) -> list[Path]:
    from probeselect.checkpoints import parse_checkpoint_name

    dirs = [p for p in tiny_ladder.iterdir() if parse_checkpoint_name(p.name)]
    return sorted(dirs, key=lambda p: parse_checkpoint_name(p.name)[0])


@pytest.fixture
def copy_ckpt(ladder_checkpoints):
    """copy_ckpt(dest, i=0): copy ladder checkpoint i to dest (a writable copy)."""

    def _copy(dest: Path, i: int = 0) -> Path:
        shutil.copytree(ladder_checkpoints[i], dest)
        return dest

    return _copy


@pytest.fixture(scope="session")
def arith_spec():
    from probeselect.probes import spec_from_dict

    return spec_from_dict({"family": "arith_pattern", "n_items": 6, "n_demos": 4})
