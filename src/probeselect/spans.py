"""The span scorer: log p(continuation | context), summed over the continuation's tokens.

Tokenization follows lm-evaluation-harness's ``loglikelihood`` contract exactly:

* trailing spaces of the context move to the continuation (word-boundary spaces belong
  to the continuation);
* the continuation's tokens are ``encode(context + continuation)[len(encode(context)):]``,
  so the boundary tokenizes the way the model sees it in running text;
* the model input is ``(context + continuation)[-(max_length + 1):][:-1]`` (contexts are
  truncated from the left).

Unlike lm-eval we refuse two silent failure modes with an error naming the item: a
continuation that tokenizes to nothing, and a boundary that merges into the context
(``encode(context + continuation)`` does not start with ``encode(context)``), because then
the scored tokens are not the candidate's.

The LM head is applied only at the positions that score a continuation token (the last
context position and the continuation positions, minus the last), never to the whole
sequence, and log-softmax is taken in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import ScoringError

__all__ = ["EncodedPair", "SpanScore", "encode_pair", "score_pairs"]


@dataclass(frozen=True)
class EncodedPair:
    """Token ids of one (context, continuation) request."""

    context_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]


@dataclass(frozen=True)
class SpanScore:
    """Result of scoring one continuation.

    ``logprob`` is the summed log-probability in nats; ``n_tokens`` the number of
    continuation tokens; ``is_greedy`` whether every continuation token is the argmax.
    """

    logprob: float
    n_tokens: int
    is_greedy: bool


def encode_pair(tokenizer, context: str, continuation: str, *, what: str = "request") -> EncodedPair:
    """Encode a request the way lm-evaluation-harness does, with strict boundary checks.

    ``what`` names the request in errors (e.g. the item id and candidate).
    """
    if not context:
        raise ScoringError(f"{what}: empty prompt; every item needs a non-empty prompt.")
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    cont = whole[len(ctx):]
    if whole[: len(ctx)] != ctx:
        raise ScoringError(
            f"{what}: candidate {continuation!r} merges into the prompt at the token boundary "
            f"(prompt ends {context[-20:]!r}); its tokens cannot be scored separately. "
            "Start the candidate with a space or end the prompt with a separator."
        )
    if not cont:
        raise ScoringError(f"{what}: candidate {continuation!r} tokenizes to nothing; use a non-empty answer string.")
    return EncodedPair(tuple(ctx), tuple(cont))


def _model_max_length(model) -> int:
    cfg = model.config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        val = getattr(cfg, attr, None)
        if isinstance(val, int) and val > 0:
            return val
    return 2048


def _head_only_supported(model) -> bool:
    """Whether logits == lm_head(decoder hidden state) exactly for this model.

    Models that post-process logits (soft-capping, logit scaling) take the full-forward
    path instead, restricted to the needed positions.
    """
    cfg = model.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return False
    try:
        dec, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return dec is not None and head is not None and dec is not model


@torch.inference_mode()
def score_pairs(
    model,
    pairs: Sequence[EncodedPair],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
    device: torch.device | str | None = None,
    progress=None,
) -> list[SpanScore]:
    """Score encoded requests with ``model``; returns one :class:`SpanScore` per pair, in order.

    Requests are processed longest first (an out-of-memory error shows up at once),
    right-padded within a batch.
    """
    if device is None:
        device = next(model.parameters()).device
    max_length = max_length or _model_max_length(model)
    head_only = _head_only_supported(model)
    pad_id = getattr(model.config, "pad_token_id", None) or 0

    inputs: list[tuple[list[int], list[int]]] = []
    for p in pairs:
        full = list(p.context_ids) + list(p.continuation_ids)
        if len(p.continuation_ids) > max_length:
            raise ScoringError(f"continuation of {len(p.continuation_ids)} tokens exceeds the model's {max_length}-token context")
        inp = full[-(max_length + 1):][:-1]
        inputs.append((inp, list(p.continuation_ids)))

    order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i][0]))
    results: list[SpanScore | None] = [None] * len(inputs)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(inputs[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            inp = inputs[i][0]
            ids[r, : len(inp)] = torch.tensor(inp)
            mask[r, : len(inp)] = 1
        ids, mask = ids.to(device), mask.to(device)
        # Positions whose next-token distribution scores a continuation token.
        rows, cols, targets = [], [], []
        for r, i in enumerate(idx):
            inp, cont = inputs[i]
            first = len(inp) - len(cont)
            rows.extend([r] * len(cont))
            cols.extend(range(first, len(inp)))
            targets.extend(cont)
        rows_t = torch.tensor(rows, device=device)
        cols_t = torch.tensor(cols, device=device)
        if head_only:
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = model.get_output_embeddings()(hidden[rows_t, cols_t])
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits[rows_t, cols_t]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        tgt = torch.tensor(targets, device=device)
        token_lp = logprobs.gather(-1, tgt[:, None])[:, 0].cpu()
        greedy = (logprobs.argmax(-1) == tgt).cpu()
        offset = 0
        for i in idx:
            n = len(inputs[i][1])
            results[i] = SpanScore(
                logprob=float(token_lp[offset : offset + n].double().sum()),
                n_tokens=n,
                is_greedy=bool(greedy[offset : offset + n].all()),
            )
            offset += n
        if progress is not None:
            progress.update(len(idx))
    return results  # type: ignore[return-value]
