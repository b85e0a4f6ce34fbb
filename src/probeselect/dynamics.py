"""Mode-hopping dynamics: how probe scores move from one saved checkpoint to the next.

``compute_dynamics(run_dir)`` reads a scored run folder (``summary.csv``, and when present
``scores.parquet`` and ``manifest.json``) and writes ``run_dir/dynamics/``:

* ``dynamics.csv`` - one row per *track* (statistics below);
* ``trajectories.csv`` - one row per track x checkpoint (the values that are plotted, and
  ``oriented_value`` = value x direction, higher = better);
* ``pairs.csv`` - one row per margin track x consecutive checkpoint pair: hard accuracy
  next to the continuous margin, with flags;
* ``correlation.csv`` - Spearman correlation of every pair of tracks across checkpoints,
  long form (``track_a, track_b, spearman_rho, n_checkpoints``), computed on **oriented**
  values (:func:`probeselect.metrics.oriented`: higher = better for every track, so bits
  per byte is negated and +1 means the two tracks agree on which checkpoints are better);
* ``margin_trajectories.png``, ``accuracy_vs_margin.png``, ``correlation.png``;
* ``manifest.json`` - parameters, input hashes, versions.

A **track** is one metric of one family x prompt variant followed across checkpoints:

* conflict and capability rows: ``mean_margin`` (nats; track name ``family/variant``);
* held-out NLL rows (``kind == "nll"`` or family ``heldout_nll``): ``bits_per_byte``
  (lower is better; track name ``heldout_nll/bpb``);
* sampled-generation columns (:data:`EXTRA_TRACK_METRICS`, e.g. ``gen_consistency``) when
  present: track name ``family/variant:metric``.

Checkpoints are taken in step order. With ``m_1..m_n`` the track's checkpoint values and
``d_i = m_{i+1} - m_i``:

* **hops** - a hop is a move of the track that is later undone: a rise then a fall, or a
  fall then a rise, whose *both* legs exceed the noise threshold ``h``. The threshold comes
  from the evaluation-seed spread: with ``s`` the pooled seed sd of the track (root mean
  square over checkpoints of ``seed_sd``, the sd across evaluation seeds of the per-seed
  mean margin, in nats) and ``n`` its number of evaluation seeds (the smallest over
  checkpoints), a checkpoint value has standard error ``s / sqrt(n)`` and the difference of
  two checkpoint values ``sqrt(2) * s / sqrt(n)``; ``h = max(k * sqrt(2 / n) * s, f)``
  with ``k = HOP_K = 3`` and, for margin tracks, the floor ``f = MIN_HOP_NATS = 0.1`` nats
  (evaluation seeds can agree to 0.001 nats; a smaller move is not a change of behaviour)
  (``hop_threshold`` in ``dynamics.csv``). The legs are found by a
  zig-zag (hysteresis) filter (:func:`zigzag_legs`): from the start, follow the running
  extreme; a turning point is confirmed when the track moves back from the extreme by
  more than ``h``, and the next leg starts there. Consecutive legs alternate in direction
  and each changes the value by more than ``h``; ``hop_legs`` counts them and ``hops`` =
  ``floor(hop_legs / 2)``: each completed up-then-down or down-then-up excursion counts
  once, without overlap. Monotone learning, however steep, is one leg (0 hops); a dip that
  recovers is two legs after any rise (1 hop); two dips are 2 hops; wiggles within ``h``
  are no leg at all. ``hop_turning_steps`` lists the steps of the confirmed turning points.
  ``hops`` is NaN (n/a) with fewer than 3 checkpoints, or when ``h`` is unknown (no seed sd:
  a single evaluation seed, held-out bits per byte, generation columns). On tracks of pure
  evaluation noise (10 checkpoints) the rule calls a hop on about 3% of tracks with 3 or 5
  seeds and about 7% with 2 (one degree of freedom per seed sd makes ``h`` itself noisy;
  ``tests/test_dynamics.py`` pins <= 5% for 3 seeds);
* ``learning_crossings`` - 1 when the first and last nonzero values lie on opposite sides
  of zero (the track crossed zero and stayed: learning, not a hop), else 0 (margin tracks
  only); ``undone_crossings`` = ``sign_changes - learning_crossings`` (crossings later
  reversed);
* ``sign_changes`` - number of i with ``m_i * m_{i+1} < 0`` (margin tracks only; a
  checkpoint whose mean margin is exactly 0 starts no change). A track that learns crosses
  zero once: a sign change is not a hop;
* ``total_variation`` - ``sum |d_i|``; ``mean_abs_change`` = total_variation / (n - 1);
  ``excess_variation`` = total_variation - ``|m_n - m_1|``, the movement that was later
  undone (in the metric's units: nats for margins; 0 for a monotone trajectory, so a
  steady trend does not count as fluctuation);
* ``largest_drop`` - the largest single worsening, ``max(0, max_i -d_i)`` for
  higher-is-better metrics (``max(0, max_i d_i)`` for bits per byte), at
  ``largest_drop_step`` (the later checkpoint of the pair);
* ``flip_rate`` - for each consecutive pair, the fraction of (item, seed) units whose
  ``correct`` (margin > 0) differs between the two checkpoints; averaged over pairs
  (``flip_rate_max`` is the largest pair). Needs ``scores.parquet``;
* ``acc_total_variation`` - ``sum |accuracy_{i+1} - accuracy_i|``;
* signal and noise, after Heineman et al. (2025), "Signal and Noise", whose
  ``snr = (max_{j,k}|m_j - m_k| / mean) / (sd(final checkpoints) / mean)``. Margins can be
  negative or near zero, so the division by the mean is dropped (signal and noise are in
  the metric's own units, and the two means would nearly cancel anyway):

  - ``signal_range`` = ``max_j m_j - min_j m_j`` (= the largest pairwise difference);
  - ``signal_sd`` = sample sd (ddof=1) of the checkpoint values;
  - ``noise_seed_sd`` = mean over checkpoints of ``seed_sd`` (sd across evaluation seeds
    of the per-seed mean, from ``summary.csv``);
  - ``noise_last_sd`` = population sd (ddof=0) of the last ``noise_window`` checkpoint
    values (Heineman's noise: checkpoint-to-checkpoint variation late in training);
  - ``noise_last_diff_sd`` = sample sd (ddof=1) of the first differences among those last
    ``noise_window`` values, divided by sqrt(2) (a trend-free estimate of the per-checkpoint
    jitter: a steady trend adds a constant to every difference and cancels);
  - ``snr_last`` = signal_range / noise_last_sd, ``snr_last_diff`` = signal_range /
    noise_last_diff_sd, ``snr_seed`` = signal_range / noise_seed_sd (inf when the noise is
    exactly 0 and the signal is not; NaN when undefined).

In ``pairs.csv`` ``flag_acc_moves_margin_still`` marks pairs where
``|d accuracy| >= acc_jump`` while ``|d mean_margin| <= small_margin_nats`` (margins
crossing zero without moving much: a threshold artefact), and
``flag_margin_moves_acc_still`` marks ``|d mean_margin| >= large_margin_nats`` with
``|d accuracy| < acc_jump`` (the continuous margin fluctuates where accuracy hides it).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ._io import atomic_write_csv, atomic_write_json, reading, replace_dir, sha256_file
from .errors import ProbeselectError
from .manifest import base_manifest, checkpoint_steps
from .metrics import direction

__all__ = [
    "DynamicsResult",
    "RunTables",
    "compute_dynamics",
    "load_run",
    "track_table",
    "heldout_bpb",
    "lowest_heldout_bpb",
    "LowestBpb",
    "trajectory_stats",
    "flip_rates",
    "spearman_matrix",
    "EXTRA_TRACK_METRICS",
    "HOP_K",
    "MIN_HOP_NATS",
    "Leg",
    "HopStats",
    "hop_threshold",
    "zigzag_legs",
    "hop_stats",
]

#: Sampled-generation summary columns that become their own tracks when present.
EXTRA_TRACK_METRICS = ("gen_consistency",)
#: Hop threshold multiplier: a leg counts when it moves by more than HOP_K standard errors of
#: a difference of two checkpoint values (see the module docstring and :func:`hop_threshold`).
HOP_K = 3.0
#: Smallest leg (nats) that counts for a margin track, whatever the seed noise: evaluation
#: seeds can agree to 0.001 nats, and a 0.005-nat wiggle is real but not a change of behaviour.
MIN_HOP_NATS = 0.10
#: Order of kinds in tables and plots.
KIND_ORDER = {"conflict": 0, "capability": 1, "nll": 2, "generation": 3, "calibration": 4}
_SCORE_COLUMNS = ["checkpoint", "step", "family", "variant", "seed", "item_id", "margin", "correct"]


@dataclass
class RunTables:
    """A scored run folder, read: ``summary`` always; ``scores``/``manifest`` when present."""

    run_dir: Path
    summary: pd.DataFrame
    scores: pd.DataFrame | None
    manifest: dict[str, Any] | None


@dataclass
class DynamicsResult:
    """What :func:`compute_dynamics` returns (every table is also written as a file)."""

    run_dir: Path
    out_dir: Path
    stats: pd.DataFrame  # dynamics.csv
    trajectories: pd.DataFrame  # trajectories.csv
    pairs: pd.DataFrame  # pairs.csv
    correlation: pd.DataFrame  # wide Spearman matrix (track x track)
    correlation_n: pd.DataFrame  # wide matrix of checkpoints each correlation rests on
    plots: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Reading a run
# ---------------------------------------------------------------------------


def load_run(run_dir: str | Path, *, need_scores: bool = True) -> RunTables:
    """Read a run folder written by ``probeselect score``.

    Raises :class:`ProbeselectError` when the folder or ``summary.csv`` is missing or the
    manifest says the run did not finish. ``scores.parquet`` is read column-wise (only the
    columns dynamics needs) and may be absent.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ProbeselectError(f"{run}: run folder does not exist. Score checkpoints first: "
                               f"`probeselect score CKPT_DIR --probes SPEC --out {run}`.")
    manifest = None
    mpath = run / "manifest.json"
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise ProbeselectError(f"{mpath}: corrupt manifest (not JSON). Re-run `probeselect score`.") from None
        status = manifest.get("status")
        if status is not None and status != "complete":
            raise ProbeselectError(f"{mpath}: run status is {status!r}, not 'complete'. "
                                   "Re-run the same `probeselect score` command to finish it.")
    spath = run / "summary.csv"
    if not spath.is_file():
        raise ProbeselectError(f"{run}: no summary.csv. Score the checkpoints first: "
                               f"`probeselect score CKPT_DIR --probes SPEC --out {run}`.")
    with reading(spath, ProbeselectError, also=(ValueError,)):  # pandas' ParserError is a ValueError
        summary = pd.read_csv(spath)
    missing = [c for c in ("checkpoint", "step", "family", "variant") if c not in summary.columns]
    if missing:
        raise ProbeselectError(f"{spath}: missing columns {missing}. Re-create it with `probeselect score`.")
    summary["variant"] = summary["variant"].astype(str)
    scores = None
    ppath = run / "scores.parquet"
    if need_scores and ppath.is_file():
        import pyarrow.parquet as pq

        have = set(pq.read_schema(ppath).names)
        cols = [c for c in _SCORE_COLUMNS if c in have]
        if {"checkpoint", "family", "variant", "item_id", "correct"} <= set(cols):
            scores = pd.read_parquet(ppath, columns=cols)
            scores["variant"] = scores["variant"].astype(str)
    return RunTables(run_dir=run, summary=summary, scores=scores, manifest=manifest)


