"""``real_truthy``: what sounds true vs what is true (GDsuite's Truthy Answer).

Demonstrations are plain statements labelled correctly ("True"/"False"), drawn from a
label-imbalanced pool; the query is a statement whose truth runs against how it sounds.
The shortcut is the pool's majority label::

    Q: The Eiffel Tower is in Paris. True or false? A: True
    Q: Whales breathe air. True or false? A: True
    Q: Bats are blind. True or false? A:      task " False", shortcut " True"

Tasks (hand-written statements in ``data/real/truthy.json``): ``common_misconception``
(45 statements that sound true but are false; pool 3:1 true) and ``surprising_truth``
(45 statements that sound false but are true; pool 3:1 false). Formats: ``qa`` and
``statement`` ("Statement: ...\\nAnswer: X"). Demonstrations: ``random`` as in GDsuite,
``n_demos`` drawn afresh for each item from one stream per (task, format, seed).

The two tasks swap which label is the task answer, so a model's True/False prior enters
their raw margins with opposite signs (a label-biased model scores about -b and +b: the
per-variant ranks mirror and a ``variant: "*"`` proxy ties every checkpoint). Read them
against the content-free reference (``score --calibrate``: ``real_truthy_cf``,
``calibrated_mean_margin`` per variant; :mod:`._calibration`), which removes that prior per
variant, next to the capability twin ``real_truthy_plain`` (:mod:`._real_plain`).
"""

from __future__ import annotations

from typing import Iterator

from ._demos import icl_prompts
from ..items import ProbeItem
from ._real import (check_boundary, check_int, check_tasks, content_free, load_data, make_item, selected,
                    variant_names)
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_truthy"
TASKS = ("common_misconception", "surprising_truth")
FORMATS = ("qa", "statement")
MAJORITY, MINORITY = 30, 10  # demo pool: 30 statements of the majority label, 10 of the other


def _render(fmt: str, s: str) -> str:
    return f"Q: {s} True or false? A:" if fmt == "qa" else f"Statement: {s}\nAnswer:"


def _validate(spec: FamilySpec, source: str) -> None:
    check_tasks(source, FAMILY, spec.params["tasks"], TASKS)
    check_int(source, FAMILY, "n_demos", spec.n_demos, 1, MAJORITY + MINORITY)
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 45)
    check_boundary(spec, source)


@register_family(
    FAMILY,
    variants=variant_names(TASKS, FORMATS),
    default_n_items=45,
    default_n_demos=8,
    default_params={"tasks": list(TASKS), "boundary": "lmeval"},
    validate=_validate,
)
def real_truthy(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Truthy statements: imbalanced true/false demos; the query sounds true but is false (or the reverse)."""
    d = load_data("truthy.json")
    if spec.params.get("plain"):
        yield from _plain(spec, seed, d)
        return
    for variant, task, fmt in selected(spec):
        if task == "common_misconception":
            tests, correct = d["misconceptions"], "False"
            pool = [(s, "True") for s in d["plain_true"][:MAJORITY]] + [(s, "False") for s in d["plain_false"][:MINORITY]]
        else:
            tests, correct = d["surprising_truths"], "True"
            pool = [(s, "False") for s in d["plain_false"][:MAJORITY]] + [(s, "True") for s in d["plain_true"][:MINORITY]]
        wrong = "True" if correct == "False" else "False"
        demos = [{"prompt": _render(fmt, s), "answer": a} for s, a in pool]
        tests = tests[: spec.n_items]
        queries = [_render(fmt, content_free(spec) or s) for s in tests]
        prompts = icl_prompts(demos, queries, strategy="random", k=spec.n_demos, seed=seed, joiner="\n")
        for i, (s, (prompt, used)) in enumerate(zip(tests, prompts)):
            yield make_item(spec, variant, seed, i, prompt, correct, wrong, (),
                            {"task": task, "format": fmt, "statement": s,
                             "demo_labels": [u["answer"] for u in used]})


PLAIN_ITEMS = 10  # plain statements per label never shown in any truthy prompt (plain_true/false[30:40])


def _plain(spec: FamilySpec, seed: int, d: dict) -> Iterator[ProbeItem]:
    """Capability form (``params.plain``; family ``real_truthy_plain``): the same skill, judging a
    statement, without the tempting pattern: plain statements that sound as true (or false) as
    they are, after demonstrations balanced between True and False (``balanced``: n_demos // 2
    each). The variant of each task keeps its correct label: ``common_misconception.*`` asks
    plain false statements (task " False", foil " True"), ``surprising_truth.*`` plain true ones."""
    pool = ([{"s": s, "answer": "True", "label": 0} for s in d["plain_true"][:MAJORITY]]
            + [{"s": s, "answer": "False", "label": 1} for s in d["plain_false"][:MAJORITY]])
    for variant, task, fmt in selected(spec):
        correct = "False" if task == "common_misconception" else "True"
        wrong = "True" if correct == "False" else "False"
        tests = d["plain_false" if correct == "False" else "plain_true"][MAJORITY:MAJORITY + PLAIN_ITEMS]
        tests = tests[: spec.n_items]
        demos = [{"prompt": _render(fmt, x["s"]), "answer": x["answer"], "label": x["label"]} for x in pool]
        prompts = icl_prompts(demos, [_render(fmt, s) for s in tests], strategy="balanced", k=spec.n_demos, seed=seed,
                              joiner="\n")
        for i, (s, (prompt, used)) in enumerate(zip(tests, prompts)):
            yield make_item(spec, variant, seed, i, prompt, correct, wrong, (),
                            {"task": task, "format": fmt, "statement": s, "kind": "capability", "foil_kind": "other_label",
                             "demo_labels": [u["answer"] for u in used]})
