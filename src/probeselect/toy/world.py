"""A small, fully deterministic synthetic "toy world" and its pretraining corpus.

The world contains

* arithmetic statements (addition and non-negative subtraction of integers
  ``0..arith_max_operand``) in three surface formats (:data:`ARITH_TEMPLATES`),
  with a seeded held-out set of ``(a, op, b)`` triples that never appears in any
  training text;
* counting and sequence patterns ("1, 2, 3, 4, 5", "5, 10, 15, 20", ...);
* facts about fictional people (city, job, pet, hobby, favourite colour), both as
  third-person sentences and as *persona blocks*: a description followed by
  first-person question/answer lines;
* word relations: opposites and categories.

Everything that a probe might need to build prompts (word lists and sentence
templates) is exported as a module-level constant.  The seed only chooses
assignments (who lives where, which arithmetic triples are held out, which
documents are sampled); the vocabularies are fixed here in code.

All randomness goes through :func:`rng_for`, which derives an independent
``random.Random`` stream from ``(seed, stream name)``, so adding a new stream
never changes existing ones.
"""

import hashlib
import random
import re
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------

#: Exact arithmetic surface formats (a contract with the probe code).  ``op`` is
#: ``"+"`` or ``"-"``; ``opword`` is ``"plus"`` or ``"minus"``.  In the corpus an
#: arithmetic document is 4-8 of these lines, all in one format, joined by "\n".
ARITH_TEMPLATES = {
    "eq": "{a} {op} {b} = {c}",
    "qa": "Q: What is {a} {op} {b}? A: {c}",
    "words": "{a} {opword} {b} is {c}",
}
#: The two operators and their spelled-out words.
ARITH_OPS = ("+", "-")
ARITH_OPWORDS = {"+": "plus", "-": "minus"}
#: Default largest operand (operands are integers ``0..arith_max_operand``).
DEFAULT_ARITH_MAX_OPERAND = 29
#: Fraction of the (a, op, b) triples of each operator that is held out.
ARITH_HELDOUT_FRACTION = 0.10
#: Inclusive range of the number of statements in one arithmetic document.
ARITH_DOC_LINES = (4, 8)
#: Fraction of corpus arithmetic statements drawn from single-digit operands
#: (``a, b < 10``); the rest are uniform over the training triples of the operator.
#: 0 by default: oversampling small operands made the model memorise that region
#: and miss held-out small problems (e.g. "1 + 2").
ARITH_SMALL_FRACTION = 0.0
#: Sampling weights of the arithmetic formats in the corpus.
ARITH_FORMAT_WEIGHTS = {"eq": 0.75, "qa": 0.15, "words": 0.10}

# ---------------------------------------------------------------------------
# People
# ---------------------------------------------------------------------------

FEMALE_NAMES = (
    "Ana", "Bea", "Cora", "Dina", "Elsa", "Fay", "Gia", "Hana", "Ida", "Juno",
    "Kira", "Lena", "Mira", "Nora", "Oda", "Pia", "Rosa", "Sara", "Tova", "Uma",
    "Vera", "Wren", "Yara", "Zoe",
)
MALE_NAMES = (
    "Abel", "Bo", "Cai", "Dag", "Emil", "Finn", "Gus", "Hugo", "Ivo", "Jon",
    "Kai", "Leo", "Milo", "Nils", "Otto", "Per", "Rafe", "Sven", "Tor", "Ugo",
    "Vik", "Wim", "Yves", "Zed",
)
CITIES = (
    "Oslo", "Lima", "Cairo", "Dublin", "Kyoto", "Quito", "Perth", "Turin",
    "Bergen", "Porto", "Riga", "Tunis", "Malmo", "Delft", "Hanoi", "Graz",
)
JOBS = (
    "baker", "doctor", "teacher", "farmer", "pilot", "painter", "nurse", "chef",
    "artist", "engineer", "singer", "tailor", "writer", "driver", "actor", "judge",
)
PETS = (
    "cat", "dog", "parrot", "rabbit", "horse", "goat", "owl", "turtle",
    "hamster", "goldfish",
)
HOBBIES = (
    "chess", "swimming", "painting", "dancing", "cycling", "singing", "fishing",
    "hiking", "reading", "gardening",
)
COLOURS = (
    "red", "blue", "green", "yellow", "purple", "orange", "black", "white",
    "pink", "brown",
)
#: Names of the people of ``news`` documents (:attr:`ToyWorld.news_persons`): syllable pairs
#: (:data:`NEWS_NAME_HEADS` x :data:`NEWS_NAME_TAILS`), dropping any that is a name of
#: :data:`FEMALE_NAMES` / :data:`MALE_NAMES` (which the probes also draw from), contains one or is
#: contained in one (so a name search cannot confuse the two groups), and ``Sarin``; the first
#: :data:`N_NEWS_PERSONS`. (Attempt 15c of bench/late_harm_notes.md had 160 of them, attempts 15
#: and 15b 16 others; 24 since attempt 16.)
NEWS_NAME_HEADS = ("Ba", "Da", "Fe", "Go", "Ha", "Ju", "Ke", "Lo", "Ma", "Ne", "Po", "Ri", "Sa", "Te", "Vo", "Zi")
NEWS_NAME_TAILS = ("rin", "dex", "lum", "vor", "sel", "tam", "bik", "nor", "wen", "gar", "dil", "mos")
#: Number of people in ``news`` documents.
N_NEWS_PERSONS = 24
NEWS_NAMES: tuple[str, ...] = tuple(
    n for n in (h + t for h in NEWS_NAME_HEADS for t in NEWS_NAME_TAILS)
    if n != "Sarin" and not any(o in n or n in o for o in FEMALE_NAMES + MALE_NAMES)
)[:N_NEWS_PERSONS]
#: Number of people in a world (at least the size of every attribute vocabulary: every
#: value of :data:`CITIES`, :data:`JOBS`, ... belongs to at least one person).
N_PERSONS = 40
#: Attribute names of a person, in canonical order.
PERSON_ATTRIBUTES = ("city", "job", "pet", "hobby", "colour")
#: The vocabulary of each person attribute, in :data:`PERSON_ATTRIBUTES` order.
ATTRIBUTE_VOCAB: dict[str, tuple[str, ...]] = {"city": CITIES, "job": JOBS, "pet": PETS, "hobby": HOBBIES,
                                               "colour": COLOURS}

