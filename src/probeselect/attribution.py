"""Data-window attribution: which stretch of pretraining data moved each probe track.

A ladder built from a curriculum records its data lineage next to the checkpoints
(``data_lineage.json``, written by ``probeselect toy-ladder --curriculum``)::

    {"windows": [{"name": "parrot", "start_step": 800, "end_step": 1200, "mixture": {...},
                  "tokens_by_kind": {...}, "documents_sha256": "...", "planted": "parrot"}, ...]}

A user may instead give a CSV with the columns ``start_step,end_step,window`` (optional
``planted``). :func:`load_windows` reads either; :func:`find_lineage` looks for
``data_lineage.json`` in the folders of the checkpoints a score run scored (its
``manifest.json``) and in their parent folder.

Window convention: a window covers the optimizer steps ``start_step < t <= end_step``, so
contiguous windows share their boundary (``[0, 800]``, ``[800, 1200]``, ...) and the
checkpoint saved at ``start_step`` has seen none of the window's data.

For every track (one metric of one family x variant, as in ``dynamics/trajectories.csv``)
and every window, :func:`attribute` measures, oriented so that **positive = better**
(``value`` for margins and accuracies, ``-value`` for bits per byte and losses):

* ``start_checkpoint``: the last checkpoint with ``step <= start_step`` (the state before
  the window's data; when no checkpoint precedes the window, its first checkpoint, and
  ``start_inside`` is true);
* ``end_checkpoint``: the last checkpoint with ``step <= end_step``; when no checkpoint
  falls inside the window, the first one after it (``end_after_window`` is true);
* ``change`` = oriented ``end - start``; ``worst_change`` = the lowest oriented value of
  the checkpoints in the window (start excluded, end included) minus the start (a dip
  that recovers inside the window shows here and not in ``change``);
* ``noise_sd`` = sqrt(seed_sd_start^2 + seed_sd_end^2) (evaluation-seed sd of the two
  checkpoint means, ``summary.csv`` ``seed_sd``), ``change_z`` = change / noise_sd (NaN
  when the noise is unknown or 0);
* ``prior_gain`` = oriented start value minus the track's first checkpoint value (what
  training had gained before the window); ``undone_fraction`` = ``max(0, -change) /
  prior_gain`` when ``prior_gain > 0``;
* ``undoes_gains``: ``change < 0``, ``prior_gain > 0`` and the loss is beyond noise
  (``change_z <= -z_threshold``, or ``-change > rel_threshold * prior_gain`` when the
  noise is unknown);
* ``recovered_after``: for a window with ``change < 0``, whether a later checkpoint
  reaches the start value again (NaN when no checkpoint follows the window);
* ``harm_rank``: rank of the window among the track's windows by ``change`` (1 = the
  largest loss); ``most_harmful``: rank 1 with ``change < 0`` and beyond noise (as for
  ``undoes_gains`` but without requiring a prior gain).

:func:`family_summary` reduces tracks to one row per family x metric x window (mean change
over the family's prompt variants) and names each family's most harmful window.
Outputs (:func:`write_attribution`): ``RUN/dynamics/attribution.csv`` (track x window)
and ``RUN/dynamics/attribution_families.csv`` (family x window).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ._io import atomic_write_csv
from .errors import ProbeselectError

__all__ = ["AttributionError", "Window", "load_windows", "find_lineage", "attribute", "family_summary",
           "write_attribution", "ATTRIBUTION_COLUMNS", "FAMILY_COLUMNS"]

LINEAGE_FILE = "data_lineage.json"
ATTRIBUTION_COLUMNS = [
    "track", "family", "variant", "metric", "window", "planted", "start_step", "end_step", "start_checkpoint",
    "end_checkpoint", "n_checkpoints_in_window", "start_inside", "end_after_window", "start_value", "end_value",
    "change", "worst_change", "noise_sd", "change_z", "prior_gain", "undone_fraction", "undoes_gains",
    "recovered_after", "harm_rank", "most_harmful"]
FAMILY_COLUMNS = ["family", "metric", "window", "planted", "start_step", "end_step", "n_tracks", "mean_change",
                  "mean_change_z", "tracks_undoing_gains", "harm_rank", "most_harmful"]


class AttributionError(ProbeselectError):
    """A data lineage / window file is missing or invalid, or it does not fit the run."""


@dataclass(frozen=True)
class Window:
    """One data window: optimizer steps ``start_step < t <= end_step``."""

    name: str
    start_step: int
    end_step: int
    planted: str | None = None

    def holds(self, step: Any) -> bool:
        """Whether a checkpoint at ``step`` (None or NaN: no step) lies in this window."""
        return step is not None and not pd.isna(step) and self.start_step < step <= self.end_step


# ---------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer)) or (isinstance(v, float) and not v.is_integer()):
        raise AttributionError(f"{where}: expected an integer step, got {v!r}.")
    return int(v)


def _check_windows(windows: list[Window], src: str) -> list[Window]:
    if not windows:
        raise AttributionError(f"{src}: no windows; expected at least one {{name, start_step, end_step}}.")
    names = [w.name for w in windows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AttributionError(f"{src}: window name {dup[0]!r} appears more than once; names must be unique.")
    for w in windows:
        if w.end_step <= w.start_step or w.start_step < 0:
            raise AttributionError(f"{src}: window {w.name!r}: need 0 <= start_step < end_step, got "
                                   f"{w.start_step}..{w.end_step}.")
    ws = sorted(windows, key=lambda w: w.start_step)
    for a, b in zip(ws, ws[1:]):
        if b.start_step < a.end_step:
            raise AttributionError(f"{src}: windows {a.name!r} ({a.start_step}..{a.end_step}) and {b.name!r} "
                                   f"({b.start_step}..{b.end_step}) overlap; windows must be disjoint.")
    return ws


def load_windows(path: str | Path) -> list[Window]:
    """Windows of a ``data_lineage.json`` or of a CSV ``start_step,end_step,window[,planted]``,
    sorted by start step. :class:`AttributionError` for a missing or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise AttributionError(f"{p}: lineage file not found; pass --lineage data_lineage.json (written next to the "
                               "checkpoints by `probeselect toy-ladder --curriculum`) or a CSV start_step,end_step,window.")
    if p.suffix.lower() == ".csv":
        try:
            df = pd.read_csv(p)
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise AttributionError(f"{p}: cannot read the window CSV ({type(exc).__name__}: {exc}).") from None
        missing = [c for c in ("start_step", "end_step", "window") if c not in df.columns]
        if missing:
            raise AttributionError(f"{p}: the window CSV lacks columns {missing}; expected start_step,end_step,window.")
        out = []
        for i, r in enumerate(df.itertuples(index=False), 2):
            planted = getattr(r, "planted", None)
            planted = None if planted is None or (isinstance(planted, float) and math.isnan(planted)) else str(planted)
            out.append(Window(str(r.window), _int(r.start_step, f"{p}:{i} start_step"),
                              _int(r.end_step, f"{p}:{i} end_step"), planted))
        return _check_windows(out, str(p))
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AttributionError(f"{p}: invalid JSON ({exc.msg}); expected {{\"windows\": [...]}}.") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("windows"), list):
        raise AttributionError(f"{p}: expected a JSON object with a \"windows\" list (data_lineage.json format).")
    out = []
    for i, w in enumerate(raw["windows"]):
        if not isinstance(w, dict) or not all(k in w for k in ("name", "start_step", "end_step")):
            raise AttributionError(f"{p}: windows[{i}] needs name, start_step and end_step.")
        planted = w.get("planted")
        out.append(Window(str(w["name"]), _int(w["start_step"], f"{p}: windows[{i}].start_step"),
                          _int(w["end_step"], f"{p}: windows[{i}].end_step"),
                          None if planted in (None, "") else str(planted)))
    return _check_windows(out, str(p))


