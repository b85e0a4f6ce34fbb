"""Which way is better: the one place that knows every metric's direction.

Every number probeselect compares across checkpoints or bases has a direction:

* **lower is better** (-1): bits per byte (``bits_per_byte``, ``*_bpb``), losses and
  negative log-likelihoods (``*loss*``, ``*nll*``, ``nats_per_token``, ``total_nats``),
  perplexity, and spreads used as proxies (``seed_sd``);
* **higher is better** (+1): margins (``mean_margin``, ``mean_margin_per_token``),
  accuracies (``accuracy``, ``candidate_accuracy``, ``task_accuracy``), log-probs
  (``task_logprob``), ``robust_recovery``, ``termination`` and generation consistency.

:func:`direction` returns +1 or -1 for a name; :func:`oriented` multiplies values by it,
so that after orientation **higher = better for every metric**. Correlations, heatmaps,
shortlist ranks and proxy validation all work on oriented values: a bits-per-byte track
that falls while a margin rises correlates at +1 (both improve), not -1.

A name is looked up exactly first (:data:`DIRECTIONS`), then by its parts (a ``loss``,
``nll``, ``bpb``, ``perplexity`` or ``bits_per_byte`` part makes it lower-is-better; a
``margin``, ``accuracy``, ``logprob``, ``recovery``, ``termination`` or ``consistency``
part higher-is-better). A name that matches neither raises :class:`ProbeselectError`:
guessing a direction silently would flip a correlation without a trace.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import ProbeselectError

__all__ = ["DIRECTIONS", "TRANSFER_METRIC_NAMES", "RENAMED_METRICS", "LABELS", "direction", "direction_word",
           "oriented", "is_rate", "ORIENTED_CAPTION"]

#: Known metrics: +1 = higher is better, -1 = lower is better.
DIRECTIONS: dict[str, int] = {
    # probe summaries (summary.csv)
    "mean_margin": +1,
    "mean_margin_per_token": +1,
    "accuracy": +1,
    "candidate_accuracy": +1,
    "gen_consistency": +1,
    "gen_item_consistency_mean": +1,
    "gen_shortcut_rate": -1,
    "gen_unterminated_rate": -1,
    "bits_per_byte": -1,
    "nats_per_token": -1,
    "seed_sd": -1,
    # transfer (transfer.csv); ``heldout_bpb`` is the pre-rename name of ``sft_heldout_bpb``
    "task_accuracy": +1,
    "task_shortcut_rate": -1,
    "task_shortcut_margin": +1,
    "task_logprob": +1,
    "robust_recovery": +1,
    "termination": +1,
    "heldout_loss": -1,
    "sft_heldout_bpb": -1,
    "heldout_bpb": -1,
}

#: The metrics :mod:`probeselect.transfer` produces, in table order.
TRANSFER_METRIC_NAMES = ("task_accuracy", "task_logprob", "robust_recovery", "termination", "heldout_loss",
                         "sft_heldout_bpb", "task_shortcut_rate", "task_shortcut_margin")

#: Transfer metrics whose run-level value is weighted (tokens or bytes), not an item mean.
WEIGHTED_METRICS = ("heldout_loss", "sft_heldout_bpb", "heldout_bpb")

#: Old metric names still read from earlier runs -> current name.
RENAMED_METRICS: dict[str, str] = {"heldout_bpb": "sft_heldout_bpb"}

#: Labels that say which held-out text a number is on (the SFT rows vs the pretraining text).
LABELS: dict[str, str] = {
    "sft_heldout_bpb": "SFT held-out bits per byte",
    "heldout_loss": "SFT held-out loss (nats per token)",
    "bits_per_byte": "pretraining held-out bits per byte",
    "heldout_nll/bpb": "pretraining held-out bits per byte",
}

_LOWER_PARTS = ("loss", "nll", "bpb", "perplexity", "ppl", "nats")
_HIGHER_PARTS = ("margin", "accuracy", "acc", "logprob", "recovery", "termination", "consistency")
#: Metrics that are fractions in [0, 1] (floor/ceiling checks apply to them).
_RATE_PARTS = ("accuracy", "recovery", "termination", "rate", "consistency")

#: Caption fragment for every oriented figure or table.
ORIENTED_CAPTION = "oriented: higher = better for every metric (bits per byte and losses are negated)"


def direction(name: str) -> int:
    """+1 when a higher value of metric ``name`` is better, -1 when lower is better.

    ``name`` may be a bare metric (``bits_per_byte``) or a track/proxy id whose metric
    follows the last ``:`` (``persona_qa/block:gen_consistency``). Raises
    :class:`ProbeselectError` for a name whose direction is unknown.
    """
    metric = str(name).rsplit(":", 1)[-1]
    if metric in DIRECTIONS:
        return DIRECTIONS[metric]
    if "bits_per_byte" in metric:
        return -1
    parts = [p for p in re.split(r"[^a-z0-9]+", metric.lower()) if p]
    lower = any(p in _LOWER_PARTS for p in parts)
    higher = any(p in _HIGHER_PARTS for p in parts)
    if lower != higher:
        return -1 if lower else +1
    raise ProbeselectError(f"metric {metric!r}: unknown direction (is higher or lower better?). Use a known metric "
                           f"({', '.join(sorted(DIRECTIONS))}) or state `direction: higher|lower` where the metric is "
                           "declared.")


def direction_word(name: str) -> str:
    """``"higher"`` or ``"lower"``: the better direction of ``name`` (see :func:`direction`)."""
    return "higher" if direction(name) > 0 else "lower"


def oriented(values: Any, name: str | None = None, *, sign: int | None = None) -> Any:
    """``values`` multiplied by the direction of ``name`` (or by ``sign``): higher = better.

    Works on scalars, numpy arrays and pandas objects (the type is kept).
    """
    s = sign if sign is not None else direction(name)  # type: ignore[arg-type]
    if s not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {s!r}")
    if isinstance(values, (list, tuple)):
        values = np.asarray(values, dtype=float)
    return values * s


def is_rate(name: str) -> bool:
    """True for metrics that are fractions in [0, 1] (accuracies, rates, recovery, termination)."""
    metric = str(name).rsplit(":", 1)[-1]
    parts = [p for p in re.split(r"[^a-z0-9]+", metric.lower()) if p]
    return any(p in _RATE_PARTS for p in parts)
