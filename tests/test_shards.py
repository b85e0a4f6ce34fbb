"""Job arrays: ``score --shard I/N`` into a shared folder, then ``--merge`` (probeselect._shards)."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from probeselect import score_checkpoints
from probeselect._shards import ShardError, owned_units, parse_shard

SPEC = {"family": "arith_pattern", "n_items": 6, "n_demos": 4}
KW = dict(seeds=[0, 1], chunk_items=6, audit_items=2, progress=False)
TABLES = ("scores.parquet", "summary.csv", "items.jsonl", "audit.parquet", "audit_summary.csv")


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("spec") / "arith.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    return f


@pytest.fixture(scope="module")
def ladder(ladder_checkpoints, tmp_path_factory):
    """Four checkpoints of the tiny ladder (enough units for three shards, and quick)."""
    root = tmp_path_factory.mktemp("ladder") / "ladder"
    for p in ladder_checkpoints[::2]:
        shutil.copytree(p, root / p.name)
    return root


@pytest.fixture(scope="module")
def one_process(ladder, spec_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    return score_checkpoints(ladder, [spec_file], out=out, **KW)


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_parse_and_partition():
    assert parse_shard("2/8") == (2, 8) and parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/3", "4/3", "2", "a/b", "1/0"):
        with pytest.raises(ShardError, match="--shard"):
            parse_shard(bad)
    for n_units in (0, 1, 7, 48):
        for n in (1, 3, 5):
            parts = [list(owned_units(n_units, (i, n))) for i in range(1, n + 1)]
            assert sorted(k for p in parts for k in p) == list(range(n_units))  # disjoint and complete
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_three_shards_then_merge_equal_one_process(ladder, spec_file, one_process, tmp_path):
    out = tmp_path / "run"
    owned = {}
    for i in (1, 2):
        res = score_checkpoints(ladder, [spec_file], out=out, shard=f"{i}/3", **KW)
        rec = json.loads((out / "shards" / f"shard-{i}-of-3.json").read_text())
        assert rec["status"] == "complete" and rec["shard"] == [i, 3] and rec["units_pending"] > 0
        assert res.manifest["kind"] == "score-shard" and res.scored  # each shard did model work
        owned[i] = set(res.scores[["checkpoint", "item_id", "seed"]].itertuples(index=False))
        # A shard never writes the final tables or the run manifest.
        assert not any((out / t).exists() for t in TABLES) and not (out / "manifest.json").exists()
    assert owned[1] and owned[2] and not owned[1] & owned[2]  # disjoint, non-empty shares
    last = score_checkpoints(ladder, [spec_file], out=out, shard="3/3", **KW)
    assert last.scored  # the last shard scored its share, then merged
    assert (out / "shards").is_dir() and list((out / "shards").glob("merge-*.claim"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and m["config"]["merge"] is True
    for t in TABLES:  # byte-identical final tables
        assert _sha(out / t) == _sha(one_process.run_dir / t), t
    # An explicit --merge on a complete folder rewrites the same bytes without model work.
    again = score_checkpoints(ladder, [spec_file], out=out, merge=True, **KW)
    assert again.scored == [] and all(_sha(out / t) == _sha(one_process.run_dir / t) for t in TABLES)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "probeselect", *args], capture_output=True, text=True)


def test_merge_with_missing_shard_names_it(ladder, spec_file, tmp_path):
    out = tmp_path / "run"
    kw = dict(seeds=[0], chunk_items=6, audit_items=0, progress=False)
    for i in (1, 3):
        res = score_checkpoints(ladder, [spec_file], out=out, shard=f"{i}/3", **kw)
        assert res.manifest["units_pending"] > 0
    r = _cli("score", str(ladder), "--probes", str(spec_file), "--seeds", "0", "--out", str(out),
             "--chunk-items", "6", "--audit-items", "0", "--no-progress", "--merge")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "shard 2/3 (not started: no shards/shard-2-of-3.json)" in line and "unit(s) missing, e.g. checkpoint-" in line
    assert "shard 1/3" not in line and "shard 3/3" not in line
    assert not (out / "summary.csv").exists() and not (out / "manifest.json").exists()  # refusal touched nothing
    res = score_checkpoints(ladder, [spec_file], out=out, shard="2/3", **kw)  # completes the plan and merges
    assert res.manifest["kind"] == "score" and len(res.summary)
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_merge_with_other_flags_says_so(ladder, spec_file, tmp_path):
    out = tmp_path / "run"
    score_checkpoints(ladder, [spec_file], out=out, shard="1/2", seeds=[0], chunk_items=6, audit_items=0,
                      progress=False)
    with pytest.raises(ShardError, match="written for a different plan"):
        score_checkpoints(ladder, [spec_file], out=out, merge=True, seeds=[0, 1], chunk_items=6,
                          audit_items=0, progress=False)
    with pytest.raises(ShardError, match="--shard needs --out"):
        score_checkpoints(ladder, [spec_file], shard="1/2", seeds=[0], progress=False)
