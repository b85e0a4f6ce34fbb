"""Misleading-template conflict families built from toy-world facts.

Three families, each with the prompt-format variants ``sentence`` (the toy corpus's own
sentence form), ``qa`` ("Q: ... A: ...") and ``arrow`` ("x -> y"). In every family the
query (and so task, shortcut and distractors) of item ``i`` depends only on
(family, variant, "query", i); the demonstrations are resampled per evaluation seed
from (family, variant, seed, i). Item ``i`` is therefore the same whatever ``n_items``
is, and its id ``family/variant/iiii`` is stable across evaluation seeds.

``tmpl_repeated`` -- repeated demonstration output
    Every demonstration is a *true* category fact from one category C, so every
    demonstration shows the same answer; the query is a member of another category D::

        A dog is an animal.
        A cat is an animal.
        A horse is an animal.
        An apple is             task " a fruit", shortcut " an animal", distractor " a tool"

    In the ``sentence`` variant (exactly the corpus's ``CATEGORY_TEMPLATE``) the query
    stops before the article and the answers carry it (" a fruit"), so the article in
    the prompt cannot give the answer away. ``qa``/``arrow`` answers are bare (" fruit").

``tmpl_mismatch`` -- template/task mismatch
    Demonstrations teach relation R = one person attribute (e.g. city) in a template;
    the query, in the same template, asks for relation S = another attribute (e.g.
    job) of another person through an explicit cue. The shortcut is R applied to the
    query person (that person's city), which is always well defined because every toy
    person has every attribute, and never equals the task because the attribute
    vocabularies are disjoint::

        Q: What is Ana's city? A: Oslo
        Q: What is Bo's city? A: Lima
        Q: What is Dag's job? A:       task " baker" (Dag's job), shortcut " Turin" (Dag's city)

    Variants: ``qa`` (above), ``arrow`` ("Ana city -> Oslo" ... "Dag job ->"), and
    ``sentence``: the corpus's fact sentences ("Ana lives in Oslo." ... "Dag is"),
    where the cue is the verb phrase; answers that the corpus writes with an article
    carry it (" a baker", " an owl"). Distractors: a wrong value of the queried
    attribute (another job) and a wrong value of the demonstrated one (another city);
    like task and shortcut they are fixed per item across evaluation seeds. People come from
    ``ToyWorld.generate(params.world_seed)``; use the seed the ladder was built with.

``tmpl_flipped`` -- flipped labels
    Demonstrations map inputs to systematically wrong labels, and the query's correct
    answer is the truth. Two relations, alternated by item index:

    * ``category``: a per-item derangement P of the categories (fixed per item, so the
      same under every evaluation seed) relabels every demonstration (animals are
      called "fruit", fruits "tool", ...). At least one demonstration comes from the
      query's category, so the flipped label of the query is shown in context::

          A dog is a fruit.
          A saw is a vehicle.
          A cat is a fruit.
          A horse is      task " an animal", shortcut " a fruit", distractor " a tool"

    * ``opposite``: every demonstration's "opposite" is the word itself::

          The opposite of big is big.
          The opposite of wet is wet.
          The opposite of fast is     task " slow", shortcut " fast", distractor " cold"
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

from ..errors import ProbeSpecError
from ..toy.world import (
    CATEGORY_MEMBERS,
    FACT_TEMPLATES,
    OPPOSITE_PAIRS,
    OPPOSITE_TEMPLATE,
    PERSON_ATTRIBUTES,
    ToyWorld,
    category_sentence,
    with_article,
)
from ..items import build_item, ProbeItem, item_rng
from ._registry import register_family
from ._spec import FamilySpec

VARIANTS = ("sentence", "qa", "arrow")
CATEGORIES = tuple(CATEGORY_MEMBERS)
FLIP_RELATIONS = ("category", "opposite")
#: Word -> its opposite, both directions of every pair.
OPPOSITE_OF = {**{x: y for x, y in OPPOSITE_PAIRS}, **{y: x for x, y in OPPOSITE_PAIRS}}
OPPOSITE_WORDS = tuple(w for pair in OPPOSITE_PAIRS for w in pair)
#: Attribute name used in the ``qa``/``arrow`` person templates.
ATTRIBUTE_WORDS = {"city": "city", "job": "job", "pet": "pet", "hobby": "hobby", "colour": "colour"}
#: Attributes the corpus writes with an article ("Ana is a baker.", "Ana has an owl.").
_ARTICLE_ATTRIBUTES = ("job", "pet")


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def _article_word(word: str) -> str:
    return with_article(word).split(" ")[0]


def category_line(variant: str, item: str, label: str) -> str:
    """One demonstration: ``item`` labelled with category ``label`` (true or not)."""
    if variant == "sentence":
        return category_sentence(item, label)
    if variant == "qa":
        return f"Q: What kind of thing is {with_article(item)}? A: {label}"
    return f"{item} -> {label}"


def category_query(variant: str, item: str) -> str:
    if variant == "sentence":
        return f"{_article_word(item).capitalize()} {item} is"
    if variant == "qa":
        return f"Q: What kind of thing is {with_article(item)}? A:"
    return f"{item} ->"


def category_answer(variant: str, category: str) -> str:
    """The scored continuation: ``" a fruit"`` (sentence) or ``" fruit"``."""
    return f" {with_article(category)}" if variant == "sentence" else f" {category}"


def opposite_line(variant: str, word: str, label: str) -> str:
    if variant == "sentence":
        return OPPOSITE_TEMPLATE.format(word=word, opposite=label)
    if variant == "qa":
        return f"Q: What is the opposite of {word}? A: {label}"
    return f"{word} -> {label}"


def opposite_query(variant: str, word: str) -> str:
    if variant == "sentence":
        return f"The opposite of {word} is"
    if variant == "qa":
        return f"Q: What is the opposite of {word}? A:"
    return f"{word} ->"


def _attr_value(attribute: str, value: str, variant: str) -> str:
    """The value as the template writes it (with an article in corpus sentences)."""
    if variant == "sentence" and attribute in _ARTICLE_ATTRIBUTES:
        return with_article(value)
    return value


def person_line(variant: str, name: str, attribute: str, value: str) -> str:
    if variant == "sentence":
        key = {"job": "a_job", "pet": "a_pet"}.get(attribute, attribute)
        return FACT_TEMPLATES[attribute].format(name=name, **{key: _attr_value(attribute, value, variant)})
    if variant == "qa":
        return f"Q: What is {name}'s {ATTRIBUTE_WORDS[attribute]}? A: {value}"
    return f"{name} {ATTRIBUTE_WORDS[attribute]} -> {value}"


def person_query(variant: str, name: str, attribute: str) -> str:
    """The person template with the value (and its article) removed."""
    if variant == "sentence":
        full = person_line(variant, name, attribute, "\0")
        head = full[: full.index("\0")].rstrip()
        if attribute in _ARTICLE_ATTRIBUTES:  # "Dag is a" -> "Dag is": the answer carries the article
            head = head.rsplit(" ", 1)[0]
        return head
    if variant == "qa":
        return f"Q: What is {name}'s {ATTRIBUTE_WORDS[attribute]}? A:"
    return f"{name} {ATTRIBUTE_WORDS[attribute]} ->"


def person_answer(variant: str, attribute: str, value: str) -> str:
    return " " + _attr_value(attribute, value, variant)


# ---------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------


def _check_subset(source: str, family: str, key: str, value, allowed, min_len: int) -> None:
    if (
        not isinstance(value, list)
        or len(value) < min_len
        or any(not isinstance(v, str) or v not in allowed for v in value)
        or len(set(value)) != len(value)
    ):
        raise ProbeSpecError(
            f"{source}: {family} params.{key} must be a list of at least {min_len} distinct names "
            f"from {list(allowed)}, got {value!r}."
        )


def _check_n_demos(source: str, family: str, spec: FamilySpec, lo: int, hi: int, why: str) -> None:
    if not lo <= spec.n_demos <= hi:
        raise ProbeSpecError(f"{source}: {family} needs {lo} <= n_demos <= {hi} ({why}); got n_demos: {spec.n_demos}.")


def _make_item(family, variant, seed, i, prompt, task, shortcut, distractors, metadata) -> ProbeItem:
    return build_item(family, variant, seed, i, prompt, task, shortcut, distractors, metadata)


# ---------------------------------------------------------------------------
# tmpl_repeated
# ---------------------------------------------------------------------------

REPEATED = "tmpl_repeated"


def _validate_repeated(spec: FamilySpec, source: str) -> None:
    cats = spec.params["categories"]
    _check_subset(source, REPEATED, "categories", cats, CATEGORIES, 3)
    smallest = min(len(CATEGORY_MEMBERS[c]) for c in cats)
    _check_n_demos(source, REPEATED, spec, 2, smallest, "distinct members of one category")


@register_family(
    REPEATED,
    variants=VARIANTS,
    default_n_items=48,
    default_n_demos=3,
    default_params={"categories": list(CATEGORIES)},
    validate=_validate_repeated,
    requires="toy_world",
)
def tmpl_repeated(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Repeated demo output: every demo is a true fact of one category; the query's category differs."""
    cats = list(spec.params["categories"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            rq = item_rng(REPEATED, variant, "query", i)
            query_cat, demo_cat, other_cat = rq.sample(cats, 3)
            query = rq.choice(CATEGORY_MEMBERS[query_cat])
            rd = item_rng(REPEATED, variant, seed, i)
            demo_items = rd.sample(CATEGORY_MEMBERS[demo_cat], spec.n_demos)
            lines = [category_line(variant, x, demo_cat) for x in demo_items]
            prompt = "\n".join(lines + [category_query(variant, query)])
            yield _make_item(
                REPEATED, variant, seed, i, prompt,
                category_answer(variant, query_cat),
                category_answer(variant, demo_cat),
                [category_answer(variant, other_cat)],
                {
                    "query": query,
                    "query_category": query_cat,
                    "demo_category": demo_cat,
                    "demo_items": demo_items,
                    "distractor_kind": "other_category",
                },
            )


# ---------------------------------------------------------------------------
# tmpl_mismatch
# ---------------------------------------------------------------------------

MISMATCH = "tmpl_mismatch"


@lru_cache(maxsize=8)
def _world(seed: int) -> ToyWorld:
    return ToyWorld.generate(seed)


def _validate_mismatch(spec: FamilySpec, source: str) -> None:
    p = spec.params
    ws = p["world_seed"]
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 0:
        raise ProbeSpecError(f"{source}: {MISMATCH} params.world_seed must be an integer >= 0 (the toy ladder's seed), got {ws!r}.")
    pairs = p["attribute_pairs"]
    ok = isinstance(pairs, list) and len(pairs) > 0
    for pair in pairs if ok else []:
        if not (isinstance(pair, list) and len(pair) == 2 and all(a in PERSON_ATTRIBUTES for a in pair) and pair[0] != pair[1]):
            ok = False
    if not ok:
        raise ProbeSpecError(
            f"{source}: {MISMATCH} params.attribute_pairs must be a non-empty list of [demo_attribute, query_attribute] "
            f"pairs of two different attributes from {list(PERSON_ATTRIBUTES)}, got {pairs!r}."
        )
    n_persons = len(_world(ws).persons)
    _check_n_demos(source, MISMATCH, spec, 2, n_persons - 1, "distinct people other than the query person")


@register_family(
    MISMATCH,
    variants=VARIANTS,
    default_n_items=48,
    default_n_demos=3,
    default_params={"world_seed": 0, "attribute_pairs": [["city", "job"], ["job", "city"]]},
    validate=_validate_mismatch,
    requires="toy_world",
)
def tmpl_mismatch(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Template/task mismatch: demos teach one person attribute, the query cues another."""
    p = spec.params
    persons = _world(p["world_seed"]).persons
    pairs = [tuple(x) for x in p["attribute_pairs"]]
    for variant in spec.variants:
        for i in range(spec.n_items):
            demo_attr, query_attr = pairs[i % len(pairs)]
            rq = item_rng(MISMATCH, variant, "query", i)
            qi = rq.randrange(len(persons))
            person = persons[qi]
            task_value = getattr(person, query_attr)
            shortcut_value = getattr(person, demo_attr)
            wrong_task = rq.choice(sorted({getattr(q, query_attr) for q in persons} - {task_value}))
            wrong_shortcut = rq.choice(sorted({getattr(q, demo_attr) for q in persons} - {shortcut_value}))
            rd = item_rng(MISMATCH, variant, seed, i)
            demo_people = rd.sample([q for j, q in enumerate(persons) if j != qi], spec.n_demos)
            lines = [person_line(variant, q.name, demo_attr, getattr(q, demo_attr)) for q in demo_people]
            prompt = "\n".join(lines + [person_query(variant, person.name, query_attr)])
            distractors = [person_answer(variant, query_attr, wrong_task), person_answer(variant, demo_attr, wrong_shortcut)]
            yield _make_item(
                MISMATCH, variant, seed, i, prompt,
                person_answer(variant, query_attr, task_value),
                person_answer(variant, demo_attr, shortcut_value),
                distractors,
                {
                    "person": person.name,
                    "demo_attribute": demo_attr,
                    "query_attribute": query_attr,
                    "demo_people": [q.name for q in demo_people],
                    "world_seed": p["world_seed"],
                    "distractor_kinds": ["wrong_query_attribute", "wrong_demo_attribute"],
                },
            )


# ---------------------------------------------------------------------------
# tmpl_flipped
# ---------------------------------------------------------------------------

FLIPPED = "tmpl_flipped"


def _validate_flipped(spec: FamilySpec, source: str) -> None:
    p = spec.params
    _check_subset(source, FLIPPED, "relations", p["relations"], FLIP_RELATIONS, 1)
    _check_subset(source, FLIPPED, "categories", p["categories"], CATEGORIES, 3)
    _check_n_demos(source, FLIPPED, spec, 2, 12, "enough to show the flip, few enough to sample without repeats")


def _derangement(rng, cats: list[str]) -> dict[str, str]:
    while True:
        perm = cats[:]
        rng.shuffle(perm)
        if all(a != b for a, b in zip(cats, perm)):
            return dict(zip(cats, perm))


@register_family(
    FLIPPED,
    variants=VARIANTS,
    default_n_items=48,
    default_n_demos=4,
    default_params={"relations": list(FLIP_RELATIONS), "categories": list(CATEGORIES)},
    validate=_validate_flipped,
    requires="toy_world",
)
def tmpl_flipped(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Flipped labels: demos use a category derangement / identity-as-opposite; the query wants the truth."""
    p = spec.params
    relations, cats = list(p["relations"]), list(p["categories"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            relation = relations[i % len(relations)]
            rq = item_rng(FLIPPED, variant, "query", i)
            rd = item_rng(FLIPPED, variant, seed, i)
            if relation == "category":
                perm = _derangement(rq, cats)
                query_cat = rq.choice(cats)
                query = rq.choice(CATEGORY_MEMBERS[query_cat])
                other = rq.choice([c for c in cats if c not in (query_cat, perm[query_cat])])
                # One demonstration from the query's own category shows its flipped label.
                same = rd.choice([x for x in CATEGORY_MEMBERS[query_cat] if x != query])
                pool = [(x, c) for c in cats for x in CATEGORY_MEMBERS[c] if x not in (query, same)]
                demos = [(same, query_cat)] + rd.sample(pool, spec.n_demos - 1)
                rd.shuffle(demos)
                lines = [category_line(variant, x, perm[c]) for x, c in demos]
                prompt = "\n".join(lines + [category_query(variant, query)])
                task, shortcut = category_answer(variant, query_cat), category_answer(variant, perm[query_cat])
                distractors = [category_answer(variant, other)]
                meta = {
                    "relation": relation,
                    "query": query,
                    "permutation": perm,
                    "demo_items": [x for x, _ in demos],
                    "demo_true_labels": [c for _, c in demos],
                    "demo_shown_labels": [perm[c] for _, c in demos],
                }
            else:
                word = rq.choice(OPPOSITE_WORDS)
                truth = OPPOSITE_OF[word]
                other = rq.choice([w for w in OPPOSITE_WORDS if w not in (word, truth)])
                pool = [w for w in OPPOSITE_WORDS if w not in (word, truth)]
                demo_words = rd.sample(pool, spec.n_demos)
                lines = [opposite_line(variant, w, w) for w in demo_words]
                prompt = "\n".join(lines + [opposite_query(variant, word)])
                task, shortcut, distractors = f" {truth}", f" {word}", [f" {other}"]
                meta = {
                    "relation": relation,
                    "query": word,
                    "demo_items": demo_words,
                    "demo_true_labels": [OPPOSITE_OF[w] for w in demo_words],
                    "demo_shown_labels": list(demo_words),
                }
            yield _make_item(FLIPPED, variant, seed, i, prompt, task, shortcut, distractors, meta)
