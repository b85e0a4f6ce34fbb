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

__all__ = ["EncodedPair", "SpanScore", "encode_pair", "encode_pair_gdsuite", "score_pairs"]


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


def encode_pair_gdsuite(tokenizer, prompt: str, answer: str, *, what: str = "request") -> EncodedPair:
    """Encode ``prompt + " " + answer`` with GDsuite's answer-boundary rule (``boundary: gdsuite``).

    GDsuite finds the boundary as ``len(encode(prompt + " "))`` without special tokens,
    or ``len(encode(prompt))`` when the trailing space changes the prompt's tokens, and
    reads the log-probabilities vLLM returns for the full text, which vLLM tokenizes
    *with* the tokenizer's special tokens. The same index is applied here to the same
    token list, so with a tokenizer that prepends BOS the scored span starts one token
    before the answer (the last prompt token), exactly as in GDsuite. Position 0 has no
    log-probability and is never scored.
    """
    if not prompt:
        raise ScoringError(f"{what}: empty prompt; every item needs a non-empty prompt.")
    full_text = prompt + " " + answer
    prompt_ids = tokenizer.encode(prompt + " ", add_special_tokens=False)
    plain = tokenizer.encode(full_text, add_special_tokens=False)
    start = len(prompt_ids)
    if plain[:start] != prompt_ids:
        start = len(tokenizer.encode(prompt, add_special_tokens=False))
    full = list(tokenizer.encode(full_text))  # what vLLM scores: the tokenizer's default special tokens
    start = max(start, 1)
    if start >= len(full):
        raise ScoringError(f"{what}: answer {answer!r} leaves no token to score under GDsuite's boundary rule.")
    return EncodedPair(tuple(full[:start]), tuple(full[start:]))


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


def _score_targets(model, rows_in: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, device,
                   head_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad the inputs of ``rows_in`` (``(input_ids, targets)``; the targets are the
    last ``len(targets)`` next tokens of the input) into one batch and return, for every
    target token in order, its log-probability (float32) and whether it is the argmax.
    The LM head runs only at the scored positions when ``head_only``."""
    width = max(len(inp) for inp, _ in rows_in)
    ids = torch.full((len(rows_in), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows_in), width), dtype=torch.long)
    rows, cols, targets = [], [], []
    for r, (inp, tgt) in enumerate(rows_in):
        ids[r, : len(inp)] = torch.tensor(list(inp))
        mask[r, : len(inp)] = 1
        # positions whose next-token distribution scores a target token
        rows.extend([r] * len(tgt))
        cols.extend(range(len(inp) - len(tgt), len(inp)))
        targets.extend(tgt)
    ids, mask = ids.to(device), mask.to(device)
    rows_t = torch.tensor(rows, device=device)
    cols_t = torch.tensor(cols, device=device)
    if head_only:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model.get_output_embeddings()(hidden[rows_t, cols_t])
    else:
        logits = model(input_ids=ids, attention_mask=mask).logits[rows_t, cols_t]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tgt_t = torch.tensor(targets, device=device)
    return logprobs.gather(-1, tgt_t[:, None])[:, 0], logprobs.argmax(-1) == tgt_t


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
        token_lp, greedy = _score_targets(model, [inputs[i] for i in idx], pad_id, device, head_only)
        token_lp, greedy = token_lp.cpu(), greedy.cpu()
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


# ---------------------------------------------------------------------------
# Shared-prefix scoring: every candidate of an item behind one copy of its prompt.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedGroup:
    """One prompt and all its candidates (token ids), scored from a single prompt pass."""

    context_ids: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]


def group_pairs(pairs: Sequence[EncodedPair]) -> EncodedGroup:
    """Combine requests that share one context into a group."""
    ctx = pairs[0].context_ids
    if any(p.context_ids != ctx for p in pairs):
        raise ValueError("all pairs of a group must share the context")
    return EncodedGroup(ctx, tuple(p.continuation_ids for p in pairs))


def _packing_mode(model) -> str | None:
    """How to pass a custom 4D mask to this model's attention ("bool", "float"), or None."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl == "sdpa":
        return "bool"
    if impl == "eager":
        return "float"
    return None  # flash/flex/paged kernels take no arbitrary 4D mask


def _pack_group(g: EncodedGroup, max_length: int):
    """Token ids, position ids, segment ids and scoring targets for one packed row.

    Layout: ``context + cand_1[:-1] + cand_2[:-1] + ...``. Segment 0 is the context;
    candidate ``j`` is segment ``j+1`` and sees the context plus its own earlier tokens.
    Positions restart after the context for every candidate, so each candidate sees
    exactly the positions it would see alone. Contexts are truncated from the left so
    that the longest candidate fits in ``max_length`` (lm-eval's rule for that candidate).
    """
    longest = max(len(c) for c in g.continuations)
    keep = max(1, max_length + 1 - longest)
    ctx = list(g.context_ids[-keep:])
    p = len(ctx)
    ids, pos, seg = list(ctx), list(range(p)), [0] * p
    # targets: (index of predicting position in the row, target token, candidate j)
    targets: list[tuple[int, int, int]] = []
    for j, cont in enumerate(g.continuations):
        targets.append((p - 1, cont[0], j))
        for t, tok in enumerate(cont[:-1]):
            targets.append((len(ids), cont[t + 1], j))
            ids.append(tok)
            pos.append(p + t)
            seg.append(j + 1)
    return ids, pos, seg, p, targets


def _build_mask(segs: list[list[int]], ctx_lens: list[int], width: int, mode: str, dtype, device):
    n = len(segs)
    seg = torch.full((n, width), -1, dtype=torch.long)
    for r, s in enumerate(segs):
        seg[r, : len(s)] = torch.tensor(s)
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]  # [q, k]
    same = seg[:, :, None] == seg[:, None, :]  # [b, q, k]
    in_ctx = idx[None, None, :] < torch.tensor(ctx_lens)[:, None, None]  # key is a context token
    real_k = seg[:, None, :] >= 0
    allowed = causal[None] & real_k & (same | in_ctx)
    allowed |= torch.eye(width, dtype=torch.bool)[None]  # padded queries attend to themselves (no NaN)
    allowed = allowed[:, None].to(device)
    if mode == "bool":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


