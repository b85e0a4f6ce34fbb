"""``real_persona``: a coherent persona vs disconnected facts (GDsuite's Multi-hop Persona
QA), with fictional people whose facts are all given in context.

The prompt is the persona's whole fact pool as first-person question/answer blocks
(shuffled per evaluation seed, as GDsuite shuffles its fact pool), then a question whose
answer needs two hops (who is my sister -> where does she live). The task is the
two-hop answer; the shortcut the same relation of the persona itself (a disconnected
one-hop fact: where *I* live); the distractor the same relation of the other related
person::

    Q: Where do you live?
    A: I live in Ketterby.

    Q: Do you have any siblings?
    A: Yes, I have a sister called Mira.

    Q: Where does Mira live?
    A: Mira lives in Ashcombe.
    ...
    Q: In which town does your sister live?
    A: My sister lives in          task " Ashcombe", shortcut " Ketterby"

People are generated from invented names and towns (``data/real/persona.json``):
persona ``p`` depends only on ``p``; each asks four two-hop questions (sibling's town,
sibling's job, best friend's town, best friend's job), so ``n_items`` = 4 x personas.
Formats: ``qa`` (GDsuite's "Q: ...\\nA: ..." blocks) and ``interview`` ("Interviewer:
...\\nMe: ..."). ``params.gen_samples`` > 0 also samples generations (probeselect's
generation-based consistency; answers stop at the first newline).
"""

from __future__ import annotations

import numbers
import random
from typing import Iterator

from ..errors import ProbeSpecError
from ._demos import STRATEGIES, build_icl_prompt, demo_block
from ..items import ProbeItem, item_rng
from ._real import check_boundary, check_int, load_data, make_item, selected
from ._registry import register_family
from ._spec import FamilySpec

FAMILY = "real_persona"
FORMATS = ("qa", "interview")
QUESTIONS = ("sibling_town", "sibling_job", "friend_town", "friend_job")


def _a(job: str) -> str:
    return ("an " if job[0] in "aeiou" else "a ") + job


def make_persona(p: int) -> dict:
    """Persona ``p``: distinct names, towns and jobs for the persona, a sibling and a friend."""
    d = load_data("persona.json")
    r = item_rng(FAMILY, "persona", p)
    fem = r.random() < 0.5
    sib_fem = r.random() < 0.5
    names = [n for n in d["female_names"] + d["male_names"]]
    name = r.choice(d["female_names"] if fem else d["male_names"])
    sib = r.choice([n for n in (d["female_names"] if sib_fem else d["male_names"]) if n != name])
    friend = r.choice([n for n in names if n not in (name, sib)])
    towns = r.sample(d["towns"], 3)
    jobs = r.sample(d["jobs"], 3)
    return {"name": name, "town": towns[0], "job": jobs[0], "rel": "sister" if sib_fem else "brother",
            "sib": sib, "sib_town": towns[1], "sib_job": jobs[1], "friend": friend, "friend_town": towns[2],
            "friend_job": jobs[2], "pet": r.choice(d["pets"]), "pet_name": r.choice(d["pet_names"])}


def facts(pp: dict) -> list[tuple[str, str]]:
    """The persona's fact pool as (question, first-person answer)."""
    return [
        ("What is your name?", f"My name is {pp['name']}."),
        ("Where do you live?", f"I live in {pp['town']}."),
        ("What do you do for work?", f"I work as {_a(pp['job'])}."),
        ("Do you have any siblings?", f"Yes, I have a {pp['rel']} called {pp['sib']}."),
        (f"Where does {pp['sib']} live?", f"{pp['sib']} lives in {pp['sib_town']}."),
        (f"What does {pp['sib']} do for work?", f"{pp['sib']} works as {_a(pp['sib_job'])}."),
        ("Who is your best friend?", f"My best friend is {pp['friend']}."),
        (f"Where does {pp['friend']} live?", f"{pp['friend']} lives in {pp['friend_town']}."),
        (f"What does {pp['friend']} do for work?", f"{pp['friend']} works as {_a(pp['friend_job'])}."),
        ("Do you have a pet?", f"Yes, I have a {pp['pet']} called {pp['pet_name']}."),
    ]


def question(pp: dict, q: str) -> tuple[str, str, str, str, str]:
    """(question, answer stem, task, shortcut, distractor) of a two-hop question."""
    rel = pp["rel"]
    if q == "sibling_town":
        return f"In which town does your {rel} live?", f"My {rel} lives in", pp["sib_town"], pp["town"], pp["friend_town"]
    if q == "sibling_job":
        return (f"What does your {rel} do for work?", f"My {rel} works as", _a(pp["sib_job"]), _a(pp["job"]),
                _a(pp["friend_job"]))
    if q == "friend_town":
        return "In which town does your best friend live?", "My best friend lives in", pp["friend_town"], pp["town"], \
            pp["sib_town"]
    return ("What does your best friend do for work?", "My best friend works as", _a(pp["friend_job"]), _a(pp["job"]),
            _a(pp["sib_job"]))


def _block(fmt: str, q: str) -> str:
    return f"Q: {q}\nA:" if fmt == "qa" else f"Interviewer: {q}\nMe:"


def _validate(spec: FamilySpec, source: str) -> None:
    check_int(source, FAMILY, "n_items", spec.n_items, 1, 400)
    check_boundary(spec, source)
    p = spec.params
    if not (isinstance(p["gen_samples"], int) and not isinstance(p["gen_samples"], bool) and p["gen_samples"] >= 0):
        raise ProbeSpecError(f"{source}: params.gen_samples must be an integer >= 0 (0 = no sampling).")
    check_int(source, FAMILY, "params.gen_max_new_tokens", p["gen_max_new_tokens"], 1)
    t = p["gen_temperature"]
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t >= 0:
        raise ProbeSpecError(f"{source}: params.gen_temperature must be a number >= 0, got {t!r}.")


@register_family(
    FAMILY,
    variants=tuple(f"multihop.{f}" for f in FORMATS),
    default_n_items=60,
    default_n_demos=10,
    default_params={"boundary": "lmeval", "gen_samples": 0, "gen_temperature": 1.0, "gen_max_new_tokens": 8},
    validate=_validate,
)
def real_persona(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Multi-hop persona QA: fictional facts in context; the two-hop answer vs the persona's own fact."""
    for variant, _task, fmt in selected(spec):
        for i in range(spec.n_items):
            p, qi = divmod(i, len(QUESTIONS))
            pp = make_persona(p)
            own = {"town": "Where do you live?", "job": "What do you do for work?"}[QUESTIONS[qi].split("_")[1]]
            # plain (capability twin real_persona_plain): the persona's own fact of the asked relation, the
            # tempting one-hop answer, is left out of the pool; the two-hop question stays
            pool = [{"prompt": _block(fmt, q), "answer": a} for q, a in facts(pp)
                    if not (spec.params.get("plain") and q == own)]
            # GDsuite feeds the full fact pool, shuffled per seed: a random sample of all of it
            rng = random.Random(item_rng(FAMILY, variant, seed, p).getrandbits(64))
            shown = STRATEGIES["random"](pool, len(pool), rng)
            q, stem, task, short, other = question(pp, QUESTIONS[qi])
            prompt = build_icl_prompt([demo_block(d) for d in shown], f"{_block(fmt, q)} {stem}", "\n\n")
            yield make_item(spec, variant, seed, i, prompt, task, short, [other],
                            {"task": "multihop", "format": fmt, "question": QUESTIONS[qi], "persona": pp["name"],
                             "shortcut_answers": [" " + short]})
