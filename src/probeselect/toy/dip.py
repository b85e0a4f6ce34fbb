"""Measure a planted dip: family margins across checkpoints against the data windows.

Inputs are the item-level score table of ``probeselect score`` (``scores.parquet``:
``checkpoint, step, family, seed, margin`` ...) and the windows of a toy ladder's
``data_lineage.json``. Definitions (all margins in nats):

* **family trajectory** (:func:`family_trajectories`): per checkpoint and family, the
  mean margin over the family's items under each evaluation seed; ``value`` is the mean
  of these per-seed means, ``seed_sd`` their standard deviation across seeds (ddof=1).
* **dip** of a family for a window ``(start, end]`` (:func:`planted_dip`): the reference
  is the last checkpoint at or before ``start``; the *dip region* is the checkpoints
  inside the window plus the first one after it. A checkpoint is *below* when its value
  is lower than the reference by more than ``sd_factor`` times the evaluation-seed sd
  (the larger of the two checkpoints' sds, floored at ``sd_floor``). The family *dips*
  when at least ``min_consecutive`` consecutive checkpoints of the region are below.
  ``depth`` = reference - lowest value in the region. ``recovery`` = the fraction of the
  depth regained by the last checkpoint ((last - lowest) / depth); ``recovered`` = the
  last checkpoint is no longer below the reference (within the same tolerance), i.e. a
  full recovery.
  For tracks where lower is better (bits per byte) pass ``higher_is_better=False``.
* **averaging** (:func:`averaging_dip`): the depth of the same dip on the raw ladder and
  on a ladder of k-checkpoint averages (scored with the same probes); ``reduction`` =
  1 - depth_avg / depth_raw.

This module imports no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

__all__ = ["family_trajectories", "planted_dip", "averaging_dip", "write_averaging_dip", "load_windows",
           "bpb_trajectory", "check_planted_dip", "CONFLICT_FAMILIES", "CAPABILITY_FAMILIES"]


def load_windows(lineage) -> list[dict]:
    """The windows of a ``data_lineage.json`` (path or loaded dict)."""
    if not isinstance(lineage, dict):
        lineage = json.loads(Path(lineage).read_text(encoding="utf-8"))
    return list(lineage["windows"])


def family_trajectories(scores: pd.DataFrame, families: Iterable[str] | None = None,
                        column: str = "margin") -> pd.DataFrame:
    """Columns ``family, checkpoint, step, value, seed_sd, n_seeds`` (``value``: mean over
    seeds of the per-seed mean of ``column`` over the family's items: the margin by default,
    ``candidate_correct`` for candidate accuracy), sorted by family, step."""
    df = scores if families is None else scores[scores["family"].isin(set(families))]
    if df.empty:
        return pd.DataFrame(columns=["family", "checkpoint", "step", "value", "seed_sd", "n_seeds"])
    if column not in df.columns:
        raise KeyError(f"scores have no column {column!r}; columns: {', '.join(map(str, df.columns))}")
    per_seed = df.groupby(["family", "checkpoint", "step", "seed"], as_index=False)[column].mean()
    out = per_seed.groupby(["family", "checkpoint", "step"], as_index=False).agg(
        value=(column, "mean"), seed_sd=(column, lambda x: float(np.std(x, ddof=1)) if len(x) > 1 else np.nan),
        n_seeds=(column, "size"))
    return out.sort_values(["family", "step"]).reset_index(drop=True)


def bpb_trajectory(summary: pd.DataFrame) -> pd.DataFrame:
    """The held-out bits-per-byte track of a ``summary.csv`` in the layout of
    :func:`family_trajectories` (family ``heldout_nll``, ``seed_sd`` 0: not seeded)."""
    g = summary[summary["family"] == "heldout_nll"]
    out = pd.DataFrame({"family": "heldout_nll", "checkpoint": g["checkpoint"], "step": g["step"],
                        "value": g["bits_per_byte"].astype(float), "seed_sd": 0.0, "n_seeds": 1})
    return out.sort_values("step").reset_index(drop=True)


def _dip_one(g: pd.DataFrame, start: int, end: int, sd_factor: float, min_consecutive: int, sd_floor: float,
             sign: float, ref_fallback_first: bool = False) -> dict:
    g = g.sort_values("step")
    steps = g["step"].to_numpy(dtype=float)
    vals = sign * g["value"].to_numpy(dtype=float)
    sds = np.nan_to_num(g["seed_sd"].to_numpy(dtype=float), nan=0.0)
    row = {"ref_step": np.nan, "ref_value": np.nan, "region_steps": "", "min_step": np.nan, "min_value": np.nan,
           "depth": np.nan, "seed_sd": np.nan, "threshold": np.nan, "n_below": 0, "longest_below_run": 0,
           "dipped": False, "last_step": float(steps[-1]) if len(steps) else np.nan,
           "last_value": float(sign * vals[-1]) if len(vals) else np.nan, "recovered": False, "recovery": np.nan}
    ref = np.where(steps <= start)[0]
    if not len(ref) and not (ref_fallback_first and len(steps) > 1 and steps[0] <= end):
        return row
    r = ref[-1] if len(ref) else 0
    inside = np.where((steps > max(start, steps[r])) & (steps <= end))[0]
    after = np.where(steps > end)[0]
    region = list(inside) + ([after[0]] if len(after) else [])
    if not region:
        return row
    below, run, best = [], 0, 0
    for i in region:
        sd = max(sds[r], sds[i], sd_floor)
        b = bool(vals[i] < vals[r] - sd_factor * sd)
        below.append(b)
        run = run + 1 if b else 0
        best = max(best, run)
    j = region[int(np.argmin(vals[region]))]
    sd_ref = max(sds[r], sds[j], sd_floor)
    last = len(vals) - 1
    depth = float(vals[r] - vals[j])
    row.update({
        "ref_step": float(steps[r]), "ref_value": float(sign * vals[r]),
        "region_steps": " ".join(str(int(steps[i])) for i in region),
        "min_step": float(steps[j]), "min_value": float(sign * vals[j]), "depth": depth,
        "seed_sd": float(sd_ref), "threshold": float(sd_factor * sd_ref), "n_below": int(sum(below)),
        "longest_below_run": int(best), "dipped": bool(best >= min_consecutive and depth > sd_factor * sd_ref),
        "recovered": bool(last > region[-1] and vals[last] >= vals[r] - sd_factor * max(sds[r], sds[last], sd_floor)),
        "recovery": float((vals[last] - vals[j]) / depth) if depth > 0 else np.nan,
    })
    return row


def planted_dip(traj: pd.DataFrame, windows: Sequence[dict], *, families: Iterable[str] | None = None,
                planted_only: bool = True, sd_factor: float = 3.0, min_consecutive: int = 2, sd_floor: float = 0.0,
                higher_is_better: bool = True, ref_fallback_first: bool = False) -> pd.DataFrame:
    """One row per (window, family): the dip statistics defined in the module docstring.

    ``traj``: a :func:`family_trajectories` (or :func:`bpb_trajectory`) table;
    ``windows``: the ``windows`` of ``data_lineage.json`` (:func:`load_windows`); only
    windows with a ``planted`` behaviour unless ``planted_only=False``.
    ``ref_fallback_first``: when no checkpoint precedes the window (e.g. the first
    k-checkpoint average lies inside it), use the first checkpoint inside the window as
    the reference instead of reporting nothing.
    """
    fams = list(dict.fromkeys(traj["family"])) if families is None else list(families)
    rows = []
    for w in windows:
        if planted_only and not w.get("planted"):
            continue
        for f in fams:
            g = traj[traj["family"] == f]
            if g.empty:
                continue
            r = _dip_one(g, int(w["start_step"]), int(w["end_step"]), sd_factor, min_consecutive, sd_floor,
                         1.0 if higher_is_better else -1.0, ref_fallback_first)
            rows.append({"window": w["name"], "planted": w.get("planted"), "start_step": int(w["start_step"]),
                         "end_step": int(w["end_step"]), "family": f, **r})
    return pd.DataFrame(rows)


def averaging_dip(raw_scores: pd.DataFrame, avg_scores: pd.DataFrame, windows: Sequence[dict], *,
                  families: Iterable[str] | None = None, window_size: int | None = None) -> pd.DataFrame:
    """Depth of each planted window's dip per family on the raw ladder and on the
    averaged ladder: columns ``window, family, k, depth_raw, min_step_raw, depth_avg,
    min_step_avg, reduction`` (``reduction`` = 1 - depth_avg / depth_raw; NaN unless the
    raw track dips, ``dipped_raw``, by :func:`planted_dip` with one checkpoint enough). Averaged checkpoints are labelled
    with their last source step, so their dip region is the same step range; when no
    average precedes the window, the first average inside it is the reference
    (``ref_step_avg``).
    """
    raw = planted_dip(family_trajectories(raw_scores, families), windows, min_consecutive=1, ref_fallback_first=True)
    avg = planted_dip(family_trajectories(avg_scores, families), windows, min_consecutive=1, ref_fallback_first=True)
    cols = ["window", "family", "depth", "min_step", "ref_step", "dipped"]
    m = raw[cols].merge(avg[cols], on=["window", "family"], how="outer", suffixes=("_raw", "_avg"))
    m.insert(2, "k", window_size)
    m["reduction"] = [1.0 - a / r if d is True and np.isfinite(r) and r > 0 and np.isfinite(a) else np.nan
                      for r, a, d in zip(m["depth_raw"], m["depth_avg"], m["dipped_raw"])]
    return m


#: Conflict families whose planted dip is reported (the toy conflict families).
CONFLICT_FAMILIES = ("arith_pattern", "tmpl_repeated", "tmpl_flipped", "tmpl_mismatch", "persona_qa")


def write_averaging_dip(run_dir, avg_run_dir, lineage, *, window_size: int | None = None,
                        families: Iterable[str] | None = CONFLICT_FAMILIES) -> Path | None:
    """Write ``AVG_RUN/averaging_dip.csv`` (e.g. ``RUN/averaged/``; not ``RUN/dynamics/``, which
    ``compute_dynamics`` replaces whole): :func:`averaging_dip` of the raw run
    (``run_dir/scores.parquet``) and the averaged run (``avg_run_dir/scores.parquet``) over
    the planted windows of ``lineage`` (``data_lineage.json``). Returns the path, or None
    when the lineage has no planted window or a run has no scores."""
    from .._io import atomic_write_csv

    windows = [w for w in load_windows(lineage) if w.get("planted")]
    raw_p, avg_p = Path(run_dir) / "scores.parquet", Path(avg_run_dir) / "scores.parquet"
    if not windows or not raw_p.is_file() or not avg_p.is_file():
        return None
    df = averaging_dip(pd.read_parquet(raw_p), pd.read_parquet(avg_p), windows, families=families,
                       window_size=window_size)
    path = Path(avg_run_dir) / "averaging_dip.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(path, df)
    return path


#: Capability families that must not dip with the conflict families (issue 13).
CAPABILITY_FAMILIES = ("arith_plain", "relation_plain")


def check_planted_dip(scores: pd.DataFrame, summary: pd.DataFrame | None, lineage, *,
                      conflict_families: Iterable[str] = CONFLICT_FAMILIES,
                      capability_families: Iterable[str] = CAPABILITY_FAMILIES,
                      min_families: int = 2, sd_factor: float = 3.0, bpb_rel_tol: float = 0.01,
                      min_recovery: float = 0.5) -> dict:
    """The planted-dip criteria on one scored ladder, per planted window of ``lineage``:

    * at least ``min_families`` conflict families dip (:func:`planted_dip`: >= 2
      consecutive checkpoints inside or right after the window below the pre-window value
      by more than ``sd_factor`` x their evaluation-seed sd) and recover: by the last
      checkpoint they regain at least ``min_recovery`` of the dip's depth (``recovery``;
      1.0 = back to the pre-window value; ``recovered`` in the table is the full recovery);
    * no capability family dips by the same rule;
    * held-out bits per byte (``summary``'s ``heldout_nll`` rows, when present) does not
      rise by more than ``bpb_rel_tol`` (relative to the pre-window value) over >= 2
      consecutive checkpoints of the region (bpb has no evaluation seeds, so the tolerance
      replaces the seed sd).

    Returns ``{"pass", "windows": [{window, dipped_and_recovered, dipped_not_recovered,
    capability_dipped, bpb_dipped}], "dips": DataFrame}``.
    """
    windows = load_windows(lineage)
    traj = family_trajectories(scores, list(conflict_families) + list(capability_families))
    dips = planted_dip(traj, windows, sd_factor=sd_factor)
    parts = [dips]
    if summary is not None and (summary["family"] == "heldout_nll").any():
        bpb = bpb_trajectory(summary)
        floor = bpb_rel_tol * float(bpb["value"].median()) / sd_factor
        parts.append(planted_dip(bpb, windows, higher_is_better=False, sd_factor=sd_factor, sd_floor=floor))
    allp = pd.concat(parts, ignore_index=True) if len(parts) > 1 else dips
    out = []
    for name in dict.fromkeys(allp["window"]) if len(allp) else []:
        d = allp[allp["window"] == name]
        conf = d[d["family"].isin(set(conflict_families))]
        rec = conf["recovery"].fillna(0.0) >= min_recovery
        out.append({
            "window": name,
            "dipped_and_recovered": sorted(conf[conf["dipped"] & rec]["family"]),
            "dipped_not_recovered": sorted(conf[conf["dipped"] & ~rec]["family"]),
            "recovery": {f: round(float(r), 3) for f, r in zip(conf["family"], conf["recovery"]) if np.isfinite(r)},
            "capability_dipped": sorted(d[d["family"].isin(set(capability_families)) & d["dipped"]]["family"]),
            "bpb_dipped": bool(d[(d["family"] == "heldout_nll") & d["dipped"]].shape[0]),
        })
    ok = bool(out) and all(len(w["dipped_and_recovered"]) >= min_families and not w["capability_dipped"]
                           and not w["bpb_dipped"] for w in out)
    return {"pass": ok, "windows": out, "dips": allp}
