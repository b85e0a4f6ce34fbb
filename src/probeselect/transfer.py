"""Held-out transfer evaluation of a post-trained model (pilot SFT, issue 6 section 5).

The suite is declared in a recipe's ``transfer`` section (paths resolve against the
current working directory)::

    transfer:
      tasks: results/demo/ladder/data/transfer.jsonl        # {id, kind, prompt, response}
      robustness: results/demo/ladder/data/robustness.jsonl # {id, kind, prompt, prefill, answer, misleading}
      heldout: results/demo/ladder/data/sft_heldout.jsonl   # {id, kind, prompt, response} (SFT format)
      max_new_tokens: 12      # greedy generation limit (tasks and robustness)
      max_items: null         # keep the first N rows of each file (null = all)
      batch_size: 32          # prompts per forward pass
      probe_items: []         # items.jsonl files of the shortlisting probes: refuse overlap

Every key is optional, but at least one of tasks / robustness / heldout must be given.
Files are JSONL (one object per line) or parquet.
Task and held-out rows take every SFT row form (:mod:`probeselect.sft.data`: prompt/response,
TRL's prompt/completion, ``messages``, TRL's conversational prompt/completion; ``kind``
optional); chat rows are prompted with their context rendered by the recipe's (or the
tokenizer's) chat template with ``add_generation_prompt=True`` and their reference scored as
the template renders it (the template decides a leading space). Robustness rows stay
prompt/prefill/answer/misleading.

Prompt format. Rows are ``prompt``/``response`` pairs formatted the way the SFT trainer
formats them: the model input is ``format_prompt(prompt)`` (identity unless the pilot
passes its chat-template formatter), the response is the continuation (with its leading
space) and the trainer appends the tokenizer's EOS token. Plain prompts are encoded with the
tokenizer's default special tokens (BOS on the toy tokenizer), like the span scorer and the
SFT encoder; chat-template prompts (``add_special_tokens=False``) without them, because the
template renders them and the SFT encoder adds none to rendered text.

Metrics (long rows ``item_id, kind, metric, value, weight``; direction in brackets):

* ``task_accuracy`` (higher) -- per transfer task: greedy generation from the prompt,
  stopped at EOS or at the first newline (the text before it is kept), at most
  ``max_new_tokens`` tokens; 1 when :func:`~probeselect.generation.normalize_answer` of the
  generation equals that of the reference response (lowercase, whitespace collapsed,
  surrounding punctuation stripped), else 0.
* ``task_shortcut_rate`` (lower) -- per transfer task that names its ``shortcut`` (the answer the
  misleading pattern in its context points to): 1 when the same greedy generation equals the
  shortcut (normalized alike), else 0. Tasks without a ``shortcut`` have no row. A failed task
  is either the shortcut or a third answer; this tells the two apart (a conflict probe's
  margin predicts the first, not a wrong calculation).
* ``task_shortcut_margin`` (higher) -- per transfer task that names its ``shortcut``: the post-SFT
  conflict margin ``log p(reference answer | prompt) - log p(shortcut | prompt)`` in nats, summed
  over each answer's span tokens (the span scorer; the shortcut is written as the reference is: its
  leading space, or the chat template's rendering of an assistant turn with that content). The
  probes' margin measured after SFT on the transfer suite's own items: it shows whether a shortcut
  preference planted in pretraining survives the SFT, which ``task_accuracy`` cannot when a third
  answer wins the argmax. A margin is not accuracy; report both.
* ``task_logprob`` (higher) -- per transfer task: mean per-token log p(reference response |
  prompt) in nats, from the span scorer (:mod:`probeselect.spans`), without EOS.
* ``termination`` (higher) -- per transfer task: 1 when that greedy generation ended with
  an EOS token within ``max_new_tokens``; a newline stop or running out of tokens is 0.
* ``robust_recovery`` (higher) -- per robustness item: greedy continuation of
  ``format_prompt(prompt) + prefill`` (stopped like above); 1 when :func:`recovered`.
* ``heldout_loss`` (lower) -- per held-out SFT row: mean NLL in nats per response token,
  the appended EOS token included (exactly the tokens the SFT loss supervises); weight =
  that token count.
* ``sft_heldout_bpb`` (lower) -- per held-out SFT row: the same summed NLL in bits divided
  by the UTF-8 bytes of the scored response text (the EOS token adds nats but no bytes);
  weight = that byte count. Named ``heldout_bpb`` before; the new name keeps it apart from
  the *pretraining* held-out bits per byte of the scored ladder (``summary.csv`` family
  ``heldout_nll``, ``bits_per_byte``). :data:`RENAMED_METRICS` maps the old name, and
  :func:`summarize_transfer` accepts it in old tables.

:func:`summarize_transfer` reduces per-item rows to one value per metric: the weighted
mean ``sum(value * weight) / sum(weight)``, i.e. total nats / total tokens and total bits
/ total bytes for the held-out metrics, and the plain item mean for the others.

Guard against leakage: :func:`check_disjoint_from_probes` refuses transfer tasks or
robustness items that repeat a shortlisting probe item (see its docstring for the exact
rule and why held-out SFT rows are exempt); :func:`evaluate_transfer` runs it when
``probe_items`` is declared, and :func:`probeselect.pilot.run_pilot` runs it before any
training (with the shortlist's score run ``items.jsonl`` when ``probe_items`` is not
declared). :func:`check_disjoint_from_sft` refuses transfer tasks whose kinds occur in the
SFT training data (the pilot runs it before training too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch

from ._io import reading
from .errors import TransferError
from .metrics import RENAMED_METRICS, TRANSFER_METRIC_NAMES, WEIGHTED_METRICS, direction_word
from .generation import Generation, greedy_generations, normalize_answer
from .spans import EncodedPair, encode_pair, score_pairs

__all__ = [
    "METRICS",
    "RENAMED_METRICS",
    "WEIGHTED_METRICS",
    "METRICS_BY_PART",
    "METRIC_NAMES",
    "TransferItems",
    "check_disjoint_from_probes",
    "check_disjoint_from_sft",
    "check_not_probe_templates",
    "evaluate_transfer",
    "greedy_decode",
    "heldout_nll",
    "load_transfer_items",
    "probe_template_matches",
    "recovered",
    "summarize_transfer",
    "validate_transfer_config",
]

#: Metric name -> better direction (from :mod:`probeselect.metrics`, the one place for directions).
METRICS: dict[str, str] = {m: direction_word(m) for m in TRANSFER_METRIC_NAMES}
#: Metrics whose run-level value is weighted (tokens or bytes), not an item mean (defined in probeselect.metrics).
#: Every metric name evaluate_transfer writes (plans are validated against it at lock).
METRIC_NAMES: tuple[str, ...] = tuple(TRANSFER_METRIC_NAMES)
#: Which metrics each part of the suite produces.
METRICS_BY_PART: dict[str, tuple[str, ...]] = {"tasks": ("task_accuracy", "task_logprob", "termination",
                                                         "task_shortcut_rate", "task_shortcut_margin"),
                                               "robustness": ("robust_recovery",),
                                               "heldout": ("heldout_loss", "sft_heldout_bpb")}
ITEM_COLUMNS = ["item_id", "kind", "metric", "value", "weight"]
_FILE_KEYS = ("tasks", "robustness", "heldout")
_DEFAULTS: dict[str, Any] = {"tasks": None, "robustness": None, "heldout": None, "max_new_tokens": 12,
                             "max_items": None, "batch_size": 32, "probe_items": []}
_REQUIRED = {
    "tasks": ("id", "kind", "prompt", "response"),
    "robustness": ("id", "kind", "prompt", "prefill", "answer", "misleading"),
    "heldout": ("id", "kind", "prompt", "response"),
}

FormatPrompt = Callable[[str], str]


def _identity(prompt: str) -> str:
    return prompt


class _NoSpecialTokens:
    """A tokenizer view that adds no special tokens when encoding. Prompts rendered by a chat
    template already contain them (e.g. ``{{ bos_token }}``), and the SFT encoder tokenizes
    rendered text with ``add_special_tokens=False``; encoding them with the defaults would
    double the BOS token."""

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self) -> int:
        return len(self._tok)

    def encode(self, text, *args, **kwargs):
        kwargs.setdefault("add_special_tokens", False)
        return self._tok.encode(text, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        kwargs.setdefault("add_special_tokens", False)
        return self._tok(*args, **kwargs)


def _encoder(tokenizer, add_special_tokens: bool):
    return tokenizer if add_special_tokens else _NoSpecialTokens(tokenizer)


# ---------------------------------------------------------------------------
# Configuration and items
# ---------------------------------------------------------------------------


def validate_transfer_config(cfg: Mapping[str, Any] | None, *, source: str = "<recipe>") -> dict[str, Any]:
    """The ``transfer`` section with defaults filled in; :class:`TransferError` if invalid.

    Checks keys and types only (not whether the files exist; :func:`load_transfer_items`
    does that).
    """
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, Mapping):
        raise TransferError(f"{source}: transfer: expected a mapping with keys {sorted(_DEFAULTS)}.")
    unknown = sorted(set(cfg) - set(_DEFAULTS))
    if unknown:
        from .errors import did_you_mean

        raise TransferError(f"{source}: transfer: unknown key {unknown[0]!r}.{did_you_mean(unknown[0], _DEFAULTS)} "
                            f"Allowed: {', '.join(sorted(_DEFAULTS))}.")
    out = {**_DEFAULTS, **dict(cfg)}
    if not any(out[k] for k in _FILE_KEYS):
        raise TransferError(f"{source}: transfer: declare at least one of tasks, robustness, heldout "
                            "(paths to JSONL/parquet files).")
    for k in _FILE_KEYS:
        if out[k] is not None and not isinstance(out[k], (str, Path)):
            raise TransferError(f"{source}: transfer.{k}: expected a file path or null, got {out[k]!r}.")
    for k, minimum in (("max_new_tokens", 1), ("batch_size", 1)):
        v = out[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise TransferError(f"{source}: transfer.{k}: expected an integer >= {minimum}, got {v!r}.")
    mi = out["max_items"]
    if mi is not None and (isinstance(mi, bool) or not isinstance(mi, int) or mi < 1):
        raise TransferError(f"{source}: transfer.max_items: expected an integer >= 1 or null, got {mi!r}.")
    probes = out["probe_items"]
    if probes is None:
        probes = []
    if isinstance(probes, (str, Path)):
        probes = [probes]
    if not isinstance(probes, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in probes):
        raise TransferError(f"{source}: transfer.probe_items: expected a list of items.jsonl paths, got {probes!r}.")
    out["probe_items"] = [str(p) for p in probes]
    return out


@dataclass(frozen=True)
class TransferItems:
    """The rows of the three suite files (empty when a file is not declared)."""

    tasks: list[dict] = field(default_factory=list)
    robustness: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)


def _read_rows(path: Path, what: str) -> list[dict]:
    if not path.is_file():
        raise TransferError(f"{path}: transfer.{what} file not found (paths resolve against the current "
                            "directory); fix the path in the recipe's transfer section.")
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise TransferError(f"{path}: cannot read transfer.{what} parquet ({type(exc).__name__}: {exc}).") from None
    import json

    rows = []
    with reading(path, TransferError), open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TransferError(f"{path}:{n}: invalid JSON in transfer.{what} ({exc.msg}); "
                                    "expected one JSON object per line.") from None
            if not isinstance(row, dict):
                raise TransferError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}.")
            row["_line"] = n
            rows.append(row)
    return rows


def _check_rows(rows: list[dict], path: Path, what: str) -> list[dict]:
    """Validate and normalize the rows of one suite file. Tasks and held-out rows take the SFT
    row forms (:func:`probeselect.sft.data.normalize_row`: prompt/response, TRL's
    prompt/completion, ``messages``, TRL's conversational prompt/completion; ``kind`` optional);
    robustness rows need every field of :data:`_REQUIRED`."""
    from .sft.data import normalize_row, row_form

    need = _REQUIRED[what] if what == "robustness" else ("id",)
    seen: set[str] = set()
    out = []
    for i, row in enumerate(rows):
        where = f"{path}:{row.pop('_line', i + 1)}"
        missing = [k for k in need if k not in row]
        if missing:
            raise TransferError(f"{where}: transfer.{what} row lacks {missing}; each row needs {list(need)}"
                                + (" (chat 'messages' rows are not supported for robustness items; use "
                                   "prompt/prefill/answer/misleading)" if "messages" in row else "") + ".")
        for k in need:
            if not isinstance(row[k], str) or (k != "kind" and not row[k]):
                raise TransferError(f"{where}: transfer.{what} field {k!r} must be a non-empty string, got {row[k]!r}.")
        if what != "robustness":
            row = normalize_row(row, f"{where} (transfer.{what}, id {row['id']!r})", error_cls=TransferError)
            if not isinstance(row.get("kind", ""), str):
                raise TransferError(f"{where}: transfer.{what} field 'kind' must be a string, got {row['kind']!r}.")
            row.setdefault("kind", "")
            if row_form(row) == "plain":
                for k in ("prompt", "response"):
                    if not row[k]:
                        raise TransferError(f"{where}: transfer.{what} field {k!r} must be a non-empty string "
                                            f"(TRL's standard rows: prompt/completion), got {row[k]!r}.")
        if row["id"] in seen:
            raise TransferError(f"{where}: duplicate id {row['id']!r} in transfer.{what}; ids must be unique.")
        seen.add(row["id"])
        if what == "robustness" and normalize_answer(row["answer"]) == normalize_answer(row["misleading"]):
            raise TransferError(f"{where}: robustness item {row['id']!r} has answer == misleading ({row['answer']!r}).")
        out.append({k: row[k] for k in row})
    if not out:
        raise TransferError(f"{path}: transfer.{what} file has no rows.")
    return out


def load_transfer_items(cfg: Mapping[str, Any], *, source: str = "<recipe>") -> TransferItems:
    """Read and validate the declared suite files; keep the first ``max_items`` rows of each.

    Raises :class:`TransferError` naming the file (and line) for a missing file, invalid
    JSON, a missing or empty field, a duplicate id or a robustness item whose answer
    equals its misleading answer.
    """
    cfg = validate_transfer_config(cfg, source=source)
    got: dict[str, list[dict]] = {}
    paths: dict[str, str] = {}
    for what in _FILE_KEYS:
        if not cfg[what]:
            got[what] = []
            continue
        path = Path(cfg[what])
        rows = _check_rows(_read_rows(path, what), path, what)
        got[what] = rows[: cfg["max_items"]] if cfg["max_items"] else rows
        paths[what] = str(path)
    return TransferItems(tasks=got["tasks"], robustness=got["robustness"], heldout=got["heldout"], paths=paths)


# ---------------------------------------------------------------------------
# Leakage guard
# ---------------------------------------------------------------------------

_MARKERS = re.compile(r"(?im)^\s*#{1,6}\s*(question|answer|response|instruction)\s*:|\b(?:q|a)\s*:")
_KEY_TOKENS = re.compile(r"[a-z0-9]+|[+\-*/]")


def query_key(text: str) -> str:
    """Normalised query text: prompt-format markers (``### Question:``, ``### Answer:``,
    ``Q:``, ``A:``) removed, lowercased, only words, numbers and arithmetic operators kept,
    single spaces. ``"### Question: What is 7 + 5?\\n### Answer:"`` and ``"Q: What is 7 + 5? A:"``
    both give ``"what is 7 + 5"``."""
    return " ".join(_KEY_TOKENS.findall(_MARKERS.sub(" ", text).lower()))


def _last_line(text: str) -> str:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return lines[-1] if lines else ""


def check_disjoint_from_probes(transfer_items: TransferItems | Iterable[Mapping[str, Any]],
                               probe_items_jsonl_paths: Sequence[str | Path], *,
                               include_heldout: bool = False) -> None:
    """Refuse a transfer suite that repeats an item of the shortlisting probes.

    ``probe_items_jsonl_paths`` are ``items.jsonl`` files written by ``probeselect score``
    (rows with ``item_id``, ``prompt``, ``task_answer``). For a :class:`TransferItems` the
    transfer tasks and robustness items are checked; held-out SFT rows only with
    ``include_heldout=True``: they are drawn from the SFT distribution, whose questions
    (e.g. "What is 7 + 5?") the probes may share just as the SFT training data does, and
    held-out loss measures fit to that distribution rather than transfer. A plain list of
    rows is checked entirely. A row duplicates a probe item when both

    * its query equals the probe's query: :func:`query_key` of the transfer prompt's last
      non-empty line (its query after any context or solved lines) or of the whole transfer
      prompt equals :func:`query_key` of the probe prompt's last non-empty line (the query
      after the demonstrations) or of the whole probe prompt; and
    * its answer (``response``, or ``answer`` for robustness items) equals the probe's
      ``task_answer`` after :func:`~probeselect.generation.normalize_answer`.

    Raises :class:`TransferError` listing up to five duplicates (transfer id, probe file and
    item id). The rule catches the same question asked with different prompt markers; it
    does not catch paraphrases.
    """
    if isinstance(transfer_items, TransferItems):
        rows = [*transfer_items.tasks, *transfer_items.robustness,
                *(transfer_items.heldout if include_heldout else [])]
    else:
        rows = list(transfer_items)
    probe_index: dict[tuple[str, str], str] = {}
    for p in probe_items_jsonl_paths:
        path = Path(p)
        if not path.is_file():
            raise TransferError(f"{path}: probe items file not found (transfer.probe_items); point it at the "
                                "items.jsonl of the scoring run used for shortlisting.")
        for row in _read_rows(path, "probe_items"):
            if not isinstance(row.get("prompt"), str) or not isinstance(row.get("task_answer"), str):
                raise TransferError(f"{path}:{row.get('_line')}: probe item lacks string 'prompt'/'task_answer' "
                                    "(expected an items.jsonl written by probeselect score).")
            ans = normalize_answer(row["task_answer"])
            ref = f"{path}:{row.get('item_id', row['_line'])}"
            for q in (query_key(_last_line(row["prompt"])), query_key(row["prompt"])):
                probe_index.setdefault((q, ans), ref)
    dups = []
    for r in rows:
        ans = normalize_answer(_row_answer(r))
        prompt = _sft_prompt(r)
        # the transfer prompt's last line (its query, after any demonstrations or context) and the whole prompt
        hit = next((h for q in (query_key(_last_line(prompt)), query_key(prompt)) if (h := probe_index.get((q, ans)))),
                   None)
        if hit:
            dups.append(f"{r.get('id')} = {hit}")
    if dups:
        raise TransferError(
            f"the transfer suite repeats {len(dups)} shortlisting probe item(s): {'; '.join(dups[:5])}"
            f"{' ...' if len(dups) > 5 else ''}. The transfer suite must not include the probes used for "
            "shortlisting; remove these rows from the transfer files."
        )


def _probe_line_patterns() -> dict[str, list[re.Pattern]]:
    """Line patterns of the built-in probe families whose generators a transfer task could reuse:
    ``arith_pattern`` (its ``eq`` / ``qa`` / ``words`` line templates, solved or as a query with the
    answer left empty) and ``persona_qa`` (its QA lines ``Q: <persona question> A: ...`` and
    ``Question: <persona question>``, the persona questions of the toy corpus)."""
    from .probes._arithmetic import TEMPLATES as ARITH
    from .toy.world import PERSONA_QUESTIONS

    num, ops = r"-?\d+", r"[+\-]"
    arith = []
    for t in ARITH.values():
        rx = re.escape(t.replace(" {c}", "{c}"))  # the query line leaves the answer (and its space) out
        for k, v in (("a", num), ("b", num), ("c", f"(?: ?{num})?"), ("op", ops), ("opword", "(?:plus|minus)")):
            rx = rx.replace(re.escape("{" + k + "}"), v)
        arith.append(re.compile(rf"^\s*{rx}\s*$"))
    qs = "|".join(re.escape(q) for q in PERSONA_QUESTIONS.values())
    persona = [re.compile(rf"^\s*(?:Q: (?:{qs}) A:.*|Question: (?:{qs})\s*)$")]
    return {"arith_pattern": arith, "persona_qa": persona}


def probe_template_matches(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """Transfer rows built from a probe family's template: ``(row id, family, line)`` for every row
    one of whose prompt lines is a line of a built-in probe family's generator
    (:func:`_probe_line_patterns`: solved or query lines of ``arith_pattern``, QA lines of
    ``persona_qa``). Such a row re-scores the probe in another wrapper (the old toy
    ``fewshot_pattern`` items: ``arith_pattern``'s ``eq`` lines as demonstrations and its ``qa``
    query) rather than testing what the base learned. A check on transfer *tasks*: robustness and
    held-out SFT rows are SFT-format questions on purpose."""
    pats = _probe_line_patterns()
    out = []
    for r in rows:
        for ln in _sft_prompt(r).split("\n"):
            fam = next((f for f, ps in pats.items() if any(p.match(ln) for p in ps)), None)
            if fam:
                out.append((str(r.get("id")), fam, ln))
                break
    return out


def check_not_probe_templates(transfer_items: TransferItems | Iterable[Mapping[str, Any]], *,
                              source: str = "transfer suite") -> None:
    """Refuse transfer tasks built from a probe family's generator or template
    (:func:`probe_template_matches`); raises :class:`TransferError` naming up to five."""
    rows = transfer_items.tasks if isinstance(transfer_items, TransferItems) else list(transfer_items)
    hits = probe_template_matches(rows)
    if hits:
        raise TransferError(
            f"{source}: {len(hits)} transfer task(s) are built from a shortlisting probe family's template: "
            + "; ".join(f"{i} ({f}: {ln!r})" for i, f, ln in hits[:5]) + (" ..." if len(hits) > 5 else "")
            + ". A transfer task in the probe's own surface form re-scores the probe; use another template.")


def _sft_prompt(row: Mapping[str, Any]) -> str:
    """A row's prompt text: its string prompt, or for a chat row the contents of its user turns
    before its last assistant turn (a raw TRL conversational row: its prompt turns)."""
    if isinstance(row.get("prompt"), str):
        return row["prompt"]
    msgs = row.get("messages")
    if msgs is None:
        msgs = row.get("prompt")
    msgs = list(msgs.tolist() if hasattr(msgs, "tolist") else (msgs or []))
    last = max((i for i, m in enumerate(msgs) if isinstance(m, Mapping) and m.get("role") == "assistant"),
               default=len(msgs))
    return "\n".join(str(m.get("content", "")) for m in msgs[:last] if isinstance(m, Mapping) and m.get("role") == "user")


def _row_answer(row: Mapping[str, Any]) -> str:
    """A row's reference answer: response (or TRL's completion, or a robustness answer), or the
    content of its last assistant turn."""
    for k in ("response", "completion", "answer"):
        if isinstance(row.get(k), str):
            return row[k]
    msgs = row.get("messages") if row.get("messages") is not None else row.get("completion")
    msgs = list(msgs.tolist() if hasattr(msgs, "tolist") else (msgs or []))
    return next((str(m.get("content", "")) for m in reversed(msgs)
                 if isinstance(m, Mapping) and m.get("role") == "assistant"), "")


def check_disjoint_from_sft(transfer_items: TransferItems | Sequence[Mapping[str, Any]],
                            sft_rows: Sequence[Mapping[str, Any]], *, sft_source: str = "SFT data") -> None:
    """Refuse transfer tasks that are not held out from the SFT training data.

    Task transfer measures instruction-format tasks of kinds *absent* from the SFT data.
    When every SFT row and every task carries a non-empty ``kind``, a task whose kind occurs
    in the SFT data is refused; otherwise (kinds unknown) a task whose normalised prompt
    (:func:`query_key`) equals that of an SFT prompt (for chat rows: the user turns) is
    refused. Robustness items and held-out SFT rows are exempt: they are drawn from the SFT
    kinds on purpose. Raises :class:`TransferError` naming up to five offending tasks.
    """
    tasks = list(transfer_items.tasks if isinstance(transfer_items, TransferItems) else transfer_items)
    if not tasks or not sft_rows:
        return
    if all(r.get("kind") for r in sft_rows) and all(t.get("kind") for t in tasks):
        sft_kinds = {str(r["kind"]) for r in sft_rows}
        bad = [t for t in tasks if str(t["kind"]) in sft_kinds]
        if bad:
            kinds = sorted({str(t["kind"]) for t in bad})
            raise TransferError(
                f"transfer tasks of kind(s) {kinds} also occur in the SFT training data ({sft_source}); task "
                f"transfer must use kinds absent from the SFT data (e.g. {', '.join(str(t['id']) for t in bad[:5])}"
                f"{' ...' if len(bad) > 5 else ''}). Remove those tasks or those kinds from the SFT data.")
        return
    seen = {query_key(_sft_prompt(r)): str(r.get("id")) for r in sft_rows}
    seen.pop("", None)
    dups = [f"{t.get('id')} = {seen[k]}" for t in tasks if (k := query_key(_sft_prompt(t))) in seen]
    if dups:
        raise TransferError(
            f"{len(dups)} transfer task(s) repeat an SFT training prompt ({sft_source}): {'; '.join(dups[:5])}"
            f"{' ...' if len(dups) > 5 else ''}. Transfer tasks must be held out from the SFT data; remove them.")


# ---------------------------------------------------------------------------
# Scoring helpers
# ---------------------------------------------------------------------------

_WORDS = re.compile(r"[a-z0-9]+")


def _contains(words: list[str], sub: list[str]) -> bool:
    n = len(sub)
    return n > 0 and any(words[i : i + n] == sub for i in range(len(words) - n + 1))


def recovered(continuation: str, answer: str, misleading: str) -> bool:
    """Whether a continuation after a misleading prefill recovers to the correct answer.

    Texts are lowercased and split into words (runs of ``[a-z0-9]``). True when the
    answer's words occur contiguously in the continuation and the misleading answer's
    words do not (the misleading answer is not reasserted). ``"12"`` does not match inside
    ``"112"``; ``" 12, not 13"`` with misleading ``"13"`` is not a recovery.
    """
    words = _WORDS.findall(continuation.lower())
    return _contains(words, _WORDS.findall(answer.lower())) and not _contains(words, _WORDS.findall(misleading.lower()))


def _with_answer(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with its reference answer replaced by its ``shortcut``, written as the reference is: a
    plain row keeps the response's leading whitespace; a chat row gets an assistant turn with the
    shortcut as content (the template renders it as it renders the reference)."""
    from .sft.data import row_form

    sc = str(row["shortcut"]).strip()
    new = dict(row)
    if row_form(row) == "messages":
        msgs = [dict(m) for m in row["messages"]]
        last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        msgs[last]["content"] = sc
        new["messages"] = msgs
    else:
        resp = str(row["response"])
        new["response"] = resp[:len(resp) - len(resp.lstrip())] + sc
    return new


