"""Toy post-training / evaluation data derived from a :class:`~probeselect.toy.world.ToyWorld`.

Written by :func:`write_toy_data` under ``<ladder>/data/``:

* ``sft.jsonl`` -- instruction SFT rows ``{"id", "kind", "prompt", "response"}``;
* ``sft_heldout.jsonl`` -- held-out SFT rows, same format as ``sft.jsonl`` (ids
  ``sft_heldout-<kind>-NNNN``), of the SFT kinds that have unused questions
  (:data:`SFT_HELDOUT_KINDS`, arithmetic on training triples that ``sft.jsonl`` does not
  use); no prompt is identical to an SFT prompt. For held-out SFT loss;
* ``transfer.jsonl`` -- same row format plus ``"split": "transfer"``, only kinds
  absent from the SFT set (:data:`TRANSFER_KINDS`);
* ``robustness.jsonl`` -- prefill-attack analogue items
  ``{"id", "kind", "prompt", "prefill", "answer", "misleading"}``: the response is
  prefilled with a wrong answer and a fresh answer cue (:data:`ROBUST_PREFILL_TEMPLATE`),
  and the model is scored on whether its continuation recovers to ``answer``
  (:func:`probeselect.transfer.recovered`);
* ``heldout.txt`` -- plain text in the world's style, one item per line, with no
  line identical to any line of the pretraining corpus (for bits-per-byte);
* ``README.md`` -- a description of these files.

Everything is deterministic in the world seed (separate RNG streams per file).
"""

import json
import os
import re
from pathlib import Path

from .curriculum import SFT_OPTIONS
from .world import (
    ARITH_TEMPLATES,
    CATEGORY_MEMBERS,
    CITIES,
    OPPOSITE_PAIRS,
    PERSON_ATTRIBUTES,
    PERSONA_QUESTIONS,
    SEQUENCE_KINDS,
    TELL_QUESTIONS,
    ToyWorld,
    format_arith,
    format_sequence,
    line_subject,
    make_sequence,
    rng_for,
    with_article,
)

#: Instruction prompt format: the question line of the pretraining corpus's own QA format
#: (``"Q: What is 12 + 5? A: 17"``, persona blocks' ``"Q: Where do you live? A: ..."``), after
#: the question's context lines if it has any. The response is ``" " + answer`` (leading space;
#: the SFT trainer appends EOS). (An earlier ``"### Question: ...\n### Answer:"`` format, absent
#: from pretraining, left the pilot's LoRA SFT at a few percent accuracy on plain arithmetic.)
SFT_PROMPT_TEMPLATE = "Q: {question} A:"
#: Question templates per kind (placeholders from Person.fields() / arithmetic). Lines before
#: the last are context (kept as they are); the last line is the question.
#: ``{demos}`` is a block of solved arithmetic lines (``"a + b = c"``, one per line).
SFT_QUESTION_TEMPLATES = {
    "addition": "What is {a} + {b}?",
    "subtraction": "What is {a} - {b}?",
    "opposite": "What is the opposite of {word}?",
    "person_city": "Where does {name} live?",
    "person_job": "What is {name}'s job?",
    "fewshot_arith": "{demos}\nWhat is {a} {op} {b}?",
    "persona_city": "{description}\nWhere do you live?",
    "persona_job": "{description}\nWhat is your job?",
    "persona_pet": "{description}\nWhat pet do you have?",
    # transfer-only kinds
    "category": "What kind of thing is {a_item}?",
    "persona": "{description}\n{question}",
    "persona_pair": "{block}\n{description}\n{question}",
    "persona_copy": "{block}\n{description}\n{question}",
    "fewshot_pattern": "{demos}\nWhat is {a} {op} {b}?",
    # issue 22: arrow-format arithmetic and "Tell me ..." persona questions, a surface form that neither
    # the shortlisting probes nor the pretraining documents use
    "arrow_arith": "{demos}\nCompute {a} {op} {b}.",
    "arrow_pattern": "{demos}\nCompute {a} {op} {b}.",
    "persona_tell_pair": "{block}\n{description}\n{question}",
    "persona_tell_copy": "{block}\n{description}\n{question}",
}
#: The solved-line format of ``arrow_arith`` / ``arrow_pattern``: ``"24 + 3 -> 27"``. Neither the
#: pretraining corpus (``eq`` / ``qa`` / ``words`` of :data:`~probeselect.toy.world.ARITH_TEMPLATES`)
#: nor the ``arith_pattern`` probe (the same three) writes arithmetic this way.
ARROW_LINE = "{a} {op} {b} -> {c}"
#: Persona questions phrased as requests (``persona_tell_pair`` / ``persona_tell_copy``); the corpus
#: and the ``persona_qa`` probe ask :data:`~probeselect.toy.world.PERSONA_QUESTIONS` ("Where do you
#: live?"). The answers are the same first-person sentences. (``TELL_QUESTIONS`` is defined in
#: :mod:`.world`, where the negative control's ``wrong_persona_tell`` documents use it too.)
#: Kinds in ``sft.jsonl``. Every answer format of the transfer suite is taught here: bare
#: words and numbers (arithmetic, opposites, person facts), an arithmetic question after a
#: block of solved lines (``fewshot_arith``) and first-person sentences about a described
#: persona (``persona_city``, ``persona_job``, ``persona_pet``), also after another persona's
#: block whose shown QA line is about a different attribute (``persona_pair``).
SFT_KINDS = ("addition", "subtraction", "opposite", "person_city", "person_job", "fewshot_arith", "persona_city",
             "persona_job", "persona_pet", "persona_pair", "arrow_arith", "persona_tell_pair")
