"""Domain-capability families: plain, non-conflicting items of each conflict family's skill.

A conflict family measures whether a model follows the task or a tempting shortcut; a low
score can mean "prefers the shortcut" or simply "cannot do the task". These families ask
the same skill in the same surface formats with *correct* demonstrations and nothing
misleading in the prompt, so they separate the two (registered with ``kind="capability"``).

``ProbeItem`` requires a ``shortcut_answer`` different from the task answer. For
capability items it is a **foil**: the most plausible *wrong* answer (a near miss), fixed
per item. The per-item ``margin`` (``log p(task) - log p(foil)``) is therefore a margin
against this foil, not against a shortcut, and the headline metric of a capability
family is ``candidate_accuracy`` (the task answer beats every candidate: the foil and the
further distractors). As in the conflict families, the query, task, foil and distractors
of item ``i`` depend only on (family, variant, "query", i); the demonstrations (and, for
``persona_plain``, the description's form) are resampled per evaluation seed from
(family, variant, seed, i); item ids ``family/variant/iiii`` are stable across seeds.
Every item's metadata has ``kind: "capability"`` and ``foil_kind``.

``arith_plain`` -- arithmetic with correct demonstrations (the formats of ``arith_pattern``:
variants ``eq``, ``qa``, ``words``). The demonstrations never show the task answer or the
foil as their answer::

    12 + 9 = 21
    6 - 6 = 0
    8 + 3 = 11
    20 - 2 = 18
    17 - 13 =          task " 4", foil " 3" (off by one), distractor " 30" (the other operation)

``relation_plain`` -- opposites and categories (toy-world facts) with correct
demonstrations of the same relation (the formats of the ``tmpl_*`` families: ``sentence``,
``qa``, ``arrow``). Relations alternate by item index. The demonstrations never show the
task answer or the foil as an answer (no copying either from context)::

    The opposite of sad is happy.
    The opposite of long is short.
    The opposite of poor is rich.
    The opposite of old is young.
    The opposite of small is      task " big", foil " loud" (another opposite word), distractor " small" (echo)

    A flute is an instrument.
    A piano is an instrument.
    A cherry is a fruit.
    A lemon is a fruit.
    A leek is                     task " a vegetable", foil " an animal", distractor " a tool" (other categories)

``persona_plain`` -- one toy-world person's persona block, as the corpus writes it
(description line, then first-person "Q: ... A: ..." lines about that same person), with
no other person in the prompt. The demonstrations are correct QA lines about other
attributes of the same person; the query asks one more. The person is a toy-world person
(``ToyWorld.generate(params.world_seed)``), so the description agrees with the facts the
model was pretrained on. The description is the corpus's full template or (per seed) its
first sentence plus a random subset/order of the other sentences that covers every
attribute asked about. Variants: ``block`` (the answer is the whole first-person
sentence, as in the corpus) and ``value`` (the prompt ends with the answer's stem and the
answer is the value, with its article for job and pet)::

    Abel is a pilot from Malmo. His favourite colour is brown. He likes chess. He has a cat.
    Q: What is your job? A: I am a pilot.
    Q: What pet do you have? A: I have a cat.
    Q: Where do you live? A:      task " I live in Malmo.", foil " I live in Delft." (another
                                  person's city), distractor " I live in Graz." (another city)

    (the same query in the value form: "... Q: Where do you live? A: I live in" -> " Malmo" / " Delft")
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Iterator

from ..errors import ProbeSpecError
from ..toy.world import (
    ATTRIBUTE_VOCAB,
    CATEGORY_MEMBERS,
    PERSON_ATTRIBUTES,
    PERSONA_ANSWER_TEMPLATES,
    PERSONA_DESCRIPTION_EXTRA,
    PERSONA_QA_TEMPLATE,
    PERSONA_QUESTIONS,
    ToyWorld,
)
from ._arithmetic import TEMPLATES as ARITH_TEMPLATES
from ..items import build_item, ProbeItem, item_rng
from ._registry import register_family
from ._templates import CATEGORIES, OPPOSITE_OF, OPPOSITE_WORDS, _check_subset
from ._templates import VARIANTS as TEMPLATE_VARIANTS
from ._templates import category_answer as cat_answer
from ._templates import category_line as cat_line
from ._templates import category_query as cat_query
from ._templates import opposite_line as opp_line
from ._templates import opposite_query as opp_query
from ._spec import FamilySpec

__all__ = ["ARITH_PLAIN", "PERSONA_PLAIN", "RELATION_PLAIN"]

ARITH_PLAIN = "arith_plain"
RELATION_PLAIN = "relation_plain"
PERSONA_PLAIN = "persona_plain"


def _make_item(family, variant, seed, i, prompt, task, foil, distractors, metadata) -> ProbeItem:
    return build_item(family, variant, seed, i, prompt, task, foil, distractors, {"kind": "capability", **metadata})


def _check_n_demos(source: str, family: str, spec: FamilySpec, hi: int, why: str) -> None:
    if spec.n_demos > hi:
        raise ProbeSpecError(f"{source}: {family} needs n_demos <= {hi} ({why}); got n_demos: {spec.n_demos}.")


# ---------------------------------------------------------------------------
# arith_plain
# ---------------------------------------------------------------------------

_OPWORDS = {"+": "plus", "-": "minus"}


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b


def _arith_line(variant: str, a: int, op: str, b: int, c: object) -> str:
    return ARITH_TEMPLATES[variant].format(a=a, op=op, b=b, opword=_OPWORDS[op], c=c).rstrip()


def _arith_problem(rng, ops, lo: int, hi: int) -> tuple[int, str, int]:
    op = rng.choice(ops)
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    if op == "-" and a < b:
        a, b = b, a
    return a, op, b


def _validate_arith(spec: FamilySpec, source: str) -> None:
    p = spec.params
    lo, hi = p["operand_min"], p["operand_max"]
    if not (isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) and 0 <= lo < hi):
        raise ProbeSpecError(f"{source}: params.operand_min/operand_max must be integers with 0 <= min < max.")
    _check_subset(source, ARITH_PLAIN, "ops", p["ops"], tuple(_OPWORDS), 1)
    _check_n_demos(source, ARITH_PLAIN, spec, 32, "a few-shot prompt, not a table")


@register_family(
    ARITH_PLAIN,
    variants=tuple(ARITH_TEMPLATES),
    default_n_items=64,
    default_n_demos=4,
    default_params={"operand_min": 0, "operand_max": 20, "ops": ["+", "-"]},
    validate=_validate_arith,
    kind="capability",
)
def arith_plain(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Plain arithmetic: correct demonstrations; foil = off-by-one, distractor = other operation."""
    p = spec.params
    lo, hi, ops = p["operand_min"], p["operand_max"], list(p["ops"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            rq = item_rng(ARITH_PLAIN, variant, "query", i)
            a, op, b = _arith_problem(rq, ops, lo, hi)
            c = _apply(op, a, b)
            step = rq.choice((1, -1)) if c > 0 else 1
            foil = c + step
            other = _apply("-" if op == "+" else "+", a, b)
            options = [other, c - step, c + 2 * step, c - 2 * step, c + 3]
            distractor = next(d for d in options if d >= 0 and d not in (c, foil))
            rd = item_rng(ARITH_PLAIN, variant, seed, i)
            demos, tries = [], 0
            while len(demos) < spec.n_demos:
                tries += 1
                if tries > 10_000 * spec.n_demos:
                    raise ProbeSpecError(
                        f"{ARITH_PLAIN}: operand range [{lo}, {hi}] with ops {ops} is too narrow for demonstrations "
                        f"whose answers differ from the query's answer {c} and foil {foil}."
                    )
                d = _arith_problem(rd, ops, lo, hi)
                # A demonstration never shows the task answer or the foil as its answer.
                if _apply(d[1], d[0], d[2]) not in (c, foil):
                    demos.append(d)
            lines = [_arith_line(variant, da, dop, db, _apply(dop, da, db)) for da, dop, db in demos]
            prompt = "\n".join(lines + [_arith_line(variant, a, op, b, "")])
            yield _make_item(
                ARITH_PLAIN, variant, seed, i, prompt, f" {c}", f" {foil}", [f" {distractor}"],
                {
                    "query": [a, op, b],
                    "demo_queries": [list(d) for d in demos],
                    "foil_kind": "off_by_one",
                    "distractor_kinds": ["other_operation" if distractor == other else "off_by_n"],
                },
            )


# ---------------------------------------------------------------------------
# relation_plain
# ---------------------------------------------------------------------------

# The same surface formats (and renderers) as the tmpl_* conflict families.
RELATION_VARIANTS = TEMPLATE_VARIANTS
RELATIONS = ("category", "opposite")


def _validate_relation(spec: FamilySpec, source: str) -> None:
    p = spec.params
    _check_subset(source, RELATION_PLAIN, "relations", p["relations"], RELATIONS, 1)
    _check_subset(source, RELATION_PLAIN, "categories", p["categories"], CATEGORIES, 3)
    sizes = sorted(len(CATEGORY_MEMBERS[c]) for c in p["categories"])
    hi = min(12, sum(sizes[:-2]) if "category" in p["relations"] else 12)
    _check_n_demos(source, RELATION_PLAIN, spec, hi, "distinct facts that show neither the answer nor the foil")


@register_family(
    RELATION_PLAIN,
    variants=RELATION_VARIANTS,
    default_n_items=48,
    default_n_demos=4,
    default_params={"relations": list(RELATIONS), "categories": list(CATEGORIES)},
    validate=_validate_relation,
    kind="capability",
    requires="toy_world",
)
def relation_plain(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Plain word relations (category / opposite) with correct demonstrations of the same relation."""
    p = spec.params
    relations, cats = list(p["relations"]), list(p["categories"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            relation = relations[i % len(relations)]
            rq = item_rng(RELATION_PLAIN, variant, "query", i)
            rd = item_rng(RELATION_PLAIN, variant, seed, i)
            if relation == "category":
                query_cat, foil_cat, other_cat = rq.sample(cats, 3)
                query = rq.choice(CATEGORY_MEMBERS[query_cat])
                pool = [(x, c) for c in cats if c not in (query_cat, foil_cat) for x in CATEGORY_MEMBERS[c]]
                demos = rd.sample(pool, spec.n_demos)
                lines = [cat_line(variant, x, c) for x, c in demos]
                prompt = "\n".join(lines + [cat_query(variant, query)])
                task, foil = cat_answer(variant, query_cat), cat_answer(variant, foil_cat)
                distractors = [cat_answer(variant, other_cat)]
                meta = {
                    "relation": relation,
                    "query": query,
                    "demo_items": [x for x, _ in demos],
                    "demo_labels": [c for _, c in demos],
                    "foil_kind": "other_category",
                    "distractor_kinds": ["other_category"],
                }
            else:
                word = rq.choice(OPPOSITE_WORDS)
                truth = OPPOSITE_OF[word]
                foil = rq.choice([w for w in OPPOSITE_WORDS if w not in (word, truth)])
                banned = {word, truth, foil, OPPOSITE_OF[foil]}
                demo_words = rd.sample([w for w in OPPOSITE_WORDS if w not in banned], spec.n_demos)
                lines = [opp_line(variant, w, OPPOSITE_OF[w]) for w in demo_words]
                prompt = "\n".join(lines + [opp_query(variant, word)])
                task, foil, distractors = f" {truth}", f" {foil}", [f" {word}"]
                meta = {
                    "relation": relation,
                    "query": word,
                    "demo_items": demo_words,
                    "demo_labels": [OPPOSITE_OF[w] for w in demo_words],
                    "foil_kind": "other_opposite_word",
                    "distractor_kinds": ["echo_query_word"],
                }
            yield _make_item(RELATION_PLAIN, variant, seed, i, prompt, task, foil, distractors, meta)


# ---------------------------------------------------------------------------
# persona_plain
# ---------------------------------------------------------------------------

PERSONA_VARIANTS = ("block", "value")
_EXTRA_ATTRIBUTES = tuple(PERSONA_DESCRIPTION_EXTRA)  # pet, hobby, colour (city/job are always described)


@lru_cache(maxsize=8)
def _world(seed: int) -> ToyWorld:
    return ToyWorld.generate(seed)


def _answer_parts(attribute: str) -> tuple[str, str]:
    """``("I live in", "city")``: the first-person answer's stem and its value placeholder."""
    tmpl = PERSONA_ANSWER_TEMPLATES[attribute]
    lo, hi = tmpl.index("{"), tmpl.index("}")
    return tmpl[:lo].rstrip(), tmpl[lo + 1 : hi]


def _persona_answer(variant: str, person, attribute: str, value: str) -> str:
    """The scored continuation for ``person`` with ``attribute`` set to ``value``."""
    who = dataclasses.replace(person, **{attribute: value})
    if variant == "block":
        return " " + who.persona_answer(attribute)
    _, key = _answer_parts(attribute)
    return " " + who.fields()[key]


def _validate_persona(spec: FamilySpec, source: str) -> None:
    p = spec.params
    ws = p["world_seed"]
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 0:
        raise ProbeSpecError(
            f"{source}: {PERSONA_PLAIN} params.world_seed must be an integer >= 0 (the toy ladder's seed), got {ws!r}."
        )
    _check_subset(source, PERSONA_PLAIN, "attributes", p["attributes"], PERSON_ATTRIBUTES, 1)
    _check_n_demos(source, PERSONA_PLAIN, spec, len(PERSON_ATTRIBUTES) - 1, "QA lines about the other attributes")


@register_family(
    PERSONA_PLAIN,
    variants=PERSONA_VARIANTS,
    default_n_items=40,
    default_n_demos=2,
    default_params={"world_seed": 0, "attributes": list(PERSON_ATTRIBUTES)},
    validate=_validate_persona,
    kind="capability",
    requires="toy_world",
)
def persona_plain(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Plain persona QA: one described person, first-person questions about that same person."""
    p = spec.params
    persons = _world(p["world_seed"]).persons
    attributes = list(p["attributes"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            attr = attributes[i % len(attributes)]
            rq = item_rng(PERSONA_PLAIN, variant, "query", i)
            person = rq.choice(persons)
            truth = getattr(person, attr)
            others = sorted({getattr(q, attr) for q in persons} - {truth})
            foil = rq.choice(others)  # another person's value of the same attribute
            pool = [v for v in ATTRIBUTE_VOCAB[attr] if v not in (truth, foil)]
            other = rq.choice(pool)
            rd = item_rng(PERSONA_PLAIN, variant, seed, i)
            demo_attrs = rd.sample([a for a in PERSON_ATTRIBUTES if a != attr], spec.n_demos)
            # The description, as in the corpus: the full template, or the first sentence
            # (city, job) plus a random subset/order of the rest that covers every asked attribute.
            if rd.random() < 0.5:
                extras = None
            else:
                needed = [a for a in [attr, *demo_attrs] if a in _EXTRA_ATTRIBUTES]
                rest = [a for a in _EXTRA_ATTRIBUTES if a not in needed]
                extras = needed + rd.sample(rest, rd.randint(0, len(rest)))
                rd.shuffle(extras)
                extras = tuple(extras)
            lines = [person.description(extras)] + [person.persona_qa(a) for a in demo_attrs]
            question = PERSONA_QUESTIONS[attr]
            if variant == "block":
                query = PERSONA_QA_TEMPLATE.format(question=question, answer="").rstrip()
            else:
                stem, _ = _answer_parts(attr)
                query = PERSONA_QA_TEMPLATE.format(question=question, answer=stem)
            prompt = "\n".join(lines + [query])
            yield _make_item(
                PERSONA_PLAIN, variant, seed, i, prompt,
                _persona_answer(variant, person, attr, truth),
                _persona_answer(variant, person, attr, foil),
                [_persona_answer(variant, person, attr, other)],
                {
                    "person": person.name,
                    "attribute": attr,
                    "demo_attributes": demo_attrs,
                    "description_extras": None if extras is None else list(extras),
                    "world_seed": p["world_seed"],
                    "foil_kind": "other_person_value",
                    "distractor_kinds": ["other_value"],
                },
            )

