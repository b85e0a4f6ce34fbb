"""Persona QA: answer as the described persona, not as a demonstration persona.

Each prompt shows ``n_demos`` demonstration personas, each a description followed by its
first-person answer to one question, then the query persona's description and the same
question with the answer left open. The task is the query persona's attribute; the
shortcut is copying the answer of a demonstration persona (the last one, which sits right
before the query). In the toy corpus's persona-block format (variant ``block``)::

    Gus is a judge from Lima. He has a goat. He likes hiking. His favourite colour is red.
    Q: Where do you live? A: I live in Lima.

    Nora is a baker from Oslo. She has a cat. She likes chess. Her favourite colour is blue.
    Q: Where do you live? A: I live in Oslo.

    Ana is a pilot from Riga. She has an owl. She likes reading. Her favourite colour is pink.
    Q: Where do you live? A:

task ``" I live in Riga."``, shortcut ``" I live in Oslo."``, distractor
``" I live in Lima."``. Every demonstration persona's value of the asked attribute differs
from the query persona's and from each other's; all of them are listed in
``metadata["shortcut_answers"]`` (generations copying any demonstration count as shortcut).

Personas are fictitious combinations of the toy world's vocabularies (the answer is in the
prompt, so they need not be the world's people). Every toy world gives every value of these
vocabularies to at least one of its people (``ToyWorld.generate``), so every answer word is
in the pretraining corpus of whichever world the ladder was built from
(tests/toy/test_vocabulary.py). Item ``i`` asks question
``questions[i % len(questions)]`` about persona ``i // len(questions)``; the query persona
depends only on (family, variant, "query", persona index), the demonstrations are
resampled per evaluation seed from (family, variant, seed, i).

The spec's ``params`` also carry the generation settings used for generation-based
consistency (``gen_samples``, ``gen_temperature``, ``gen_max_new_tokens``).
"""

from __future__ import annotations

import numbers
import random
from dataclasses import asdict
from typing import Iterator

from ..errors import ProbeSpecError
from ..toy.world import (
    ATTRIBUTE_VOCAB,
    FEMALE_NAMES,
    MALE_NAMES,
    PERSON_ATTRIBUTES,
    PERSONA_BLOCK_SEPARATOR,
    PERSONA_QUESTIONS,
    Person,
)
from ..items import ProbeItem, item_rng
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "persona_qa"

#: Question types, in the toy world's canonical attribute order.
QUESTIONS: tuple[str, ...] = tuple(PERSON_ATTRIBUTES)
_NAMES: tuple[tuple[str, str], ...] = tuple((n, "she") for n in FEMALE_NAMES) + tuple((n, "he") for n in MALE_NAMES)

#: Prompt-format variants: how one persona block (description, question, answer) is
#: rendered; blocks are joined by the corpus's blank-line separator. The query block
#: leaves ``{answer}`` empty and ends right after the answer label.
BLOCK_TEMPLATES: dict[str, str] = {
    # exactly the toy corpus's persona block (description line, then a QA line)
    "block": "{description}\nQ: {question} A: {answer}",
    # the description behind a "Persona:" label
    "persona_label": "Persona: {description}\nQ: {question} A: {answer}",
    # question and answer on their own labelled lines
    "qa_labels": "{description}\nQuestion: {question}\nAnswer: {answer}",
}
VARIANTS: tuple[str, ...] = tuple(BLOCK_TEMPLATES)

DEFAULT_PARAMS = {
    "questions": list(QUESTIONS),
    "gen_samples": 200,
    "gen_temperature": 1.0,
    "gen_max_new_tokens": 16,
}


def render_block(variant: str, person: Person, question: str, answer: bool = True) -> str:
    """One persona block; ``answer=False`` gives the query block ending at the answer label."""
    text = BLOCK_TEMPLATES[variant].format(
        description=person.description(),
        question=PERSONA_QUESTIONS[question],
        answer=person.persona_answer(question) if answer else "",
    )
    return text.rstrip()


