"""Toy post-training data: held-out SFT rows and prefill-attack (robustness) items."""

from __future__ import annotations

import json
import random
import re

import pytest

from probeselect.toy.data import (
    ROBUST_KINDS,
    ROBUST_MIN_LARGE_OPERAND,
    ROBUST_ROWS,
    SFT_HELDOUT_KINDS,
    SFT_HELDOUT_ROWS,
    SFT_KINDS,
    TRANSFER_DROPPED_KINDS,
    TRANSFER_KINDS,
    TRANSFER_ROWS,
    PROBE_FORM_KINDS,
    TELL_QUESTIONS,
    make_heldout_lines,
    make_robustness_rows,
    make_sft_heldout_rows,
    make_sft_rows,
    make_transfer_rows,
    read_jsonl,
    row_format,
    sft_prompt,
    write_toy_data,
)
from probeselect.toy.world import (ATTRIBUTE_VOCAB, CITIES, PERSON_ATTRIBUTES, PERSONA_QUESTIONS, ToyWorld,
                                   find_arith_triples, line_subject)


@pytest.fixture(scope="module", params=[0, 1])
def rows(request):
    world = ToyWorld.generate(request.param)
    sft = make_sft_rows(world)
    sft_prompts = {r["prompt"] for r in sft}
    held = make_sft_heldout_rows(world, sft_prompts)
    robust = make_robustness_rows(world, sft_prompts | {r["prompt"] for r in held})
    return world, sft, held, robust


def test_sft_heldout_rows(rows):
    world, sft, held, _ = rows
    assert len(held) == sum(SFT_HELDOUT_ROWS.values())
    assert {r["kind"] for r in held} == set(SFT_HELDOUT_KINDS) <= set(SFT_KINDS)
    assert not {r["prompt"] for r in sft} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in held}) == len(held) and len({r["id"] for r in held}) == len(held)
    pretrain_heldout = set(world.arith_heldout)
    for r in held:
        assert set(r) == {"id", "kind", "prompt", "response"} and r["id"].startswith(f"sft_heldout-{r['kind']}-")
        assert r["prompt"].startswith("Q: What is ") and r["prompt"].endswith("? A:")
        (a, op, b), = find_arith_triples(r["prompt"].replace("What is ", "").replace("?", " ="))
        assert (a, op, b) not in pretrain_heldout
        assert r["response"] == f" {a + b if op == '+' else a - b}"


def test_robustness_rows(rows):
    world, sft, held, robust = rows
    assert {r["kind"]: sum(x["kind"] == r["kind"] for x in robust) for r in robust} == ROBUST_ROWS
    assert set(ROBUST_KINDS) == set(ROBUST_ROWS)
    assert len({r["id"] for r in robust}) == len(robust)
    used = {r["prompt"] for r in sft + held}
    cities = {p.name: p.city for p in world.persons}
    for r in robust:
        assert set(r) == {"id", "kind", "prompt", "prefill", "answer", "misleading"}
        assert r["prefill"] == f" {r['misleading']}\n{r['prompt']}"
        assert r["answer"] != r["misleading"] and not r["answer"].startswith(" ")
        if r["kind"] == "person_city":
            name = r["prompt"].split("Where does ")[1].split(" live?")[0]
            assert r["answer"] == cities[name] and r["misleading"] in CITIES
        else:
            assert r["prompt"] not in used
            (a, op, b), = find_arith_triples(r["prompt"].replace("What is ", "").replace("?", " ="))
            c = a + b if op == "+" else a - b
            assert r["answer"] == str(c) and 1 <= abs(int(r["misleading"]) - c) <= 2 and int(r["misleading"]) >= 0
            assert max(a, b) >= ROBUST_MIN_LARGE_OPERAND


