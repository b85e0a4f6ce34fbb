"""Summary tables computed from per-row scores."""

from __future__ import annotations

import numpy as np
import pandas as pd

GROUP = ["checkpoint", "step", "tokens", "family", "variant", "kind"]


def bootstrap_mean_ci(values: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampling values)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    means = values[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def _gdsuite_metrics(g: pd.DataFrame) -> dict:
    """GDsuite's per-task ``hard_accuracy`` (fraction of rows with correct_avg_prob >
    incorrect_avg_prob) and ``prob_margin`` (mean correct_avg_prob - incorrect_avg_prob),
    for rows that carry GDsuite's columns (GDsuite-format families); else nothing."""
    if "correct_avg_prob" not in g.columns or not g["correct_avg_prob"].notna().any():
        return {}
    c, i = g["correct_avg_prob"].astype(float), g["incorrect_avg_prob"].astype(float)
    return {"hard_accuracy": float((c > i).mean()), "prob_margin": float((c - i).mean())}


def summarize_scores(scores: pd.DataFrame, *, n_boot: int = 1000) -> pd.DataFrame:
    """Per checkpoint x family x variant summary of a ``scores`` table.

    Columns: ``mean_margin`` (nats, over items and seeds), ``seed_sd`` (standard deviation
    across evaluation seeds of the per-seed mean margin), ``ci_low``/``ci_high`` (95%
    bootstrap interval of the mean margin, resampling items; each item's margin is first
    averaged over seeds), ``mean_margin_per_token``, ``accuracy`` (fraction margin > 0),
    ``candidate_accuracy`` (fraction where the task answer beats every candidate),
    ``n_items`` and ``n_seeds``; for GDsuite-format families also ``hard_accuracy`` and
    ``prob_margin`` (GDsuite's metrics, from the mean per-token probabilities).
    """
    rows = []
    keys = [k for k in GROUP if k in scores.columns]
    for key, g in scores.groupby(keys, sort=False, dropna=False):
        per_seed = g.groupby("seed")["margin"].mean()
        per_item = g.groupby("item_id")["margin"].mean().to_numpy()
        lo, hi = bootstrap_mean_ci(per_item, n_boot=n_boot)
        rows.append(
            dict(
                zip(keys, key),
                mean_margin=float(g["margin"].mean()),
                seed_sd=float(per_seed.std(ddof=1)) if len(per_seed) > 1 else float("nan"),
                ci_low=lo,
                ci_high=hi,
                mean_margin_per_token=float(g["margin_per_token"].mean()),
                accuracy=float(g["correct"].mean()),
                candidate_accuracy=float(g["candidate_correct"].mean()),
                n_items=int(g["item_id"].nunique()),
                n_seeds=int(g["seed"].nunique()),
                **_gdsuite_metrics(g),
            )
        )
    out = pd.DataFrame(rows)
    if len(out):
        out = out.sort_values(["step", "checkpoint", "family", "variant"], kind="stable", na_position="first")
    return out.reset_index(drop=True)
