"""Hub repos with revisions, resolved offline from a hand-built HF cache (probeselect._hub)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probeselect._hub import checkpoint_from_snapshot, resolve_hub_ladder
from probeselect.errors import CheckpointError


def build_hf_cache(cache: Path, repo: str, revisions: dict[str, Path], extra_refs: dict[str, str] = ()) -> dict:
    """Lay out ``revisions`` (name -> model folder) the way huggingface_hub caches a repo:
    ``models--ORG--NAME/{refs/<revision>, snapshots/<sha>/<file> -> ../../blobs/<hash>, blobs/}``."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    shas = {}
    for rev, src in revisions.items():
        sha = hashlib.sha1(f"{repo}@{rev}".encode()).hexdigest()
        shas[rev] = sha
        snap = root / "snapshots" / sha
        snap.mkdir(parents=True)
        for f in sorted(p for p in src.iterdir() if p.is_file()):
            data = f.read_bytes()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            if not blob.exists():
                blob.write_bytes(data)
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
        (root / "refs" / rev).write_text(sha)
    for ref, rev in dict(extra_refs).items():
        (root / "refs" / ref).write_text(shas[rev])
    return shas


@pytest.fixture()
def hub(tmp_path, ladder_checkpoints, monkeypatch):
    """Five Pythia-style revisions (step<N>) plus `main`, and three OLMo-style ones, offline."""
    cache = tmp_path / "hf" / "hub"
    pythia = {f"step{(i + 1) * 1000}": ladder_checkpoints[i] for i in range(5)}
    shas = build_hf_cache(cache, "org/tiny", pythia, extra_refs={"main": "step5000"})
    olmo = {f"stage1-step{(i + 1) * 500}-tokens{(i + 1) * 2}B": ladder_checkpoints[i] for i in range(3)}
    olmo["stage2-ingredient1-step100-tokens200B"] = ladder_checkpoints[3]
    build_hf_cache(cache, "org/olmo-tiny", olmo)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, shas


def test_explicit_revisions_numeric_order(hub):
    cache, shas = hub
    ckpts = resolve_hub_ladder("org/tiny", ["step3000", "step1000", "step2000"])
    assert [(c.name, c.step) for c in ckpts] == [("step1000", 1000), ("step2000", 2000), ("step3000", 3000)]
    c = ckpts[0]
    assert c.repo == "org/tiny" and c.commit == shas["step1000"] and c.path.name == shas["step1000"]
    assert c.weight_files == ("model.safetensors",) and len(c.fingerprint) == 64
    d = c.to_dict()
    assert d["revision"] == "step1000" and d["commit"] == shas["step1000"]


def test_all_and_pattern(hub):
    names = [c.name for c in resolve_hub_ladder("org/tiny", "all")]
    assert names == [f"step{k}000" for k in range(1, 6)]  # `main` carries no step: skipped
    assert [c.name for c in resolve_hub_ladder("org/tiny", pattern="step[12]000")] == ["step1000", "step2000"]
    olmo = resolve_hub_ladder("org/olmo-tiny", pattern="stage1-step*")
    assert [(c.step, c.tokens) for c in olmo] == [(500, 2 * 10**9), (1000, 4 * 10**9), (1500, 6 * 10**9)]
    assert resolve_hub_ladder("org/olmo-tiny", ["stage2-ingredient1-step100-tokens200B"])[0].step == 100


def test_fingerprint_includes_commit(hub, tmp_path, ladder_checkpoints):
    """Same files under another commit: another fingerprint (the commit sha is part of it)."""
    cache, _ = hub
    build_hf_cache(cache, "org/copy", {"step1000": ladder_checkpoints[0]})
    a = resolve_hub_ladder("org/tiny", ["step1000"])[0]
    b = resolve_hub_ladder("org/copy", ["step1000"])[0]
    assert a.commit != b.commit and a.fingerprint != b.fingerprint
    assert resolve_hub_ladder("org/tiny", ["step1000"])[0].fingerprint == a.fingerprint  # stable


