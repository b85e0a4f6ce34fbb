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


# ---------------------------------------------------------------------------
# Cross-item prefix reuse
# ---------------------------------------------------------------------------


def _shared_demo_groups(tok, arith_spec, max_length=None):
    """Items of two shared demonstration blocks (two 'seeds'), items with no shared prefix,
    a prompt that is a prefix of another, and (with ``max_length``) left-truncated prompts."""
    from probeselect.spans import group_pairs

    items = generate_items(arith_spec, [0, 1])
    demos_a = "".join(f"{a} + {b} = {a + b}\n" for a, b in [(12, 7), (30, 41), (5, 5), (66, 21), (8, 13), (44, 40)])
    demos_b = "".join(f"{a} + {b} = {a + b}\n" for a, b in [(3, 9), (71, 2), (19, 19), (50, 25), (9, 80), (17, 6)])
    prompts = []
    for demos in (demos_a, demos_b):
        prompts += [demos + f"{a} + {b} = " for a, b in [(1, 2), (10, 20), (33, 44), (7, 70), (2, 29)]]
    prompts.append(demos_a)  # the shared block itself is a whole prompt (suffix of one token)
    prompts += [it.prompt for it in items]  # per-item resampled demos: no long shared prefix
    if max_length is not None:
        prompts += [demos_a * 3 + "5 + 6 = ", demos_a * 3 + "8 + 1 = "]  # share a prefix, but truncated
    groups = [group_pairs([encode_pair(tok, p, c) for c in (" 11", " 42", " 7 apples")]) for p in prompts]
    order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(0)).tolist()
    return [groups[i] for i in order]  # mixed in one unit, in no particular order


def _flat(res):
    return [s for g in res for s in g]


def test_prefix_reuse_equals_unshared(final_model, arith_spec, monkeypatch):
    """Reuse on and off give the same log-probs (1e-4 nats), token counts and greedy flags,
    with several shared-prefix clusters and unshared items mixed in one call; the shared
    prefixes are run once each (a one-row decoder call per cluster)."""
    from probeselect.spans import prefix_clusters, score_groups

    model, tok = final_model
    assert tok("x")["input_ids"][0] == tok.bos_token_id  # the toy tokenizer prepends BOS
    groups = _shared_demo_groups(tok, arith_spec)
    clusters = prefix_clusters([g.context_ids for g in groups], range(len(groups)))
    sizes = sorted(len(m) for _, m in clusters)
    assert sizes == [5, 6] and all(n >= 32 for n, _ in clusters)
    ref = score_groups(model, groups, prefix_reuse=False)
    decoder = model.get_decoder()
    real_forward = decoder.forward
    calls = []

    def spy(*args, **kw):
        cache = kw.get("cache", kw.get("past_key_values"))
        calls.append((tuple(kw["input_ids"].shape), cache is not None, cache is not None and not cache.serving))
        return real_forward(*args, **kw)

    monkeypatch.setattr(decoder, "forward", spy)
    for budget, cache_tokens in ((8192, 32768), (64, 32768), (8192, 200), (100_000, 10)):
        calls.clear()
        got = score_groups(model, groups, max_batch_tokens=budget, max_prefix_cache_tokens=cache_tokens)
        delta = max(abs(a.logprob - b.logprob) for a, b in zip(_flat(got), _flat(ref)))
        assert delta <= 1e-4, (budget, cache_tokens, delta)
        assert [(s.n_tokens, s.is_greedy) for s in _flat(got)] == [(s.n_tokens, s.is_greedy) for s in _flat(ref)]
        prefix_passes = [shape for shape, _, recording in calls if recording]
        if cache_tokens >= 200:
            assert len(prefix_passes) == 2 and all(s[0] == 1 and s[1] >= 32 for s in prefix_passes), calls
        else:  # the prefixes exceed the bound: no reuse, the unshared path only
            assert not any(cached for _, cached, _ in calls)