def _sample_person(rng: random.Random, *, avoid_names: set[str], attribute: str | None = None,
                   avoid_values: set[str] = frozenset()) -> Person:
    name, pronoun = rng.choice([np for np in _NAMES if np[0] not in avoid_names])
    values = {}
    for k in QUESTIONS:  # fixed order: the stream is reproducible
        pool = ATTRIBUTE_VOCAB[k]
        if k == attribute:
            pool = [v for v in pool if v not in avoid_values]
        values[k] = rng.choice(pool)
    return Person(name=name, pronoun=pronoun, **values)


def _is_int(x, lo: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def _validate(spec: FamilySpec, source: str) -> None:
    p = spec.params
    qs = p["questions"]
    if isinstance(qs, str) or not isinstance(qs, (list, tuple)) or not qs:
        raise ProbeSpecError(f"{source}: params.questions must be a non-empty list, a subset of {list(QUESTIONS)}.")
    bad = [q for q in qs if q not in QUESTIONS]
    if bad:
        raise ProbeSpecError(f"{source}: params.questions has unknown question type(s) {bad}; choose from {list(QUESTIONS)}.")
    if len(set(qs)) != len(qs):
        raise ProbeSpecError(f"{source}: params.questions lists a question type twice: {list(qs)}.")
    max_demos = min(len(ATTRIBUTE_VOCAB[q]) for q in qs) - 1
    if not 1 <= spec.n_demos <= max_demos:
        raise ProbeSpecError(
            f"{source}: {FAMILY} needs 1 <= n_demos <= {max_demos} (each demonstration persona needs its own "
            f"value of the asked attribute, different from the query's), got {spec.n_demos}."
        )
    if not _is_int(p["gen_samples"], 1):
        raise ProbeSpecError(f"{source}: params.gen_samples must be an integer >= 1, got {p['gen_samples']!r}.")
    if not _is_int(p["gen_max_new_tokens"], 1):
        raise ProbeSpecError(f"{source}: params.gen_max_new_tokens must be an integer >= 1, got {p['gen_max_new_tokens']!r}.")
    t = p["gen_temperature"]
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t >= 0:
        raise ProbeSpecError(f"{source}: params.gen_temperature must be a number >= 0 (0 = greedy), got {t!r}.")


@register_family(
    FAMILY,
    variants=VARIANTS,
    default_n_items=60,
    default_n_demos=3,
    default_params=DEFAULT_PARAMS,
    validate=_validate,
    kind="conflict",
    requires="toy_world",
)
def persona_qa(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Persona QA: answer as the described persona, not as the demonstration personas."""
    questions = list(spec.params["questions"])
    for variant in spec.variants:
        for i in range(spec.n_items):
            persona_index, q = divmod(i, len(questions))
            question = questions[q]
            query = _sample_person(item_rng(FAMILY, variant, "query", persona_index), avoid_names=set())
            rd = item_rng(FAMILY, variant, seed, i)
            demos: list[Person] = []
            used_values = {getattr(query, question)}
            used_names = {query.name}
            for _ in range(spec.n_demos):
                d = _sample_person(rd, avoid_names=used_names, attribute=question, avoid_values=used_values)
                demos.append(d)
                used_values.add(getattr(d, question))
                used_names.add(d.name)
            blocks = [render_block(variant, d, question) for d in demos]
            blocks.append(render_block(variant, query, question, answer=False))
            prompt = PERSONA_BLOCK_SEPARATOR.join(blocks)
            task = " " + query.persona_answer(question)
            demo_answers = [" " + d.persona_answer(question) for d in demos]
            shortcut = demo_answers[-1]
            yield ProbeItem(
                item_id=f"{FAMILY}/{variant}/{i:04d}",
                family=FAMILY,
                variant=variant,
                seed=seed,
                prompt=prompt,
                task_answer=task,
                shortcut_answer=shortcut,
                candidates=(task, shortcut, *demo_answers[:-1]),
                metadata={
                    "question": question,
                    "persona_index": persona_index,
                    "query_persona": asdict(query),
                    "query_value": getattr(query, question),
                    "demo_names": [d.name for d in demos],
                    "demo_values": [getattr(d, question) for d in demos],
                    "shortcut_answers": demo_answers,
                },
            )