def checkpoint_order(df: pd.DataFrame) -> list[str]:
    """Checkpoint names in step order (unknown steps first, then by name)."""
    ck = df[["checkpoint", "step"]].drop_duplicates("checkpoint")
    ck = ck.assign(_s=pd.to_numeric(ck["step"], errors="coerce"))
    ck = ck.sort_values(["_s", "checkpoint"], na_position="first", kind="stable")
    return ck["checkpoint"].astype(str).tolist()


def _kind_column(summary: pd.DataFrame) -> pd.Series:
    inferred = pd.Series("conflict", index=summary.index, dtype=object)
    is_nll = summary["family"].astype(str).eq("heldout_nll")
    if "bits_per_byte" in summary.columns and "mean_margin" in summary.columns:
        is_nll |= summary["bits_per_byte"].notna() & summary["mean_margin"].isna()
    inferred[is_nll] = "nll"
    if "kind" in summary.columns:
        given = summary["kind"]
        return given.where(given.notna() & given.astype(str).ne(""), inferred).astype(str)
    return inferred


class LowestBpb(NamedTuple):
    checkpoint: str
    bpb: float


def heldout_bpb(summary: pd.DataFrame | None) -> pd.Series:
    """Pretraining held-out bits per byte per checkpoint: the mean ``bits_per_byte`` of the
    checkpoint's held-out NLL rows (``kind == "nll"`` as :func:`_kind_column` reads it; rows
    without a value skipped), indexed by checkpoint in the order the checkpoints first appear
    in ``summary``; empty when there is no such row. The one definition behind the shortlist's
    ``heldout_bpb_within`` and ``lowest_bpb`` reference and the report's lowest-bpb mark."""
    if summary is None or "bits_per_byte" not in summary.columns:
        return pd.Series(dtype=float)
    bpb = pd.to_numeric(summary["bits_per_byte"], errors="coerce")
    rows = summary.assign(_bpb=bpb)[_kind_column(summary).eq("nll") & bpb.notna()]
    return rows.groupby("checkpoint", sort=False)["_bpb"].mean()


