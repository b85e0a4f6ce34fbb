"""``real_repetitive``: in-context repeated answer vs the computation (GDsuite's
Repetitive Answer).

Every demonstration is *correct* and every one has the same answer R; the query is a
problem of the same kind whose answer differs from R. Task: the computed answer;
shortcut: R; distractor: the answer off by one (task + 1, or - 1 if that is R)::

    Q: -11 = -94 + a. a? A: 83
    Q: 53 = a + -30. a? A: 83
    Q: -25 = -41 + a. a? A:        task " 16", shortcut " 83"

Tasks and prompt formats (variants ``<task>.<format>``):

* ``algebra`` (one-variable linear equations) in GDsuite's four templates:
  ``original`` ("Q: c = x + a. a? A: v"), ``v2fmt`` ("Equation: ...\\nValue of a: v"),
  ``numbered`` ("1. Solve c = x + a. a = v", numbered through the query) and
  ``instruction`` (an instruction line, then "c = x + a, so a = v");
* ``letter_counting`` (how often a letter occurs in an English word): ``qa``, ``plain``;
* ``code_tracing`` (what a 2-5 line Python snippet prints): ``qa``, ``plain``.

Demonstrations: ``random`` as in GDsuite — ``n_demos`` drawn afresh for every item and
evaluation seed from a pool of problems whose answer is R. The query, R and the
candidates of item ``i`` are fixed across seeds.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable, Iterator

from ._demos import STRATEGIES, build_icl_prompt, demo_block
from ..items import ProbeItem, item_rng
from ._real import check_boundary, check_int, check_tasks, content_free, load_data, make_item, selected
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_repetitive"
TASK_FORMATS = {
    "algebra": ("original", "v2fmt", "numbered", "instruction"),
    "letter_counting": ("qa", "plain"),
    "code_tracing": ("qa", "plain"),
}
TASKS = tuple(TASK_FORMATS)
POOL = 24  # demo pool size per item (the strategy draws n_demos of them)

# ---------------------------------------------------------------------------
# Problems: (fields, answer) with a given answer
# ---------------------------------------------------------------------------


def _algebra(rng: random.Random, answer: int) -> dict:
    x = rng.randint(-99, 99)
    if rng.random() < 0.5:
        return {"eq": f"{answer + x} = {x} + a", "answer": str(answer)}
    return {"eq": f"{answer + x} = a + {x}", "answer": str(answer)}


@lru_cache(maxsize=1)
def _letter_triples() -> list[tuple[str, str, int]]:
    out = []
    for w in load_data("words.json")["words"]:
        for c in sorted(set(w)):
            out.append((w, c, w.count(c)))
    return out


@lru_cache(maxsize=8)
def _triples_with_count(n: int) -> tuple[tuple[str, str, int], ...]:
    return tuple(t for t in _letter_triples() if t[2] == n)


def _letter(rng: random.Random, answer: int, avoid_word: str = "") -> dict:
    pool = [t for t in _triples_with_count(answer) if t[0] != avoid_word]
    w, c, n = rng.choice(pool)
    return {"word": w, "letter": c, "answer": str(n)}


_CODE: tuple[Callable[[random.Random], tuple[str, int]], ...] = (
    lambda r: (lambda a, b: (f"x = {a}\ny = x + {b}\nprint(y)", a + b))(r.randint(1, 9), r.randint(1, 9)),
    lambda r: (lambda a, b, c: (f"x = {a}\nx = x * {b}\nprint(x - {c})", a * b - c))(
        r.randint(2, 5), r.randint(2, 4), r.randint(0, 5)),
    lambda r: (lambda n, a: (f"total = 0\nfor i in range({n}):\n    total += {a}\nprint(total)", n * a))(
        r.randint(2, 5), r.randint(1, 4)),
    lambda r: (lambda a, b: (f"a = {a}\nb = {b}\nif a > b:\n    print(a - b)\nelse:\n    print(b - a)", abs(a - b)))(
        r.randint(1, 20), r.randint(1, 20)),
    lambda r: (lambda xs: (f"items = {xs}\nprint(len(items))", len(xs)))(
        [r.randint(0, 9) for _ in range(r.randint(1, 9))]),
    lambda r: (lambda w: (f"s = '{w}'\nprint(len(s))", len(w)))(r.choice(load_data("words.json")["words"])),
    lambda r: (lambda a, b: (f"x = {a}\nif x % 2 == 0:\n    x = x // 2\nelse:\n    x = x + {b}\nprint(x)",
                             a // 2 if a % 2 == 0 else a + b))(r.randint(2, 20), r.randint(1, 5)),
)


def _code(rng: random.Random, answer: int | None = None) -> dict:
    for _ in range(10_000):
        code, val = rng.choice(_CODE)(rng)
        if answer is None or val == answer:
            return {"code": code, "answer": str(val)}
    raise RuntimeError(f"no code snippet with output {answer}")  # pragma: no cover (answers are 1..12)


def _render(task: str, fmt: str, f: dict, pos: int) -> str:
    if task == "algebra":
        return {"original": f"Q: {f['eq']}. a? A:", "v2fmt": f"Equation: {f['eq']}\nValue of a:",
                "numbered": f"{pos}. Solve {f['eq']}. a =", "instruction": f"{f['eq']}, so a ="}[fmt]
    if task == "letter_counting":
        return (f"Q: How many times does the letter '{f['letter']}' appear in the word '{f['word']}'? A:"
                if fmt == "qa" else f"Word: {f['word']}\nNumber of '{f['letter']}'s:")
    return f"Q: What does this Python code print?\n{f['code']}\nA:" if fmt == "qa" else f"Code:\n{f['code']}\nOutput:"


def _query(task: str, r: random.Random) -> tuple[dict, int]:
    """The query problem and the repeated demo answer R (different from the query's)."""
    if task == "algebra":
        ans, rep = r.sample(range(-99, 100), 2)
        return _algebra(r, ans), rep
    if task == "letter_counting":
        w, c, n = r.choice([t for t in _letter_triples() if t[2] <= 3])
        return {"word": w, "letter": c, "answer": str(n)}, r.choice([x for x in (1, 2, 3) if x != n])
    q = _code(r)
    while not 1 <= int(q["answer"]) <= 12:
        q = _code(r)
    return q, r.choice([x for x in range(1, 13) if x != int(q["answer"])])


@lru_cache(maxsize=4096)
def _query_and_pool(task: str, i: int) -> tuple[dict, int, tuple[dict, ...]]:
    """Item ``i``'s query, repeated answer R and demo pool (problems whose answer is R)."""
    q, rep = _query(task, item_rng(FAMILY, task, "query", i))
    make = {"algebra": lambda r: _algebra(r, rep),
            "letter_counting": lambda r: _letter(r, rep, q.get("word", "")),
            "code_tracing": lambda r: _code(r, rep)}[task]
    rp = item_rng(FAMILY, task, "pool", i)
    return q, rep, tuple(make(rp) for _ in range(POOL))


@lru_cache(maxsize=4096)
def _plain_pool(task: str, i: int) -> tuple[dict, int, tuple[dict, ...]]:
    """Capability form of item ``i``: the same query and foil R, and a pool of correct problems
    whose answers vary and are never the query's answer or R (nothing repeated to copy; letter
    counts 1-4 leave two values, so their demonstrations alternate between those two)."""
    q, rep = _query(task, item_rng(FAMILY, task, "query", i))
    rp = item_rng(FAMILY, task, "plain_pool", i)
    avoid = {int(q["answer"]), rep}
    values = {"algebra": [v for v in range(-99, 100) if v not in avoid],
              "letter_counting": [v for v in (1, 2, 3, 4) if v not in avoid],
              "code_tracing": [v for v in range(1, 13) if v not in avoid]}[task]
    make = {"algebra": lambda r: _algebra(r, r.choice(values)),
            "letter_counting": lambda r: _letter(r, r.choice(values), q.get("word", "")),
            "code_tracing": lambda r: _code(r, r.choice(values))}[task]
    return q, rep, tuple(make(rp) for _ in range(POOL))


def _validate(spec: FamilySpec, source: str) -> None:
    check_tasks(source, FAMILY, spec.params["tasks"], TASKS)
    check_int(source, FAMILY, "n_demos", spec.n_demos, 2, POOL)
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 400)
    check_boundary(spec, source)


