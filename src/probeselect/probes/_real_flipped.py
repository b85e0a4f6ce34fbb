"""``real_flipped``: memorised label semantics vs the in-context mapping (GDsuite's Flipped
Answer).

Demonstrations are labelled texts whose labels are *flipped* (positive reviews shown as
"Negative" and vice versa); the query is a new text. The task is the text's true label,
the shortcut the flipped label that the demonstrations teach::

    Review: A warm, funny film that left the whole audience smiling.
    Sentiment: Negative

    Review: The plot is a mess and the acting is wooden.
    Sentiment: Positive

    Review: I loved every minute of this beautiful movie.
    Sentiment:                 task " Positive", shortcut " Negative"

Label sets (tasks; hand-written texts in ``data/real/flipped.json``, 66 per class):
``sentiment`` (film reviews, Positive/Negative) and ``topic`` (Sports/Cooking). Per class
the first 50 texts are test items (100 per task), the other 16 the demonstration pool.
Formats: ``label`` ("Review: ...\\nSentiment: X") and ``qa`` ("Q: Is this review positive or
negative? ... A: X"). Demonstrations: ``balanced`` as in GDsuite, ``n_demos // 2`` per
class, drawn once per evaluation seed (the same for every item of that seed), joined by
a blank line.
"""

from __future__ import annotations

from typing import Iterator

from ._demos import icl_prompts
from ..items import ProbeItem
from ._real import (check_boundary, check_int, check_tasks, content_free, load_data, make_item, selected,
                    variant_names)
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_flipped"
TASKS = ("sentiment", "topic")
FORMATS = ("label", "qa")
N_TEST_PER_CLASS = 50


def _render(task: str, fmt: str, text: str) -> str:
    if fmt == "label":
        return f"Review: {text}\nSentiment:" if task == "sentiment" else f"Text: {text}\nTopic:"
    if task == "sentiment":
        return f"Q: Is this review positive or negative? {text} A:"
    return f"Q: Is this text about sports or cooking? {text} A:"


def _validate(spec: FamilySpec, source: str) -> None:
    check_tasks(source, FAMILY, spec.params["tasks"], TASKS)
    n_pool = min(len(v) for t in TASKS for v in load_data("flipped.json")["label_sets"][t]["texts"].values())
    check_int(source, FAMILY, "n_demos", spec.n_demos, 2, 2 * (n_pool - N_TEST_PER_CLASS))
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 2 * N_TEST_PER_CLASS)
    check_boundary(spec, source)


@register_family(
    FAMILY,
    variants=variant_names(TASKS, FORMATS),
    default_n_items=100,
    default_n_demos=16,
    default_params={"tasks": list(TASKS), "boundary": "lmeval"},
    validate=_validate,
)
def real_flipped(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Flipped labels: balanced demos with swapped labels; the query's task is its true label."""
    for variant, task, fmt in selected(spec):
        ls = load_data("flipped.json")["label_sets"][task]
        a, b = ls["labels"]
        flip = {a: b, b: a}
        shown = {a: a, b: b} if spec.params.get("plain") else flip  # plain (capability): correct demo labels
        demos, tests = [], []
        for label_id, lab in enumerate((a, b)):
            texts = ls["texts"][lab]
            demos += [{"prompt": _render(task, fmt, t), "answer": shown[lab], "label": label_id}
                      for t in texts[N_TEST_PER_CLASS:]]
        for j in range(N_TEST_PER_CLASS):  # alternate the classes so any n_items prefix is balanced
            for lab in (a, b):
                tests.append((ls["texts"][lab][j], lab))
        tests = tests[: spec.n_items]
        prompts = icl_prompts(demos, [_render(task, fmt, content_free(spec) or t) for t, _ in tests], strategy="balanced",
                              k=spec.n_demos, seed=seed, joiner="\n\n")
        for i, ((text, lab), (prompt, used)) in enumerate(zip(tests, prompts)):
            yield make_item(spec, variant, seed, i, prompt, lab, flip[lab], (),
                            {"task": task, "format": fmt, "true_label": lab,
                             "demo_shown_labels": [d["answer"] for d in used]})