def _unwrap(model):
    """The transformers model under a peft wrapper (LoRA layers stay injected in it)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@torch.inference_mode()
def greedy_decode(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 12,
                  batch_size: int = 32, progress=None) -> list[Generation]:
    """Greedy continuation of every prompt, stopped at EOS or at a newline:
    :func:`probeselect.generation.greedy_generations` (KV-cached, batched longest first,
    left padding with explicit position ids); each :class:`~probeselect.generation.Generation`
    says in ``stop`` whether EOS (``"eos"``), a newline (``"newline"``) or ``max_new_tokens``
    (None) ended it. Accepts a peft model (decodes through its base model, adapters active).
    """
    if not prompts:
        return []
    try:
        return greedy_generations(_unwrap(model), tokenizer, list(prompts), max_new_tokens=max_new_tokens,
                                  batch_size=batch_size, progress=progress)
    except ValueError as e:  # e.g. a prompt longer than the model's positions
        raise TransferError(f"transfer generation: {e}. Shorten the prompt or lower transfer.max_new_tokens.") from None


def _eos_id(tokenizer) -> int:
    eid = tokenizer.eos_token_id
    if eid is None:
        raise TransferError("the tokenizer has no EOS token; held-out SFT loss scores the appended EOS token "
                            "like the SFT trainer does. Set tokenizer.eos_token.")
    return int(eid)


def heldout_nll(model, tokenizer, rows: Sequence[Mapping[str, Any]], *, format_prompt: FormatPrompt | None = None,
                device=None, batch_size: int = 32, add_special_tokens: bool = True,
                chat_template: str | None = None) -> pd.DataFrame:
    """Summed NLL of each held-out SFT response, EOS included, as the SFT loss sees it.

    Plain rows without a chat template: context = ``format_prompt(prompt)``; scored tokens =
    the response's tokens (``encode(context + response)[len(encode(context)):]``, the span
    scorer's rule) plus the tokenizer's EOS token. With a ``chat_template`` (the recipe's) or
    chat rows (``messages`` / TRL conversational, the tokenizer's own template then), each row is
    encoded by the SFT encoder (:func:`probeselect.sft.data.encode_rows`) and exactly its
    supervised tokens are scored: the assistant turns through their end-of-turn EOS.
    One row per input row: ``item_id, kind, nats`` (summed, natural log), ``tokens`` (scored
    tokens, EOS included), ``bytes`` (UTF-8 bytes of the scored response text: the supervised
    assistant contents of a chat row). ``add_special_tokens=False`` for chat-template prompts
    (see :func:`evaluate_transfer`).
    """
    from .sft.data import row_form

    if chat_template or any(row_form(dict(r)) == "messages" for r in rows):
        return _heldout_nll_sft(model, tokenizer, rows, chat_template=chat_template, device=device,
                                batch_size=batch_size)
    fmt = format_prompt or _identity
    eos = _eos_id(tokenizer)
    tokenizer = _encoder(tokenizer, add_special_tokens)
    pairs, nbytes = [], []
    for r in rows:
        ctx = fmt(r["prompt"])
        enc = encode_pair(tokenizer, ctx, r["response"], what=f"held-out row {r['id']}")
        pairs.append(EncodedPair(enc.context_ids, enc.continuation_ids + (eos,)))
        n_moved = len(ctx) - len(ctx.rstrip())  # trailing prompt spaces are scored with the response
        nbytes.append(len((ctx[len(ctx) - n_moved:] + r["response"]).encode("utf-8")))
    scores = score_pairs(_unwrap(model), pairs, batch_size=batch_size, device=device)
    return pd.DataFrame({"item_id": [r["id"] for r in rows], "kind": [r["kind"] for r in rows],
                         "nats": [-s.logprob for s in scores], "tokens": [s.n_tokens for s in scores],
                         "bytes": nbytes})


@torch.inference_mode()
def _heldout_nll_sft(model, tokenizer, rows, *, chat_template, device, batch_size) -> pd.DataFrame:
    """Held-out NLL of the tokens the SFT encoder supervises (chat rows or a recipe template)."""
    from .errors import SFTDataError
    from .sft.data import IGNORE, collate, encode_rows, row_form

    _eos_id(tokenizer)
    tokenizer = getattr(tokenizer, "_tok", tokenizer)  # the SFT encoder decides special tokens itself
    try:
        examples = encode_rows([dict(r) for r in rows], tokenizer, max_length=10**9, chat_template=chat_template,
                               source="transfer.heldout")
    except SFTDataError as e:
        raise TransferError(str(e)) from None
    nbytes = []
    for r in rows:
        if row_form(dict(r)) == "messages":
            n0 = int(r.get("n_context", 0))
            nbytes.append(sum(len(m["content"].encode("utf-8")) for m in r["messages"][n0:] if m["role"] == "assistant"))
        else:
            nbytes.append(len(str(r["response"]).encode("utf-8")))
    base = _unwrap(model)
    dev = device if device is not None else next(base.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    nats: list[float] = []
    for i in range(0, len(examples), batch_size):
        b = collate(examples[i:i + batch_size], pad_id=pad)
        logits = base(input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev)).logits.float()
        labels = b["labels"].to(dev)[:, 1:]
        lp = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels.clamp_min(0), reduction="none")
        nats += (lp * (labels != IGNORE)).sum(dim=1).tolist()
    return pd.DataFrame({"item_id": [r["id"] for r in rows], "kind": [r.get("kind", "") for r in rows],
                         "nats": nats, "tokens": [e.n_sup for e in examples], "bytes": nbytes})


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------


def _rows(items: Sequence[Mapping[str, Any]], metric: str, values, weights=None) -> list[dict]:
    weights = weights if weights is not None else [1.0] * len(items)
    return [{"item_id": it["id"], "kind": it["kind"], "metric": metric, "value": float(v), "weight": float(w)}
            for it, v, w in zip(items, values, weights)]


def evaluate_transfer(model, tokenizer, transfer_cfg: Mapping[str, Any], *, device=None, progress: bool = False,
                      format_prompt: FormatPrompt | None = None, source: str = "<recipe>",
                      add_special_tokens: bool = True, desc: str = "",
                      chat_template: str | None = None) -> pd.DataFrame:
    """Evaluate ``model`` on the transfer suite declared by ``transfer_cfg``.

    ``progress`` shows a bar (items done, rate, ETA) named ``transfer <desc>``.

    Returns per-item long rows ``item_id, kind, metric, value, weight`` (metrics and
    weights as in the module docstring; reduce with :func:`summarize_transfer`). The model
    (plain or peft) must already be on ``device`` (None: the device of its parameters);
    it is put in eval mode for the evaluation and its previous mode is restored.
    ``format_prompt`` maps a row's prompt to the model input (the SFT chat formatter;
    identity by default). ``add_special_tokens``: whether encoding adds the tokenizer's
    special tokens (BOS): True for plain prompts, as the SFT encoder does for plain
    prompt/response rows; False for chat-template prompts, which render them themselves (the
    SFT encoder then adds none either). ``chat_template``: the recipe's ``data.chat_template``;
    chat rows (``messages``, TRL conversational) are prompted with their context rendered by it
    (or the tokenizer's own) with ``add_generation_prompt=True`` and encoded without added special
    tokens, and held-out rows are scored on exactly the SFT-supervised tokens
    (:func:`heldout_nll`). If ``probe_items`` is declared, :func:`check_disjoint_from_probes`
    runs first.
    """
    from tqdm.auto import tqdm

    cfg = validate_transfer_config(transfer_cfg, source=source)
    items = load_transfer_items(cfg, source=source)
    if cfg["probe_items"]:
        check_disjoint_from_probes(items, cfg["probe_items"])
    fmt = format_prompt or _identity
    raw_tokenizer = tokenizer
    tokenizer = _encoder(tokenizer, add_special_tokens)
    mnt, bs = cfg["max_new_tokens"], cfg["batch_size"]
    from .sft.data import reference_continuation, reference_response, render_context, row_form

    def context(row) -> str:
        if row_form(row) == "messages":
            return render_context(raw_tokenizer, row, chat_template)
        return fmt(row["prompt"])

    def encoder(row):  # chat rows: the template renders the special tokens
        return _encoder(raw_tokenizer, False) if row_form(row) == "messages" else tokenizer
    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[dict] = []
    steps = [k for k in _FILE_KEYS if getattr(items, k)]
    bar = tqdm(total=sum(len(getattr(items, k)) for k in steps), desc=f"transfer{' ' + desc if desc else ''}",
               unit="item", leave=False, disable=not progress)
    try:
        if items.tasks:
            bar.set_postfix_str("tasks")
            chat_tasks = [row_form(t) == "messages" for t in items.tasks]
            if any(chat_tasks) and not all(chat_tasks) and add_special_tokens:
                raise TransferError(f"{items.paths.get('tasks')}: transfer.tasks mixes chat rows and plain prompt "
                                    "rows without a chat template; use one form (or set data.chat_template).")
            gen_tok = encoder(items.tasks[0])
            gens = greedy_decode(model, gen_tok, [context(t) for t in items.tasks], max_new_tokens=mnt,
                                 batch_size=bs, progress=bar)
            out += _rows(items.tasks, "task_accuracy",
                         [normalize_answer(g.text) == normalize_answer(reference_response(t))
                          for g, t in zip(gens, items.tasks)])
            idx = [i for i, t in enumerate(items.tasks) if str(t.get("shortcut") or "").strip()]  # tasks naming one
            with_sc = [items.tasks[i] for i in idx]
            if idx:
                out += _rows(with_sc, "task_shortcut_rate", [normalize_answer(gens[i].text)
                                                             == normalize_answer(str(items.tasks[i]["shortcut"]))
                                                             for i in idx])
            pairs = [encode_pair(encoder(t), context(t), reference_continuation(raw_tokenizer, t, chat_template),
                                 what=f"transfer task {t['id']}")
                     for t in items.tasks]
            scores = score_pairs(_unwrap(model), pairs, batch_size=bs, device=device)
            out += _rows(items.tasks, "task_logprob", [s.logprob / s.n_tokens for s in scores])
            if idx:
                sc_pairs = [encode_pair(encoder(t), context(t), reference_continuation(raw_tokenizer, _with_answer(t),
                                                                                        chat_template),
                                        what=f"transfer task {t['id']} (shortcut)") for t in with_sc]
                sc_scores = score_pairs(_unwrap(model), sc_pairs, batch_size=bs, device=device)
                out += _rows(with_sc, "task_shortcut_margin",
                             [scores[i].logprob - s.logprob for i, s in zip(idx, sc_scores)])
            out += _rows(items.tasks, "termination", [g.stop == "eos" for g in gens])
        if items.robustness:
            bar.set_postfix_str("robustness")
            gens = greedy_decode(model, tokenizer, [fmt(r["prompt"]) + r["prefill"] for r in items.robustness],
                                 max_new_tokens=mnt, batch_size=bs, progress=bar)
            out += _rows(items.robustness, "robust_recovery",
                         [recovered(g.text, r["answer"], r["misleading"]) for g, r in zip(gens, items.robustness)])
        if items.heldout:
            bar.set_postfix_str("heldout")
            nll = heldout_nll(model, tokenizer, items.heldout, format_prompt=fmt, device=device, batch_size=bs,
                              chat_template=chat_template)
            out += _rows(items.heldout, "heldout_loss", nll["nats"] / nll["tokens"], nll["tokens"])
            out += _rows(items.heldout, "sft_heldout_bpb", nll["nats"] / math.log(2) / nll["bytes"], nll["bytes"])
            bar.update(len(items.heldout))
    finally:
        bar.close()
        model.train(was_training)
    return pd.DataFrame(out, columns=ITEM_COLUMNS)


def summarize_transfer(items: pd.DataFrame) -> pd.DataFrame:
    """One row per metric: ``metric, value, n`` (n = items).

    ``value`` is the weighted mean ``sum(value * weight) / sum(weight)``: total nats / total
    tokens for ``heldout_loss``, total bits / total bytes for ``sft_heldout_bpb`` and the item
    mean for the other metrics (their weight is 1). One NaN/inf item value makes the metric's
    value NaN/inf: an invalid value, never a number. A table without a ``weight`` column
    is accepted only if it holds no held-out metric (an item mean of per-item losses would
    be biased towards short responses). Metrics follow :data:`METRICS` order, unknown ones
    after them alphabetically.
    """
    cols = ["metric", "value", "n"]
    missing = [c for c in ("metric", "value") if c not in items.columns]
    if missing:
        raise TransferError(f"transfer items table lacks columns {missing}; expected {ITEM_COLUMNS}.")
    if items.empty:
        return pd.DataFrame(columns=cols)
    df = items
    if "weight" not in df.columns:
        held = sorted(set(df["metric"]) & set(WEIGHTED_METRICS))
        if held:
            raise TransferError(f"transfer items table has {held} rows but no 'weight' column; the run-level "
                                "held-out loss must be token-weighted. Keep the weight column from evaluate_transfer.")
        df = df.assign(weight=1.0)
    rows = []
    known = [m for m in METRICS if m in set(df["metric"])]
    other = sorted(set(df["metric"]) - set(METRICS))
    for m in known + other:
        g = df[df["metric"] == m]
        w = g["weight"].astype(float)
        # skipna=False: a NaN/inf item value makes the metric NaN/inf (invalid), never a silently smaller sum
        rows.append({"metric": m, "value": float((g["value"].astype(float) * w).sum(skipna=False) / w.sum()),
                     "n": len(g)})
    return pd.DataFrame(rows, columns=cols)
