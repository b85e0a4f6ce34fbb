"""Incremental, resumable, fault-tolerant and multi-process scoring."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from probeselect import score_checkpoints
from probeselect.errors import CheckpointError

SPEC = {"family": "arith_pattern", "n_items": 6, "n_demos": 4}


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("spec") / "arith.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    return f


@pytest.fixture(scope="module")
def reference(tiny_ladder, spec_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    return score_checkpoints(tiny_ladder, [spec_file], seeds=[0, 1], out=out, chunk_items=6, progress=False)


def _comparable(df):
    return df.drop(columns=["candidate_logprobs"]).reset_index(drop=True)


def test_kill_and_resume(tiny_ladder, spec_file, reference, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "probeselect", "score", str(tiny_ladder), "--probes", str(spec_file),
           "--seeds", "0", "1", "--out", str(out), "--chunk-items", "6", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / "cache").rglob("*.parquet"))) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed; make the workload larger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Nothing partial presented as complete.
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "running"
    assert not (out / "scores.parquet").exists() and not (out / "summary.csv").exists()
    # Atomic writes: every final cache file is complete (a killed write leaves at most a
    # hidden .tmp orphan, never a torn final file).
    finished = list((out / "cache").rglob("*.parquet"))
    for p in finished:
        pd.read_parquet(p)
    before = {p: p.stat().st_mtime_ns for p in finished}
    resumed = score_checkpoints(tiny_ladder, [spec_file], seeds=[0, 1], out=out, chunk_items=6, progress=False)
    assert not list(out.rglob("*.tmp"))  # orphans cleaned on resume
    # Finished units were reused, not recomputed.
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    pd.testing.assert_frame_equal(_comparable(resumed.scores), _comparable(reference.scores))
    pd.testing.assert_frame_equal(resumed.summary, reference.summary)
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_keep_going_records_failed_checkpoint(tiny_ladder, spec_file, tmp_path):
    from safetensors.torch import load_file, save_file

    ladder = tmp_path / "ladder"
    ckpts = sorted((p for p in tiny_ladder.iterdir() if p.name.startswith("checkpoint-")),
                   key=lambda p: int(p.name.split("-")[1]))[:3]
    for p in ckpts:
        shutil.copytree(p, ladder / p.name)
    bad = ladder / ckpts[1].name / "model.safetensors"
    sd = load_file(bad)
    del sd[sorted(k for k in sd if ".layers." in k)[0]]
    save_file(sd, bad, metadata={"format": "pt"})
    out = tmp_path / "run"
    with pytest.raises(CheckpointError, match=ckpts[1].name):
        score_checkpoints(ladder, [spec_file], seeds=[0], out=out, progress=False)
    # The checkpoint scored before the failure keeps its results.
    assert list((out / "cache" / ckpts[0].name).glob("*.parquet"))
    res = score_checkpoints(ladder, [spec_file], seeds=[0], out=out, keep_going=True, progress=False)
    assert set(res.failed) == {ckpts[1].name}
    assert set(res.scores["checkpoint"]) == {ckpts[0].name, ckpts[2].name}
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "incomplete" and m["failed"][0]["checkpoint"] == ckpts[1].name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(tiny_ladder, spec_file, reference, tmp_path):
    out = tmp_path / "run2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "probeselect", "score", str(tiny_ladder),
           "--probes", str(spec_file), "--seeds", "0", "1", "--out", str(out), "--chunk-items", "6",
           "--no-progress", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    two = pd.read_parquet(out / "scores.parquet")
    pd.testing.assert_frame_equal(_comparable(two), _comparable(reference.scores))
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), pd.read_csv(reference.run_dir / "summary.csv"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["world_size"] == 2 and m["status"] == "complete"
    # Both ranks did model work: each rank computed a non-empty share of the units, the shares are disjoint
    # and together they are every unit (fails if one rank does everything or both do the same units).
    assert len(m["scored_now"]) == len(m["checkpoints"])
    per_rank = {r["rank"]: set(r["computed"]) for r in m["units_by_rank"]}
    assert sorted(per_rank) == [0, 1] and all(per_rank.values())
    assert not per_rank[0] & per_rank[1]
    assert {r["rank"]: set(r["assigned"]) for r in m["units_by_rank"]} == per_rank  # a fresh run computes its share
    one = json.loads((reference.run_dir / "manifest.json").read_text())
    assert per_rank[0] | per_rank[1] == set(one["units_by_rank"][0]["computed"]) and len(one["units_by_rank"]) == 1
