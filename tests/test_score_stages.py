"""The scoring pipeline's stages hand over exactly what the engines compute.

Two checks on a run that uses every kind of work unit (answer spans in several chunks per
family, held-out NLL, sampled generation, greedy audit):

* the final tables are byte-identical whether each unit was computed now or read back
  from the run folder's cache (a fresh run vs a run that finds half of the units cached);
* the rows of one checkpoint equal what the engines give when called directly on that
  checkpoint (spans.score_groups, capability.heldout_nll,
  generation.persona_generation_table), so the stages pass the right items, encodings
  and settings down and assemble the results in the right place.
"""

from __future__ import annotations

import hashlib
import math
import shutil

import pandas as pd
import pytest
import torch

from probeselect.capability import heldout_nll, load_heldout_texts
from probeselect.checkpoints import discover_checkpoints
from probeselect.generation import persona_generation_table
from probeselect.probes import generate_items, spec_from_dict
from probeselect.score import load_model, load_tokenizer, score_checkpoints
from probeselect.spans import encode_pair, group_pairs, score_groups

SEEDS = [0, 1]
TABLES = ("items.jsonl", "scores.parquet", "summary.csv", "generations.parquet", "audit.parquet", "audit_summary.csv")


def _specs():
    return [
        spec_from_dict({"family": "arith_pattern", "n_items": 4, "n_demos": 3}),
        spec_from_dict({"family": "persona_qa", "n_items": 2, "n_demos": 2, "variants": ["block"],
                        "params": {"gen_samples": 3, "gen_max_new_tokens": 4}}),
    ]


def _run(ckpts, heldout, out):
    return score_checkpoints(ckpts, _specs(), seeds=SEEDS, out=out, chunk_items=5, heldout=heldout, audit_items=2,
                             audit_max_new_tokens=4, progress=False)


def _hashes(run_dir):
    return {n: hashlib.sha256((run_dir / n).read_bytes()).hexdigest() for n in TABLES}


@pytest.fixture(scope="module")
def setup(tiny_ladder, tmp_path_factory):
    ckpts = discover_checkpoints(tiny_ladder)[-2:]
    heldout = tiny_ladder / "data" / "heldout.txt"
    fresh = _run(ckpts, heldout, tmp_path_factory.mktemp("fresh") / "run")
    return ckpts, heldout, fresh


def test_tables_do_not_depend_on_where_each_unit_came_from(setup, tmp_path):
    ckpts, heldout, fresh = setup
    kinds = {p.name.split("-")[0] for p in (fresh.run_dir / "cache").rglob("*.parquet")}
    assert kinds == {"spans", "nll", "gen", "audit"}, kinds
    mixed_dir = tmp_path / "run"
    shutil.copytree(fresh.run_dir / "cache", mixed_dir / "cache")
    parts = sorted((mixed_dir / "cache").rglob("*.parquet"))
    for p in parts[::2]:  # every other unit is computed again, the rest is read back
        p.unlink()
    mixed = _run(ckpts, heldout, mixed_dir)
    assert 0 < mixed.units_cached < mixed.units_total == fresh.units_total
    assert mixed.manifest["units"]["scored_now"] == len(parts[::2])
    assert _hashes(mixed_dir) == _hashes(fresh.run_dir)


def test_one_checkpoint_equals_the_engines_called_directly(setup):
    ckpts, heldout, fresh = setup
    ckpt = ckpts[-1]
    tok = load_tokenizer(ckpt.path)
    model = load_model(ckpt.path, torch.float32, torch.device("cpu"))
    arith, persona = _specs()

    # Answer spans: margins of every item, in the run's row order for this checkpoint.
    items = generate_items(arith, SEEDS) + generate_items(persona, SEEDS)
    groups = [group_pairs([encode_pair(tok, it.prompt, c) for c in it.candidates]) for it in items]
    spans = score_groups(model, groups)
    direct = pd.DataFrame({"family": [it.family for it in items], "item_id": [it.item_id for it in items],
                           "seed": [it.seed for it in items],
                           "margin": [sc[0].logprob - sc[1].logprob for sc in spans]})
    got = fresh.scores[fresh.scores["checkpoint"] == ckpt.name].reset_index(drop=True)
    assert list(zip(got["family"], got["item_id"], got["seed"])) == list(
        zip(direct["family"], direct["item_id"], direct["seed"]))
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got["margin"], direct["margin"]))

    # Held-out bits per byte.
    bpb = heldout_nll(model, tok, load_heldout_texts(heldout), device="cpu").bits_per_byte
    row = fresh.summary[(fresh.summary["checkpoint"] == ckpt.name) & (fresh.summary["family"] == "heldout_nll")]
    assert len(row) == 1 and math.isclose(float(row["bits_per_byte"].iloc[0]), bpb, rel_tol=1e-6)

    # Sampled generation of the persona family (same seed and settings as the run).
    gen = persona_generation_table(model, tok, generate_items(persona, SEEDS), n=3, temperature=1.0,
                                   max_new_tokens=4, seed=0)
    run_gen = fresh.generations[fresh.generations["checkpoint"] == ckpt.name].drop(
        columns=["checkpoint", "step", "tokens"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(run_gen[["item_id", "seed", "n_task", "n_shortcut", "n_other"]],
                                  gen[["item_id", "seed", "n_task", "n_shortcut", "n_other"]])
