"""Run-correctness diagnostics: per-layer gradient norms, loss-spike detection and the
summary of a train log (pre-clip norm quantiles, clip fraction, nonfinite events, spikes).
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Any, Iterable, Sequence

import numpy as np
import torch

__all__ = ["layer_key", "grad_norms", "grad_norms_many", "UpdateNorms", "layer_grad_norms", "summarize_layer_norms", "SpikeDetector",
           "summarize_train_log"]

_LAYER = re.compile(r"(?:^|\.)(layers|h|blocks|layer)\.(\d+)\.")


def layer_key(name: str) -> str:
    """Group a parameter name by transformer block (``layers.3``) or by its top-level module."""
    m = _LAYER.search(name)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    parts = [p for p in name.split(".") if p not in ("base_model", "model", "module", "weight", "bias")]
    return parts[0] if parts else name


def grad_norms(named_params: Iterable[tuple[str, torch.Tensor]]) -> tuple[float, dict[str, float]]:
    """``(global L2 norm, {layer group: L2 norm})`` of the gradients (parameters without a
    gradient are skipped). Per-tensor norms come from one ``torch._foreach_norm`` (fp32) and
    both results reach the host in a single transfer."""
    keys: list[str] = []
    grads: list[torch.Tensor] = []
    for name, p in named_params:
        if p.grad is not None:
            keys.append(layer_key(name))
            grads.append(p.grad.detach())
    if not grads:
        return 0.0, {}
    groups = list(dict.fromkeys(keys))
    where = {k: i for i, k in enumerate(groups)}
    dev = grads[0].device
    if all(g.device == dev for g in grads):
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
    else:  # grads on several devices (model parallel): per tensor, then gathered
        norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float32).to(dev) for g in grads]
    sq = torch.stack(norms).square()
    idx = torch.tensor([where[k] for k in keys], device=dev)
    per_layer = torch.zeros(len(groups), device=dev, dtype=torch.float32).index_add_(0, idx, sq)
    vals = torch.cat([per_layer, sq.sum().reshape(1)]).sqrt().tolist()  # the one host sync
    return vals[-1], dict(zip(groups, vals[:-1]))


def grad_norms_many(runs: Sequence[Sequence[tuple[str, torch.Tensor]]]) -> list[tuple[float, dict[str, float]]]:
    """:func:`grad_norms` of several runs' parameters at once (batched seeds): one
    ``torch._foreach_norm`` over every run's gradients, one ``index_add_`` and a single host
    transfer for all runs. Each run's values equal :func:`grad_norms` of that run alone."""
    keys: list[list[str]] = []
    grads: list[torch.Tensor] = []
    for named in runs:
        ks = []
        for name, p in named:
            if p.grad is not None:
                ks.append(layer_key(name))
                grads.append(p.grad.detach())
        keys.append(ks)
    if not grads or len({g.device for g in grads}) > 1:
        return [grad_norms(named) for named in runs]
    dev = grads[0].device
    sq = torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)).square()
    groups: list[list[str]] = []  # per run: its layer groups, each one slot of per_layer
    idx: list[int] = []
    offset = 0
    for ks in keys:
        where = {k: offset + i for i, k in enumerate(dict.fromkeys(ks))}
        groups.append(list(where))
        idx += [where[k] for k in ks]
        offset += len(where)
    n_slots = offset
    per_layer = torch.zeros(n_slots, device=dev, dtype=torch.float32).index_add_(0, torch.tensor(idx, device=dev), sq)
    totals = [c.sum().reshape(1) for c in sq.split([len(ks) for ks in keys])]  # as grad_norms: sq.sum() per run
    vals = torch.cat([per_layer, *totals]).sqrt().tolist()  # the one host sync
    out, offset = [], 0
    for r, gs in enumerate(groups):
        out.append((vals[n_slots + r] if keys[r] else 0.0, {g: vals[offset + i] for i, g in enumerate(gs)}))
        offset += len(gs)
    return out