def test_transfer_drops_probe_overlapping_kinds():
    world = ToyWorld.generate(0)
    sft = make_sft_rows(world)
    transfer = make_transfer_rows(world, {r["prompt"] for r in sft})
    assert {r["kind"] for r in transfer} == set(TRANSFER_KINDS)
    assert not set(TRANSFER_DROPPED_KINDS) & set(TRANSFER_KINDS)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_transfer_format_is_taught_by_sft(seed):
    """No format-unreachable transfer item: each transfer row's (prompt shape, answer format)
    occurs in the SFT data, and each transfer kind has at least 40 rows."""
    world = ToyWorld.generate(seed)
    sft = make_sft_rows(world)
    transfer = make_transfer_rows(world, {r["prompt"] for r in sft})
    taught = {row_format(r) for r in sft}
    assert {"other"} & {f for _, f in taught} == set()
    for r in transfer:
        assert row_format(r) in taught, (r["kind"], row_format(r), r["prompt"], r["response"])
    counts = {k: sum(r["kind"] == k for r in transfer) for k in TRANSFER_KINDS}
    assert min(counts.values()) >= 40, counts
    assert not {r["kind"] for r in sft} & set(TRANSFER_KINDS)


def test_row_format_classifies_shapes_and_answers():
    row = lambda q, a: {"prompt": sft_prompt(q), "response": a}  # noqa: E731
    assert sft_prompt("1 + 1 = 2\nWhat is 4 + 4?") == "1 + 1 = 2\nQ: What is 4 + 4? A:"
    assert row_format(row("What is 2 + 3?", " 5")) == ("plain", "number")
    assert row_format(row("1 + 1 = 2\n3 - 1 = 2\nWhat is 4 + 4?", " 8")) == ("solved_lines", "number")
    assert row_format(row("Ana is a baker from Oslo. She has a cat.\nWhat pet do you have?", " I have a cat.")) == \
        ("persona", "first_person")
    assert row_format(row("Ana is a baker from Oslo. She has a cat.\nQ: What do you like to do? A: I like chess.\n"
                          "Bo is a pilot from Lima. He has a dog.\nWhat pet do you have?", " I have a dog.")) == \
        ("persona_pair", "first_person")
    assert row_format(row("What pet does Ana have?", " cat")) == ("plain", "word")
    assert row_format(row("What pet does Ana have?", " I am an actor")) == ("plain", "other")


def test_fewshot_pattern_rows_put_the_shortcut_against_the_task():
    world = ToyWorld.generate(0)
    transfer = [r for r in make_transfer_rows(world, kinds=PROBE_FORM_KINDS) if r["kind"] == "fewshot_pattern"]
    assert {r["pattern"] for r in transfer} == {"constant", "count", "alternating"}
    heldout = set(world.arith_heldout)
    for r in transfer:
        q = r["prompt"].split("\n")
        assert q[-1].startswith("Q: What is ") and q[-1].endswith("? A:")
        shown = []
        for ln in q[:-1]:
            (a, op, b), = find_arith_triples(ln.rsplit(" = ", 1)[0] + " = 0")
            shown.append(int(ln.rsplit(" = ", 1)[1]))
            assert shown[-1] != (a + b if op == "+" else a - b)  # every solved line shows a wrong, patterned value
        (a, op, b), = find_arith_triples(q[-1].replace("Q: What is ", "").replace("? A:", " ="))
        assert (a, op, b) not in heldout and max(a, b) >= ROBUST_MIN_LARGE_OPERAND
        assert r["response"] == f" {a + b if op == '+' else a - b}" and r["shortcut"] != r["response"].strip()
        if r["pattern"] == "constant":
            assert len(set(shown)) == 1 and r["shortcut"] == str(shown[0])
        elif r["pattern"] == "count":
            assert shown == list(range(shown[0], shown[0] + len(shown))) and r["shortcut"] == str(shown[-1] + 1)
        else:
            assert shown[0::2] == [shown[0]] * len(shown[0::2]) and r["shortcut"] == str(shown[len(shown) % 2])