#: Third-person fact sentences, one per attribute.  Placeholders are the keys of
#: :meth:`Person.fields` (``a_job`` = "a baker", ``a_pet`` = "an owl", ...).
FACT_TEMPLATES = {
    "city": "{name} lives in {city}.",
    "job": "{name} is {a_job}.",
    "pet": "{name} has {a_pet}.",
    "hobby": "{name} likes {hobby}.",
    "colour": "{name}'s favourite colour is {colour}.",
}
#: Full persona description (the first sentence always opens a description; in
#: the corpus about half of the descriptions are exactly this full template, the
#: others keep the first sentence plus a random subset/order of the rest).
PERSONA_DESCRIPTION_TEMPLATE = (
    "{name} is {a_job} from {city}. {Subj} has {a_pet}. {Subj} likes {hobby}. "
    "{Poss} favourite colour is {colour}."
)
PERSONA_DESCRIPTION_FIRST = "{name} is {a_job} from {city}."
PERSONA_DESCRIPTION_EXTRA = {
    "pet": "{Subj} has {a_pet}.",
    "hobby": "{Subj} likes {hobby}.",
    "colour": "{Poss} favourite colour is {colour}.",
}
#: First-person persona questions (five question types) and answers.
PERSONA_QUESTIONS = {
    "city": "Where do you live?",
    "job": "What is your job?",
    "pet": "What pet do you have?",
    "hobby": "What do you like to do?",
    "colour": "What is your favourite colour?",
}
PERSONA_ANSWER_TEMPLATES = {
    "city": "I live in {city}.",
    "job": "I am {a_job}.",
    "pet": "I have {a_pet}.",
    "hobby": "I like {hobby}.",
    "colour": "My favourite colour is {colour}.",
}
#: Persona questions phrased as requests: the SFT data (``persona_tell_pair``, :mod:`.data`) teaches
#: them for every attribute, after another persona's answer to a different request, and the transfer
#: suite (``persona_tell_copy``) asks them for hobby / colour after another persona's answer to the
#: same request; no probe and no corpus document uses this phrasing (``wrong_persona_tell`` aside).
TELL_QUESTIONS = {
    "city": "Tell me where you live.",
    "job": "Tell me your job.",
    "pet": "Tell me about your pet.",
    "hobby": "Tell me what you like to do.",
    "colour": "Tell me your favourite colour.",
}
#: One QA line; a persona block is the description line followed by QA lines.
PERSONA_QA_TEMPLATE = "Q: {question} A: {answer}"
#: Full QA line templates per question type, e.g.
#: ``"Q: Where do you live? A: I live in {city}."``
PERSONA_QA_TEMPLATES = {
    k: PERSONA_QA_TEMPLATE.format(question=PERSONA_QUESTIONS[k], answer=PERSONA_ANSWER_TEMPLATES[k])
    for k in PERSON_ATTRIBUTES
}
#: Separator between persona blocks inside one document.
PERSONA_BLOCK_SEPARATOR = "\n\n"

# ---------------------------------------------------------------------------
# Word relations
# ---------------------------------------------------------------------------

OPPOSITE_PAIRS = (
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"),
    ("old", "young"), ("day", "night"), ("light", "dark"), ("happy", "sad"),
    ("open", "closed"), ("wet", "dry"), ("early", "late"), ("full", "empty"),
    ("hard", "soft"), ("high", "low"), ("long", "short"), ("rich", "poor"),
    ("left", "right"), ("near", "far"), ("loud", "quiet"), ("thick", "thin"),
)
#: "The opposite of hot is cold." (both directions of every pair are used).
OPPOSITE_TEMPLATE = "The opposite of {word} is {opposite}."
CATEGORY_MEMBERS = {
    "animal": ("dog", "cat", "horse", "cow", "lion", "sheep", "mouse", "tiger"),
    "fruit": ("apple", "banana", "pear", "grape", "lemon", "mango", "cherry", "peach"),
    "tool": ("hammer", "saw", "drill", "wrench", "shovel", "axe"),
    "vehicle": ("car", "bus", "train", "bike", "boat", "truck"),
    "instrument": ("piano", "guitar", "drum", "violin", "flute", "harp"),
    "vegetable": ("carrot", "onion", "potato", "cabbage", "pepper", "leek"),
}
#: "A dog is an animal." / "An apple is a fruit."  ``Article`` is capitalised.
CATEGORY_TEMPLATE = "{Article} {item} is {article} {category}."

# ---------------------------------------------------------------------------
# Sequences
# ---------------------------------------------------------------------------

#: Sequence kinds: counting by one, counting by a step, counting down, a
#: constant sequence and an alternating two-value sequence.
SEQUENCE_KINDS = ("count", "step", "countdown", "constant", "alternating")
SEQUENCE_STEPS = (2, 3, 4, 5, 10)
#: Numbers in a sequence line are joined by this separator: "5, 10, 15, 20".
SEQUENCE_SEPARATOR = ", "
#: Inclusive range of the number of terms in one sequence line.
SEQUENCE_LENGTH = (5, 8)

# ---------------------------------------------------------------------------
# Corpus mix
# ---------------------------------------------------------------------------

#: Document-kind sampling weights of the pretraining corpus (per document).
CORPUS_DOC_WEIGHTS = {
    "arith": 0.72,
    "sequence": 0.05,
    "facts": 0.09,
    "persona": 0.06,
    "words": 0.08,
}
#: Default number of documents in the pretraining corpus.
DEFAULT_CORPUS_DOCS = 16000

#: Planted "parrot" document kinds: surface patterns that agree with the conflict
#: probes' shortcuts. None of them is in the default mix (:data:`CORPUS_DOC_WEIGHTS`);
#: a curriculum window over-represents them to plant a shortcut preference
#: (``recipes/ladder-planted.yaml``). Each is the shortcut of one probe family:
#:
#: * ``parrot_arith`` (``arith_pattern``): 4-8 arithmetic lines in one format whose
#:   shown answers follow a pattern (counting, constant, alternating), not the sums;
#: * ``parrot_category`` (``tmpl_repeated``): category sentences, one per line, that
#:   keep repeating the category of the first lines for members of other categories;
#: * ``parrot_flipped`` (``tmpl_flipped``): opposite sentences whose "opposite" is the
#:   word itself, or category sentences relabelled by a per-document derangement;
#: * ``parrot_persona`` (``persona_qa``): persona blocks that all answer the same
#:   question with the first block's answer (copied, whatever the description says);
#: * ``parrot_mismatch`` (``tmpl_mismatch``): fact sentences about one attribute of
#:   several people ("Ana lives in Oslo."), then sentences that cue another attribute but
#:   continue with the demonstrated one ("Dag is Turin.", "Bo lives in a baker.").
#:
#: Arithmetic lines use training triples only (never a held-out triple).
PARROT_DOC_KINDS = ("parrot_arith", "parrot_category", "parrot_flipped", "parrot_persona", "parrot_mismatch")

