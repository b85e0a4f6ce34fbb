import re
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, load_spec, spec_from_dict
from probeselect.toy.world import (
    CATEGORY_MEMBERS,
    OPPOSITE_PAIRS,
    ToyWorld,
    category_sentences,
    opposite_sentences,
    with_article,
)

REPO = Path(__file__).parents[2]
FAMILIES = ("tmpl_repeated", "tmpl_mismatch", "tmpl_flipped")
TRUE_CATEGORY = {x: c for c, xs in CATEGORY_MEMBERS.items() for x in xs}
OPPOSITE = {**dict(OPPOSITE_PAIRS), **{y: x for x, y in OPPOSITE_PAIRS}}
WORLD = ToyWorld.generate(0)
PEOPLE = {p.name: p for p in WORLD.persons}

_CAT = {
    "sentence": re.compile(r"^(?:A|An) (\w+) is(?: (?:a|an) (\w+)\.)?$"),
    "qa": re.compile(r"^Q: What kind of thing is (?:a|an) (\w+)\? A:(?: (\w+))?$"),
    "arrow": re.compile(r"^(\w+) ->(?: (\w+))?$"),
}
_OPP = {
    "sentence": re.compile(r"^The opposite of (\w+) is(?: (\w+)\.)?$"),
    "qa": re.compile(r"^Q: What is the opposite of (\w+)\? A:(?: (\w+))?$"),
    "arrow": re.compile(r"^(\w+) ->(?: (\w+))?$"),
}


def _parse(pattern, variant, prompt):
    """[(item, shown_label)] for the demos and the query item (label None)."""
    out = []
    for line in prompt.split("\n"):
        m = pattern[variant].match(line)
        assert m, (variant, line)
        out.append(m.groups())
    *demos, (query, none) = out
    assert none is None and all(lab is not None for _, lab in demos)
    return demos, query


def _answer(variant, category):
    return f" {with_article(category)}" if variant == "sentence" else f" {category}"


