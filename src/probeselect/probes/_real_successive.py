"""``real_successive``: in-context successive pattern vs the computation (GDsuite's
Successive Answer).

The ``k`` demonstrations are correct, and their answers run through a sequence in order
(1, 2, 3, ...; one, two, three, ...; a, b, c, ...; 2, 4, 6, ...). The query is a
problem of the same kind whose answer is *not* the sequence's next element; the shortcut
is that next element (the (k+1)-th), the task the computed answer, the distractor the
last demonstrated element repeated::

    Q: 8 - 7 = ? A: 1
    Q: 1 + 1 = ? A: 2
    Q: 192 - 189 = ? A: 3
    Q: 68 - 60 = ? A:        task " 8", shortcut " 4", distractor " 3"

Tasks (procedural): ``arithmetic`` (answers 1, 2, 3, ...), ``even`` (answers 2, 4, 6,
...), ``number_words`` ("What is 9 minus 7 in words?" -> one, two, ...), ``letters``
("What is the first letter of 'apple'?" -> a, b, c, ...). Demonstrations are
``ordered`` as in GDsuite: each task ships ``params.n_demo_sets`` demo sets (fixed
sequences of problems), and evaluation seed ``s`` uses set ``s % n_demo_sets``, first
``k`` rows. Prompt formats: ``qa`` ("Q: ... A: x") and ``plain`` ("... = x" /
"Question: ...\\nAnswer: x"). Test item ``i`` is fixed (independent of seed and ``k``
except for the shortcut, which is the (k+1)-th sequence element).
"""

from __future__ import annotations

import random
from typing import Iterator

from ..errors import ProbeSpecError
from ._demos import icl_prompts
from ..items import ProbeItem, item_rng
from ._real import (check_boundary, check_int, check_tasks, content_free, load_data, make_item, selected,
                    variant_names)
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_successive"
TASKS = ("arithmetic", "even", "number_words", "letters")
FORMATS = ("qa", "plain")
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()
LETTERS = "abcdefghijklmnopqrstuvwxyz"
_OPWORD = {"+": "plus", "-": "minus"}


def _sequence(task: str, n: int) -> list[str]:
    if task == "arithmetic":
        return [str(j + 1) for j in range(n)]
    if task == "even":
        return [str(2 * (j + 1)) for j in range(n)]
    if task == "number_words":
        return [NUMBER_WORDS[j + 1] for j in range(n)]
    return [LETTERS[j] for j in range(n)]


def max_k(task: str) -> int:
    return {"arithmetic": 40, "even": 40, "number_words": 19, "letters": 25}[task]


def _words_by_letter() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in load_data("words.json")["words"]:
        out.setdefault(w[0], []).append(w)
    return out


def _problem(task: str, answer: str, rng: random.Random) -> dict:
    """A problem of ``task`` whose answer is ``answer`` (fields for the templates)."""
    if task == "letters":
        return {"word": rng.choice(_words_by_letter()[answer]), "answer": answer}
    value = NUMBER_WORDS.index(answer) if task == "number_words" else int(answer)
    hi = 20 if task == "number_words" else 99
    op = rng.choice("+-")
    if op == "+":
        a = rng.randint(0, value)
        b = value - a
    else:
        b = rng.randint(1, hi)
        a = value + b
    return {"a": a, "op": op, "b": b, "answer": answer}


def _render(task: str, fmt: str, p: dict, cf: str | None = None) -> str:
    """The problem as the model sees it, ending where the answer goes; with ``cf`` (a content-free
    string such as "N/A") in place of the problem's content (the word, or the whole expression)."""
    if cf is not None:
        if task == "letters":
            p = {"word": cf}
        elif task == "number_words":
            return (f"Q: What is {cf}, written as a word? A:" if fmt == "qa"
                    else f"Question: Write {cf} in words.\nAnswer:")
        else:
            return f"Q: {cf} = ? A:" if fmt == "qa" else f"{cf} ="
    if task == "letters":
        return (f"Q: What is the first letter of the word '{p['word']}'? A:" if fmt == "qa"
                else f"Question: Which letter does '{p['word']}' start with?\nAnswer:")
    if task == "number_words":
        return (f"Q: What is {p['a']} {_OPWORD[p['op']]} {p['b']}, written as a word? A:" if fmt == "qa"
                else f"Question: Write {p['a']} {p['op']} {p['b']} in words.\nAnswer:")
    return f"Q: {p['a']} {p['op']} {p['b']} = ? A:" if fmt == "qa" else f"{p['a']} {p['op']} {p['b']} ="


def _validate(spec: FamilySpec, source: str) -> None:
    p = spec.params
    check_tasks(source, FAMILY, p["tasks"], TASKS)
    check_int(source, FAMILY, "params.n_demo_sets", p["n_demo_sets"], 1, 16)
    limit = min(max_k(t) for t in p["tasks"])
    check_int(source, FAMILY, "n_demos", spec.n_demos, 2, limit)
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 400)
    check_boundary(spec, source)


def _test_answers(task: str, k: int) -> list[str]:
    """Possible test answers: every sequence value except the (k+1)-th."""
    if task == "letters":
        pool = [c for c in LETTERS if c in _words_by_letter()]
    elif task == "number_words":
        pool = NUMBER_WORDS[1:]
    elif task == "even":
        pool = [str(x) for x in range(2, 81, 2)]
    else:
        pool = [str(x) for x in range(1, 41)]
    return pool


@register_family(
    FAMILY,
    variants=variant_names(TASKS, FORMATS),
    default_n_items=100,
    default_n_demos=10,
    default_params={"tasks": list(TASKS), "n_demo_sets": 4, "boundary": "lmeval"},
    validate=_validate,
)
def real_successive(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Successive answers: ordered demos answer 1,2,3 / a,b,c / ...; the query's answer is not the next one."""
    k = spec.n_demos
    for variant, task, fmt in selected(spec):
        seq = _sequence(task, k + 1)
        shortcut = seq[k]
        # the demo sets: fixed problems whose answers follow the sequence (GDsuite's demo_set rows)
        demos = []
        for s in range(spec.params["n_demo_sets"]):
            r = item_rng(FAMILY, task, "demo_set", s)
            rows = [{"prompt": _render(task, fmt, _problem(task, a, r)), "answer": a, "demo_set": s}
                    for a in _sequence(task, max_k(task))]
            if spec.params.get("plain"):  # capability: the same problems in a random order, no successive answers
                item_rng(FAMILY, task, "plain_order", s).shuffle(rows)
            demos += rows
        tests = []
        pool = [a for a in _test_answers(task, k) if a not in (shortcut, seq[k - 1])]
        for i in range(spec.n_items):
            r = item_rng(FAMILY, task, "query", i)
            ans = r.choice(pool)
            tests.append((_render(task, fmt, _problem(task, ans, r), content_free(spec)), ans))
        prompts = icl_prompts(demos, [t for t, _ in tests], strategy="ordered", k=k, seed=seed, joiner="\n")
        for i, ((_, ans), (prompt, used)) in enumerate(zip(tests, prompts)):
            yield make_item(spec, variant, seed, i, prompt, ans, shortcut, [seq[k - 1]],
                            {"task": task, "format": fmt, "demo_set": seed % spec.params["n_demo_sets"],
                             "demo_answers": [d["answer"] for d in used], "distractor_kind": "last_demo_answer"})


def _check_words() -> None:  # used by tests: every letter used by ``letters`` has words
    missing = [c for c in LETTERS[:max_k("letters")] if c not in _words_by_letter()]
    if missing:
        raise ProbeSpecError(f"words.json has no word for letters {missing}")