def test_errors_name_the_revision(hub):
    with pytest.raises(CheckpointError, match=r"org/tiny: revision 'step9000' is not in the local HF cache .*HF_HUB_OFFLINE"):
        resolve_hub_ladder("org/tiny", ["step1000", "step9000"])
    with pytest.raises(CheckpointError, match=r"cannot tell the step of revision 'main'"):
        resolve_hub_ladder("org/tiny", ["main"])
    with pytest.raises(CheckpointError, match=r"org/absent: not in the local HF cache"):
        resolve_hub_ladder("org/absent", "all")
    with pytest.raises(CheckpointError, match=r"no revision in the local HF cache matches --revision-pattern 'x\*'"):
        resolve_hub_ladder("org/tiny", pattern="x*")
    with pytest.raises(CheckpointError, match="not a Hub repo id"):
        resolve_hub_ladder("../etc", ["step1"])


def test_snapshot_folder_is_named_by_its_revision(hub):
    cache, shas = hub
    snap = cache / "models--org--tiny" / "snapshots" / shas["step2000"]
    c = checkpoint_from_snapshot(snap)
    assert c is not None and c.name == "step2000" and c.step == 2000
    assert checkpoint_from_snapshot(snap.parent.parent) is None


def test_cli_scores_five_revisions_offline_and_resumes(hub, tmp_path):
    cache, _ = hub
    out = tmp_path / "run"
    spec = tmp_path / "arith.yaml"
    spec.write_text("family: arith_pattern\nn_items: 6\nn_demos: 4\n")
    cmd = [sys.executable, "-m", "probeselect", "score", "org/tiny", "--revisions", "all", "--probes",
           str(spec), "--seeds", "0", "--audit-items", "0", "--out", str(out),
           "--no-progress"]
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    print(r.stderr + r.stdout)
    assert "scored 5 of 5 checkpoints" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert [c["revision"] for c in m["checkpoints"]] == [f"step{k}000" for k in range(1, 6)]
    assert m["status"] == "complete" and all(c["commit"] for c in m["checkpoints"])
    r2 = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r2.returncode == 0 and "no model work" in r2.stderr
    r3 = subprocess.run(cmd[:6] + ["step1000", "step7000"] + cmd[7:], capture_output=True, text=True, env=env)
    assert r3.returncode == 2 and "Traceback" not in r3.stderr
    assert "revision 'step7000' is not in the local HF cache" in r3.stderr


def test_pilot_bases_and_run_config(hub, tmp_path):
    from probeselect.errors import ProbeselectError
    from probeselect.pilot import resolve_bases
    from probeselect.run import _ladder_identity, load_run_config

    cache, shas = hub
    snaps = [cache / "models--org--tiny" / "snapshots" / shas[r] for r in ("step1000", "step3000")]
    bases = resolve_bases(snaps)  # e.g. from a shortlist of a Hub-revision score run (manifest paths)
    assert [(b.name, b.revision, b.commit) for b in bases] == [("step1000", "step1000", shas["step1000"]),
                                                                ("step3000", "step3000", shas["step3000"])]
    cfg = tmp_path / "run.yaml"
    base = "out: {o}\nscore: {{probes: [x.yaml]}}\nplan: p.yaml\npilot: {{recipe: r.yaml}}\n".format(o=tmp_path / "o")
    cfg.write_text(base + "ladder: {repo: org/tiny, revisions: [step1000, step2000]}\n")
    loaded = load_run_config(cfg)
    assert loaded["ladder"]["repo"] == "org/tiny"
    ident = _ladder_identity(resolve_hub_ladder("org/tiny", ["step1000", "step2000"]))
    assert [h["commit"] for h in ident["hub"]] == [shas["step1000"], shas["step2000"]]
    cfg.write_text(base + "ladder: {repo: org/tiny, revison: [step1000]}\n")
    with pytest.raises(ProbeselectError, match="ladder: {repo: ORG/NAME, revisions"):
        load_run_config(cfg)
    cfg.write_text(base + "ladder: {repo: org/tiny, revisions: all}\naverage: {window: 2}\n")
    with pytest.raises(ProbeselectError, match="average:` needs a local ladder"):
        load_run_config(cfg)
