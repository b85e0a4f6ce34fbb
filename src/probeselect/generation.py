"""Generation-based measurements: sampled consistency and a greedy generative audit.

Sampling (:func:`sample_generations`) prefills each prompt once, batched across prompts
with left padding (prompts that share a long token prefix prefill that prefix once, as one
group), then decodes the ``n`` sample rows of those prompts in one batch with a
custom ancestral-sampling loop (full softmax at ``temperature``, no top-k/top-p). The
default engine (``"shared"``, :mod:`probeselect._shared_kv`) keeps one copy of each
prompt's prefill keys/values for all its rows and a preallocated buffer for each row's
generated keys/values; ``engine="expand"`` copies the prompt's cache into every row and
grows it each step, as HF ``generate`` does. A sample stops at the first generated token
whose decoded text contains a newline (the text before the newline is kept) or at an
end-of-sequence token; finished rows are dropped from the batch as they accumulate. The
decode batch is capped by a memory budget or ``max_rows``; larger batches decode in
chunks of rows that all read the one prefill. ``temperature=0`` is greedy (argmax) decoding.

Reproducibility: sample ``j`` of prompt ``i`` at step ``t`` draws the uniform number
``U_i[t, j]`` from a ``torch.Generator`` (on the CPU) seeded from ``(seed, i)`` (or from an
explicit per-prompt seed) and picks the token by inverse-CDF sampling. The random numbers
therefore do not depend on batch composition, on the order of prompts, on which rows
already finished, on how rows are chunked or on the engine; the same seed gives the same
samples on the same checkpoint and device (up to floating-point differences between batch
shapes and engines, which can flip a token only at a near-tie of the cumulative
distribution).

Classification (:func:`classify_generation`) compares normalized text with an item's task
answer, shortcut answer(s) and distractor candidates. Tables:
:func:`persona_generation_table` / :func:`summarize_generation` (sampled task rate with a
Wilson interval) and :func:`generative_audit` / :func:`summarize_audit` (greedy generation
compared with span-scoring correctness).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import math
import re
import string
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Iterable, NamedTuple, Sequence

import pandas as pd
import torch

from ._shared_kv import SharedKVCache, shared_kv_attention_enabled, unsupported_reason
from .items import ProbeItem

__all__ = [
    "CLASSES",
    "Generation",
    "classify_generation",
    "generative_audit",
    "greedy_generations",
    "normalize_answer",
    "persona_generation_table",
    "sample_generations",
    "select_audit_items",
    "summarize_audit",
    "summarize_generation",
    "wilson_interval",
]

#: Generation classes, in the order they are checked.
CLASSES = ("unterminated", "task", "shortcut", "other_candidate", "other")


@dataclass(frozen=True)
class Generation:
    """One generated continuation.

    ``text`` excludes the stop newline (and anything after it in the stop token) and the
    EOS token; ``terminated`` is False when ``max_new_tokens`` ran out first;
    ``n_new_tokens`` counts the generated tokens, the stop token included; ``stop`` says
    what ended it: ``"eos"``, ``"newline"`` or None (``terminated`` is ``stop is not None``;
    it is left out of equality so that ``Generation(text, terminated, n)`` compares by outcome).
    """

    text: str
    terminated: bool
    n_new_tokens: int
    stop: str | None = field(default=None, compare=False)
    #: prompt tokens cut from the left to fit the context (``on_overflow="truncate"``); 0 = whole prompt
    truncated_tokens: int = field(default=0, compare=False)


class ContextOverflowError(ValueError):
    """A prompt plus ``max_new_tokens`` does not fit the context and ``on_overflow="error"``."""

    def __init__(self, message: str, prompts: Sequence[int], limit: int):
        super().__init__(message)
        self.prompts = list(prompts)  # indices of the prompts that do not fit
        self.limit = limit


OVERFLOW_CHOICES = ("error", "truncate")


def context_limit(model, max_length: int | None = None) -> int | None:
    """Tokens a prompt plus its generated tokens may occupy: ``max_length`` when given, capped
    by the model's positions (``max_position_embeddings`` / ``n_positions`` ...) when known."""
    max_pos = _max_positions(model)
    if max_length is None:
        return max_pos
    return max_length if max_pos is None else min(int(max_length), max_pos)


def fit_prompts(encoded: Sequence[Sequence[int]], limit: int | None, max_new_tokens: int,
                on_overflow: str = "error") -> tuple[list[list[int]], list[int]]:
    """Fit token prompts to ``limit - max_new_tokens`` tokens.

    ``on_overflow="error"`` raises :class:`ContextOverflowError` naming the first prompt
    that does not fit and how many do not; ``"truncate"`` keeps each long prompt's last
    ``limit - max_new_tokens`` tokens, as lm-eval's ``generate_until`` does (a leading BOS
    is cut with the rest). Returns the prompts and the tokens cut from each.
    """
    if on_overflow not in OVERFLOW_CHOICES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_CHOICES}, got {on_overflow!r}")
    if limit is None:
        return [list(e) for e in encoded], [0] * len(encoded)
    keep = limit - max_new_tokens
    over = [i for i, ids in enumerate(encoded) if len(ids) > keep]
    if not over:
        return [list(e) for e in encoded], [0] * len(encoded)
    if on_overflow == "error" or keep < 1:
        i = over[0]
        why = (f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the {limit}-token context"
               if keep < 1 else
               f"prompt {i} has {len(encoded[i])} tokens; with max_new_tokens={max_new_tokens} it exceeds the "
               f"{limit}-token context ({len(over)} of {len(encoded)} prompts do not fit)")
        raise ContextOverflowError(why, over, limit)
    cut = [max(0, len(ids) - keep) for ids in encoded]
    return [list(ids[c:]) for ids, c in zip(encoded, cut)], cut


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------