@torch.inference_mode()
def score_groups(
    model,
    groups: Sequence[EncodedGroup],
    *,
    max_batch_tokens: int = 8192,
    max_length: int | None = None,
    device: torch.device | str | None = None,
    progress=None,
) -> list[list[SpanScore]]:
    """Score every candidate of every group, running each prompt once.

    Candidates are packed behind their prompt with a block mask and restarted position
    ids, and the LM head is applied only to the last prompt position and the candidate
    positions. Rows are sorted longest first and batched up to ``max_batch_tokens``
    (padded) tokens; on out-of-memory the budget halves and the batch is retried.
    Falls back to :func:`score_pairs` (one sequence per candidate) for attention
    kernels that take no custom mask. Returns, per group, one :class:`SpanScore` per
    candidate in the group's order.
    """
    mode = _packing_mode(model)
    if mode is None or not _head_only_supported(model):
        flat = [EncodedPair(g.context_ids, c) for g in groups for c in g.continuations]
        scores = score_pairs(model, flat, batch_size=max(1, max_batch_tokens // 512), max_length=max_length, device=device)
        out, k = [], 0
        for g in groups:
            out.append(scores[k : k + len(g.continuations)])
            k += len(g.continuations)
        if progress is not None:
            progress.update(len(groups))
        return out

    if device is None:
        device = next(model.parameters()).device
    max_length = max_length or _model_max_length(model)
    for g in groups:
        if max(len(c) for c in g.continuations) > max_length:
            raise ScoringError(f"a continuation exceeds the model's {max_length}-token context")
    packed = [_pack_group(g, max_length) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: -len(packed[i][0]))
    dtype = next(model.parameters()).dtype
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    results: list[list[SpanScore] | None] = [None] * len(groups)

    start, budget = 0, max_batch_tokens
    while start < len(order):
        width = len(packed[order[start]][0])
        rows = max(1, budget // max(width, 1))
        idx = order[start : start + rows]
        try:
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            pos = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                row_ids, row_pos = packed[i][0], packed[i][1]
                ids[r, : len(row_ids)] = torch.tensor(row_ids)
                pos[r, : len(row_pos)] = torch.tensor(row_pos)
            mask = _build_mask([packed[i][2] for i in idx], [packed[i][3] for i in idx], width, mode, dtype, device)
            hidden = decoder(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device)).last_hidden_state
            # Unique scoring positions per row (the last prompt position is shared by all candidates).
            rows_l, cols_l, tgt_rows, tgt_tokens, owners = [], [], [], [], []
            for r, i in enumerate(idx):
                where: dict[int, int] = {}
                for col, tok, j in packed[i][4]:
                    if col not in where:
                        where[col] = len(rows_l)
                        rows_l.append(r)
                        cols_l.append(col)
                    tgt_rows.append(where[col])
                    tgt_tokens.append(tok)
                    owners.append((i, j))
            logits = head(hidden[torch.tensor(rows_l, device=device), torch.tensor(cols_l, device=device)])
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            sel = logprobs[torch.tensor(tgt_rows, device=device)]
            tgt = torch.tensor(tgt_tokens, device=device)
            token_lp = sel.gather(-1, tgt[:, None])[:, 0].double().cpu().tolist()
            greedy = (sel.argmax(-1) == tgt).cpu().tolist()
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            if _is_oom(exc) and rows > 1:
                budget = max(width, (len(idx) * width) // 2)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            raise
        acc: dict[tuple[int, int], list] = {}
        for (i, j), lp, gr in zip(owners, token_lp, greedy):
            a = acc.setdefault((i, j), [0.0, 0, True])
            a[0] += lp
            a[1] += 1
            a[2] = a[2] and gr
        for i in idx:
            results[i] = [SpanScore(*acc[(i, j)]) for j in range(len(groups[i].continuations))]
        if progress is not None:
            progress.update(len(idx))
        start += len(idx)
    return results  # type: ignore[return-value]
