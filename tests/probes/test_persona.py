import re
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, get_family, load_spec, spec_from_dict
from probeselect.probes._persona import QUESTIONS, render_block
from probeselect.toy.world import (
    ATTRIBUTE_VOCAB,
    PERSONA_ANSWER_TEMPLATES,
    PERSONA_BLOCK_SEPARATOR,
    PERSONA_QUESTIONS,
    Person,
)

REPO = Path(__file__).resolve().parents[2]
FIRST_PERSON = {k: re.compile("^ " + re.escape(t).replace(r"\{a_job\}", r"an? \w+").replace(r"\{a_pet\}", r"an? \w+")
                              .replace(r"\{city\}", r"\w+").replace(r"\{hobby\}", r"\w+").replace(r"\{colour\}", r"\w+") + "$")
                for k, t in PERSONA_ANSWER_TEMPLATES.items()}


@pytest.fixture(scope="module")
def spec():
    return spec_from_dict({"family": "persona_qa", "n_items": 15, "n_demos": 3})


@pytest.fixture(scope="module")
def items(spec):
    return generate_items(spec, [0, 1])


def _blocks(it):
    return it.prompt.split(PERSONA_BLOCK_SEPARATOR)


def _description(block):
    line = block.split("\n")[0]
    return line[len("Persona: "):] if line.startswith("Persona: ") else line


def test_registered_and_yaml():
    fam = get_family("persona_qa")
    assert fam.kind == "conflict"
    assert set(fam.variants) >= {"block", "persona_label", "qa_labels"}
    spec = load_spec(REPO / "probes" / "persona_qa.yaml")
    assert spec.family == "persona_qa" and 2 <= spec.n_demos <= 3
    assert spec.n_items % len(spec.params["questions"]) == 0
    assert (spec.params["gen_samples"], spec.params["gen_temperature"], spec.params["gen_max_new_tokens"]) == (200, 1.0, 16)


def test_items_are_real_conflicts(spec, items):
    assert len(items) == 15 * 3 * 2
    for it in items:
        q = it.metadata["question"]
        blocks = _blocks(it)
        assert len(blocks) == spec.n_demos + 1
        query_desc = _description(blocks[-1])
        demo_descs = [_description(b) for b in blocks[:-1]]
        qv, dvs = it.metadata["query_value"], it.metadata["demo_values"]
        # the task attribute is in the query persona's description ...
        assert re.search(rf"\b{qv}\b", query_desc)
        # ... the shortcut's attribute is in the last demonstration persona's, not in the query's
        assert re.search(rf"\b{dvs[-1]}\b", demo_descs[-1])
        assert all(not re.search(rf"\b{v}\b", query_desc) for v in dvs)
        assert len(set(dvs + [qv])) == len(dvs) + 1
        # the demonstration answers are in the prompt, the task answer is not
        for ans in it.metadata["shortcut_answers"]:
            assert ans.strip() in it.prompt
        assert it.task_answer.strip() not in it.prompt
        assert it.shortcut_answer == it.metadata["shortcut_answers"][-1]
        assert it.candidates == (it.task_answer, it.shortcut_answer, *it.metadata["shortcut_answers"][:-1])
        # first-person answers with a leading space
        for c in it.candidates:
            assert FIRST_PERSON[q].match(c), (q, c)
        assert qv in it.task_answer and dvs[-1] in it.shortcut_answer
        # distinct persona names
        names = [d.split(" ")[0] for d in demo_descs + [query_desc]]
        assert len(set(names)) == len(names)
        assert it.prompt.endswith("A:") or it.prompt.endswith("Answer:")
        assert PERSONA_QUESTIONS[q] in blocks[-1]


def test_block_variant_matches_corpus_rendering(items):
    it = next(x for x in items if x.variant == "block")
    q = it.metadata["question"]
    p = Person(**it.metadata["query_persona"])
    # a corpus persona block with one QA line, its answer removed
    block = p.persona_block((q,))
    assert block.endswith(p.persona_answer(q))
    assert _blocks(it)[-1] == block[: -len(p.persona_answer(q)) - 1]
    assert it.prompt + it.task_answer == PERSONA_BLOCK_SEPARATOR.join(_blocks(it)[:-1] + [block])
    # and the demonstration blocks are corpus blocks as well
    for b, name in zip(_blocks(it)[:-1], it.metadata["demo_names"]):
        desc, qa = b.split("\n")
        assert desc.startswith(name + " is ") and qa.startswith(f"Q: {PERSONA_QUESTIONS[q]} A: I ")