def _derived_seed(*key: object) -> int:
    digest = hashlib.sha256(repr(("probeselect.generation",) + key).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _forward_kwargs(model) -> tuple[str, dict[str, int]]:
    """The forward() name of the KV cache argument (``cache`` in recent transformers,
    ``past_key_values`` before) and the prefill kwargs that keep only the last logits."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    if "logits_to_keep" in params:
        keep = {"logits_to_keep": 1}
    elif "num_logits_to_keep" in params:
        keep = {"num_logits_to_keep": 1}
    else:
        keep = {}
    return cache_kw, keep


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def _stop_token_mask(tokenizer, vocab_size: int, device) -> torch.Tensor:
    """Boolean mask over the model's vocabulary: tokens whose decoded text contains a newline."""
    n = min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[: n] = torch.tensor(["\n" in t for t in texts], dtype=torch.bool)
    return mask.to(device)


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        val = getattr(src, "eos_token_id", None) if src is not None else None
        if val is None:
            continue
        ids.update([val] if isinstance(val, int) else [int(v) for v in val])
    return ids


def _max_positions(model) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        val = getattr(model.config, attr, None)
        if isinstance(val, int) and val > 0:
            return val
    return None


_MiB = 1 << 20


def _cache_bytes(cache) -> int | None:
    """Bytes held by a (prefill) KV cache, or None when its layout is unknown."""
    layers = getattr(cache, "layers", None)
    try:
        if layers is not None:
            tensors = [t for l in layers for t in (getattr(l, "keys", None), getattr(l, "values", None))]
        else:  # transformers 4.x
            tensors = list(getattr(cache, "key_cache")) + list(getattr(cache, "value_cache"))
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    except (AttributeError, TypeError):
        return None


def _row_budget(model, device) -> float:
    """Bytes of decode state the batch may use: on the CPU 256 MiB or twice the weights,
    whichever is larger (moderate batches are much faster than huge ones there); on CUDA
    30% of the free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return 0.3 * free
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(256 * _MiB, 2 * weights)


def _auto_max_rows(model, cache, n_prompts: int, width: int, max_new_tokens: int, device, *,
                   shared_vocab: int | None = None) -> int | None:
    """Decode-batch rows that fit :func:`_row_budget` (None when the cache size is unknown).

    ``engine="expand"`` (``shared_vocab=None``): a row holds its own copy of the prompt's K/V
    plus the new tokens'. ``engine="shared"`` (``shared_vocab`` = the vocabulary size): a row
    holds only its generated K/V (the prompt's K/V is shared), one layer's float32 attention
    scores over the prompt and a few float32 copies of its next-token distribution.
    """
    total = _cache_bytes(cache)
    if not total:
        return None
    per_prompt = total / n_prompts
    if shared_vocab is None:
        per_row = per_prompt * (width + max_new_tokens) / width
    else:
        heads = getattr(model.config, "num_attention_heads", None) or 1
        per_row = per_prompt * max_new_tokens / width + 4 * (3 * heads * width + 4 * shared_vocab)
    return max(1, int(_row_budget(model, device) // per_row))


def _pick(logits: torch.Tensor, u: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Next tokens: argmax when ``temperature == 0``, else inverse-CDF sampling with ``u``."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    x = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    # first token whose cumulative probability exceeds x (never a zero-probability token)
    tok = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return tok.clamp_(max=logits.shape[-1] - 1)


def _finish(tokenizer, toks: list[int], reason: str | None) -> Generation:
    if reason == "eos":
        text = tokenizer.decode(toks[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    else:
        text = tokenizer.decode(toks, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if reason == "newline":
            text = text.split("\n", 1)[0]
    return Generation(text=text, terminated=reason is not None, n_new_tokens=len(toks), stop=reason)


class _ExpandDecoder:
    """Decode steps over a per-row (expanded) HF cache with a growing 2-D attention mask."""

    def __init__(self, model, cache, cache_kw: str, attn: torch.Tensor):
        self.model, self.cache, self.cache_kw, self.attn = model, cache, cache_kw, attn

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.attn = self.attn[keep]

    def step(self, nxt: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones((self.attn.shape[0], 1))], dim=1)
        out = self.model(input_ids=nxt.unsqueeze(-1), attention_mask=self.attn, position_ids=pos.unsqueeze(-1),
                         use_cache=True, **{self.cache_kw: self.cache})
        return out.logits[:, -1, :]


class _SharedDecoder:
    """Decode steps through a :class:`~probeselect._shared_kv.SharedKVCache` (one copy of
    each prompt's K/V; call inside ``shared_kv_attention_enabled(model)``)."""

    def __init__(self, model, shared):
        self.model, self.shared = model, shared

    def select(self, keep: torch.Tensor) -> None:
        self.shared.select_rows(keep)

    def step(self, nxt: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=nxt.unsqueeze(-1), position_ids=pos.unsqueeze(-1), use_cache=False,
                         shared_kv=self.shared)
        return out.logits[:, -1, :]


_REASONS = (None, "eos", "newline")


def _decode_rows(decoder, logits0, pos0, row_prompt, row_sample, uniforms, *,
                 temperature, max_new_tokens, stop_mask, eos, compact_fraction):
    """Decode the rows of one chunk (first logits from the prefill); per-row (tokens, reason)."""
    device = logits0.device
    n_rows = len(row_prompt)
    toks = torch.zeros((n_rows, max_new_tokens), dtype=torch.long)
    n_toks = torch.zeros(n_rows, dtype=torch.long)
    code = torch.zeros(n_rows, dtype=torch.long)  # index into _REASONS
    live = torch.arange(n_rows)  # chunk row id of each current batch row
    done_present = torch.zeros(n_rows, dtype=torch.bool)  # finished rows still in the batch
    logits, pos = logits0, pos0
    rp, rs = row_prompt, row_sample
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=device) if eos else None
    for t in range(max_new_tokens):
        u = uniforms[rp, t, rs] if temperature != 0 else None
        nxt = _pick(logits, u, temperature)
        is_nl = stop_mask[nxt]
        is_eos = torch.isin(nxt, eos_t) if eos_t is not None else torch.zeros_like(is_nl)
        nxt_c, nl_c, eos_c = nxt.cpu(), is_nl.cpu(), is_eos.cpu()
        active = ~done_present
        rows = live[active]
        toks[rows, t] = nxt_c[active]
        n_toks[rows] = t + 1
        code[rows] = torch.where(eos_c, 1, torch.where(nl_c, 2, 0))[active]
        done_present = done_present | nl_c | eos_c
        if t == max_new_tokens - 1 or bool(done_present.all()):
            break
        n_done = int(done_present.sum())
        if n_done and n_done >= compact_fraction * len(live):
            keep = (~done_present).nonzero().squeeze(-1)
            keep_d = keep.to(device)
            decoder.select(keep_d)
            live, rp, rs = live[keep], rp[keep], rs[keep]
            nxt, pos = nxt[keep_d], pos[keep_d]
            done_present = done_present[keep]
        logits = decoder.step(nxt, pos)
        pos = pos + 1
    return ([row[:k] for row, k in zip(toks.tolist(), n_toks.tolist())],
            [_REASONS[c] for c in code.tolist()])


#: Default ``min_shared_prefix`` of :func:`sample_generations`: prompts sharing a token
#: prefix at least this long prefill it once.
MIN_SHARED_PREFIX = 16


def _prefix_groups(model, encoded: Sequence[Sequence[int]], min_shared: int,
                   max_new_tokens: int) -> list[tuple[int, list[int]]]:
    """Groups of prompts whose common token prefix is prefilled once: ``(shared length,
    member indices)``, ``shared length >= min_shared`` and shorter than every member (each
    member keeps at least its last token to prefill), sorted by shared length (longest
    first). None when ``min_shared`` is 0, or when the model has a sliding attention window
    that a batch's cache could outgrow: a batch lays its rows out as ``[prefix | padding |
    rest]`` in cache slots, up to (longest shared prefix) + (longest prompt) slots before
    ``max_new_tokens`` decode slots, and HF's sliding masks and sliding cache layers count
    slots, not positions."""
    from .spans import attention_window, prefix_clusters

    if min_shared <= 0 or len(encoded) < 2:
        return []
    groups = prefix_clusters(encoded, range(len(encoded)), min_shared=min_shared)
    if not groups:
        return []
    window = attention_window(model.config)
    if window is not None and window < max(g[0] for g in groups) + max(map(len, encoded)) + max_new_tokens:
        return []
    return sorted(groups, key=lambda g: (-g[0], g[1][0]))


def _prefix_kv(model, ids: Sequence[int], *, cache_kw: str, keep_last: dict, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) ``[1, kv_heads, len(ids), head_dim]`` of one token prefix
    (positions 0..len-1), run as a batch of one."""
    from ._shared_kv import _cache_layers

    cache = _new_cache(model)
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    model(input_ids=x, position_ids=torch.arange(x.shape[1], device=device)[None], use_cache=True,
          **{cache_kw: cache}, **keep_last)
    return [(k, v) for k, v in _cache_layers(cache)]


def _prefill_batch(model, encoded: Sequence[Sequence[int]], shared: Sequence[int],
                   prefix_kv: Sequence[list[tuple[torch.Tensor, torch.Tensor]] | None], *, cache_kw: str,
                   keep_last: dict, pad_id: int, device):
    """Prefill one batch of prompts; returns (cache, attention mask, last-position logits).

    Prompt ``r`` has token ids ``encoded[r]``; its first ``shared[r]`` tokens were already run
    (``prefix_kv[r]``: their per-layer keys/values, batch 1; None when ``shared[r]`` is 0).
    The cache rows are laid out ``[prefix | padding | left-padded rest]``: the prefixes'
    keys/values (placed in the first ``shared[r]`` slots of every row; S = the longest
    shared prefix of the batch), then the rest of every prompt, left-padded to the longest
    rest and run in one forward behind them with explicit positions continuing after each
    row's prefix. The mask (``[rows, S + rest width]``) is 1 exactly at each row's prompt
    tokens, so ``mask.sum(-1)`` is each prompt's length (its next position). With no shared
    prefix this is the plain left-padded prefill.
    """
    P = len(encoded)
    S = max(shared)
    rest = [list(e[s:]) for e, s in zip(encoded, shared)]
    if not all(rest):
        raise ValueError("every prompt needs at least one token past its shared prefix")
    W = max(map(len, rest))
    ids = torch.full((P, W), pad_id, dtype=torch.long)
    mask = torch.zeros((P, S + W), dtype=torch.long)
    pos = torch.zeros((P, W), dtype=torch.long)
    for r, (toks, s) in enumerate(zip(rest, shared)):
        L = len(toks)
        ids[r, W - L :] = torch.tensor(toks, dtype=torch.long)
        mask[r, :s] = 1
        mask[r, S + W - L :] = 1
        pos[r, W - L :] = torch.arange(s, s + L)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    cache = _new_cache(model)
    if S:
        ref = next(kv for kv in prefix_kv if kv is not None)
        for layer, (k0, v0) in enumerate(ref):
            keys = k0.new_zeros((P, k0.shape[1], S, k0.shape[3]))
            values = v0.new_zeros((P, v0.shape[1], S, v0.shape[3]))
            for r, (s, kv) in enumerate(zip(shared, prefix_kv)):
                if s:
                    keys[r, :, :s] = kv[layer][0][0, :, :s]
                    values[r, :, :s] = kv[layer][1][0, :, :s]
            cache.update(keys, values, layer)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache},
                **keep_last)
    last = out.logits[:, -1, :]
    return cache, mask, last


ENGINES = ("shared", "expand")


_FALLBACK_NOTED: set[tuple[str, str]] = set()


def _note_fallback(model, why: str) -> None:
    """Warn that sampling uses the ``expand`` engine: once per process for each model type and
    kind of reason, not once per call (a run samples many times on every checkpoint)."""
    key = (str(getattr(model.config, "model_type", type(model).__name__)), why.split(" (")[0])
    if key in _FALLBACK_NOTED:
        return
    _FALLBACK_NOTED.add(key)
    warnings.warn(f"sample_generations: the shared-KV engine does not support this model ({why}); "
                  "falling back to engine='expand' (same samples, more memory); shown once per model type",
                  RuntimeWarning, stacklevel=4)


@torch.inference_mode()
def sample_generations(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    n: int = 200,
    temperature: float = 1.0,
    max_new_tokens: int = 16,
    seed: int = 0,
    batch_prompts: int = 8,
    prompt_seeds: Sequence[int] | None = None,
    max_rows: int | None = None,
    compact_fraction: float = 0.25,
    engine: str = "shared",
    min_shared_prefix: int = MIN_SHARED_PREFIX,
    progress=None,
    stats: dict | None = None,
    max_length: int | None = None,
    on_overflow: str = "error",
) -> list[list[Generation]]:
    """``n`` sampled continuations of every prompt, each stopped at a newline or EOS.

    Prompts are encoded with the tokenizer's default special tokens (like the span
    scorer), sorted by length (prefix groups first, see below), and prefilled ``batch_prompts`` at a time (left padding,
    explicit position ids), so a prompt's tokens are processed once, not ``n`` times; the
    ``n`` sample rows of those prompts then decode in one batch.

    Prompts that share a token prefix of at least ``min_shared_prefix`` tokens (default
    :data:`MIN_SHARED_PREFIX`; 0 turns this off) also share its prefill: the prompts are
    sorted by token ids and runs of them with long common prefixes form groups (as
    :func:`probeselect.spans.prefix_clusters` does for span scoring; every member keeps at
    least one token of its own). A group's common prefix runs once, as a batch of one; its
    keys/values are copied into the prefill cache of each member's batch, and the rest of
    each prompt is prefilled behind it (positions continuing after the prefix). Decoding
    is unchanged. Grouping changes only floating-point rounding, not the random numbers
    (see reproducibility below). It is skipped for models whose sliding attention window
    is shorter than prompt + new tokens. ``max_rows`` caps the
    decode batch (rows = prompts x samples; default: a memory budget, see
    :func:`_row_budget`): larger batches decode in chunks of rows that all read the one
    prefill. Rows are dropped from the batch once at least ``compact_fraction`` of the
    current rows have finished.

    ``engine``: ``"shared"`` (default) keeps ONE copy of each prompt's prefill keys/values
    and a preallocated buffer of every row's generated keys/values, and merges the two
    attention parts exactly (:mod:`probeselect._shared_kv`); it supports llama, mistral,
    qwen2, qwen3, olmo and olmo2 models and falls back to ``"expand"`` for other
    architectures (GPT-2, GPT-NeoX, ...), with one ``RuntimeWarning`` per process and model
    type. ``"expand"`` copies each prompt's cache into its ``n`` rows and
    grows it every step (what HF ``generate`` does). Both draw the same random numbers:
    they give the same samples, up to floating-point near-ties (see the module docstring).

    ``temperature=0`` is greedy decoding (all ``n`` samples are identical). Sample ``j`` of
    prompt ``i`` is determined by ``(seed, i)`` — or by ``prompt_seeds[i]`` when given, so
    that a prompt keeps its samples whatever else is in the list.

    ``progress``: None/False (silent); True (a tqdm bar counting samples, with samples/s
    and ETA, closed on return); or a tqdm-like object, updated once per finished prompt
    (its postfix, when it has ``set_postfix_str``, shows the sample rate).

    Context: a prompt plus ``max_new_tokens`` must fit in ``max_length`` (default: the
    model's positions; see :func:`context_limit`). ``on_overflow="error"`` (default) raises
    :class:`ContextOverflowError` (a ``ValueError``); ``"truncate"`` cuts long prompts from
    the left as lm-eval's ``generate_until`` does, and each :class:`Generation` records the
    tokens cut (``truncated_tokens``).

    ``stats``: an optional dict, filled with counts of what ran: ``prompts``,
    ``prompt_tokens`` (all prompts' tokens), ``prefill_tokens`` (tokens run through the
    model to prefill them, each group prefix once; padding excluded), ``shared_groups``
    and ``shared_prompts`` (prefix groups and the prompts in them).
    """
    _check_sampling_args(prompts, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                         batch_prompts=batch_prompts, prompt_seeds=prompt_seeds, max_rows=max_rows, engine=engine,
                         min_shared_prefix=min_shared_prefix)
    if not prompts:
        return []
    device = next(model.parameters()).device
    cache_kw, keep_last = _forward_kwargs(model)
    eos = _eos_ids(model, tokenizer)
    pad_id = _pad_id(model, tokenizer)
    encoded, cut = _encode_prompts(model, tokenizer, prompts, max_new_tokens, max_length, on_overflow)
    if engine == "shared":  # the fallback is noted here: its warning's stacklevel names our caller
        why = unsupported_reason(model, max(map(len, encoded)) + max_new_tokens)
        if why is not None:
            _note_fallback(model, why)
            engine = "expand"
    # greedy samples are all identical: decode one row per prompt and repeat it
    s = _Sampler(model=model, tokenizer=tokenizer, device=device, cache_kw=cache_kw, keep_last=keep_last, eos=eos,
                 pad_id=pad_id, engine=engine, n=n, n_rows=1 if temperature == 0 else n, temperature=temperature,
                 max_new_tokens=max_new_tokens, seed=seed, prompt_seeds=prompt_seeds, max_rows=max_rows,
                 compact_fraction=compact_fraction)
    lay = _layout(model, encoded, min_shared_prefix, max_new_tokens, batch_prompts)
    counts = _Counts()
    if stats is not None:
        stats.update(prompts=len(prompts), prompt_tokens=sum(map(len, encoded)), shared_groups=len(lay.groups),
                     shared_prompts=sum(len(m) for _, m in lay.groups), prefill_tokens=0)
    progress, own_bar = _open_progress(progress, len(prompts) * n)
    try:
        return _sample_batches(s, encoded, cut, lay, batch_prompts, counts, progress, own_bar)
    finally:
        if own_bar:
            progress.close()
        if stats is not None:
            stats["prefill_tokens"] = counts.prefill


def _pad_id(model, tokenizer) -> int:
    """The padding token: the model config's, else the tokenizer's, else 0."""
    pad_id = getattr(model.config, "pad_token_id", None)
    if pad_id is None:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return pad_id


def _sample_batches(s: _Sampler, encoded: list[list[int]], cut: list[int], lay: _Layout, batch_prompts: int,
                    counts: _Counts, progress, own_bar: bool) -> list[list[Generation]]:
    """Prefill the prompts ``batch_prompts`` at a time in the layout's order, decode each batch's
    rows and collect every prompt's samples (each distinct sample decoded to text once)."""
    results: list[list[Generation] | None] = [None] * len(encoded)
    finished: dict[tuple[tuple[int, ...], str | None], Generation] = {}  # decode each distinct sample once
    prefix_kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    stop_mask = None
    t_start = time.perf_counter()
    for start in range(0, len(lay.order), batch_prompts):
        idx = lay.order[start : start + batch_prompts]
        cache, mask, last = _prefill(s, encoded, lay, idx, start, prefix_kv, counts)
        if stop_mask is None:
            stop_mask = _stop_token_mask(s.tokenizer, last.shape[-1], s.device)
        toks, reasons = _decode_batch(s, cache, mask, last, stop_mask, _uniforms(s, idx))
        del cache
        _collect(s, idx, toks, reasons, cut, finished, results, progress, own_bar)
        counts.done += len(idx) * s.n
        if progress is not None and not own_bar and hasattr(progress, "set_postfix_str"):
            progress.set_postfix_str(f"{counts.done / max(time.perf_counter() - t_start, 1e-9):.0f} samples/s")
    return results  # type: ignore[return-value]


def _check_sampling_args(prompts: Sequence[str], *, n: int, temperature: float, max_new_tokens: int,
                         batch_prompts: int, prompt_seeds: Sequence[int] | None, max_rows: int | None, engine: str,
                         min_shared_prefix: int) -> None:
    """Refuse bad arguments of :func:`sample_generations` before any model work."""
    if n < 1 or max_new_tokens < 1 or batch_prompts < 1:
        raise ValueError("n, max_new_tokens and batch_prompts must be >= 1")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if prompt_seeds is not None and len(prompt_seeds) != len(prompts):
        raise ValueError("prompt_seeds must have one seed per prompt")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if min_shared_prefix < 0:
        raise ValueError(f"min_shared_prefix must be >= 0 (0 = no prefix sharing), got {min_shared_prefix}")


def _encode_prompts(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, max_length: int | None,
                    on_overflow: str) -> tuple[list[list[int]], list[int]]:
    """Token ids of every prompt, fitted to the context (:func:`fit_prompts`), and the tokens cut from each."""
    encoded = [list(tokenizer.encode(p)) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} encodes to no tokens")
    return fit_prompts(encoded, context_limit(model, max_length), max_new_tokens, on_overflow)


@dataclass(frozen=True, eq=False)
class _Sampler:
    """The resolved settings every batch of one :func:`sample_generations` call uses."""

    model: Any
    tokenizer: Any
    device: torch.device
    cache_kw: str  # forward()'s name of the KV cache argument
    keep_last: dict  # prefill kwargs that keep only the last logits
    eos: set[int]
    pad_id: Any
    engine: str  # after any fallback to "expand"
    n: int
    n_rows: int  # decoded rows per prompt (1 when greedy)
    temperature: float
    max_new_tokens: int
    seed: int
    prompt_seeds: Sequence[int] | None
    max_rows: int | None
    compact_fraction: float


class _Layout(NamedTuple):
    """Prefix groups and the order in which prompts are prefilled (batches of ``batch_prompts``)."""

    groups: list[tuple[int, list[int]]]  # (shared prefix length, member prompts)
    n_shared: list[int]  # tokens of prompt i prefilled with its group (0: none)
    group_of: list[int]  # group of prompt i (-1: none)
    order: list[int]  # prompts in prefill order
    last_batch: dict[int, int]  # group -> start of the last batch holding one of its prompts


@dataclass
class _Counts:
    prefill: int = 0  # tokens run through the model to prefill (each group prefix once)
    done: int = 0  # samples finished


def _layout(model, encoded: Sequence[Sequence[int]], min_shared_prefix: int, max_new_tokens: int,
            batch_prompts: int) -> _Layout:
    """Group prompts sharing a long token prefix (prefilled once) and order them for prefill."""
    groups = _prefix_groups(model, encoded, min_shared_prefix, max_new_tokens)
    n_shared = [0] * len(encoded)
    group_of = [-1] * len(encoded)
    for g, (S, members) in enumerate(groups):
        for i in members:
            n_shared[i], group_of[i] = S, g
    # groups first (members adjacent, longest first), then the other prompts, longest first;
    # batches of batch_prompts prompts may mix groups and ungrouped prompts
    order = sorted((i for i in range(len(encoded)) if group_of[i] >= 0),
                   key=lambda i: (group_of[i], -len(encoded[i]), i))
    order += sorted((i for i in range(len(encoded)) if group_of[i] < 0), key=lambda i: (-len(encoded[i]), i))
    last_batch = {}
    for k, i in enumerate(order):
        if group_of[i] >= 0:
            last_batch[group_of[i]] = k - k % batch_prompts
    return _Layout(groups=groups, n_shared=n_shared, group_of=group_of, order=order, last_batch=last_batch)


def _open_progress(progress, total: int):
    """(progress object or None, whether it is our own tqdm bar to close)."""
    own_bar = progress is True
    if own_bar:
        from tqdm.auto import tqdm

        progress = tqdm(total=total, desc="sampling", unit="sample", leave=False)
    elif progress is False:
        progress = None
    return progress, own_bar


def _prefill(s: _Sampler, encoded: Sequence[Sequence[int]], lay: _Layout, idx: list[int], start: int,
             prefix_kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]], counts: _Counts):
    """Prefill the batch ``idx`` (starting at ``start`` in ``lay.order``): (cache, mask, last logits).
    Runs each group prefix it needs once (kept in ``prefix_kv`` until its last batch)."""
    for g in sorted({lay.group_of[i] for i in idx if lay.group_of[i] >= 0}):
        if g not in prefix_kv:  # a group's common prefix runs once (batch 1), whatever its batches
            prefix_kv[g] = _prefix_kv(s.model, encoded[lay.groups[g][1][0]][: lay.groups[g][0]],
                                      cache_kw=s.cache_kw, keep_last=s.keep_last, device=s.device)
            counts.prefill += lay.groups[g][0]
    # the prefill: each prompt's tokens (past its group's prefix) go through the model once
    cache, mask, last = _prefill_batch(s.model, [encoded[i] for i in idx], [lay.n_shared[i] for i in idx],
                                       [prefix_kv.get(lay.group_of[i]) for i in idx], cache_kw=s.cache_kw,
                                       keep_last=s.keep_last, pad_id=int(s.pad_id), device=s.device)
    counts.prefill += sum(len(encoded[i]) - lay.n_shared[i] for i in idx)
    for g in [g for g in prefix_kv if lay.last_batch[g] <= start]:
        del prefix_kv[g]  # no later batch needs this group's prefix
    return cache, mask, last


