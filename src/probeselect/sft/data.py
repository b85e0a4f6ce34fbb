"""SFT data: load rows, tokenize them with loss masks, and collate micro-batches.

Rows come from a JSONL file, a parquet file or a saved ``datasets`` folder, each row either
``{"id", "prompt", "response"}`` or ``{"id", "messages": [{"role", "content"}, ...]}``
(``id`` optional: ``<file stem>:<row index>`` otherwise). Chat roles must be ``system``,
``user`` or ``assistant`` (:data:`CHAT_ROLES`); any other role is refused naming the file
and line (or row), not left to the template.

Encoding (plain, no chat template): ``BOS + prompt`` then the response tokens taken as
``encode(prompt + response)[len(encode(prompt)):]`` (the boundary tokenizes as in running
text), then EOS appended by the trainer. With a chat template (the recipe's
``data.chat_template`` or the tokenizer's own) the conversation is rendered to text and the
assistant turns are supervised. ``masking.loss_on: response`` supervises response tokens and
EOS; ``all`` supervises every token after the first.

Encoding refuses, naming the example id, an example with zero supervised tokens and one
whose EOS would be cut off by ``max_length`` (a model trained on it never learns to stop).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import canonical_json_hash, reading, sha256_file
from ..errors import SFTDataError

__all__ = ["EncodedExample", "load_rows", "data_hash", "encode_rows", "collate", "prompt_formatter", "IGNORE"]

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
        if not isinstance(r, dict):
            raise SFTDataError(f"{path}: row {i} is not an object.")
        has_pr = "prompt" in r and "response" in r
        if not has_pr and "messages" not in r:
            raise SFTDataError(f"{path}: row {i} has neither prompt/response nor messages (keys: {sorted(r)}).")
        rid = str(r["id"]) if r.get("id") is not None else f"{path.stem}:{i}"
        if r.get("messages") is not None and "prompt" not in r:  # the rows encoded as a conversation
            _check_roles(r.get("messages"), f"{path}: " + (f"line {lines[i]}" if lines else f"row {i}") +
                         f" (id {rid!r})")
        if rid in seen:
            raise SFTDataError(f"{path}: duplicate id {rid!r}; ids must be unique (the data manifest refers to them).")
        seen.add(rid)
        out.append({**r, "id": rid})
    return out


#: Chat roles the SFT encoder handles: assistant turns are supervised, system and user turns are context.
CHAT_ROLES = ("system", "user", "assistant")


def _check_roles(messages: Any, where: str) -> None:
    """Refuse a conversation with a role the encoder does not handle (e.g. ``tool``, ``function``,
    ``Assistant``): a chat template may render it silently as another role or drop it, and
    whether its tokens are supervised would be undefined."""
    if messages is None:
        return
    if hasattr(messages, "tolist"):  # a parquet/datasets column: numpy array of dicts
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        raise SFTDataError(f"{where}: messages must be a non-empty list of {{role, content}}.")
    for k, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in CHAT_ROLES:
            raise SFTDataError(f"{where}: message {k} has role {role!r}; supported roles are "
                               f"{', '.join(CHAT_ROLES)} (assistant turns are trained on, the others are context). "
                               "Map it to one of them or drop the row.")


def data_hash(path: str | Path) -> str:
    """SHA-256 of a data file, or of a folder's files (names and contents)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    return canonical_json_hash(sorted((str(f.relative_to(path)), sha256_file(f)) for f in path.rglob("*") if f.is_file()))


def _render(tokenizer, messages, template, *, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encode_chat(tokenizer, messages: list[dict], template: str | None, rid: str) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation and, per token, whether it belongs to an assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise SFTDataError(f"example {rid}: messages must be a non-empty list of {{role, content}}.")
    full_text = _render(tokenizer, messages, template, generation_prompt=False)
    ids = tokenizer(full_text, add_special_tokens=False).input_ids
    sup = [False] * len(ids)
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        start = len(tokenizer(_render(tokenizer, messages[:i], template, generation_prompt=True),
                              add_special_tokens=False).input_ids)
        upto = tokenizer(_render(tokenizer, messages[: i + 1], template, generation_prompt=False),
                         add_special_tokens=False).input_ids
        if ids[: len(upto)] != upto:
            raise SFTDataError(f"example {rid}: the chat template does not render turn {i} as a prefix of the "
                               "conversation; use a template whose output grows turn by turn.")
        for k in range(start, len(upto)):
            sup[k] = True
    return ids, sup


def _encode_one(tokenizer, row: dict, *, chat_template: str | None, loss_on: str) -> tuple[list[int], list[bool]]:
    rid = row["id"]
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if "messages" in row and row.get("messages") is not None and "prompt" not in row:
        if not template:
            raise SFTDataError(f"example {rid}: chat messages need a chat template; set data.chat_template in the "
                               "recipe (the tokenizer has none).")
        ids, sup = _encode_chat(tokenizer, row["messages"], template, rid)
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
        ids, sup = _encode_one(tokenizer, row, chat_template=chat_template, loss_on=loss_on)
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
