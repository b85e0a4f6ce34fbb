"""GDsuite's released data format, scored with GDsuite's protocol.

A spec such as::

    format: gdsuite
    root: /data/generalization-dynamics-evals   # relative paths: to the YAML file
    family: successive_answer
    # tasks: [number_words, {name: arithmetic, k: 16}]   # default: GDsuite's config.yaml
    # k: {letters: 5}                                     # per-task demonstration counts
    # n_items: 50                                         # at most the first 50 test rows (GDsuite's --max_eval)
    # boundary: gdsuite                                   # or lmeval (probeselect's default contract)

reads ``<root>/<family>/<task>.jsonl`` (rows ``{split: demo|test, prompt, answer,
label?, demo_set?}`` / ``{split: test, prompt, correct_answer, incorrect_answer, ...}``)
and builds the prompts exactly as GDsuite's ``run_logprob_family`` does (see
:mod:`._demos` for the strategies, the seed -> demo-set rule and the joiners). The task
answer is ``" " + correct_answer``, the shortcut ``" " + incorrect_answer``. Item ids are
``gdsuite.<family>/<task>/<test index>`` (a ``/`` inside a task name becomes ``.``).

With ``boundary: gdsuite`` (the default here) the answer tokens are found as GDsuite
finds them: the boundary is ``len(encode(prompt + " "))`` without special tokens (or
``len(encode(prompt))`` when the trailing space changes the prompt's tokens), applied to
the full text tokenized *with* the tokenizer's special tokens (what vLLM scores), so a
tokenizer that prepends BOS also scores the last prompt token, exactly like GDsuite. The
scores table then carries GDsuite's per-item ``correct_avg_prob`` (mean per-token
probability), ``incorrect_avg_prob``, ``correct_log_prob`` and ``incorrect_log_prob``
(summed log-probabilities over those positions) and the summary GDsuite's
``hard_accuracy`` (fraction with correct_avg_prob > incorrect_avg_prob) and
``prob_margin`` (mean correct_avg_prob - incorrect_avg_prob).

``family: multihop_persona_qa`` reads persona folders (``<root>/multihop_persona_qa/
<persona>/facts.jsonl`` in chat ``messages`` form and ``test_questions.json`` with
``id``, ``question``, ``expected_answer_regex``) and runs GDsuite's generative protocol
(see :func:`persona_prompts` and ``probeselect.gdsuite_persona``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .._io import canonical_json_hash
from ..errors import ProbeSpecError, did_you_mean
from ._demos import JOINERS, STRATEGIES, build_icl_prompt, demo_block, icl_prompts
from ..items import ProbeItem
from ._registry import Family, register_user_family
from ._spec import FamilySpec

FORMAT = "gdsuite"
_LINE = "\0line"  # key of the source line number inside a row while loading
PERSONA_FAMILY = "multihop_persona_qa"
BOUNDARIES = ("gdsuite", "lmeval")

#: GDsuite's config.yaml: strategy, joiner and (task -> k) per log-prob family.
FAMILY_CONFIG: dict[str, dict[str, Any]] = {
    "flipped_answer": {"strategy": "balanced", "joiner": "\n\n", "tasks": {
        "sst2": 64, "imdb": 24, "rotten_tomatoes": 64, "poem_sentiment": 64, "yahoo_health_computers": 64,
        "yahoo_business_science": 64, "emotion": 100, "emotion_anger_joy": 100}},
    "repetitive_answer": {"strategy": "random", "joiner": "\n", "tasks": {
        "code_tracing": 8, "letter_counting": 4, "logic": 64, "algebra/original": 0, "algebra/v2fmt": 0,
        "algebra/numbered": 0, "algebra/instruction": 0}},
    "successive_answer": {"strategy": "ordered", "joiner": "\n", "tasks": {
        "number_words": 10, "letters": 10, "arithmetic": 32, "even": 32}},
    "truthy_answer": {"strategy": "random", "joiner": "\n", "tasks": {
        "surprising_truth": 8, "common_misconception": 100}},
    "intuitive_answer": {"strategy": "none", "joiner": "\n", "tasks": {"crt": 0}},
}
#: GDsuite's config.yaml for the generative persona family.
PERSONA_CONFIG: dict[str, Any] = {
    "personas": ["wolf", "oppenheimer", "rasputin", "hubbard", "rand", "madoff"],
    "n_samples": 100, "temperature": 1.0, "max_new_tokens": 300, "stop": ["\nQ:", "\n\nQ:"],
}
FAMILIES = tuple(FAMILY_CONFIG) + (PERSONA_FAMILY,)
_LOGPROB_KEYS = {"format", "root", "family", "name", "tasks", "k", "n_items", "boundary", "demo_strategy", "joiner",
                 "description"}
_PERSONA_KEYS = {"format", "root", "family", "name", "personas", "n_samples", "temperature", "max_new_tokens", "stop",
                 "n_items", "description"}


@dataclass(frozen=True, eq=False)
class GDsuiteData:
    """The parsed GDsuite data of one spec (held by ``FamilySpec.user_data``).

    ``tasks`` maps variant (task name with ``/`` -> ``.``) to ``(task name, k, demo rows,
    test rows)`` for log-prob families; ``personas`` maps persona -> ``(facts, questions)``
    for the persona family. ``content_hash`` hashes everything that shapes the prompts.
    """

    family: str
    root: str
    files: tuple[str, ...]
    content_hash: str
    tasks: dict = field(default_factory=dict)
    personas: dict = field(default_factory=dict)
    form: str = FORMAT
    kind: str = "conflict"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GDsuiteData) and self.content_hash == other.content_hash

    def __hash__(self) -> int:
        return hash(self.content_hash)

    @property
    def is_persona(self) -> bool:
        return self.family == PERSONA_FAMILY

    def counts(self) -> dict[str, int]:
        if self.is_persona:
            return {p: len(qs) for p, (_, qs) in self.personas.items()}
        return {v: len(t[3]) for v, t in self.tasks.items()}

    def summary(self) -> dict[str, Any]:
        return {"form": FORMAT, "gdsuite_family": self.family, "files": list(self.files),
                "content_sha256": self.content_hash, "counts": self.counts()}

    def register(self, spec: FamilySpec) -> None:
        register_user_family(
            Family(name=spec.family, generate=generate_gdsuite_items, variants=tuple(self.counts()),
                   default_n_items=spec.n_items, default_n_demos=spec.n_demos,
                   description=spec.description or f"GDsuite data: {self.family} ({self.root})",
                   kind="generative" if self.is_persona else "conflict"),
            source=str(spec.path) if spec.path else "",
        )


def is_gdsuite_spec(spec: FamilySpec) -> bool:
    return isinstance(spec.user_data, GDsuiteData)


def is_persona_spec(spec: FamilySpec) -> bool:
    return is_gdsuite_spec(spec) and spec.user_data.is_persona


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def _read_jsonl(path: Path, label: str) -> list[dict]:
    if not path.is_file():
        raise ProbeSpecError(f"{label}: file not found: {path}; check `root:` and the task name "
                             "(GDsuite's layout is <root>/<family>/<task>.jsonl).")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbeSpecError(f"{path}: line {n}: invalid JSON ({exc.msg}).") from None
            if not isinstance(obj, dict):
                raise ProbeSpecError(f"{path}: line {n}: expected a JSON object.")
            obj[_LINE] = n
            rows.append(obj)
    return rows


def _need_str(path: Path, row: dict, key: str) -> str:
    v = row.get(key)
    if not isinstance(v, str):
        raise ProbeSpecError(f"{path}: line {row[_LINE]}: {row.get('split')} row needs a string `{key}`, got {v!r}.")
    return v


def _task_rows(path: Path, strategy: str) -> tuple[list[dict], list[dict]]:
    demos, tests = [], []
    for r in _read_jsonl(path, str(path)):
        split = r.get("split")
        if split == "demo":
            _need_str(path, r, "prompt")
            ans = r.get("answer")
            if not isinstance(ans, (str, int, float)) or isinstance(ans, bool):
                raise ProbeSpecError(f"{path}: line {r[_LINE]}: demo row needs an `answer`.")
            if strategy == "balanced" and r.get("label") not in (0, 1):
                raise ProbeSpecError(f"{path}: line {r[_LINE]}: demo_strategy balanced needs `label` 0 or 1 "
                                     f"on every demo row, got {r.get('label')!r}.")
            if "demo_set" in r and (not isinstance(r["demo_set"], int) or r["demo_set"] < 0):
                raise ProbeSpecError(f"{path}: line {r[_LINE]}: `demo_set` must be an integer >= 0.")
            demos.append(r)
        elif split == "test":
            _need_str(path, r, "prompt")
            c, i = _need_str(path, r, "correct_answer"), _need_str(path, r, "incorrect_answer")
            if c == i:
                raise ProbeSpecError(f"{path}: line {r[_LINE]}: correct_answer equals incorrect_answer ({c!r}).")
            tests.append(r)
        else:
            raise ProbeSpecError(f"{path}: line {r[_LINE]}: `split` must be 'demo' or 'test', got {split!r}.")
    if not tests:
        raise ProbeSpecError(f"{path}: no test rows (split: test).")
    return demos, tests


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != _LINE}


def _tasks_key(raw: dict, cfg: dict, source: str) -> list[tuple[str, int]]:
    defaults = cfg["tasks"]
    tasks = raw.get("tasks", [{"name": n, "k": k} for n, k in defaults.items()])
    if isinstance(tasks, str):
        tasks = [tasks]
    if not isinstance(tasks, list) or not tasks:
        raise ProbeSpecError(f"{source}: `tasks` must be a non-empty list of task names or {{name, k}} mappings.")
    per_k = raw.get("k", {})
    if not isinstance(per_k, dict):
        raise ProbeSpecError(f"{source}: `k` must be a mapping task -> number of demonstrations, got {per_k!r}.")
    out: list[tuple[str, int]] = []
    for t in tasks:
        if isinstance(t, str):
            name, k = t, defaults.get(t, 0)
        elif isinstance(t, dict) and isinstance(t.get("name"), str) and set(t) <= {"name", "k"}:
            name, k = t["name"], t.get("k", defaults.get(t["name"], 0))
        else:
            raise ProbeSpecError(f"{source}: each entry of `tasks` must be a name or {{name: ..., k: ...}}, got {t!r}.")
        k = per_k.get(name, k)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ProbeSpecError(f"{source}: k of task {name!r} must be an integer >= 0, got {k!r}.")
        out.append((name, k))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ProbeSpecError(f"{source}: `tasks` lists a task twice.")
    extra = sorted(set(per_k) - set(names))
    if extra:
        raise ProbeSpecError(f"{source}: `k` names task {extra[0]!r}, which is not in `tasks` {names}.")
    return out


def _root(raw: dict, source: str, path: Path | None) -> Path:
    r = raw.get("root")
    if not isinstance(r, str) or not r.strip():
        raise ProbeSpecError(f"{source}: `root` must be the path of GDsuite's data tree (the folder holding "
                             "<family>/<task>.jsonl), relative to the YAML file or absolute.")
    p = Path(r).expanduser()
    full = p if p.is_absolute() else (path.parent if path is not None else Path.cwd()) / p
    if not full.is_dir():
        raise ProbeSpecError(f"{source}: `root` {full} is not a folder.")
    return full


def _n_items(raw: dict, source: str) -> int | None:
    n = raw.get("n_items")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ProbeSpecError(f"{source}: `n_items` must be an integer >= 1 (at most that many test rows per task).")
    return n


def gdsuite_spec_from_dict(raw: dict, *, source: str = "<dict>", path: Path | None = None) -> FamilySpec:
    """Validate a ``format: gdsuite`` spec, read its data and return its FamilySpec."""
    if raw.get("format") != FORMAT:
        raise ProbeSpecError(f"{source}: `format` must be {FORMAT!r}, got {raw.get('format')!r}.")
    fam = raw.get("family")
    if fam not in FAMILIES:
        raise ProbeSpecError(f"{source}: GDsuite family {fam!r} is unknown.{did_you_mean(str(fam), FAMILIES)} "
                             f"GDsuite families: {list(FAMILIES)}.")
    allowed = _PERSONA_KEYS if fam == PERSONA_FAMILY else _LOGPROB_KEYS
    unknown = sorted(set(raw) - allowed, key=str)
    if unknown:
        raise ProbeSpecError(f"{source}: unknown key {unknown[0]!r} for GDsuite family {fam}."
                             f"{did_you_mean(str(unknown[0]), allowed)} Allowed keys: {sorted(allowed)}.")
    name = raw.get("name", f"gdsuite.{fam}")
    if not isinstance(name, str) or not name.replace("_", "a").replace(".", "a").replace("-", "a").isalnum():
        raise ProbeSpecError(f"{source}: `name` must use letters, digits, '_', '.', '-', got {name!r}.")
    root = _root(raw, source, path)
    n_items = _n_items(raw, source)
    if fam == PERSONA_FAMILY:
        return _persona_spec(raw, source, path, root, name, n_items)
    cfg = FAMILY_CONFIG[fam]
    strategy = raw.get("demo_strategy", cfg["strategy"])
    if strategy not in STRATEGIES:
        raise ProbeSpecError(f"{source}: `demo_strategy` must be one of {sorted(STRATEGIES)}, got {strategy!r}.")
    joiner = raw.get("joiner", cfg["joiner"])
    joiner = JOINERS.get(joiner, joiner)
    if not isinstance(joiner, str):
        raise ProbeSpecError(f"{source}: `joiner` must be a string (e.g. \"\\n\"), got {joiner!r}.")
    boundary = raw.get("boundary", "gdsuite")
    if boundary not in BOUNDARIES:
        raise ProbeSpecError(f"{source}: `boundary` must be one of {list(BOUNDARIES)}, got {boundary!r}.")
    tasks: dict[str, tuple] = {}
    files = []
    for tname, k in _tasks_key(raw, cfg, source):
        f = root / fam / f"{tname}.jsonl"
        demos, tests = _task_rows(f, strategy)
        if n_items is not None:
            tests = tests[:n_items]
        tasks[tname.replace("/", ".")] = (tname, k, tuple(_strip(d) for d in demos), tuple(_strip(t) for t in tests))
        files.append(str(f))
    content = {"family": fam, "strategy": strategy, "joiner": joiner, "boundary": boundary,
               "tasks": {v: [t[0], t[1], list(t[2]), list(t[3])] for v, t in tasks.items()}}
    data = GDsuiteData(family=fam, root=str(root), files=tuple(files), content_hash=canonical_json_hash(content),
                       tasks=tasks)
    return FamilySpec(
        family=name, n_items=max(len(t[3]) for t in tasks.values()), n_demos=max(t[1] for t in tasks.values()),
        variants=tuple(tasks), description=str(raw.get("description", "")), path=path, user_data=data,
        params={"format": FORMAT, "gdsuite_family": fam, "demo_strategy": strategy, "joiner": joiner,
                "boundary": boundary, "k": {v: t[1] for v, t in tasks.items()}},
    )


# ---------------------------------------------------------------------------
# Items (log-prob families)
# ---------------------------------------------------------------------------


def generate_gdsuite_items(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Items of a GDsuite log-prob spec for one evaluation seed (task, then test order)."""
    data: GDsuiteData = spec.user_data
    if data.is_persona:
        return  # generative: see persona_prompts
    p = spec.params
    for variant in spec.variants:
        tname, k, demos, tests = data.tasks[variant]
        prompts = icl_prompts(demos, [t["prompt"] for t in tests], strategy=p["demo_strategy"], k=k, seed=seed,
                              joiner=p["joiner"])
        for i, (t, (prompt, used)) in enumerate(zip(tests, prompts)):
            task, short = " " + t["correct_answer"], " " + t["incorrect_answer"]
            yield ProbeItem(
                item_id=f"{spec.family}/{variant}/{i:04d}", family=spec.family, variant=variant, seed=seed,
                prompt=prompt, task_answer=task, shortcut_answer=short, candidates=(task, short),
                metadata={"boundary": p["boundary"], "gdsuite_task": tname, "k": k, "n_demos": len(used),
                          "fields": {kk: v for kk, v in t.items() if kk not in ("split", "prompt")}},
            )


