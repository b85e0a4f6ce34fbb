"""Shared helpers for the SFT tests: a small recipe over the tiny ladder's data."""

from __future__ import annotations

from pathlib import Path

from probeselect.sft.recipe import Recipe, recipe_from_dict


def small_recipe(ladder: Path, **over) -> Recipe:
    """A fast recipe (LoRA r=4, micro-batch 4, accum 2, 6 steps) on ``ladder``'s SFT data.

    ``over`` replaces top-level sections or, as ``section__key=value``, one key of a section.
    """
    d = Path(ladder) / "data"
    heldout = d / "sft_heldout.jsonl"
    if not heldout.is_file() or not heldout.read_text().strip():
        heldout = d / "transfer.jsonl"  # same row format; mechanics tests only need some held-out rows
    raw = {
        "name": "test",
        "data": {"train": str(d / "sft.jsonl"), "max_length": 128},
        "budget": {"optimizer_steps": 6},
        "optimizer": {"lr": 2e-3, "warmup_steps": 2, "micro_batch_size": 4, "grad_accum": 2,
                      "clip": {"rule": "global_norm", "max_norm": 1.0}},
        "method": {"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0},
        "seeds": [0],
        "checkpointing": {"every": 2, "keep": 2},
        "transfer": {"tasks": str(d / "transfer.jsonl"), "robustness": str(d / "robustness.jsonl"),
                     "heldout": str(heldout), "max_new_tokens": 4, "max_items": 6},
    }
    for k, v in over.items():
        if "__" in k:
            sec, key = k.split("__")
            raw[sec] = {**raw.get(sec, {}), key: v}
        else:
            raw[k] = v
    return recipe_from_dict(raw, source="test-recipe")


def prepared(ladder: Path, recipe: Recipe, seed: int = 0, ckpt: str | None = None):
    """(base path, tokenizer, examples by id, manifest) for ``recipe`` on a ladder checkpoint."""
    from probeselect.checkpoints import discover_checkpoints
    from probeselect.score import load_tokenizer
    from probeselect.sft.data import data_hash, encode_rows, load_rows
    from probeselect.sft.manifest import build_data_manifest

    ckpts = discover_checkpoints(ladder)
    base = next(c for c in ckpts if c.name == ckpt) if ckpt else ckpts[-1]
    tok = load_tokenizer(base.path)
    ex = encode_rows(load_rows(recipe.train_path), tok, max_length=recipe.max_length)
    m = build_data_manifest(ex, recipe, seed=seed, tokenizer_hash=base.tokenizer_hash,
                            data_sha256=data_hash(recipe.train_path))
    return base, tok, {e.id: e for e in ex}, m