def _uniforms(s: _Sampler, idx: list[int]) -> torch.Tensor | None:
    """The uniform draws ``[prompt, step, sample]`` of the batch (None when greedy): prompt
    ``i``'s come from ``prompt_seeds[i]`` or ``(seed, i)``, whatever else is in the batch."""
    if s.temperature == 0:
        return None
    uniforms = torch.empty((len(idx), s.max_new_tokens, s.n), dtype=torch.float32)
    for r, i in enumerate(idx):
        seed = int(s.prompt_seeds[i]) & ((1 << 63) - 1) if s.prompt_seeds is not None else _derived_seed(s.seed, i)
        uniforms[r] = torch.rand((s.max_new_tokens, s.n), generator=torch.Generator().manual_seed(seed))
    return uniforms


def _decode_batch(s: _Sampler, cache, mask: torch.Tensor, last: torch.Tensor, stop_mask: torch.Tensor,
                  uniforms: torch.Tensor | None) -> tuple[list[list[int]], list[str | None]]:
    """Decode every row (prompt x sample) of one prefilled batch, in chunks of rows that all
    read the one prefill; per-row (tokens, stop reason), rows of prompt r at r*n_rows..."""
    P, width, lengths = mask.shape[0], mask.shape[1], mask.sum(-1)
    rows_p = torch.arange(P).repeat_interleave(s.n_rows)
    rows_s = torch.arange(s.n_rows).repeat(P)
    auto = _auto_max_rows(s.model, cache, P, width, s.max_new_tokens, s.device,
                          shared_vocab=last.shape[-1] if s.engine == "shared" else None)
    chunk = s.max_rows or auto or len(rows_p)
    toks_all: list[list[int]] = []
    reason_all: list[str | None] = []
    kw = dict(temperature=s.temperature, max_new_tokens=s.max_new_tokens, stop_mask=stop_mask, eos=s.eos,
              compact_fraction=s.compact_fraction)
    for c0 in range(0, len(rows_p), chunk):
        rp, rs = rows_p[c0 : c0 + chunk], rows_s[c0 : c0 + chunk]
        rp_d = rp.to(s.device)
        if s.engine == "shared":
            # every chunk reads the one prefill K/V; only generated tokens get per-row storage
            shared = SharedKVCache.from_prefill(cache, mask, rp_d, s.max_new_tokens)
            with shared_kv_attention_enabled(s.model):
                toks, reason = _decode_rows(_SharedDecoder(s.model, shared), last[rp_d], lengths[rp_d],
                                            rp, rs, uniforms, **kw)
            del shared
        else:
            # the last (or only) chunk expands the prefill cache itself, earlier ones a copy
            c_cache = cache if c0 + chunk >= len(rows_p) else copy.deepcopy(cache)
            c_cache.batch_select_indices(rp_d)  # expand: each prompt's row repeated per sample
            toks, reason = _decode_rows(_ExpandDecoder(s.model, c_cache, s.cache_kw, mask[rp_d]), last[rp_d],
                                        lengths[rp_d], rp, rs, uniforms, **kw)
            del c_cache
        toks_all.extend(toks)
        reason_all.extend(reason)
    return toks_all, reason_all


