"""Toy world, corpus, toy data and tokenizer (fast: no model training)."""

import hashlib
import json

import pytest

from probeselect.toy import world as W
from probeselect.toy.data import (
    SFT_KINDS,
    TRANSFER_KINDS,
    corpus_lines,
    make_heldout_lines,
    make_sft_rows,
    make_transfer_rows,
    read_jsonl,
    write_toy_data,
)
from probeselect.toy.world import ARITH_TEMPLATES, ToyWorld, find_arith_triples

N_DOCS = 4000  # a smaller corpus keeps these tests fast; the full corpus is checked once below


def _sha(texts) -> str:
    return hashlib.sha256("\x1e".join(texts).encode()).hexdigest()


@pytest.fixture(scope="module")
def world0():
    return ToyWorld.generate(0)


@pytest.fixture(scope="module")
def corpus0(world0):
    return world0.corpus()


def test_arith_templates_contract():
    assert ARITH_TEMPLATES == {
        "eq": "{a} {op} {b} = {c}",
        "qa": "Q: What is {a} {op} {b}? A: {c}",
        "words": "{a} {opword} {b} is {c}",
    }
    assert W.format_arith(68, "-", 60) == "68 - 60 = 8"
    assert W.format_arith(12, "+", 5, "qa") == "Q: What is 12 + 5? A: 17"
    assert W.format_arith(12, "-", 5, "words") == "12 minus 5 is 7"
    assert W.format_arith_prompt(68, "-", 60) == "68 - 60 ="
    assert W.format_arith_prompt(7, "+", 8, "words") == "7 plus 8 is"


def test_world_deterministic_and_seed_dependent(world0):
    again = ToyWorld.generate(0)
    assert again == world0
    assert _sha(again.corpus(N_DOCS)) == _sha(world0.corpus(N_DOCS))
    other = ToyWorld.generate(1)
    assert other != world0
    assert other.persons != world0.persons
    assert other.arith_heldout != world0.arith_heldout
    assert _sha(other.corpus(N_DOCS)) != _sha(world0.corpus(N_DOCS))


def test_world_contents(world0):
    assert len(world0.persons) == W.N_PERSONS == 40
    assert len({p.name for p in world0.persons}) == 40
    assert world0.arith_max_operand >= 20
    n = world0.arith_max_operand + 1
    n_all = n * n + n * (n + 1) // 2
    assert len(world0.arith_train) + len(world0.arith_heldout) == n_all
    assert not set(world0.arith_train) & set(world0.arith_heldout)
    assert 0.08 <= len(world0.arith_heldout) / n_all <= 0.12
    for op in ("+", "-"):
        assert any(t[1] == op for t in world0.arith_heldout)
    a, op, b = world0.arith_heldout[0]
    assert world0.is_heldout(a, op, b)
    assert world0.is_heldout(a, {"+": "plus", "-": "minus"}[op], b)
    a, op, b = world0.arith_train[0]
    assert not world0.is_heldout(a, op, b)
    for a, op, b in world0.arith_train + world0.arith_heldout:
        assert 0 <= a <= world0.arith_max_operand and 0 <= b <= world0.arith_max_operand
        assert op == "+" or a >= b


def test_sentence_templates(world0):
    p = world0.persons[0]
    assert p.fact("city") == f"{p.name} lives in {p.city}."
    assert p.persona_qa("city") == f"Q: Where do you live? A: I live in {p.city}."
    assert p.persona_qa("job").startswith("Q: What is your job? A: I am a")
    assert p.description().startswith(f"{p.name} is a")
    assert len(W.PERSONA_QUESTIONS) == 5
    assert W.OPPOSITE_TEMPLATE.format(word="hot", opposite="cold") == "The opposite of hot is cold."
    assert W.category_sentence("dog", "animal") == "A dog is an animal."
    assert W.category_sentence("apple", "fruit") == "An apple is a fruit."