def test_variants_render(items):
    seen = set()
    for it in items:
        last = _blocks(it)[-1]
        if it.variant == "persona_label":
            assert all(b.startswith("Persona: ") for b in _blocks(it))
            assert last.endswith(" A:")
        elif it.variant == "qa_labels":
            assert last.split("\n")[1].startswith("Question: ") and last.endswith("\nAnswer:")
        seen.add(it.variant)
    assert seen == {"block", "persona_label", "qa_labels"}


def test_questions_cycle_per_persona(spec, items):
    its = [it for it in items if it.variant == "block" and it.seed == 0]
    for i, it in enumerate(its):
        assert it.metadata["question"] == QUESTIONS[i % 5]
        assert it.metadata["persona_index"] == i // 5
    # the five questions of a persona ask about the same query persona
    assert its[0].metadata["query_persona"] == its[4].metadata["query_persona"]
    assert its[0].metadata["query_persona"] != its[5].metadata["query_persona"]


def test_determinism(spec):
    a = generate_items(spec, [0, 3])
    b = generate_items(spec, [0, 3])
    assert [x.to_dict() for x in a] == [x.to_dict() for x in b]
    # independent of n_items: a prefix of a longer run
    longer = generate_items(spec_from_dict({"family": "persona_qa", "n_items": 25, "n_demos": 3}), [0])
    short = {x.item_id: x for x in generate_items(spec, [0])}
    for x in longer:
        if x.item_id in short:
            assert x.to_dict() == short[x.item_id].to_dict()
    # query fixed across evaluation seeds, demonstrations resampled
    s0 = {x.item_id: x for x in a if x.seed == 0}
    s3 = {x.item_id: x for x in a if x.seed == 3}
    assert s0.keys() == s3.keys()
    changed = 0
    for iid in s0:
        assert s0[iid].task_answer == s3[iid].task_answer
        assert _blocks(s0[iid])[-1] == _blocks(s3[iid])[-1]
        changed += s0[iid].prompt != s3[iid].prompt
    assert changed >= len(s0) - 1


def test_question_subset_and_render_block():
    spec = spec_from_dict({"family": "persona_qa", "n_items": 4, "n_demos": 2, "variants": ["qa_labels"],
                           "params": {"questions": ["pet", "colour"]}})
    its = generate_items(spec, [0])
    assert [it.metadata["question"] for it in its] == ["pet", "colour", "pet", "colour"]
    assert all(len(it.candidates) == 3 for it in its)
    p = Person("Ana", "she", "Oslo", "baker", "cat", "chess", "red")
    assert render_block("block", p, "city") == (
        "Ana is a baker from Oslo. She has a cat. She likes chess. Her favourite colour is red.\n"
        "Q: Where do you live? A: I live in Oslo."
    )
    assert render_block("persona_label", p, "job", answer=False).endswith("Q: What is your job? A:")
    assert render_block("qa_labels", p, "pet").endswith("Question: What pet do you have?\nAnswer: I have a cat.")


@pytest.mark.parametrize(
    "raw, msg",
    [
        ({"n_demos": 0}, "n_demos"),
        ({"n_demos": len(ATTRIBUTE_VOCAB["pet"])}, "n_demos"),
        ({"params": {"questions": ["age"]}}, "questions"),
        ({"params": {"questions": []}}, "questions"),
        ({"params": {"questions": ["pet", "pet"]}}, "twice"),
        ({"params": {"gen_samples": 0}}, "gen_samples"),
        ({"params": {"gen_samples": 2.5}}, "gen_samples"),
        ({"params": {"gen_temperature": -1}}, "gen_temperature"),
        ({"params": {"gen_temperature": "hot"}}, "gen_temperature"),
        ({"params": {"gen_max_new_tokens": 0}}, "gen_max_new_tokens"),
        ({"params": {"gen_max_new_tokens": True}}, "gen_max_new_tokens"),
    ],
)
def test_validation(raw, msg):
    with pytest.raises(ProbeSpecError, match=msg):
        spec_from_dict({"family": "persona_qa", **raw})


def test_many_demos_all_distinct():
    spec = spec_from_dict({"family": "persona_qa", "n_items": 10, "n_demos": 9})
    for it in generate_items(spec, [0]):
        vals = it.metadata["demo_values"] + [it.metadata["query_value"]]
        assert len(set(vals)) == 10