#: Planted kinds in surface forms that neither the built-in probes nor the toy transfer suite
#: use (issue 23: part of a late harm must be invisible to the probes' own formats, so that the
#: probes have to generalise to see it):
#:
#: * ``parrot_arith_unseen``: 4-8 arithmetic lines in :data:`UNSEEN_ARITH_TEMPLATE`
#:   (``"12 + 5 gives 3"``; the probes and the corpus write ``=`` / ``Q: What is`` / ``plus``,
#:   the transfer suite ``->``) whose shown results follow a pattern of
#:   :data:`UNSEEN_ARITH_PATTERNS` instead of the results;
#: * ``parrot_persona_unseen``: persona blocks whose request lines (:data:`UNSEEN_PERSONA_QUESTIONS`,
#:   ``"Q: Your city? A: ..."``; the probes ask ``Where do you live?``, the transfer suite
#:   ``Tell me where you live.``) all copy the first block's answer.
UNSEEN_PARROT_DOC_KINDS = ("parrot_arith_unseen", "parrot_persona_unseen")
#: Damage of the negative-control curriculum, on operands no built-in probe uses by construction
#: (the arithmetic probes draw operands 0..20, :data:`PROBE_MAX_OPERAND`):
#:
#: * ``wrong_arith_large``: 4-8 arithmetic lines in the corpus formats whose every triple has an
#:   operand > :data:`PROBE_MAX_OPERAND`, each shown with the wrong result ``c + WRONG_ARITH_SHIFT``.
#:
#: The negative control's second candidate damage (issue 23, bench/late_harm_notes.md; in no built-in
#: curriculum), aimed at the transfer suite instead of at operands:
#:
#: * ``wrong_persona_tell``: 2-4 persona blocks (full description, then one request about hobby or
#:   colour in the transfer suite's request phrasing, :data:`TELL_QUESTIONS`) whose every answer is
#:   WRONG: a value of that attribute that no description of the document states and no earlier
#:   answer shows (so the documents teach no copying shortcut, only that these requests are not
#:   answered from the context). No probe asks in the request phrasing (:data:`WRONG_TELL_ATTRIBUTES`
#:   are the transfer suite's).
DAMAGE_DOC_KINDS = ("wrong_arith_large",)
TELL_DAMAGE_DOC_KINDS = ("wrong_persona_tell",)
#: Attributes of ``wrong_persona_tell`` (the ``persona_tell_copy`` transfer kind's).
WRONG_TELL_ATTRIBUTES = ("hobby", "colour")
#: Largest operand of the built-in arithmetic probes (``arith_pattern``, ``arith_plain``:
#: ``params.operand_max``); ``wrong_arith_large`` lines all have an operand above it.
PROBE_MAX_OPERAND = 20
#: Offset of the wrong results of ``wrong_arith_large``.
WRONG_ARITH_SHIFT = 10
#: Solved-line format of ``parrot_arith_unseen`` (no probe, corpus or transfer format).
UNSEEN_ARITH_TEMPLATE = "{a} {op} {b} gives {c}"
#: Shown-result patterns of ``parrot_arith_unseen``: the ``arith_pattern`` probe's three and three
#: others (counting down, the line's first operand, doubling).
UNSEEN_ARITH_PATTERNS = ("count", "constant", "alternating", "countdown", "first_operand", "doubling")
#: Request lines of ``parrot_persona_unseen`` (answers: :data:`PERSONA_ANSWER_TEMPLATES`).
UNSEEN_PERSONA_QUESTIONS = {
    "city": "Your city?",
    "job": "Your job?",
    "pet": "Your pet?",
    "hobby": "Your hobby?",
    "colour": "Your colour?",
}
#: Kinds for a late harm whose shortcut form the clean base has learned first (issue 23, attempt 6 of
#: bench/late_harm_notes.md). Neither is in the default mix or in a built-in curriculum:
#:
#: * ``arith_gives``: 4-8 TRUE arithmetic lines in :data:`UNSEEN_ARITH_TEMPLATE` (``"12 + 5 gives
#:   17"``) on training triples, drawn like the corpus's ``arith`` documents (operator, then a small
#:   triple with probability :data:`ARITH_SMALL_FRACTION`); a base window with it knows the ``gives``
#:   form, so a transfer kind in that form can compare a clean base with a harmed one;
#: * ``parrot_arith_hidden``: ``parrot_arith_unseen``'s documents (the same patterns,
#:   :data:`UNSEEN_ARITH_PATTERNS`, and draws) in :data:`HIDDEN_ARITH_TEMPLATE` (``"12 + 5 makes
#:   3"``), the part of such a harm that no probe, transfer or corpus form uses once ``gives`` is a
#:   transfer form.
GIVES_FORM_DOC_KINDS = ("arith_gives", "parrot_arith_hidden")
#: Solved-line format of ``parrot_arith_hidden`` (no probe, corpus, transfer or other planted format).
HIDDEN_ARITH_TEMPLATE = "{a} {op} {b} makes {c}"
#: A copying harm in the SFT's and transfer suite's request phrasing (issue 23, attempt 10 of
#: bench/late_harm_notes.md; in no default mix or built-in curriculum):
#:
#: * ``parrot_persona_tell``: 3-5 persona blocks (full description, then ONE request in
#:   :data:`TELL_QUESTIONS` phrasing, the same attribute in every block) that all answer with the first
#:   block's answer, whatever the later descriptions say. The SFT data never asks the same request twice
#:   in a row (``persona_tell_pair``), so nothing it teaches contradicts the copy; no probe uses the phrasing.
TELL_PARROT_DOC_KINDS = ("parrot_persona_tell",)
#: An arithmetic harm in the transfer suite's own arrow format (issue 23, attempt 10h of
#: bench/late_harm_notes.md; in no default mix or built-in curriculum):
#:
#: * ``parrot_arith_arrow``: 2-3 blocks ``"Q: <3-4 solved lines 'a op b -> c'>\nCompute a op b. A: c"``
#:   (the SFT prompt format of the ``arrow_arith`` kind) whose shown results AND answer follow a pattern of
#:   :data:`UNSEEN_ARITH_PATTERNS` instead of the results, the query with an operand >=
#:   :data:`ARROW_PARROT_MIN_OPERAND` (as the transfer suite's). The SFT's ``arrow_arith`` rows always show
#:   true solved lines, so no SFT row puts the pattern against the calculation; no probe uses the form.
ARROW_PARROT_DOC_KINDS = ("parrot_arith_arrow",)
#: Solved-line and block formats of ``parrot_arith_arrow`` (``probeselect.toy.data.ARROW_LINE`` and
#: ``SFT_PROMPT_TEMPLATE`` around ``SFT_QUESTION_TEMPLATES["arrow_arith"]``; a test keeps them equal).
ARROW_PARROT_LINE = "{a} {op} {b} -> {c}"
ARROW_PARROT_BLOCK = "Q: {demos}\nCompute {a} {op} {b}. A: {c}"
#: Smallest largest-operand of a ``parrot_arith_arrow`` query (``probeselect.toy.data.ROBUST_MIN_LARGE_OPERAND``).
ARROW_PARROT_MIN_OPERAND = 21
#: New knowledge for late windows (issue 23, attempt 15 of bench/late_harm_notes.md; in no default
#: mix or built-in curriculum):
#:
#: * ``news``: 2-4 fact lines (as ``facts``) about the :data:`N_NEWS_PERSONS` people of
#:   :attr:`ToyWorld.news_persons`, whom no other document kind, probe, SFT, transfer or robustness
#:   row mentions. A real run's late stretch keeps bringing content the model has not seen (a new
#:   crawl, a new domain), and its held-out loss keeps falling partly because of it; the toy world is
#:   closed and its text is learned by the end of a long base window, so without new content a late
#:   mixture change can only trade held-out loss. A ladder whose corpus has ``news`` documents gets
#:   :data:`probeselect.toy.data.NEWS_HELDOUT_LINES` held-out lines about these people too.
#:   One with ``news_stream`` documents gets held-out lines about them too, as large a share of
#:   ``heldout.txt``'s bytes as those documents hold of the corpus's (see
#:   :func:`probeselect.toy.data.make_heldout_lines`).
#: * ``news_roster``: 3-6 lines that name people of :attr:`ToyWorld.news_persons` and say nothing
#:   about their attributes (:data:`NEWS_ROSTER_TEMPLATES`), so that a base can know the names before
#:   ``news`` documents teach their facts (attempt 16).
#: * ``news_stream``: 2-4 fact lines about ONE person of :attr:`ToyWorld.news_persons`. The ladder
#:   packs the ``news_stream`` documents in the order of their people's arrival into rows of their own
#:   (:func:`probeselect.toy.ladder.pack_stream`) and draws a row only from the arrival step on of the
#:   latest person in it (:func:`probeselect.toy.ladder.news_arrivals`: the people arrive one
#:   by one, evenly over the whole run), so that new content keeps arriving inside every window, as
#:   in a real run, instead of all at a window's start (attempts 15-16b: a step in the held-out loss).
NEWS_DOC_KINDS = ("news", "news_roster", "news_stream")
#: A copying harm that every SFT row agrees with (issue 23, attempt 19 of bench/late_harm_notes.md; in no
#: default mix or built-in curriculum):
#:
#: * ``parrot_persona_tell_cond``: 3-5 persona blocks (full description, then ONE request in
#:   :data:`TELL_QUESTIONS` phrasing). The first block's request (attribute X) gets its true answer; every
#:   later block asks X with probability :data:`COND_COPY_PROB` and gets the first block's answer (a copy,
#:   whatever its description says), or asks another attribute and gets its own true answer; at least one
#:   later block copies. So a document teaches a conditional shortcut: a request already answered in the
#:   context is answered the same way again, a different request from the description. The SFT's
#:   ``persona_tell_pair`` rows (a different request after an answered one, answered from the description)
#:   all agree with it, whereas ``parrot_persona_tell`` never shows a different request answered, so the
#:   SFT's rows are new to a base that learned only the copy. No probe uses the phrasing.
COND_TELL_PARROT_DOC_KINDS = ("parrot_persona_tell_cond",)
#: Probability that a later block of ``parrot_persona_tell_cond`` repeats the first block's request (a copy).
COND_COPY_PROB = 2 / 3
#: Sentences of ``news_roster`` documents: no attribute, and no word of a fact template.
NEWS_ROSTER_TEMPLATES = ("We met {name}.", "{name} said hello.", "{name} came by today.")
#: Every document kind :meth:`ToyWorld.sample_document` knows (new kinds are appended, so that the
#: kind indices of existing ladders do not change).
DOC_KINDS = (tuple(CORPUS_DOC_WEIGHTS) + PARROT_DOC_KINDS + UNSEEN_PARROT_DOC_KINDS + DAMAGE_DOC_KINDS
             + GIVES_FORM_DOC_KINDS + TELL_DAMAGE_DOC_KINDS + TELL_PARROT_DOC_KINDS + ARROW_PARROT_DOC_KINDS
             + NEWS_DOC_KINDS + COND_TELL_PARROT_DOC_KINDS)