#: Kinds of ``transfer.jsonl`` before issue 22 (disjoint from :data:`SFT_KINDS`):
#:
#: * ``fewshot_pattern`` -- the held-out task where the shortcut competes with the task: the
#:   ``fewshot_arith`` format, but the solved lines show answers that follow a pattern
#:   (constant, counting, alternating; :data:`PATTERNS`) instead of the true sums, and the
#:   question has an operand >= :data:`ROBUST_MIN_LARGE_OPERAND` (never a probe query). The
#:   correct answer is the calculation; a base that continues patterns answers the
#:   pattern's next value (``shortcut`` field). SFT only ever showed correct solved lines.
#: * ``persona_copy`` -- the ``persona_pair`` format, but the first persona's shown QA line
#:   answers the *same* question (hobby or colour, attributes SFT never asks) with its own,
#:   different value: answering as the second persona competes with copying the first
#:   persona's answer (the ``copied personas`` shortcut; ``shortcut`` field).
#:
#: The earlier third-person pet / hobby / colour questions ("What pet does Ana have?") needed
#: a question-answering skill that no base had, "What comes next: 2, 4, 6?" a prompt format SFT
#: never showed (0-3% accuracy after SFT for every base), and single-persona first-person
#: questions were answered correctly by every base before any SFT; all three are gone.
#:
#: Issue 22: both kinds above put the *probe* in another wrapper: ``fewshot_pattern`` uses the
#: three patterns of the ``arith_pattern`` probe, cycled the same way, its ``eq`` lines as
#: demonstrations and its ``qa`` query; ``persona_copy`` shows the ``persona_qa`` probe's QA lines.
#: They are no longer in the suite (their generators stay, :data:`PROBE_FORM_KINDS`); the suite is
#: now
#:
#: * ``arrow_pattern`` -- solved lines in the arrow format (:data:`ARROW_LINE`, taught by the SFT
#:   kind ``arrow_arith`` with true results, never seen in pretraining or in a probe) whose shown
#:   results follow patterns no probe uses (:data:`ARROW_PATTERNS`: counting down, copying the
#:   line's first operand, doubling), then ``"Compute a op b."`` with an operand >=
#:   :data:`ROBUST_MIN_LARGE_OPERAND` (the probes draw 0..20). The shortcut (the pattern's next
#:   value) is never the answer.
#: * ``persona_tell_copy`` -- persona A's description and its answered request about hobby or
#:   colour in the request phrasing (:data:`TELL_QUESTIONS`), then persona B's description and the
#:   same request: answering as B competes with copying A's answer. ``persona_tell_pair`` teaches
#:   the request phrasing and the first-person answer (with its end) for every attribute, hobby and
#:   colour included, but always after A's answer to a *different* request: the copy conflict is
#:   what is new. (Until 2026-12-04 the SFT asked only city / job / pet; then the 6-token colour
#:   answer was longer than any SFT response and in no taught format, and whether a run ended it
#:   early or answered in a taught format was a lottery over SFT seeds: on the late-harm ladders of
#:   bench/late_harm_notes.md the colour items' accuracy had an SFT-seed sd of 0.21 within a base,
#:   more than the 0.15 between bases.)
#:
#: What stays shared with the probes: the ``Q: ... A:`` prompt markers (the SFT prompt format), the
#: persona description sentences and the world's facts (names, cities, hobbies, colours) and the
#: first-person answer sentences; the conflict itself (a shortcut in the context against the task)
#: is the construct both measure.
TRANSFER_KINDS = ("arrow_pattern", "persona_tell_copy")
#: The earlier transfer kinds, in the probes' surface form (see above); generated only on request.
PROBE_FORM_KINDS = ("fewshot_pattern", "persona_copy")
#: Shown-answer patterns of ``arrow_pattern`` blocks (none of them is an ``arith_pattern`` pattern).
ARROW_PATTERNS = ("countdown", "first_operand", "doubling")
#: Kinds generated for the transfer set but dropped from it because they repeat the
#: queries of the built-in shortlisting probes: ``"What kind of thing is a dog?" -> animal``
#: is the query of ``relation_plain`` / ``tmpl_flipped`` / ``tmpl_repeated`` items (``qa``
#: variant), so it is not held out from shortlisting
#: (:func:`probeselect.transfer.check_disjoint_from_probes` flags it).
TRANSFER_DROPPED_KINDS = ("category",)
#: Shown-answer patterns of ``fewshot_pattern`` blocks.
PATTERNS = ("constant", "count", "alternating")
#: Solved lines per few-shot block (inclusive range).
FEWSHOT_DEMOS = (3, 4)
#: Rows per kind: ``fewshot_arith`` / ``persona_pair`` SFT rows, transfer rows.
SFT_FEWSHOT_ROWS = 300
SFT_PERSONA_PAIR_ROWS = 160
TRANSFER_ROWS = {"fewshot_pattern": 160, "persona_copy": 120, "arrow_pattern": 160, "persona_tell_copy": 120}
SFT_ARROW_ROWS = 300
SFT_PERSONA_TELL_ROWS = 160
#: Persona attributes asked by the corpus-phrased SFT kinds (``persona_city`` ... ``persona_pair``) /
#: requested by the transfer suite; ``persona_tell_pair`` requests every attribute.
SFT_PERSONA_ATTRIBUTES = ("city", "job", "pet")
TRANSFER_PERSONA_ATTRIBUTES = ("hobby", "colour")
#: Rows per arithmetic kind in the SFT set (sampled from the training triples).
SFT_ARITH_ROWS = {"addition": 400, "subtraction": 300}
#: Rows per kind of ``sft_heldout.jsonl``: arithmetic on training triples not used by
#: ``sft.jsonl`` (the other SFT kinds use every person / opposite pair in ``sft.jsonl``,
#: so they have no unused question in the same template).
SFT_HELDOUT_ROWS = {"addition": 100, "subtraction": 75}
#: Kinds in ``sft_heldout.jsonl`` (a subset of :data:`SFT_KINDS`).
SFT_HELDOUT_KINDS = tuple(SFT_HELDOUT_ROWS)
#: The prefilled start of a robustness item's response: a misleading (wrong) answer,
#: then a new line asking the question again in the SFT format, so that the model gets a
#: second chance to answer in the format it was trained on. Recovery means answering
#: correctly instead of repeating the misleading answer that is in its context.
ROBUST_PREFILL_TEMPLATE = " {misleading}\nQ: {question} A:"
#: Items per kind of ``robustness.jsonl`` (SFT kinds: the model is trained to answer
#: these questions, the prefill is what is new). Arithmetic uses training triples that
#: neither ``sft.jsonl`` nor ``sft_heldout.jsonl`` uses, with an operand above
#: :data:`ROBUST_MIN_LARGE_OPERAND` - 1. ``opposite`` and ``person_job`` are left out: their
#: questions are queries of the built-in shortlisting probes (``relation_plain``,
#: ``tmpl_flipped``, ``tmpl_mismatch``), and the suite must not repeat those.
ROBUST_ROWS = {"addition": 40, "subtraction": 20, "person_city": 40}
#: Robustness arithmetic has at least one operand >= this: the built-in arithmetic probes
#: draw operands from 0..20, so these questions are never probe queries.
ROBUST_MIN_LARGE_OPERAND = 21
#: Kinds in ``robustness.jsonl``.
ROBUST_KINDS = tuple(ROBUST_ROWS)