def find_lineage(run_dir: str | Path) -> Path | None:
    """``data_lineage.json`` next to the checkpoints of a score run (folders named in its
    ``manifest.json``, then their parent), or None when there is none."""
    man = Path(run_dir) / "manifest.json"
    if not man.is_file():
        return None
    try:
        ckpts = json.loads(man.read_text(encoding="utf-8")).get("checkpoints") or []
    except json.JSONDecodeError:
        return None
    seen: list[Path] = []
    for c in ckpts:
        path = c.get("path") if isinstance(c, dict) else None
        if not path:
            continue
        for d in (Path(path), Path(path).parent):
            if d not in seen:
                seen.append(d)
    for d in seen:
        if (d / LINEAGE_FILE).is_file():
            return d / LINEAGE_FILE
    return None


# ---------------------------------------------------------------------------
# Attribution
# ---------------------------------------------------------------------------


def _higher_is_better(metric: str) -> bool:
    from .metrics import direction  # the shared orientation table (bits per byte, losses: lower is better)

    return direction(metric) > 0


def attribute(trajectories: pd.DataFrame, windows: Sequence[Window], *, z_threshold: float = 3.0,
              rel_threshold: float = 0.1) -> pd.DataFrame:
    """Track x window attribution table (:data:`ATTRIBUTION_COLUMNS`; definitions in the module docstring).

    ``trajectories``: long rows with ``track, family, variant, metric, step, value`` and
    optionally ``checkpoint``, ``seed_sd``, ``higher_is_better`` (else from the metric name).
    Raises :class:`AttributionError` when no window holds or follows any checkpoint.
    """
    need = ["track", "family", "variant", "metric", "step", "value"]
    missing = [c for c in need if c not in trajectories.columns]
    if missing:
        raise AttributionError(f"trajectories lack columns {missing}; expected dynamics/trajectories.csv rows.")
    windows = _check_windows(list(windows), "windows")
    steps_all = sorted({int(s) for s in trajectories["step"].dropna()})
    if not steps_all:
        raise AttributionError("trajectories have no checkpoint steps; score a ladder of checkpoints first.")
    if all(w.start_step >= steps_all[-1] for w in windows):
        raise AttributionError(f"no window starts before the last checkpoint (step {steps_all[-1]}); the lineage "
                               "does not belong to this ladder.")
    rows: list[dict] = []
    for track, g in trajectories.groupby("track", sort=False):
        g = g.dropna(subset=["step", "value"]).sort_values("step", kind="stable")
        if g.empty:
            continue
        metric = str(g["metric"].iloc[0])
        hib = bool(g["higher_is_better"].iloc[0]) if "higher_is_better" in g.columns and \
            g["higher_is_better"].notna().all() else _higher_is_better(metric)
        sign = 1.0 if hib else -1.0
        steps = g["step"].astype(int).to_numpy()
        vals = sign * g["value"].astype(float).to_numpy()
        sds = g["seed_sd"].astype(float).to_numpy() if "seed_sd" in g.columns else np.full(len(g), np.nan)
        names = g["checkpoint"].astype(str).to_numpy() if "checkpoint" in g.columns else np.array(
            [f"step-{s}" for s in steps])
        track_rows = []
        for w in windows:
            inside = np.where((steps > w.start_step) & (steps <= w.end_step))[0]
            before = np.where(steps <= w.start_step)[0]
            after = np.where(steps > w.end_step)[0]
            start_inside = end_after = False
            if len(before):
                i0 = int(before[-1])
            elif len(inside) >= 2:
                i0, start_inside = int(inside[0]), True
                inside = inside[1:]
            else:
                i0 = None
            if len(inside):
                i1 = int(inside[-1])
            elif len(after) and i0 is not None:
                i1, end_after = int(after[0]), True
            else:
                i1 = None
            base = {"track": track, "family": g["family"].iloc[0], "variant": g["variant"].iloc[0], "metric": metric,
                    "window": w.name, "planted": w.planted, "start_step": w.start_step, "end_step": w.end_step,
                    "n_checkpoints_in_window": int(((steps > w.start_step) & (steps <= w.end_step)).sum())}
            if i0 is None or i1 is None or i1 <= i0:
                track_rows.append(base | {"start_inside": start_inside, "end_after_window": end_after})
                continue
            change = float(vals[i1] - vals[i0])
            seg = vals[i0 + 1: i1 + 1]
            worst = float(seg.min() - vals[i0])
            noise = float(math.sqrt(sds[i0] ** 2 + sds[i1] ** 2)) if np.isfinite(sds[[i0, i1]]).all() else float("nan")
            z = change / noise if np.isfinite(noise) and noise > 0 else float("nan")
            prior = float(vals[i0] - vals[0])
            undone = max(0.0, -change) / prior if prior > 0 else float("nan")
            beyond = (z <= -z_threshold) if np.isfinite(z) else (prior > 0 and -change > rel_threshold * prior)
            later = vals[i1 + 1:]
            recovered = (bool((later >= vals[i0]).any()) if len(later) else float("nan")) if change < 0 else float("nan")
            track_rows.append(base | {
                "start_checkpoint": names[i0], "end_checkpoint": names[i1], "start_inside": start_inside,
                "end_after_window": end_after, "start_value": float(sign * vals[i0]), "end_value": float(sign * vals[i1]),
                "change": change, "worst_change": worst, "noise_sd": noise, "change_z": z, "prior_gain": prior,
                "undone_fraction": undone, "undoes_gains": bool(change < 0 and prior > 0 and beyond),
                "recovered_after": recovered, "_beyond": bool(change < 0 and beyond)})
        measured = [r for r in track_rows if "change" in r]
        order = sorted(measured, key=lambda r: r["change"])
        for rank, r in enumerate(order, 1):
            r["harm_rank"] = rank
            r["most_harmful"] = bool(rank == 1 and r["_beyond"])
        for r in track_rows:
            r.pop("_beyond", None)
        rows += track_rows
    out = pd.DataFrame(rows).reindex(columns=ATTRIBUTION_COLUMNS)
    for c in ("start_inside", "end_after_window", "undoes_gains", "most_harmful"):
        out[c] = out[c].fillna(False).astype(bool)
    return out