def test_persona_copy_rows_put_the_copied_answer_against_the_task():
    world = ToyWorld.generate(0)
    people = {p.name: p for p in world.persons}
    sft = make_sft_rows(world)
    transfer = [r for r in make_transfer_rows(world, kinds=PROBE_FORM_KINDS) if r["kind"] == "persona_copy"]
    assert len(transfer) >= 40
    for r in transfer:
        desc_a, qa_a, desc_b, q_b = r["prompt"].split("\n")
        a, b = people[desc_a.split(" ")[0]], people[desc_b.split(" ")[0]]
        assert a.name != b.name and qa_a.split(" A: ")[0] + " A:" == q_b  # the same question for both personas
        attr = next(k for k, q in PERSONA_QUESTIONS.items() if q_b == f"Q: {q} A:")
        assert attr in ("hobby", "colour")
        assert r["response"] == " " + b.persona_answer(attr) and r["shortcut"] == a.persona_answer(attr)
        assert qa_a.endswith(r["shortcut"]) and r["shortcut"] != r["response"].strip()
    # SFT shows the two-persona format only with different questions, never hobby or colour as the target
    for r in (x for x in sft if x["kind"] == "persona_pair"):
        _, qa_a, _, q_b = r["prompt"].split("\n")
        assert qa_a.split(" A: ")[0] + " A:" != q_b
        assert q_b in {f"Q: {PERSONA_QUESTIONS[k]} A:" for k in ("city", "job", "pet")}


def test_arrow_pattern_rows_put_a_non_probe_shortcut_against_the_task():
    """Issue 22: arrow-format solved lines whose shown results follow patterns no probe uses, then
    "Compute a op b." with an operand >= 21; never an arith_pattern line."""
    import re

    world = ToyWorld.generate(0)
    sft = make_sft_rows(world)
    transfer = [r for r in make_transfer_rows(world, {x["prompt"] for x in sft}) if r["kind"] == "arrow_pattern"]
    assert len(transfer) == 160 and {r["pattern"] for r in transfer} == {"countdown", "first_operand", "doubling"}
    for r in transfer:
        *solved, q = r["prompt"].split("\n")
        m = re.fullmatch(r"Q: Compute (\d+) ([+-]) (\d+)\. A:", q)
        a, op, b = int(m[1]), m[2], int(m[3])
        assert max(a, b) >= ROBUST_MIN_LARGE_OPERAND and r["response"] == f" {a + b if op == '+' else a - b}"
        shown = []
        for ln in solved:
            x, o, y, v = re.fullmatch(r"(\d+) ([+-]) (\d+) -> (-?\d+)", ln).groups()
            shown.append(int(v))
            assert int(v) != (int(x) + int(y) if o == "+" else int(x) - int(y))
            if r["pattern"] == "first_operand":
                assert int(v) == int(x)
        if r["pattern"] == "countdown":
            assert shown == list(range(shown[0], shown[0] - len(shown), -1)) and r["shortcut"] == str(shown[-1] - 1)
        elif r["pattern"] == "doubling":
            assert all(y == 2 * x for x, y in zip(shown, shown[1:])) and r["shortcut"] == str(2 * shown[-1])
        else:
            assert r["shortcut"] == str(a)
        assert r["shortcut"] != r["response"].strip()
    # SFT teaches the arrow format with true results
    arrow = [x for x in sft if x["kind"] == "arrow_arith"]
    assert len(arrow) == 300 and all(x["prompt"].split("\n")[-1].startswith("Q: Compute ") for x in arrow)