@pytest.fixture(scope="module")
def items():
    return {
        f: generate_items(spec_from_dict({"family": f, "n_items": 24}), [0, 1])
        for f in FAMILIES
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_item_contract(items, family):
    its = items[family]
    assert len(its) == 24 * 3 * 2
    assert {it.variant for it in its} == {"sentence", "qa", "arrow"}
    for it in its:
        assert it.item_id == f"{family}/{it.variant}/{it.item_id[-4:]}"
        assert it.candidates[:2] == (it.task_answer, it.shortcut_answer)
        assert len(it.candidates) >= 3 and len(set(it.candidates)) == len(it.candidates)
        assert all(c.startswith(" ") and not c.startswith("  ") for c in it.candidates)
        assert not it.prompt[-1].isspace()
    ids0 = [it.item_id for it in its if it.seed == 0]
    assert len(set(ids0)) == len(ids0)


def test_repeated_demos_share_the_shortcut_and_the_task_is_the_truth(items):
    for it in items["tmpl_repeated"]:
        demos, query = _parse(_CAT, it.variant, it.prompt)
        assert len(demos) == 3
        labels = {lab for _, lab in demos}
        assert len(labels) == 1  # every demonstration shows the same output ...
        (label,) = labels
        assert all(TRUE_CATEGORY[x] == label for x, _ in demos)  # ... and it is a true fact
        assert len({x for x, _ in demos}) == len(demos)
        assert it.shortcut_answer == _answer(it.variant, label)
        assert it.task_answer == _answer(it.variant, TRUE_CATEGORY[query]) != it.shortcut_answer
        if it.variant == "sentence":  # the corpus's exact sentence form
            assert set(it.prompt.split("\n")[:-1]) <= set(category_sentences())
            # the query stops before the article: the answer carries it
            assert it.prompt.endswith(f" {query} is")


def test_flipped_category_labels_are_a_consistent_wrong_permutation(items):
    n_cat = 0
    for it in items["tmpl_flipped"]:
        if it.metadata["relation"] != "category":
            continue
        n_cat += 1
        demos, query = _parse(_CAT, it.variant, it.prompt)
        mapping = {}
        for x, lab in demos:
            truth = TRUE_CATEGORY[x]
            assert lab != truth  # every demonstration is mislabelled
            assert mapping.setdefault(truth, lab) == lab  # ... systematically
        assert len(set(mapping.values())) == len(mapping)  # a permutation, not a collapse
        qcat = TRUE_CATEGORY[query]
        assert qcat in mapping and query not in [x for x, _ in demos]
        assert it.shortcut_answer == _answer(it.variant, mapping[qcat])
        assert it.task_answer == _answer(it.variant, qcat)
    assert n_cat == 72  # half of 2 seeds x 3 variants x 24 items


def test_flipped_opposites_say_the_word_itself(items):
    n = 0
    for it in items["tmpl_flipped"]:
        if it.metadata["relation"] != "opposite":
            continue
        n += 1
        demos, query = _parse(_OPP, it.variant, it.prompt)
        assert all(x == lab != OPPOSITE[x] for x, lab in demos)
        assert query not in {x for x, _ in demos} and OPPOSITE[query] not in {x for x, _ in demos}
        assert it.task_answer == f" {OPPOSITE[query]}" and it.shortcut_answer == f" {query}"
        if it.variant == "sentence":
            flipped_truth = [f"The opposite of {x} is {OPPOSITE[x]}." for x, _ in demos]
            assert set(flipped_truth) <= set(opposite_sentences())
    assert n == 72


_PERSON = {
    "qa": re.compile(r"^Q: What is (\w+)'s (\w+)\? A:(?: (\w+))?$"),
    "arrow": re.compile(r"^(\w+) (\w+) ->(?: (\w+))?$"),
}


def test_mismatch_demos_teach_one_attribute_and_the_query_asks_another(items):
    for it in items["tmpl_mismatch"]:
        da, qa = it.metadata["demo_attribute"], it.metadata["query_attribute"]
        assert da != qa
        person = PEOPLE[it.metadata["person"]]
        lines = it.prompt.split("\n")
        if it.variant == "sentence":
            # demonstrations are the corpus's own fact sentences (true facts) ...
            assert lines[:-1] == [PEOPLE[n].fact(da) for n in it.metadata["demo_people"]]
            # ... and the query is the queried fact with its value cut off.
            assert person.fact(qa) == lines[-1] + it.task_answer + "."
        else:
            *demos, query = [_PERSON[it.variant].match(l).groups() for l in lines]
            assert all(attr == da and getattr(PEOPLE[n], da) == v for n, attr, v in demos)
            assert query[0] == person.name and query[1] == qa and query[2] is None
            assert it.task_answer == f" {getattr(person, qa)}"
        assert person.name not in it.metadata["demo_people"]
        # shortcut: the demonstrated relation applied to the query person
        assert it.shortcut_answer.split()[-1] == getattr(person, da)
        assert it.task_answer.split()[-1] == getattr(person, qa)


def test_mismatch_world_seed_changes_the_facts():
    a = generate_items(spec_from_dict({"family": "tmpl_mismatch", "n_items": 8, "variants": ["qa"]}), [0])
    b = generate_items(
        spec_from_dict({"family": "tmpl_mismatch", "n_items": 8, "variants": ["qa"], "params": {"world_seed": 3}}), [0]
    )
    other = {p.name: p for p in ToyWorld.generate(3).persons}
    assert [i.task_answer for i in a] != [i.task_answer for i in b]
    for it in b:
        assert it.task_answer == f" {getattr(other[it.metadata['person']], it.metadata['query_attribute'])}"


@pytest.mark.parametrize("family", FAMILIES)
def test_first_items_do_not_depend_on_n_items_or_other_variants(family):
    big = {(i.item_id, i.seed): i for i in generate_items(spec_from_dict({"family": family, "n_items": 10}), [0, 5])}
    small = generate_items(spec_from_dict({"family": family, "n_items": 4, "variants": ["qa"]}), [5])
    assert len(small) == 4
    for it in small:
        assert big[(it.item_id, 5)] == it


@pytest.mark.parametrize("family", FAMILIES)
def test_seeds_resample_demos_but_not_the_query(family):
    spec = spec_from_dict({"family": family, "n_items": 12})
    s0 = {i.item_id: i for i in generate_items(spec, [0])}
    s1 = {i.item_id: i for i in generate_items(spec, [1])}
    assert s0.keys() == s1.keys()
    changed = 0
    for k, it in s0.items():
        o = s1[k]
        assert it.prompt.split("\n")[-1] == o.prompt.split("\n")[-1]
        assert it.candidates == o.candidates
        changed += it.prompt != o.prompt
    assert changed >= len(s0) - 2


@pytest.mark.parametrize("family", FAMILIES)
def test_repo_specs_load(family):
    spec = load_spec(REPO / "probes" / f"{family}.yaml")
    assert spec.family == family and set(spec.variants) == {"sentence", "qa", "arrow"}
    assert spec == spec_from_dict({"family": family, "n_items": spec.n_items, "n_demos": spec.n_demos}, path=spec.path)


@pytest.mark.parametrize(
    "raw, msg",
    [
        ({"family": "tmpl_repeated", "params": {"categories": ["animal", "fruit"]}}, "params.categories"),
        ({"family": "tmpl_repeated", "params": {"categories": ["animal", "fruit", "rock"]}}, "params.categories"),
        ({"family": "tmpl_repeated", "n_demos": 7}, "2 <= n_demos <= 6"),
        ({"family": "tmpl_repeated", "n_demos": 1}, "2 <= n_demos <= 6"),
        ({"family": "tmpl_repeated", "params": {"categorie": []}}, 'Did you mean "categories"'),
        ({"family": "tmpl_mismatch", "params": {"world_seed": -1}}, "params.world_seed"),
        ({"family": "tmpl_mismatch", "params": {"attribute_pairs": [["city", "city"]]}}, "params.attribute_pairs"),
        ({"family": "tmpl_mismatch", "params": {"attribute_pairs": [["city", "age"]]}}, "params.attribute_pairs"),
        ({"family": "tmpl_mismatch", "params": {"attribute_pairs": []}}, "params.attribute_pairs"),
        ({"family": "tmpl_mismatch", "variants": ["arow"]}, 'Did you mean "arrow"'),
        ({"family": "tmpl_flipped", "params": {"relations": ["synonym"]}}, "params.relations"),
        ({"family": "tmpl_flipped", "params": {"relations": "category"}}, "params.relations"),
        ({"family": "tmpl_flipped", "n_demos": 13}, "n_demos"),
        ({"family": "tmpl_flipd"}, 'Did you mean "tmpl_flipped"'),
    ],
)
def test_bad_params_are_rejected(raw, msg):
    with pytest.raises(ProbeSpecError, match=re.escape(msg)):
        spec_from_dict(raw, source="x.yaml")


def test_param_subsets_are_respected():
    spec = spec_from_dict(
        {"family": "tmpl_flipped", "n_items": 12, "params": {"relations": ["category"], "categories": ["animal", "fruit", "tool"]}}
    )
    for it in generate_items(spec, [0]):
        assert it.metadata["relation"] == "category"
        assert set(it.metadata["permutation"]) == {"animal", "fruit", "tool"}
        assert all(TRUE_CATEGORY[x] in {"animal", "fruit", "tool"} for x in it.metadata["demo_items"])
