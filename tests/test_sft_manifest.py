"""Data manifests: order from the data seed only, token budgets, and refusal naming the first difference."""

from __future__ import annotations

import copy

import pytest

from _sft_helpers import small_recipe
from probeselect.errors import ManifestMismatchError
from probeselect.sft.data import EncodedExample
from probeselect.sft.manifest import build_data_manifest, compare_manifests, require_same_manifest


def _examples(n: int, tokens: int) -> list[EncodedExample]:
    return [EncodedExample(f"ex{i}", (0,) * (tokens + 1), (-100,) + (5,) * tokens, tokens) for i in range(n)]


@pytest.fixture(scope="module")
def recipe(tiny_ladder):
    return small_recipe(tiny_ladder)


def test_order_depends_on_the_data_seed_only(recipe):
    a = build_data_manifest(_examples(10, 3), recipe, seed=0, tokenizer_hash="t", data_sha256="d")
    b = build_data_manifest(_examples(10, 7), recipe, seed=0, tokenizer_hash="t", data_sha256="d")
    c = build_data_manifest(_examples(10, 3), recipe, seed=1, tokenizer_hash="t", data_sha256="d")
    assert [s["ids"] for s in a["steps"]] == [s["ids"] for s in b["steps"]]  # token counts do not move the order
    assert [s["ids"] for s in a["steps"]] != [s["ids"] for s in c["steps"]]
    assert a["n_steps"] == 6 and all(len(s["ids"]) == 8 for s in a["steps"])
    assert [s["sup_tokens"] for s in a["steps"]] == [24] * 6 and a["total_sup_tokens"] == 144
    # 48 draws from 10 examples: each epoch is a permutation, so after 4 full epochs every id was seen 4 times
    ids = [i for s in a["steps"] for i in s["ids"]]
    assert all(ids[:40].count(f"ex{k}") == 4 for k in range(10))


def test_supervised_token_budget(tiny_ladder):
    r = small_recipe(tiny_ladder, budget={"supervised_tokens": 100})
    m = build_data_manifest(_examples(10, 3), r, seed=0, tokenizer_hash="t", data_sha256="d")
    assert m["n_steps"] == 5 and m["total_sup_tokens"] == 120  # 24 per step: 4 steps = 96 < 100


def test_compare_names_first_difference(recipe):
    a = build_data_manifest(_examples(10, 3), recipe, seed=0, tokenizer_hash="t", data_sha256="d")
    assert compare_manifests(a, copy.deepcopy(a)) is None
    b = copy.deepcopy(a)
    b["steps"][2]["ids"][5] = "other"
    assert compare_manifests(a, b) == f"optimizer step 3, example 5: {a['steps'][2]['ids'][5]!r} vs 'other'"
    c = dict(copy.deepcopy(a), tokenizer_hash="u")
    assert compare_manifests(a, c) == "tokenizer hash differs: 't' vs 'u'"
    with pytest.raises(ManifestMismatchError, match=r"refusing to compare base-a and base-b: .*optimizer step 3"):
        require_same_manifest({"base-a": a, "base-b": b})