def lowest_heldout_bpb(summary: pd.DataFrame | None, among: list[str] | None = None) -> LowestBpb | None:
    """The checkpoint of lowest :func:`heldout_bpb` and its value, or None when none has one.

    ``among``: only these checkpoints (the shortlist's candidates), an exact tie going to the
    first of them in this order; default every checkpoint of ``summary``, a tie going to the
    one listed first there (``summary.csv`` lists the checkpoints in step order).
    """
    per = heldout_bpb(summary)
    if among is not None:
        per = per.reindex(among)
    per = per.dropna()
    if per.empty:
        return None
    return LowestBpb(str(per.idxmin()), float(per.min()))


def naive_choices(run_dir: Path) -> dict[str, list[str]]:
    """The naive choices of a scored run, checkpoint -> the rules it stands for (in
    :data:`probeselect.plan.REFERENCES` order): ``latest``, the checkpoint of the highest step in
    ``manifest.json``; ``lowest_bpb``, the checkpoint of lowest pretraining held-out bits per byte in
    ``summary.csv`` (:func:`probeselect.dynamics.lowest_heldout_bpb`). A rule without the value it needs
    (no steps, no held-out loss) is absent."""
    run_dir = Path(run_dir)
    out: dict[str, list[str]] = {}
    man = run_dir / "manifest.json"
    steps = checkpoint_steps(json.loads(man.read_text(encoding="utf-8"))) if man.is_file() else {}
    if steps:
        out.setdefault(max(steps, key=lambda n: steps[n]), []).append("latest")
    summ = run_dir / "summary.csv"
    lowest = lowest_heldout_bpb(pd.read_csv(summ)) if summ.is_file() else None
    if lowest is not None:
        out.setdefault(lowest.checkpoint, []).append("lowest_bpb")
    return out


