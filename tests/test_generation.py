import math

import pandas as pd
import pytest
import torch

from probeselect.generation import (
    Generation,
    _finish,
    classify_generation,
    generative_audit,
    greedy_generations,
    normalize_answer,
    persona_generation_table,
    sample_generations,
    select_audit_items,
    summarize_audit,
    summarize_generation,
    wilson_interval,
)
from probeselect.probes import ProbeItem, generate_items, spec_from_dict
from probeselect.score import load_model, load_tokenizer

NL = 201  # "\n" in the toy tokenizer (checked below)

PROMPTS = [
    "Ana is a baker from Oslo. She has a cat.\nQ: Where do you live? A:",
    "12 + 5 =",
    "Q: What is 3 + 4? A:",
    "The opposite of hot is",
    "Bo is a pilot from Lima. He has an owl. He likes chess. His favourite colour is red.\nQ: What pet do you have? A:",
]


@pytest.fixture(scope="module")
def ckpt(ladder_checkpoints):
    path = ladder_checkpoints[-1]
    return load_model(path, torch.float32, torch.device("cpu")), load_tokenizer(path)


@pytest.fixture(scope="module")
def tok(ckpt):
    return ckpt[1]


@pytest.fixture(scope="module")
def random_model(tok):
    """A randomly initialised tiny Llama with large weights: varied, non-degenerate argmax paths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def random_model64(random_model):
    """A float64 copy of ``random_model`` for the tests that compare samples *exactly* across
    batch layouts, engines or prefix sharing. Those change only floating-point rounding; in
    float32 this random model spreads its next-token probability widely, and a uniform draw
    then lands within float32 rounding of a boundary of the cumulative distribution about
    once in a few hundred samples (observed: 1 of 140 in the prompt-order test once the toy
    vocabulary grew by one token), which flips that sample without any bug. In float64 the
    rounding is ~1e-16 and such ties do not occur at these sample counts. The float32 path is
    compared exactly on the trained ladder checkpoint (``which="ladder"``) and within
    tolerances on this model (the logit tests)."""
    import copy

    return copy.deepcopy(random_model).double()


class _Script:
    """Make ``model`` deterministic: next token = ``table[last input token]`` (others -inf-ish).

    Also records (batch rows, sequence length) of every forward call.
    """

    def __init__(self, model, table: dict[int, int], default: int):
        self.model, self.table, self.default, self.calls = model, table, default, []
        self._last = None
        self.h1 = model.register_forward_pre_hook(self._pre, with_kwargs=True)
        self.h2 = model.lm_head.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs):
        ids = kwargs["input_ids"]
        self.calls.append(tuple(ids.shape))
        self._last = ids[:, -1]

    def _post(self, module, inp, out):
        forced = torch.tensor([self.table.get(int(t), self.default) for t in self._last])
        new = torch.full_like(out, -30.0)
        new[torch.arange(out.shape[0]), -1, forced] = 30.0
        return new

    def remove(self):
        self.h1.remove()
        self.h2.remove()


def test_toy_tokenizer_newline(tok):
    assert tok.decode([NL]) == "\n"
    assert tok.encode("a")[0] == tok.bos_token_id  # prompts get BOS like the span scorer


# ---------------------------------------------------------------------------
# stopping
# ---------------------------------------------------------------------------


def test_stop_at_newline_and_eos_scripted(random_model, tok):
    ids = {w: tok.encode(w, add_special_tokens=False) for w in (" I", " live", " in", " Oslo", ".")}
    assert all(len(v) == 1 for v in ids.values())
    I, live, in_, oslo, dot = (ids[w][0] for w in (" I", " live", " in", " Oslo", "."))
    eq = tok.encode("12 + 5 =", add_special_tokens=False)[-1]
    colon = tok.encode("A:", add_special_tokens=False)[-1]
    lima = tok.encode(" Lima", add_special_tokens=False)
    assert len(lima) == 1
    table = {colon: I, I: live, live: in_, in_: oslo, oslo: dot, dot: NL, eq: tok.eos_token_id}
    s = _Script(random_model, table, default=lima[0])
    try:
        out = sample_generations(random_model, tok, [PROMPTS[0], PROMPTS[1], PROMPTS[3]], n=3, seed=0,
                                 max_new_tokens=8)
    finally:
        s.remove()
    assert [g for g in out[0]] == [Generation(" I live in Oslo.", True, 6)] * 3
    assert out[1] == [Generation("", True, 1)] * 3  # EOS straight away
    # "The opposite of hot is" -> Lima Lima ... never stops
    assert out[2] == [Generation(" Lima" * 8, False, 8)] * 3


def test_finished_rows_are_dropped(random_model, tok):
    colon = tok.encode("A:", add_special_tokens=False)[-1]
    eq = tok.encode("12 + 5 =", add_special_tokens=False)[-1]
    oslo = tok.encode(" Oslo", add_special_tokens=False)[0]
    s = _Script(random_model, {eq: NL, colon: oslo, oslo: oslo}, default=oslo)
    try:
        out = sample_generations(random_model, tok, [PROMPTS[1], PROMPTS[2]], n=10, max_new_tokens=5,
                                 compact_fraction=0.1)
    finally:
        s.remove()
    assert all(g == Generation("", True, 1) for g in out[0])
    assert all(g == Generation(" Oslo" * 5, False, 5) for g in out[1])
    # one prefill of 2 prompts, then decode steps: the 10 finished rows of prompt 0 are gone
    assert s.calls[0][0] == 2 and s.calls[0][1] > 1
    assert [c[0] for c in s.calls[1:]] == [10] * 4 and all(c[1] == 1 for c in s.calls[1:])


def test_finish_keeps_text_before_newline():
    class FakeTok:
        def decode(self, ids, **kw):
            return "".join({1: " Oslo", 2: ".\nQ", 3: "<eos>"}[i] for i in ids)

    t = FakeTok()
    assert _finish(t, [1, 2], "newline") == Generation(" Oslo.", True, 2)
    assert _finish(t, [1, 3], "eos") == Generation(" Oslo", True, 2)
    assert _finish(t, [1, 1], None) == Generation(" Oslo Oslo", False, 2)


def test_real_checkpoint_generations_respect_stops(ckpt):
    model, tok = ckpt
    gens = sample_generations(model, tok, PROMPTS[:2], n=16, max_new_tokens=12, seed=0)
    for gs in gens:
        assert len(gs) == 16
        for g in gs:
            assert "\n" not in g.text and "<|eos|>" not in g.text
            assert 1 <= g.n_new_tokens <= 12
            if not g.terminated:
                assert g.n_new_tokens == 12


# ---------------------------------------------------------------------------
# equivalence with HF generate, reproducibility, shared prefill
# ---------------------------------------------------------------------------


def _hf_greedy(model, tok, prompt, max_new_tokens):
    enc = tok(prompt, return_tensors="pt")
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    new = out[0, enc.input_ids.shape[1]:].tolist()
    for k, t in enumerate(new):  # cut at the first newline / EOS, as our sampler does
        if t == tok.eos_token_id:
            return tok.decode(new[:k]), True
        if "\n" in tok.decode([t]):
            return tok.decode(new[: k + 1]).split("\n")[0], True
    return tok.decode(new), False


@pytest.mark.parametrize("which", ["ladder", "random"])
def test_greedy_equals_hf_generate(which, ckpt, random_model):
    model, tok = (ckpt if which == "ladder" else (random_model, ckpt[1]))
    gens = greedy_generations(model, tok, PROMPTS, max_new_tokens=10, batch_size=3)  # left-padded batches
    expected = [_hf_greedy(model, tok, p, 10) for p in PROMPTS]
    assert [(g.text, g.terminated) for g in gens] == expected
    if which == "random":
        assert len({g.text for g in gens}) == len(PROMPTS)  # a non-trivial comparison
    # the sampler's argmax mode gives the same continuation for every sample
    samp = sample_generations(model, tok, PROMPTS[:2], n=4, temperature=0.0, max_new_tokens=10)
    assert [[g.text for g in gs] for gs in samp] == [[e[0]] * 4 for e in expected[:2]]


def test_sampling_reproducible(random_model, tok):
    kw = dict(n=12, temperature=1.0, max_new_tokens=6)
    a = sample_generations(random_model, tok, PROMPTS, seed=1, batch_prompts=8, **kw)
    b = sample_generations(random_model, tok, PROMPTS, seed=1, batch_prompts=8, **kw)
    assert a == b
    c = sample_generations(random_model, tok, PROMPTS, seed=2, batch_prompts=8, **kw)
    assert a != c
    # samples of a prompt vary, and do not depend on batch composition or row chunking
    assert len({g.text for g in a[0]}) > 3
    d = sample_generations(random_model, tok, PROMPTS, seed=1, batch_prompts=2, max_rows=5, **kw)
    assert d == a
    e = sample_generations(random_model, tok, PROMPTS[2:3], seed=1, prompt_seeds=None, **kw)
    assert e[0] != a[2]  # seeds derive from (seed, index): index 0 here
    f = sample_generations(random_model, tok, [PROMPTS[2], PROMPTS[0]], seed=9, prompt_seeds=[77, 78], **kw)
    g = sample_generations(random_model, tok, [PROMPTS[0]], seed=3, prompt_seeds=[78], **kw)
    assert f[1] == g[0]


@pytest.mark.parametrize("max_rows", [None, 40])
def test_prefill_is_shared(random_model, tok, max_rows):
    calls = []
    h = random_model.register_forward_pre_hook(lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        sample_generations(random_model, tok, PROMPTS[:3], n=50, max_new_tokens=4, batch_prompts=8,
                           max_rows=max_rows)
    finally:
        h.remove()
    width = max(len(tok.encode(p)) for p in PROMPTS[:3])
    prefill = [c for c in calls if c[1] > 1]
    # one prefill forward over the 3 prompts: each prompt's tokens once, not 50 times ...
    assert prefill == [(3, width)] and calls[0] == (3, width)
    # ... then one-token decode steps over the expanded rows (in chunks of <= max_rows rows)
    decode = calls[1:]
    assert all(c[1] == 1 and c[0] <= (max_rows or 150) for c in decode)
    assert len(decode) <= 3 * -(-150 // (max_rows or 150))
    assert max(c[0] for c in decode) == (max_rows or 150)


# ---------------------------------------------------------------------------
# classification and tables
# ---------------------------------------------------------------------------


def _item(**kw):
    base = dict(item_id="f/v/0000", family="f", variant="v", seed=0, prompt="P:", task_answer=" I live in Oslo.",
                shortcut_answer=" I live in Rome.", candidates=(" I live in Oslo.", " I live in Rome.", " I live in Lima."),
                metadata={"shortcut_answers": [" I live in Riga.", " I live in Rome."]})
    base.update(kw)
    return ProbeItem(**base)


def test_normalize_answer():
    assert normalize_answer("  I live   in OSLO. ") == "i live in oslo"
    assert normalize_answer('"Oslo!"') == "oslo"
    assert normalize_answer(" 8") == "8"
    assert normalize_answer("\tI am a baker.\n") == "i am a baker"
    assert normalize_answer("") == ""


def test_classify_generation():
    it = _item()
    assert classify_generation(Generation(" I live in Oslo.", True, 6), it) == "task"
    assert classify_generation(Generation("i live in oslo", True, 6), it) == "task"
    assert classify_generation(Generation(" I live in Oslo.", False, 16), it) == "unterminated"
    assert classify_generation(Generation(" I live in Rome.", True, 6), it) == "shortcut"
    assert classify_generation(Generation(" I live in Riga.", True, 6), it) == "shortcut"  # metadata list
    assert classify_generation(Generation(" I live in Lima.", True, 6), it) == "other_candidate"
    assert classify_generation(Generation(" I live in Oslo, Norway.", True, 8), it) == "other"
    arith = _item(task_answer=" 8", shortcut_answer=" 4", candidates=(" 8", " 4", " 128"), metadata={})
    assert classify_generation(Generation(" 8", True, 2), arith) == "task"
    assert classify_generation(Generation(" 128", True, 2), arith) == "other_candidate"


def test_wilson_interval_known_values():
    # Newcombe (1998), Table I, method 3 (Wilson score interval without continuity correction)
    for (k, n), (lo, hi) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605),
                             (0, 20): (0.0, 0.1611), (1, 29): (0.0061, 0.1718)}.items():
        a, b = wilson_interval(k, n)
        assert (round(a, 4), round(b, 4)) == (lo, hi)
    a, b = wilson_interval(5, 10)
    assert a == pytest.approx(0.2366, abs=1e-4) and b == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)
    lo90, hi90 = wilson_interval(5, 10, level=0.90)
    assert a < lo90 < hi90 < b
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_persona_generation_table_and_summary(random_model, tok):
    spec = spec_from_dict({"family": "persona_qa", "n_items": 3, "n_demos": 2, "variants": ["block", "qa_labels"]})
    items = generate_items(spec, [0])
    df = persona_generation_table(random_model, tok, items, n=8, temperature=1.0, max_new_tokens=4, seed=0,
                                  batch_prompts=4)
    assert list(df.columns[:10]) == ["item_id", "family", "variant", "seed", "n_samples", "n_task", "n_shortcut",
                                     "n_other_candidate", "n_other", "n_unterminated"]
    assert len(df) == 6 and (df.n_samples == 8).all()
    counts = df[["n_task", "n_shortcut", "n_other_candidate", "n_other", "n_unterminated"]].sum(axis=1)
    assert (counts == 8).all()
    assert all(sum(c) <= 8 and len(t) == len(c) for t, c in zip(df.top_texts, df.top_counts))
    # an item's samples do not depend on the other items in the list
    df1 = persona_generation_table(random_model, tok, items[4:5], n=8, temperature=1.0, max_new_tokens=4, seed=0,
                                   batch_prompts=4)
    assert df1.iloc[0].to_dict() == df.iloc[4].to_dict()


def test_summarize_generation_synthetic():
    df = pd.DataFrame({
        "checkpoint": ["c1"] * 3 + ["c2"],
        "step": [1, 1, 1, 2],
        "family": ["f"] * 4,
        "variant": ["a", "a", "b", "a"],
        "item_id": ["f/a/0", "f/a/1", "f/b/0", "f/a/0"],
        "seed": [0] * 4,
        "n_samples": [10, 10, 20, 10],
        "n_task": [5, 3, 20, 0],
        "n_shortcut": [4, 2, 0, 10],
        "n_other_candidate": [0, 1, 0, 0],
        "n_other": [1, 2, 0, 0],
        "n_unterminated": [0, 2, 0, 0],
    })
    s = summarize_generation(df)
    assert list(s[["checkpoint", "step", "family", "variant"]].itertuples(index=False, name=None)) == [
        ("c1", 1, "f", "a"), ("c1", 1, "f", "b"), ("c2", 2, "f", "a")]
    r = s.iloc[0]
    assert r.gen_items == 2 and r.gen_n == 20 and r.gen_consistency == pytest.approx(8 / 20)
    assert (r.gen_ci_low, r.gen_ci_high) == pytest.approx(wilson_interval(8, 20))
    assert r.gen_shortcut_rate == pytest.approx(6 / 20) and r.gen_unterminated_rate == pytest.approx(2 / 20)
    assert r.gen_item_consistency_mean == pytest.approx((0.5 + 0.3) / 2)
    assert s.iloc[1].gen_consistency == 1.0 and s.iloc[1].gen_ci_high == 1.0
    s2 = summarize_generation(df.drop(columns=["checkpoint", "step"]))
    assert list(s2.columns[:2]) == ["family", "variant"] and len(s2) == 2
    assert s2.iloc[0].gen_n == 30


# ---------------------------------------------------------------------------
# audit
# ---------------------------------------------------------------------------


def test_select_audit_items():
    arith = generate_items(spec_from_dict({"family": "arith_pattern", "n_items": 30}), [0, 1])
    pers = generate_items(spec_from_dict({"family": "persona_qa", "n_items": 10}), [0, 1])
    items = arith + pers
    sel = select_audit_items(items, n_per_family=12, seed=0)
    assert len(sel) == 24 and {it.seed for it in sel} == {0}
    assert sum(it.family == "arith_pattern" for it in sel) == 12
    assert select_audit_items(list(reversed(items)), n_per_family=12, seed=0) == sel
    assert select_audit_items(items, n_per_family=12, seed=1) != sel
    assert len(select_audit_items(items, n_per_family=1000)) == 90 + 30
    assert {it.seed for it in select_audit_items(items, 5, eval_seed=1)} == {1}


def test_generative_audit_columns(random_model, tok):
    items = generate_items(spec_from_dict({"family": "persona_qa", "n_items": 2, "variants": ["block"]}), [0])
    df = generative_audit(random_model, tok, items, max_new_tokens=3, batch_size=2)
    assert list(df.columns) == ["item_id", "family", "variant", "seed", "generated", "class", "terminated",
                                "n_new_tokens", "truncated_tokens"]
    assert (df["truncated_tokens"] == 0).all()  # these prompts fit: nothing cut
    assert len(df) == 2 and set(df["class"]) <= {"task", "shortcut", "other_candidate", "other", "unterminated"}


def test_summarize_audit_hand_computed():
    audit = pd.DataFrame({
        "item_id": [f"f/v/{i}" for i in range(6)],
        "family": ["f"] * 6,
        "variant": ["v"] * 6,
        "seed": [0] * 6,
        "generated": ["x"] * 6,
        "class": ["task", "task", "shortcut", "other", "task", "unterminated"],
        "terminated": [True] * 5 + [False],
    })
    scores = pd.DataFrame({
        "checkpoint": ["c"] * 7,
        "item_id": [f"f/v/{i}" for i in range(6)] + ["f/v/0"],
        "seed": [0] * 6 + [1],  # the seed-1 row is not audited
        "correct": [True, True, True, False, False, False, True],
        "candidate_correct": [True, False, False, False, False, False, True],
    })
    s = summarize_audit(audit, scores)
    assert len(s) == 1
    r = s.iloc[0]
    assert r.checkpoint == "c" and r.family == "f" and r.n == 6
    assert r.gen_task_rate == pytest.approx(3 / 6) and r.gen_shortcut_rate == pytest.approx(1 / 6)
    assert r.gen_unterminated_rate == pytest.approx(1 / 6) and r.gen_other_candidate_rate == 0
    # gen==task: T T F F T F ; correct: T T T F F F ; candidate_correct: T F F F F F
    assert r.n_correct == 3 and r.p_task_given_correct == pytest.approx(2 / 3)
    assert r.n_candidate_correct == 1 and r.p_task_given_candidate_correct == 1.0
    assert r.agree_correct == pytest.approx(4 / 6)  # agree on items 0,1,3,5
    assert r.agree_candidate_correct == pytest.approx(4 / 6)  # agree on items 0,2,3,5
    # several checkpoints in the scores need a checkpoint column in the audit
    two = pd.concat([scores, scores.assign(checkpoint="d")])
    with pytest.raises(ValueError, match="several checkpoints"):
        summarize_audit(audit, two)
    s2 = summarize_audit(audit.assign(checkpoint="d"), two, by=["checkpoint", "variant"])
    assert list(s2.variant) == ["v"] and s2.iloc[0].n == 6
    # no correct items -> NaN conditional rate
    s3 = summarize_audit(audit, scores.assign(correct=False))
    assert math.isnan(s3.iloc[0].p_task_given_correct) and s3.iloc[0].agree_correct == pytest.approx(3 / 6)


def test_samples_do_not_depend_on_batch_composition(random_model64, tok):
    """Sample j of prompt i is the same whatever the prompt batch, the decode-row cap and
    the compaction threshold (per-(seed, item) generators, pre-drawn uniforms)."""
    kw = dict(n=12, max_new_tokens=6, temperature=1.0, seed=3)
    seeds = [101, 202, 303, 404]
    ref = sample_generations(random_model64, tok, PROMPTS[:4], batch_prompts=8, prompt_seeds=seeds, **kw)
    for batch_prompts, max_rows, compact in ((1, None, 0.25), (3, 7, 0.5), (2, 1, 1.0)):
        got = sample_generations(random_model64, tok, PROMPTS[:4], batch_prompts=batch_prompts, max_rows=max_rows,
                                 compact_fraction=compact, prompt_seeds=seeds, **kw)
        assert got == ref
    # a prompt keeps its samples in another list (same prompt seed), alone or reordered
    alone = sample_generations(random_model64, tok, [PROMPTS[2]], prompt_seeds=[303], **kw)
    assert alone[0] == ref[2]
    swapped = sample_generations(random_model64, tok, PROMPTS[:4][::-1], prompt_seeds=seeds[::-1], **kw)
    assert swapped[::-1] == ref


def test_sampling_progress_bar_and_object(random_model, tok):
    class Bar:
        def __init__(self):
            self.n, self.postfix = 0, None

        def update(self, k):
            self.n += k

        def set_postfix_str(self, s):
            self.postfix = s

    bar = Bar()
    out = sample_generations(random_model, tok, PROMPTS[:3], n=5, max_new_tokens=3, batch_prompts=2, progress=bar)
    assert bar.n == 3 and bar.postfix.endswith("samples/s")  # one update per prompt
    assert sample_generations(random_model, tok, PROMPTS[:3], n=5, max_new_tokens=3, batch_prompts=2,
                              progress=True) == out  # own tqdm bar (samples/s, ETA); same samples


# ---------------------------------------------------------------------------
# decode engines: shared prompt KV vs expanded per-row caches
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["ladder", "random"])
@pytest.mark.parametrize("kw", [{}, {"max_rows": 37, "compact_fraction": 0.05}, {"batch_prompts": 2}])
def test_shared_engine_gives_identical_samples(which, kw, ckpt, random_model64):
    """Same pre-drawn uniforms, same attention up to rounding: the same sample, sample for
    sample, across prompts of different lengths (left padding) and rows that finish early."""
    model, tok = (ckpt if which == "ladder" else (random_model64, ckpt[1]))
    args = dict(n=40, max_new_tokens=10, seed=5, **kw)
    shared = sample_generations(model, tok, PROMPTS, engine="shared", **args)
    expand = sample_generations(model, tok, PROMPTS, engine="expand", **args)
    assert [[(g.text, g.stop, g.n_new_tokens) for g in gs] for gs in shared] == \
        [[(g.text, g.stop, g.n_new_tokens) for g in gs] for gs in expand]
    lengths = {g.n_new_tokens for gs in shared for g in gs}
    if which == "ladder":
        # rows finish at different steps: compaction is exercised (the trained model writes
        # newlines; whether the random model ever samples one depends on its initialisation,
        # i.e. on the tokenizer's vocabulary size, which follows the toy corpus)
        assert len(lengths) > 2
    assert len({len(tok.encode(p)) for p in PROMPTS}) == len(PROMPTS)


def _prefill(model, tok, prompts):
    from probeselect.generation import _new_cache

    enc = [tok.encode(p) for p in prompts]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), tok.pad_token_id)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    for r, e in enumerate(enc):
        ids[r, width - len(e):] = torch.tensor(e)
        mask[r, width - len(e):] = 1
    cache = _new_cache(model)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True, cache=cache)
    return cache, mask, out.logits[:, -1]


def test_shared_engine_logits_match_expand(random_model, tok):
    """A few decode steps through both engines (GQA: 4 heads, 2 KV heads) give logits within 1e-4."""
    import copy

    from probeselect._shared_kv import SharedKVCache, shared_kv_attention_enabled
    from probeselect.generation import _ExpandDecoder, _SharedDecoder

    model = random_model
    cache, mask, _ = _prefill(model, tok, PROMPTS[:3])
    rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    e_cache = copy.deepcopy(cache)
    e_cache.batch_select_indices(rows)
    expand = _ExpandDecoder(model, e_cache, "cache", mask[rows])
    shared_cache = SharedKVCache.from_prefill(cache, mask, rows, max_new=4)
    shared = _SharedDecoder(model, shared_cache)
    pos = mask.sum(-1)[rows]
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for step in range(4):
            nxt = torch.randint(3, len(tok), (len(rows),), generator=g)
            a = expand.step(nxt, pos)
            with shared_kv_attention_enabled(model):
                b = shared.step(nxt, pos)
            torch.testing.assert_close(b, a, rtol=0, atol=1e-4)
            pos = pos + 1
            if step == 1:  # drop rows, leaving prompts with 1, 2 and 2 rows (not a dense layout)
                keep = torch.tensor([0, 4, 5, 7])
                expand.select(keep)
                shared.select(keep)
                rows, pos = rows[keep], pos[keep]
    assert model.config._attn_implementation != "probeselect_shared_kv"  # restored


def test_shared_kv_attend_causal_block_and_gqa():
    """Several new tokens at once: each query sees the prompt's unpadded prefix and the
    generated tokens up to its own (compared with a plain softmax over the concatenation)."""
    from probeselect._shared_kv import SharedKVCache

    torch.manual_seed(0)
    P, KV, G, W, D, Q = 2, 2, 3, 5, 4, 3
    pk, pv = torch.randn(P, KV, W, D), torch.randn(P, KV, W, D)
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    rows = torch.tensor([0, 1, 1])
    cache = SharedKVCache([pk], [pv], valid, rows, max_new=5)
    steps = [(torch.randn(3, KV * G, 2, D), torch.randn(3, KV, 2, D), torch.randn(3, KV, 2, D)),
             (torch.randn(3, KV * G, Q, D), torch.randn(3, KV, Q, D), torch.randn(3, KV, Q, D))]
    gk, gv = torch.empty(3, KV, 0, D), torch.empty(3, KV, 0, D)
    for q, k, v in steps:
        out = cache.attend(0, q, k, v, scaling=0.5)  # [rows, q, heads, D]
        t0 = gk.shape[2]
        gk, gv = torch.cat([gk, k], 2), torch.cat([gv, v], 2)
        for r, p in enumerate(rows.tolist()):
            keys = torch.cat([pk[p][:, valid[p]], gk[r]], 1).repeat_interleave(G, 0)  # [heads, keys, D]
            vals = torch.cat([pv[p][:, valid[p]], gv[r]], 1).repeat_interleave(G, 0)
            n_pre = int(valid[p].sum())
            for i in range(q.shape[2]):
                n_keys = n_pre + t0 + i + 1
                w = torch.softmax((keys[:, :n_keys] * q[r, :, i, None]).sum(-1) * 0.5, -1)  # [heads, keys]
                ref = (w.unsqueeze(-1) * vals[:, :n_keys]).sum(1)
                torch.testing.assert_close(out[r, i], ref, rtol=1e-5, atol=1e-5)


def test_unsupported_architecture_falls_back_with_warning(tok, monkeypatch):
    import probeselect.generation as gen
    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setattr(gen, "_FALLBACK_NOTED", set())  # as at the start of a run

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                     bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = GPT2LMHeadModel(cfg).eval()
    with pytest.warns(RuntimeWarning, match="falling back to engine='expand'"):
        got = sample_generations(model, tok, PROMPTS[:2], n=6, max_new_tokens=4, seed=1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = sample_generations(model, tok, PROMPTS[:2], n=6, max_new_tokens=4, seed=1, engine="expand")
        again = sample_generations(model, tok, PROMPTS[:2], n=6, max_new_tokens=4, seed=1)  # warned once per run
    assert got == ref == again
    with pytest.raises(ValueError, match="engine"):
        sample_generations(model, tok, PROMPTS[:1], n=2, engine="paged")


@pytest.mark.parametrize("engine", ["shared", "expand"])
def test_decode_rows_bounded(random_model, tok, engine, monkeypatch):
    """max_rows caps every decode batch; without it a memory budget does (here a tiny one)."""
    import probeselect.generation as gen

    calls = []
    h = random_model.register_forward_pre_hook(lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        ref = sample_generations(random_model, tok, PROMPTS[:3], n=30, max_new_tokens=4, engine=engine)
        calls.clear()
        got = sample_generations(random_model, tok, PROMPTS[:3], n=30, max_new_tokens=4, engine=engine,
                                 max_rows=16)
        assert max(c[0] for c in calls if c[1] == 1) == 16 and got == ref
        calls.clear()
        monkeypatch.setattr(gen, "_row_budget", lambda model, device: 1.0)  # one row at a time
        got = sample_generations(random_model, tok, PROMPTS[:3], n=5, max_new_tokens=3, engine=engine)
        assert {c[0] for c in calls if c[1] == 1} == {1}
        monkeypatch.undo()
        assert got == sample_generations(random_model, tok, PROMPTS[:3], n=5, max_new_tokens=3, engine=engine)
    finally:
        h.remove()
    with pytest.raises(ValueError, match="max_rows"):
        sample_generations(random_model, tok, PROMPTS[:1], n=2, max_rows=0)


def test_sampling_progress_off(random_model, tok, capsys):
    for progress in (False, None):
        sample_generations(random_model, tok, PROMPTS[:2], n=5, max_new_tokens=3, progress=progress)
        captured = capsys.readouterr()
        assert captured.err == "" and captured.out == ""
    sample_generations(random_model, tok, PROMPTS[:2], n=5, max_new_tokens=3, progress=True)
    assert "sampling" in capsys.readouterr().err  # the bar itself does write (to stderr)


# ---------------------------------------------------------------------------
# prefix sharing across prompts
# ---------------------------------------------------------------------------

FACTS = ("Ana is a baker from Oslo. She has a cat. She likes chess. Her favourite colour is red.\n"
         "Bo is a pilot from Lima. He has an owl. He likes golf.\n")
SHARED_PROMPTS = [  # four questions behind one long prefix, mixed with prompts that share none
    FACTS + "Q: Where do you live? A:",
    "12 + 5 =",
    FACTS + "Q: What pet do you have? A:",
    "The opposite of hot is",
    FACTS + "Q: What is your job? A:",
    FACTS + "Q: What do you like to do? A: I like",
    "Q: What is 3 + 4? A:",
]


def _outcomes(gens):
    return [[(g.text, g.stop, g.n_new_tokens) for g in gs] for gs in gens]


@pytest.mark.parametrize("engine", ["shared", "expand"])
@pytest.mark.parametrize("which", ["ladder", "random"])
def test_prefix_sharing_gives_identical_samples(which, engine, ckpt, random_model64):
    """Sharing the prefill of a common prefix (on by default) gives the same samples, sample
    for sample, as prefilling every prompt in full; prefix and other prompts mixed in one call
    and in one batch (batch_prompts=3 splits the group)."""
    model, tok = (ckpt if which == "ladder" else (random_model64, ckpt[1]))
    assert len(tok.encode(FACTS)) >= 32
    kw = dict(n=30, max_new_tokens=8, seed=4, engine=engine, batch_prompts=3)
    on, off = {}, {}
    got = sample_generations(model, tok, SHARED_PROMPTS, stats=on, **kw)
    ref = sample_generations(model, tok, SHARED_PROMPTS, min_shared_prefix=0, stats=off, **kw)
    assert _outcomes(got) == _outcomes(ref)
    assert len({g.text for gs in got for g in gs}) > 10  # a non-trivial comparison
    n_facts = min(len(tok.encode(p)) for p in SHARED_PROMPTS if p.startswith(FACTS))
    assert on["shared_groups"] == 1 and on["shared_prompts"] == 4 and off["shared_groups"] == 0
    assert off["prefill_tokens"] == off["prompt_tokens"] == on["prompt_tokens"]
    assert on["prompt_tokens"] - on["prefill_tokens"] >= 3 * (len(tok.encode(FACTS)) - 1)
    assert on["prefill_tokens"] < off["prefill_tokens"] - 3 * n_facts // 2


def test_prefix_sharing_prefill_logits_match(ckpt, random_model):
    """The prefill behind a shared prefix (prefix run once, batch 1; keys/values copied into
    each row; the rest left-padded behind it) gives the same next-token log-probs as the full
    left-padded prefill, within 1e-4, and so do decode steps from its cache (both engines)."""
    import copy

    from probeselect._shared_kv import SharedKVCache, shared_kv_attention_enabled
    from probeselect.generation import (_ExpandDecoder, _forward_kwargs, _prefill_batch, _prefix_groups,
                                        _prefix_kv, _SharedDecoder)

    for model, tok in (ckpt, (random_model, ckpt[1])):
        enc = [tok.encode(p) for p in SHARED_PROMPTS]
        groups = _prefix_groups(model, enc, 16, 8)
        assert len(groups) == 1
        S, members = groups[0]
        assert members == [0, 2, 4, 5] and S >= len(tok.encode(FACTS)) - 1
        cache_kw, keep = _forward_kwargs(model)
        common = dict(cache_kw=cache_kw, keep_last=keep, pad_id=tok.pad_token_id, device=torch.device("cpu"))
        with torch.inference_mode():
            pkv = _prefix_kv(model, enc[0][:S], cache_kw=cache_kw, keep_last=keep, device=torch.device("cpu"))
            assert pkv[0][0].shape[:3] == (1, model.config.num_key_value_heads, S)
            shared = [S if i in members else 0 for i in range(len(enc))]
            c1, m1, l1 = _prefill_batch(model, enc, shared, [pkv if s else None for s in shared], **common)
            c0, m0, l0 = _prefill_batch(model, enc, [0] * len(enc), [None] * len(enc), **common)
        assert m1.shape[1] > m0.shape[1] and torch.equal(m1.sum(-1), m0.sum(-1))
        d = (torch.log_softmax(l1, -1) - torch.log_softmax(l0, -1)).abs().max().item()
        print(f"prefix-sharing prefill: max |d log-prob| = {d:.2e}, max |d logit| = {(l1 - l0).abs().max().item():.2e}")
        assert d <= 1e-4, d
        torch.testing.assert_close(l1, l0, rtol=0, atol=1e-4)
        # decode steps from each cache give the same logits
        rows = torch.tensor([0, 0, 1, 2, 2, 3, 4, 5, 6])
        pos = m0.sum(-1)[rows]
        nxt0 = torch.randint(3, len(tok), (len(rows),), generator=torch.Generator().manual_seed(1))
        outs = []
        for cache, mask in ((c1, m1), (c0, m0)):
            e = copy.deepcopy(cache)
            e.batch_select_indices(rows)
            expand = _ExpandDecoder(model, e, cache_kw, mask[rows])
            sh = _SharedDecoder(model, SharedKVCache.from_prefill(cache, mask, rows, max_new=3))
            got, p, nxt = [], pos, nxt0
            with torch.inference_mode():
                for _ in range(2):
                    a = expand.step(nxt, p)
                    with shared_kv_attention_enabled(model):
                        b = sh.step(nxt, p)
                    got += [a, b]
                    nxt, p = a.argmax(-1), p + 1
            outs.append(got)
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_prefix_sharing_does_not_depend_on_prompt_order(random_model64, tok):
    """With prompt seeds, a prompt's samples do not depend on where it is in the list (which
    changes the groups' batches) nor on batch_prompts."""
    seeds = [11 * (k + 1) for k in range(len(SHARED_PROMPTS))]
    kw = dict(n=20, max_new_tokens=6, seed=0)
    ref = sample_generations(random_model64, tok, SHARED_PROMPTS, prompt_seeds=seeds, **kw)
    for perm, bp in (([6, 5, 4, 3, 2, 1, 0], 8), ([3, 0, 5, 1, 6, 2, 4], 2), ([2, 4, 0, 5, 1, 3, 6], 1)):
        got = sample_generations(random_model64, tok, [SHARED_PROMPTS[k] for k in perm], batch_prompts=bp,
                                 prompt_seeds=[seeds[k] for k in perm], **kw)
        assert [got[perm.index(k)] for k in range(len(perm))] == ref
    # a grouped prompt alone (no group) keeps its samples
    alone = sample_generations(random_model64, tok, [SHARED_PROMPTS[2]], prompt_seeds=[seeds[2]], **kw)
    assert alone[0] == ref[2]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_prefix_sharing_edge_cases(random_model64, tok, arch):
    """A prompt that is exactly the shared prefix, identical prompts, one-token prompts and a
    group larger than batch_prompts (its prefix still runs once): same samples as without
    sharing; a model with absolute position embeddings (gpt2, expand engine) too."""
    import warnings

    model = random_model64
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                                           bos_token_id=0, eos_token_id=1, pad_token_id=2)).eval().double()
    prompts = [FACTS, FACTS + "Q: Where do you live? A:", "", FACTS + "Q: Where do you live? A:",
               FACTS + "Q: What pet do you have? A:", "", FACTS + "Q: What is your job? A:", "a",
               FACTS + "Q: What is your job? A: I am", FACTS + "Q: What is your job? A: I am a",
               FACTS + "Q: What do you like to do? A:"]
    enc = [tok.encode(p) for p in prompts]
    assert len(enc[2]) == len(enc[5]) == 1 and enc[1] == enc[3]
    calls = []
    h = model.register_forward_pre_hook(lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    seeds = [100 + k for k in range(len(prompts))]
    seeds[3] = seeds[1]  # identical prompts, same stream
    kw = dict(n=12, max_new_tokens=5, prompt_seeds=seeds, batch_prompts=3,
              engine="shared" if arch == "llama" else "expand")
    st = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = sample_generations(model, tok, prompts, stats=st, **kw)
        n_calls = len(calls)
        ref = sample_generations(model, tok, prompts, min_shared_prefix=0, **kw)
    finally:
        h.remove()
    assert _outcomes(got) == _outcomes(ref)
    assert got[1] == got[3] and got[2] != got[5]  # same prompt and seed: same samples; other seed: other
    # one group of 8 (the bare prefix keeps its last token to prefill): its prefix runs once,
    # as one batch-1 forward, although its members fill three batches of 3
    S = len(enc[0]) - 1
    assert st["shared_groups"] == 1 and st["shared_prompts"] == 8
    assert [c for c in calls[:n_calls] if c[0] == 1 and c[1] > 1] == [(1, S)]
    members = [e for p, e in zip(prompts, enc) if p.startswith(FACTS)]
    others = [e for p, e in zip(prompts, enc) if not p.startswith(FACTS)]
    assert st["prefill_tokens"] == S + sum(len(e) - S for e in members) + sum(map(len, others))
    greedy = sample_generations(model, tok, prompts, n=3, temperature=0.0, max_new_tokens=5, batch_prompts=4,
                                engine=kw["engine"])
    assert _outcomes(greedy) == _outcomes(sample_generations(model, tok, prompts, n=3, temperature=0.0,
                                                             max_new_tokens=5, batch_prompts=4,
                                                             engine=kw["engine"], min_shared_prefix=0))
    with pytest.raises(ValueError, match="min_shared_prefix"):
        sample_generations(model, tok, prompts[:1], n=2, min_shared_prefix=-1)


def test_prefix_sharing_respects_sliding_windows(random_model, tok):
    """HF's sliding masks and sliding cache layers count cache slots, not positions, and a batch
    with a shared prefix lays its rows out as [prefix | padding | rest]: up to (longest shared
    prefix + longest prompt) slots before the new tokens. A window shorter than that turns
    grouping off (same samples, nothing shared); a window that covers it keeps it on. A long
    ungrouped prompt shares a batch with the group's last member, so the batch is that wide."""
    import copy

    from transformers import MistralConfig, MistralForCausalLM

    from probeselect.generation import _prefix_groups

    new = 6
    prompts = SHARED_PROMPTS + ["Cy is a chef from Rome. He has a dog. He likes tennis. His favourite colour is blue.\n"
                                "Di is a nurse from Kyiv. She has a fish.\nQ: Where"]
    enc = [tok.encode(p) for p in prompts]
    longest = max(map(len, enc))
    shared = max(g[0] for g in _prefix_groups(random_model, enc, 16, new))
    assert shared >= 16 and len(enc[-1]) > shared
    for window, grouped in ((longest + new + shared // 2, False), (shared + longest + new, True)):
        torch.manual_seed(0)
        cfg = MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            sliding_window=window, initializer_range=0.3, bos_token_id=0, eos_token_id=1,
                            pad_token_id=2)
        model = MistralForCausalLM(cfg).eval().double()
        assert bool(_prefix_groups(model, enc, 16, new)) is grouped
        on, off = {}, {}
        kw = dict(n=10, max_new_tokens=new, seed=2, batch_prompts=3)
        got = sample_generations(model, tok, prompts, stats=on, **kw)
        ref = sample_generations(copy.deepcopy(model), tok, prompts, stats=off, min_shared_prefix=0, **kw)
        assert _outcomes(got) == _outcomes(ref)
        assert (on["shared_groups"] > 0) is grouped and off["shared_groups"] == 0