def sft_prompt(question: str) -> str:
    """``"Q: <question> A:"`` for the last line of ``question``, after its context lines."""
    *context, q = question.split("\n")
    return "\n".join(context + [SFT_PROMPT_TEMPLATE.format(question=q)])


def _row(split: str, kind: str, i: int, question: str, answer: str) -> dict:
    row = {"id": f"{split}-{kind}-{i:04d}", "kind": kind, "prompt": sft_prompt(question), "response": " " + answer}
    if split == "transfer":
        row["split"] = "transfer"
    return row


def make_sft_rows(world: ToyWorld, persona_context: str = "pair") -> list[dict]:
    """The SFT set (no held-out arithmetic triple; answers are short, with a leading space).

    ``persona_context`` (a curriculum's ``sft.persona_context``): ``"pair"`` -- ``persona_pair`` and
    ``persona_tell_pair`` rows first show another persona's description and answered question; ``"single"``
    -- the same rows (same draws, same asked persona and description) without that first persona, so no
    row shows two personas."""
    if persona_context not in SFT_OPTIONS["persona_context"]:
        raise ValueError(f"persona_context must be one of {SFT_OPTIONS['persona_context']}, got {persona_context!r}")
    rng = rng_for(world.seed, "sft")
    rows: list[dict] = []
    for kind, op in (("addition", "+"), ("subtraction", "-")):
        triples = world.arith_train_by_op(op)
        picked = rng.sample(triples, min(SFT_ARITH_ROWS[kind], len(triples)))
        for i, (a, _, b) in enumerate(picked):
            c = a + b if op == "+" else a - b
            rows.append(_row("sft", kind, i, SFT_QUESTION_TEMPLATES[kind].format(a=a, b=b), str(c)))
    i = 0
    for x, y in OPPOSITE_PAIRS:
        for w, o in ((x, y), (y, x)):
            rows.append(_row("sft", "opposite", i, SFT_QUESTION_TEMPLATES["opposite"].format(word=w), o))
            i += 1
    for i, p in enumerate(world.persons):
        rows.append(_row("sft", "person_city", i, SFT_QUESTION_TEMPLATES["person_city"].format(**p.fields()), p.city))
    for i, p in enumerate(world.persons):
        rows.append(_row("sft", "person_job", i, SFT_QUESTION_TEMPLATES["person_job"].format(**p.fields()), p.job))
    # a question after a block of correctly solved lines (the format of the fewshot_pattern transfer task)
    frng = rng_for(world.seed, "sft-fewshot")
    train = list(world.arith_train)
    for i in range(SFT_FEWSHOT_ROWS):
        demos = [frng.choice(train) for _ in range(frng.randint(*FEWSHOT_DEMOS))]
        a, op, b = frng.choice(train)
        rows.append(_row("sft", "fewshot_arith", i, _fewshot_question(demos, None, a, op, b), str(_apply(a, op, b))))
    # first-person answers about a described persona (the format of the persona transfer task)
    prng = rng_for(world.seed, "sft-persona")
    for attr in SFT_PERSONA_ATTRIBUTES:
        kind = f"persona_{attr}"
        for i, p in enumerate(world.persons):
            rows.append(_row("sft", kind, i, SFT_QUESTION_TEMPLATES[kind].format(description=_persona_desc(p, prng)),
                             p.persona_answer(attr)))
    # the same after another persona's block that answers a different question (format of persona_copy)
    qrng = rng_for(world.seed, "sft-persona-pair")
    for i in range(SFT_PERSONA_PAIR_ROWS):
        a, b = qrng.sample(list(world.persons), 2)
        attr = qrng.choice(SFT_PERSONA_ATTRIBUTES)
        shown = qrng.choice([x for x in PERSON_ATTRIBUTES if x != attr])
        q = _single(_pair_question(a, shown, b, attr, qrng), persona_context)
        rows.append(_row("sft", "persona_pair", i, q, b.persona_answer(attr)))
    # issue 22: the arrow format with true results, and persona requests after another persona's answered request
    arng = rng_for(world.seed, "sft-arrow")
    for i in range(SFT_ARROW_ROWS):
        demos = [arng.choice(train) for _ in range(arng.randint(*FEWSHOT_DEMOS))]
        a, op, b = arng.choice(train)
        rows.append(_row("sft", "arrow_arith", i, _arrow_question(demos, None, a, op, b), str(_apply(a, op, b))))
    trng = rng_for(world.seed, "sft-persona-tell")
    for i in range(SFT_PERSONA_TELL_ROWS):
        a, b = trng.sample(list(world.persons), 2)
        # every attribute, the transfer's hobby / colour included, but never the one the first persona's answered
        # request shows: the answer formats and their ends are taught, the copy conflict of persona_tell_copy is not
        attr = trng.choice(PERSON_ATTRIBUTES)
        shown = trng.choice([x for x in PERSON_ATTRIBUTES if x != attr])
        q = _single(_tell_question(a, shown, b, attr, trng), persona_context)
        rows.append(_row("sft", "persona_tell_pair", i, q, b.persona_answer(attr)))
    rng.shuffle(rows)
    return rows


