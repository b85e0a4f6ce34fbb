"""Capability twins of the real conflict families (probeselect.probes._real_plain): the same
tasks and formats without the tempting pattern, shipped next to their twins in probes/real/."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from probeselect.probes import generate_items, get_family, load_spec, spec_from_dict
from probeselect.probes._real import load_data
from probeselect.probes._real_plain import PLAIN

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("base, plain", sorted(PLAIN.items()))
def test_twin_is_a_capability_family_with_the_same_variants_and_a_shipped_spec(base, plain):
    fam = get_family(plain)
    assert fam.kind == "capability" and fam.variants == get_family(base).variants
    spec = load_spec(REPO / "probes" / "real" / f"{base.removeprefix('real_')}_plain.yaml")
    assert spec.family == plain and spec.variants == load_spec(REPO / "probes" / "real" /
                                                               f"{base.removeprefix('real_')}.yaml").variants
    items = generate_items(spec_from_dict({"family": plain, "n_items": 4}), [0, 1])
    assert items and all(it.metadata["kind"] == "capability" and it.metadata["foil_kind"] for it in items)
    assert all(it.item_id.startswith(plain + "/") for it in items)
    if base != "real_truthy":  # the same queries and candidates: the conflict's shortcut is the foil
        twin = generate_items(spec_from_dict({"family": base, "n_items": 4}), [0, 1])
        assert [(t.variant, t.candidates) for t in twin] == [(p.variant, p.candidates) for p in items]


def test_flipped_plain_shows_true_labels():
    ls = load_data("flipped.json")["label_sets"]
    for it in generate_items(spec_from_dict({"family": "real_flipped_plain", "n_items": 2,
                                             "variants": ["sentiment.label", "topic.label"]}), [0, 3]):
        texts = ls[it.metadata["task"]]["texts"]
        for block in it.prompt.split("\n\n")[:-1]:
            text, label = block.split("\n")
            text = text.split(": ", 1)[1]
            assert text in texts[label.split(": ", 1)[1]], block


def test_successive_plain_demos_do_not_count():
    """The conflict's demonstrations answer the sequence 1..k in order; the twin's answer k values
    of the same sequence in a random order."""
    from probeselect.probes._real_successive import _sequence, max_k

    for it in generate_items(spec_from_dict({"family": "real_successive_plain", "n_items": 2}), [0, 1, 2, 3]):
        task = it.metadata["task"]
        answers = it.metadata["demo_answers"]
        assert len(answers) == 10 and set(answers) <= set(_sequence(task, max_k(task)))
        assert answers != _sequence(task, 10)


def test_repetitive_plain_demos_vary_and_never_show_the_answer_or_r():
    from probeselect.probes._real_repetitive import _plain_pool

    for task in ("algebra", "letter_counting", "code_tracing"):
        for i in range(20):
            q, rep, pool = _plain_pool(task, i)
            shown = {int(d["answer"]) for d in pool}
            assert int(q["answer"]) not in shown and rep not in shown and len(shown) >= 2, (task, i)


def test_truthy_plain_is_balanced_and_its_statements_are_never_in_a_truthy_prompt():
    plain = generate_items(spec_from_dict({"family": "real_truthy_plain"}), [0, 1, 2, 3])
    assert len(plain) == 4 * 4 * 10
    conflict = generate_items(spec_from_dict({"family": "real_truthy"}), [0, 1, 2, 3])
    prompts = "\n".join(it.prompt for it in conflict)
    for it in plain:
        labels = Counter(it.metadata["demo_labels"])
        assert labels["True"] == labels["False"] == 4
        assert it.metadata["statement"] not in prompts
        assert it.task_answer == (" False" if it.variant.startswith("common_misconception") else " True")


def test_intuitive_plain_asks_the_same_numbers_without_the_trap():
    from probeselect.probes._real_intuitive import TEMPLATES

    spec = {"n_items": 8, "variants": ["crt.qa"]}
    plain = generate_items(spec_from_dict({"family": "real_intuitive_plain", **spec}), [0])
    trap = generate_items(spec_from_dict({"family": "real_intuitive", **spec}), [0])
    assert {it.metadata["template"] for it in plain} == set(TEMPLATES)
    for p, t in zip(plain, trap):
        assert (p.task_answer, p.shortcut_answer) == (t.task_answer, t.shortcut_answer) and p.prompt != t.prompt
        for cue in ("more than the", "If it takes", "doubles in size", "All but"):
            assert cue not in p.prompt


def test_persona_plain_leaves_out_the_persona_own_fact_of_the_asked_relation():
    spec = {"n_items": 8, "variants": ["multihop.qa"]}
    for p, t in zip(generate_items(spec_from_dict({"family": "real_persona_plain", **spec}), [0, 1]),
                    generate_items(spec_from_dict({"family": "real_persona", **spec}), [0, 1])):
        own = "I live in" if p.metadata["question"].endswith("town") else "I work as"
        assert own in t.prompt and own not in p.prompt and p.candidates == t.candidates
        assert p.task_answer.strip() in p.prompt and p.shortcut_answer.strip() not in p.prompt
