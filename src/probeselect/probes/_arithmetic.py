"""Pattern-vs-calculation arithmetic: demonstrations whose answers follow a pattern.

The demonstrations are arithmetic problems whose *shown* answers follow a pattern that
has nothing to do with the arithmetic (1, 2, 3, ...; constant; alternating). The query is
an ordinary problem whose calculated answer differs from the pattern's next value:

    12 + 5 = 1
    30 - 8 = 2
    7 + 8 = 3
    68 - 60 =          task " 8", shortcut " 4", distractor " 128" (the other operation)

The query, pattern and candidates of item ``i`` depend only on (family, variant, i); the
demonstrations are resampled per evaluation seed from (family, variant, seed, i).
"""

from __future__ import annotations

from typing import Iterator

from ..errors import ProbeSpecError
from ..items import ProbeItem, item_rng
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "arith_pattern"

#: Prompt-format variants. ``{c}`` is the answer; the query line leaves it empty.
TEMPLATES: dict[str, str] = {
    "eq": "{a} {op} {b} = {c}",
    "qa": "Q: What is {a} {op} {b}? A: {c}",
    "words": "{a} {opword} {b} is {c}",
}
_OPWORDS = {"+": "plus", "-": "minus"}
PATTERNS = ("count", "constant", "alternating")


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b


def _line(variant: str, a: int, op: str, b: int, c: object) -> str:
    return TEMPLATES[variant].format(a=a, op=op, b=b, opword=_OPWORDS[op], c=c).rstrip()


def _pattern_values(pattern: str, n: int, rng) -> tuple[list[int], int]:
    """The demonstrations' shown answers and the pattern's next value (the shortcut)."""
    if pattern == "count":
        start = rng.randint(1, 5)
        return [start + j for j in range(n)], start + n
    if pattern == "constant":
        k = rng.randint(1, 9)
        return [k] * n, k
    if pattern == "alternating":
        x, y = rng.sample(range(1, 10), 2)
        vals = [x if j % 2 == 0 else y for j in range(n)]
        return vals, (x if n % 2 == 0 else y)
    raise ValueError(pattern)


def _problem(rng, ops, lo: int, hi: int, avoid: set[int]) -> tuple[int, str, int, int]:
    for _ in range(10_000):
        op = rng.choice(ops)
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if op == "-" and a < b:
            a, b = b, a
        c = _apply(op, a, b)
        if c not in avoid:
            return a, op, b, c
    raise ProbeSpecError(f"{FAMILY}: operand range [{lo}, {hi}] is too narrow to avoid answers {sorted(avoid)}.")


def _validate(spec: FamilySpec, source: str) -> None:
    p = spec.params
    if spec.n_demos < 2:
        raise ProbeSpecError(f"{source}: {FAMILY} needs n_demos >= 2 so the demonstrations form a pattern.")
    lo, hi = p["operand_min"], p["operand_max"]
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
        raise ProbeSpecError(f"{source}: params.operand_min/operand_max must be integers with 0 <= min < max.")
    bad_ops = [o for o in p["ops"] if o not in _OPWORDS]
    if bad_ops or not p["ops"]:
        raise ProbeSpecError(f"{source}: params.ops must be a non-empty subset of ['+', '-'], got {p['ops']!r}.")
    bad = [x for x in p["patterns"] if x not in PATTERNS]
    if bad or not p["patterns"]:
        raise ProbeSpecError(f"{source}: params.patterns must be a non-empty subset of {list(PATTERNS)}, got {p['patterns']!r}.")


@register_family(
    FAMILY,
    variants=tuple(TEMPLATES),
    default_n_items=64,
    default_n_demos=4,
    default_params={"operand_min": 0, "operand_max": 20, "ops": ["+", "-"], "patterns": list(PATTERNS)},
    validate=_validate,
)
def arith_pattern(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Pattern-vs-calculation arithmetic: shown demo answers follow 1,2,3 / constant / alternating."""
    p = spec.params
    lo, hi, ops, patterns = p["operand_min"], p["operand_max"], list(p["ops"]), list(p["patterns"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            rq = item_rng(FAMILY, variant, "query", i)
            pattern = patterns[i % len(patterns)]
            shown, shortcut = _pattern_values(pattern, spec.n_demos, rq)
            a, op, b, c = _problem(rq, ops, lo, hi, avoid={shortcut})
            other = _apply("-" if op == "+" else "+", a, b)
            distractor = other if other >= 0 and other not in (c, shortcut) else next(
                d for d in (c + 1, c + 2, c + 3) if d != shortcut
            )
            rd = item_rng(FAMILY, variant, seed, i)
            demos, true_demo = [], []
            for value in shown:
                da, dop, db, dc = _problem(rd, ops, lo, hi, avoid={value})
                demos.append(_line(variant, da, dop, db, value))
                true_demo.append(dc)
            cf = spec.params.get("content_free")  # a content-free reference (probes._calibration): no expression
            query = _line(variant, a, op, b, "") if not cf else {"eq": f"{cf} =", "qa": f"Q: What is {cf}? A:",
                                                                 "words": f"{cf} is"}[variant]
            prompt = "\n".join(demos + [query])
            task, short = f" {c}", f" {shortcut}"
            yield ProbeItem(
                item_id=f"{FAMILY}/{variant}/{i:04d}",
                family=FAMILY,
                variant=variant,
                seed=seed,
                prompt=prompt,
                task_answer=task,
                shortcut_answer=short,
                candidates=(task, short, f" {distractor}"),
                metadata={
                    "pattern": pattern,
                    "query": [a, op, b],
                    "demo_shown_answers": shown,
                    "demo_true_answers": true_demo,
                    "distractor_kind": "other_operation" if distractor == other else "off_by_n",
                },
            )
