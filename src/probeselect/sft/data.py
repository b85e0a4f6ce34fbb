"""SFT data: load rows, tokenize them with loss masks, and collate micro-batches.

Rows come from a JSONL file, a parquet file or a saved ``datasets`` folder (``id`` optional:
``<file stem>:<row index>`` otherwise). Four row forms are accepted, the project's own and
TRL's standard and conversational ones (:func:`row_form`):

* ``{"prompt": str, "response": str}`` and TRL's standard prompt-completion
  ``{"prompt": str, "completion": str}`` (``completion`` is read as ``response``);
* TRL's conversational language modeling ``{"messages": [{"role", "content"}, ...]}``:
  every assistant turn is supervised (TRL's ``assistant_only_loss``);
* TRL's conversational prompt-completion ``{"prompt": [messages], "completion": [messages]}``:
  the assistant turns of ``completion`` are supervised, the prompt turns are context
  (TRL's ``completion_only_loss``), even when the prompt holds assistant turns (few-shot).

Chat roles must be ``system``, ``user`` or ``assistant`` (:data:`CHAT_ROLES`); any other role,
a malformed message or a conversation without an assistant turn to train on is refused naming
the file and line (or row), not left to the template.

Encoding (plain rows, no chat template): ``BOS + prompt`` then the response tokens taken as
``encode(prompt + response)[len(encode(prompt)):]`` (the boundary tokenizes as in running
text), then EOS appended by the trainer.

Encoding with a chat template (the recipe's ``data.chat_template`` or the tokenizer's own; a
plain row then becomes one user turn and one assistant turn, the response verbatim as the
assistant content): the conversation is rendered to text and tokenized without added special
tokens (the template renders its own). Which tokens each assistant turn supervises:

1. the turn's token range: with a template that marks assistant text with
   ``{% generation %} ... {% endgeneration %}`` (TRL's ``assistant_only_loss`` convention), the
   tokens ``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks; otherwise the
   tokens between ``render(turns before it, add_generation_prompt=True)`` and
   ``render(turns up to it)``. Either way the tokens before the range must be exactly the
   tokens of the rendered generation prompt, as evaluation prompts the model with them; a
   template whose generation prompt tokenizes differently alone (a trailing space merging into
   the content) is refused;
2. within that range, every token up to and including the first EOS token; a turn without
   EOS keeps its tokens up to its last non-whitespace token (e.g. ChatML's ``<|im_end|>``).
   Template text after that (the newline after ``{{ eos_token }}``, a second EOS, padding) is
   context, never a target;
3. the sequence ends at the last supervised token (trailing template text carries no loss);
   if that token is not EOS, EOS is appended and supervised, so the model learns to stop
   with the token evaluation stops at.

So a template ending an assistant turn with ``{{ eos_token }}\n`` supervises the content
tokens and one EOS: ``' dark', '<eos>'``, not the newline nor a second EOS.
``masking.loss_on: response`` supervises those tokens; ``all`` supervises every token of the
sequence after the first.

Encoding refuses, naming the example id, an example with zero supervised tokens and one
whose EOS would be cut off by ``max_length`` (a model trained on it never learns to stop).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import canonical_json_hash, reading, sha256_file
from ..errors import SFTDataError

__all__ = ["EncodedExample", "load_rows", "data_hash", "encode_rows", "collate", "prompt_formatter", "IGNORE",
           "normalize_row", "row_form", "render_context", "reference_response",
           "reference_continuation", "supervised_tokens"]

IGNORE = -100  # label of a position that carries no loss


@dataclass(frozen=True)
class EncodedExample:
    """One tokenized example. ``n_sup`` counts target tokens: labels[1:] that are not IGNORE."""

    id: str
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    n_sup: int


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read SFT rows from JSONL, parquet or a ``datasets.save_to_disk`` folder; every row gets an ``id``."""
    path = Path(path)
    lines: list[int] = []  # JSONL: the file line of each row
    if not path.exists():
        raise SFTDataError(f"{path}: SFT data not found. Point data.train at a JSONL/parquet file or a saved "
                           "datasets folder.")
    if path.is_dir():
        try:
            import datasets

            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # datasets raises several types for a non-dataset folder
            raise SFTDataError(f"{path}: not a saved datasets folder ({type(exc).__name__}: {exc}).") from None
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise SFTDataError(f"{path}: DatasetDict without a 'train' split (splits: {list(ds)}).")
            ds = ds["train"]
        rows = [dict(r) for r in ds]
    elif path.suffix == ".parquet":
        import pandas as pd

        with reading(path, SFTDataError, also=(ValueError,)):  # pyarrow's ArrowInvalid is a ValueError
            rows = pd.read_parquet(path).to_dict("records")
    elif path.suffix in (".jsonl", ".json"):
        rows = []
        with reading(path, SFTDataError), open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                    lines.append(n)
                except json.JSONDecodeError as exc:
                    raise SFTDataError(f"{path}: line {n}: invalid JSON ({exc.msg}). Fix the line.") from None
    else:
        raise SFTDataError(f"{path}: unsupported data file type {path.suffix!r}; use .jsonl, .parquet or a "
                           "saved datasets folder.")
    if not rows:
        raise SFTDataError(f"{path}: no rows.")
    seen: set[str] = set()
    out = []
    for i, r in enumerate(rows):
        where = f"{path}: " + (f"line {lines[i]}" if lines else f"row {i}")
        if not isinstance(r, dict):
            raise SFTDataError(f"{where}: not an object.")
        rid = str(r["id"]) if r.get("id") is not None else f"{path.stem}:{i}"
        row = normalize_row(r, f"{where} (id {rid!r})", error_cls=SFTDataError)
        if rid in seen:
            raise SFTDataError(f"{where}: duplicate id {rid!r}; ids must be unique (the data manifest refers to them).")
        seen.add(rid)
        out.append({**row, "id": rid})
    return out


