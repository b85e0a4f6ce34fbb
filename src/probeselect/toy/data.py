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
from pathlib import Path

from .world import (
    ARITH_TEMPLATES,
    CATEGORY_MEMBERS,
    CITIES,
    OPPOSITE_PAIRS,
    PERSON_ATTRIBUTES,
    PERSONA_QUESTIONS,
    SEQUENCE_KINDS,
    ToyWorld,
    format_arith,
    format_sequence,
    make_sequence,
    rng_for,
    with_article,
)

#: Instruction prompt format; the response is ``" " + answer`` (leading space; the
#: SFT trainer appends EOS).
SFT_PROMPT_TEMPLATE = "### Question: {question}\n### Answer:"
#: Question templates per kind (placeholders from Person.fields() / arithmetic).
SFT_QUESTION_TEMPLATES = {
    "addition": "What is {a} + {b}?",
    "subtraction": "What is {a} - {b}?",
    "opposite": "What is the opposite of {word}?",
    "person_city": "Where does {name} live?",
    "person_job": "What is {name}'s job?",
    # transfer-only kinds
    "category": "What kind of thing is {a_item}?",
    "person_pet": "What pet does {name} have?",
    "person_hobby": "What does {name} like to do?",
    "person_colour": "What is {name}'s favourite colour?",
    "persona": "{description} {question}",
    "sequence": "What comes next: {sequence}?",
}
#: Kinds in ``sft.jsonl``.
SFT_KINDS = ("addition", "subtraction", "opposite", "person_city", "person_job")
#: Kinds in ``transfer.jsonl`` (disjoint from :data:`SFT_KINDS`).
TRANSFER_KINDS = ("person_pet", "person_hobby", "person_colour", "persona", "sequence")
#: Kinds generated for the transfer set but dropped from it because they repeat the
#: queries of the built-in shortlisting probes: ``"What kind of thing is a dog?" -> animal``
#: is the query of ``relation_plain`` / ``tmpl_flipped`` / ``tmpl_repeated`` items (``qa``
#: variant), so it is not held out from shortlisting
#: (:func:`probeselect.transfer.check_disjoint_from_probes` flags it).
TRANSFER_DROPPED_KINDS = ("category",)
#: Rows per arithmetic kind in the SFT set (sampled from the training triples).
SFT_ARITH_ROWS = {"addition": 400, "subtraction": 300}
#: Rows per kind of ``sft_heldout.jsonl``: arithmetic on training triples not used by
#: ``sft.jsonl`` (the other SFT kinds use every person / opposite pair in ``sft.jsonl``,
#: so they have no unused question in the same template).
SFT_HELDOUT_ROWS = {"addition": 100, "subtraction": 75}
#: Kinds in ``sft_heldout.jsonl`` (a subset of :data:`SFT_KINDS`).
SFT_HELDOUT_KINDS = tuple(SFT_HELDOUT_ROWS)
#: The prefilled start of a robustness item's response: a misleading (wrong) answer,
#: then a new line with the answer cue of the SFT format, so that the model gets a
#: second chance to answer in the format it was trained on. Recovery means answering
#: correctly instead of repeating the misleading answer that is in its context.
ROBUST_PREFILL_TEMPLATE = " {misleading}\n### Answer:"
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
    """``"### Question: <question>\\n### Answer:"``."""
    return SFT_PROMPT_TEMPLATE.format(question=question)


def _row(split: str, kind: str, i: int, question: str, answer: str) -> dict:
    row = {"id": f"{split}-{kind}-{i:04d}", "kind": kind, "prompt": sft_prompt(question), "response": " " + answer}
    if split == "transfer":
        row["split"] = "transfer"
    return row


def make_sft_rows(world: ToyWorld) -> list[dict]:
    """The SFT set (no held-out arithmetic triple; answers are short, with a leading space)."""
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
    rng.shuffle(rows)
    return rows


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
            "prefill": ROBUST_PREFILL_TEMPLATE.format(misleading=misleading), "answer": answer,
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


def _sequence_next(kind: str, values: list[int]) -> int:
    if kind in ("alternating",):
        return values[-2]
    return values[-1] + (values[-1] - values[-2])


