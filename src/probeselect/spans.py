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

:func:`score_groups` runs each prompt once for all its candidates, and runs a token prefix
shared by many prompts (fixed demonstrations) once for all of them (:func:`prefix_clusters`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .errors import ScoringError

__all__ = ["EncodedGroup", "EncodedPair", "SpanScore", "encode_pair", "encode_pair_gdsuite", "group_pairs",
           "prefix_clusters", "score_groups", "score_pairs"]


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


def attention_window(config) -> int | None:
    """The smallest sliding attention window of any layer of a model with ``config``, or None
    when every layer attends to the whole context.

    Reads ``sliding_window`` (Mistral, Qwen2/3, Gemma 2/3, Phi-3, ...) and honours
    ``use_sliding_window: false`` (Qwen2's default) and ``layer_types`` without any
    ``"sliding_attention"`` layer. A model with a window applies it in its own attention
    masks, keyed on cache slots; custom 4D masks (packed scoring) and hand-built cache layouts
    bypass it, so callers keep such layouts to sequences no longer than the window.
    """
    get_text = getattr(config, "get_text_config", None)
    cfg = get_text() if callable(get_text) else config
    window = getattr(cfg, "sliding_window", None)
    if not isinstance(window, int) or window <= 0 or getattr(cfg, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and not any("sliding" in str(t) for t in layer_types):
        return None
    return window


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


@dataclass
class _Row:
    """One packed input row: token ids, position ids, and for every token the group it
    belongs to (``item``, -1 for padding) and its segment in that group (0 = context,
    ``j + 1`` = candidate ``j``); ``targets`` are ``(column, target token, group, j)``."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    item: list[int] = field(default_factory=list)
    seg: list[int] = field(default_factory=list)
    targets: list[tuple[int, int, int, int]] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)


def _item_width(ctx_len: int, g: EncodedGroup) -> int:
    return ctx_len + sum(len(c) - 1 for c in g.continuations)


def _append_group(row: _Row, gi: int, ctx: Sequence[int], g: EncodedGroup, pos0: int) -> None:
    """Append ``ctx + cand_1[:-1] + cand_2[:-1] + ...`` of group ``gi`` to ``row``.

    ``ctx`` is the (possibly truncated, or prefix-stripped) context and ``pos0`` the
    position of its first token. Candidate ``j`` sees the context plus its own earlier
    tokens; positions restart after the context for every candidate, so each candidate
    sees exactly the positions it would see alone.
    """
    p = len(ctx)
    row.groups.append(gi)
    row.ids.extend(ctx)
    row.pos.extend(range(pos0, pos0 + p))
    row.item.extend([gi] * p)
    row.seg.extend([0] * p)
    last_ctx = len(row.ids) - 1
    for j, cont in enumerate(g.continuations):
        row.targets.append((last_ctx, cont[0], gi, j))
        for t, tok in enumerate(cont[:-1]):
            row.targets.append((len(row.ids), cont[t + 1], gi, j))
            row.ids.append(tok)
            row.pos.append(pos0 + p + t)
            row.item.append(gi)
            row.seg.append(j + 1)


def _kept_context(g: EncodedGroup, max_length: int) -> int:
    """Context tokens kept: contexts are truncated from the left so that the longest
    candidate fits in ``max_length`` (lm-eval's rule for that candidate)."""
    longest = max(len(c) for c in g.continuations)
    return min(len(g.context_ids), max(1, max_length + 1 - longest))


def _rows_mask(rows: Sequence[_Row], width: int, n_prefix: int, mode: str, dtype, device):
    """Attention mask ``[rows, 1, width, n_prefix + width]`` for packed rows.

    A token attends causally to the tokens of its own group that are in its own segment
    or in the group's context; every query also sees the ``n_prefix`` shared-prefix keys
    in front of the row. Padded queries attend to themselves (no NaN)."""
    n = len(rows)
    item = torch.full((n, width), -1, dtype=torch.long)
    seg = torch.full((n, width), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        item[r, : len(row.item)] = torch.tensor(row.item)
        seg[r, : len(row.seg)] = torch.tensor(row.seg)
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]  # [q, k]
    same_item = item[:, :, None] == item[:, None, :]
    real_k = (item >= 0)[:, None, :]
    seg_ok = (seg[:, :, None] == seg[:, None, :]) | (seg == 0)[:, None, :]
    allowed = causal[None] & real_k & same_item & seg_ok
    allowed |= torch.eye(width, dtype=torch.bool)[None]
    if n_prefix:
        allowed = torch.cat([torch.ones((n, width, n_prefix), dtype=torch.bool), allowed], dim=-1)
    allowed = allowed[:, None].to(device)
    if mode == "bool":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


class _PrefixKV:
    """A minimal KV cache for one shared prefix.

    While ``serving`` is False it records each layer's keys and values of the prefix
    (batch of 1). While serving, each layer's ``update`` returns the prefix keys/values
    expanded along the batch dimension in front of the batch's own, and keeps nothing,
    so at most one layer's expanded prefix is materialized at a time.
    """

    is_compileable = False

    def __init__(self, n_tokens: int):
        self.n_tokens = n_tokens
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.serving = False

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if not self.serving:
            self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
            return key_states, value_states
        b = key_states.shape[0]
        k, v = self.keys[layer_idx], self.values[layer_idx]
        return (torch.cat([k.expand(b, -1, -1, -1), key_states], dim=-2),
                torch.cat([v.expand(b, -1, -1, -1), value_states], dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.n_tokens if self.serving else 0


def _cache_kwarg(module) -> str | None:
    """The forward() name of the KV cache argument (``cache`` in recent transformers,
    ``past_key_values`` before), or None when the module takes none."""
    import inspect

    params = inspect.signature(type(module).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def prefix_clusters(contexts: Sequence[Sequence[int]], candidates: Sequence[int], *,
                    min_shared: int = 32) -> list[tuple[int, list[int]]]:
    """Groups of contexts worth running behind one shared prefix.

    ``candidates`` are indices into ``contexts``. The contexts are sorted by token ids, so
    that contexts sharing a prefix are adjacent; a run of contexts whose adjacent common
    prefixes are all >= ``min_shared`` tokens shares the shortest of them. A run is split
    at its weakest links when the parts together save more prefix tokens
    (``(members - 1) * shared length``, summed) than the run as a whole. The shared length
    leaves every member at least one token of its own (the last context position predicts
    the first candidate token). Returns ``(shared length, member indices)`` per cluster of
    >= 2 members, members in input order.
    """
    order = sorted(candidates, key=lambda i: tuple(contexts[i]))
    if len(order) < 2:
        return []
    links = [min(_lcp(contexts[a], contexts[b]), len(contexts[a]) - 1, len(contexts[b]) - 1)
             for a, b in zip(order, order[1:])]

    def best(lo: int, hi: int, depth: int) -> tuple[int, list[tuple[int, list[int]]]]:
        # members order[lo:hi], links[lo:hi-1]
        if hi - lo < 2:
            return 0, []
        m = min(links[lo : hi - 1])
        own = (hi - lo - 1) * m if m >= min_shared else 0
        whole = [(m, sorted(order[lo:hi]))] if own else []
        if depth > 200:  # pathological chains of ever longer prefixes: stop refining
            return own, whole
        gain, parts, s = 0, [], lo
        for k in range(lo, hi):
            if k == hi - 1 or links[k] == m:
                g, c = best(s, k + 1, depth + 1)
                gain += g
                parts.extend(c)
                s = k + 1
        return (own, whole) if own and own >= gain else (gain, parts)

    if max(links) < min_shared:
        return []
    return best(0, len(order), 0)[1]


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _score_rows(model, rows: Sequence[_Row], acc: dict, *, budget: int, max_rows: int, prefix: _PrefixKV | None,
                cache_kw: str | None, mode: str, dtype, pad_id: int, device, on_done) -> None:
    """Run packed ``rows`` (longest first) in batches of at most ``budget`` padded tokens
    and ``max_rows`` rows, behind ``prefix`` when given, and accumulate every target's
    log-prob into ``acc[(group, j)] = [logprob, n_tokens, is_greedy]``. On out-of-memory
    the rows per batch halve and the batch is retried. ``on_done(groups)`` is called after
    each batch with the groups it completed."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    n_prefix = prefix.n_tokens if prefix is not None else 0
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r].ids))
    start, cap = 0, max(1, max_rows)
    while start < len(order):
        width = len(rows[order[start]].ids)
        n = max(1, min(cap, budget // max(width, 1)))
        batch = [rows[r] for r in order[start : start + n]]
        try:
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            pos = torch.zeros((len(batch), width), dtype=torch.long)
            for r, row in enumerate(batch):
                ids[r, : len(row.ids)] = torch.tensor(row.ids)
                pos[r, : len(row.pos)] = torch.tensor(row.pos)
            mask = _rows_mask(batch, width, n_prefix, mode, dtype, device)
            kw = {cache_kw: prefix} if prefix is not None else {}
            hidden = decoder(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device),
                             **kw).last_hidden_state
            # Unique scoring positions per row (the last context position is shared by all candidates).
            rows_l, cols_l, tgt_rows, tgt_tokens, owners = [], [], [], [], []
            for r, row in enumerate(batch):
                where: dict[int, int] = {}
                for col, tok, gi, j in row.targets:
                    if col not in where:
                        where[col] = len(rows_l)
                        rows_l.append(r)
                        cols_l.append(col)
                    tgt_rows.append(where[col])
                    tgt_tokens.append(tok)
                    owners.append((gi, j))
            logits = head(hidden[torch.tensor(rows_l, device=device), torch.tensor(cols_l, device=device)])
            del hidden
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            sel = logprobs[torch.tensor(tgt_rows, device=device)]
            tgt = torch.tensor(tgt_tokens, device=device)
            token_lp = sel.gather(-1, tgt[:, None])[:, 0].double().cpu().tolist()
            greedy = (sel.argmax(-1) == tgt).cpu().tolist()
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            if _is_oom(exc) and len(batch) > 1:
                cap = max(1, len(batch) // 2)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            raise
        for key, lp, gr in zip(owners, token_lp, greedy):
            a = acc.setdefault(key, [0.0, 0, True])
            a[0] += lp
            a[1] += 1
            a[2] = a[2] and gr
        on_done([gi for row in batch for gi in row.groups])
        start += len(batch)


def _first_fit(widths: dict[int, int], target: int) -> list[list[int]]:
    """Bins of group indices whose widths sum to at most ``target`` (first fit, widest first)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for gi in sorted(widths, key=lambda g: (-widths[g], g)):
        w = widths[gi]
        for b in range(len(bins)):
            if room[b] >= w:
                bins[b].append(gi)
                room[b] -= w
                break
        else:
            bins.append([gi])
            room.append(max(target, w) - w)
    return bins


#: Shared prefixes shorter than this many tokens are not worth a separate prefix pass.
MIN_SHARED_PREFIX = 32
#: Default bound on prefix KV tokens held at once (rows x prefix length).
DEFAULT_MAX_PREFIX_CACHE_TOKENS = 32768


@torch.inference_mode()
def score_groups(
    model,
    groups: Sequence[EncodedGroup],
    *,
    max_batch_tokens: int = 8192,
    max_length: int | None = None,
    device: torch.device | str | None = None,
    progress=None,
    prefix_reuse: bool = True,
    max_prefix_cache_tokens: int = DEFAULT_MAX_PREFIX_CACHE_TOKENS,
    min_shared_prefix: int = MIN_SHARED_PREFIX,
) -> list[list[SpanScore]]:
    """Score every candidate of every group, running each prompt once.

    Candidates are packed behind their prompt with a block mask and restarted position
    ids, and the LM head is applied only to the last prompt position and the candidate
    positions. Rows are sorted longest first and batched up to ``max_batch_tokens``
    (padded) tokens; on out-of-memory the rows per batch halve and the batch is retried.

    With ``prefix_reuse`` (default), prompts that share a token prefix of at least
    ``min_shared_prefix`` tokens (found by sorting the token ids, see
    :func:`prefix_clusters`) run that prefix once: its keys and values are kept and every
    member's remaining prompt and candidates are packed, several groups to a row, behind
    it (position ids continue after the prefix; the mask lets each group see the prefix,
    its own prompt suffix and its own candidate). A batch holds at most
    ``max_prefix_cache_tokens`` expanded prefix tokens (rows x prefix length); a prefix
    longer than that, and any prompt truncated from the left (longer than the model's
    context), is scored on the unshared path. The log-probs agree with the unshared path
    to float rounding.

    Falls back to :func:`score_pairs` (one sequence per candidate) for attention
    kernels that take no custom mask, and, on a model with a sliding attention window
    (:func:`attention_window`), for the groups longer than the window (a custom mask
    bypasses the model's window rule). Returns, per group, one :class:`SpanScore` per
    candidate in the group's order.
    """
    if max_prefix_cache_tokens < 1:
        raise ValueError("max_prefix_cache_tokens must be >= 1")
    mode = _packing_mode(model)
    packable = mode is not None and _head_only_supported(model)
    # One sequence per candidate, under the model's own masks: everything when the kernel takes
    # no custom mask; on a sliding-window model, the groups longer than the window (the packed
    # layout's custom mask bypasses the window rule).
    window = attention_window(model.config) if packable else None
    unpacked = [i for i, g in enumerate(groups) if not packable or (
        window is not None and len(g.context_ids) + max(map(len, g.continuations)) > window)]
    packed_kw = dict(max_batch_tokens=max_batch_tokens, max_length=max_length, device=device, progress=progress,
                     prefix_reuse=prefix_reuse, max_prefix_cache_tokens=max_prefix_cache_tokens,
                     min_shared_prefix=min_shared_prefix, mode=mode)
    if not unpacked:
        return _score_packed(model, groups, **packed_kw)
    by_index = dict(zip(unpacked, _score_unpacked(model, [groups[i] for i in unpacked], max_batch_tokens, max_length,
                                                  device, progress)))
    rest = sorted(set(range(len(groups))) - set(unpacked))
    if rest:
        by_index.update(zip(rest, _score_packed(model, [groups[i] for i in rest], **packed_kw)))
    return [by_index[i] for i in range(len(groups))]


def _score_unpacked(model, groups: Sequence[EncodedGroup], max_batch_tokens: int, max_length, device, progress
                    ) -> list[list[SpanScore]]:
    """One sequence per candidate (:func:`score_pairs`), regrouped; at most ``max_batch_tokens``
    tokens per batch (16 sequences at the default budget, fewer when they are longer than 512)."""
    flat = [EncodedPair(g.context_ids, c) for g in groups for c in g.continuations]
    if not flat:
        return [[] for _ in groups]
    longest = min(max(len(p.context_ids) + len(p.continuation_ids) for p in flat),
                  max_length or _model_max_length(model))
    batch_size = max(1, max_batch_tokens // max(512, longest))
    scores = score_pairs(model, flat, batch_size=batch_size, max_length=max_length, device=device)
    out, k = [], 0
    for g in groups:
        out.append(scores[k : k + len(g.continuations)])
        k += len(g.continuations)
    if progress is not None:
        progress.update(len(groups))
    return out


def _score_packed(model, groups: Sequence[EncodedGroup], *, max_batch_tokens: int, max_length, device, progress,
                  prefix_reuse: bool, max_prefix_cache_tokens: int, min_shared_prefix: int, mode: str
                  ) -> list[list[SpanScore]]:
    """The packed path of :func:`score_groups` (block mask, optional shared prefixes)."""
    if device is None:
        device = next(model.parameters()).device
    max_length = max_length or _model_max_length(model)
    for g in groups:
        if max(len(c) for c in g.continuations) > max_length:
            raise ScoringError(f"a continuation exceeds the model's {max_length}-token context")
    dtype = next(model.parameters()).dtype
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    acc: dict[tuple[int, int], list] = {}

    def on_done(done: list[int]) -> None:
        if progress is not None:
            progress.update(len(done))

    common = dict(mode=mode, dtype=dtype, pad_id=pad_id, device=device, on_done=on_done)
    kept = [_kept_context(g, max_length) for g in groups]
    plain = set(range(len(groups)))
    cache_kw = _cache_kwarg(model.get_decoder()) if prefix_reuse else None
    if cache_kw is not None:
        whole = [i for i, g in enumerate(groups) if kept[i] == len(g.context_ids)]  # not truncated
        clusters = prefix_clusters([g.context_ids for g in groups], whole, min_shared=min_shared_prefix)
        for n_prefix, members in clusters:
            if n_prefix > max_prefix_cache_tokens:
                continue  # too long to hold expanded even for one row: unshared path
            widths = {gi: _item_width(len(groups[gi].context_ids) - n_prefix, groups[gi]) for gi in members}
            max_rows = max(1, min(max_prefix_cache_tokens // n_prefix, max_batch_tokens // max(widths.values())))
            target = max(max(widths.values()), max_batch_tokens // max_rows)
            rows = []
            for bin_ in _first_fit(widths, target):
                row = _Row()
                for gi in sorted(bin_):
                    _append_group(row, gi, groups[gi].context_ids[n_prefix:], groups[gi], n_prefix)
                rows.append(row)
            prefix = _PrefixKV(n_prefix)
            head_row = _Row()
            head_row.ids = list(groups[members[0]].context_ids[:n_prefix])
            head_row.item, head_row.seg = [0] * n_prefix, [0] * n_prefix
            decoder = model.get_decoder()
            decoder(input_ids=torch.tensor([head_row.ids], device=device),
                    attention_mask=_rows_mask([head_row], n_prefix, 0, mode, dtype, device),
                    position_ids=torch.arange(n_prefix, device=device)[None], **{cache_kw: prefix})
            prefix.serving = True
            _score_rows(model, rows, acc, budget=max(max_batch_tokens, target), max_rows=max_rows, prefix=prefix,
                        cache_kw=cache_kw, **common)
            del prefix
            plain -= set(members)

    rows = []
    for i in sorted(plain):
        row = _Row()
        g = groups[i]
        _append_group(row, i, g.context_ids[len(g.context_ids) - kept[i]:], g, 0)
        rows.append(row)
    _score_rows(model, rows, acc, budget=max_batch_tokens, max_rows=len(rows) or 1, prefix=None, cache_kw=None,
                **common)
    return [[SpanScore(*acc[(i, j)]) for j in range(len(g.continuations))] for i, g in enumerate(groups)]
