"""Held-out NLL in bits per byte (probeselect.capability)."""

import json
import math

import pytest
import torch

from probeselect import capability
from probeselect.capability import NllResult, heldout_nll, load_heldout_texts, rolling_loglikelihoods, rolling_windows
from probeselect.errors import ProbeSpecError, ScoringError
from probeselect.score import load_model, load_tokenizer

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # These tiny models run fastest single-threaded, and far faster than with two threads
    # when other processes share the cores (OpenMP threads spin-wait for each other).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def final_model(ladder_checkpoints):
    path = ladder_checkpoints[-1]
    return load_model(path, torch.float32, CPU), load_tokenizer(path)


@pytest.fixture(scope="module")
def heldout(tiny_ladder):
    return load_heldout_texts(tiny_ladder / "data" / "heldout.txt")


@pytest.fixture(scope="module")
def docs(heldout):
    # Short held-out lines plus longer multi-sentence documents (with non-ASCII text), so
    # that with max_length=16 documents span one to several windows, the last one partial.
    long = [
        "Ana lives in Malmö. She has a cat. She likes chess. Her favourite colour is red.",
        "The opposite of hot is cold. A dog is an animal. " * 3,
        "\n".join(["3 + 4 = 7", "Q: What is 12 - 5? A: 7", "9 plus 9 is 18"]),
    ]
    return heldout[:24] + long + ["x"]


# ---------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 32, 33, 100])
@pytest.mark.parametrize("max_length, stride", [(16, 16), (16, 8), (16, 5), (16, 1), (1, 1), (7, 3)])
def test_windows_score_every_token_exactly_once(n, max_length, stride):
    targets = []
    for start, end, n_new in rolling_windows(n, max_length, stride):
        assert 0 <= start < end and end - start <= max_length and 1 <= n_new <= end - start
        assert n_new <= (max_length if start == 0 and not targets else stride)
        if targets:  # later windows read as much context as fits
            assert end - start == min(max_length, end)
        targets += range(end - n_new + 1, end + 1)
    assert targets == list(range(1, n + 1))


def test_disjoint_windows_are_lm_evals():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (5, 16, 17, 40, 47):
        toks = list(range(100, 100 + n))
        seq = [0] + toks
        ours = [(seq[s:e], seq[e - k + 1 : e + 1]) for s, e, k in rolling_windows(n, 16)]
        theirs = [
            (ctx + cont)[-17:][:-1] for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(toks, 0, 16, 1))
        ]
        conts = [cont for _, cont in get_rolling_token_windows(toks, 0, 16, 1)]
        assert [w[0] for w in ours] == theirs and [w[1] for w in ours] == conts


def test_bad_window_arguments():
    with pytest.raises(ValueError, match="stride"):
        rolling_windows(10, 8, 9)
    with pytest.raises(ValueError, match="stride"):
        rolling_windows(10, 8, 0)
    with pytest.raises(ValueError, match="max_length"):
        rolling_windows(10, 0)


# ---------------------------------------------------------------------------
# lm-eval oracle
# ---------------------------------------------------------------------------


def test_matches_lm_eval_loglikelihood_rolling(final_model, docs):
    """Per-document log-likelihoods equal HFLM.loglikelihood_rolling (disjoint windows).

    Convention: documents are encoded without special tokens and BOS is the single prefix
    token, i.e. HFLM(add_bos_token=False, prefix_token_id=BOS). (With lm-eval's default
    add_bos_token=None this tokenizer adds BOS itself and lm-eval scores BOS after BOS.)
    """
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = final_model
    ours, ntoks = rolling_loglikelihoods(model, tok, docs, max_length=16, batch_size=7)
    assert max(ntoks) > 32 and any(16 < n < 32 for n in ntoks)  # several windows, partial last ones
    lm = HFLM(pretrained=model, tokenizer=tok, max_length=16, add_bos_token=False,
              prefix_token_id=tok.bos_token_id, batch_size=5, device="cpu")
    reqs = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(d,), idx=i) for i, d in enumerate(docs)]
    theirs = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    deltas = [abs(o - t) for o, t in zip(ours, theirs)]
    print(f"max |delta| vs lm-eval loglikelihood_rolling over {len(docs)} documents: {max(deltas):.2e} nats")
    assert max(deltas) < 1e-4


