"""Checkpoint averaging on a micro ladder of random tiny models (built in about a second)."""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet
from probeselect.average import average_checkpoints, average_windows, compare_averaging
from probeselect.checkpoints import discover_checkpoints
from probeselect.errors import CheckpointError, TokenizerMismatchError

STEPS = (10, 20, 30)


def _tokenizer():
    from probeselect.toy.ladder import train_tokenizer

    text = ["1 + 2 = 3. 4 - 1 = 3. Q: What is 5 + 2? A: 7", "seven plus two is nine", "a cat is an animal"] * 20
    return train_tokenizer(text, vocab_size=300)


def _save_model(path, tok, seed, *, hidden=16, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).to(dtype)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """Three random checkpoints (checkpoint-10/20/30) sharing one tokenizer. Read-only."""
    root = tmp_path_factory.mktemp("micro") / "ladder"
    tok = _tokenizer()
    for i, s in enumerate(STEPS):
        _save_model(root / f"checkpoint-{s}", tok, seed=i)
    return root


def _copy(src, tmp_path):
    dst = tmp_path / "ladder"
    shutil.copytree(src, dst)
    return dst


def test_mean_of_three_equals_tensor_mean_and_names_sources(micro, tmp_path):
    out = tmp_path / "avg"
    paths = average_checkpoints(micro, window=3, out_dir=out)
    assert [p.name for p in paths] == ["avg3-checkpoint-30"]
    got = load_file(str(paths[0] / "model.safetensors"))
    srcs = [load_file(str(micro / f"checkpoint-{s}" / "model.safetensors")) for s in STEPS]
    assert set(got) == set(srcs[0])
    for key, t in got.items():
        expected = (srcs[0][key].double() + srcs[1][key].double() + srcs[2][key].double()) / 3
        torch.testing.assert_close(t.double(), expected, rtol=0, atol=1e-6)
        assert t.dtype == srcs[0][key].dtype

    meta = json.loads((paths[0] / "probeselect_checkpoint.json").read_text())
    ckpts = discover_checkpoints(micro)
    assert meta["step"] == 30
    assert meta["averaged"]["window"] == 3 and meta["averaged"]["mode"] == "sliding"
    assert [(s["name"], s["fingerprint"]) for s in meta["averaged"]["sources"]] == [(c.name, c.fingerprint) for c in ckpts]
    assert json.loads((paths[0] / "trainer_state.json").read_text())["global_step"] == 30
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (paths[0] / f).is_file()
    found = discover_checkpoints(out)
    assert [(c.name, c.step) for c in found] == [("avg3-checkpoint-30", 30)]
    assert found[0].tokenizer_hash == ckpts[0].tokenizer_hash


def test_sliding_and_disjoint_windows(micro, tmp_path):
    slide = average_checkpoints(micro, window=2, out_dir=tmp_path / "s")
    assert [p.name for p in slide] == ["avg2-checkpoint-20", "avg2-checkpoint-30"]
    assert [c.step for c in discover_checkpoints(tmp_path / "s")] == [20, 30]
    disj = average_checkpoints(micro, window=2, out_dir=tmp_path / "d", mode="disjoint")
    assert [p.name for p in disj] == ["avg2-checkpoint-30"]  # blocks end at the last checkpoint
    names = lambda ws: [[c for c in w] for w in ws]  # noqa: E731
    assert names(average_windows(list("abcde"), 2, "disjoint")) == [["b", "c"], ["d", "e"]]
    assert names(average_windows(list("abcd"), 3, "sliding")) == [["a", "b", "c"], ["b", "c", "d"]]
    # a second call reuses folders made from the same sources
    before = os.stat(slide[0] / "model.safetensors").st_mtime_ns
    average_checkpoints(micro, window=2, out_dir=tmp_path / "s")
    assert os.stat(slide[0] / "model.safetensors").st_mtime_ns == before


def test_averaged_folder_loads_runs_and_scores(micro, tmp_path):
    from transformers import AutoModelForCausalLM

    import probeselect
    from probeselect.probes import spec_from_dict

    out = tmp_path / "avg"
    (path,) = average_checkpoints(micro, window=3, out_dir=out)
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[0, 5, 6, 7]])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
    spec = spec_from_dict({"family": "arith_pattern", "n_items": 2, "n_demos": 2, "variants": ["eq"]})
    res = probeselect.score_checkpoints(out, [spec], seeds=[0], progress=False)
    assert len(res.scores) == 2 and res.scores["checkpoint"].unique().tolist() == ["avg3-checkpoint-30"]
    assert np.isfinite(res.scores["margin"]).all()