#: Chat roles the SFT encoder handles: assistant turns are supervised, system and user turns are context.
CHAT_ROLES = ("system", "user", "assistant")

_FORMS_HELP = ('each row needs {"prompt": str, "response": str} (or TRL\'s {"prompt": str, "completion": str}), '
               '{"messages": [{"role", "content"}, ...]} or TRL\'s conversational {"prompt": [messages], '
               '"completion": [messages]}')


def _as_list(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") else v  # a parquet/datasets column: numpy array of dicts


def row_form(row: dict) -> str:
    """``"plain"`` (string prompt and response/completion), ``"messages"`` (a conversation) or
    ``"conversational"`` (TRL's prompt/completion message lists); ``""`` if none fits."""
    prompt, resp = row.get("prompt"), row.get("response", row.get("completion"))
    if isinstance(prompt, str) and isinstance(resp, str):
        return "plain"
    if row.get("messages") is not None and prompt is None:
        return "messages"
    if isinstance(_as_list(prompt), list) and isinstance(_as_list(row.get("completion")), list):
        return "conversational"
    return ""


def normalize_row(r: dict, where: str, *, error_cls: type[Exception] = SFTDataError,
                  need_assistant: bool = True) -> dict:
    """One row in a canonical form: plain rows keep ``prompt``/``response`` (``completion`` copied
    to ``response``); chat rows get ``messages`` (the whole conversation) and ``n_context``
    (how many leading messages are context only: the prompt turns of a conversational
    prompt/completion row, 0 for a ``messages`` row). Roles, contents and (with
    ``need_assistant``) an assistant turn to supervise are checked; errors name ``where``."""
    form = row_form(r)
    if form == "plain":
        out = {**r}
        if "response" not in out:
            out["response"] = out["completion"]
        return out
    if form == "messages":
        msgs = _check_messages(_as_list(r["messages"]), where, "messages", error_cls)
        n_context = r.get("n_context") or 0  # an already normalized conversational row keeps its context length
        if isinstance(n_context, bool) or not isinstance(n_context, int) or not 0 <= n_context < len(msgs):
            raise error_cls(f"{where}: n_context must be an integer in [0, {len(msgs)}), got {n_context!r}.")
    elif form == "conversational":
        prompt = _check_messages(_as_list(r["prompt"]), where, "prompt", error_cls)
        comp = _check_messages(_as_list(r["completion"]), where, "completion", error_cls)
        if need_assistant and not any(m["role"] == "assistant" for m in comp):
            raise error_cls(f"{where}: completion has no assistant message; the completion is what is trained on "
                            "(TRL's conversational prompt/completion: completion = [{role: assistant, content}]).")
        msgs, n_context = prompt + comp, len(prompt)
    else:
        if isinstance(r.get("prompt"), str) and not isinstance(r.get("response", r.get("completion")), str):
            raise error_cls(f"{where}: a prompt row lacks 'response' (or TRL's 'completion'), a string; "
                            f"{_FORMS_HELP}.")
        lm = (" (TRL's language-modeling {\"text\"} rows are not supported: the pilot supervises responses, so it "
              "needs the prompt apart)" if "text" in r else "")
        raise error_cls(f"{where}: unrecognised row (keys: {sorted(map(str, r))}){lm}; {_FORMS_HELP}.")
    if need_assistant and not any(m["role"] == "assistant" for m in msgs[n_context:]):
        raise error_cls(f"{where}: the conversation has no assistant turn to train on; add one or drop the row.")
    out = {k: v for k, v in r.items() if k not in ("prompt", "completion", "messages")}
    return {**out, "messages": msgs, "n_context": n_context}


def _check_messages(messages: Any, where: str, field: str, error_cls=SFTDataError) -> list[dict]:
    """Refuse a conversation with a role the encoder does not handle (e.g. ``tool``, ``function``,
    ``Assistant``): a chat template may render it silently as another role or drop it, and
    whether its tokens are supervised would be undefined. Contents must be strings."""
    if not isinstance(messages, list) or not messages:
        raise error_cls(f"{where}: {field} must be a non-empty list of {{role, content}}.")
    out = []
    for k, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in CHAT_ROLES:
            raise error_cls(f"{where}: message {k} has role {role!r}; supported roles are "
                            f"{', '.join(CHAT_ROLES)} (assistant turns are trained on, the others are context). "
                            "Map it to one of them or drop the row.")
        if not isinstance(m.get("content"), str):
            raise error_cls(f"{where}: message {k} ({role}) has content {m.get('content')!r}; expected a string.")
        out.append({"role": role, "content": m["content"]})
    return out


def data_hash(path: str | Path) -> str:
    """SHA-256 of a data file, or of a folder's files (names and contents)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    return canonical_json_hash(sorted((str(f.relative_to(path)), sha256_file(f)) for f in path.rglob("*") if f.is_file()))


def _render(tokenizer, messages, template, *, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=generation_prompt)


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _turn_ranges(tokenizer, messages: list[dict], template: str, rid: str, n_context: int,
                 ids: list[int]) -> list[tuple[int, int]]:
    """Token range ``[start, end)`` of every supervised assistant turn (before trimming)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= n_context]
    starts = []
    for i in turns:  # the tokens before each turn must be the rendered generation prompt's tokens
        pre = _ids(tokenizer, _render(tokenizer, messages[:i], template, generation_prompt=True))
        if ids[: len(pre)] != pre:
            raise SFTDataError(
                f"example {rid}: the chat template's generation prompt before turn {i} tokenizes differently alone "
                "than inside the conversation (the boundary merges with the assistant text, e.g. a trailing space); "
                "evaluation would prompt the model with tokens training never showed it. End the generation prompt "
                "without trailing whitespace (put a leading space in the assistant content, or let the template "
                "add it inside the assistant turn).")
        starts.append(len(pre))
    if _GENERATION_TAG.search(template):
        out = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        if list(out["input_ids"]) != ids:
            raise SFTDataError(f"example {rid}: the chat template renders different tokens with "
                               "return_assistant_tokens_mask; use a fast tokenizer.")
        mask = list(out["assistant_masks"])
        runs, k = [], 0
        while k < len(mask):
            if mask[k]:
                e = k
                while e < len(mask) and mask[e]:
                    e += 1
                runs.append((k, e))
                k = e
            else:
                k += 1
        ranges = []
        for s in starts:  # the {% generation %} block of each supervised assistant turn
            hit = [r for r in runs if r[0] == s]
            if not hit:
                raise SFTDataError(f"example {rid}: the chat template's {{% generation %}} block of an assistant turn "
                                   f"does not start right after the generation prompt (token {s}); wrap exactly the "
                                   "assistant content and its end-of-turn token in {% generation %}...{% endgeneration %}.")
            ranges.append(hit[0])
        return ranges
    ranges = []
    for s, i in zip(starts, turns):
        upto = _ids(tokenizer, _render(tokenizer, messages[: i + 1], template, generation_prompt=False))
        if ids[: len(upto)] != upto:
            raise SFTDataError(f"example {rid}: the chat template does not render turn {i} as a prefix of the "
                               "conversation; use a template whose output grows turn by turn.")
        ranges.append((s, len(upto)))
    return ranges