def family_summary(attr: pd.DataFrame, *, z_threshold: float = 3.0) -> pd.DataFrame:
    """One row per family x metric x window (:data:`FAMILY_COLUMNS`): the mean oriented change
    and z over the family's tracks of that metric (its prompt variants), the number of its tracks that undo earlier gains there, the
    window's harm rank within the family (1 = largest mean loss) and ``most_harmful`` (rank
    1 with a negative mean change whose mean z is <= -z_threshold, or, without noise
    estimates, with a majority of tracks undoing gains)."""
    if attr.empty:
        return pd.DataFrame(columns=FAMILY_COLUMNS)
    rows = []
    for (fam, metric, win), g in attr.groupby(["family", "metric", "window"], sort=False):
        m = g.dropna(subset=["change"])
        rows.append({"family": fam, "metric": metric, "window": win, "planted": g["planted"].iloc[0],
                     "start_step": int(g["start_step"].iloc[0]), "end_step": int(g["end_step"].iloc[0]),
                     "n_tracks": len(m), "mean_change": float(m["change"].mean()) if len(m) else float("nan"),
                     "mean_change_z": float(m["change_z"].mean()) if m["change_z"].notna().any() else float("nan"),
                     "tracks_undoing_gains": int(m["undoes_gains"].sum())})
    out = pd.DataFrame(rows)
    out["harm_rank"] = np.nan
    out["most_harmful"] = False
    for _, g in out.groupby(["family", "metric"], sort=False):
        g = g.dropna(subset=["mean_change"]).sort_values("mean_change", kind="stable")
        for rank, idx in enumerate(g.index, 1):
            out.loc[idx, "harm_rank"] = rank
        if len(g):
            top = g.iloc[0]
            z = top["mean_change_z"]
            beyond = (z <= -z_threshold) if np.isfinite(z) else top["tracks_undoing_gains"] * 2 > top["n_tracks"]
            out.loc[g.index[0], "most_harmful"] = bool(top["mean_change"] < 0 and beyond)
    return out.reindex(columns=FAMILY_COLUMNS)


