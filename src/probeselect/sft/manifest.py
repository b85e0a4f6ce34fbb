"""Data manifests: the exact examples of every optimizer step, fixed before training.

A manifest lists, for one data seed, the example ids of every optimizer step in order and
the supervised-token count of each step, with the tokenizer hash, the data hash and the
recipe's training hash (``Recipe.train_sha256``; eval and transfer settings are not part of
it). Every base trained under that seed uses exactly this manifest, so matched runs differ
only in their weights. The order depends on the data seed alone (a numpy PCG64
stream seeded with ``[seed, DATA_STREAM]``): one fresh permutation per epoch, steps running
across epoch boundaries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._io import atomic_write_json, canonical_json_hash
from ..errors import ManifestMismatchError
from .data import EncodedExample
from .recipe import Recipe

__all__ = ["build_data_manifest", "manifest_hash", "compare_manifests", "require_same_manifest",
           "read_manifest", "write_manifest", "FORMAT"]

FORMAT = "probeselect-data-manifest-v2"  # v2: train_sha256 replaces recipe_sha256
DATA_STREAM = 0xDA7A  # separates the data-order stream from the init stream (seed, INIT_STREAM)


def _order(n: int, seed: int):
    rng = np.random.Generator(np.random.PCG64([seed, DATA_STREAM]))
    while True:
        yield from (int(i) for i in rng.permutation(n))


def build_data_manifest(examples: Sequence[EncodedExample], recipe: Recipe, *, seed: int, tokenizer_hash: str | None,
                        data_sha256: str) -> dict[str, Any]:
    """The manifest for ``seed``: ``steps[k] = {"ids": [...], "sup_tokens": n}`` for optimizer step k+1.

    The budget is ``budget.optimizer_steps`` or, for ``budget.supervised_tokens``, the fewest
    steps whose supervised tokens reach it.
    """
    eb = recipe.optimizer.effective_batch
    order = _order(len(examples), seed)
    steps: list[dict[str, Any]] = []
    total = 0
    while True:
        if recipe.optimizer_steps is not None and len(steps) >= recipe.optimizer_steps:
            break
        if recipe.supervised_tokens is not None and total >= recipe.supervised_tokens:
            break
        picked = [examples[next(order)] for _ in range(eb)]
        n = sum(e.n_sup for e in picked)
        steps.append({"ids": [e.id for e in picked], "sup_tokens": n})
        total += n
    return {
        "format": FORMAT,
        "seed": seed,
        "train_sha256": recipe.train_sha256,
        "tokenizer_hash": tokenizer_hash,
        "data": {"path": str(recipe.train_path), "sha256": data_sha256, "n_examples": len(examples)},
        "micro_batch_size": recipe.optimizer.micro_batch_size,
        "grad_accum": recipe.optimizer.grad_accum,
        "n_steps": len(steps),
        "total_sup_tokens": total,
        "epochs": round(len(steps) * eb / len(examples), 4),
        "steps": steps,
    }


def manifest_hash(manifest: dict[str, Any]) -> str:
    """Canonical hash of a manifest; the data path is excluded (same bytes elsewhere = same data)."""
    m = dict(manifest, data={k: v for k, v in manifest["data"].items() if k != "path"})
    return canonical_json_hash(m)


def compare_manifests(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None if ``a`` and ``b`` describe the same training data; else the first difference, in words."""
    for key, label in (("format", "format"), ("seed", "data seed"), ("tokenizer_hash", "tokenizer hash"),
                       ("train_sha256", "recipe training hash"), ("micro_batch_size", "micro-batch size"),
                       ("grad_accum", "gradient accumulation")):
        if a.get(key) != b.get(key):
            return f"{label} differs: {a.get(key)!r} vs {b.get(key)!r}"
    if a["data"].get("sha256") != b["data"].get("sha256"):
        return f"training data differs: sha256 {a['data'].get('sha256')} vs {b['data'].get('sha256')}"
    for k, (sa, sb) in enumerate(zip(a["steps"], b["steps"]), 1):
        for j, (ia, ib) in enumerate(zip(sa["ids"], sb["ids"])):
            if ia != ib:
                return f"optimizer step {k}, example {j}: {ia!r} vs {ib!r}"
        if len(sa["ids"]) != len(sb["ids"]):
            return f"optimizer step {k}: {len(sa['ids'])} vs {len(sb['ids'])} examples"
        if sa["sup_tokens"] != sb["sup_tokens"]:
            return f"optimizer step {k}: {sa['sup_tokens']} vs {sb['sup_tokens']} supervised tokens"
    if len(a["steps"]) != len(b["steps"]):
        return f"number of optimizer steps differs: {len(a['steps'])} vs {len(b['steps'])}"
    return None


def require_same_manifest(runs: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`ManifestMismatchError` unless every run (name -> manifest) has the same manifest."""
    items = list(runs.items())
    if not items:
        return
    ref_name, ref = items[0]
    for name, m in items[1:]:
        diff = compare_manifests(ref, m)
        if diff is not None:
            raise ManifestMismatchError(f"refusing to compare {ref_name} and {name}: their data manifests differ "
                                        f"({diff}). Matched runs must share one manifest; re-run them with one "
                                        "recipe, data file and tokenizer.")


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(path, manifest)


def read_manifest(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