def test_batch_size_and_head_path_do_not_change_numbers(final_model, docs, monkeypatch):
    model, tok = final_model
    docs = docs[-6:]
    one, _ = rolling_loglikelihoods(model, tok, docs, max_length=16, stride=6, batch_size=1)
    many, _ = rolling_loglikelihoods(model, tok, docs, max_length=16, stride=6, batch_size=64)
    monkeypatch.setattr(capability, "_head_only_supported", lambda m: False)  # full-logits path
    full, _ = rolling_loglikelihoods(model, tok, docs, max_length=16, stride=6, batch_size=3)
    torch.testing.assert_close(torch.tensor(many), torch.tensor(one), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.tensor(full), torch.tensor(one), rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------
# Strided windows, bits per byte
# ---------------------------------------------------------------------------


def test_stride_gives_more_context(final_model, heldout):
    model, tok = final_model
    texts = [t for t in heldout if len(tok.encode(t, add_special_tokens=False)) > 16][:40]
    disjoint = heldout_nll(model, tok, texts, max_length=16, batch_size=32)
    strided = heldout_nll(model, tok, texts, max_length=16, stride=4, batch_size=32)
    assert (strided.n_tokens, strided.n_bytes, strided.n_docs) == (disjoint.n_tokens, disjoint.n_bytes, disjoint.n_docs)
    # More context per scored token does not hurt a trained checkpoint (tiny tolerance)...
    assert strided.total_nats <= disjoint.total_nats * 1.001
    assert strided.bits_per_byte > 0.9 * disjoint.bits_per_byte
    # ...and when every document fits into one window, stride changes nothing.
    whole = heldout_nll(model, tok, texts, batch_size=32)
    whole_strided = heldout_nll(model, tok, texts, stride=3, batch_size=32)
    assert whole_strided.total_nats == pytest.approx(whole.total_nats, abs=1e-6)
    assert whole.total_nats <= disjoint.total_nats * 1.001


def test_bits_per_byte_hand_checked(ladder_checkpoints):
    """A model with an all-zero LM head predicts uniformly over 1024 tokens: 10 bits per token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(ladder_checkpoints[-1])
    cfg = LlamaConfig(vocab_size=1024, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    texts = ["Ana lives in Malmö.", "", "7 + 8 = 15"]
    n_tok = sum(len(tok.encode(t, add_special_tokens=False)) for t in texts)
    res = heldout_nll(model, tok, texts, max_length=4, stride=2)
    assert isinstance(res, NllResult)
    assert res.n_bytes == 20 + 0 + 10  # "ö" is two UTF-8 bytes
    assert (res.n_tokens, res.n_docs) == (n_tok, 3)
    assert res.total_nats == pytest.approx(n_tok * math.log(1024), rel=1e-6)
    assert res.nats_per_token == pytest.approx(math.log(1024), rel=1e-6)
    assert res.bits_per_byte == pytest.approx(10 * n_tok / 30, rel=1e-6)
    assert res.to_dict()["n_bytes"] == 30


def test_final_checkpoint_has_lower_bits_per_byte_than_first(tiny_ladder, ladder_checkpoints, final_model, heldout):
    first = ladder_checkpoints[0]
    r0 = heldout_nll(load_model(first, torch.float32, CPU), load_tokenizer(first), heldout, batch_size=64)
    r1 = heldout_nll(*final_model, heldout, batch_size=64)
    print(f"heldout bits/byte: {first.name} {r0.bits_per_byte:.3f} -> {ladder_checkpoints[-1].name} {r1.bits_per_byte:.3f}")
    assert math.isfinite(r0.bits_per_byte) and math.isfinite(r1.bits_per_byte)
    assert 0 < r1.bits_per_byte < r0.bits_per_byte
    assert r1.n_docs == len(heldout) and r1.n_bytes == sum(len(t.encode()) for t in heldout)


def test_scoring_errors(final_model):
    model, tok = final_model
    with pytest.raises(ScoringError, match="no documents"):
        heldout_nll(model, tok, [])
    with pytest.raises(ScoringError, match="every document is empty"):
        heldout_nll(model, tok, [""])
    with pytest.raises(ScoringError, match="stride"):
        heldout_nll(model, tok, ["abc"], max_length=8, stride=9)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def test_load_txt_jsonl_and_datasets_folder(tmp_path):
    txt = tmp_path / "h.txt"
    txt.write_text("first line\n\n   \nsecond  line \r\nthird\n", encoding="utf-8")
    assert load_heldout_texts(txt) == ["first line", "second  line ", "third"]
    jl = tmp_path / "h.jsonl"
    jl.write_text(json.dumps({"text": "a b", "id": 1}) + "\n\n" + json.dumps({"text": "Malmö\nnext"}) + "\n"
                  + json.dumps({"text": ""}) + "\n", encoding="utf-8")
    assert load_heldout_texts(jl) == ["a b", "Malmö\nnext"]
    from datasets import Dataset, DatasetDict

    Dataset.from_dict({"text": ["x y", "z"], "n": [1, 2]}).save_to_disk(str(tmp_path / "ds"))
    assert load_heldout_texts(tmp_path / "ds") == ["x y", "z"]
    DatasetDict({"test": Dataset.from_dict({"text": ["only"]})}).save_to_disk(str(tmp_path / "dd"))
    assert load_heldout_texts(tmp_path / "dd") == ["only"]


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ProbeSpecError, match=r"nope\.txt: held-out text file not found"):
        load_heldout_texts(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ProbeSpecError, match=r"empty\.txt: no held-out documents"):
        load_heldout_texts(tmp_path / "empty.txt")
    (tmp_path / "nofield.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n')
    with pytest.raises(ProbeSpecError, match=r"nofield\.jsonl:2: missing field `text`"):
        load_heldout_texts(tmp_path / "nofield.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"\n')
    with pytest.raises(ProbeSpecError, match=r"bad\.jsonl:1: invalid JSON"):
        load_heldout_texts(tmp_path / "bad.jsonl")
    (tmp_path / "num.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(ProbeSpecError, match=r"num\.jsonl:1: field `text` must be a string"):
        load_heldout_texts(tmp_path / "num.jsonl")
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(ProbeSpecError, match=r"empty\.jsonl: no held-out documents"):
        load_heldout_texts(tmp_path / "empty.jsonl")
    (tmp_path / "h.csv").write_text("text\nabc\n")
    with pytest.raises(ProbeSpecError, match=r"h\.csv: unsupported held-out text format '\.csv'"):
        load_heldout_texts(tmp_path / "h.csv")
    from datasets import Dataset

    Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "nocol"))
    with pytest.raises(ProbeSpecError, match=r"nocol: missing column `text`"):
        load_heldout_texts(tmp_path / "nocol")
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ProbeSpecError, match=r"plain_dir: not a `datasets` folder"):
        load_heldout_texts(tmp_path / "plain_dir")