@register_family(
    FAMILY,
    variants=tuple(f"{t}.{f}" for t, fs in TASK_FORMATS.items() for f in fs),
    default_n_items=100,
    default_n_demos=4,
    default_params={"tasks": list(TASKS), "boundary": "lmeval"},
    validate=_validate,
)
def real_repetitive(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Repeated answer: every (correct) demo has the same answer R; the query's answer differs."""
    k = spec.n_demos
    for variant, task, fmt in selected(spec):
        for i in range(spec.n_items):
            q, rep, pool = _plain_pool(task, i) if spec.params.get("plain") else _query_and_pool(task, i)
            chosen = STRATEGIES["random"](pool, k, item_rng(FAMILY, variant, seed, i))
            blocks = [demo_block({"prompt": _render(task, fmt, d, j + 1), "answer": d["answer"]})
                      for j, d in enumerate(chosen)]
            cf = content_free(spec)
            shown = q if cf is None else {"eq": cf, "word": cf, "letter": cf, "code": cf}
            prompt = build_icl_prompt(blocks, _render(task, fmt, shown, k + 1), "\n")
            if task == "algebra" and fmt == "instruction":
                prompt = "Solve each equation for a.\n" + prompt
            ans = int(q["answer"])
            near = ans + 1 if ans + 1 != rep else ans - 1
            yield make_item(spec, variant, seed, i, prompt, q["answer"], str(rep), [str(near)],
                            {"task": task, "format": fmt, "repeated_answer": rep, "distractor_kind": "off_by_one"})