def _collect(s: _Sampler, idx: list[int], toks_all: list[list[int]], reason_all: list[str | None], cut: list[int],
             finished: dict, results: list, progress, own_bar: bool) -> None:
    """Turn the batch's rows into each prompt's ``n`` :class:`Generation` (each distinct
    sample decoded once, in ``finished``) in ``results``; one progress update per prompt."""
    for r, i in enumerate(idx):
        gens = []
        for j in range(r * s.n_rows, (r + 1) * s.n_rows):
            key = (tuple(toks_all[j]), reason_all[j])
            if key not in finished:
                finished[key] = _finish(s.tokenizer, toks_all[j], reason_all[j])
            gens.append(finished[key])
        if cut[i]:
            gens = [dataclasses.replace(g, truncated_tokens=cut[i]) for g in gens]
        results[i] = gens if s.n_rows == s.n else gens * s.n
        if progress is not None:
            progress.update(s.n if own_bar else 1)


def greedy_generations(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 16,
                       batch_size: int = 32, min_shared_prefix: int = MIN_SHARED_PREFIX,
                       progress=None, max_length: int | None = None, on_overflow: str = "error") -> list[Generation]:
    """Greedy (argmax) continuation of every prompt, stopped at a newline or EOS.
    ``progress`` (e.g. a tqdm bar) is updated once per prompt done; ``min_shared_prefix``,
    ``max_length`` and ``on_overflow`` as in :func:`sample_generations`."""
    outs = sample_generations(model, tokenizer, prompts, n=1, temperature=0.0, max_new_tokens=max_new_tokens,
                              batch_prompts=batch_size, min_shared_prefix=min_shared_prefix, progress=progress,
                              max_length=max_length, on_overflow=on_overflow)
    return [o[0] for o in outs]