def _trim_turn(tokenizer, ids: list[int], start: int, end: int) -> int:
    """End (exclusive) of the supervised tokens of the turn ``ids[start:end]``: through its first
    EOS token, else through its last non-whitespace token."""
    eos = tokenizer.eos_token_id
    for k in range(start, end):
        if ids[k] == eos:
            return k + 1
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    while end > start and ids[end - 1] not in special and not tokenizer.decode([ids[end - 1]]).strip():
        end -= 1
    return end


def _encode_chat(tokenizer, messages: list[dict], template: str | None, rid: str, *,
                 n_context: int = 0) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation, cut after its last supervised token, and per token
    whether it is supervised (module docstring: the assistant turns, each through its first EOS)."""
    if not isinstance(messages, list) or not messages:
        raise SFTDataError(f"example {rid}: messages must be a non-empty list of {{role, content}}.")
    ids = _ids(tokenizer, _render(tokenizer, messages, template, generation_prompt=False))
    sup = [False] * len(ids)
    last = 0
    for s, e in _turn_ranges(tokenizer, messages, template, rid, n_context, ids):
        stop = _trim_turn(tokenizer, ids, s, e)
        for k in range(s, stop):
            sup[k] = True
        last = max(last, stop)
    if last == 0:
        raise SFTDataError(f"example {rid}: the chat template renders no assistant tokens to train on.")
    return ids[:last], sup[:last]


def _template_for(tokenizer, chat_template: str | None) -> str | None:
    return chat_template or getattr(tokenizer, "chat_template", None)


def _encode_one(tokenizer, row: dict, *, chat_template: str | None, loss_on: str) -> tuple[list[int], list[bool]]:
    rid = row["id"]
    template = _template_for(tokenizer, chat_template)
    if row_form(row) != "messages" and "response" not in row or row_form(row) == "conversational":
        row = normalize_row(row, f"example {rid}")  # a raw row not read by load_rows (API callers, tests)
    if row_form(row) == "messages":
        if not template:
            raise SFTDataError(f"example {rid}: chat messages need a chat template; set data.chat_template in the "
                               "recipe (the tokenizer has none).")
        ids, sup = _encode_chat(tokenizer, row["messages"], template, rid, n_context=int(row.get("n_context", 0)))
    elif chat_template:
        msgs = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]
        ids, sup = _encode_chat(tokenizer, msgs, chat_template, rid)
    else:
        prompt, response = str(row["prompt"]), str(row["response"])
        p_ids = tokenizer(prompt).input_ids
        full = tokenizer(prompt + response).input_ids
        if full and full[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in p_ids[-1:]:
            full = full[:-1]  # a tokenizer that appends EOS itself; we append it below
        if full[: len(p_ids)] == p_ids:
            r_ids = full[len(p_ids):]
        else:  # the boundary merged across prompt and response: encode the response alone
            r_ids = tokenizer(response, add_special_tokens=False).input_ids
        ids, sup = p_ids + r_ids, [False] * len(p_ids) + [True] * len(r_ids)
    if loss_on == "all":
        sup = [True] * len(ids)
    return ids, sup


def encode_rows(rows: Sequence[dict], tokenizer, *, max_length: int, loss_on: str = "response",
                chat_template: str | None = None, source: str = "data") -> list[EncodedExample]:
    """Tokenize rows into :class:`EncodedExample` (EOS appended and supervised).

    Raises :class:`SFTDataError` naming the example id for zero supervised tokens or an EOS
    that ``max_length`` would cut off.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SFTDataError("the tokenizer has no EOS token; SFT needs one to teach the model to stop.")
    out: list[EncodedExample] = []
    for row in rows:
        rid = row["id"]
        try:
            ids, sup = _encode_one(tokenizer, row, chat_template=chat_template, loss_on=loss_on)
        except SFTDataError as e:
            raise SFTDataError(f"{source}: {e}") from None
        if not ids or ids[-1] != eos:
            ids, sup = ids + [eos], sup + [True]
        else:
            sup[-1] = True
        n_content = sum(sup[1:-1])  # supervised tokens besides EOS (position 0 is never predicted)
        if len(ids) > max_length:
            if sum(sup[1:max_length]) == 0:
                raise SFTDataError(f"{source}: example {rid} has zero supervised tokens within max_length "
                                   f"{max_length} (its prompt alone is {sup.index(True)} tokens). Raise "
                                   "data.max_length or drop the example.")
            raise SFTDataError(f"{source}: example {rid} is {len(ids)} tokens; truncation to data.max_length="
                               f"{max_length} would cut off its EOS. Raise data.max_length to >= {len(ids)} or "
                               "drop/shorten the example.")
        if n_content == 0 and loss_on == "response":
            raise SFTDataError(f"{source}: example {rid} has zero supervised response tokens (empty response, "
                               "or the chat template renders no assistant content). Fix or drop the example.")
        labels = [t if s else IGNORE for t, s in zip(ids, sup)]
        labels[0] = IGNORE  # the first token is never a target
        out.append(EncodedExample(rid, tuple(ids), tuple(labels), sum(1 for x in labels[1:] if x != IGNORE)))
    return out