def write_attribution(run_dir: str | Path, lineage: str | Path | None = None, *,
                      trajectories: pd.DataFrame | None = None, z_threshold: float = 3.0) -> dict[str, Any] | None:
    """Attribute the run's tracks to its data windows and write ``RUN/dynamics/attribution.csv``
    and ``attribution_families.csv``.

    ``lineage``: a ``data_lineage.json`` or window CSV; None = :func:`find_lineage` (and
    nothing is written, None returned, when there is none). ``trajectories`` defaults to
    ``RUN/dynamics/trajectories.csv`` (run ``probeselect dynamics`` first). Returns
    ``{"lineage": path, "tracks": DataFrame, "families": DataFrame, "files": [...]}``.
    """
    run = Path(run_dir)
    path = Path(lineage) if lineage is not None else find_lineage(run)
    if path is None:
        return None
    windows = load_windows(path)
    if trajectories is None:
        tp = run / "dynamics" / "trajectories.csv"
        if not tp.is_file():
            raise AttributionError(f"{tp}: not found; run `probeselect dynamics {run}` first.")
        trajectories = pd.read_csv(tp)
    attr = attribute(trajectories, windows, z_threshold=z_threshold)
    fam = family_summary(attr, z_threshold=z_threshold)
    out = run / "dynamics"
    atomic_write_csv(out / "attribution.csv", attr)
    atomic_write_csv(out / "attribution_families.csv", fam)
    return {"lineage": str(path), "tracks": attr, "families": fam,
            "files": [str(out / "attribution.csv"), str(out / "attribution_families.csv")]}
