"""Toy post-training / evaluation data derived from a :class:`~probeselect.toy.world.ToyWorld`.

Written by :func:`write_toy_data` under ``<ladder>/data/``:

* ``sft.jsonl`` -- instruction SFT rows ``{"id", "kind", "prompt", "response"}``;
* ``transfer.jsonl`` -- same row format plus ``"split": "transfer"``, only kinds
  absent from the SFT set (:data:`TRANSFER_KINDS`);
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
TRANSFER_KINDS = ("category", "person_pet", "person_hobby", "person_colour", "persona", "sequence")
#: Rows per arithmetic kind in the SFT set (sampled from the training triples).
SFT_ARITH_ROWS = {"addition": 400, "subtraction": 300}


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


def _sequence_next(kind: str, values: list[int]) -> int:
    if kind in ("alternating",):
        return values[-2]
    return values[-1] + (values[-1] - values[-2])


def make_transfer_rows(world: ToyWorld, sft_prompts: set[str] | None = None) -> list[dict]:
    """The transfer set: kinds absent from SFT; no prompt equal to an SFT prompt."""
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
    return rows


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

## transfer.jsonl
Same row format plus `"split": "transfer"`. Only kinds absent from `sft.jsonl`: {transfer_kinds}.
No prompt is identical to an SFT prompt. `persona` prompts contain a persona description followed
by a first-person question; the answer is first-person (e.g. `" I live in Oslo."`).
Rows: {n_transfer}.

## heldout.txt
Plain UTF-8 text, one item per line ({n_heldout} lines), in the style of the pretraining corpus,
for bits-per-byte evaluation. No line is identical to any line of the pretraining corpus:
it contains every held-out arithmetic triple once (in a random one of the formats
`eq`, `qa`, `words`; these triples never occur in training text), plus fact, word-relation,
persona-description and sequence lines sampled from a separate random stream and filtered
against the corpus.
"""


def write_toy_data(world: ToyWorld, data_dir, corpus_docs: list[str]) -> dict[str, str]:
    """Write sft.jsonl, transfer.jsonl, heldout.txt and README.md; return name -> path."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    sft = make_sft_rows(world)
    transfer = make_transfer_rows(world, {r["prompt"] for r in sft})
    heldout = make_heldout_lines(world, corpus_docs)
    paths = {"sft": d / "sft.jsonl", "transfer": d / "transfer.jsonl", "heldout": d / "heldout.txt",
             "readme": d / "README.md"}
    _write_text(paths["sft"], "".join(json.dumps(r) + "\n" for r in sft))
    _write_text(paths["transfer"], "".join(json.dumps(r) + "\n" for r in transfer))
    _write_text(paths["heldout"], "".join(ln + "\n" for ln in heldout))
    _write_text(paths["readme"], README_TEXT.format(
        seed=world.seed, sft_kinds=", ".join(SFT_KINDS), transfer_kinds=", ".join(TRANSFER_KINDS),
        n_sft=len(sft), n_transfer=len(transfer), n_heldout=len(heldout)))
    return {k: str(v) for k, v in paths.items()}


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path) -> list[dict]:
    """Read a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]
