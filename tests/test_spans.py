import pytest
import torch

from probeselect import spans
from probeselect.errors import ScoringError
from probeselect.probes import generate_items
from probeselect.score import load_model, load_tokenizer
from probeselect.spans import encode_pair, score_pairs


@pytest.fixture(scope="module")
def final_model(ladder_checkpoints):
    path = ladder_checkpoints[-1]
    return load_model(path, torch.float32, torch.device("cpu")), load_tokenizer(path)


@pytest.fixture(scope="module")
def requests(arith_spec):
    items = generate_items(arith_spec, [0, 1])
    reqs = [(it.prompt, c) for it in items for c in it.candidates]
    # extra shapes: multi-token continuation, trailing space moved into the continuation
    reqs += [("Ana lives in", " Oslo. She has a cat."), ("7 + 8 = ", "15")]
    return reqs


def test_matches_lm_eval_oracle(final_model, requests):
    """Our span log-probs equal lm-evaluation-harness's HFLM.loglikelihood (float32)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = final_model
    ours = score_pairs(model, [encode_pair(tok, c, x) for c, x in requests], batch_size=7)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=5, device="cpu")
    theirs = lm.loglikelihood(
        [Instance(request_type="loglikelihood", doc={}, arguments=r, idx=i) for i, r in enumerate(requests)],
        disable_tqdm=True,
    )
    deltas = [abs(o.logprob - t[0]) for o, t in zip(ours, theirs)]
    print(f"max |delta| vs lm-eval over {len(deltas)} requests: {max(deltas):.2e} nats")
    assert max(deltas) < 1e-4
    assert [o.is_greedy for o in ours] == [bool(t[1]) for t in theirs]


def test_batch_size_and_head_path_do_not_change_numbers(final_model, requests, monkeypatch):
    model, tok = final_model
    pairs = [encode_pair(tok, c, x) for c, x in requests]
    one = [s.logprob for s in score_pairs(model, pairs, batch_size=1)]
    many = [s.logprob for s in score_pairs(model, pairs, batch_size=64)]
    monkeypatch.setattr(spans, "_head_only_supported", lambda m: False)  # unoptimised full-logits path
    full = [s.logprob for s in score_pairs(model, pairs, batch_size=3)]
    torch.testing.assert_close(torch.tensor(many), torch.tensor(one), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.tensor(full), torch.tensor(one), rtol=0, atol=1e-4)


def test_encoding_contract(final_model):
    _, tok = final_model
    p = encode_pair(tok, "7 + 8 =", " 15")
    assert list(p.context_ids) + list(p.continuation_ids) == tok.encode("7 + 8 = 15")
    assert tok.decode(p.continuation_ids) == " 15"
    # trailing context space belongs to the continuation, as in lm-eval
    assert encode_pair(tok, "7 + 8 = ", "15") == p


def test_empty_and_merging_candidates_are_errors(final_model):
    _, tok = final_model
    with pytest.raises(ScoringError, match="item X.*tokenizes to nothing"):
        encode_pair(tok, "7 + 8 =", "", what="item X")
    # "1" glued to "1" forms digits, but digits are single tokens; a word glued to a word merges
    with pytest.raises(ScoringError, match="item Y.*merges into the prompt"):
        encode_pair(tok, "The opposite of hot is co", "ld", what="item Y")
    with pytest.raises(ScoringError, match="empty prompt"):
        encode_pair(tok, "", " 1")


def test_shared_prefix_equals_unshared(final_model, arith_spec):
    from probeselect.spans import group_pairs, score_groups

    model, tok = final_model
    items = generate_items(arith_spec, [0, 1, 2])
    groups = [group_pairs([encode_pair(tok, it.prompt, c) for c in it.candidates]) for it in items]
    ref = score_pairs(model, [encode_pair(tok, it.prompt, c) for it in items for c in it.candidates], batch_size=4)
    for budget in (64, 100_000):  # one row per batch, everything in one batch
        got = [s for g in score_groups(model, groups, max_batch_tokens=budget) for s in g]
        torch.testing.assert_close(torch.tensor([s.logprob for s in got]), torch.tensor([s.logprob for s in ref]),
                                   rtol=0, atol=1e-4)
        assert [(s.n_tokens, s.is_greedy) for s in got] == [(s.n_tokens, s.is_greedy) for s in ref]


def test_out_of_memory_halves_the_batch(final_model, arith_spec, monkeypatch):
    from probeselect.spans import group_pairs, score_groups

    model, tok = final_model
    items = generate_items(arith_spec, [0])
    groups = [group_pairs([encode_pair(tok, it.prompt, c) for c in it.candidates]) for it in items]
    ref = score_groups(model, groups, max_batch_tokens=100_000)
    decoder = model.get_decoder()
    real_forward = decoder.forward
    seen = []

    def flaky(*args, **kw):
        rows = kw["input_ids"].shape[0]
        seen.append(rows)
        if rows > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_forward(*args, **kw)

    monkeypatch.setattr(decoder, "forward", flaky)
    got = score_groups(model, groups, max_batch_tokens=100_000)
    assert seen[:3] == [len(groups), len(groups) // 2, len(groups) // 4]  # halved until it fits
    torch.testing.assert_close(torch.tensor([s.logprob for g in got for s in g]),
                               torch.tensor([s.logprob for g in ref for s in g]), rtol=0, atol=1e-4)