def test_prefix_reuse_skips_left_truncated_prompts(final_model, arith_spec):
    from probeselect.spans import score_groups

    model, tok = final_model
    groups = _shared_demo_groups(tok, arith_spec, max_length=120)
    assert any(len(g.context_ids) > 120 for g in groups)
    ref = score_groups(model, groups, max_length=120, prefix_reuse=False)
    got = score_groups(model, groups, max_length=120)
    assert max(abs(a.logprob - b.logprob) for a, b in zip(_flat(got), _flat(ref))) <= 1e-4
    assert [s.is_greedy for s in _flat(got)] == [s.is_greedy for s in _flat(ref)]


def test_prefix_clusters_split_only_when_it_saves_more():
    from probeselect.spans import prefix_clusters

    base = list(range(100, 140))  # 40 tokens shared by all
    a = [base + list(range(200, 300)) + [k] for k in range(3)]  # 140 shared within a
    b = [base + list(range(300, 400)) + [k, k] for k in range(3)]
    lone = [[1, 2, 3] + [k] * 50 for k in range(2)]  # share 3 tokens only
    ctxs = a + b + lone
    got = prefix_clusters(ctxs, range(len(ctxs)))
    assert sorted((n, m) for n, m in got) == [(140, [0, 1, 2]), (140, [3, 4, 5])]
    # one long-prefix pair and many items sharing only the 40-token block: the block wins
    ctxs = a[:2] + [base + [k] * 5 for k in range(10)]
    assert prefix_clusters(ctxs, range(len(ctxs))) == [(40, list(range(12)))]
    # a whole context that is a prefix of another keeps one token of its own
    assert prefix_clusters([base, base + [7, 8]], [0, 1]) == [(39, [0, 1])]
    assert prefix_clusters([base, base], [0, 1], min_shared=40) == []
    assert prefix_clusters(ctxs, []) == []


def test_prefix_reuse_halves_the_batch_on_out_of_memory(final_model, arith_spec, monkeypatch):
    from probeselect.spans import score_groups

    model, tok = final_model
    groups = _shared_demo_groups(tok, arith_spec)
    ref = score_groups(model, groups, prefix_reuse=False)
    decoder = model.get_decoder()
    real_forward = decoder.forward
    seen = []

    def flaky(*args, **kw):
        rows = kw["input_ids"].shape[0]
        seen.append(rows)
        if rows > 1 and kw["input_ids"].shape[1] < 32:  # the shared batches (short suffix rows)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_forward(*args, **kw)

    monkeypatch.setattr(decoder, "forward", flaky)
    got = score_groups(model, groups, max_batch_tokens=64)
    assert 1 in seen
    assert max(abs(a.logprob - b.logprob) for a, b in zip(_flat(got), _flat(ref))) <= 1e-4


def test_prefix_reuse_flags_reach_the_scorer(tiny_ladder, monkeypatch, tmp_path):
    """`probeselect score --no-prefix-reuse --max-prefix-cache-tokens N` reaches score_groups;
    a non-positive bound is a usage error."""
    from probeselect import score as score_mod
    from probeselect.cli import build_parser, main
    from probeselect.errors import UsageError

    args = build_parser().parse_args(["score", "X", "--probes", "p.yaml"])
    assert args.no_prefix_reuse is False and args.max_prefix_cache_tokens == 32768
    seen = []
    real = score_mod.score_groups

    def spy(*a, **kw):
        seen.append((kw["prefix_reuse"], kw["max_prefix_cache_tokens"]))
        return real(*a, **kw)

    monkeypatch.setattr(score_mod, "score_groups", spy)
    ckpt = sorted(p for p in tiny_ladder.iterdir() if p.name.startswith("checkpoint-"))[0]
    spec = tmp_path / "arith.yaml"
    spec.write_text("family: arith_pattern\nn_items: 2\nn_demos: 2\n")
    rc = main(["score", str(ckpt), "--probes", str(spec), "--seeds", "0", "--out", str(tmp_path / "run"),
               "--no-prefix-reuse", "--max-prefix-cache-tokens", "77", "--no-progress", "--audit-items", "0"])
    assert rc == 0 and seen and set(seen) == {(False, 77)}
    with pytest.raises(UsageError, match="max-prefix-cache-tokens"):
        score_mod.score_checkpoints(str(ckpt), [str(spec)], max_prefix_cache_tokens=0)


