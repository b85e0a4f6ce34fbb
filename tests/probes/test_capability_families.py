"""Capability families: arith_plain, relation_plain, persona_plain."""

import re
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, get_family, load_spec, spec_from_dict
from probeselect.toy.world import (
    CATEGORY_MEMBERS,
    FEMALE_NAMES,
    MALE_NAMES,
    OPPOSITE_PAIRS,
    PERSONA_QUESTIONS,
    ToyWorld,
)

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("arith_plain", "relation_plain", "persona_plain")
OPPOSITE_OF = {**dict(OPPOSITE_PAIRS), **{y: x for x, y in OPPOSITE_PAIRS}}
CATEGORY_OF = {x: c for c, xs in CATEGORY_MEMBERS.items() for x in xs}
ARITH_LINE = re.compile(r"^(?:Q: What is )?(\d+) (\+|-|plus|minus) (\d+)(?: =|\? A:| is)(?: (\d+))?$")


def _arith(line):
    m = ARITH_LINE.match(line)
    assert m, line
    a, op, b, c = m.groups()
    val = int(a) + int(b) if op in ("+", "plus") else int(a) - int(b)
    return val, (int(c) if c is not None else None)


def _items(family, seeds=(0, 1), **raw):
    return generate_items(spec_from_dict({"family": family, **raw}), list(seeds))


@pytest.mark.parametrize("family", FAMILIES)
def test_registered_as_capability_with_variants(family):
    fam = get_family(family)
    assert fam.kind == "capability" and len(fam.variants) >= 2
    for it in _items(family, n_items=6):
        assert it.metadata["kind"] == "capability" and it.metadata["foil_kind"]
        assert it.candidates[:2] == (it.task_answer, it.shortcut_answer)
        assert it.task_answer != it.shortcut_answer and len(it.candidates) >= 3
        assert all(c.startswith(" ") and c.strip() for c in it.candidates)
        assert not it.prompt.endswith(" ")


def test_arith_plain_demos_are_correct_and_foil_is_a_near_miss():
    items = _items("arith_plain", n_items=30)
    assert len(items) == 30 * 3 * 2
    other_op = 0
    for it in items:
        lines = it.prompt.split("\n")
        assert len(lines) == 4 + 1
        for line in lines[:-1]:
            true, shown = _arith(line)
            assert shown == true  # every demonstration is correct arithmetic
            assert f" {shown}" not in it.candidates[:2]  # and shows neither the answer nor the foil
        val, none = _arith(lines[-1])
        assert none is None and it.task_answer == f" {val}"
        assert abs(int(it.shortcut_answer) - val) == 1 and int(it.shortcut_answer) >= 0
        a, op, b = it.metadata["query"]
        if int(it.candidates[2]) == (a - b if op == "+" else a + b):
            other_op += 1
    assert other_op > len(items) // 2  # the distractor is usually the other operation's result


def test_relation_plain_demos_and_answers_are_true():
    items = _items("relation_plain", n_items=24)
    for it in items:
        lines = it.prompt.split("\n")
        meta = it.metadata
        assert len(lines) == 4 + 1 and len(meta["demo_items"]) == 4
        words = lambda c: c.split()[-1]  # " an animal" -> "animal"
        if meta["relation"] == "category":
            assert all(CATEGORY_OF[x] == c for x, c in zip(meta["demo_items"], meta["demo_labels"]))
            assert words(it.task_answer) == CATEGORY_OF[meta["query"]]
            assert words(it.shortcut_answer) in CATEGORY_MEMBERS and words(it.shortcut_answer) != CATEGORY_OF[meta["query"]]
        else:
            assert all(OPPOSITE_OF[x] == y for x, y in zip(meta["demo_items"], meta["demo_labels"]))
            assert it.task_answer == f" {OPPOSITE_OF[meta['query']]}"
            assert words(it.shortcut_answer) in OPPOSITE_OF and it.candidates[2] == f" {meta['query']}"
        # every demonstration line states its (true) label; none states the answer or the foil
        for line, label in zip(lines[:-1], meta["demo_labels"]):
            assert line.rstrip(".").endswith(label)
        assert not {words(it.task_answer), words(it.shortcut_answer)} & set(meta["demo_labels"])
        assert meta["query"] not in meta["demo_items"]
    combos = {(it.variant, it.metadata["relation"]) for it in items}
    assert len(combos) == 6  # both relations in every format
    sentence = [it for it in items if it.variant == "sentence" and it.metadata["relation"] == "category"]
    assert all(re.fullmatch(r" an? \w+", it.task_answer) for it in sentence)  # the answer carries the article


