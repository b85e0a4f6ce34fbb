import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from probeselect import score_checkpoints
from probeselect.errors import CheckpointError

SCORE_COLUMNS = {
    "checkpoint", "step", "tokens", "family", "variant", "seed", "item_id", "task_logprob",
    "shortcut_logprob", "margin", "margin_per_token", "correct", "candidate_correct",
}


@pytest.fixture(scope="module")
def scored(tiny_ladder, arith_spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    return score_checkpoints(tiny_ladder, [arith_spec], seeds=[0, 1], out=out, progress=False)


def test_tables_and_files(scored, tiny_ladder):
    n_ckpt = sum(1 for p in tiny_ladder.iterdir() if p.name.startswith("checkpoint-"))
    s = scored.scores
    assert SCORE_COLUMNS <= set(s.columns)
    assert len(s) == n_ckpt * 6 * 3 * 2  # checkpoints x items x variants x seeds
    assert s.groupby(["checkpoint", "item_id", "seed"]).size().max() == 1
    pd.testing.assert_series_equal(s["margin"], s["task_logprob"] - s["shortcut_logprob"], check_names=False)
    assert (s["correct"] == (s["margin"] > 0)).all()
    # candidate_correct implies correct; a third answer can win even when correct
    assert (~s["candidate_correct"] | s["correct"]).all()
    lp = pd.DataFrame(s["candidate_logprobs"].tolist())
    assert (s["candidate_correct"] == (lp[0] > lp.drop(columns=0).max(axis=1))).all()
    run = scored.run_dir
    on_disk = pd.read_parquet(run / "scores.parquet")
    pd.testing.assert_frame_equal(on_disk.drop(columns="candidate_logprobs"), s.drop(columns="candidate_logprobs"))
    summ = pd.read_csv(run / "summary.csv")
    assert len(summ) == n_ckpt * 3
    assert {"mean_margin", "seed_sd", "ci_low", "ci_high", "accuracy", "candidate_accuracy"} <= set(summ.columns)
    assert list(summ.drop_duplicates("checkpoint")["step"]) == sorted(summ["step"].unique())
    items = [json.loads(l) for l in (run / "items.jsonl").read_text().splitlines()]
    assert len(items) == 6 * 3 * 2 and all(c.startswith(" ") for it in items for c in it["candidates"])


def test_manifest(scored):
    m = json.loads((scored.run_dir / "manifest.json").read_text())
    assert m["status"] == "complete" and m["seeds"] == [0, 1]
    assert m["versions"]["torch"] and m["versions"]["transformers"]
    assert "commit" in m["git"]
    assert all(len(c["fingerprint"]) == 64 for c in m["checkpoints"])
    assert m["probes"][0]["spec_hash"] and m["config"]["dtype"] == "float32"
    assert {(c["checkpoint"], c["family"]) for c in m["complete"]} == {
        (c["name"], "arith_pattern") for c in m["checkpoints"]
    }
    assert {"items.jsonl", "scores.parquet", "summary.csv", "audit.parquet"} <= set(m["outputs"])


def test_rerun_uses_cache_and_new_checkpoint_only(scored, tiny_ladder, arith_spec, tmp_path):
    again = score_checkpoints(tiny_ladder, [arith_spec], seeds=[0, 1], out=scored.run_dir, progress=False)
    assert again.scored == []
    pd.testing.assert_frame_equal(again.scores, scored.scores)
    # a ladder that gained one checkpoint scores only the new one
    ladder = tmp_path / "ladder"
    ckpts = sorted((p for p in tiny_ladder.iterdir() if p.name.startswith("checkpoint-")),
                   key=lambda p: int(p.name.split("-")[1]))
    for p in ckpts[:-1]:
        shutil.copytree(p, ladder / p.name)
    run = tmp_path / "run"
    first = score_checkpoints(ladder, [arith_spec], seeds=[0, 1], out=run, progress=False)
    assert len(first.scored) == len(ckpts) - 1
    shutil.copytree(ckpts[-1], ladder / ckpts[-1].name)
    second = score_checkpoints(ladder, [arith_spec], seeds=[0, 1], out=run, progress=False)
    assert second.scored == [ckpts[-1].name]
    pd.testing.assert_frame_equal(second.scores, scored.scores)


def test_weights_not_matching_config_fail_clearly(tmp_path, copy_ckpt, arith_spec):
    """A checkpoint missing tensors must not load with random weights (transformers only warns)."""
    from safetensors.torch import load_file, save_file

    c = copy_ckpt(tmp_path / "ladder" / "checkpoint-1")
    sd = load_file(c / "model.safetensors")
    dropped = sorted(k for k in sd if ".layers." in k)[0]
    del sd[dropped]
    save_file(sd, c / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"checkpoint-1: failed to load the model: 1 missing .*{dropped}"):
        score_checkpoints(tmp_path / "ladder", [arith_spec], seeds=[0], progress=False)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "probeselect", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_score_end_to_end(tiny_ladder, tmp_path):
    from conftest import REPO

    out = tmp_path / "cli-run"
    r = _cli("score", str(tiny_ladder), "--probes", str(REPO / "probes" / "arith_pattern.yaml"),
             "--seeds", "0", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert (out / "summary.csv").is_file() and "mean_margin" in r.stdout and str(out) in r.stdout
    r2 = _cli("score", str(tiny_ladder), "--probes", str(REPO / "probes" / "arith_pattern.yaml"),
              "--seeds", "0", "--out", str(out), "--no-progress")
    assert r2.returncode == 0 and "no model work" in r2.stderr


def test_cli_errors_are_one_line(tmp_path):
    from conftest import REPO

    r = _cli("score", str(tmp_path / "missing"), "--probes", str(REPO / "probes" / "arith_pattern.yaml"))
    assert r.returncode == 2
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: arith_patern\n")
    (tmp_path / "ck").mkdir()
    r = _cli("score", str(tmp_path / "ck"), "--probes", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "bad.yaml" in r.stderr and 'Did you mean "arith_pattern"' in r.stderr


def test_capability_and_heldout_tracks_in_summary(tiny_ladder, tmp_path):
    from probeselect.capability import heldout_nll, load_heldout_texts
    from probeselect.probes import spec_from_dict
    from probeselect.score import load_model, load_tokenizer

    heldout = tiny_ladder / "data" / "heldout.txt"
    specs = [spec_from_dict({"family": "arith_pattern", "n_items": 3}),
             spec_from_dict({"family": "arith_plain", "n_items": 3})]
    res = score_checkpoints(tiny_ladder, specs, seeds=[0], out=tmp_path / "run", heldout=heldout, audit_items=0,
                            progress=False)
    summ = res.summary
    assert set(summ["kind"]) == {"conflict", "capability", "nll"}
    nll = summ[summ["kind"] == "nll"].set_index("checkpoint")
    assert list(nll["family"].unique()) == ["heldout_nll"] and len(nll) == summ["checkpoint"].nunique()
    # The track equals a direct call on one checkpoint.
    last = res.manifest["checkpoints"][-1]
    direct = heldout_nll(load_model(last["path"], __import__("torch").float32, __import__("torch").device("cpu")),
                         load_tokenizer(last["path"]), load_heldout_texts(heldout))
    assert nll.loc[last["name"], "bits_per_byte"] == pytest.approx(direct.bits_per_byte, abs=1e-6)
    assert res.manifest["heldout"]["n_docs"] == direct.n_docs
    # The scores table carries each family's kind.
    assert dict(res.scores.groupby("family")["kind"].first()) == {"arith_pattern": "conflict", "arith_plain": "capability"}


def test_generation_and_audit_outputs(tiny_ladder, tmp_path):
    from probeselect.probes import spec_from_dict

    specs = [spec_from_dict({"family": "arith_pattern", "n_items": 2}),
             spec_from_dict({"family": "persona_qa", "n_items": 2, "variants": ["block"],
                             "params": {"gen_samples": 8, "gen_max_new_tokens": 8}})]
    out = tmp_path / "run"
    res = score_checkpoints(tiny_ladder, specs, seeds=[0, 1], out=out, audit_items=2, progress=False)
    n_ckpt = len(res.manifest["checkpoints"])
    gen = pd.read_parquet(out / "generations.parquet")
    assert len(gen) == n_ckpt * 2 * 2  # checkpoints x items x seeds
    assert (gen[["n_task", "n_shortcut", "n_other_candidate", "n_other", "n_unterminated"]].sum(axis=1) == 8).all()
    persona = res.summary[res.summary["family"] == "persona_qa"]
    assert persona["gen_n"].eq(2 * 2 * 8).all()
    assert ((persona["gen_ci_low"] <= persona["gen_consistency"]) & (persona["gen_consistency"] <= persona["gen_ci_high"])).all()
    assert res.summary.loc[res.summary["family"] == "arith_pattern", "gen_n"].isna().all()
    audit = pd.read_parquet(out / "audit.parquet")
    assert len(audit) == n_ckpt * 2 * 2 and set(audit["seed"]) == {0}  # 2 items per family, first seed
    summ = pd.read_csv(out / "audit_summary.csv")
    assert {"agree_correct", "agree_candidate_correct", "gen_task_rate"} <= set(summ.columns)
    m = json.loads((out / "manifest.json").read_text())
    assert {"generations.parquet", "audit.parquet", "audit_summary.csv"} <= set(m["outputs"])


def test_use_device_makes_cuda_n_the_current_device(monkeypatch):
    """``cuda:N`` becomes the process's current CUDA device (accelerate trains there; without it a ``cuda:1``
    run scored on GPU 1 and fine-tuned on GPU 0), in one process only; ``cuda``/``cpu`` change nothing."""
    import torch

    from probeselect import score

    calls = []
    monkeypatch.setattr(score, "resolve_device", lambda d: torch.device(d))  # as on a machine with 2 GPUs
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert score.use_device("cuda:1") == torch.device("cuda:1") and calls == [1]
    score.use_device("cuda")
    score.use_device("cpu")
    assert calls == [1]
    monkeypatch.setenv("WORLD_SIZE", "2")  # under accelerate launch each rank keeps its own GPU
    score.use_device("cuda:1")
    assert calls == [1]