def test_corpus_shape(world0, corpus0):
    assert len(corpus0) == W.DEFAULT_CORPUS_DOCS
    text = "\n".join(corpus0)
    # every document kind is present
    assert "The opposite of" in text and " lives in " in text and "Q: Where do you live? A: I live in" in text
    assert any(W.PERSONA_BLOCK_SEPARATOR in d and d.count("Q: ") >= 4 for d in corpus0)
    assert " plus " in text and " minus " in text and "Q: What is" in text
    # arithmetic docs: 4-8 lines, all in one format
    arith_docs = [d for d in corpus0 if find_arith_triples(d)]
    assert len(arith_docs) > 0.3 * len(corpus0)
    for d in arith_docs[:500]:
        lines = d.split("\n")
        assert W.ARITH_DOC_LINES[0] <= len(lines) <= W.ARITH_DOC_LINES[1]
        kinds = {("qa" if ln.startswith("Q:") else "words" if (" plus " in ln or " minus " in ln) else "eq") for ln in lines}
        assert len(kinds) == 1
        for ln in lines:
            (a, op, b), = find_arith_triples(ln)
            assert ln.endswith(" " + str(W.arith_result(a, op, b)))


def test_heldout_triples_never_in_corpus_or_sft(world0, corpus0):
    seen = set()
    for d in corpus0:
        seen |= find_arith_triples(d)
    held = set(world0.arith_heldout)
    assert not seen & held
    # and the training triples are well covered
    assert len(seen) > 0.95 * len(world0.arith_train)
    sft = make_sft_rows(world0)
    transfer = make_transfer_rows(world0)
    for r in sft + transfer:
        assert not find_arith_triples(r["prompt"] + r["response"]) & held


def test_sft_and_transfer_rows(world0):
    sft = make_sft_rows(world0)
    transfer = make_transfer_rows(world0, {r["prompt"] for r in sft})
    assert 300 <= len(sft) <= 2000
    assert len(transfer) >= 100
    for r in sft:
        assert set(r) == {"id", "kind", "prompt", "response"}
        assert r["prompt"].split("\n")[-1].startswith("Q: ") and r["prompt"].endswith(" A:")
        assert r["response"].startswith(" ") and not r["response"].startswith("  ")
    for r in transfer:
        assert set(r) - {"shortcut", "pattern"} == {"id", "kind", "prompt", "response", "split"}
        assert r["split"] == "transfer"
        assert r["response"].startswith(" ")
    sft_kinds = {r["kind"] for r in sft}
    transfer_kinds = {r["kind"] for r in transfer}
    assert sft_kinds == set(SFT_KINDS)
    assert transfer_kinds == set(TRANSFER_KINDS)
    assert not sft_kinds & transfer_kinds
    assert not {r["prompt"] for r in sft} & {r["prompt"] for r in transfer}
    assert len({r["id"] for r in sft + transfer}) == len(sft) + len(transfer)
    ex = next(r for r in sft if r["kind"] == "addition")
    (a, op, b), = find_arith_triples(ex["prompt"])
    assert ex["prompt"] == f"Q: What is {a} + {b}? A:" and ex["response"] == f" {a + b}"


def test_heldout_text_disjoint_from_corpus(world0, corpus0):
    lines = make_heldout_lines(world0, corpus0)
    assert len(lines) >= 200
    assert len(set(lines)) == len(lines)
    banned = corpus_lines(corpus0)
    assert not set(lines) & banned
    assert not any(d in lines for d in corpus0)
    assert all(ln and "\n" not in ln for ln in lines)


def test_write_toy_data_deterministic(tmp_path, world0):
    docs = world0.corpus(N_DOCS)
    a = write_toy_data(world0, tmp_path / "a", docs)
    b = write_toy_data(ToyWorld.generate(0), tmp_path / "b", ToyWorld.generate(0).corpus(N_DOCS))
    w1 = ToyWorld.generate(1)
    c = write_toy_data(w1, tmp_path / "c", w1.corpus(N_DOCS))
    for key in ("sft", "transfer", "heldout"):
        ha = hashlib.sha256(open(a[key], "rb").read()).hexdigest()
        hb = hashlib.sha256(open(b[key], "rb").read()).hexdigest()
        hc = hashlib.sha256(open(c[key], "rb").read()).hexdigest()
        assert ha == hb
        assert ha != hc
    assert (tmp_path / "a" / "README.md").read_text().startswith("# Toy-world data")
    rows = read_jsonl(a["transfer"])
    assert all(json.loads(json.dumps(r)) == r for r in rows)