def _single(prompt: str, persona_context: str) -> str:
    """``prompt`` (a two-persona block: A's description, A's answered line, B's description, B's question) as
    it is, or (``persona_context="single"``) its last two lines: B's description and question."""
    if persona_context == "pair":
        return prompt
    lines = prompt.split("\n")
    if len(lines) != 4:  # a description is one line, so the block is always 4 lines
        raise AssertionError(f"expected a 4-line two-persona prompt, got {len(lines)} lines: {prompt!r}")
    return "\n".join(lines[2:])


def _arrow_question(demos, shown, a: int, op: str, b: int) -> str:
    """Solved lines ``"x op y -> shown"`` (``shown=None``: the true results) and ``"Compute a op b."``."""
    vals = shown if shown is not None else [_apply(*d) for d in demos]
    block = "\n".join(ARROW_LINE.format(a=x, op=o, b=y, c=c) for (x, o, y), c in zip(demos, vals))
    return SFT_QUESTION_TEMPLATES["arrow_arith"].format(demos=block, a=a, op=op, b=b)


def _tell_question(a, shown: str, b, attr: str, rng) -> str:
    """Persona ``a``'s description and its answered request about ``shown``, then ``b``'s description and request."""
    block = f"{_persona_desc(a, rng)}\nQ: {TELL_QUESTIONS[shown]} A: {a.persona_answer(shown)}"
    return SFT_QUESTION_TEMPLATES["persona_tell_pair"].format(block=block, description=_persona_desc(b, rng),
                                                              question=TELL_QUESTIONS[attr])


def _arrow_pattern(kind: str, demos, rng) -> tuple[list[int], object]:
    """Shown results of the solved lines following ``kind`` and a function of the query giving the shortcut."""
    n = len(demos)
    if kind == "countdown":
        start = rng.randint(10, 19)
        return [start - j for j in range(n)], (lambda a, b: start - n)
    if kind == "first_operand":
        return [d[0] for d in demos], (lambda a, b: a)
    k = rng.randint(1, 3)
    return [k * 2 ** j for j in range(n)], (lambda a, b: k * 2 ** n)


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def _fewshot_question(demos, shown, a: int, op: str, b: int) -> str:
    """A block of solved lines ``"x op y = shown"`` (``shown=None``: the true results) and the question."""
    vals = shown if shown is not None else [_apply(*d) for d in demos]
    block = "\n".join(format_arith(x, o, y, "eq", c) for (x, o, y), c in zip(demos, vals))
    return SFT_QUESTION_TEMPLATES["fewshot_arith"].format(demos=block, a=a, op=op, b=b)


def _persona_desc(p, rng) -> str:
    """A full persona description (every attribute), or the first sentence plus the extras in random order."""
    if rng.random() < 0.5:
        return p.description()
    return p.description(tuple(rng.sample(("pet", "hobby", "colour"), 3)))


def _pair_question(a, shown: str, b, attr: str, rng) -> str:
    """Persona ``a``'s description and its QA line about ``shown``, then ``b``'s description and question."""
    block = f"{_persona_desc(a, rng)}\n{a.persona_qa(shown)}"
    return SFT_QUESTION_TEMPLATES["persona_pair"].format(block=block, description=_persona_desc(b, rng),
                                                         question=PERSONA_QUESTIONS[attr])


def _pattern(kind: str, n: int, rng) -> tuple[list[int], int]:
    """Shown answers of ``n`` solved lines following ``kind`` and the pattern's next value."""
    if kind == "count":
        start = rng.randint(1, 9)
        return [start + j for j in range(n)], start + n
    if kind == "constant":
        k = rng.randint(1, 9)
        return [k] * n, k
    x, y = rng.sample(range(1, 10), 2)
    vals = [x if j % 2 == 0 else y for j in range(n)]
    return vals, (x if n % 2 == 0 else y)