def collate(examples: Sequence[EncodedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch: input_ids, attention_mask, labels (IGNORE on padding)."""
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        ids[i, :k] = torch.tensor(e.input_ids)
        labels[i, :k] = torch.tensor(e.labels)
        mask[i, :k] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def prompt_formatter(tokenizer, chat_template: str | None):
    """The prompt-to-model-input map matching training: None (identity) for plain
    prompt+response data, else a single user turn rendered with the generation prompt."""
    if not chat_template:
        return None
    return lambda prompt: _render(tokenizer, [{"role": "user", "content": prompt}], chat_template,
                                  generation_prompt=True)


def render_context(tokenizer, row: dict, chat_template: str | None) -> str:
    """The model input that evaluation prompts with for ``row`` (a normalized row), formatted as
    in training: a chat row's context (its prompt turns, or every turn before its last assistant
    turn) rendered with the template and ``add_generation_prompt=True``; a plain row's prompt
    through :func:`prompt_formatter` (identity without a recipe template)."""
    if row_form(row) == "messages":
        template = _template_for(tokenizer, chat_template)
        if not template:
            raise SFTDataError(f"row {row.get('id')}: chat messages need a chat template; set data.chat_template "
                               "in the recipe (the tokenizer has none).")
        msgs = row["messages"]
        n = int(row.get("n_context", 0))
        if n == 0 or any(m["role"] == "assistant" for m in msgs[n:-1]):
            n = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        return _render(tokenizer, msgs[:n], template, generation_prompt=True)
    fmt = prompt_formatter(tokenizer, chat_template)
    return fmt(row["prompt"]) if fmt else row["prompt"]


def reference_response(row: dict) -> str:
    """The reference answer of a normalized row: its response, or its last assistant turn's content."""
    if row_form(row) == "messages":
        return [m for m in row["messages"] if m["role"] == "assistant"][-1]["content"]
    return row["response"]


def supervised_tokens(tokenizer, example: EncodedExample) -> list[tuple[str, bool]]:
    """Every token of an encoded example as ``(token text, is a target)``: the mask, readable."""
    return [(tokenizer.decode([t]), lab != IGNORE) for t, lab in zip(example.input_ids, example.labels)]


def reference_continuation(tokenizer, row: dict, chat_template: str | None) -> str:
    """The text a model continues the evaluation prompt (:func:`render_context`) with when it gives
    the reference answer, as training renders it. Plain rows without a template: the response
    verbatim (its leading space is the data's). Under a chat template the template decides:
    the rendered assistant turn from the end of the generation prompt through the content, e.g.
    ``" 12"`` for a template rendering ``Assistant: {{ content }}`` after the prompt ``Assistant:``
    (the content itself is ``"12"``); the end-of-turn tokens are not part of it."""
    ref = reference_response(row)
    if row_form(row) != "messages" and not chat_template:
        return ref
    template = _template_for(tokenizer, chat_template)
    ctx = render_context(tokenizer, row, chat_template)
    if row_form(row) == "messages":
        msgs = row["messages"]
        n = int(row.get("n_context", 0))
        if n == 0 or any(m["role"] == "assistant" for m in msgs[n:-1]):
            n = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        context = msgs[:n]
    else:
        context = [{"role": "user", "content": row["prompt"]}]
    full = _render(tokenizer, [*context, {"role": "assistant", "content": ref}], template, generation_prompt=False)
    turn = full[len(ctx):] if full.startswith(ctx) else None
    k = -1 if turn is None else turn.find(ref)
    if k < 0:
        raise SFTDataError(f"row {row.get('id')}: the chat template does not render the assistant content right after "
                           "the generation prompt; use a template whose conversation extends its generation prompt.")
    return turn[: k + len(ref)]
