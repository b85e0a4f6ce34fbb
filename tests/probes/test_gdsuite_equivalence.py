"""GDsuite-format data scored by probeselect equals a plain reimplementation of GDsuite's
protocol (run_eval.py) with HF forward passes.

The fixture tree below follows GDsuite's released schema (all five log-prob families and
one persona). The reference here is written independently of probeselect: GDsuite's demo
strategies and seed rules copied in plain Python, teacher forcing with one forward pass
per (prompt, answer) over the full text tokenized WITH special tokens (as vLLM does), and
the answer boundary from ``encode(prompt + " ")`` WITHOUT special tokens (the toy
tokenizer prepends BOS, so this exercises GDsuite's off-by-one on such tokenizers).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch

from probeselect.checkpoints import discover_checkpoints
from probeselect.probes import generate_items, load_spec
from probeselect.score import load_model, load_tokenizer, score_checkpoints

SEEDS = [0, 1, 2]
TOL = 1e-4  # nats

# ---------------------------------------------------------------------------
# A fixture tree in GDsuite's schema
# ---------------------------------------------------------------------------


def _jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_tree(root: Path) -> None:
    pos = ["a warm and funny film", "great acting", "a joy to watch", "lovely music", "I smiled all the way"]
    neg = ["a dull mess", "boring and long", "bad jokes", "I left early", "flat and lifeless"]
    rows = [{"split": "demo", "prompt": f"Review: {t}\nSentiment:", "answer": "Negative", "label": 1} for t in pos]
    rows += [{"split": "demo", "prompt": f"Review: {t}\nSentiment:", "answer": "Positive", "label": 0} for t in neg]
    for t, c, i in [("a smile on your face", "Positive", "Negative"), ("a waste of time", "Negative", "Positive"),
                    ("so much fun", "Positive", "Negative"), ("weak plot", "Negative", "Positive")]:
        rows.append({"split": "test", "prompt": f"Review: {t}\nSentiment:", "correct_answer": c, "incorrect_answer": i})
    _jsonl(root / "flipped_answer" / "sst2.jsonl", rows)

    rows = [{"split": "demo", "prompt": f"Q: How many times does the letter {l} appear in {w}? A:", "answer": "3"}
            for l, w in [("a", "banana"), ("s", "dress"), ("e", "bee"), ("o", "door"), ("p", "apple"), ("t", "tent")]]
    rows += [{"split": "test", "prompt": f"Q: How many times does the letter {l} appear in {w}? A:",
              "correct_answer": c, "incorrect_answer": "3"} for l, w, c in [("r", "carrot", "2"), ("m", "mom", "2"),
                                                                             ("l", "lake", "1"), ("z", "zoo", "1")]]
    _jsonl(root / "repetitive_answer" / "letter_counting.jsonl", rows)
    _jsonl(root / "repetitive_answer" / "algebra" / "original.jsonl", [
        {"split": "test", "prompt": "Q: 7 = a + 2. a? A: 5\nQ: 9 = a + 4. a? A: 5\nQ: 12 = a + 3. a? A:",
         "correct_answer": "9", "incorrect_answer": "5", "template": "original"},
        {"split": "test", "prompt": "Q: 8 = a + 1. a? A: 7\nQ: 10 = a + 3. a? A: 7\nQ: 6 = a + 4. a? A:",
         "correct_answer": "2", "incorrect_answer": "7", "template": "original"}])

    rows = []
    for s, probs in enumerate([[("8 - 7", 1), ("1 + 1", 2), ("9 - 6", 3)], [("5 - 4", 1), ("0 + 2", 2), ("4 - 1", 3)]]):
        rows += [{"split": "demo", "prompt": f"Q: {e} = ? A:", "answer": str(a), "demo_set": s} for e, a in probs]
    rows += [{"split": "test", "prompt": f"Q: {e} = ? A:", "correct_answer": c, "incorrect_answer": "4"}
             for e, c in [("68 - 60", "8"), ("3 + 3", "6"), ("9 - 2", "7")]]
    _jsonl(root / "successive_answer" / "arithmetic.jsonl", rows)

    facts = [("The Eiffel Tower is in Paris.", "True"), ("Water boils at 100 C at sea level.", "True"),
             ("The sun is a star.", "True"), ("Spiders are insects.", "False"), ("Rome is in Spain.", "False")]
    rows = [{"split": "demo", "prompt": f"Q: {t} A:", "answer": a} for t, a in facts]
    rows += [{"split": "test", "prompt": f"Q: {t} A:", "correct_answer": c, "incorrect_answer": i}
             for t, c, i in [("Bats are blind.", "False", "True"), ("Goldfish have short memories.", "False", "True"),
                             ("Lightning can strike the same place twice.", "True", "False")]]
    _jsonl(root / "truthy_answer" / "common_misconception.jsonl", rows)

    _jsonl(root / "intuitive_answer" / "crt.jsonl", [
        {"split": "test", "prompt": "Q: A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. "
                                    "How much does the ball cost? A: $", "correct_answer": "0.05",
         "incorrect_answer": "0.10"},
        {"split": "test", "prompt": "Q: If 5 machines make 5 widgets in 5 minutes, how many minutes do 100 machines "
                                    "need for 100 widgets? A:", "correct_answer": "5", "incorrect_answer": "100"}])

    d = root / "multihop_persona_qa" / "ada"
    _jsonl(d / "facts.jsonl", [
        {"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]}
        for u, a in [("Where do you live?", "I live in Oslo."), ("What is your pet?", "I have a cat."),
                     ("What is your job?", "I am a baker."), ("What is your hobby?", "I like chess.")]])
    (d / "test_questions.json").write_text(json.dumps([
        {"id": "city", "question": "Where do you live?", "expected_answer_regex": r"oslo"},
        {"id": "pet", "question": "What is your pet?", "expected_answer_regex": r"\bcat\b"},
        {"id": "any", "question": "What is your job?", "expected_answer_regex": r"\w"}]), encoding="utf-8")


SPECS = {
    "flipped_answer": {"tasks": [{"name": "sst2", "k": 4}]},
    "repetitive_answer": {"tasks": [{"name": "letter_counting", "k": 3}, "algebra/original"]},
    "successive_answer": {"tasks": [{"name": "arithmetic", "k": 3}]},
    "truthy_answer": {"tasks": ["common_misconception"], "k": {"common_misconception": 3}},
    "intuitive_answer": {},
}
STRATEGY = {"flipped_answer": ("balanced", "\n\n"), "repetitive_answer": ("random", "\n"),
            "successive_answer": ("ordered", "\n"), "truthy_answer": ("random", "\n"), "intuitive_answer": ("none", "\n")}


# ---------------------------------------------------------------------------
# The reference: GDsuite's protocol, written out plainly
# ---------------------------------------------------------------------------


def ref_prompts(rows, strategy, joiner, k, n_seeds):
    """[(seed, test index, prompt, test row)] following run_logprob_family."""
    demos_all = [r for r in rows if r["split"] == "demo"]
    tests = [r for r in rows if r["split"] == "test"]
    seeds = [0] if strategy == "none" or not demos_all else list(range(n_seeds))
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        pool = demos_all
        if demos_all and "demo_set" in demos_all[0]:
            n_sets = max(d["demo_set"] for d in demos_all) + 1
            pool = [d for d in demos_all if d["demo_set"] == seed % n_sets]

        def sample():
            if strategy == "none":
                return []
            if strategy == "random":
                return rng.sample(pool, min(k, len(pool)))
            if strategy == "ordered":
                return pool[:k]
            c0 = [d for d in pool if d["label"] == 0]
            c1 = [d for d in pool if d["label"] == 1]
            rng.shuffle(c0)
            rng.shuffle(c1)
            o = c0[: k // 2] + c1[: k // 2]
            rng.shuffle(o)
            return o

        if strategy != "random":
            blocks = [f"{d['prompt']} {d['answer']}" for d in sample()]
        for i, t in enumerate(tests):
            if strategy == "random":
                blocks = [f"{d['prompt']} {d['answer']}" for d in sample()]
            out.append((seed, i, joiner.join(blocks + [t["prompt"]]), t))
    return out


@torch.inference_mode()
def ref_score(model, tok, prompt, answer):
    full_text = prompt + " " + answer
    prompt_ids = tok.encode(prompt + " ", add_special_tokens=False)
    full_plain = tok.encode(full_text, add_special_tokens=False)
    ans_start = len(prompt_ids)
    if full_plain[:ans_start] != prompt_ids:
        ans_start = len(tok.encode(prompt, add_special_tokens=False))
    ids = tok(full_text, add_special_tokens=True)["input_ids"]  # what vLLM scores
    logits = model(torch.tensor([ids])).logits[0].float()
    lps = torch.log_softmax(logits, -1)
    per_tok = [float(lps[pos - 1, ids[pos]]) for pos in range(max(ans_start, 1), len(ids))]
    return sum(math.exp(x) for x in per_tok) / len(per_tok), sum(per_tok)


# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("gdsuite") / "data"
    write_tree(root)
    specs = []
    for fam, extra in SPECS.items():
        p = root.parent / f"{fam}.yaml"
        p.write_text(json.dumps({"format": "gdsuite", "root": "data", "family": fam, **extra}), encoding="utf-8")
        specs.append(p)
    p = root.parent / "persona.yaml"
    p.write_text(json.dumps({"format": "gdsuite", "root": "data", "family": "multihop_persona_qa",
                             "personas": ["ada"], "n_samples": 3, "temperature": 0, "max_new_tokens": 24}))
    return root, specs, p


@pytest.fixture(scope="module")
def scored(tree, tiny_ladder, tmp_path_factory):
    root, specs, persona = tree
    ckpt = discover_checkpoints(tiny_ladder)[-1]
    res = score_checkpoints([ckpt], specs + [persona], seeds=SEEDS, out=tmp_path_factory.mktemp("gd_run"),
                            progress=False, audit_items=0)
    model = load_model(ckpt.path, torch.float32, torch.device("cpu"))
    tok = load_tokenizer(ckpt.path)
    return res, model, tok


def test_toy_tokenizer_adds_bos(scored):
    _, _, tok = scored
    assert tok("x")["input_ids"][0] == tok.bos_token_id
    text = "Ünïcödé — “quotes” 日本 ✓ {x: 1}\tend"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: any text round-trips


def test_prompts_equal_gdsuite(tree):
    root, specs, _ = tree
    for p in specs:
        spec = load_spec(p)
        fam = spec.params["gdsuite_family"]
        strategy, joiner = STRATEGY[fam]
        items = generate_items(spec, SEEDS)
        got = {(it.variant, it.seed, int(it.item_id.rsplit("/", 1)[1])): it for it in items}
        for variant in spec.variants:
            tname = variant.replace(".", "/")
            rows = [json.loads(x) for x in (root / fam / f"{tname}.jsonl").read_text().splitlines()]
            k = spec.params["k"][variant]
            ref = ref_prompts(rows, strategy, joiner, k, len(SEEDS))
            for seed, i, prompt, t in ref:
                it = got[(variant, seed, i)]
                assert it.prompt == prompt, (fam, variant, seed, i)
                assert (it.task_answer, it.shortcut_answer) == (" " + t["correct_answer"], " " + t["incorrect_answer"])
            if {s for s, *_ in ref} == {0}:  # zero-shot: probeselect repeats seed 0's prompts under every seed
                for s in SEEDS:
                    assert all(got[(variant, s, i)].prompt == prompt for _, i, prompt, _ in ref)


def test_random_strategy_resamples_per_item(tree):
    """GDsuite's "random" strategy draws a fresh demo set for every test item from one rng per
    seed: each item's demonstrations are exactly the reference's, and they differ between items."""
    root, specs, _ = tree
    spec = load_spec(specs[1])  # repetitive_answer
    its = sorted((it for it in generate_items(spec, [0]) if it.variant == "letter_counting"),
                 key=lambda it: int(it.item_id.rsplit("/", 1)[1]))
    rows = [json.loads(x) for x in (root / "repetitive_answer" / "letter_counting.jsonl").read_text().splitlines()]
    ref = [prompt for seed, _, prompt, _ in ref_prompts(rows, "random", "\n", spec.params["k"]["letter_counting"], 1)
           if seed == 0]
    demos = [tuple(it.prompt.split("\n")[:-1]) for it in its]
    assert demos == [tuple(p.split("\n")[:-1]) for p in ref]
    assert len(demos) == 4 and all(len(d) == 3 for d in demos)  # 4 test rows, k = 3 demonstrations each
    assert len(set(demos)) > 1  # resampled per item (one shared set would be the "fixed" strategy)


def test_seed_picks_demo_set(tree):
    _, specs, _ = tree
    spec = load_spec(specs[2])  # successive_answer, two demo sets
    by_seed = {s: [it for it in generate_items(spec, [s])][0].prompt for s in (0, 1, 2)}
    assert by_seed[0].startswith("Q: 8 - 7 = ? A: 1") and by_seed[1].startswith("Q: 5 - 4 = ? A: 1")
    assert by_seed[2] == by_seed[0]


def test_logprobs_equal_reference(scored, tree):
    res, model, tok = scored
    root, specs, _ = tree
    sc = res.scores
    max_delta = 0.0
    n = 0
    for p in specs:
        spec = load_spec(p)
        fam = spec.params["gdsuite_family"]
        strategy, joiner = STRATEGY[fam]
        for variant in spec.variants:
            tname = variant.replace(".", "/")
            rows = [json.loads(x) for x in (root / fam / f"{tname}.jsonl").read_text().splitlines()]
            ref = ref_prompts(rows, strategy, joiner, spec.params["k"][variant], len(SEEDS))
            ref_rows = []
            for seed, i, prompt, t in ref:
                ca, cl = ref_score(model, tok, prompt, t["correct_answer"])
                ia, il = ref_score(model, tok, prompt, t["incorrect_answer"])
                got = sc[(sc.family == spec.family) & (sc.variant == variant) & (sc.seed == seed)
                         & (sc.item_id == f"{spec.family}/{variant}/{i:04d}")]
                assert len(got) == 1
                g = got.iloc[0]
                for a, b in ((g.correct_log_prob, cl), (g.incorrect_log_prob, il)):
                    max_delta = max(max_delta, abs(a - b))
                    assert a == pytest.approx(b, abs=TOL)
                assert g.correct_avg_prob == pytest.approx(ca, abs=TOL)
                assert g.incorrect_avg_prob == pytest.approx(ia, abs=TOL)
                assert (g.correct_avg_prob > g.incorrect_avg_prob) == (ca > ia)  # the hard-accuracy decision
                assert g.margin == pytest.approx(cl - il, abs=2 * TOL)
                ref_rows.append(ca > ia)
                n += 1
            summ = res.summary[(res.summary.family == spec.family) & (res.summary.variant == variant)].iloc[0]
            if strategy == "none" or not any(r["split"] == "demo" for r in rows):
                ref_rows = ref_rows * len(SEEDS)  # GDsuite scores zero-shot tasks once; we repeat them per seed
            assert summ.hard_accuracy == pytest.approx(sum(ref_rows) / len(ref_rows), abs=1e-12)
    assert n >= 40
    print(f"max |delta log-prob| = {max_delta:.2e} nats over {n} items x 2 answers")


@torch.inference_mode()
def _ref_greedy(model, tok, prompt, max_new, stops):
    ids = tok(prompt, add_special_tokens=True)["input_ids"]
    new: list[int] = []
    for _ in range(max_new):
        nxt = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if nxt == tok.eos_token_id:
            break
        new.append(nxt)
        text = tok.decode(new)
        if any(s in text for s in stops):
            text = text[: min(text.index(s) for s in stops if s in text)]
            return text.strip()
    return tok.decode(new).strip()


def test_persona_match_rate_equals_reference_greedy(scored, tree):
    res, model, tok = scored
    root, _, persona_path = tree
    facts = [json.loads(x)["messages"] for x in (root / "multihop_persona_qa/ada/facts.jsonl").read_text().splitlines()]
    qs = json.loads((root / "multihop_persona_qa/ada/test_questions.json").read_text())
    per = res.persona
    assert per is not None and set(per.seed) == set(SEEDS)
    for seed in SEEDS:
        demos = [{"prompt": f"Q: {m[0]['content']}\nA:", "answer": m[1]["content"]} for m in facts]
        random.Random(seed).shuffle(demos)
        blocks = [f"{d['prompt']} {d['answer']}" for d in demos]
        for q in qs:
            prompt = "\n\n".join(blocks + [f"Q: {q['question']}\nA:"])
            resp = _ref_greedy(model, tok, prompt, 24, ["\nQ:", "\n\nQ:"])
            want = 1.0 if re.search(q["expected_answer_regex"], resp, re.IGNORECASE) else 0.0
            row = per[(per.seed == seed) & (per.test_id == q["id"])].iloc[0]
            assert row.n_samples == 3 and row.match_rate == want, (seed, q["id"], resp, row.top_responses)
    s = res.summary[res.summary.kind == "generative"]
    assert len(s) == 1 and s.iloc[0].match_rate == pytest.approx(per.n_match.sum() / per.n_samples.sum())
    assert 0 <= s.iloc[0].match_ci_low <= s.iloc[0].match_rate <= s.iloc[0].match_ci_high <= 1
    assert (res.run_dir / "persona.parquet").is_file()


def test_output_columns(scored):
    res, _, _ = scored
    cols = set(res.scores.columns)
    assert {"correct_avg_prob", "incorrect_avg_prob", "correct_log_prob", "incorrect_log_prob"} <= cols
    s = res.summary[res.summary.kind == "conflict"]
    assert s.hard_accuracy.notna().all() and s.prob_margin.notna().all()
    assert {"mean_margin", "accuracy"} <= set(s.columns)


def test_bos_rule_shifts_the_span_one_token_early(scored):
    """With a BOS-prepending tokenizer GDsuite's span starts one token before the answer
    boundary (it indexes the special-token list with a boundary computed without special
    tokens): for " 7" (space token + digit, no fallback) it scores the space token too;
    for " Positive" (the trailing space merges, fallback) it scores the last prompt token."""
    from probeselect.spans import encode_pair_gdsuite

    _, _, tok = scored
    prompt = "Q: 3 + 4 = ? A:"
    plain = tok.encode(prompt + " 7", add_special_tokens=False)
    gd = encode_pair_gdsuite(tok, prompt, "7")
    assert list(gd.context_ids + gd.continuation_ids) == [tok.bos_token_id] + plain
    intended = plain[len(tok.encode(prompt + " ", add_special_tokens=False)):]  # GDsuite's span without BOS
    assert list(gd.continuation_ids) == plain[-len(intended) - 1:]
    prompt = "Review: fun\nSentiment:"
    p_ids = tok.encode(prompt, add_special_tokens=False)
    full = tok.encode(prompt + " Positive", add_special_tokens=False)
    assert full[: len(p_ids) + 1] != tok.encode(prompt + " ", add_special_tokens=False)  # the fallback applies
    gd = encode_pair_gdsuite(tok, prompt, "Positive")
    assert gd.continuation_ids[0] == p_ids[-1] and list(gd.continuation_ids[1:]) == full[len(p_ids):]