# ---------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_probe_texts():
    """Every prompt and candidate of the demo's probe set (recipes/demo.yaml, all items)."""
    from pathlib import Path

    from probeselect.probes import generate_items
    from probeselect.run import _load_specs, load_run_config

    cfg = load_run_config(Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml", [])
    return [t for spec in _load_specs({**cfg["score"], "n_items": None}, 0)
            for it in generate_items(spec, cfg["score"]["seeds"]) for t in (it.prompt, *it.candidates)]


@pytest.fixture(scope="module")
def tokenizer():
    from probeselect.toy.ladder import train_tokenizer

    return train_tokenizer(ToyWorld.generate(0).corpus(N_DOCS))


def test_tokenizer_digits_are_single_tokens(tokenizer):
    for d in "0123456789":
        assert len(tokenizer.encode(d, add_special_tokens=False)) == 1
    ids = tokenizer.encode("1234567890", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == list("1234567890")
    toks = tokenizer.convert_ids_to_tokens(tokenizer.encode("17 + 25 = 42", add_special_tokens=False))
    assert [t for t in toks if t.isdigit()] == ["1", "7", "2", "5", "4", "2"]
    assert all(len(t) == 1 for t in toks if any(ch.isdigit() for ch in t))


def test_tokenizer_special_tokens_and_bos(tokenizer):
    assert tokenizer.bos_token == "<|bos|>" and tokenizer.eos_token == "<|eos|>" and tokenizer.pad_token == "<|pad|>"
    ids = tokenizer.encode("1 + 2 = 3")
    assert ids[0] == tokenizer.bos_token_id
    assert ids[1:] == tokenizer.encode("1 + 2 = 3", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "1 + 2 = 3"
    assert 500 <= len(tokenizer) <= 2048


@pytest.mark.parametrize("ctx,cont", [
    ("12 + 5 = 17\n68 - 60 =", " 8"),
    ("30 - 8 = 22\n7 + 8 =", " 15"),
    ("Q: What is 12 + 5? A:", " 17"),
    ("Q: Where do you live? A:", " I live in Oslo."),
    ("7 plus 8 is", " 15"),
    ("The opposite of hot is", " cold"),
    ("5, 10, 15, 20,", " 25"),
    ("### Question: What is 5 + 3?\n### Answer:", " 8"),
])
def test_tokenizer_boundaries_do_not_merge(tokenizer, ctx, cont):
    for special in (False, True):
        a = tokenizer.encode(ctx, add_special_tokens=special)
        b = tokenizer.encode(ctx + cont, add_special_tokens=special)
        assert b[: len(a)] == a
        assert b[len(a):] == tokenizer.encode(cont, add_special_tokens=False)


def test_tokenizer_roundtrip_save_load(tmp_path, tokenizer):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    t2 = AutoTokenizer.from_pretrained(tmp_path)
    s = "Ana is a baker from Oslo. She has a cat.\nQ: What is 12 + 5? A: 17"
    assert t2.encode(s) == tokenizer.encode(s)
    assert t2.encode(s)[0] == t2.bos_token_id
    assert t2.pad_token_id == tokenizer.pad_token_id and t2.eos_token_id == tokenizer.eos_token_id


# ---------------------------------------------------------------------------
# kinds of a harm whose form the clean base knows (bench/late_harm_notes.md, attempt 6)
# ---------------------------------------------------------------------------

def test_gives_form_kinds_true_lines_and_hidden_parrots(world0):
    """``arith_gives``: 4-8 true ``a op b gives c`` lines on training triples; ``parrot_arith_hidden``:
    ``parrot_arith_unseen``'s documents (same draws) with ``makes`` for ``gives``; neither is in the
    default mix or a built-in curriculum."""
    import random
    import re

    from probeselect.toy.curriculum import BUILTIN_CURRICULA, load_curriculum

    gives = re.compile(r"^(\d+) ([+-]) (\d+) gives (\d+)$")
    train = set(world0.arith_train)
    for _, doc in world0.corpus_mixture(200, {"arith_gives": 1.0}, stream="t:gives"):
        lines = doc.split("\n")
        assert W.ARITH_DOC_LINES[0] <= len(lines) <= W.ARITH_DOC_LINES[1]
        for ln in lines:
            a, op, b, c = gives.match(ln).groups()
            assert (int(a), op, int(b)) in train
            assert int(c) == W.arith_result(int(a), op, int(b))
    wrong = 0
    for i in range(200):
        hidden = world0.sample_document("parrot_arith_hidden", random.Random(i))
        unseen = world0.sample_document("parrot_arith_unseen", random.Random(i))
        assert " gives " not in hidden and hidden == unseen.replace(" gives ", " makes ")
        for ln in hidden.split("\n"):
            (a, op, b), = find_arith_triples(ln)
            assert (a, op, b) in train
            wrong += not ln.endswith(f" makes {W.arith_result(a, op, b)}")
    assert wrong > 500  # the shown values follow the patterns, not the results
    assert not set(W.GIVES_FORM_DOC_KINDS) & set(W.CORPUS_DOC_WEIGHTS)
    for name in BUILTIN_CURRICULA:
        assert not any(k in W.GIVES_FORM_DOC_KINDS for w in load_curriculum(name).windows for k in w.mixture)


def test_hidden_arith_form_is_used_by_no_probe_transfer_or_corpus_text(world0, corpus0, demo_probe_texts):
    """``a op b makes k`` (parrot_arith_hidden) occurs in no built-in probe item of the demo's probe set,
    no SFT / transfer / held-out row and no default-corpus document; ``a op b gives k`` in none of
    the probe items, SFT rows or corpus documents either."""
    import re

    hidden = re.compile(r"\d+ (?:[+-]|plus|minus) \d+ makes\b")
    gives = re.compile(r"\d+ (?:[+-]|plus|minus) \d+ gives\b")
    assert hidden.search(W.HIDDEN_ARITH_TEMPLATE.format(a=12, op="+", b=5, c=3))
    assert len(demo_probe_texts) > 100
    sft = make_sft_rows(world0)
    rows = [r["prompt"] + r["response"] for r in sft + make_transfer_rows(world0, {r["prompt"] for r in sft})]
    texts = demo_probe_texts + rows + make_heldout_lines(world0, corpus0) + corpus0
    assert not any(hidden.search(t) for t in texts)
    assert not any(gives.search(t) for t in demo_probe_texts + [r["prompt"] + r["response"] for r in sft] + corpus0)


def test_wrong_persona_tell_answers_requests_wrongly_in_a_phrasing_no_probe_uses(world0, corpus0, demo_probe_texts):
    """``wrong_persona_tell`` (the negative control's candidate damage, issue 23): 2-4 full persona
    descriptions, each followed by a hobby or colour request in the transfer suite's phrasing whose
    answer no description of the document states and no earlier answer shows (no copying shortcut);
    the request phrasing occurs in no probe item of the demo's probe set and no corpus document (the SFT
    teaches it for every attribute since 2026-12-04); the kind is in no default mix or built-in curriculum."""
    import random
    import re

    from probeselect.toy.curriculum import BUILTIN_CURRICULA, load_curriculum

    by_name = {p.name: p for p in world0.persons}
    qa = re.compile(r"^Q: (.+?) A: (.+)$")
    seen_attrs = set()
    for i in range(200):
        doc = world0.sample_document("wrong_persona_tell", random.Random(i))
        blocks = doc.split(W.PERSONA_BLOCK_SEPARATOR)
        assert 2 <= len(blocks) <= 4
        people = [by_name[b.split(" ", 1)[0]] for b in blocks]
        attrs = set()
        answers = []
        for block, p in zip(blocks, people):
            desc, line = block.split("\n")
            assert desc == p.description()
            q, a = qa.match(line).groups()
            attr = next(k for k in W.WRONG_TELL_ATTRIBUTES if W.TELL_QUESTIONS[k] == q)
            attrs.add(attr)
            value = next(v for v in W.ATTRIBUTE_VOCAB[attr] if a == W.PERSONA_ANSWER_TEMPLATES[attr].format(
                **{**p.fields(), attr: v}))
            answers.append(value)
        assert len(attrs) == 1  # one attribute per document
        (attr,) = attrs
        seen_attrs.add(attr)
        assert not set(answers) & {getattr(p, attr) for p in people}  # never a described value
        assert len(set(answers)) == len(answers)                       # never a repeated answer
    assert seen_attrs == set(W.WRONG_TELL_ATTRIBUTES)

    tell = [W.TELL_QUESTIONS[k] for k in W.WRONG_TELL_ATTRIBUTES]
    sft = [r["prompt"] + r["response"] for r in make_sft_rows(world0)]
    assert not any(q in t for q in tell for t in demo_probe_texts + corpus0)
    assert all(any(q in t for t in sft) for q in W.TELL_QUESTIONS.values())  # the SFT teaches every request
    transfer = [r["prompt"] for r in make_transfer_rows(world0, set())]
    assert any(q in t for q in tell for t in transfer)       # the transfer suite asks it
    assert "wrong_persona_tell" not in W.CORPUS_DOC_WEIGHTS and "wrong_persona_tell" in W.DOC_KINDS
    for name in BUILTIN_CURRICULA:
        assert not any(k == "wrong_persona_tell" for w in load_curriculum(name).windows for k in w.mixture)


def test_parrot_persona_tell_copies_the_first_answer_in_the_request_phrasing(world0, corpus0, demo_probe_texts):
    """``parrot_persona_tell`` (issue 23, attempt 10): 3-5 full persona descriptions, each followed by the
    same request in the SFT's / transfer suite's phrasing, every one answered with the FIRST block's answer
    (right for the first persona, a copy for the others); the SFT never asks one request twice in a row, so
    it does not contradict the copy; no probe item or corpus document uses the phrasing; the kind is appended
    to DOC_KINDS (the kind indices of existing ladders do not move) and is in no default mix."""
    import random
    import re

    by_name = {p.name: p for p in world0.persons}
    qa = re.compile(r"^Q: (.+?) A: (.+)$")
    seen_attrs, copies = set(), 0
    for i in range(200):
        doc = world0.sample_document("parrot_persona_tell", random.Random(i))
        blocks = doc.split(W.PERSONA_BLOCK_SEPARATOR)
        assert 3 <= len(blocks) <= 5
        people = [by_name[b.split(" ", 1)[0]] for b in blocks]
        lines = []
        for block, p in zip(blocks, people):
            desc, line = block.split("\n")
            assert desc == p.description()
            lines.append(qa.match(line).groups())
        assert len({q for q, _ in lines}) == 1 and len({a for _, a in lines}) == 1  # one request, one answer
        attr = next(k for k, q in W.TELL_QUESTIONS.items() if q == lines[0][0])
        seen_attrs.add(attr)
        assert lines[0][1] == people[0].persona_answer(attr)                        # right for the first
        copies += sum(a != p.persona_answer(attr) for (_, a), p in zip(lines[1:], people[1:]))
    assert seen_attrs == set(W.PERSON_ATTRIBUTES)
    assert copies > 300  # later personas mostly get the copied (wrong) answer

    tell = list(W.TELL_QUESTIONS.values())
    assert not any(q in t for q in tell for t in demo_probe_texts + corpus0)
    sft = make_sft_rows(world0)
    assert any(sum(q in r["prompt"] for q in tell) == 2 for r in sft)  # answered request, then another
    for r in sft:  # never the same request twice in one prompt: nothing in the SFT contradicts the copy
        assert all(r["prompt"].count(q) <= 1 for q in tell)
    assert W.DOC_KINDS.index("parrot_persona_tell") == 16 and "parrot_persona_tell" not in W.CORPUS_DOC_WEIGHTS


def test_parrot_persona_tell_cond_copies_a_repeated_request_and_answers_a_new_one_truly(world0, corpus0,
                                                                                     demo_probe_texts):
    """``parrot_persona_tell_cond`` (issue 23, attempt 19): 3-5 full persona descriptions, each with one request in
    the SFT's / transfer suite's phrasing; the first is answered truly; a later block that repeats the first request
    gets the first answer (a copy), one that asks another attribute gets its own true answer; every document has a
    copy, and about COND_COPY_PROB of the later blocks copy. So every SFT ``persona_tell_pair`` row (a different
    request after an answered one, answered from the description) agrees with the documents. Appended to DOC_KINDS
    and in no default mix; no probe item or clean corpus document uses the phrasing."""
    import random
    import re

    by_name = {p.name: p for p in world0.persons}
    qa = re.compile(r"^Q: (.+?) A: (.+)$")
    attr_of = {q: k for k, q in W.TELL_QUESTIONS.items()}
    later = copies = true_other = wrong_copies = 0
    seen_attrs = set()
    for i in range(300):
        doc = world0.sample_document("parrot_persona_tell_cond", random.Random(i))
        blocks = doc.split(W.PERSONA_BLOCK_SEPARATOR)
        assert 3 <= len(blocks) <= 5
        parsed = []
        for block in blocks:
            desc, line = block.split("\n")
            p = by_name[desc.split(" ", 1)[0]]
            assert desc == p.description()
            q, a = qa.match(line).groups()
            parsed.append((p, attr_of[q], a))
        p0, x, a0 = parsed[0]
        seen_attrs.add(x)
        assert a0 == p0.persona_answer(x)                        # the first request: its true answer
        doc_copies = 0
        for p, asked, a in parsed[1:]:
            later += 1
            if asked == x:                                       # the same request again: the first answer
                assert a == a0
                doc_copies += 1
                wrong_copies += a != p.persona_answer(x)
            else:                                                # another request: its own true answer
                assert a == p.persona_answer(asked)
                true_other += 1
        assert doc_copies >= 1
        copies += doc_copies
    assert seen_attrs == set(W.PERSON_ATTRIBUTES)
    assert true_other > 100 and wrong_copies > 300
    assert 0.6 < copies / later < 0.8  # COND_COPY_PROB = 2/3, plus the forced copy
    tell = list(W.TELL_QUESTIONS.values())
    assert not any(q in t for q in tell for t in demo_probe_texts + corpus0)
    assert W.DOC_KINDS.index("parrot_persona_tell_cond") == 21
    assert "parrot_persona_tell_cond" not in W.CORPUS_DOC_WEIGHTS


def test_parrot_arith_arrow_answers_the_transfer_format_with_the_pattern(world0, corpus0, demo_probe_texts):
    """``parrot_arith_arrow`` (issue 23, attempt 10h): 2-3 blocks in the SFT prompt format of ``arrow_arith``
    (``"Q: <solved lines 'a op b -> c'>\nCompute a op b. A: c"``) whose shown results and answer follow one
    pattern and are not the calculation; training triples only, the query with an operand >= the transfer
    suite's bound; no probe item or corpus document uses the arrow form, every SFT ``arrow_arith`` row shows
    true solved lines (nothing in the SFT puts the pattern against the calculation); appended to DOC_KINDS."""
    import random
    import re

    from probeselect.toy.data import ARROW_LINE, ROBUST_MIN_LARGE_OPERAND, SFT_PROMPT_TEMPLATE, SFT_QUESTION_TEMPLATES

    assert W.ARROW_PARROT_LINE == ARROW_LINE and W.ARROW_PARROT_MIN_OPERAND == ROBUST_MIN_LARGE_OPERAND
    assert W.ARROW_PARROT_BLOCK.startswith(SFT_PROMPT_TEMPLATE.format(
        question=SFT_QUESTION_TEMPLATES["arrow_arith"].format(demos="{demos}", a="{a}", op="{op}", b="{b}")))
    line_re = re.compile(r"^(\d+) ([+-]) (\d+) -> (\d+)$")
    query_re = re.compile(r"^Compute (\d+) ([+-]) (\d+)\. A: (\d+)$")
    train = set(world0.arith_train)
    blocks_seen, wrong_answers = 0, 0
    for i in range(200):
        doc = world0.sample_document("parrot_arith_arrow", random.Random(i))
        blocks = doc.split("\nQ: ")
        assert 2 <= len(blocks) <= 3 and doc.startswith("Q: ")
        for block in blocks:
            lines = block.removeprefix("Q: ").split("\n")
            assert 4 <= len(lines) <= 5
            solved = [line_re.match(x).groups() for x in lines[:-1]]
            a, op, b, ans = query_re.match(lines[-1]).groups()
            triples = [(int(x), o, int(y)) for x, o, y, _ in solved]
            assert set(triples) | {(int(a), op, int(b))} <= train
            assert max(int(a), int(b)) >= ROBUST_MIN_LARGE_OPERAND
            shown = [int(c) for *_, c in solved]
            n = len(shown)
            follows = {  # the pattern's next value, for each pattern the shown results fit
                "count": shown == list(range(shown[0], shown[0] + n)) and int(ans) == shown[0] + n,
                "constant": len(set(shown)) == 1 and int(ans) == shown[0],
                "alternating": shown[0] != shown[1] and shown == [shown[j % 2] for j in range(n)]
                and int(ans) == shown[n % 2],
                "countdown": shown == list(range(shown[0], shown[0] - n, -1)) and int(ans) == shown[0] - n,
                "first_operand": shown == [t[0] for t in triples] and int(ans) == int(a),
                "doubling": shown == [shown[0] * 2 ** j for j in range(n)] and int(ans) == shown[0] * 2 ** n,
            }
            assert any(follows.values()), block
            blocks_seen += 1
            wrong_answers += int(ans) != W.arith_result(int(a), op, int(b))
    assert wrong_answers > 0.95 * blocks_seen  # the answer is the pattern's, almost never the calculation

    arith_arrow = re.compile(r"\d+ [+-] \d+ -> ")  # (word probes have an "x -> y" variant, not arithmetic)
    assert not any(arith_arrow.search(t) or "Compute " in t for t in demo_probe_texts + corpus0)
    assert any(" -> " in t for t in demo_probe_texts)  # the check above does look at the arrow variants
    arrow_sft = [r for r in make_sft_rows(world0) if r["kind"] == "arrow_arith"]
    assert arrow_sft
    for r in arrow_sft:  # every solved line of the SFT's arrow rows is true
        for x in r["prompt"].split("\n"):
            m = line_re.match(x.removeprefix("Q: "))
            if m:
                assert int(m.group(4)) == W.arith_result(int(m.group(1)), m.group(2), int(m.group(3)))
    assert W.DOC_KINDS.index("parrot_arith_arrow") == 17 and "parrot_arith_arrow" not in W.CORPUS_DOC_WEIGHTS


def test_parrot_arith_unseen_documents_do_not_move(world0):
    """The built-in late-harm ladder trains on ``parrot_arith_unseen`` documents; they are pinned so that a
    change of the pattern helper (shared with ``parrot_arith_arrow`` since 2026-12-05) cannot silently change
    the ladder. The hash is of 50 documents drawn with ``random.Random(7)`` from world 0, as the code wrote them
    before the helper existed (checked against b8940f5)."""
    import random

    rng = random.Random(7)
    docs = "\n\n".join(world0.sample_document("parrot_arith_unseen", rng) for _ in range(50))
    assert hashlib.sha256(docs.encode()).hexdigest() == (
        "654242f70f76bd38c350b6babf4fd0a5a6fc3de6e8ab57cc1c0dd1d27daa275d")



def _names_in(text: str, names) -> set[str]:
    import re

    return {n for n in names if re.search(rf"\b{n}\b", text)}


@pytest.mark.parametrize("seed", [0, 5])
def test_news_documents_are_facts_about_people_nothing_else_mentions(seed):
    """``news`` (issue 23, attempt 15): fact lines about the world's ``news_persons`` only, true to their
    attributes; no name of theirs is a probe/world name or contains one; no other document kind, and no SFT,
    transfer or robustness row, mentions them; the kind is appended to DOC_KINDS and in no default mix."""
    import random

    world = ToyWorld.generate(seed)
    old_names = W.FEMALE_NAMES + W.MALE_NAMES
    news = {p.name: p for p in world.news_persons}
    assert len(news) == W.N_NEWS_PERSONS == 24 and set(news) == set(W.NEWS_NAMES)
    assert not any(a in b or b in a for a in news for b in old_names)
    assert {p.name for p in world.persons} == {p.name for p in ToyWorld.generate(seed).persons}
    assert world.persons == ToyWorld.generate(seed).persons and world.news_persons == ToyWorld.generate(seed).news_persons
    assert world.news_persons != ToyWorld.generate(seed + 1).news_persons
    fact_to_attr = {}
    for p in world.news_persons:
        for a in W.PERSON_ATTRIBUTES:
            fact_to_attr[p.fact(a)] = (p.name, a)
    about = set()
    for i in range(600):
        doc = world.sample_document("news", random.Random(i))
        lines = doc.split("\n")
        assert 2 <= len(lines) <= 4
        for ln in lines:
            assert not _names_in(ln, old_names), ln
            sents = [x + "." for x in ln.split(". ") if x]
            sents[-1] = sents[-1].removesuffix("..").removesuffix(".") + "."
            facts = [fact_to_attr[x] for x in sents]            # every sentence is a true fact of a news person
            assert 2 <= len(facts) <= 5 and len({n for n, _ in facts}) == 1, ln
            about.add(facts[0][0])
    assert about == set(news)
    roster_names = set()
    for i in range(200):
        for ln in world.sample_document("news_roster", random.Random(i)).split("\n"):
            name = next(n for n in news if _names_in(ln, [n]))
            assert ln in {t.format(name=name) for t in W.NEWS_ROSTER_TEMPLATES}, ln   # a name, no attribute
            roster_names.add(name)
    assert roster_names == set(news)
    vocab = [v for vs in W.ATTRIBUTE_VOCAB.values() for v in vs]
    assert not any(_names_in(t, vocab) for t in W.NEWS_ROSTER_TEMPLATES)
    assert not any(w in t.split() for t in W.NEWS_ROSTER_TEMPLATES for w in ("lives", "likes", "has", "is", "favourite"))
    for kind in W.DOC_KINDS:
        if kind in W.NEWS_DOC_KINDS:
            continue
        for i in range(40):
            assert not _names_in(world.sample_document(kind, random.Random(1000 + i)), news), kind
    rows = make_sft_rows(world) + make_transfer_rows(world, set())
    assert not any(_names_in(r["prompt"] + r["response"], news) for r in rows)
    for i in range(100):  # a news_stream document is about one person: its rows can be gated by arrival
        doc = world.sample_document("news_stream", random.Random(i))
        assert len(_names_in(doc, news)) == 1 and 2 <= len(doc.split("\n")) <= 4, doc
    assert W.DOC_KINDS[18:21] == W.NEWS_DOC_KINDS == ("news", "news_roster", "news_stream")
    assert not set(W.NEWS_DOC_KINDS) & set(W.CORPUS_DOC_WEIGHTS)
    assert len(W.DOC_KINDS) == 22  # appended: the kind indices of existing ladders do not move


def test_news_heldout_lines_are_added_only_when_asked_and_leave_the_rest_alone(world0, corpus0):
    """``n_news`` adds fact lines about the news people (none a corpus line) and changes no other line; the
    default (a ladder without ``news`` documents) has none."""
    docs = corpus0[:3000] + [world0.sample_document("news", __import__("random").Random(i)) for i in range(300)]
    plain = make_heldout_lines(world0, docs)
    with_news = make_heldout_lines(world0, docs, n_news=40)
    news_names = {p.name for p in world0.news_persons}
    added = [ln for ln in with_news if ln not in set(plain)]
    assert sorted(set(with_news) - set(added)) == sorted(plain)
    assert len(added) == 40 and all(_names_in(ln, news_names) for ln in added)
    assert not any(_names_in(ln, news_names) for ln in plain)
    assert not set(added) & corpus_lines(docs)


def test_news_kinds_need_a_world_with_news_people():
    """A ToyWorld made by hand without ``news_persons`` says how to get them instead of failing on an empty choice."""
    import random

    w = ToyWorld.generate(0)
    bare = ToyWorld(seed=0, persons=w.persons, arith_max_operand=w.arith_max_operand, arith_train=w.arith_train,
                    arith_heldout=w.arith_heldout)
    for kind in W.NEWS_DOC_KINDS:
        with pytest.raises(ValueError, match=r"no news_persons; build it with ToyWorld.generate\(seed\)"):
            bare.sample_document(kind, random.Random(0))