# ---------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------

_PUNCT = string.punctuation + "\u2018\u2019\u201c\u201d"
_SPACES = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """Lowercase, strip whitespace and surrounding punctuation, collapse inner whitespace."""
    t = _SPACES.sub(" ", text.lower()).strip()
    return t.strip(_PUNCT + " ").strip()


def classify_generation(gen: Generation, item: ProbeItem) -> str:
    """One of :data:`CLASSES` for ``gen`` as an answer to ``item``.

    ``unterminated`` (no newline/EOS within the limit) is checked first; then ``task``
    (matches ``item.task_answer``), ``shortcut`` (matches ``item.shortcut_answer`` or any of
    ``item.metadata["shortcut_answers"]``), ``other_candidate`` (matches another candidate),
    else ``other``. Matching compares :func:`normalize_answer` forms.
    """
    if not gen.terminated:
        return "unterminated"
    text = normalize_answer(gen.text)
    if text == normalize_answer(item.task_answer):
        return "task"
    shortcuts = [item.shortcut_answer, *(item.metadata.get("shortcut_answers") or [])]
    if any(text == normalize_answer(s) for s in shortcuts):
        return "shortcut"
    if any(text == normalize_answer(c) for c in item.candidates[2:]):
        return "other_candidate"
    return "other"


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k / n``; ``(0.0, 1.0)`` when ``n == 0``."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# ---------------------------------------------------------------------------
# Sampled consistency tables
# ---------------------------------------------------------------------------