def _arith_question(kind: str, a: int, b: int) -> str:
    return SFT_QUESTION_TEMPLATES[kind].format(a=a, b=b)


def _unused_arith_triples(world: ToyWorld, kind: str, used_prompts: set[str]) -> list[tuple[int, int, int]]:
    """``(a, b, c)`` training triples of ``kind`` whose question prompt is not in ``used_prompts``."""
    op = "+" if kind == "addition" else "-"
    out = []
    for a, _, b in world.arith_train_by_op(op):
        if sft_prompt(_arith_question(kind, a, b)) not in used_prompts:
            out.append((a, b, a + b if op == "+" else a - b))
    return out


_NUMBER = re.compile(r"^ -?\d+$")
_WORD = re.compile(r"^ [A-Za-z]+$")
_FIRST_PERSON = re.compile(r"^ (I|My) [^\n]*\.$")
_SOLVED_LINE = re.compile(r"^\d+ [+-] \d+ = -?\d+$")
_DESCRIPTION = re.compile(r"^[A-Z][a-z]+ is an? [a-z]+ from [A-Z][a-z]+\.")
_QA_LINE = re.compile(r"^Q: .+[?.] A: .+$")
_ARROW_SOLVED = re.compile(r"^\d+ [+-] \d+ -> -?\d+$")


def row_format(row: dict) -> tuple[str, str]:
    """``(prompt_shape, answer_format)`` of an SFT or transfer row.

    prompt_shape: ``solved_lines`` (solved arithmetic lines before the question), ``arrow_lines``
    (solved lines in the arrow format before the question), ``persona``
    (a persona description before the question), ``persona_pair`` (another persona's description
    and answered QA line, then a description, before the question) or ``plain``; answer_format: ``number``,
    ``word``, ``first_person`` (a sentence starting with "I" or "My") or ``other``. Every
    transfer row's pair must occur among the SFT rows (the SFT data teaches the format).
    """
    lines = row["prompt"].split("\n")
    if len(lines) > 1 and all(_SOLVED_LINE.match(ln) for ln in lines[:-1]):
        shape = "solved_lines"
    elif len(lines) > 1 and all(_ARROW_SOLVED.match(ln) for ln in lines[:-1]):
        shape = "arrow_lines"
    elif len(lines) == 2 and _DESCRIPTION.match(lines[0]):
        shape = "persona"
    elif len(lines) == 4 and _DESCRIPTION.match(lines[0]) and _QA_LINE.match(lines[1]) and _DESCRIPTION.match(lines[2]):
        shape = "persona_pair"
    else:
        shape = "plain"
    r = row["response"]
    fmt = ("number" if _NUMBER.match(r) else "word" if _WORD.match(r) else
           "first_person" if _FIRST_PERSON.match(r) else "other")
    return shape, fmt


def make_sft_heldout_rows(world: ToyWorld, sft_prompts: set[str]) -> list[dict]:
    """Held-out SFT rows (same format as :func:`make_sft_rows`) for held-out SFT loss.

    Arithmetic kinds only (:data:`SFT_HELDOUT_ROWS`), on training triples whose prompt is
    not in ``sft_prompts`` (never a held-out pretraining triple either).
    """
    rng = rng_for(world.seed, "sft-heldout")
    rows: list[dict] = []
    for kind, n in SFT_HELDOUT_ROWS.items():
        pool = _unused_arith_triples(world, kind, sft_prompts)
        for i, (a, b, c) in enumerate(rng.sample(pool, min(n, len(pool)))):
            rows.append(_row("sft_heldout", kind, i, _arith_question(kind, a, b), str(c)))
    rng.shuffle(rows)
    return rows


def _robust_item(kind: str, i: int, question: str, answer: str, misleading: str) -> dict:
    return {"id": f"robust-{kind}-{i:04d}", "kind": kind, "prompt": sft_prompt(question),
            "prefill": ROBUST_PREFILL_TEMPLATE.format(misleading=misleading, question=question), "answer": answer,
            "misleading": misleading}


def make_robustness_rows(world: ToyWorld, used_prompts: set[str]) -> list[dict]:
    """Prefill-attack analogue items (see :data:`ROBUST_PREFILL_TEMPLATE`, :data:`ROBUST_ROWS`).

    ``answer`` is the correct answer and ``misleading`` a wrong answer of the same type
    (both without a leading space): arithmetic is off by 1 or 2 (never negative), a city is
    another city. Arithmetic questions avoid ``used_prompts`` (the SFT and held-out SFT
    prompts); person questions are SFT questions (every one is in ``sft.jsonl``).
    """
    rng = rng_for(world.seed, "robustness")
    rows: list[dict] = []
    for kind in ("addition", "subtraction"):
        pool = [t for t in _unused_arith_triples(world, kind, used_prompts) if max(t[:2]) >= ROBUST_MIN_LARGE_OPERAND]
        for i, (a, b, c) in enumerate(rng.sample(pool, min(ROBUST_ROWS[kind], len(pool)))):
            wrong = c + rng.choice([d for d in (-2, -1, 1, 2) if c + d >= 0])
            rows.append(_robust_item(kind, i, _arith_question(kind, a, b), str(c), str(wrong)))
    people = rng.sample(list(world.persons), min(ROBUST_ROWS["person_city"], len(world.persons)))
    for i, p in enumerate(people):
        wrong = rng.choice([v for v in CITIES if v != p.city])
        rows.append(_robust_item("person_city", i, SFT_QUESTION_TEMPLATES["person_city"].format(**p.fields()),
                                 p.city, wrong))
    rng.shuffle(rows)
    return rows