def make_transfer_rows(world: ToyWorld, sft_prompts: set[str] | None = None) -> list[dict]:
    """The transfer set: kinds absent from SFT (:data:`TRANSFER_KINDS`); no prompt equal to
    an SFT prompt; no :data:`TRANSFER_DROPPED_KINDS` row."""
    rng = rng_for(world.seed, "transfer")
    rows: list[dict] = []
    i = 0
    for cat, items in CATEGORY_MEMBERS.items():
        for item in items:
            q = SFT_QUESTION_TEMPLATES["category"].format(a_item=with_article(item))
            rows.append(_row("transfer", "category", i, q, cat))
            i += 1
    for kind, attr in (("person_pet", "pet"), ("person_hobby", "hobby"), ("person_colour", "colour")):
        for i, p in enumerate(world.persons):
            f = p.fields()
            rows.append(_row("transfer", kind, i, SFT_QUESTION_TEMPLATES[kind].format(**f), f[attr]))
    i = 0
    for p in world.persons:
        for attr in rng.sample(PERSON_ATTRIBUTES, 2):
            q = SFT_QUESTION_TEMPLATES["persona"].format(description=p.description(), question=PERSONA_QUESTIONS[attr])
            rows.append(_row("transfer", "persona", i, q, p.persona_answer(attr)))
            i += 1
    seen = set()
    i = 0
    while i < 60:
        kind = rng.choice(SEQUENCE_KINDS)
        vals = make_sequence(kind, rng)
        nxt = _sequence_next(kind, vals)
        if nxt < 0:
            continue
        key = format_sequence(vals)
        if key in seen:
            continue
        seen.add(key)
        rows.append(_row("transfer", "sequence", i, SFT_QUESTION_TEMPLATES["sequence"].format(sequence=key),
                         str(nxt)))
        i += 1
    if sft_prompts:
        rows = [r for r in rows if r["prompt"] not in sft_prompts]
    rng.shuffle(rows)
    # dropped after the shuffle so that the kept rows keep their ids and order
    return [r for r in rows if r["kind"] not in TRANSFER_DROPPED_KINDS]


def corpus_lines(docs: list[str]) -> set[str]:
    """Set of all non-empty lines of the corpus documents."""
    return {ln for d in docs for ln in d.split("\n") if ln}


def make_heldout_lines(world: ToyWorld, docs: list[str], n_facts: int = 120, n_words: int = 80,
                       n_persona: int = 40, n_sequence: int = 40) -> list[str]:
    """Held-out plain text lines in the world's style, none identical to a corpus line.

    Contents: every held-out arithmetic triple once (random format; these never
    appear in the corpus), fact lines, word-relation lines (2-3 sentences),
    persona description / QA lines and sequence lines sampled from a separate RNG
    stream and filtered against the corpus (so counts may be below the targets).
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
    rng.shuffle(out)
    return out


README_TEXT = """\
# Toy-world data (probeselect)

Generated by `probeselect.toy.build_toy_ladder` for world seed {seed}; deterministic in the seed.

## sft.jsonl
One JSON object per line: `{{"id": str, "kind": str, "prompt": str, "response": str}}`.
`prompt` is `"### Question: <question>\\n### Answer:"`; `response` is the short answer with a
leading space (e.g. `" 8"`, `" Oslo"`); the SFT trainer appends EOS.
Kinds: {sft_kinds}. Arithmetic rows use only training triples (never a held-out triple).
Rows: {n_sft}.

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
must not repeat those (`probeselect.transfer.check_disjoint_from_probes`). `persona` prompts contain a persona description followed
by a first-person question; the answer is first-person (e.g. `" I live in Oslo."`).
Rows: {n_transfer}.

## robustness.jsonl
Prefill-attack analogue. One JSON object per line:
`{{"id": str, "kind": str, "prompt": str, "prefill": str, "answer": str, "misleading": str}}`.
`prompt` is an SFT-format question; the model's response is prefilled with `prefill` =
`" <misleading>\\n### Answer:"` -- a wrong answer followed by a fresh answer cue -- and the model
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
against the corpus.
"""


def write_toy_data(world: ToyWorld, data_dir, corpus_docs: list[str]) -> dict[str, str]:
    """Write sft.jsonl, sft_heldout.jsonl, transfer.jsonl, robustness.jsonl, heldout.txt and
    README.md; return name -> path (keys sft, sft_heldout, transfer, robustness, heldout, readme)."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    sft = make_sft_rows(world)
    sft_prompts = {r["prompt"] for r in sft}
    transfer = make_transfer_rows(world, sft_prompts)
    sft_heldout = make_sft_heldout_rows(world, sft_prompts)
    robust = make_robustness_rows(world, sft_prompts | {r["prompt"] for r in sft_heldout})
    heldout = make_heldout_lines(world, corpus_docs)
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
        n_heldout=len(heldout)))
    return {k: str(v) for k, v in paths.items()}


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path) -> list[dict]:
    """Read a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]
