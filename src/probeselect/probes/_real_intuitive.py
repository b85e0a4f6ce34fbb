"""``real_intuitive``: the System-1 answer vs the System-2 answer (GDsuite's Intuitive
Answer, zero-shot cognitive-reflection items).

Procedural CRT-style problems with varied numbers and objects; the shortcut is the
intuitive (wrong) answer, the task the correct one::

    Q: A bat and a ball cost 110 cents in total. The bat costs 100 cents more than the
    ball. How many cents does the ball cost? A:          task " 5", shortcut " 10"

Templates (cycled by item index): ``total_difference`` (bat and ball), ``machines``
(n machines make n widgets in m minutes), ``doubling`` (a lily-pad patch doubling
daily), ``all_but`` (all but m of n sheep ran away). Formats: ``qa`` ("Q: ... A:") and
``question`` ("Question: ...\\nAnswer:"). No demonstrations (strategy ``none``), so every
evaluation seed sees the same prompts. The distractor is a plausible third answer (the
sum, the product, the full period, the total).
"""

from __future__ import annotations

import random
from typing import Iterator

from ._demos import icl_prompts
from ..items import ProbeItem, item_rng
from ._real import check_boundary, check_int, content_free, make_item, selected
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_intuitive"
TEMPLATES = ("total_difference", "machines", "doubling", "all_but")
FORMATS = ("qa", "question")
_PAIRS = (("bat", "ball"), ("notebook", "pencil"), ("pizza", "drink"), ("book", "bookmark"), ("shirt", "tie"),
          ("lamp", "bulb"), ("racket", "shuttlecock"), ("cake", "candle"))
_MACHINES = (("machines", "widgets"), ("printers", "posters"), ("bakers", "loaves"), ("robots", "toys"),
             ("looms", "scarves"))
_PATCHES = (("lily pads", "lake"), ("algae", "pond"), ("moss", "rock"), ("mould", "slice of bread"))
_FLOCKS = (("farmer", "sheep"), ("shepherd", "goats"), ("zookeeper", "parrots"), ("girl", "goldfish"))


def crt_problem(template: str, r: random.Random, plain: bool = False) -> tuple[str, int, int, int]:
    """(question, correct, intuitive, distractor) for one template. ``plain`` (the capability twin
    ``real_intuitive_plain``): the same numbers, objects and answers, asked without the trap (the
    quantity the question needs is stated, nothing invites the intuitive answer, which stays a foil)."""
    if template == "total_difference":
        a, b = r.choice(_PAIRS)
        x, d = r.randint(2, 45), 10 * r.randint(5, 50)
        t = 2 * x + d
        if plain:
            return (f"A {a} and a {b} cost {t} cents in total. The {a} costs {x + d} cents. "
                    f"How many cents does the {b} cost?", x, t - d, t)
        return (f"A {a} and a {b} cost {t} cents in total. The {a} costs {d} cents more than the {b}. "
                f"How many cents does the {b} cost?", x, t - d, t)
    if template == "machines":
        m_, w = r.choice(_MACHINES)
        n, m = r.randint(3, 9), r.randint(2, 30)
        k = r.choice([v for v in (20, 50, 80, 100, 120, 200) if v != m])
        third = m * k // n if m * k // n not in (m, k) else m + k
        if plain:
            return (f"Each of {k} {m_} makes one of {k} {w} in {m} minutes, all at the same time. How many minutes "
                    f"does it take them to make the {k} {w}?", m, k, third)
        return (f"If it takes {n} {m_} {m} minutes to make {n} {w}, how many minutes would it take {k} {m_} "
                f"to make {k} {w}?", m, k, third)
    if template == "doubling":
        p, place = r.choice(_PATCHES)
        d = 2 * r.randint(5, 40)
        if plain:
            return (f"A patch of {p} covers the whole {place} after {d} days. It covered half of the {place} one day "
                    f"before that. After how many days did it cover half of it?", d - 1, d // 2, d)
        return (f"A patch of {p} on a {place} doubles in size every day. If it takes {d} days for the patch to "
                f"cover the whole {place}, how many days would it take to cover half of it?", d - 1, d // 2, d)
    who, animals = r.choice(_FLOCKS)
    n = r.randint(12, 40)
    m = r.choice([v for v in range(3, n - 2) if v != n - v])
    if plain:
        return (f"A {who} had {n} {animals}. {m} of them stayed and the others ran away. How many {animals} does the "
                f"{who} have left?", m, n - m, n)
    return (f"A {who} had {n} {animals}. All but {m} of them ran away. How many {animals} does the {who} have "
            f"left?", m, n - m, n)


def _render(fmt: str, q: str) -> str:
    return f"Q: {q} A:" if fmt == "qa" else f"Question: {q}\nAnswer:"


def _validate(spec: FamilySpec, source: str) -> None:
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 1000)
    check_boundary(spec, source)


@register_family(
    FAMILY,
    variants=tuple(f"crt.{f}" for f in FORMATS),
    default_n_items=100,
    default_n_demos=0,
    default_params={"boundary": "lmeval"},
    validate=_validate,
)
def real_intuitive(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Intuitive answers: zero-shot CRT items (bat and ball, machines, doubling, all-but) with varied numbers."""
    for variant, _task, fmt in selected(spec):
        probs = []
        for i in range(spec.n_items):
            template = TEMPLATES[i % len(TEMPLATES)]
            probs.append((template, *crt_problem(template, item_rng(FAMILY, "query", i), bool(spec.params.get("plain")))))
        prompts = icl_prompts([], [_render(fmt, content_free(spec) or p[1]) for p in probs], strategy="none", k=0, seed=seed, joiner="\n")
        for i, (p, (prompt, _)) in enumerate(zip(probs, prompts)):
            template, _q, correct, intuitive, other = p
            yield make_item(spec, variant, seed, i, prompt, str(correct), str(intuitive), [str(other)],
                            {"task": "crt", "template": template, "format": fmt})