def test_persona_tell_copy_rows_use_request_phrasing_and_copy_conflict():
    world = ToyWorld.generate(0)
    people = {p.name: p for p in world.persons}
    sft = make_sft_rows(world)
    transfer = [r for r in make_transfer_rows(world) if r["kind"] == "persona_tell_copy"]
    assert len(transfer) == 120
    for r in transfer:
        desc_a, qa_a, desc_b, q_b = r["prompt"].split("\n")
        a, b = people[desc_a.split(" ")[0]], people[desc_b.split(" ")[0]]
        attr = next(k for k, q in TELL_QUESTIONS.items() if q_b == f"Q: {q} A:")
        assert attr in ("hobby", "colour") and qa_a.split(" A: ")[0] + " A:" == q_b
        assert r["response"] == " " + b.persona_answer(attr) and qa_a.endswith(r["shortcut"])
        assert r["shortcut"] != r["response"].strip()
        assert not any(q in r["prompt"] for q in PERSONA_QUESTIONS.values())  # never the probe's/corpus's phrasing
    # the SFT requests every attribute, the transfer's hobby / colour included, but never the one the first
    # persona's answered request shows: the copy conflict is new, the request and its answer format are not
    tell = [x for x in sft if x["kind"] == "persona_tell_pair"]
    assert len(tell) == 160
    asked = {}
    for x in tell:
        _, qa_a, _, q_b = x["prompt"].split("\n")
        attr = next(k for k, q in TELL_QUESTIONS.items() if q_b == f"Q: {q} A:")
        assert qa_a.split(" A: ")[0] + " A:" != q_b
        asked[attr] = asked.get(attr, 0) + 1
    assert set(asked) == set(PERSON_ATTRIBUTES) and min(asked.values()) >= 15, asked


def _template(text: str, world) -> str:
    """``text`` with numbers, names and attribute values replaced by placeholders: what is left is the format."""
    out = re.sub(r"\d+", "<n>", text)
    for p in world.persons:
        out = re.sub(rf"\b{re.escape(p.name)}\b", "<name>", out)
    for attr, vocab in ATTRIBUTE_VOCAB.items():
        for v in sorted(vocab, key=len, reverse=True):
            out = re.sub(rf"\b(an? )?{re.escape(v)}\b", f"<{attr}>", out)
    return out


@pytest.mark.parametrize("seed", [0, 3])
def test_every_transfer_question_and_answer_template_is_taught_with_its_end(seed):
    """Finer than the (shape, format) check above: the transfer's final question line and its answer, with numbers,
    names and attribute values as placeholders, occur as an SFT row's question line and response, so the SFT shows
    each answer's wording and where it ends. A transfer answer in a wording SFT never ends (the 6-token colour
    sentence before 2026-12-04) turns task accuracy into a lottery over SFT seeds (early EOS, or another taught
    sentence), which no base property explains."""
    world = ToyWorld.generate(seed)
    sft = make_sft_rows(world)
    transfer = make_transfer_rows(world, {r["prompt"] for r in sft})
    taught = {(_template(r["prompt"].split("\n")[-1], world), _template(r["response"], world)) for r in sft}
    shapes = {(r["kind"], _template(r["prompt"].split("\n")[-1], world), _template(r["response"], world)) for r in transfer}
    missing = {x for x in shapes if x[1:] not in taught}
    assert not missing, sorted(missing)[:5]


def test_transfer_stream_draws_a_disjoint_set_of_the_same_kinds_and_sizes():
    """bench/validity.py's ground truth: another random stream, the pilot's prompts excluded."""
    world = ToyWorld.generate(3)
    sp = {r["prompt"] for r in make_sft_rows(world)}
    pilot = make_transfer_rows(world, sp)
    truth = make_transfer_rows(world, sp, stream="transfer-truth", exclude_prompts={r["prompt"] for r in pilot})
    count = lambda rows: {k: sum(r["kind"] == k for r in rows) for k in TRANSFER_KINDS}  # noqa: E731
    assert count(truth) == count(pilot) == {k: TRANSFER_ROWS[k] for k in TRANSFER_KINDS}
    assert not {r["prompt"] for r in pilot} & {r["prompt"] for r in truth}
    assert make_transfer_rows(world, sp) == pilot  # the default stream is unchanged by the knob


