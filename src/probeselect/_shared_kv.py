"""Decoding many sampled rows against one shared copy of each prompt's KV cache.

:func:`probeselect.generation.sample_generations` draws ``n`` samples of each prompt. The
classic way (HF ``generate(num_return_sequences=n)``, and probeselect's ``engine="expand"``)
copies every prompt's keys/values into each of its ``n`` sample rows and concatenates the
cache at every step, so a decode step moves ``rows x (prompt + generated)`` keys/values
through memory. Here the prefill keys/values stay ONE copy per prompt
(``[n_prompts, kv_heads, prompt_width, head_dim]`` per layer) and only the generated tokens
get per-row storage, in a buffer preallocated for ``max_new`` tokens. A row's attention is
computed in two parts, against its prompt's prefix (all rows of a prompt in one matrix
product) and against its own generated keys/values, and the two softmax parts are merged
exactly with their log-sum-exp statistics.

The attention function is registered with ``transformers.AttentionInterface`` under
:data:`ATTN_NAME` and reaches the cache through the ``shared_kv`` keyword argument, which
the supported model classes (llama, mistral, qwen2, qwen3) pass from ``forward(**kwargs)``
down to their attention interface. Use :func:`shared_kv_attention_enabled` around the decode
forwards; the prefill runs with the model's own attention implementation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["ATTN_NAME", "SUPPORTED_MODEL_TYPES", "SharedKVCache", "shared_kv_attention_enabled",
           "unsupported_reason"]

#: Name of the attention implementation registered with ``transformers.AttentionInterface``.
ATTN_NAME = "probeselect_shared_kv"

#: Architectures whose attention modules call the attention interface with (q, k, v) after RoPE,
#: and pass forward kwargs through to it.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2")


def unsupported_reason(model, total_length: int) -> str | None:
    """Why the shared-KV engine cannot decode ``model`` (None when it can).

    ``total_length``: the longest prompt plus the new tokens (a sliding attention window
    shorter than that would need the window rule, which this engine does not implement).
    """
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    from .spans import attention_window

    window = attention_window(cfg)
    if window is not None and window < total_length:
        return f"its sliding attention window ({window}) is shorter than prompt + new tokens ({total_length})"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(getattr(l, "self_attn", None), "layer_idx") for l in layers):
        return "its decoder layers do not have the expected self_attn modules"
    return None


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a prefill ``DynamicCache`` (transformers 5.x or 4.x)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(l.keys, l.values) for l in layers]
    return list(zip(cache.key_cache, cache.value_cache))


class SharedKVCache:
    """One copy of the prompts' prefill K/V plus a preallocated per-row generated K/V buffer.

    ``prefix_keys`` / ``prefix_values``: per layer, ``[n_prompts, kv_heads, width, head_dim]``
    (a left-padded prefill); ``prefix_valid``: ``[n_prompts, width]`` bool, False at padding;
    ``row_prompt``: ``[rows]`` prompt index of every decode row, non-decreasing (rows of a
    prompt are adjacent); ``max_new``: generated tokens each row can store.
    """

    def __init__(self, prefix_keys: list[torch.Tensor], prefix_values: list[torch.Tensor],
                 prefix_valid: torch.Tensor, row_prompt: torch.Tensor, max_new: int):
        if len(prefix_keys) != len(prefix_values) or not prefix_keys:
            raise ValueError("need the same positive number of key and value layers")
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        device = prefix_keys[0].device
        valid = prefix_valid.to(device=device, dtype=torch.bool)
        if not bool(valid.any(-1).all()):
            raise ValueError("every prompt needs at least one unpadded position")
        # additive bias over the prefix keys: 0 where valid, -inf at padding
        self.prefix_bias = torch.zeros(valid.shape, dtype=torch.float32, device=device).masked_fill_(
            ~valid, float("-inf"))[:, None, None, :]
        self._padded = (~valid).any(-1).cpu()  # per prompt: has left padding
        self.max_new = int(max_new)
        rows = len(row_prompt)
        self.gen_keys = [k.new_empty((rows, k.shape[1], self.max_new, k.shape[3])) for k in prefix_keys]
        self.gen_values = [v.new_empty((rows, v.shape[1], self.max_new, v.shape[3])) for v in prefix_values]
        self.lengths = [0] * len(prefix_keys)  # generated tokens stored, per layer
        self._set_rows(row_prompt.to(device=device, dtype=torch.long))

    @classmethod
    def from_prefill(cls, cache, prefix_valid: torch.Tensor, row_prompt: torch.Tensor, max_new: int) -> "SharedKVCache":
        """Wrap the K/V of a left-padded prefill ``DynamicCache`` (no copy of the prefix)."""
        layers = _cache_layers(cache)
        return cls([k for k, _ in layers], [v for _, v in layers], prefix_valid, row_prompt, max_new)

    @property
    def n_rows(self) -> int:
        return len(self.row_prompt)

    def _set_rows(self, row_prompt: torch.Tensor) -> None:
        """Index the rows' prompts: the padded [prompt, rank-within-prompt] slot of every row."""
        if len(row_prompt) and bool((row_prompt[1:] < row_prompt[:-1]).any()):
            raise ValueError("row_prompt must be non-decreasing (the rows of a prompt adjacent)")
        self.row_prompt = row_prompt
        if not len(row_prompt):
            return
        lo, hi = int(row_prompt[0]), int(row_prompt[-1]) + 1
        local = row_prompt - lo
        counts = torch.bincount(local, minlength=hi - lo)
        self._lo, self._hi, self._max_rows = lo, hi, int(counts.max())
        starts = counts.cumsum(0) - counts
        rank = torch.arange(len(row_prompt), device=row_prompt.device) - starts[local]
        self._slot = local * self._max_rows + rank
        # every prompt of the range has the same number of rows: the slots are 0..rows-1
        self._dense = bool((counts == self._max_rows).all())

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (increasing row indices); e.g. drop finished samples."""
        keep = keep.to(self.row_prompt.device)
        self.gen_keys = [k.index_select(0, keep) for k in self.gen_keys]
        self.gen_values = [v.index_select(0, keep) for v in self.gen_values]
        self._set_rows(self.row_prompt.index_select(0, keep))

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float) -> torch.Tensor:
        """Store this step's ``key``/``value`` and attend ``query`` to prefix + generated tokens.

        ``query``: ``[rows, heads, q_len, head_dim]``; ``key``/``value``: ``[rows, kv_heads,
        q_len, head_dim]`` (after RoPE). Query ``i`` sees its prompt's unpadded prefix and the
        row's generated tokens up to and including its own position (causal). Returns
        ``[rows, q_len, heads, head_dim]``, the layout the HF attention modules expect.
        """
        R, H, Q, D = query.shape
        KV = key.shape[1]
        G = H // KV
        if R != self.n_rows:
            raise RuntimeError(f"decode batch has {R} rows, the shared KV cache {self.n_rows}")
        start = self.lengths[layer]
        end = start + Q
        if end > self.max_new:
            raise RuntimeError(f"more than max_new={self.max_new} generated tokens")
        self.gen_keys[layer][:, :, start:end] = key
        self.gen_values[layer][:, :, start:end] = value
        self.lengths[layer] = end
        f32 = torch.float32
        # heads h = kv_head * G + g (repeat_kv's order); one kv head serves G * Q query rows.
        # The scale goes on the (small) queries rather than on the scores.
        q = (query * scaling).reshape(R, KV, G * Q, D)

        # the row's own generated tokens
        gk, gv = self.gen_keys[layer][:, :, :end], self.gen_values[layer][:, :, :end]
        s_gen = torch.matmul(q, gk.transpose(-1, -2)).to(f32)  # [R, KV, G*Q, end]
        if Q > 1:
            q_pos = start + torch.arange(Q, device=q.device).repeat(G)  # index g * Q + i
            future = torch.arange(end, device=q.device)[None, :] > q_pos[:, None]
            s_gen = s_gen.masked_fill(future, float("-inf"))
        m_gen = s_gen.amax(-1, keepdim=True)
        e_gen = torch.exp(s_gen - m_gen)
        l_gen = e_gen.sum(-1, keepdim=True)
        if G * Q == 1:  # one query per kv head: a broadcast product beats many 1-row matmuls
            o_gen = (e_gen.transpose(-1, -2).to(gv.dtype) * gv).sum(-2, keepdim=True).to(f32)
        else:
            o_gen = torch.matmul(e_gen.to(gv.dtype), gv).to(f32)

        # the prompt prefix: the rows of each prompt form one query block against its one K/V copy
        lo, hi, M = self._lo, self._hi, self._max_rows
        P = hi - lo
        pk, pv = self.prefix_keys[layer][lo:hi], self.prefix_values[layer][lo:hi]
        if self._dense:
            qp = q.reshape(P, M, KV, G * Q, D)
        else:
            qp = q.new_zeros((P * M, KV, G * Q, D))
            qp[self._slot] = q
            qp = qp.reshape(P, M, KV, G * Q, D)
        qp = qp.transpose(1, 2).reshape(P, KV, M * G * Q, D)
        s_pre = torch.matmul(qp, pk.transpose(-1, -2)).to(f32)
        if self._padded[lo:hi].any():
            s_pre = s_pre + self.prefix_bias[lo:hi]
        m_pre = s_pre.amax(-1, keepdim=True)
        e_pre = s_pre.sub_(m_pre).exp_()
        l_pre = e_pre.sum(-1, keepdim=True)
        o_pre = torch.matmul(e_pre.to(pv.dtype), pv).to(f32)  # [P, KV, M*G*Q, D]
        # back to rows: [P, KV, M*G*Q, D+2] -> [R, KV, G*Q, D+2], one copy for all three
        stats = torch.cat([o_pre, m_pre, l_pre], dim=-1)
        stats = stats.reshape(P, KV, M, G * Q, D + 2).transpose(1, 2).reshape(P * M, KV, G * Q, D + 2)
        if not self._dense:
            stats = stats[self._slot]
        o_pre, m_pre, l_pre = stats[..., :D], stats[..., D:D + 1], stats[..., D + 1:]
        # log-sum-exp merge of the two softmax parts
        m = torch.maximum(m_pre, m_gen)
        a_pre, a_gen = torch.exp(m_pre - m), torch.exp(m_gen - m)
        out = (o_pre * a_pre + o_gen * a_gen) / (l_pre * a_pre + l_gen * a_gen)
        out = out.to(query.dtype).reshape(R, KV, G, Q, D).reshape(R, H, Q, D)
        return out.transpose(1, 2)


def shared_kv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        shared_kv: SharedKVCache | None = None, **kwargs):
    """``transformers.AttentionInterface`` function: attention through a :class:`SharedKVCache`.

    ``attention_mask`` is ignored (the cache knows each prompt's padding and the causal rule).
    """
    if shared_kv is None:
        raise RuntimeError(f"attention implementation {ATTN_NAME!r} needs a shared_kv=SharedKVCache forward argument")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return shared_kv.attend(module.layer_idx, query, key, value, scaling), None


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_NAME, shared_kv_attention)
        _registered = True


@contextlib.contextmanager
def shared_kv_attention_enabled(model) -> Iterator[None]:
    """Within the block, ``model``'s attention layers use :func:`shared_kv_attention`
    (call the model with ``shared_kv=cache``, no attention mask, no HF cache); the previous
    implementation is restored on exit."""
    _register()
    old = model.config._attn_implementation
    model.config._attn_implementation = ATTN_NAME
    try:
        yield
    finally:
        model.config._attn_implementation = old