def test_bfloat16_sources_stay_bfloat16(tmp_path):
    tok = _tokenizer()
    root = tmp_path / "bf"
    for i, s in enumerate((1, 2)):
        _save_model(root / f"checkpoint-{s}", tok, seed=i, dtype=torch.bfloat16)
    (path,) = average_checkpoints(root, window=2, out_dir=tmp_path / "avg")
    got = load_file(str(path / "model.safetensors"))
    a, b = (load_file(str(root / f"checkpoint-{s}" / "model.safetensors")) for s in (1, 2))
    for key, t in got.items():
        assert t.dtype == torch.bfloat16
        torch.testing.assert_close(t, ((a[key].float() + b[key].float()) / 2).to(torch.bfloat16), rtol=0, atol=0)


def test_mismatched_config_is_refused(micro, tmp_path):
    lad = _copy(micro, tmp_path)
    shutil.rmtree(lad / "checkpoint-20")
    _save_model(lad / "checkpoint-20", _tokenizer(), seed=1, hidden=24)
    with pytest.raises(CheckpointError, match=r"cannot average .*checkpoint-10 and .*checkpoint-20: config.json "
                                              r"differs in .*hidden_size"):
        average_checkpoints(lad, window=2, out_dir=tmp_path / "avg")
    assert not (tmp_path / "avg").exists() or not any((tmp_path / "avg").iterdir())  # nothing written


def test_mismatched_tensor_shapes_are_refused(micro, tmp_path):
    lad = _copy(micro, tmp_path)
    f = lad / "checkpoint-30" / "model.safetensors"
    sd = load_file(str(f))
    key = "model.norm.weight"
    sd[key] = torch.ones(sd[key].shape[0] + 1)
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"cannot average .*checkpoint-10 and .*checkpoint-30: tensor "
                                              r"'model.norm.weight' is F32\[16\] in the first and F32\[17\]"):
        average_checkpoints(lad, window=2, out_dir=tmp_path / "avg")


def test_mismatched_tokenizers_are_refused(micro, tmp_path):
    lad = _copy(micro, tmp_path)
    tj = lad / "checkpoint-20" / "tokenizer.json"
    j = json.loads(tj.read_text())
    j["normalizer"] = {"type": "Lowercase"}
    tj.write_text(json.dumps(j))
    with pytest.raises(TokenizerMismatchError, match=r"cannot average .*checkpoint-10 and .*checkpoint-20: their "
                                                      r"tokenizers differ"):
        average_checkpoints(lad, window=3, out_dir=tmp_path / "avg")


def test_bad_window_and_output_folder(micro, tmp_path):
    with pytest.raises(CheckpointError, match="exceeds the 3 checkpoints"):
        average_checkpoints(micro, window=4, out_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="must be >= 2"):
        average_checkpoints(micro, window=1, out_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="output folder is the checkpoint folder"):
        average_checkpoints(micro, window=2, out_dir=micro)


def _run(path, steps, means):
    """A minimal run folder: summary.csv + scores.parquet (one item, one seed) + manifest."""
    rows = [dict(checkpoint=f"ck{s}", step=s, tokens=None, family="f", variant="v", seed=0, item_id="i0",
                 margin=m, correct=m > 0) for s, m in zip(steps, means)]
    summ = [dict(checkpoint=f"ck{s}", step=s, tokens=None, family="f", variant="v", mean_margin=m, seed_sd=np.nan,
                 accuracy=float(m > 0), candidate_accuracy=float(m > 0)) for s, m in zip(steps, means)]
    atomic_write_parquet(path / "scores.parquet", pd.DataFrame(rows))
    atomic_write_csv(path / "summary.csv", pd.DataFrame(summ))
    atomic_write_json(path / "manifest.json", {"status": "complete", "items_hash": "x", "checkpoints": []})
    return path


def test_compare_averaging_aligns_steps(tmp_path):
    raw = _run(tmp_path / "raw", [1, 2, 3, 4, 5], [0.0, 2.0, -1.0, 1.0, -1.0])
    avg = _run(tmp_path / "avg", [3, 4, 5], [0.3, 0.1, -0.2])
    df = compare_averaging(raw, avg)
    r = df.iloc[0]
    assert r["aligned"] and r["n_checkpoints_raw"] == 3 and r["n_checkpoints_avg"] == 3
    assert r["raw_total_variation"] == pytest.approx(4.0)  # raw at steps 3,4,5: -1, 1, -1
    assert r["avg_total_variation"] == pytest.approx(0.5)
    assert r["tv_ratio"] == pytest.approx(0.125)
    assert r["raw_sign_changes"] == 2 and r["avg_sign_changes"] == 1
    assert r["raw_flip_rate"] == pytest.approx(1.0) and r["avg_flip_rate"] == pytest.approx(0.5)
    assert r["raw_excess_variation"] == pytest.approx(4.0) and r["avg_excess_variation"] == pytest.approx(0.0)