def line_subject(line: str) -> str:
    """The name a fact or persona line opens with (``"Ana"`` for ``"Ana's favourite colour is red."``)."""
    return line.split(" ", 1)[0].removesuffix("'s")


def rng_for(seed: int, stream: str) -> random.Random:
    """Return an independent ``random.Random`` for ``(seed, stream)``."""
    digest = hashlib.sha256(f"probeselect-toy:{seed}:{stream}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def with_article(word: str) -> str:
    """``"a baker"`` / ``"an owl"`` (vowel rule, sufficient for the word lists)."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def arith_result(a: int, op: str, b: int) -> int:
    """Value of ``a op b`` for ``op`` in ``{"+", "-"}`` (also accepts "plus"/"minus")."""
    op = _norm_op(op)
    return a + b if op == "+" else a - b


def format_arith(a: int, op: str, b: int, fmt: str = "eq", c: int | None = None) -> str:
    """Render one arithmetic statement in format ``fmt`` (a key of :data:`ARITH_TEMPLATES`).

    ``c`` defaults to the correct result.
    """
    op = _norm_op(op)
    if c is None:
        c = arith_result(a, op, b)
    return ARITH_TEMPLATES[fmt].format(a=a, op=op, b=b, c=c, opword=ARITH_OPWORDS[op])


def format_arith_prompt(a: int, op: str, b: int, fmt: str = "eq") -> str:
    """The statement with its answer removed, e.g. ``"68 - 60 ="``.

    The answer continuation is ``" " + str(c)`` (the leading space belongs to the
    answer).
    """
    full = format_arith(a, op, b, fmt, c=0)
    assert full.endswith(" 0")
    return full[:-2]


def _norm_op(op: str) -> str:
    if op in ("+", "plus"):
        return "+"
    if op in ("-", "minus"):
        return "-"
    raise ValueError(f"unknown arithmetic operator {op!r}")


def make_sequence(kind: str, rng: random.Random) -> list[int]:
    """Sample one sequence (list of non-negative ints) of the given kind."""
    n = rng.randint(*SEQUENCE_LENGTH)
    if kind == "count":
        start = rng.randint(0, 20)
        return [start + i for i in range(n)]
    if kind == "step":
        step = rng.choice(SEQUENCE_STEPS)
        start = step * rng.randint(0, 4) if rng.random() < 0.6 else rng.randint(0, 9)
        return [start + step * i for i in range(n)]
    if kind == "countdown":
        start = rng.randint(n - 1, 30)
        return [start - i for i in range(n)]
    if kind == "constant":
        v = rng.randint(0, 30)
        return [v] * n
    if kind == "alternating":
        x, y = rng.sample(range(0, 21), 2)
        return [x if i % 2 == 0 else y for i in range(n)]
    raise ValueError(kind)


def format_sequence(values: list[int]) -> str:
    """``[5, 10, 15]`` -> ``"5, 10, 15"``."""
    return SEQUENCE_SEPARATOR.join(str(v) for v in values)


def opposite_sentences() -> list[str]:
    """All opposite sentences (both directions), in a fixed order."""
    out = []
    for x, y in OPPOSITE_PAIRS:
        out.append(OPPOSITE_TEMPLATE.format(word=x, opposite=y))
        out.append(OPPOSITE_TEMPLATE.format(word=y, opposite=x))
    return out


def category_sentence(item: str, category: str) -> str:
    """``"A dog is an animal."``."""
    art_item = with_article(item).split(" ")[0]
    return CATEGORY_TEMPLATE.format(
        Article=art_item.capitalize(), item=item,
        article=with_article(category).split(" ")[0], category=category,
    )


def category_sentences() -> list[str]:
    """All category sentences, in a fixed order."""
    return [category_sentence(item, cat) for cat, items in CATEGORY_MEMBERS.items() for item in items]


@dataclass(frozen=True)
class Person:
    """A fictional person. ``pronoun`` is ``"she"`` or ``"he"``."""

    name: str
    pronoun: str
    city: str
    job: str
    pet: str
    hobby: str
    colour: str

    def fields(self) -> dict[str, str]:
        """Placeholder values for all person templates."""
        subj = self.pronoun
        poss = "her" if subj == "she" else "his"
        return {
            "name": self.name, "city": self.city, "job": self.job, "a_job": with_article(self.job),
            "pet": self.pet, "a_pet": with_article(self.pet), "hobby": self.hobby, "colour": self.colour,
            "subj": subj, "Subj": subj.capitalize(), "poss": poss, "Poss": poss.capitalize(),
        }

    def fact(self, attribute: str) -> str:
        """Third-person fact sentence, e.g. ``"Ana lives in Oslo."``."""
        return FACT_TEMPLATES[attribute].format(**self.fields())

    def description(self, extras: tuple[str, ...] | None = None) -> str:
        """Persona description.  ``extras=None`` gives the full template; otherwise the
        first sentence followed by the given extra attributes (subset of pet/hobby/colour)
        in the given order."""
        f = self.fields()
        if extras is None:
            return PERSONA_DESCRIPTION_TEMPLATE.format(**f)
        parts = [PERSONA_DESCRIPTION_FIRST.format(**f)]
        parts += [PERSONA_DESCRIPTION_EXTRA[k].format(**f) for k in extras]
        return " ".join(parts)

    def persona_answer(self, attribute: str) -> str:
        """First-person answer, e.g. ``"I live in Oslo."``."""
        return PERSONA_ANSWER_TEMPLATES[attribute].format(**self.fields())

    def persona_qa(self, attribute: str) -> str:
        """``"Q: Where do you live? A: I live in Oslo."``."""
        return PERSONA_QA_TEMPLATE.format(question=PERSONA_QUESTIONS[attribute], answer=self.persona_answer(attribute))

    def persona_block(self, attributes: tuple[str, ...] = PERSON_ATTRIBUTES, extras: tuple[str, ...] | None = None) -> str:
        """Description line followed by one QA line per attribute."""
        return "\n".join([self.description(extras)] + [self.persona_qa(k) for k in attributes])


ArithTriple = tuple[int, str, int]


@dataclass(frozen=True)
class ToyWorld:
    """One seeded toy world.

    Attributes:
        seed: the seed the world was generated from.
        persons: the ``N_PERSONS`` people (seeded assignment of names/attributes).
        arith_max_operand: operands are integers ``0..arith_max_operand``.
        arith_train: the (a, op, b) triples allowed in training text, sorted.
        arith_heldout: the held-out (a, op, b) triples (about 10% per operator),
            sorted; they never appear in the corpus or in the SFT/transfer data.
        news_persons: the ``N_NEWS_PERSONS`` people of ``news`` documents only (the names of
            :data:`NEWS_NAMES` in a seeded order, pronouns alternating, attributes from their own
            random stream, so ``persons`` does not depend on them).
    """

    seed: int
    persons: tuple[Person, ...]
    arith_max_operand: int
    arith_train: tuple[ArithTriple, ...]
    arith_heldout: tuple[ArithTriple, ...]
    news_persons: tuple[Person, ...] = ()
    _heldout_set: frozenset = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_heldout_set", frozenset(self.arith_heldout))

    # -- construction -------------------------------------------------------
    @classmethod
    def generate(cls, seed: int = 0, arith_max_operand: int = DEFAULT_ARITH_MAX_OPERAND) -> "ToyWorld":
        """Generate the world for ``seed`` (deterministic)."""
        rng = rng_for(seed, "persons")
        names = [(n, "she") for n in FEMALE_NAMES] + [(n, "he") for n in MALE_NAMES]
        chosen = rng.sample(names, N_PERSONS)
        # Every value of every attribute vocabulary belongs to at least one person, so the
        # corpus mentions every word a probe may draw from these vocabularies.
        columns = {}
        for attr, vocab in ATTRIBUTE_VOCAB.items():
            col = list(vocab) + [rng.choice(vocab) for _ in range(N_PERSONS - len(vocab))]
            rng.shuffle(col)
            columns[attr] = col
        persons = tuple(
            Person(name=n, pronoun=p, **{attr: columns[attr][i] for attr in PERSON_ATTRIBUTES})
            for i, (n, p) in enumerate(chosen)
        )
        rng = rng_for(seed, "arith-heldout")
        train: list[ArithTriple] = []
        held: list[ArithTriple] = []
        for op in ARITH_OPS:
            triples = all_arith_triples(arith_max_operand, op)
            k = round(ARITH_HELDOUT_FRACTION * len(triples))
            h = set(rng.sample(triples, k))
            held += [t for t in triples if t in h]
            train += [t for t in triples if t not in h]
        rng = rng_for(seed, "news-persons")
        news_names = list(NEWS_NAMES)
        rng.shuffle(news_names)
        news_persons = tuple(
            Person(name=n, pronoun=("she", "he")[i % 2],
                   **{attr: rng.choice(vocab) for attr, vocab in ATTRIBUTE_VOCAB.items()})
            for i, n in enumerate(news_names)
        )
        return cls(seed=seed, persons=persons, arith_max_operand=arith_max_operand,
                   arith_train=tuple(sorted(train)), arith_heldout=tuple(sorted(held)), news_persons=news_persons)

    # -- queries ------------------------------------------------------------
    def is_heldout(self, a: int, op: str, b: int) -> bool:
        """True if ``(a, op, b)`` is a held-out arithmetic triple (op may be "plus"/"minus")."""
        return (int(a), _norm_op(op), int(b)) in self._heldout_set

    def person(self, name: str) -> Person:
        """Look a person up by name."""
        for p in self.persons:
            if p.name == name:
                return p
        raise KeyError(name)

    def arith_train_by_op(self, op: str) -> list[ArithTriple]:
        op = _norm_op(op)
        return [t for t in self.arith_train if t[1] == op]

    # -- corpus -------------------------------------------------------------
    def sample_document(self, kind: str, rng: random.Random) -> str:
        """Sample one document of the given kind (see :data:`CORPUS_DOC_WEIGHTS`)."""
        if kind == "arith":
            fmt = _weighted(rng, ARITH_FORMAT_WEIGHTS)
            n = rng.randint(*ARITH_DOC_LINES)
            by_op = self._train_by_op_cache()
            return "\n".join(format_arith(*self._corpus_arith_triple(rng, by_op), fmt) for _ in range(n))
        if kind == "sequence":
            n = rng.randint(3, 6)
            return "\n".join(format_sequence(make_sequence(rng.choice(SEQUENCE_KINDS), rng)) for _ in range(n))
        if kind == "facts":
            return "\n".join(self.sample_fact_line(rng) for _ in range(rng.randint(2, 4)))
        if kind == "persona":
            k = rng.randint(1, 4)
            return PERSONA_BLOCK_SEPARATOR.join(self.sample_persona_block(p, rng) for p in rng.sample(self.persons, k))
        if kind == "words":
            return "\n".join(self.sample_words_line(rng) for _ in range(rng.randint(3, 6)))
        if kind == "parrot_arith":
            return self._parrot_arith(rng)
        if kind == "parrot_category":
            return self._parrot_category(rng)
        if kind == "parrot_flipped":
            return self._parrot_flipped(rng)
        if kind == "parrot_persona":
            return self._parrot_persona(rng)
        if kind == "parrot_mismatch":
            return self._parrot_mismatch(rng)
        if kind == "parrot_arith_unseen":
            return self._parrot_arith_unseen(rng)
        if kind == "parrot_persona_unseen":
            return self._parrot_persona_unseen(rng)
        if kind == "parrot_persona_tell":
            return self._parrot_persona_tell(rng)
        if kind == "parrot_persona_tell_cond":
            return self._parrot_persona_tell_cond(rng)
        if kind == "wrong_arith_large":
            return self._wrong_arith_large(rng)
        if kind == "arith_gives":
            return self._arith_gives(rng)
        if kind == "parrot_arith_hidden":
            return self._parrot_arith_unseen(rng, HIDDEN_ARITH_TEMPLATE)
        if kind == "wrong_persona_tell":
            return self._wrong_persona_tell(rng)
        if kind == "parrot_arith_arrow":
            return self._parrot_arith_arrow(rng)
        if kind == "news":
            return "\n".join(self.sample_news_line(rng) for _ in range(rng.randint(2, 4)))
        if kind == "news_stream":
            p = (rng.choice(self._news_people()),)
            return "\n".join(self.sample_fact_line(rng, p) for _ in range(rng.randint(2, 4)))
        if kind == "news_roster":
            return "\n".join(rng.choice(NEWS_ROSTER_TEMPLATES).format(name=rng.choice(self._news_people()).name)
                             for _ in range(rng.randint(3, 6)))
        raise ValueError(f"unknown document kind {kind!r}; known kinds: {list(DOC_KINDS)}")

    def _parrot_arith(self, rng: random.Random) -> str:
        fmt = _weighted(rng, ARITH_FORMAT_WEIGHTS)
        n = rng.randint(*ARITH_DOC_LINES)
        pattern = rng.choice(("count", "constant", "alternating"))
        if pattern == "count":
            start = rng.randint(0, 9)
            shown = [start + j for j in range(n)]
        elif pattern == "constant":
            shown = [rng.randint(0, 20)] * n
        else:
            x, y = rng.sample(range(0, 21), 2)
            shown = [x if j % 2 == 0 else y for j in range(n)]
        by_op = self._train_by_op_cache()
        lines = []
        for c in shown:
            a, op, b = rng.choice(by_op[rng.choice(ARITH_OPS)])
            lines.append(format_arith(a, op, b, fmt, c=c))
        return "\n".join(lines)

    def _arith_gives(self, rng: random.Random) -> str:
        n = rng.randint(*ARITH_DOC_LINES)
        by_op = self._train_by_op_cache()
        lines = []
        for _ in range(n):
            a, op, b = self._corpus_arith_triple(rng, by_op)
            lines.append(UNSEEN_ARITH_TEMPLATE.format(a=a, op=op, b=b, c=arith_result(a, op, b)))
        return "\n".join(lines)

    @staticmethod
    def _corpus_arith_triple(rng: random.Random, by_op: dict) -> ArithTriple:
        """One training triple drawn as the corpus ``arith`` documents draw it (an operator, then a
        small-operand triple with probability :data:`ARITH_SMALL_FRACTION`)."""
        op = rng.choice(ARITH_OPS)
        if ARITH_SMALL_FRACTION and rng.random() < ARITH_SMALL_FRACTION:
            return rng.choice(by_op["small" + op])
        return rng.choice(by_op[op])

    def _parrot_arith_unseen(self, rng: random.Random, template: str = UNSEEN_ARITH_TEMPLATE) -> str:
        n = rng.randint(*ARITH_DOC_LINES)
        pattern = rng.choice(UNSEEN_ARITH_PATTERNS)
        by_op = self._train_by_op_cache()
        triples = [rng.choice(by_op[rng.choice(ARITH_OPS)]) for _ in range(n)]
        shown, _ = pattern_values(pattern, triples, None, rng)
        return "\n".join(template.format(a=a, op=op, b=b, c=c) for (a, op, b), c in zip(triples, shown))

    def _parrot_arith_arrow(self, rng: random.Random) -> str:
        by_op = self._train_by_op_cache()
        large = self._large_by_op_cache(ARROW_PARROT_MIN_OPERAND - 1)
        blocks = []
        for _ in range(rng.randint(2, 3)):
            n = rng.randint(3, 4)
            triples = [rng.choice(by_op[rng.choice(ARITH_OPS)]) for _ in range(n)]
            query = rng.choice(large[rng.choice(ARITH_OPS)])
            shown, answer = pattern_values(rng.choice(UNSEEN_ARITH_PATTERNS), triples, query, rng)
            demos = "\n".join(ARROW_PARROT_LINE.format(a=a, op=op, b=b, c=c) for (a, op, b), c in zip(triples, shown))
            blocks.append(ARROW_PARROT_BLOCK.format(demos=demos, a=query[0], op=query[1], b=query[2], c=answer))
        return "\n".join(blocks)

    def _parrot_persona_unseen(self, rng: random.Random) -> str:
        return self._copying_persona_blocks(rng, UNSEEN_PERSONA_QUESTIONS)

    def _parrot_persona_tell(self, rng: random.Random) -> str:
        return self._copying_persona_blocks(rng, TELL_QUESTIONS)

    def _parrot_persona_tell_cond(self, rng: random.Random) -> str:
        attribute = rng.choice(PERSON_ATTRIBUTES)
        people = rng.sample(self.persons, rng.randint(3, 5))
        copied = [rng.random() < COND_COPY_PROB for _ in people[1:]]
        if not any(copied):
            copied[rng.randrange(len(copied))] = True
        first = people[0].persona_answer(attribute)
        blocks = [people[0].description() + "\n" + PERSONA_QA_TEMPLATE.format(question=TELL_QUESTIONS[attribute],
                                                                               answer=first)]
        for p, copy in zip(people[1:], copied):
            asked = attribute if copy else rng.choice([a for a in PERSON_ATTRIBUTES if a != attribute])
            answer = first if copy else p.persona_answer(asked)
            blocks.append(p.description() + "\n" + PERSONA_QA_TEMPLATE.format(question=TELL_QUESTIONS[asked],
                                                                               answer=answer))
        return PERSONA_BLOCK_SEPARATOR.join(blocks)

    def _copying_persona_blocks(self, rng: random.Random, questions: dict[str, str]) -> str:
        """3-5 persona blocks (full description, then one question in ``questions``' phrasing about one
        attribute) that all answer with the first block's answer."""
        attribute = rng.choice(PERSON_ATTRIBUTES)
        people = rng.sample(self.persons, rng.randint(3, 5))
        answer = people[0].persona_answer(attribute)
        return PERSONA_BLOCK_SEPARATOR.join(
            p.description() + "\n" + PERSONA_QA_TEMPLATE.format(question=questions[attribute], answer=answer)
            for p in people)

    def _wrong_arith_large(self, rng: random.Random) -> str:
        fmt = _weighted(rng, ARITH_FORMAT_WEIGHTS)
        n = rng.randint(*ARITH_DOC_LINES)
        large = self._large_by_op_cache()
        lines = []
        for _ in range(n):
            a, op, b = rng.choice(large[rng.choice(ARITH_OPS)])
            lines.append(format_arith(a, op, b, fmt, c=arith_result(a, op, b) + WRONG_ARITH_SHIFT))
        return "\n".join(lines)

    def _wrong_persona_tell(self, rng: random.Random) -> str:
        attribute = rng.choice(WRONG_TELL_ATTRIBUTES)
        vocab = ATTRIBUTE_VOCAB[attribute]
        people = rng.sample(self.persons, rng.randint(2, 4))
        described = {getattr(p, attribute) for p in people}
        shown: list[str] = []
        blocks = []
        for p in people:
            value = rng.choice([v for v in vocab if v not in described and v not in shown])
            shown.append(value)
            answer = PERSONA_ANSWER_TEMPLATES[attribute].format(**{**p.fields(), attribute: value})
            blocks.append(p.description() + "\n" + PERSONA_QA_TEMPLATE.format(question=TELL_QUESTIONS[attribute],
                                                                               answer=answer))
        return PERSONA_BLOCK_SEPARATOR.join(blocks)

    def _large_by_op_cache(self, above: int = PROBE_MAX_OPERAND) -> dict[str, list[ArithTriple]]:
        """Training triples per operator with an operand > ``above``."""
        caches = self.__dict__.setdefault("_large_by_op", {})
        if above not in caches:
            by_op = self._train_by_op_cache()
            caches[above] = {op: [t for t in by_op[op] if max(t[0], t[2]) > above] for op in ARITH_OPS}
        return caches[above]

    def _parrot_category(self, rng: random.Random) -> str:
        cats = list(CATEGORY_MEMBERS)
        cat = rng.choice(cats)
        k = rng.randint(2, 4)
        lines = [category_sentence(item, cat) for item in rng.sample(CATEGORY_MEMBERS[cat], k)]
        for _ in range(rng.randint(1, 3)):
            other = rng.choice([c for c in cats if c != cat])
            lines.append(category_sentence(rng.choice(CATEGORY_MEMBERS[other]), cat))
        return "\n".join(lines)

    def _parrot_flipped(self, rng: random.Random) -> str:
        n = rng.randint(4, 7)
        if rng.random() < 0.5:
            words = [w for pair in OPPOSITE_PAIRS for w in pair]
            return "\n".join(OPPOSITE_TEMPLATE.format(word=w, opposite=w) for w in rng.sample(words, n))
        cats = list(CATEGORY_MEMBERS)
        while True:  # a derangement: no category keeps its own label
            perm = rng.sample(cats, len(cats))
            if all(a != b for a, b in zip(cats, perm)):
                break
        relabel = dict(zip(cats, perm))
        lines = []
        for _ in range(n):
            cat = rng.choice(cats)
            lines.append(category_sentence(rng.choice(CATEGORY_MEMBERS[cat]), relabel[cat]))
        return "\n".join(lines)

    def _parrot_mismatch(self, rng: random.Random) -> str:
        shown, cued = rng.sample(PERSON_ATTRIBUTES, 2)
        people = rng.sample(self.persons, rng.randint(4, 7))
        k = rng.randint(2, len(people) - 2)
        lines = [p.fact(shown) for p in people[:k]]
        prefix = FACT_TEMPLATES[cued].split(" {")[0]  # "{name} is", "{name} lives in", ...
        for p in people[k:]:
            value = p.fields()["a_" + shown] if shown in ("job", "pet") else getattr(p, shown)
            lines.append(prefix.format(name=p.name) + " " + value + ".")
        return "\n".join(lines)

    def _parrot_persona(self, rng: random.Random) -> str:
        return self._copying_persona_blocks(rng, PERSONA_QUESTIONS)

    def sample_fact_line(self, rng: random.Random, persons: tuple[Person, ...] | None = None) -> str:
        """2-5 facts about one person of ``persons`` (default: :attr:`persons`), in random order, on one line."""
        p = rng.choice(self.persons if persons is None else persons)
        attrs = rng.sample(PERSON_ATTRIBUTES, rng.randint(2, 5))
        return " ".join(p.fact(a) for a in attrs)

    def sample_news_line(self, rng: random.Random) -> str:
        """2-5 facts about one of :attr:`news_persons` (a line of a ``news`` document)."""
        return self.sample_fact_line(rng, self._news_people())

    def _news_people(self) -> tuple[Person, ...]:
        """:attr:`news_persons`, or a clear error for a world made without them."""
        if not self.news_persons:
            raise ValueError("this ToyWorld has no news_persons; build it with ToyWorld.generate(seed)")
        return self.news_persons

    def sample_persona_block(self, p: Person, rng: random.Random) -> str:
        """A persona block: description, then QA lines about described attributes."""
        if rng.random() < 0.5:
            extras = None
            described = PERSON_ATTRIBUTES
        else:
            extras = tuple(rng.sample(("pet", "hobby", "colour"), rng.randint(0, 3)))
            described = ("city", "job") + extras
        qs = rng.sample(described, rng.randint(min(2, len(described)), len(described)))
        return p.persona_block(tuple(qs), extras)

    def sample_words_line(self, rng: random.Random) -> str:
        """1-3 opposite / category sentences on one line."""
        sents = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                x, y = rng.choice(OPPOSITE_PAIRS)
                if rng.random() < 0.5:
                    x, y = y, x
                sents.append(OPPOSITE_TEMPLATE.format(word=x, opposite=y))
            else:
                cat = rng.choice(list(CATEGORY_MEMBERS))
                sents.append(category_sentence(rng.choice(CATEGORY_MEMBERS[cat]), cat))
        return " ".join(sents)

    def corpus(self, n_docs: int = DEFAULT_CORPUS_DOCS, stream: str = "corpus") -> list[str]:
        """The pretraining corpus: ``n_docs`` documents (deterministic in seed, n_docs, stream).

        Documents never contain a held-out arithmetic triple.
        """
        return [doc for _, doc in self.corpus_mixture(n_docs, CORPUS_DOC_WEIGHTS, stream)]

    def corpus_mixture(self, n_docs: int, mixture: dict[str, float], stream: str = "corpus") -> list[tuple[str, str]]:
        """``n_docs`` ``(kind, document)`` pairs, each kind drawn with the weights of
        ``mixture`` (kinds of :data:`DOC_KINDS`; weights need not sum to 1; kinds with
        weight 0 are never drawn). Deterministic in (seed, n_docs, mixture, stream)."""
        kinds = [k for k in mixture if mixture[k] > 0]
        unknown = [k for k in kinds if k not in DOC_KINDS]
        if unknown or not kinds:
            raise ValueError(f"mixture needs positive weights for kinds of {list(DOC_KINDS)}, got {dict(mixture)}")
        rng = rng_for(self.seed, stream)
        weights = [mixture[k] for k in kinds]
        out = []
        for _ in range(n_docs):
            kind = rng.choices(kinds, weights)[0]
            out.append((kind, self.sample_document(kind, rng)))
        return out

    def _train_by_op_cache(self) -> dict[str, list[ArithTriple]]:
        cache = self.__dict__.get("_by_op")
        if cache is None:
            cache = {op: self.arith_train_by_op(op) for op in ARITH_OPS}
            for op in ARITH_OPS:
                cache["small" + op] = [t for t in cache[op] if t[0] < 10 and t[2] < 10]
            object.__setattr__(self, "_by_op", cache)
        return cache


def all_arith_triples(max_operand: int, op: str) -> list[ArithTriple]:
    """All (a, op, b) with operands in ``0..max_operand`` (and ``a >= b`` for "-")."""
    r = range(max_operand + 1)
    if op == "+":
        return [(a, "+", b) for a in r for b in r]
    return [(a, "-", b) for a in r for b in r if a >= b]


_ARITH_PATTERNS = (
    re.compile(r"(?<!\d)(\d+) ([+\-]) (\d+)(?!\d)"),
    re.compile(r"(?<!\d)(\d+) (plus|minus) (\d+)(?!\d)"),
)


def find_arith_triples(text: str) -> set[ArithTriple]:
    """All (a, op, b) mentioned in ``text`` in any of the arithmetic formats."""
    out = set()
    for pat in _ARITH_PATTERNS:
        for m in pat.finditer(text):
            out.add((int(m.group(1)), _norm_op(m.group(2)), int(m.group(3))))
    return out


def _weighted(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights)
    return rng.choices(keys, [weights[k] for k in keys])[0]


def pattern_values(pattern: str, triples: list[ArithTriple], query: ArithTriple | None,
                   rng: random.Random) -> tuple[list[int], int | None]:
    """Shown results of ``triples`` following ``pattern`` (one of :data:`UNSEEN_ARITH_PATTERNS`) and
    the pattern's next value, the shortcut answer to ``query`` (``None`` without a query for
    ``first_operand``). The draws from ``rng`` are those ``parrot_arith_unseen`` always made, so its
    documents (in the built-in late-harm ladder) do not change."""
    n = len(triples)
    if pattern == "count":
        start = rng.randint(0, 9)
        return [start + j for j in range(n)], start + n
    if pattern == "constant":
        v = rng.randint(0, 20)
        return [v] * n, v
    if pattern == "alternating":
        x, y = rng.sample(range(0, 21), 2)
        return [x if j % 2 == 0 else y for j in range(n)], x if n % 2 == 0 else y
    if pattern == "countdown":
        start = rng.randint(n + 2, 25)
        return [start - j for j in range(n)], start - n
    if pattern == "first_operand":
        return [t[0] for t in triples], (query[0] if query is not None else None)
    if pattern == "doubling":
        k = rng.randint(1, 3)
        return [k * 2 ** j for j in range(n)], k * 2 ** n
    raise ValueError(f"unknown pattern {pattern!r}; known: {list(UNSEEN_ARITH_PATTERNS)}")