def track_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Long table of every track x checkpoint (see the module docstring for tracks).

    Columns: ``track, family, variant, kind, metric, higher_is_better, checkpoint, step,
    tokens, value, seed_sd, ci_low, ci_high, accuracy, candidate_accuracy, n_items, n_seeds``.
    """
    s = summary.copy()
    s["kind"] = _kind_column(s)
    s["variant"] = s["variant"].astype(str)
    extra = ["seed_sd", "ci_low", "ci_high", "accuracy", "candidate_accuracy", "n_items", "n_seeds", "tokens"]
    for c in extra:
        if c not in s.columns:
            s[c] = np.nan
    base = ["family", "variant", "kind", "checkpoint", "step", "tokens"]
    parts = []
    if "mean_margin" in s.columns:
        m = s[s["kind"].ne("nll") & s["mean_margin"].notna()]
        parts.append(m[base + extra[:-1]].assign(
            metric="mean_margin", higher_is_better=direction("mean_margin") > 0, value=m["mean_margin"],
            track=m["family"].astype(str) + "/" + m["variant"]))
    if "bits_per_byte" in s.columns:
        m = s[s["kind"].eq("nll") & s["bits_per_byte"].notna()]
        parts.append(m[base].assign(
            metric="bits_per_byte", higher_is_better=direction("bits_per_byte") > 0, value=m["bits_per_byte"],
            track=m["family"].astype(str) + "/" + m["variant"]))
    for col in EXTRA_TRACK_METRICS:
        if col in s.columns:
            m = s[s[col].notna()]
            parts.append(m[base].assign(
                kind="generation", metric=col, higher_is_better=direction(col) > 0, value=m[col],
                track=m["family"].astype(str) + "/" + m["variant"] + ":" + col))
    cols = ["track", "family", "variant", "kind", "metric", "higher_is_better", "checkpoint", "step", "tokens",
            "value", "seed_sd", "ci_low", "ci_high", "accuracy", "candidate_accuracy", "n_items", "n_seeds"]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True).reindex(columns=cols)
    order = {c: i for i, c in enumerate(checkpoint_order(summary))}
    out = out.assign(_k=out["kind"].map(KIND_ORDER).fillna(9), _c=out["checkpoint"].map(order))
    out = out.sort_values(["_k", "family", "variant", "metric", "_c"], kind="stable").drop(columns=["_k", "_c"])
    return out.reset_index(drop=True)


def track_names(tracks: pd.DataFrame) -> list[str]:
    """Track names in display order (kind, family, variant, metric)."""
    return list(dict.fromkeys(tracks["track"]))


# ---------------------------------------------------------------------------
# Statistics (pure functions; see the module docstring for the definitions)
# ---------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    if a is None or b is None or not np.isfinite(a) or np.isnan(b):
        return float("nan")
    if b == 0:
        return float("inf") if a > 0 else float("nan")
    return float(a / b)


class Leg(NamedTuple):
    """One confirmed leg of a zig-zag: from index ``start`` to ``end``, ``change`` = m[end] - m[start]."""

    start: int
    end: int
    change: float


class HopStats(NamedTuple):
    """What :func:`hop_stats` returns (definitions: module docstring)."""

    hops: float  # NaN when undefined (< 3 values or unknown threshold)
    legs: list[Leg]
    threshold: float
    learning_crossings: float  # NaN for unsigned tracks
    sign_changes: float


def hop_threshold(seed_sd, n_seeds, *, k: float = HOP_K, floor: float = 0.0) -> float:
    """The hop noise threshold ``h = max(k * sqrt(2 / n) * s, floor)`` (in the track's units).

    ``s`` = root mean square of the finite ``seed_sd`` values (pooled evaluation-seed sd of
    the per-seed mean), ``n`` = the smallest finite ``n_seeds`` (>= 2). ``s / sqrt(n)`` is
    the standard error of one checkpoint value, ``sqrt(2)`` times it that of a difference
    of two. ``floor`` is the smallest move that matters (:data:`MIN_HOP_NATS` for margins in
    :func:`compute_dynamics`). NaN when there is no finite seed sd or fewer than 2 seeds (a
    single evaluation seed gives no noise estimate; the floor alone does not make one).
    """
    sd = np.asarray(seed_sd if seed_sd is not None else [], dtype=float).ravel()
    sd = sd[np.isfinite(sd)]
    n = np.asarray(n_seeds if n_seeds is not None else [], dtype=float).ravel()
    n = n[np.isfinite(n)]
    if not sd.size or not n.size or n.min() < 2:
        return float("nan")
    pooled = float(np.sqrt(np.mean(sd ** 2)))
    return float(max(k * math.sqrt(2.0 / n.min()) * pooled, floor))


def zigzag_legs(values, threshold: float) -> list[Leg]:
    """The legs of ``values`` that move by more than ``threshold`` (hysteresis filter).

    Starting from the first value, follow the running maximum and minimum; the first move
    of more than ``threshold`` away from one of them fixes the first turning point there.
    Then, in an up leg, track the running maximum until the values fall more than
    ``threshold`` below it (that maximum is a confirmed turning point and a down leg
    starts), and symmetrically for a down leg. The last leg ends at its running extreme.
    Consecutive legs alternate in direction and each has ``|change| > threshold``.
    ``values`` must be finite; indices refer to positions in ``values``.
    """
    m = np.asarray(values, dtype=float)
    if not np.isfinite(m).all():
        raise ValueError("zigzag_legs needs finite values; drop missing checkpoints first")
    if not (threshold >= 0):  # also rejects NaN
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    n = len(m)
    if n < 2:
        return []
    # Floating-point dust is never a leg, even with a zero threshold.
    h = max(float(threshold), 1e-12 * max(1.0, float(np.max(np.abs(m)))))
    pivots: list[int] = []
    trend = 0
    lo = hi = 0  # indices of the running extremes
    for i in range(1, n):
        x = m[i]
        if trend == 0:
            if x > m[hi]:
                hi = i
            if x < m[lo]:
                lo = i
            if m[hi] - m[lo] > h:
                if hi == i:  # rose from the low
                    pivots.append(lo)
                    trend = 1
                else:
                    pivots.append(hi)
                    trend = -1
        elif trend == 1:
            if x > m[hi]:
                hi = i
            elif m[hi] - x > h:
                pivots.append(hi)
                trend, lo = -1, i
        else:
            if x < m[lo]:
                lo = i
            elif x - m[lo] > h:
                pivots.append(lo)
                trend, hi = 1, i
    if trend != 0:
        pivots.append(hi if trend == 1 else lo)
    return [Leg(int(a), int(b), float(m[b] - m[a])) for a, b in zip(pivots, pivots[1:])]


def hop_stats(values, *, threshold: float, signed: bool = True) -> HopStats:
    """Hops, legs, learning crossings and sign changes of one track (module docstring).

    NaN values (missing checkpoints) are dropped first; leg indices refer to the
    remaining values. ``hops`` is NaN with fewer than 3 values or a NaN threshold.
    """
    m = np.asarray(values, dtype=float)
    m = m[np.isfinite(m)]
    nan = float("nan")
    sign_changes = float(np.sum(m[:-1] * m[1:] < 0)) if signed and len(m) >= 2 else (0.0 if signed else nan)
    learning = nan
    if signed:
        nz = m[m != 0]
        learning = float(len(nz) >= 2 and np.sign(nz[0]) != np.sign(nz[-1]))
    if len(m) < 3 or not np.isfinite(threshold):
        return HopStats(nan, [], float(threshold), learning, sign_changes)
    legs = zigzag_legs(m, threshold)
    return HopStats(float(len(legs) // 2), legs, float(threshold), learning, sign_changes)


def trajectory_stats(
    values,
    *,
    steps=None,
    higher_is_better: bool = True,
    signed: bool = True,
    seed_sd=None,
    n_seeds=None,
    noise_window: int = 5,
    hop_k: float = HOP_K,
    min_hop: float = 0.0,
) -> dict[str, Any]:
    """Mode-hopping and signal/noise statistics of one track's checkpoint values.

    ``values`` are the per-checkpoint values in step order; ``signed`` counts sign changes
    and learning crossings (margins); ``seed_sd`` the per-checkpoint seed sds and
    ``n_seeds`` the per-checkpoint numbers of evaluation seeds (both set the hop threshold,
    :func:`hop_threshold` with ``k = hop_k`` and ``floor = min_hop``). Definitions: module
    docstring.
    """
    m = np.asarray(values, dtype=float)
    n = len(m)
    steps = np.arange(n) if steps is None else np.asarray(steps, dtype=float)
    nan = float("nan")
    out: dict[str, Any] = {"n_checkpoints": n}
    d = np.diff(m)
    h = hop_threshold(seed_sd, n_seeds, k=hop_k, floor=min_hop)
    hs = hop_stats(m, threshold=h, signed=signed)
    out["hops"] = hs.hops
    out["hop_legs"] = float(len(hs.legs)) if np.isfinite(hs.hops) else nan
    out["hop_threshold"] = h
    finite_steps = steps[np.isfinite(m)]
    out["hop_turning_steps"] = ";".join(fmt_step(finite_steps[leg.end]) for leg in hs.legs[:-1])
    out["learning_crossings"] = hs.learning_crossings
    out["sign_changes"] = int(hs.sign_changes) if signed else nan
    out["undone_crossings"] = (out["sign_changes"] - hs.learning_crossings) if signed else nan
    out["total_variation"] = float(np.abs(d).sum()) if n >= 2 else nan
    out["mean_abs_change"] = out["total_variation"] / (n - 1) if n >= 2 else nan
    if n >= 2:
        excess = out["total_variation"] - abs(m[-1] - m[0])
        out["excess_variation"] = 0.0 if excess <= 1e-12 * max(1.0, out["total_variation"]) else float(excess)
    else:
        out["excess_variation"] = nan
    if n >= 2:
        worsening = -d if higher_is_better else d
        i = int(np.argmax(worsening))
        out["largest_drop"] = float(max(0.0, worsening[i]))
        out["largest_drop_step"] = float(steps[i + 1]) if worsening[i] > 0 else nan
    else:
        out["largest_drop"] = out["largest_drop_step"] = nan
    out["signal_range"] = float(m.max() - m.min()) if n >= 2 else nan
    out["signal_sd"] = float(np.std(m, ddof=1)) if n >= 2 else nan
    sd = np.asarray(seed_sd if seed_sd is not None else [], dtype=float)
    out["noise_seed_sd"] = float(np.nanmean(sd)) if sd.size and np.isfinite(sd).any() else nan
    w = max(2, int(noise_window))
    last = m[-w:]
    out["noise_window"] = int(min(w, n))
    out["noise_last_sd"] = float(np.std(last, ddof=0)) if len(last) >= 2 else nan
    dl = np.diff(last)
    out["noise_last_diff_sd"] = float(np.std(dl, ddof=1) / math.sqrt(2)) if len(dl) >= 2 else nan
    out["snr_last"] = _ratio(out["signal_range"], out["noise_last_sd"])
    out["snr_last_diff"] = _ratio(out["signal_range"], out["noise_last_diff_sd"])
    out["snr_seed"] = _ratio(out["signal_range"], out["noise_seed_sd"])
    return out


def fmt_step(x: float) -> str:
    """A step for a label: ``1200`` (integers without a decimal point)."""
    return str(int(x)) if np.isfinite(x) and float(x) == int(x) else f"{x:g}"


def flip_rates(scores: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Per family x variant x consecutive checkpoint pair: fraction of (item, seed) units
    whose ``correct`` differs between the two checkpoints.

    Columns: ``family, variant, from_checkpoint, to_checkpoint, flip_rate, n_units``
    (units present at both checkpoints). Pairs follow ``order`` (default: step order).
    """
    cols = ["family", "variant", "from_checkpoint", "to_checkpoint", "flip_rate", "n_units"]
    if scores is None or not len(scores):
        return pd.DataFrame(columns=cols)
    order = order or checkpoint_order(scores)
    pos = {c: i for i, c in enumerate(order)}
    rows = []
    seed_col = "seed" if "seed" in scores.columns else None
    for (fam, var), g in scores.groupby(["family", "variant"], sort=False):
        index = ["item_id", seed_col] if seed_col else ["item_id"]
        wide = g.assign(_c=g["correct"].astype(float)).pivot_table(
            index=index, columns="checkpoint", values="_c", aggfunc="mean")
        cks = sorted((c for c in wide.columns if c in pos), key=pos.__getitem__)
        for a, b in zip(cks, cks[1:]):
            x, y = wide[a], wide[b]
            ok = x.notna() & y.notna()
            n = int(ok.sum())
            rows.append({"family": fam, "variant": str(var), "from_checkpoint": a, "to_checkpoint": b,
                         "flip_rate": float((x[ok] != y[ok]).mean()) if n else float("nan"), "n_units": n})
    return pd.DataFrame(rows, columns=cols)


def seed_spread(scores: pd.DataFrame) -> pd.DataFrame:
    """Per family x variant x checkpoint: min and max over seeds of the per-seed mean margin."""
    cols = ["family", "variant", "checkpoint", "seed_min", "seed_max"]
    if scores is None or not len(scores) or "seed" not in scores.columns or "margin" not in scores.columns:
        return pd.DataFrame(columns=cols)
    per_seed = scores.groupby(["family", "variant", "checkpoint", "seed"], sort=False)["margin"].mean()
    agg = per_seed.groupby(level=["family", "variant", "checkpoint"], sort=False).agg(["min", "max"])
    return agg.rename(columns={"min": "seed_min", "max": "seed_max"}).reset_index()[cols]


def spearman_matrix(wide: pd.DataFrame, *, min_n: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pairwise-complete Spearman correlation of the columns of ``wide`` (rows = checkpoints).

    Returns ``(rho, n)``: ``rho[a][b]`` is Spearman's rho (ties get average ranks) over the
    checkpoints where both tracks have a value, NaN when fewer than ``min_n`` checkpoints or
    a constant track; ``n[a][b]`` is that number of checkpoints.
    """
    from scipy.stats import rankdata

    names = list(wide.columns)
    rho = pd.DataFrame(np.nan, index=names, columns=names, dtype=float)
    nn = pd.DataFrame(0, index=names, columns=names, dtype=int)
    arr = wide.to_numpy(dtype=float)
    for i, a in enumerate(names):
        for j in range(i, len(names)):
            b = names[j]
            ok = np.isfinite(arr[:, i]) & np.isfinite(arr[:, j])
            n = int(ok.sum())
            nn.iloc[i, j] = nn.iloc[j, i] = n
            if n < min_n:
                continue
            x, y = rankdata(arr[ok, i]), rankdata(arr[ok, j])
            if np.ptp(x) == 0 or np.ptp(y) == 0:
                continue
            r = float(np.corrcoef(x, y)[0, 1])
            rho.iloc[i, j] = rho.iloc[j, i] = r
    return rho, nn


# ---------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------


def compute_dynamics(
    run_dir: str | Path,
    *,
    noise_window: int = 5,
    acc_jump: float = 0.10,
    small_margin_nats: float = 0.10,
    large_margin_nats: float = 0.50,
    hop_k: float = HOP_K,
    min_hop_nats: float = MIN_HOP_NATS,
    plots: bool = True,
) -> DynamicsResult:
    """Compute mode-hopping, signal/noise and correlation statistics of a scored run and
    write them (and the plots) to ``run_dir/dynamics/``.

    ``noise_window`` is the number of final checkpoints used for the checkpoint noise;
    ``acc_jump`` (fraction), ``small_margin_nats`` and ``large_margin_nats`` (nats) set the
    flags in ``pairs.csv``; ``hop_k`` the hop threshold multiplier and ``min_hop_nats`` its
    floor for margin tracks (:func:`hop_threshold`).
    Definitions: module docstring. Returns :class:`DynamicsResult`.
    """
    run = load_run(run_dir)
    notes: list[str] = []
    tracks = track_table(run.summary)
    if not len(tracks):
        raise ProbeselectError(f"{run.run_dir / 'summary.csv'}: no rows with a mean_margin or bits_per_byte value; "
                               "nothing to analyse. Re-run `probeselect score`.")
    order = checkpoint_order(run.summary)
    if len(order) < 3:
        notes.append(f"only {len(order)} checkpoint(s): hops, jitter, signal/noise and correlations need at least 3.")
    traj, flips = _trajectories(run, tracks, order, notes)
    stats, pairs_df = _track_stats(traj, flips, noise_window=noise_window, acc_jump=acc_jump,
                                   small_margin_nats=small_margin_nats, large_margin_nats=large_margin_nats,
                                   hop_k=hop_k, min_hop_nats=min_hop_nats)
    _seed_noise_notes(traj, stats, order, notes)
    rho, nn, corr_long = _correlations(traj, order)
    traj_out = traj[["track", "family", "variant", "kind", "metric", "checkpoint", "step", "tokens", "value",
                     "oriented_value", "seed_sd", "seed_min", "seed_max", "ci_low", "ci_high", "accuracy", "candidate_accuracy",
                     "n_items", "n_seeds"]]
    config = {"run_dir": str(run.run_dir), "noise_window": noise_window, "acc_jump": acc_jump,
              "small_margin_nats": small_margin_nats, "large_margin_nats": large_margin_nats, "hop_k": hop_k,
              "min_hop_nats": min_hop_nats,
              "correlation": "spearman on oriented values (higher = better)"}
    out_dir, plot_paths = _write_dynamics(run, config, notes, stats, traj_out, pairs_df, corr_long, (rho, nn),
                                          plots=plots)
    return DynamicsResult(run_dir=run.run_dir, out_dir=out_dir, stats=stats, trajectories=traj_out, pairs=pairs_df,
                          correlation=rho, correlation_n=nn, plots=plot_paths, notes=notes)


def _trajectories(run: RunTables, tracks: pd.DataFrame, order: list[str],
                  notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The track table with seed min/max bands and oriented values, and the per-item flip rates
    (both without ``scores.parquet``, noted)."""
    flips = flip_rates(run.scores, order) if run.scores is not None else flip_rates(None)
    spread = seed_spread(run.scores) if run.scores is not None else seed_spread(None)
    if run.scores is None:
        notes.append("no scores.parquet: per-item flip rates and seed min/max bands are not available "
                     "(bands show mean +- seed sd instead).")
    traj = tracks.merge(spread, on=["family", "variant", "checkpoint"], how="left")
    traj.loc[traj["metric"].ne("mean_margin"), ["seed_min", "seed_max"]] = np.nan
    traj["oriented_value"] = traj["value"] * traj["metric"].map(direction)
    return traj, flips


def _track_stats(traj: pd.DataFrame, flips: pd.DataFrame, *, noise_window: int, acc_jump: float,
                 small_margin_nats: float, large_margin_nats: float, hop_k: float,
                 min_hop_nats: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``dynamics.csv`` (one row per track) and ``pairs.csv`` (consecutive checkpoints of margin tracks)."""
    stat_rows, pair_rows = [], []
    for name, g in traj.groupby("track", sort=False):
        first = g.iloc[0]
        is_margin = first["metric"] == "mean_margin"
        st = trajectory_stats(
            g["value"].to_numpy(), steps=g["step"].to_numpy(dtype=float), higher_is_better=bool(first["higher_is_better"]),
            signed=is_margin, seed_sd=g["seed_sd"].to_numpy(dtype=float), n_seeds=g["n_seeds"].to_numpy(dtype=float),
            noise_window=noise_window, hop_k=hop_k, min_hop=min_hop_nats if is_margin else 0.0,
        )
        f = flips[(flips["family"] == first["family"]) & (flips["variant"] == first["variant"])]
        pairs = _pairs_for_track(g, f, acc_jump, small_margin_nats, large_margin_nats) if is_margin else []
        pair_rows.extend(pairs)
        rates = [p["flip_rate"] for p in pairs if np.isfinite(p["flip_rate"])]
        acc = g["accuracy"].to_numpy(dtype=float)
        stat_rows.append({
            "track": name, "family": first["family"], "variant": first["variant"], "kind": first["kind"],
            "metric": first["metric"], "higher_is_better": bool(first["higher_is_better"]),
            "first_step": g["step"].iloc[0], "last_step": g["step"].iloc[-1],
            "first_value": float(g["value"].iloc[0]), "last_value": float(g["value"].iloc[-1]),
            "mean_value": float(g["value"].mean()),
            **st,
            "flip_rate": float(np.mean(rates)) if rates else np.nan,
            "flip_rate_max": float(np.max(rates)) if rates else np.nan,
            "acc_total_variation": float(np.nansum(np.abs(np.diff(acc)))) if is_margin and len(acc) >= 2 else np.nan,
            "n_flag_acc_moves_margin_still": sum(p["flag_acc_moves_margin_still"] for p in pairs) if is_margin else np.nan,
            "n_flag_margin_moves_acc_still": sum(p["flag_margin_moves_acc_still"] for p in pairs) if is_margin else np.nan,
        })
    return pd.DataFrame(stat_rows), pd.DataFrame(pair_rows, columns=_PAIR_COLUMNS)


def _seed_noise_notes(traj: pd.DataFrame, stats: pd.DataFrame, order: list[str], notes: list[str]) -> None:
    """Notes on margin tracks whose hop threshold rests on 2 evaluation seeds, or on none."""
    margin_stats = stats[stats["metric"] == "mean_margin"]
    no_h = margin_stats[~np.isfinite(margin_stats["hop_threshold"].astype(float))]
    n_seeds = pd.to_numeric(traj.loc[traj["metric"] == "mean_margin", "n_seeds"], errors="coerce")
    if len(order) >= 3 and n_seeds.notna().any() and n_seeds.min() == 2:
        notes.append("only 2 evaluation seeds: each seed sd rests on one degree of freedom, so the hop threshold is "
                     "itself noisy (on pure-noise tracks of 10 checkpoints about 7% show a hop with 2 seeds vs about 3% "
                     "with 3). Score with --seeds 0 1 2 or more.")
    if len(no_h) and len(order) >= 3:
        notes.append(f"{len(no_h)} margin track(s) have no evaluation-seed sd (a single seed?): their hop threshold "
                     "and hops are n/a. Score with --seeds 0 1 2 to measure the noise.")


def _correlations(traj: pd.DataFrame, order: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Spearman correlations between every two tracks over the checkpoints: the wide matrix, the
    wide matrix of checkpoints each rests on, and ``correlation.csv`` (long)."""
    names = track_names(traj)
    # Oriented (higher = better for every track), so +1 always means "agree on which checkpoints are better".
    wide = traj.pivot_table(index="checkpoint", columns="track", values="oriented_value", aggfunc="first")
    wide = wide.reindex(index=[c for c in order if c in wide.index], columns=names)
    rho, nn = spearman_matrix(wide)
    corr_long = pd.DataFrame(
        [{"track_a": a, "track_b": b, "spearman_rho": rho.loc[a, b], "n_checkpoints": int(nn.loc[a, b])}
         for a in names for b in names]
    )
    return rho, nn, corr_long


def _write_dynamics(run: RunTables, config: dict, notes: list[str], stats: pd.DataFrame, traj_out: pd.DataFrame,
                    pairs_df: pd.DataFrame, corr_long: pd.DataFrame, corr: tuple[pd.DataFrame, pd.DataFrame], *,
                    plots: bool) -> tuple[Path, dict[str, Path]]:
    """Write the tables, the plots and the manifest to a staging folder and swap it in for
    ``run_dir/dynamics`` (a failure keeps the old folder); its path and the plots' paths."""
    final_dir = run.run_dir / "dynamics"
    out_dir = run.run_dir / ".dynamics.staging"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    atomic_write_csv(out_dir / "dynamics.csv", stats)
    atomic_write_csv(out_dir / "trajectories.csv", traj_out)
    atomic_write_csv(out_dir / "pairs.csv", pairs_df)
    atomic_write_csv(out_dir / "correlation.csv", corr_long)

    plot_paths: dict[str, Path] = {}
    if plots:
        plot_paths["margin_trajectories"] = plot_trajectories(traj_out, out_dir / "margin_trajectories.png",
                                                              windows=_planted_windows(run.run_dir))
        plot_paths["accuracy_vs_margin"] = plot_accuracy_vs_margin(
            traj_out, pairs_df, out_dir / "accuracy_vs_margin.png", acc_jump=config["acc_jump"],
            small_margin_nats=config["small_margin_nats"])
        plot_paths["correlation"] = plot_correlation(*corr, out_dir / "correlation.png")

    man = base_manifest("dynamics", config)
    man["inputs"] = {n: sha256_file(run.run_dir / n) for n in ("summary.csv", "scores.parquet")
                     if (run.run_dir / n).is_file()}
    man["outputs"] = ["dynamics.csv", "trajectories.csv", "pairs.csv", "correlation.csv",
                      *[p.name for p in plot_paths.values()]]
    man["notes"] = notes
    atomic_write_json(out_dir / "manifest.json", man)
    replace_dir(out_dir, final_dir)
    return final_dir, {k: (final_dir / p.name if p is not None else None) for k, p in plot_paths.items()}


_PAIR_COLUMNS = [
    "track", "family", "variant", "kind", "from_checkpoint", "to_checkpoint", "from_step", "to_step",
    "from_mean_margin", "to_mean_margin", "d_mean_margin", "from_accuracy", "to_accuracy", "d_accuracy",
    "d_candidate_accuracy", "sign_change", "flip_rate", "n_units",
    "flag_acc_moves_margin_still", "flag_margin_moves_acc_still",
]


def _pairs_for_track(g: pd.DataFrame, flips: pd.DataFrame, acc_jump: float, small: float, large: float) -> list[dict]:
    fl = {(r.from_checkpoint, r.to_checkpoint): (r.flip_rate, r.n_units) for r in flips.itertuples()}
    rows = []
    recs = g.to_dict("records")
    eps = 1e-12
    for a, b in zip(recs, recs[1:]):
        dm = b["value"] - a["value"]
        da = b["accuracy"] - a["accuracy"]
        rate, n_units = fl.get((a["checkpoint"], b["checkpoint"]), (np.nan, 0))
        rows.append({
            "track": a["track"], "family": a["family"], "variant": a["variant"], "kind": a["kind"],
            "from_checkpoint": a["checkpoint"], "to_checkpoint": b["checkpoint"],
            "from_step": a["step"], "to_step": b["step"],
            "from_mean_margin": a["value"], "to_mean_margin": b["value"], "d_mean_margin": dm,
            "from_accuracy": a["accuracy"], "to_accuracy": b["accuracy"], "d_accuracy": da,
            "d_candidate_accuracy": b["candidate_accuracy"] - a["candidate_accuracy"],
            "sign_change": bool(a["value"] * b["value"] < 0), "flip_rate": rate, "n_units": n_units,
            "flag_acc_moves_margin_still": bool(abs(da) >= acc_jump - eps and abs(dm) <= small + eps),
            "flag_margin_moves_acc_still": bool(abs(dm) >= large - eps and abs(da) < acc_jump - eps),
        })
    return rows


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

_YLABELS = {"mean_margin": "mean margin (nats)", "bits_per_byte": "pretraining held-out bits per byte"}


def _planted_windows(run_dir) -> list:
    """The data windows of the ladder's lineage next to the checkpoints (none when absent or unreadable)."""
    from .attribution import AttributionError, find_lineage, load_windows

    path = find_lineage(run_dir)
    if path is None:
        return []
    try:
        return load_windows(path)
    except AttributionError:
        return []


def _x(g: pd.DataFrame) -> np.ndarray:
    s = pd.to_numeric(g["step"], errors="coerce").to_numpy(dtype=float)
    return np.arange(len(g), dtype=float) if np.isnan(s).any() else s


def plot_trajectories(traj: pd.DataFrame, path: Path, *, title: str | None = None, windows=()) -> Path:
    """One panel per family (and metric): value per checkpoint, one line per variant, with
    a seed band (min-max over seeds, or mean +- seed sd) and the bootstrap CI dashed.
    ``windows``: data windows (:class:`probeselect.attribution.Window`) whose ``planted``
    behaviour is set are shaded over their step range (x = steps only)."""
    from ._plots import color, new_figure, save_png

    groups = list(traj.groupby(["family", "metric"], sort=False))
    fig, axes = new_figure(len(groups))
    steps_known = not pd.to_numeric(traj["step"], errors="coerce").isna().any()
    shade = [w for w in windows if getattr(w, "planted", None)] if steps_known else []
    for ax, ((fam, metric), g) in zip(axes, groups):
        for j, w in enumerate(shade):
            ax.axvspan(w.start_step, w.end_step, color="#ff7f0e", alpha=0.12, lw=0,
                       label=f"{w.name} window ({w.planted})" if j == 0 or len(shade) > 1 else None)
        for i, (var, v) in enumerate(g.groupby("variant", sort=False)):
            x, y, c = _x(v), v["value"].to_numpy(dtype=float), color(i)
            ax.plot(x, y, marker="o", ms=3, lw=1.5, color=c, label=str(var))
            lo, hi = v["seed_min"].to_numpy(dtype=float), v["seed_max"].to_numpy(dtype=float)
            if np.isnan(lo).all():
                sd = v["seed_sd"].to_numpy(dtype=float)
                lo, hi = y - sd, y + sd
            if np.isfinite(lo).any():
                ax.fill_between(x, lo, hi, color=c, alpha=0.25, lw=0)
            for col in ("ci_low", "ci_high"):
                ci = v[col].to_numpy(dtype=float)
                if np.isfinite(ci).any():
                    ax.plot(x, ci, ls="--", lw=0.8, color=c, alpha=0.6)
        if metric == "mean_margin":
            ax.axhline(0.0, color="black", lw=0.8)
        kind = g["kind"].iloc[0]
        ax.set_title(f"{fam} ({kind})" if metric in _YLABELS else f"{fam}: {metric}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(_YLABELS.get(metric, metric))
        ax.legend(fontsize=MIN_FONT_PT, loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle(title or "line: mean; band: seed spread; dashed: 95% bootstrap CI"
                 + ("; shaded: planted data window" if shade else ""), fontsize=9)
    return save_png(fig, path)


#: Smallest font (points, at the saved size) of any label a reader must read.
MIN_FONT_PT = 9.0


def accuracy_vs_margin_figure(traj: pd.DataFrame, pairs: pd.DataFrame, *, acc_jump: float = 0.10,
                              small_margin_nats: float = 0.10):
    """The figure of :func:`plot_accuracy_vs_margin` (returned, not saved)."""
    from ._plots import color, new_figure

    m = traj[traj["metric"] == "mean_margin"]
    fams = list(dict.fromkeys(m["family"]))
    fig, axes = new_figure(len(fams) + 1, ncols=3, panel_size=(4.4, 3.6))
    fs = MIN_FONT_PT
    for ax, fam in zip(axes, fams):
        g_fam = m[m["family"] == fam]
        for i, (var, g) in enumerate(g_fam.groupby("variant", sort=False)):
            ax.plot(g["value"], g["accuracy"], marker="o", ms=3, lw=1, alpha=0.85, color=color(i), label=str(var))
            ax.plot(g["value"].iloc[-1:], g["accuracy"].iloc[-1:], marker="s", ms=6, color=color(i))
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_title(f"{fam} ({g_fam['kind'].iloc[0]}; square = last)", fontsize=10)
        ax.set_xlabel("mean margin (nats)", fontsize=fs)
        ax.set_ylabel("accuracy (margin > 0)", fontsize=fs)
        ax.tick_params(labelsize=fs)
        ax.legend(fontsize=fs, loc="best", title="variant", title_fontsize=fs)
        ax.grid(alpha=0.3)
    right = axes[-1]
    right.axvspan(-small_margin_nats, small_margin_nats, color="grey", alpha=0.15, lw=0)
    for yv in (-acc_jump, acc_jump):
        right.axhline(yv, color="grey", ls=":", lw=0.8)
    for i, fam in enumerate(fams):
        p = pairs[pairs["family"] == fam] if len(pairs) else pairs
        if len(p):
            right.scatter(p["d_mean_margin"], p["d_accuracy"], s=14, color=color(i), alpha=0.8, label=fam)
    flagged = pairs[pairs["flag_acc_moves_margin_still"].astype(bool)] if len(pairs) else pairs
    if len(flagged):
        right.scatter(flagged["d_mean_margin"], flagged["d_accuracy"], s=80, facecolors="none",
                      edgecolors="red", lw=1.2, label="accuracy moved,\nmargin did not")
    if len(pairs):
        right.legend(fontsize=fs, loc="best", title="family", title_fontsize=fs)
    right.axhline(0.0, color="black", lw=0.6)
    right.axvline(0.0, color="black", lw=0.6)
    right.set_xlabel("change in mean margin (nats)", fontsize=fs)
    right.set_ylabel("change in accuracy", fontsize=fs)
    right.tick_params(labelsize=fs)
    right.set_title("consecutive checkpoints (grey: small margin change)", fontsize=10)
    right.grid(alpha=0.3)
    return fig


def plot_accuracy_vs_margin(traj: pd.DataFrame, pairs: pd.DataFrame, path: Path, *,
                            acc_jump: float = 0.10, small_margin_nats: float = 0.10) -> Path:
    """One panel per family: accuracy against mean margin per checkpoint (connected in step
    order; colours = prompt variants, with a legend). Last panel: d accuracy against d mean
    margin per consecutive pair (colours = families); flagged pairs ringed."""
    from ._plots import save_png

    return save_png(accuracy_vs_margin_figure(traj, pairs, acc_jump=acc_jump, small_margin_nats=small_margin_nats),
                    path)


def correlation_figure(rho: pd.DataFrame, nn: pd.DataFrame):
    """The figure of :func:`plot_correlation` (returned, not saved). Every label >= MIN_FONT_PT."""
    from ._plots import new_figure

    k = len(rho)
    cell = 0.45  # inches per track: room for a 9 pt value in each cell
    side = max(4.0, 3.2 + cell * k)
    fig, (ax,) = new_figure(1, ncols=1, panel_size=(side + 1.4, side))
    arr = rho.to_numpy(dtype=float)
    im = ax.imshow(np.ma.masked_invalid(arr), cmap="RdBu_r", vmin=-1, vmax=1)
    fs = MIN_FONT_PT
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels(rho.columns, rotation=60, ha="right", fontsize=fs)
    ax.set_yticklabels(rho.index, fontsize=fs)
    if k <= 24:
        for i in range(k):
            for j in range(k):
                txt = "n/a" if np.isnan(arr[i, j]) else f"{arr[i, j]:.2f}"
                ax.text(j, i, txt, ha="center", va="center", fontsize=fs,
                        color="white" if np.isfinite(arr[i, j]) and abs(arr[i, j]) > 0.6 else "black")
    off = nn.to_numpy()[~np.eye(k, dtype=bool)] if k > 1 else nn.to_numpy().ravel()
    n_txt = f"{off.min()}" if off.size and off.min() == off.max() else (f"{off.min()}-{off.max()}" if off.size else "0")
    ax.set_title(f"Spearman rho across checkpoints (n = {n_txt} checkpoints)\n"
                 "oriented (higher = better; bpb negated): red = agree, blue = disagree", fontsize=10)
    cb = fig.colorbar(im, ax=ax, shrink=0.8)
    cb.ax.tick_params(labelsize=fs)
    return fig


def plot_correlation(rho: pd.DataFrame, nn: pd.DataFrame, path: Path) -> Path:
    """Heatmap of the (oriented) Spearman matrix, values annotated when it is small enough to read."""
    from ._plots import save_png

    return save_png(correlation_figure(rho, nn), path)