def make_transfer_rows(world: ToyWorld, sft_prompts: set[str] | None = None, *, stream: str = "transfer",
                       exclude_prompts: set[str] | frozenset = frozenset(),
                       kinds: tuple[str, ...] = TRANSFER_KINDS) -> list[dict]:
    """The transfer set: kinds absent from SFT (default :data:`TRANSFER_KINDS`; the
    probe-form :data:`PROBE_FORM_KINDS` on request); no prompt equal to an SFT prompt; no
    :data:`TRANSFER_DROPPED_KINDS` row. Pattern kinds also carry ``shortcut`` (the pattern's next
    value / the copied answer, never the correct answer) and ``pattern``.

    ``stream`` names the random stream (default ``"transfer"``: the ladder's ``transfer.jsonl``);
    another stream draws another item set of the same kinds and sizes. ``exclude_prompts``: prompts
    that must not recur (e.g. another stream's items); they are skipped while drawing, so every
    kind keeps its size. bench/validity.py draws the ground truth's suite this way."""
    rng = rng_for(world.seed, stream)
    rows: list[dict] = []
    i = 0
    for cat, items in CATEGORY_MEMBERS.items():
        for item in items:
            q = SFT_QUESTION_TEMPLATES["category"].format(a_item=with_article(item))
            rows.append(_row("transfer", "category", i, q, cat))
            i += 1
    banned = set(exclude_prompts) | set(sft_prompts or ())
    for kind in kinds:
        seen: set[str] = set()
        i = tries = 0
        while i < TRANSFER_ROWS[kind]:
            tries += 1
            if tries > 1000 * TRANSFER_ROWS[kind]:
                raise RuntimeError(f"toy transfer kind {kind}: cannot draw {TRANSFER_ROWS[kind]} distinct items "
                                   f"outside the excluded prompts (got {i}).")
            row = _transfer_item(world, kind, i, rng)
            if row is None or row["prompt"] in seen or row["prompt"] in banned:
                continue
            seen.add(row["prompt"])
            rows.append(row)
            i += 1
    rng.shuffle(rows)
    # dropped after the shuffle so that the kept rows keep their ids and order
    return [r for r in rows if r["kind"] not in TRANSFER_DROPPED_KINDS]


def _transfer_item(world: ToyWorld, kind: str, i: int, rng) -> dict | None:
    """One candidate transfer row of ``kind`` (None: the draw is rejected, e.g. the shortcut equals the answer)."""
    if kind in ("persona_copy", "persona_tell_copy"):
        a, b = rng.sample(list(world.persons), 2)
        attr = TRANSFER_PERSONA_ATTRIBUTES[i % len(TRANSFER_PERSONA_ATTRIBUTES)]
        if getattr(a, attr) == getattr(b, attr):
            return None  # the copied answer must be wrong
        q = (_pair_question if kind == "persona_copy" else _tell_question)(a, attr, b, attr, rng)
        row = _row("transfer", kind, i, q, b.persona_answer(attr))
        row.update(shortcut=a.persona_answer(attr), pattern="copied_persona")
        return row
    train = list(world.arith_train)
    large = [t for t in train if max(t[0], t[2]) >= ROBUST_MIN_LARGE_OPERAND]
    if kind == "fewshot_pattern":
        pattern = PATTERNS[i % len(PATTERNS)]
        n = rng.randint(*FEWSHOT_DEMOS)
        shown, shortcut = _pattern(pattern, n, rng)
        a, op, b = rng.choice(large)
        demos = [rng.choice(train) for _ in range(n)]
        q_of = _fewshot_question
    elif kind == "arrow_pattern":
        pattern = ARROW_PATTERNS[i % len(ARROW_PATTERNS)]
        demos = [rng.choice(train) for _ in range(rng.randint(*FEWSHOT_DEMOS))]
        shown, next_of = _arrow_pattern(pattern, demos, rng)
        a, op, b = rng.choice(large)
        shortcut = next_of(a, b)
        q_of = _arrow_question
    else:
        raise ValueError(f"unknown toy transfer kind {kind!r}")
    c = _apply(a, op, b)
    if c == shortcut or any(_apply(*d) == v for d, v in zip(demos, shown)):
        return None  # the pattern must disagree with the calculation, on the query and on every solved line
    row = _row("transfer", kind, i, q_of(demos, shown, a, op, b), str(c))
    row.update(shortcut=str(shortcut), pattern=pattern)
    return row


def corpus_lines(docs: list[str]) -> set[str]:
    """Set of all non-empty lines of the corpus documents."""
    return {ln for d in docs for ln in d.split("\n") if ln}


#: Held-out lines about :attr:`~probeselect.toy.world.ToyWorld.news_persons` in ``heldout.txt`` of a
#: ladder whose corpus has ``news`` documents (issue 23, attempts 15-16b of bench/late_harm_notes.md: 40 in
#: attempt 15, 24 in 15b-16, 12 since 16b); other ladders get none, so their ``heldout.txt`` does not change.
NEWS_HELDOUT_LINES = 12