class UpdateNorms:
    """``‖Δθ‖`` of the actual update without a per-step clone: the parameters are copied into
    buffers allocated once (``torch._foreach_copy_``) before the step, and after it the buffers
    become ``before - after`` in place (``torch._foreach_sub_``; exactly ``-(after - before)``
    in IEEE arithmetic, so the norm equals the clone-and-subtract one bitwise)."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params = [p.detach() for p in params]
        self.buf = [torch.empty_like(p) for p in self.params]

    def before(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.buf, self.params)

    def after(self) -> torch.Tensor:
        """The update norm as a 0-d float32 tensor (no host sync)."""
        with torch.no_grad():
            torch._foreach_sub_(self.buf, self.params)
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(self.buf, 2.0, dtype=torch.float32)))


def layer_grad_norms(named_params: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """L2 norm of the gradient per layer group (parameters without a gradient are skipped)."""
    return grad_norms(named_params)[1]


def summarize_layer_norms(norms: dict[str, float]) -> dict[str, Any]:
    """``{min, median, max, argmax}`` over layer groups (the argmax names the layer)."""
    if not norms:
        return {"min": None, "median": None, "max": None, "argmax": None}
    vals = np.array(list(norms.values()))
    return {"min": float(vals.min()), "median": float(np.median(vals)), "max": float(vals.max()),
            "argmax": max(norms, key=norms.get)}


#: Consistency constant of the MAD for a normal distribution (MAD * 1.4826 estimates the sd).
_MAD_SD = 1.4826


def step_noise(losses: Sequence[float]) -> float | None:
    """Robust sd of one step's loss around the trend: ``1.4826 * MAD(successive differences) / sqrt(2)``.

    Differences of consecutive losses remove a slow trend (the falling SFT loss); each is the
    difference of two independent batch-noise draws, hence the ``sqrt(2)``. The MAD ignores the
    rare spike itself. None with fewer than 3 losses.
    """
    x = np.asarray([v for v in losses if math.isfinite(v)], dtype=float)
    if x.size < 3:
        return None
    d = np.diff(x)
    return float(_MAD_SD * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


class SpikeDetector:
    """Flag a loss that stands out from the run's own step-to-step noise.

    A step is a spike when its loss exceeds the rolling median of the previous ``window``
    finite losses by more than ``max(threshold, z * noise)``, where ``noise`` is the robust sd
    of the loss from batch to batch (:func:`step_noise` over the same window). The fixed
    ``threshold`` (nats) alone would flag ordinary noise whenever batches are small enough
    that their mean loss varies by more than it; ``z`` (default 6) makes the rule relative
    to each run's own noise, so a healthy run flags (almost) nothing and a jump of several
    noise widths is still caught. Nothing is flagged before ``min_history`` finite losses exist.
    ``last_margin`` holds the margin applied at the last step (None before ``min_history``).
    """

    def __init__(self, window: int = 201, threshold: float = 0.1, min_history: int = 10,
                 history: Sequence[float] = (), z: float = 6.0):
        self.window, self.threshold, self.min_history, self.z = window, threshold, min_history, z
        self.history: deque[float] = deque((x for x in history if math.isfinite(x)), maxlen=window)
        self.last_margin: float | None = None

    def update(self, loss: float) -> tuple[bool, float | None]:
        """Return ``(is_spike, rolling_median_before_this_step)``, then add ``loss`` to the history."""
        med, self.last_margin = None, None
        if len(self.history) >= self.min_history:
            med = float(np.median(self.history))
            noise = step_noise(self.history) or 0.0
            self.last_margin = max(self.threshold, self.z * noise)
        spike = med is not None and math.isfinite(loss) and loss > med + self.last_margin
        if math.isfinite(loss):
            self.history.append(loss)
        return spike, med


def summarize_train_log(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Summary of per-step rows: steps, supervised tokens, clip fraction, pre-clip norm
    p50/p90/max (over finite steps), nonfinite, skipped and spike counts."""
    norms = np.array([r["grad_norm_preclip"] for r in rows
                      if r.get("grad_norm_preclip") is not None and math.isfinite(r["grad_norm_preclip"])])
    stepped = [r for r in rows if not r.get("skipped")]
    return {
        "steps": len(rows),
        "optimizer_updates": len(stepped),
        "sup_tokens": int(sum(r["sup_tokens"] for r in rows)),
        "clip_fraction": float(np.mean([bool(r["clipped"]) for r in stepped])) if stepped else 0.0,
        "grad_norm_p50": float(np.quantile(norms, 0.5)) if norms.size else None,
        "grad_norm_p90": float(np.quantile(norms, 0.9)) if norms.size else None,
        "grad_norm_max": float(norms.max()) if norms.size else None,
        "nonfinite": int(sum(bool(r["nonfinite"]) for r in rows)),
        "skipped": int(sum(bool(r.get("skipped")) for r in rows)),
        "spikes": int(sum(bool(r["spike"]) for r in rows)),
        "scaler_retries": int(sum(int(r.get("scaler_retries") or 0) for r in rows)),
        "final_loss": rows[-1]["loss"] if rows else None,
    }