_GROUP_KEYS = ("checkpoint", "step", "tokens", "family", "variant")
_COUNT_COLS = tuple(f"n_{c}" for c in ("task", "shortcut", "other_candidate", "other", "unterminated"))


def _item_seed(seed: int, item: ProbeItem) -> int:
    return _derived_seed(seed, item.item_id, item.seed)


def persona_generation_table(model, tokenizer, items: Sequence[ProbeItem], *, n: int = 200,
                             temperature: float = 1.0, max_new_tokens: int = 16, seed: int = 0,
                             batch_prompts: int = 8, n_examples: int = 5, min_shared_prefix: int = MIN_SHARED_PREFIX,
                             progress=None, max_length: int | None = None, on_overflow: str = "error") -> pd.DataFrame:
    """Sample ``n`` generations per item and count their classes; one row per item.

    Columns: item_id, family, variant, seed (the item's evaluation seed), n_samples,
    n_task, n_shortcut, n_other_candidate, n_other, n_unterminated, task_rate,
    mean_new_tokens, top_texts / top_counts (the ``n_examples`` most frequent generated
    texts and their counts), truncated_tokens (prompt tokens cut to fit the context; see
    ``max_length`` / ``on_overflow`` in :func:`sample_generations`). An item's samples depend on (seed, item_id, item seed), not
    on the other items in the list. ``min_shared_prefix``: items whose prompts share a token
    prefix this long prefill it once (0 = off; see :func:`sample_generations`).
    """
    gens = sample_generations(model, tokenizer, [it.prompt for it in items], n=n, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed, batch_prompts=batch_prompts,
                              prompt_seeds=[_item_seed(seed, it) for it in items],
                              min_shared_prefix=min_shared_prefix, progress=progress, max_length=max_length,
                              on_overflow=on_overflow)
    rows = []
    for it, gs in zip(items, gens):
        counts = Counter(classify_generation(g, it) for g in gs)
        top = Counter(g.text for g in gs).most_common(n_examples)
        row = {"item_id": it.item_id, "family": it.family, "variant": it.variant, "seed": it.seed,
               "n_samples": len(gs)}
        for c in CLASSES:
            row[f"n_{c}"] = counts.get(c, 0)
        row["task_rate"] = row["n_task"] / len(gs)
        row["mean_new_tokens"] = sum(g.n_new_tokens for g in gs) / len(gs)
        row["top_texts"] = [t for t, _ in top]
        row["top_counts"] = [c for _, c in top]
        row["truncated_tokens"] = gs[0].truncated_tokens if gs else 0
        rows.append(row)
    cols = ["item_id", "family", "variant", "seed", "n_samples", *_COUNT_COLS, "task_rate", "mean_new_tokens",
            "top_texts", "top_counts", "truncated_tokens"]
    return pd.DataFrame(rows, columns=cols)