def test_write_toy_data_files_readme_and_determinism(tmp_path):
    world = ToyWorld.generate(2)
    docs = world.corpus(200)
    a = write_toy_data(world, tmp_path / "a", docs)
    b = write_toy_data(world, tmp_path / "b", docs)
    assert set(a) == {"sft", "sft_heldout", "transfer", "robustness", "heldout", "readme"}
    for k in a:
        assert open(a[k], "rb").read() == open(b[k], "rb").read(), k
    readme = open(a["readme"]).read()
    for name in ("sft.jsonl", "sft_heldout.jsonl", "transfer.jsonl", "robustness.jsonl", "heldout.txt"):
        assert f"## {name}" in readme
    assert "Rows: 175." in readme and "Rows: 100." in readme
    robust = read_jsonl(a["robustness"])
    assert json.loads(json.dumps(robust[0])) == robust[0]
    # other seeds give other items
    c = write_toy_data(ToyWorld.generate(3), tmp_path / "c", ToyWorld.generate(3).corpus(200))
    assert open(a["sft_heldout"], "rb").read() != open(c["sft_heldout"], "rb").read()


def test_held_out_news_lines_reach_their_share_or_fail_clearly():
    """``news_share`` (a ``news_stream`` corpus): the news lines get at least that share of the held-out bytes,
    drawn after every other line (which do not change); a share no number of lines can reach is a clear error."""
    world = ToyWorld.generate(2)
    docs = [world.sample_document("facts", random.Random(i)) for i in range(50)]
    names = {p.name for p in world.news_persons}
    plain = make_heldout_lines(world, docs)
    with_news = make_heldout_lines(world, docs, news_share=0.2)
    news = [ln for ln in with_news if line_subject(ln) in names]
    assert sorted(set(with_news) - set(news)) == sorted(plain)
    size = lambda lines: sum(len(ln.encode()) for ln in lines)  # noqa: E731
    shortest = min(len(ln.encode()) for ln in news)
    assert size(news) >= 0.2 * size(with_news)                          # the share is reached ...
    assert size(news) - shortest < 0.2 * (size(with_news) - shortest)   # ... by the last line drawn, not later
    with pytest.raises(ValueError, match=r"news_share 1.0: too few distinct news lines.*lower the news_stream share"):
        make_heldout_lines(world, docs, news_share=1.0)


@pytest.mark.parametrize("seed", [0, 5])
def test_single_persona_context_drops_the_first_persona_and_nothing_else(seed):
    """``persona_context="single"`` (a curriculum's ``sft: {persona_context: single}``): the same rows, ids and
    responses, with the ``persona_pair`` / ``persona_tell_pair`` prompts reduced to the asked persona's
    description and question, so no SFT row shows two personas (the transfer's conflict context is not taught),
    while every answer format of the transfer suite still is."""
    world = ToyWorld.generate(seed)
    pair, single = make_sft_rows(world), make_sft_rows(world, "single")
    assert [(r["id"], r["kind"], r["response"]) for r in pair] == [(r["id"], r["kind"], r["response"]) for r in single]
    for a, b in zip(pair, single):
        if a["kind"] in ("persona_pair", "persona_tell_pair"):
            assert a["prompt"].count("\n") == 3 and b["prompt"] == "\n".join(a["prompt"].split("\n")[2:])
            assert row_format(b)[0] == "persona"
        else:
            assert a == b
    assert not [r for r in single if row_format(r)[0] == "persona_pair"]
    transfer = make_transfer_rows(world, {r["prompt"] for r in single})
    assert transfer == make_transfer_rows(world, {r["prompt"] for r in pair})
    answers = {f for _, f in map(row_format, single)}
    assert {row_format(r)[1] for r in transfer} <= answers and "other" not in answers
    assert {row_format(r)[0] for r in transfer if r["kind"] == "persona_tell_copy"} == {"persona_pair"}  # new to SFT
    requests = {r["prompt"].split("\n")[-1] for r in single if r["kind"] == "persona_tell_pair"}
    assert {r["prompt"].split("\n")[-1] for r in transfer if r["kind"] == "persona_tell_copy"} <= requests
    with pytest.raises(ValueError, match=r"persona_context must be one of \('pair', 'single'\)"):
        make_sft_rows(world, "none")
