"""Validate every data file of a pilot recipe before anything is trained.

``probeselect plan lock --recipe`` (no tokenizer: the files' rows and forms) and
``probeselect pilot`` (with the bases' tokenizer: every row encoded as training and
evaluation will encode it) call :func:`check_recipe_data`. The files: ``data.train``,
``transfer.heldout``, ``transfer.tasks`` and ``transfer.robustness``. An error names the
file, the row (line or id) and the fix; nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SFTDataError, TransferError

__all__ = ["check_recipe_data"]


def _chat_rows(rows) -> list[str]:
    from .data import row_form

    return [str(r.get("id")) for r in rows if row_form(r) == "messages"]


def check_recipe_data(recipe, tokenizer=None) -> dict[str, Any]:
    """Read (and, given a ``tokenizer``, encode) every data file of ``recipe``.

    Returns ``{file key: row count}``. Raises :class:`SFTDataError` or
    :class:`TransferError` naming the file and row: a missing or unreadable file, a row of an
    unknown form, a bad chat role, chat rows without any chat template (the recipe's
    ``data.chat_template`` or, with a tokenizer, the tokenizer's own), an example with nothing
    to supervise or whose EOS ``data.max_length`` cuts off, a held-out row the SFT encoder
    refuses, or a transfer prompt whose reference cannot be scored at its token boundary.
    """
    from ..transfer import load_transfer_items, validate_transfer_config
    from .data import encode_rows, load_rows

    counts: dict[str, Any] = {}
    train = Path(recipe.train_path)
    if not train.exists():
        raise SFTDataError(f"{recipe.source}: data.train: file not found: {train} (relative paths resolve against "
                           "the current directory). Fix the path or override data.train=PATH.")
    rows = load_rows(train)
    counts["data.train"] = len(rows)
    has_template = bool(recipe.chat_template) or bool(tokenizer is not None and getattr(tokenizer, "chat_template",
                                                                                         None))
    items = None
    if recipe.transfer:
        cfg = validate_transfer_config(recipe.transfer, source=recipe.source)
        items = load_transfer_items(cfg, source=recipe.source)
        for k in ("tasks", "robustness", "heldout"):
            if items.paths.get(k):
                counts[f"transfer.{k}"] = len(getattr(items, k))
    # chat rows need a template; without a tokenizer only the recipe's can be known
    for what, path, rs in [("data.train", str(train), rows),
                           *(((f"transfer.{k}", items.paths.get(k), getattr(items, k)) for k in ("tasks", "heldout"))
                             if items else ())]:
        chat = _chat_rows(rs)
        if chat and not has_template and tokenizer is not None:
            raise SFTDataError(f"{path}: {what} row {chat[0]!r} is a chat conversation but neither the recipe "
                               "(data.chat_template) nor the tokenizer has a chat template; set data.chat_template.")
    if tokenizer is None:
        return counts
    encode_rows(rows, tokenizer, max_length=recipe.max_length, loss_on=recipe.loss_on,
                chat_template=recipe.chat_template, source=str(train))
    if items is None:
        return counts
    if items.heldout:
        encode_rows(items.heldout, tokenizer, max_length=recipe.max_length, loss_on="response",
                    chat_template=recipe.chat_template, source=items.paths["heldout"])
    _check_prompts(items, tokenizer, recipe.chat_template)
    return counts


def _check_prompts(items, tokenizer, chat_template) -> None:
    """Every transfer task and robustness prompt renders and its reference encodes at the boundary."""
    from ..errors import ScoringError
    from ..transfer import _encoder
    from .data import prompt_formatter, reference_continuation, render_context, row_form

    fmt = prompt_formatter(tokenizer, chat_template)
    for what, rows in (("tasks", items.tasks), ("robustness", items.robustness)):
        path = items.paths.get(what)
        for r in rows:
            try:
                ctx = render_context(tokenizer, r, chat_template) if row_form(r) == "messages" else (
                    fmt(r["prompt"]) if fmt else r["prompt"])
                if what == "tasks":
                    enc = _encoder(tokenizer, not (fmt or row_form(r) == "messages"))
                    from ..spans import encode_pair

                    encode_pair(enc, ctx, reference_continuation(tokenizer, r, chat_template), what=f"transfer task {r['id']}")
            except (ScoringError, SFTDataError) as e:
                raise TransferError(f"{path}: transfer.{what} row {r['id']!r}: {e}") from None