def _group_keys(df: pd.DataFrame, by: Iterable[str] | None) -> list[str]:
    keys = list(by) if by is not None else [k for k in _GROUP_KEYS if k in df.columns]
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise KeyError(f"grouping columns {missing} are not in the table")
    return keys


def summarize_generation(df: pd.DataFrame, *, by: Sequence[str] | None = None, level: float = 0.95) -> pd.DataFrame:
    """Pool a :func:`persona_generation_table` (optionally with checkpoint columns) per group.

    Groups by ``by`` or by whichever of checkpoint, step, tokens, family, variant are
    present. Columns: the keys, gen_items (items), gen_n (samples), gen_consistency
    (task rate over all samples), gen_ci_low / gen_ci_high (Wilson interval at ``level``),
    gen_shortcut_rate, gen_other_candidate_rate, gen_other_rate, gen_unterminated_rate,
    gen_item_consistency_mean (mean of per-item task rates).

    The Wilson interval treats the pooled samples as independent; samples of one item are
    correlated, so it understates between-item variation (gen_item_consistency_mean and
    the per-item table show it).
    """
    keys = _group_keys(df, by)
    out_cols = keys + ["gen_items", "gen_n", "gen_consistency", "gen_ci_low", "gen_ci_high", "gen_shortcut_rate",
                       "gen_other_candidate_rate", "gen_other_rate", "gen_unterminated_rate",
                       "gen_item_consistency_mean"]
    if df.empty:
        return pd.DataFrame(columns=out_cols)
    rows = []
    groups = df.groupby(keys, sort=True, dropna=False) if keys else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        n = int(g["n_samples"].sum())
        k = int(g["n_task"].sum())
        lo, hi = wilson_interval(k, n, level)
        rate = (lambda col: float(g[col].sum()) / n if n else math.nan)
        rows.append({
            **dict(zip(keys, key)),
            "gen_items": len(g),
            "gen_n": n,
            "gen_consistency": rate("n_task"),
            "gen_ci_low": lo,
            "gen_ci_high": hi,
            "gen_shortcut_rate": rate("n_shortcut"),
            "gen_other_candidate_rate": rate("n_other_candidate"),
            "gen_other_rate": rate("n_other"),
            "gen_unterminated_rate": rate("n_unterminated"),
            "gen_item_consistency_mean": float((g["n_task"] / g["n_samples"]).mean()),
        })
    return pd.DataFrame(rows, columns=out_cols)


# ---------------------------------------------------------------------------
# Greedy generative audit
# ---------------------------------------------------------------------------


