import json
import shutil

import pytest

from probeselect.checkpoints import discover_checkpoints, fingerprint_checkpoint, parse_checkpoint_name
from probeselect.errors import CheckpointError, TokenizerMismatchError


@pytest.mark.parametrize(
    "name, expected",
    [
        ("checkpoint-10", (10, None)),
        ("step1000-tokens4B", (1000, 4_000_000_000)),
        ("stage1-step476000-tokens2000B", (476000, 2_000_000_000_000)),
        ("step20", (20, None)),
        ("global_step300", (300, None)),
        ("iter_0001000", (1000, None)),
        ("data", None),
        ("checkpoint-x", None),
    ],
)
def test_parse_names(name, expected):
    assert parse_checkpoint_name(name) == expected


def test_toy_ladder_discovered_in_numeric_order(tiny_ladder):
    ckpts = discover_checkpoints(tiny_ladder)
    steps = [c.step for c in ckpts]
    assert len(ckpts) >= 8 and steps == sorted(steps)
    assert all(c.tokens and c.tokens > 0 for c in ckpts)
    assert [c.tokens for c in ckpts] == sorted(c.tokens for c in ckpts)
    assert len({c.fingerprint for c in ckpts}) == len(ckpts)
    assert len({c.tokenizer_hash for c in ckpts}) == 1


def test_numeric_not_lexicographic(tmp_path, copy_ckpt):
    for n in (9, 10, 100):
        copy_ckpt(tmp_path / f"checkpoint-{n}")
    (tmp_path / "notes").mkdir()  # not a checkpoint: ignored
    assert [c.name for c in discover_checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]


def test_mixed_naming_schemes_and_metadata(tmp_path, copy_ckpt):
    copy_ckpt(tmp_path / "stage1-step30-tokens1B")
    copy_ckpt(tmp_path / "global_step20")
    copy_ckpt(tmp_path / "iter_0000010")
    meta = copy_ckpt(tmp_path / "my-favourite")
    (meta / "trainer_state.json").write_text(json.dumps({"global_step": 40, "num_input_tokens_seen": 123}))
    ckpts = discover_checkpoints(tmp_path)
    assert [(c.name, c.step) for c in ckpts] == [
        ("iter_0000010", 10), ("global_step20", 20), ("stage1-step30-tokens1B", 30), ("my-favourite", 40)
    ]
    assert ckpts[2].tokens == 1_000_000_000 and ckpts[3].tokens == 123


def test_single_model_folder(tmp_path, copy_ckpt):
    one = copy_ckpt(tmp_path / "final")
    (one / "trainer_state.json").unlink(missing_ok=True)
    (ck,) = discover_checkpoints(one)
    assert ck.path == one and ck.step is None


def test_fingerprint_tracks_content(tmp_path, copy_ckpt):
    a = copy_ckpt(tmp_path / "a", 0)
    fp, files = fingerprint_checkpoint(a)
    assert files == ("model.safetensors",)
    shutil.copytree(a, tmp_path / "b")
    assert fingerprint_checkpoint(tmp_path / "b")[0] == fp  # location-independent
    b = copy_ckpt(tmp_path / "c", 1)
    assert fingerprint_checkpoint(b)[0] != fp


def test_errors_are_specific(tmp_path, copy_ckpt):
    with pytest.raises(CheckpointError, match="does not exist"):
        discover_checkpoints(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoints found"):
        discover_checkpoints(tmp_path / "empty")
    nw = tmp_path / "noweights"
    copy_ckpt(nw / "checkpoint-1")
    (nw / "checkpoint-1" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"checkpoint-1: folder has no weights"):
        discover_checkpoints(nw)


def test_truncated_safetensors(tmp_path, copy_ckpt):
    c = copy_ckpt(tmp_path / "ladder" / "checkpoint-5")
    f = c / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated or corrupt"):
        discover_checkpoints(tmp_path / "ladder")
    f.write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        discover_checkpoints(tmp_path / "ladder")


def test_tokenizer_mismatch(tmp_path, copy_ckpt):
    copy_ckpt(tmp_path / "checkpoint-1", 0)
    other = copy_ckpt(tmp_path / "checkpoint-2", 1)
    tj = other / "tokenizer.json"
    tok = json.loads(tj.read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same files, different content
    tj.write_text(json.dumps(tok))
    with pytest.raises(TokenizerMismatchError, match=r"checkpoint-1 and .*checkpoint-2"):
        discover_checkpoints(tmp_path)
    ck = discover_checkpoints(tmp_path, allow_tokenizer_mismatch=True)
    assert ck[0].tokenizer_hash != ck[1].tokenizer_hash


def test_tokenizer_hash_ignores_formatting(tmp_path, copy_ckpt):
    copy_ckpt(tmp_path / "checkpoint-1", 0)
    other = copy_ckpt(tmp_path / "checkpoint-2", 1)
    tj = other / "tokenizer.json"
    tj.write_text(json.dumps(json.loads(tj.read_text()), indent=4))  # reformatted, same content
    ck = discover_checkpoints(tmp_path)
    assert ck[0].tokenizer_hash == ck[1].tokenizer_hash


def test_fingerprint_sees_weight_values_of_large_files(tmp_path):
    """Same layout and header, different values: the fingerprint must differ (sampled blocks)."""
    import torch
    from safetensors.torch import save_file

    for name, val in (("a", 1.0), ("b", 2.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text('{"model_type": "llama"}')
        save_file({"w": torch.full((1024, 1024), val)}, d / "model.safetensors")  # 4 MiB: sampled path
    assert fingerprint_checkpoint(tmp_path / "a")[0] != fingerprint_checkpoint(tmp_path / "b")[0]