def test_attention_window_reads_the_config():
    from transformers import MistralConfig, Qwen2Config

    assert spans.attention_window(MistralConfig(sliding_window=8)) == 8
    assert spans.attention_window(MistralConfig(sliding_window=None)) is None
    assert spans.attention_window(Qwen2Config(sliding_window=8, use_sliding_window=False)) is None
    assert spans.attention_window(Qwen2Config(sliding_window=8, use_sliding_window=True, num_hidden_layers=2,
                                              max_window_layers=0)) == 8


@pytest.mark.parametrize("prefix_reuse", [True, False])
def test_sliding_window_model_scores_like_its_own_forward(final_model, prefix_reuse, monkeypatch):
    """The packed layout's custom mask bypasses a model's sliding window, so groups longer than
    the window are scored one sequence per candidate (under the model's own masks) and the
    others stay packed; every log-prob equals a plain forward of the request. (Before the fix,
    with a window of 8 on these prompts, packed log-probs were up to 7.3 nats off.)"""
    from transformers import MistralConfig, MistralForCausalLM

    _, tok = final_model
    facts = ("Ana is a baker from Oslo. She has a cat. She likes chess. Her favourite colour is red.\n"
             "Bo is a pilot from Lima. He has an owl. He likes golf.\n")
    ctxs = [facts + q for q in ("Q: Where do you live? A:", "Q: What pet do you have? A:",
                                "Q: What is your job? A:")] + ["12 + 5 =", "7 - 2 ="]
    window = 12
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, sliding_window=window, initializer_range=0.3,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, attn_implementation="sdpa")).eval()
    groups = [spans.group_pairs([encode_pair(tok, c, " Oslo"), encode_pair(tok, c, " 17 apples")]) for c in ctxs]
    long = [len(g.context_ids) + max(map(len, g.continuations)) > window for g in groups]
    assert long == [True, True, True, False, False]
    sent = []
    real = spans.score_pairs
    monkeypatch.setattr(spans, "score_pairs", lambda m, pairs, **kw: sent.append(len(pairs)) or real(m, pairs, **kw))
    got = spans.score_groups(model, groups, prefix_reuse=prefix_reuse)
    assert sent == [6]  # the three long groups' candidates; the two short groups stayed packed
    for g, scores in zip(groups, got):
        for cont, sc in zip(g.continuations, scores):
            ids = torch.tensor([list(g.context_ids) + list(cont)])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits.float(), -1)[0]
            n = len(g.context_ids)
            ref = sum(lp[n - 1 + k, t].item() for k, t in enumerate(cont))
            assert sc.logprob == pytest.approx(ref, abs=1e-4)


def test_unpacked_fallback_batches_by_token_budget(monkeypatch):
    """Requests scored one sequence per candidate (sliding-window overflow, kernels without custom
    masks) are batched within max_batch_tokens: long sequences make smaller batches."""
    seen = []
    monkeypatch.setattr(spans, "score_pairs",
                        lambda m, pairs, batch_size, **kw: seen.append(batch_size) or
                        [spans.SpanScore(0.0, len(p.continuation_ids), False) for p in pairs])
    short = spans.EncodedGroup(tuple(range(100)), ((1,), (2, 3)))
    long = spans.EncodedGroup(tuple(range(2000)), ((1,),))
    out = spans._score_unpacked(None, [short], 8192, 10_000, "cpu", None)
    assert seen == [16] and [len(x) for x in out] == [2]
    out = spans._score_unpacked(None, [short, long], 8192, 10_000, "cpu", None)
    assert seen[-1] == 8192 // 2001 and [len(x) for x in out] == [2, 1]
    assert spans._score_unpacked(None, [long], 8192, 1000, "cpu", None) and seen[-1] == 8  # capped at max_length