def select_audit_items(items: Sequence[ProbeItem], n_per_family: int = 50, seed: int = 0, *,
                       eval_seed: int | None = None) -> list[ProbeItem]:
    """A deterministic sample of up to ``n_per_family`` items per family for the audit.

    Uses the items of evaluation seed ``eval_seed`` (default: the lowest evaluation seed
    present in each family, i.e. seed 0 with the default seeds), ranks them by a hash of
    (seed, item_id), and keeps the first ``n_per_family`` per family. The result does not
    depend on the order of ``items``; it is sorted by (family, item_id).
    """
    by_family: dict[str, list[ProbeItem]] = {}
    for it in items:
        by_family.setdefault(it.family, []).append(it)
    chosen: list[ProbeItem] = []
    for fam in sorted(by_family):
        its = by_family[fam]
        s = eval_seed if eval_seed is not None else min(it.seed for it in its)
        pool = {it.item_id: it for it in its if it.seed == s}  # one item per id
        ranked = sorted(pool, key=lambda iid: (_derived_seed("audit", seed, fam, iid), iid))
        chosen.extend(sorted((pool[iid] for iid in ranked[:n_per_family]), key=lambda it: it.item_id))
    return chosen


def generative_audit(model, tokenizer, items: Sequence[ProbeItem], *, max_new_tokens: int = 16,
                     batch_size: int = 32, min_shared_prefix: int = MIN_SHARED_PREFIX,
                     progress=None, max_length: int | None = None, on_overflow: str = "error") -> pd.DataFrame:
    """Greedy generation for each item, classified; one row per item.

    Columns: item_id, family, variant, seed, generated, class, terminated, n_new_tokens,
    truncated_tokens (prompt tokens cut from the left to fit the context with
    ``on_overflow="truncate"``; 0 otherwise). ``progress`` (e.g. a tqdm bar) is updated once
    per item done; ``min_shared_prefix``, ``max_length`` and ``on_overflow`` as in
    :func:`sample_generations`.
    """
    gens = greedy_generations(model, tokenizer, [it.prompt for it in items], max_new_tokens=max_new_tokens,
                              batch_size=batch_size, min_shared_prefix=min_shared_prefix, progress=progress,
                              max_length=max_length, on_overflow=on_overflow)
    rows = [
        {"item_id": it.item_id, "family": it.family, "variant": it.variant, "seed": it.seed,
         "generated": g.text, "class": classify_generation(g, it), "terminated": g.terminated,
         "n_new_tokens": g.n_new_tokens, "truncated_tokens": g.truncated_tokens}
        for it, g in zip(items, gens)
    ]
    return pd.DataFrame(rows, columns=["item_id", "family", "variant", "seed", "generated", "class", "terminated",
                                       "n_new_tokens", "truncated_tokens"])


def summarize_audit(audit_df: pd.DataFrame, scores_df: pd.DataFrame, *, by: Sequence[str] | None = None) -> pd.DataFrame:
    """Compare greedy generations with span-scoring correctness, per group.

    Joins ``audit_df`` (from :func:`generative_audit`) with the span-scoring rows of
    ``scores_df`` (columns item_id, seed, correct, candidate_correct; the join also uses
    checkpoint when both tables have it). If only ``scores_df`` has a checkpoint column it
    must hold a single checkpoint. Groups by ``by`` or by whichever of checkpoint, step,
    tokens, family are present.

    Columns: the keys; n; gen_<class>_rate for every class; n_correct and
    p_task_given_correct = P(gen == task | correct); n_candidate_correct and
    p_task_given_candidate_correct; agree_correct = P(correct == (gen == task));
    agree_candidate_correct = P(candidate_correct == (gen == task)). Conditional rates
    are NaN when their condition never holds.
    """
    on = ["item_id", "seed"]
    if "checkpoint" in audit_df.columns and "checkpoint" in scores_df.columns:
        on.append("checkpoint")
    elif "checkpoint" in scores_df.columns and scores_df["checkpoint"].nunique() > 1:
        raise ValueError("scores_df holds several checkpoints but audit_df has no checkpoint column; "
                         "filter scores_df to the audited checkpoint or add a checkpoint column to audit_df")
    need = ["correct", "candidate_correct"]
    missing = [c for c in on + need if c not in scores_df.columns]
    if missing:
        raise KeyError(f"scores_df lacks columns {missing}")
    extra = [c for c in ("checkpoint", "step", "tokens") if c in scores_df.columns and c not in on
             and c not in audit_df.columns]
    right = scores_df[on + need + extra]
    merged = audit_df.merge(right, on=on, how="inner", validate="one_to_one")
    keys = list(by) if by is not None else [k for k in ("checkpoint", "step", "tokens", "family") if k in merged.columns]
    missing = [k for k in keys if k not in merged.columns]
    if missing:
        raise KeyError(f"grouping columns {missing} are not in the joined table")
    out_cols = keys + ["n", *[f"gen_{c}_rate" for c in ("task", "shortcut", "other_candidate", "other", "unterminated")],
                       "n_correct", "p_task_given_correct", "n_candidate_correct", "p_task_given_candidate_correct",
                       "agree_correct", "agree_candidate_correct"]
    if merged.empty:
        return pd.DataFrame(columns=out_cols)
    rows = []
    groups = merged.groupby(keys, sort=True, dropna=False) if keys else [((), merged)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        gen_task = g["class"] == "task"
        correct = g["correct"].astype(bool)
        cand = g["candidate_correct"].astype(bool)
        row: dict[str, Any] = dict(zip(keys, key))
        row["n"] = len(g)
        for c in ("task", "shortcut", "other_candidate", "other", "unterminated"):
            row[f"gen_{c}_rate"] = float((g["class"] == c).mean())
        row["n_correct"] = int(correct.sum())
        row["p_task_given_correct"] = float(gen_task[correct].mean()) if correct.any() else math.nan
        row["n_candidate_correct"] = int(cand.sum())
        row["p_task_given_candidate_correct"] = float(gen_task[cand].mean()) if cand.any() else math.nan
        row["agree_correct"] = float((correct == gen_task).mean())
        row["agree_candidate_correct"] = float((cand == gen_task).mean())
        rows.append(row)
    return pd.DataFrame(rows, columns=out_cols)