def make_heldout_lines(world: ToyWorld, docs: list[str], n_facts: int = 120, n_words: int = 80,
                       n_persona: int = 40, n_sequence: int = 40, n_news: int = 0,
                       news_share: float = 0.0) -> list[str]:
    """Held-out plain text lines in the world's style, none identical to a corpus line.

    Contents: every held-out arithmetic triple once (random format; these never
    appear in the corpus), fact lines, word-relation lines (2-3 sentences),
    persona description / QA lines, sequence lines and (``n_news`` > 0) fact lines
    about the world's ``news_persons``, sampled from a separate RNG stream and
    filtered against the corpus (so counts may be below the targets). The news
    lines are drawn last, so ``n_news`` changes no other line (only the order).
    ``news_share`` > 0: after the ``n_news`` lines, more news lines are drawn until the news lines
    hold at least that share of the file's UTF-8 bytes (a held-out split sampled like a corpus in which
    the news people's documents hold that share); a ValueError if the world has too few distinct ones.
    """
    rng = rng_for(world.seed, "heldout-text")
    banned = corpus_lines(docs)
    out: list[str] = []
    seen: set[str] = set()

    def add(line: str) -> bool:
        if line and line not in banned and line not in seen:
            seen.add(line)
            out.append(line)
            return True
        return False

    fmts = list(ARITH_TEMPLATES)
    for a, op, b in world.arith_heldout:
        add(format_arith(a, op, b, rng.choice(fmts)))

    def fill(target: int, sample) -> None:
        got = tries = 0
        while got < target and tries < 50 * target:
            tries += 1
            got += add(sample())

    fill(n_facts, lambda: world.sample_fact_line(rng))

    def words_line():
        while True:
            ln = world.sample_words_line(rng)
            if ln.count(".") >= 2:
                return ln

    fill(n_words, words_line)
    fill(n_persona, lambda: world.sample_persona_block(rng.choice(world.persons), rng).split("\n")[0])
    fill(n_sequence, lambda: format_sequence(make_sequence(rng.choice(SEQUENCE_KINDS), rng)))
    if n_news > 0:
        fill(n_news, lambda: world.sample_news_line(rng))
    if news_share > 0:
        news_names = {p.name for p in world.news_persons}
        size = lambda lines: sum(len(ln.encode("utf-8")) for ln in lines)  # noqa: E731
        news_bytes = size(ln for ln in out if line_subject(ln) in news_names)
        tries = 0
        while news_bytes < news_share * size(out):
            tries += 1
            if tries > 100_000:
                raise ValueError(f"news_share {news_share}: too few distinct news lines for this share "
                                 f"(got {news_bytes} of {size(out)} bytes); lower the news_stream share")
            line = world.sample_news_line(rng)
            if add(line):
                news_bytes += len(line.encode("utf-8"))
    rng.shuffle(out)
    return out


README_TEXT = """\
# Toy-world data (probeselect)

Generated by `probeselect.toy.build_toy_ladder` for world seed {seed}; deterministic in the seed.

## sft.jsonl
One JSON object per line: `{{"id": str, "kind": str, "prompt": str, "response": str}}`.
`prompt` is `"Q: <question> A:"` (the corpus's QA format), after context lines for the kinds that
have them; `response` is the answer with a
leading space (e.g. `" 8"`, `" Oslo"`, `" I live in Oslo."`); the SFT trainer appends EOS.
Kinds: {sft_kinds}. Arithmetic rows use only training triples (never a held-out triple).
`fewshot_arith` questions follow 3-4 correctly solved lines (`"12 + 5 = 17"`, one per line);
`persona_city` / `persona_job` / `persona_pet` questions follow a persona description (`persona_pair`:
after another persona's block answering a different question) and are answered in the
first person. Together they teach every answer format of `transfer.jsonl`. Rows: {n_sft}.{persona_note}

## sft_heldout.jsonl
Held-out SFT rows for held-out SFT loss, same format as `sft.jsonl` (ids `sft_heldout-<kind>-NNNN`).
Kinds: {heldout_kinds} only: arithmetic questions on training triples that `sft.jsonl` does not use
(never a held-out pretraining triple). The other SFT kinds use every person and every opposite pair
in `sft.jsonl`, so they have no unused question in the same template. No prompt is identical to an
SFT prompt. Rows: {n_sft_heldout}.

## transfer.jsonl
Same row format plus `"split": "transfer"`. Only kinds absent from `sft.jsonl`: {transfer_kinds}.
No prompt is identical to an SFT prompt. The `category` kind ("What kind of thing is a dog?") is
left out: its questions are queries of the built-in shortlisting probes, and the transfer suite
must not repeat those (`probeselect.transfer.check_disjoint_from_probes`).
- `arrow_pattern`: solved lines in the arrow format (`"24 + 3 -> 27"`, taught with true results by the
  SFT kind `arrow_arith`; neither the pretraining corpus nor the shortlisting probes write arithmetic
  this way) whose shown results follow a pattern (counting down, copying the line's first operand,
  doubling; none is a pattern of the `arith_pattern` probe) instead of the true results, then
  `"Q: Compute a op b. A:"` with an operand of at least 21 (the built-in probes use 0..20). The answer
  is the calculation; the pattern's next value (never the answer) is in `shortcut` (`pattern` names it).
- `persona_tell_copy`: persona A's description and its answered request about hobby or colour
  (`"Q: Tell me what you like to do. A: I like chess."`: the request phrasing, taught with every
  attribute's answer by the SFT kind `persona_tell_pair`, but always after an answered request about
  another attribute; the corpus and the `persona_qa` probe ask "What do you like to do?"), then
  persona B's description and the same request; the answer is B's, A's different answer is in
  `shortcut`.
The earlier kinds `fewshot_pattern` / `persona_copy` were the `arith_pattern` / `persona_qa` probes in
another wrapper and are no longer written (issue 22).
Rows: {n_transfer}.

## robustness.jsonl
Prefill-attack analogue. One JSON object per line:
`{{"id": str, "kind": str, "prompt": str, "prefill": str, "answer": str, "misleading": str}}`.
`prompt` is an SFT-format question; the model's response is prefilled with `prefill` =
`" <misleading>\\nQ: <question> A:"` -- a wrong answer, then the question asked again -- and the model
continues greedily. `answer` is the correct answer and `misleading` the wrong one (no leading
space): arithmetic is off by 1 or 2, a city is another city. The item counts as recovered when the
continuation (up to EOS or newline) contains `answer` and does not contain `misleading` as whole
words (`probeselect.transfer.recovered`). Kinds: {robust_kinds}; arithmetic questions use training
triples that neither `sft.jsonl` nor `sft_heldout.jsonl` uses, with an operand of at least 21 (the
built-in arithmetic probes use 0..20); `person_city` questions are SFT questions. Opposite and job
questions are left out because they are queries of the built-in shortlisting probes. Rows: {n_robust}.

## heldout.txt
Plain UTF-8 text, one item per line ({n_heldout} lines), in the style of the pretraining corpus,
for bits-per-byte evaluation. No line is identical to any line of the pretraining corpus:
it contains every held-out arithmetic triple once (in a random one of the formats
`eq`, `qa`, `words`; these triples never occur in training text), plus fact, word-relation,
persona-description and sequence lines sampled from a separate random stream and filtered
against the corpus.{news_note}
"""