def test_persona_plain_is_one_persons_block():
    world = ToyWorld.generate(0)
    names = set(FEMALE_NAMES) | set(MALE_NAMES)
    items = _items("persona_plain", n_items=20)
    for it in items:
        meta = it.metadata
        person = world.person(meta["person"])
        attr = meta["attribute"]
        lines = it.prompt.split("\n")
        assert len(lines) == 1 + 2 + 1
        extras = meta["description_extras"]
        assert lines[0] == person.description(None if extras is None else tuple(extras))
        assert lines[1:-1] == [person.persona_qa(a) for a in meta["demo_attributes"]]
        assert attr not in meta["demo_attributes"]
        # no other person anywhere in the prompt
        assert {w for w in re.findall(r"[A-Z][a-z]+", it.prompt) if w in names} == {person.name}
        question = PERSONA_QUESTIONS[attr]
        if it.variant == "block":
            assert lines[-1] == f"Q: {question} A:"
            assert it.task_answer == " " + person.persona_answer(attr)
        else:
            assert lines[-1].startswith(f"Q: {question} A: ")
            assert lines[-1] + it.task_answer + "." == person.persona_qa(attr)
        foil_value = it.shortcut_answer.rstrip(".").split(" ")[-1]
        assert foil_value != getattr(person, attr)
        assert foil_value in {getattr(q, attr) for q in world.persons}  # another person's value
        # the description covers every attribute that is asked about
        described = {"city", "job"} | (set(extras) if extras is not None else {"pet", "hobby", "colour"})
        assert {attr, *meta["demo_attributes"]} <= described


@pytest.mark.parametrize("family", FAMILIES)
def test_items_depend_only_on_family_variant_seed_index(family):
    fam = get_family(family)
    big = {(i.item_id, i.seed): i for i in _items(family, seeds=(0, 3), n_items=12)}
    small = _items(family, seeds=(3,), n_items=5, variants=[fam.variants[-1]])
    for it in small:
        assert big[(it.item_id, 3)] == it
    assert _items(family, n_items=12) == _items(family, n_items=12)


@pytest.mark.parametrize("family", FAMILIES)
def test_seeds_resample_demos_but_not_the_query(family):
    s0 = {i.item_id: i for i in _items(family, seeds=(0,), n_items=16)}
    s1 = {i.item_id: i for i in _items(family, seeds=(1,), n_items=16)}
    changed = 0
    for k, it in s0.items():
        o = s1[k]
        assert it.prompt.split("\n")[-1] == o.prompt.split("\n")[-1]
        assert it.candidates == o.candidates
        changed += it.prompt != o.prompt
    assert changed >= 0.8 * len(s0)


@pytest.mark.parametrize("family", FAMILIES)
def test_repo_specs_load(family):
    spec = load_spec(REPO / "probes" / "capability" / f"{family}.yaml")
    assert spec.family == family and set(spec.variants) == set(get_family(family).variants)
    assert generate_items(spec, [0])


def test_candidates_tokenize_cleanly(ladder_checkpoints):
    """Candidates of the shipped specs score as separate tokens with the toy tokenizer."""
    import dataclasses

    from probeselect.score import load_tokenizer
    from probeselect.spans import encode_pair

    tok = load_tokenizer(ladder_checkpoints[-1])
    for family in FAMILIES:
        spec = load_spec(REPO / "probes" / "capability" / f"{family}.yaml")
        items = generate_items(dataclasses.replace(spec, n_items=16), [0])
        assert items, family
        for it in items:
            ctx = tuple(tok.encode(it.prompt))
            conts = []
            for c in it.candidates:
                pair = encode_pair(tok, it.prompt, c, what=it.item_id)  # raises on a merged boundary
                # the prompt's own tokens, then the candidate's, which decode back to the candidate
                assert pair.context_ids == ctx, (it.item_id, c)
                assert pair.continuation_ids and tok.decode(pair.continuation_ids) == c, (it.item_id, c)
                conts.append(pair.continuation_ids)
            assert len(set(conts)) == len(conts), it.item_id  # distinct candidates, distinct token spans


@pytest.mark.parametrize(
    "raw, msg",
    [
        ({"family": "arith_plain", "params": {"ops": ["*"]}}, "params.ops"),
        ({"family": "arith_plain", "params": {"operand_min": 5, "operand_max": 5}}, "operand_min/operand_max"),
        ({"family": "relation_plain", "params": {"relations": ["synonym"]}}, "params.relations"),
        ({"family": "relation_plain", "params": {"categories": ["animal", "fruit"]}}, "params.categories"),
        ({"family": "relation_plain", "n_demos": 13}, "n_demos <= 12"),
        ({"family": "persona_plain", "n_demos": 5}, "n_demos <= 4"),
        ({"family": "persona_plain", "params": {"attributes": ["age"]}}, "params.attributes"),
        ({"family": "persona_plain", "params": {"world_seed": -1}}, "world_seed"),
        ({"family": "persona_plain", "variants": ["blok"]}, 'Did you mean "block"'),
    ],
)
def test_bad_specs_name_the_problem(raw, msg):
    with pytest.raises(ProbeSpecError, match=re.escape(msg)):
        spec_from_dict(raw, source="x.yaml")


def test_zero_shot_and_narrow_ranges():
    items = _items("arith_plain", n_items=3, n_demos=0, variants=["eq"])
    assert all("\n" not in it.prompt and it.prompt.endswith("=") for it in items)
    assert all(it.prompt.count("\n") == 1 for it in _items("persona_plain", n_items=3, n_demos=0))
    with pytest.raises(ProbeSpecError, match="too narrow"):
        _items("arith_plain", n_items=4, params={"operand_min": 0, "operand_max": 1, "ops": ["-"]})