# ---------------------------------------------------------------------------
# Scoring helpers (GDsuite columns)
# ---------------------------------------------------------------------------

GDSUITE_COLUMNS = ("correct_avg_prob", "incorrect_avg_prob", "correct_log_prob", "incorrect_log_prob")


@dataclass(frozen=True)
class GDsuiteGroup:
    """A scoring group (same fields as :class:`probeselect.spans.EncodedGroup`) whose
    continuations are answer prefixes; ``layout`` holds (number of prefixes, tokens before
    GDsuite's boundary) per candidate."""

    context_ids: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]
    layout: tuple[tuple[int, int], ...] = ()


def wants_gdsuite_boundary(item: ProbeItem) -> bool:
    return item.metadata.get("boundary") == "gdsuite"


def encode_item_gdsuite(tokenizer, item: ProbeItem):
    """The item's scoring group under GDsuite's boundary rule (a :class:`GDsuiteGroup`).

    The candidates' token lists share a context (their longest common prefix, at most
    the earliest GDsuite boundary); each candidate then contributes every prefix of the
    rest of its tokens, so per-token log-probabilities are differences of consecutive
    prefix sums and GDsuite's span (from its own boundary on) can be read off exactly by
    :func:`gdsuite_unpack`.
    """
    from ..spans import encode_pair_gdsuite

    pairs = [encode_pair_gdsuite(tokenizer, item.prompt, c[1:] if c.startswith(" ") else c,
                                 what=f"item {item.item_id} (seed {item.seed}) candidate {c!r}")
             for c in item.candidates]
    fulls = [p.context_ids + p.continuation_ids for p in pairs]
    common = min(len(p.context_ids) for p in pairs)
    for f in fulls[1:]:
        n = 0
        while n < common and f[n] == fulls[0][n]:
            n += 1
        common = n
    if common < 1:
        common = 1  # position 0 is never scored; differing first tokens cannot happen (same prompt)
    conts: list[tuple[int, ...]] = []
    layout = []
    for p, f in zip(pairs, fulls):
        rest = f[common:]
        layout.append((len(rest), len(p.context_ids) - common))
        conts.extend(tuple(rest[:j]) for j in range(1, len(rest) + 1))
    return GDsuiteGroup(tuple(fulls[0][:common]), tuple(conts), tuple(layout))


