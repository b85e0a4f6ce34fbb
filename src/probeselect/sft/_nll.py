"""Token NLL of the supervised targets only: the output head runs on the positions that have a label.

SFT supervises the response (a few tokens of a row of up to ``max_length``), yet
``model(...).logits`` projects every position onto the whole vocabulary, and the logits, their
log-softmax and its backward are then mostly thrown away. :func:`supervised_nll` calls the
model with ``logits_to_keep=1`` (transformers' own knob: the head runs on the last position
only), takes the decoder's final hidden states from a forward hook on ``get_decoder()`` and
applies ``get_output_embeddings()`` to the supervised positions. Nothing else changes: the same
forward (a DDP or peft wrapper included, so gradient synchronisation and LoRA layers work as
before), the same targets, the same float32 cross-entropy; the gradient at an unsupervised
position was exactly zero before and is absent now.

An architecture whose logits are not ``head(last hidden state)`` (a logit scale or soft-capping
after the head, a forward without ``logits_to_keep``, a decoder that cannot be found) would be
scored wrongly by that shortcut, so the first call on a model compares it with the full logits
on the batch at hand (:func:`head_is_plain`) and, where they differ, that model is scored from
the full logits from then on (one warning names the architecture).
"""

from __future__ import annotations

import warnings
from typing import Mapping

import torch
import torch.nn.functional as F

from .data import IGNORE

__all__ = ["supervised_nll", "head_is_plain"]

_FLAG = "_probeselect_plain_head"


def _causal_lm(model):
    """The transformers model under DDP (``.module``) and peft (``get_base_model``) wrappers."""
    m = getattr(model, "module", model)
    get_base = getattr(m, "get_base_model", None)
    return get_base() if callable(get_base) else m


def _inputs(batch: Mapping[str, torch.Tensor]) -> dict:
    """Packed rows (position ids, no mask: transformers attends block-diagonally) or padded rows."""
    if "position_ids" in batch:
        return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def _full(model, batch, sel: torch.Tensor) -> torch.Tensor:
    """Logits at the positions ``sel`` from the model's own full logits (float32)."""
    out = model(**_inputs(batch), use_cache=False)
    return out.logits[:, :-1][sel].float()


def _head_only(model, lm, batch, sel: torch.Tensor) -> torch.Tensor:
    """Logits at the positions ``sel``: the output head applied to the decoder's hidden states there."""
    box = {}

    def grab(_mod, _args, out):
        box["h"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

    handle = lm.get_decoder().register_forward_hook(grab)
    try:
        model(**_inputs(batch), use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return lm.get_output_embeddings()(box["h"][:, :-1][sel]).float()


def head_is_plain(model, batch: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``model``'s logits are its output head applied to its decoder's last hidden states
    (so that :func:`supervised_nll` may run the head on the supervised positions only), checked
    once on ``batch`` and remembered on the model. A mismatch or an unsupported call warns once."""
    lm = _causal_lm(model)
    known = getattr(lm, _FLAG, None)
    if known is not None:
        return known
    sel = batch["labels"][:, 1:] != IGNORE
    why = None
    was = lm.training
    lm.eval()  # no dropout: the check neither draws random numbers nor depends on them
    try:
        with torch.no_grad():
            full = _full(lm, batch, sel)
            try:
                fast = _head_only(lm, lm, batch, sel)
            except (TypeError, AttributeError, NotImplementedError, KeyError) as e:
                why = (f"its forward does not take logits_to_keep or its decoder cannot be found "
                       f"({type(e).__name__}: {e})")
            else:
                lowp = next(lm.parameters()).dtype != torch.float32 or torch.is_autocast_enabled()
                tol = (3e-2 if lowp else 1e-4) * (float(full.abs().max().clamp(min=1.0)) if full.numel() else 1.0)
                if fast.shape != full.shape or (fast.numel() and float((fast - full).abs().max()) > tol):
                    why = "its logits are not its output head applied to its last hidden states (e.g. a logit scale)"
    finally:
        lm.train(was)
    ok = why is None
    if not ok:
        warnings.warn(f"{type(lm).__name__}: {why}; SFT losses use the full logits (slower, same values).")
    setattr(lm, _FLAG, ok)
    return ok


def supervised_nll(model, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token NLL (nats, float32) of every supervised target of ``batch`` (``labels`` shifted
    by one, ``IGNORE`` excluded), row-major, and the batch row of each: ``(nll [N], rows [N])``.
    ``batch``: padded rows (``input_ids``, ``attention_mask``, ``labels``) or packed rows
    (``position_ids`` instead of the mask)."""
    targets = batch["labels"][:, 1:]
    sel = targets != IGNORE
    if head_is_plain(model, batch):
        logits = _head_only(model, _causal_lm(model), batch, sel)
    else:
        logits = _full(model, batch, sel)
    return F.cross_entropy(logits, targets[sel], reduction="none"), sel.nonzero()[:, 0]