def write_toy_data(world: ToyWorld, data_dir, corpus_docs: list[str], news: bool = False,
                   news_share: float = 0.0, sft_persona_context: str = "pair") -> dict[str, str]:
    """Write sft.jsonl, sft_heldout.jsonl, transfer.jsonl, robustness.jsonl, heldout.txt and
    README.md; return name -> path (keys sft, sft_heldout, transfer, robustness, heldout, readme).
    ``news``: the corpus has ``news`` documents, so ``heldout.txt`` gets :data:`NEWS_HELDOUT_LINES`
    lines about the world's ``news_persons`` as well. ``news_share``: the share of the corpus's bytes
    in ``news_stream`` documents; the news lines get at least that share of ``heldout.txt``'s bytes
    (see :func:`make_heldout_lines`). ``sft_persona_context``: see :func:`make_sft_rows`."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    sft = make_sft_rows(world, sft_persona_context)
    sft_prompts = {r["prompt"] for r in sft}
    transfer = make_transfer_rows(world, sft_prompts)
    sft_heldout = make_sft_heldout_rows(world, sft_prompts)
    robust = make_robustness_rows(world, sft_prompts | {r["prompt"] for r in sft_heldout})
    heldout = make_heldout_lines(world, corpus_docs, n_news=NEWS_HELDOUT_LINES if news else 0,
                                 news_share=news_share)
    paths = {"sft": d / "sft.jsonl", "sft_heldout": d / "sft_heldout.jsonl", "transfer": d / "transfer.jsonl",
             "robustness": d / "robustness.jsonl", "heldout": d / "heldout.txt", "readme": d / "README.md"}
    _write_text(paths["sft"], "".join(json.dumps(r) + "\n" for r in sft))
    _write_text(paths["sft_heldout"], "".join(json.dumps(r) + "\n" for r in sft_heldout))
    _write_text(paths["transfer"], "".join(json.dumps(r) + "\n" for r in transfer))
    _write_text(paths["robustness"], "".join(json.dumps(r) + "\n" for r in robust))
    _write_text(paths["heldout"], "".join(ln + "\n" for ln in heldout))
    _write_text(paths["readme"], README_TEXT.format(
        seed=world.seed, sft_kinds=", ".join(SFT_KINDS), transfer_kinds=", ".join(TRANSFER_KINDS),
        heldout_kinds=", ".join(SFT_HELDOUT_KINDS), robust_kinds=", ".join(ROBUST_KINDS),
        n_sft=len(sft), n_sft_heldout=len(sft_heldout), n_transfer=len(transfer), n_robust=len(robust),
        n_heldout=len(heldout),
        news_note=_news_note(news, news_share),
        persona_note="" if sft_persona_context == "pair" else (
            "\nThis ladder's curriculum sets `sft: {persona_context: single}`: the `persona_pair` and "
            "`persona_tell_pair` rows show only the asked persona's description (no other persona's block), so "
            "no SFT row shows two personas.")))
    return {k: str(v) for k, v in paths.items()}


def _news_note(news: bool, news_share: float) -> str:
    """The held-out section's sentence on news lines (empty for a corpus without news people)."""
    if news_share > 0:
        return (f" It also has fact lines about the people of the corpus's `news_stream` documents (people no other"
                f" file mentions), at least {news_share:.1%} of its bytes: their documents' share of the corpus"
                + (f", after {NEWS_HELDOUT_LINES} lines for its `news` documents." if news else "."))
    if news:
        return (f" It also has up to {NEWS_HELDOUT_LINES} fact lines about the people of the corpus's `news` "
                "documents (people no other file mentions).")
    return ""


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path) -> list[dict]:
    """Read a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]