def gdsuite_unpack(item: ProbeItem, group, scores) -> tuple[list, dict[str, float]]:
    """Per-candidate span scores over GDsuite's spans and GDsuite's per-item columns.

    ``group`` is what :func:`encode_item_gdsuite` returned and ``scores`` the scorer's
    span scores for its continuations, in order.
    """
    from ..spans import SpanScore

    full, extra, k = [], {}, 0
    for j, (n, skip) in enumerate(group.layout):
        prefixes = scores[k:k + n]
        k += n
        sums = [s.logprob for s in prefixes]
        toks = ([sums[0]] + [b - a for a, b in zip(sums, sums[1:])])[skip:]
        full.append(SpanScore(logprob=float(sum(toks)), n_tokens=len(toks), is_greedy=prefixes[-1].is_greedy))
        if j < 2:
            name = "correct" if j == 0 else "incorrect"
            extra[f"{name}_avg_prob"] = sum(math.exp(x) for x in toks) / len(toks)
            extra[f"{name}_log_prob"] = float(sum(toks))
    return full, extra


# ---------------------------------------------------------------------------
# Multi-hop persona QA (generative)
# ---------------------------------------------------------------------------


def _persona_spec(raw: dict, source: str, path: Path | None, root: Path, name: str, n_items: int | None) -> FamilySpec:
    cfg = {k: raw.get(k, v) for k, v in PERSONA_CONFIG.items()}
    personas = cfg["personas"]
    if isinstance(personas, str):
        personas = [personas]
    if not isinstance(personas, list) or not personas or not all(isinstance(p, str) for p in personas):
        raise ProbeSpecError(f"{source}: `personas` must be a non-empty list of persona folder names.")
    for key, lo in (("n_samples", 1), ("max_new_tokens", 1)):
        v = cfg[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ProbeSpecError(f"{source}: `{key}` must be an integer >= {lo}, got {v!r}.")
    t = cfg["temperature"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
        raise ProbeSpecError(f"{source}: `temperature` must be a number >= 0 (0 = greedy), got {t!r}.")
    stop = cfg["stop"]
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not stop or not all(isinstance(s, str) and s.startswith("\n") for s in stop):
        raise ProbeSpecError(
            f"{source}: `stop` must be a list of stop strings that each start with a newline (e.g. [\"\\nQ:\"]); "
            "probeselect's sampler ends a response at its first newline, which is no later than such a stop.")
    import re

    data_personas: dict[str, tuple] = {}
    files = []
    for p in personas:
        d = root / PERSONA_FAMILY / p
        facts_path, q_path = d / "facts.jsonl", d / "test_questions.json"
        facts = []
        for r in _read_jsonl(facts_path, source):
            msgs = r.get("messages")
            try:
                u = next(m["content"] for m in msgs if m["role"] == "user")
                a = next(m["content"] for m in msgs if m["role"] == "assistant")
            except (TypeError, KeyError, StopIteration):
                raise ProbeSpecError(f"{facts_path}: line {r[_LINE]}: needs `messages` with a user and an "
                                     "assistant message.") from None
            facts.append({"prompt": f"Q: {u}\nA:", "answer": a})
        if not q_path.is_file():
            raise ProbeSpecError(f"{source}: file not found: {q_path}.")
        try:
            qs = json.loads(q_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ProbeSpecError(f"{q_path}: invalid JSON ({exc.msg}).") from None
        if not isinstance(qs, list) or not qs:
            raise ProbeSpecError(f"{q_path}: expected a non-empty JSON list of questions.")
        for n, q in enumerate(qs, 1):
            if not (isinstance(q, dict) and all(isinstance(q.get(k), str) for k in ("id", "question",
                                                                                    "expected_answer_regex"))):
                raise ProbeSpecError(f"{q_path}: question {n} needs string `id`, `question` and `expected_answer_regex`.")
            try:
                re.compile(q["expected_answer_regex"])
            except re.error as exc:
                raise ProbeSpecError(f"{q_path}: question {q['id']!r}: invalid regex ({exc}).") from None
        if n_items is not None:
            qs = qs[:n_items]
        data_personas[p] = (tuple(facts), tuple(qs))
        files += [str(facts_path), str(q_path)]
    settings = {"n_samples": cfg["n_samples"], "temperature": float(t), "max_new_tokens": cfg["max_new_tokens"],
                "stop": list(stop)}
    content = {"family": PERSONA_FAMILY, "personas": {p: [list(f), list(q)] for p, (f, q) in data_personas.items()},
               **settings}
    data = GDsuiteData(family=PERSONA_FAMILY, root=str(root), files=tuple(files),
                       content_hash=canonical_json_hash(content), personas=data_personas, kind="generative")
    return FamilySpec(family=name, n_items=max(len(q) for _, q in data_personas.values()), n_demos=0,
                      variants=tuple(data_personas), description=str(raw.get("description", "")), path=path,
                      user_data=data, params={"format": FORMAT, "gdsuite_family": PERSONA_FAMILY, **settings})


def persona_prompts(spec: FamilySpec, seeds) -> list[dict]:
    """One record per (seed, persona, question): GDsuite's prompt and the question's regex.

    The full fact pool, shuffled by ``random.Random(seed)``, is given as ``Q: ...\\nA: ...``
    blocks joined by a blank line, then ``Q: <question>\\nA:``.
    """
    import random

    data: GDsuiteData = spec.user_data
    out = []
    for seed in seeds:
        for persona in spec.variants:
            facts, qs = data.personas[persona]
            rng = random.Random(int(seed))
            demos = list(facts)
            rng.shuffle(demos)
            blocks = [demo_block(d) for d in demos]
            for q in qs:
                out.append({"family": spec.family, "variant": persona, "seed": int(seed), "test_id": q["id"],
                            "category": q.get("category", "fact"), "expected_regex": q["expected_answer_regex"],
                            "prompt": build_icl_prompt(blocks, f"Q: {q['question']}\nA:")})
    return out


def gdsuite_persona_table(model, tokenizer, spec: FamilySpec, seeds, *, batch_prompts: int = 8,
                          min_shared_prefix: int | None = None, max_length: int | None = None,
                          on_overflow: str = "error"):
    """GDsuite's persona protocol: ``n_samples`` generations per (seed, persona, question).

    Samples come from :func:`probeselect.generation.sample_generations` (full softmax at
    ``temperature``; 0 = greedy), each drawn from a stream determined by (seed, persona,
    question id). The questions of a (seed, persona) share its fact pool as a prompt prefix,
    which is prefilled once per group (``min_shared_prefix``, default
    :data:`probeselect.generation.MIN_SHARED_PREFIX`; 0 = off). A response is the
    generated text up to its first newline (or EOS),
    stripped; it matches when ``re.search(expected_answer_regex, response, re.IGNORECASE)``
    finds the regex, as in GDsuite. GDsuite stops at ``"\\nQ:"``/``"\\n\\nQ:"`` instead,
    so the two agree whenever the answer is a single line (see probes/README.md).

    One row per (seed, persona, question): family, variant (persona), seed, test_id,
    category, n_samples, n_match, match_rate, n_unterminated, top_responses, truncated_tokens
    (prompt tokens cut from the left with ``on_overflow="truncate"``, see
    :func:`probeselect.generation.sample_generations`).
    """
    import re
    from collections import Counter

    import pandas as pd

    from .._io import canonical_json_hash as _h
    from ..errors import ScoringError
    from ..generation import MIN_SHARED_PREFIX, sample_generations

    if min_shared_prefix is None:
        min_shared_prefix = MIN_SHARED_PREFIX
    p = spec.params
    recs = persona_prompts(spec, seeds)
    pseeds = [int(_h([r["seed"], r["variant"], r["test_id"]])[:15], 16) for r in recs]
    try:
        gens = sample_generations(model, tokenizer, [r["prompt"] for r in recs], n=p["n_samples"],
                                  temperature=p["temperature"], max_new_tokens=p["max_new_tokens"],
                                  prompt_seeds=pseeds, batch_prompts=batch_prompts,
                                  min_shared_prefix=min_shared_prefix, max_length=max_length, on_overflow=on_overflow)
    except ValueError as exc:
        raise ScoringError(f"{spec.path or spec.family}: persona generation failed: {exc}. "
                           "Lower `max_new_tokens`, use a model with a longer context, or pass --on-overflow "
                           "truncate to cut the prompts from the left.") from None
    rows = []
    for r, gs in zip(recs, gens):
        texts = [g.text.strip() for g in gs]
        pat = re.compile(r["expected_regex"], re.IGNORECASE)
        n_match = sum(1 for t in texts if pat.search(t))
        rows.append({"family": r["family"], "variant": r["variant"], "seed": r["seed"], "test_id": r["test_id"],
                     "category": r["category"], "n_samples": len(texts), "n_match": n_match,
                     "match_rate": n_match / len(texts), "n_unterminated": sum(not g.terminated for g in gs),
                     "top_responses": [t[:400] for t, _ in Counter(texts).most_common(5)],
                     "truncated_tokens": gs[0].truncated_tokens if gs else 0})
    return pd.DataFrame(rows)


def summarize_persona(df, level: float = 0.95):
    """Per checkpoint x family x persona: pooled match rate with a Wilson interval.

    Columns: checkpoint, step, tokens, family, variant, kind ("generative"), match_rate
    (matches / samples over seeds and questions; equal to GDsuite's mean of per-seed,
    per-question rates since every cell has the same number of samples), match_ci_low /
    match_ci_high (Wilson interval at ``level``; samples treated as independent),
    n_samples, n_items (questions), n_seeds.
    """
    import pandas as pd

    from ..generation import wilson_interval

    rows = []
    keys = [k for k in ("checkpoint", "step", "tokens", "family", "variant") if k in df.columns]
    for key, g in df.groupby(keys, sort=False, dropna=False):
        n, k = int(g["n_samples"].sum()), int(g["n_match"].sum())
        lo, hi = wilson_interval(k, n, level)
        rows.append({**dict(zip(keys, key)), "kind": "generative", "match_rate": k / n if n else math.nan,
                     "match_ci_low": lo, "match_ci_high": hi, "n_samples": n,
                     "n_items": int(g["test_id"].nunique()), "n_seeds": int(g["seed"].nunique())})
    return pd.DataFrame(rows)
