"""The selection plan's final-comparison part and the plan lock that makes it predeclared.

A selection plan (``recipes/selection.yaml``) has two parts. The shortlist part
(``proxies``, ``constraints``, ``aggregation``, ``k``) is read by
:mod:`probeselect.shortlist`. The ``selection:`` block, read here, fixes the final
comparison after matched pilot SFT::

    selection:
      primary: {metric: task_accuracy, direction: higher}   # a transfer.csv metric
      constraints:                                          # on seed-mean transfer values
        - {metric: robust_recovery, min: 0.25}
        - {metric: termination, min: 0.5}
      decision: {tie_margin: 0.02}      # in the primary metric's units; interval: seeds | seeds+items;
                                        # against: latest | lowest_bpb (verdict beats_default; select.py);
                                        # confirm_margin: the margin the confirmation's interval must clear
                                        # when it re-tests the pilot's claim (default: tie_margin; confirm.py)
      uncertainty: {bootstrap: 2000, seed: 0, level: 0.95}
      selection_effect: {random_proxies: null}   # M random proxies; null = the number declared

Lock. ``lock_plan(plan, run_dir)`` writes ``run_dir/plan.lock.json``: the plan's sha256,
a copy of its text, the UTC time, and every file in ``run_dir`` (except the scoring
``cache/``) with its size and sha256. :func:`check_lock` compares a plan with the lock
and returns the reasons a selection would be **post-hoc**:

* the plan's content changed after the lock (a different sha256);
* outcome files already existed at lock time: any ``transfer*.csv`` / ``transfer*.parquet``
  anywhere in the run, ``diagnostics.csv`` or ``done.json`` under ``pilot/`` or
  ``confirm/``, or ``selection.json`` / ``selection.csv`` / ``confirm.json``.

Locking again is refused. ``force=True`` replaces the lock and keeps the old record under
``previous_locks``; a replacement taken after results exist lists them as outcome files, so
a lock cannot be quietly moved past the results it should precede.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._io import atomic_write_json, sha256_bytes, sha256_file
from ._yaml import load_yaml
from .errors import ProbeselectError, ProbeSpecError, SelectionError, did_you_mean
from .manifest import git_state
from .metrics import DIRECTIONS, TRANSFER_METRIC_NAMES, WEIGHTED_METRICS, direction_word

__all__ = ["TransferConstraint", "SelectionSpec", "SelectionPlan", "LockStatus", "load_selection_plan",
           "selection_spec_from_dict", "lock_plan", "read_lock", "check_lock", "LOCK_NAME", "TRANSFER_METRICS",
           "is_outcome_file", "validate_plan_against_run", "proxy_null_strength", "Plan", "Proxy", "Floor",
           "plan_from_dict", "load_plan", "AGGREGATIONS", "min_p_best_of_m", "smallest_beatable_k",
           "max_beatable_candidates", "step_strata", "run_strata", "run_window_ends", "BPB_MODES",
           "SHORTLIST_REFERENCES"]

LOCK_NAME = "plan.lock.json"
SHORTLIST_FILES = ("shortlist.csv", "shortlist.json")
# Transfer metrics of probeselect.transfer and their direction (contract; other metric names need `direction`).
TRANSFER_METRICS = {m: direction_word(m) for m in TRANSFER_METRIC_NAMES}
INTERVALS = ("seeds", "seeds+items")  # selection.decision.interval
_SELECTION_KEYS = ("primary", "constraints", "decision", "uncertainty", "selection_effect", "min_sft_seeds")
_SKIP_DIRS = {"cache"}  # the scoring cache: derived parts, not results

# The shortlist part of the plan (proxies, constraints, aggregation, k; used by probeselect.shortlist).
AGGREGATIONS = ("mean_rank", "median_rank")
# `selection:` (primary transfer metric, constraints, decision rule) is validated by selection_spec_from_dict.
_PLAN_KEYS = ("proxies", "constraints", "aggregation", "k", "candidates", "description", "selection", "stratify",
              "references")
#: The naive choices a plan can pilot next to its shortlist (``references:``): the latest candidate
#: (highest step) and the candidate with the lowest held-out bits per byte.
REFERENCES = ("latest", "lowest_bpb")
#: What a plan's ``references:`` may name: the naive choices, and ``window_ends`` (the last candidate of every data
#: window of ``data_lineage.json``: the base before each change of the data mixture, e.g. the last before an
#: anneal). Window ends are piloted, never a default to beat (``selection.decision.against`` and the
#: confirmation's references stay :data:`REFERENCES`).
SHORTLIST_REFERENCES = REFERENCES + ("window_ends",)
STRATIFY = (None, "data_windows")      # or a mapping {by: steps|tokens, strata: N} / {by: ..., edges: [...]}
STRATA_BY = ("steps", "tokens")
_STRATIFY_KEYS = ("by", "strata", "edges")
BPB_MODES = ("absolute", "relative", "spread")
_PROXY_KEYS = ("family", "variant", "metric", "direction")
_CONSTRAINT_KEYS = ("heldout_bpb_within", "capability_floor")
_FLOOR_KEYS = ("family", "variant", "metric", "min")
_NON_METRICS = {"step", "tokens", "n_items", "n_seeds"}


@dataclass(frozen=True)
class Proxy:
    """One ranking proxy: ``metric`` of ``family`` / ``variant`` (``"*"`` = every variant)."""

    family: str
    variant: str
    metric: str
    direction: str

    @property
    def id(self) -> str:
        return f"{self.family}/{self.variant}:{self.metric}"


@dataclass(frozen=True)
class Floor:
    """A capability floor: ``metric`` of ``family`` (one variant or the mean) must be >= ``min``."""

    family: str
    variant: str | None
    metric: str
    min: float

    @property
    def id(self) -> str:
        return f"{self.family}/{self.variant or '*'}:{self.metric}"


@dataclass(frozen=True)
class Plan:
    """A validated selection plan (see the module docstring)."""

    proxies: tuple[Proxy, ...]
    heldout_bpb_within: float | None = None
    floors: tuple[Floor, ...] = ()
    aggregation: str = "mean_rank"
    k: int = 3
    candidates: tuple[str | int, ...] | None = None
    description: str = ""
    path: Path | None = None
    stratify: str | None = None          # None | "data_windows" | "steps" | "tokens"
    strata: int | None = None            # stratify by steps/tokens: N contiguous groups of the candidates
    strata_edges: tuple[float, ...] | None = None  # ... or explicit boundaries (start < x <= end)
    heldout_bpb_mode: str = "absolute"   # how heldout_bpb_within is read (BPB_MODES)
    references: tuple[str, ...] = ()     # bases piloted next to the shortlist (SHORTLIST_REFERENCES)

    def to_dict(self) -> dict[str, Any]:
        bpb: Any = self.heldout_bpb_within
        if self.heldout_bpb_mode != "absolute":
            bpb = {self.heldout_bpb_mode: self.heldout_bpb_within}
        strat: Any = self.stratify
        if self.stratify in STRATA_BY:
            strat = {"by": self.stratify} | ({"strata": self.strata} if self.strata is not None else
                                             {"edges": list(self.strata_edges or ())})
        return {
            "proxies": [vars(p) | {"id": p.id} for p in self.proxies],
            "constraints": {"heldout_bpb_within": bpb,
                            "capability_floor": [vars(f) for f in self.floors]},
            "aggregation": self.aggregation,
            "k": self.k,
            "candidates": list(self.candidates) if self.candidates is not None else None,
            "description": self.description,
            "stratify": strat,
            **({"references": list(self.references)} if self.references else {}),
            "path": str(self.path) if self.path else None,
        }


# ---------------------------------------------------------------------------
# The shortlist part: proxies, constraints, aggregation, k (read by probeselect.shortlist)
# ---------------------------------------------------------------------------


def _unknown(src: str, where: str, raw: dict, allowed) -> None:
    extra = [k for k in raw if k not in allowed]
    if extra:
        bad = str(extra[0])
        raise ProbeSpecError(f"{src}: {where}unknown key {bad!r}.{did_you_mean(bad, allowed)} "
                             f"Allowed keys: {list(allowed)}.")


def _number(src: str, where: str, value: Any, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ProbeSpecError(f"{src}: {where} must be a number, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ProbeSpecError(f"{src}: {where} must be >= {minimum}, got {value!r}.")
    return float(value)


def plan_from_dict(raw: Any, *, source: str = "<plan>", path: Path | None = None) -> Plan:
    """Validate a raw mapping into a :class:`Plan` (run-independent checks only)."""
    src = source
    if not isinstance(raw, dict):
        raise ProbeSpecError(f"{src}: a selection plan must be a YAML mapping with `proxies:` (see recipes/selection.yaml).")
    _unknown(src, "", raw, _PLAN_KEYS)
    proxies_raw = raw.get("proxies")
    if not isinstance(proxies_raw, list) or not proxies_raw:
        raise ProbeSpecError(f"{src}: `proxies:` must be a non-empty list of {{family, variant, metric, direction}}.")
    proxies = []
    for i, p in enumerate(proxies_raw):
        where = f"proxies[{i}]: "
        if not isinstance(p, dict):
            raise ProbeSpecError(f"{src}: {where}must be a mapping like {{family: arith_pattern, metric: mean_margin}}.")
        _unknown(src, where, p, _PROXY_KEYS)
        for key in ("family", "metric"):
            if not isinstance(p.get(key), str) or not p[key]:
                raise ProbeSpecError(f"{src}: {where}missing required key `{key}`.")
        metric = p["metric"]
        try:
            known = direction_word(metric)
        except ProbeselectError:
            known = None
        direction = p.get("direction", known)
        if direction is None:
            raise ProbeSpecError(f"{src}: {where}metric {metric!r} has no known direction; add `direction: higher` or "
                                 "`direction: lower`.")
        if direction not in ("higher", "lower"):
            raise ProbeSpecError(f"{src}: {where}direction must be 'higher' or 'lower', got {direction!r}.")
        if known is not None and direction != known:
            raise ProbeSpecError(f"{src}: {where}direction {direction!r} contradicts {metric!r}, for which {known} is "
                                 f"better; drop `direction:` (known directions: {sorted(DIRECTIONS)}).")
        variant = p.get("variant", "*")
        proxies.append(Proxy(family=p["family"], variant=str(variant), metric=metric, direction=direction))
    ids = [p.id for p in proxies]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ProbeSpecError(f"{src}: proxy {dup[0]!r} is listed twice; drop one.")
    if len(proxies) < 2:
        raise ProbeSpecError(f"{src}: only one proxy ({ids[0]}); a shortlist on one probe cannot detect a one-probe "
                             "winner. Add a second family (e.g. a capability track) to `proxies:`.")
    cons = raw.get("constraints") or {}
    if not isinstance(cons, dict):
        raise ProbeSpecError(f"{src}: `constraints:` must be a mapping (heldout_bpb_within, capability_floor).")
    _unknown(src, "constraints: ", cons, _CONSTRAINT_KEYS)
    bpb, bpb_mode = _bpb_within(src, cons.get("heldout_bpb_within"))
    floors_raw = cons.get("capability_floor") or []
    if isinstance(floors_raw, dict):
        floors_raw = [floors_raw]
    if not isinstance(floors_raw, list):
        raise ProbeSpecError(f"{src}: constraints.capability_floor must be a list of {{family, metric, min}}.")
    floors = []
    for i, f in enumerate(floors_raw):
        where = f"constraints.capability_floor[{i}]: "
        if not isinstance(f, dict):
            raise ProbeSpecError(f"{src}: {where}must be a mapping like {{family: arith_plain, metric: candidate_accuracy, min: 0.5}}.")
        _unknown(src, where, f, _FLOOR_KEYS)
        for key in ("family", "metric", "min"):
            if key not in f:
                raise ProbeSpecError(f"{src}: {where}missing required key `{key}`.")
        variant = f.get("variant")
        floors.append(Floor(family=str(f["family"]), variant=None if variant in (None, "*") else str(variant),
                            metric=str(f["metric"]), min=_number(src, where + "min", f["min"])))
    agg = raw.get("aggregation", "mean_rank")
    if agg not in AGGREGATIONS:
        raise ProbeSpecError(f"{src}: aggregation {agg!r} is not supported.{did_you_mean(str(agg), AGGREGATIONS)} "
                             f"Choose one of {list(AGGREGATIONS)}.")
    k = raw.get("k", 3)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProbeSpecError(f"{src}: k must be a positive integer, got {k!r}.")
    cands = raw.get("candidates")
    if cands is not None:
        if not isinstance(cands, list) or not cands or not all(isinstance(c, (str, int)) for c in cands):
            raise ProbeSpecError(f"{src}: candidates must be a non-empty list of checkpoint names (or steps).")
        cands = tuple(cands)
    desc = raw.get("description", "")
    strat, n_strata, edges = _stratify(src, raw.get("stratify"))
    refs = raw.get("references") or []
    if not isinstance(refs, list) or any(r not in SHORTLIST_REFERENCES for r in refs) or len(set(refs)) != len(refs):
        bad = next((r for r in refs if r not in SHORTLIST_REFERENCES), None) if isinstance(refs, list) else None
        raise ProbeSpecError(f"{src}: references must be a list of distinct naive choices or window_ends, from "
                             f"{list(SHORTLIST_REFERENCES)} (piloted next to the shortlist), got {refs!r}."
                             + (did_you_mean(str(bad), SHORTLIST_REFERENCES) if bad is not None else ""))
    return Plan(proxies=tuple(proxies), heldout_bpb_within=bpb, floors=tuple(floors), aggregation=agg, k=k,
                candidates=cands, description=str(desc or ""), path=path, stratify=strat, strata=n_strata,
                strata_edges=edges, heldout_bpb_mode=bpb_mode, references=tuple(refs))


def _bpb_within(src: str, raw: Any) -> tuple[float | None, str]:
    """``constraints.heldout_bpb_within``: a number (absolute bits/byte above the best
    candidate) or one of ``{absolute: d}``, ``{relative: r}`` (within r x the best, e.g. 0.01
    = 1%), ``{spread: f}`` (within f x the candidates' range of held-out bpb, 0 <= f <= 1)."""
    if raw is None:
        return None, "absolute"
    if not isinstance(raw, dict):
        return _number(src, "constraints.heldout_bpb_within", raw, minimum=0.0), "absolute"
    if len(raw) != 1 or next(iter(raw)) not in BPB_MODES:
        raise ProbeSpecError(f"{src}: constraints.heldout_bpb_within must be a number (absolute bits/byte) or one of "
                             "{absolute: 0.05}, {relative: 0.01} (1% of the best candidate's bpb), {spread: 0.25} "
                             f"(25% of the candidates' bpb range); got {raw!r}."
                             + (did_you_mean(str(next(iter(raw))), BPB_MODES) if len(raw) == 1 else ""))
    mode, value = next(iter(raw.items()))
    v = _number(src, f"constraints.heldout_bpb_within.{mode}", value, minimum=0.0)
    if mode == "spread" and v > 1:
        raise ProbeSpecError(f"{src}: constraints.heldout_bpb_within.spread is a fraction of the candidates' range "
                             f"(0 = only the best, 1 = every candidate), got {v:g}.")
    return v, mode


def _stratify(src: str, raw: Any) -> tuple[str | None, int | None, tuple[float, ...] | None]:
    """``stratify:``: null, ``data_windows`` (needs data_lineage.json), or ``{by: steps|tokens,
    strata: N}`` / ``{by: steps|tokens, edges: [e1, e2, ...]}`` (see probeselect.shortlist)."""
    hint = ("stratify must be null, 'data_windows' (a ladder with data_lineage.json) or a mapping "
            "{by: steps, strata: 3} / {by: tokens, edges: [1.0e9, 2.0e9]}")
    if raw is None or raw == "data_windows":
        return raw, None, None
    if isinstance(raw, str):
        raise ProbeSpecError(f"{src}: {hint}; got {raw!r}.{did_you_mean(raw, ['data_windows', 'steps', 'tokens'])}")
    if not isinstance(raw, dict):
        raise ProbeSpecError(f"{src}: {hint}; got {raw!r}.")
    _unknown(src, "stratify: ", raw, _STRATIFY_KEYS)
    by = raw.get("by", "steps")
    if by not in STRATA_BY:
        raise ProbeSpecError(f"{src}: stratify.by must be one of {list(STRATA_BY)}, got {by!r}.{did_you_mean(str(by), STRATA_BY)}")
    if ("strata" in raw) == ("edges" in raw):
        raise ProbeSpecError(f"{src}: stratify needs exactly one of `strata: N` (N contiguous groups of the candidates "
                             f"in {by} order) or `edges: [...]` ({by} boundaries); got {raw!r}.")
    if "strata" in raw:
        n = raw["strata"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ProbeSpecError(f"{src}: stratify.strata must be an integer >= 2, got {n!r}.")
        return by, n, None
    edges = raw["edges"]
    if not isinstance(edges, list) or not edges:
        raise ProbeSpecError(f"{src}: stratify.edges must be a non-empty list of {by} boundaries, got {edges!r}.")
    vals = tuple(_number(src, f"stratify.edges[{i}]", e) for i, e in enumerate(edges))
    if any(b <= a for a, b in zip(vals, vals[1:])):
        raise ProbeSpecError(f"{src}: stratify.edges must be strictly increasing, got {list(edges)}.")
    return by, None, vals


def step_strata(plan: Plan, cands: list[str], steps: dict[str, Any], tokens: dict[str, Any], src: str) -> dict[str, str]:
    """The stratum of every candidate under ``stratify: {by: steps|tokens, ...}``.

    ``strata: N``: the candidates sorted by step (or tokens) are cut into N contiguous groups
    as equal in size as possible (earlier groups take the extra ones); ``edges: [e1, ...]``:
    the ranges x <= e1, e1 < x <= e2, ..., x > e_last (empty ranges are no strata). Only the
    ladder's positions are used, never a score, so the strata are fixed when the plan is.
    Labels read like ``steps 1000-3000``. Raises :class:`ProbeSpecError` when a candidate has
    no step/tokens value or N exceeds the number of candidates.
    """
    by = plan.stratify
    where = steps if by == "steps" else tokens
    pos: dict[str, float] = {}
    for c in cands:
        v = where.get(c)
        if v is None or not pd.notna(v):
            raise ProbeSpecError(f"{src}: stratify by {by}: checkpoint {c!r} has no {by[:-1]} value in summary.csv"
                                 + ("; use `by: steps`, or record tokens when scoring." if by == "tokens" else
                                    "; name the checkpoints with their step (e.g. step1000) or drop `stratify:`."))
        pos[c] = float(v)
    ordered = sorted(cands, key=lambda c: (pos[c], c))
    groups: list[list[str]] = []
    if plan.strata is not None:
        if plan.strata > len(ordered):
            raise ProbeSpecError(f"{src}: stratify.strata = {plan.strata} but the run has {len(ordered)} candidate "
                                 f"checkpoint(s); use at most {len(ordered)} strata.")
        for part in np.array_split(np.arange(len(ordered)), plan.strata):
            groups.append([ordered[i] for i in part])
    else:
        edges = list(plan.strata_edges or ())
        bounds = [-math.inf] + edges + [math.inf]
        for lo, hi in zip(bounds, bounds[1:]):
            g = [c for c in ordered if lo < pos[c] <= hi]
            if g:
                groups.append(g)

    def num(x: float) -> str:
        return f"{x:.4g}" if by == "tokens" else f"{x:g}"

    out = {}
    for g in groups:
        a, b = pos[g[0]], pos[g[-1]]
        label = f"{by} {num(a)}" if a == b else f"{by} {num(a)}-{num(b)}"
        for c in g:
            out[c] = label
    return out


def load_plan(path: str | Path) -> Plan:
    """Read and validate a selection plan YAML (duplicate keys are an error)."""
    path = Path(path)
    return plan_from_dict(load_yaml(path), source=str(path), path=path)


@dataclass(frozen=True)
class TransferConstraint:
    """``metric`` (seed mean over the pilot runs of a base) must be >= ``min`` and/or <= ``max``."""

    metric: str
    min: float | None = None
    max: float | None = None

    @property
    def id(self) -> str:
        parts = ([f">= {self.min:g}"] if self.min is not None else []) + ([f"<= {self.max:g}"] if self.max is not None else [])
        return f"{self.metric} {' and '.join(parts)}"

    def passes(self, value: float) -> bool:
        if value is None or value != value:  # NaN
            return False
        return (self.min is None or value >= self.min - 1e-12) and (self.max is None or value <= self.max + 1e-12)


@dataclass(frozen=True)
class SelectionSpec:
    """The final-comparison part of a plan (see the module docstring)."""

    primary: str = "task_accuracy"
    direction: str = "higher"
    constraints: tuple[TransferConstraint, ...] = ()
    tie_margin: float = 0.0
    bootstrap: int = 2000
    seed: int = 0
    level: float = 0.95
    random_proxies: int | None = None
    min_sft_seeds: int = 3
    interval: str = "seeds"  # "seeds" | "seeds+items" (selection.decision.interval; see probeselect.select)
    against: str | None = None  # selection.decision.against: a naive choice (REFERENCES) the top may be shown
    #                             better than without beating every other base (verdict beats_default)
    confirm_margin: float | None = None  # selection.decision.confirm_margin: the margin the confirmation must
    #                                      clear when it re-tests a claim the pilot made (None = tie_margin)

    def to_dict(self) -> dict[str, Any]:
        return {"primary": {"metric": self.primary, "direction": self.direction},
                "constraints": [{"metric": c.metric, "min": c.min, "max": c.max} for c in self.constraints],
                # the interval key only when it is not the default, so that the outputs of plans
                # written before it existed stay byte-identical
                "decision": {"rule": "interval_above_margin", "tie_margin": self.tie_margin,
                             **({"interval": self.interval} if self.interval != "seeds" else {}),
                             **({"against": self.against} if self.against else {}),
                             **({"confirm_margin": self.confirm_margin} if self.confirm_margin is not None else {})},
                "uncertainty": {"bootstrap": self.bootstrap, "seed": self.seed, "level": self.level},
                "selection_effect": {"random_proxies": self.random_proxies},
                "min_sft_seeds": self.min_sft_seeds}


@dataclass(frozen=True)
class SelectionPlan:
    """A whole plan file: its shortlist part, its selection part, and its identity."""

    shortlist: Plan
    selection: SelectionSpec
    path: Path
    sha256: str
    text: str
    declared: bool = True  # False when the file has no `selection:` block (defaults were used)


def _num(src: str, where: str, v: Any, *, minimum: float | None = None, integer: bool = False) -> Any:
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
    if integer:
        ok = ok and float(v).is_integer()
    if not ok:
        raise ProbeSpecError(f"{src}: {where} must be {'an integer' if integer else 'a number'}, got {v!r}.")
    if minimum is not None and v < minimum:
        raise ProbeSpecError(f"{src}: {where} must be >= {minimum}, got {v!r}.")
    return int(v) if integer else float(v)


def _only(src: str, where: str, raw: dict, allowed) -> None:
    for k in raw:
        if k not in allowed:
            raise ProbeSpecError(f"{src}: {where}unknown key {k!r}.{did_you_mean(str(k), allowed)} "
                                 f"Allowed keys: {list(allowed)}.")


def selection_spec_from_dict(raw: Any, *, source: str = "<plan>") -> SelectionSpec:
    """Validate the ``selection:`` block (run-independent checks only)."""
    src = source
    if raw is None:
        return SelectionSpec()
    if not isinstance(raw, dict):
        raise ProbeSpecError(f"{src}: `selection:` must be a mapping with primary/constraints/decision.")
    _only(src, "selection: ", raw, _SELECTION_KEYS)
    prim = raw.get("primary", {"metric": "task_accuracy"})
    if isinstance(prim, str):
        prim = {"metric": prim}
    if not isinstance(prim, dict) or not isinstance(prim.get("metric"), str):
        raise ProbeSpecError(f"{src}: selection.primary must be {{metric: NAME, direction: higher|lower}}; "
                             f"metrics: {list(TRANSFER_METRICS)}.")
    _only(src, "selection.primary: ", prim, ("metric", "direction"))
    metric = prim["metric"]
    direction = prim.get("direction", TRANSFER_METRICS.get(metric))
    if direction is None:
        raise ProbeSpecError(f"{src}: selection.primary: {metric!r} is not a built-in transfer metric "
                             f"({list(TRANSFER_METRICS)}){did_you_mean(metric, TRANSFER_METRICS)}; give its "
                             "`direction: higher|lower` explicitly.")
    if direction not in ("higher", "lower"):
        raise ProbeSpecError(f"{src}: selection.primary.direction must be 'higher' or 'lower', got {direction!r}.")
    cons_raw = raw.get("constraints") or []
    if not isinstance(cons_raw, list):
        raise ProbeSpecError(f"{src}: selection.constraints must be a list of {{metric, min}} / {{metric, max}}.")
    cons = []
    for i, c in enumerate(cons_raw):
        where = f"selection.constraints[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("metric"), str):
            raise ProbeSpecError(f"{src}: {where} must be a mapping like {{metric: termination, min: 0.5}}.")
        _only(src, f"{where}: ", c, ("metric", "min", "max"))
        if c.get("min") is None and c.get("max") is None:
            raise ProbeSpecError(f"{src}: {where} ({c['metric']}) needs `min:` or `max:`.")
        cons.append(TransferConstraint(
            metric=c["metric"],
            min=None if c.get("min") is None else _num(src, f"{where}.min", c["min"]),
            max=None if c.get("max") is None else _num(src, f"{where}.max", c["max"])))
    dec = raw.get("decision") or {}
    if not isinstance(dec, dict):
        raise ProbeSpecError(f"{src}: selection.decision must be a mapping like {{tie_margin: 0.02}}.")
    _only(src, "selection.decision: ", dec, ("rule", "tie_margin", "interval", "against", "confirm_margin"))
    if dec.get("rule", "interval_above_margin") != "interval_above_margin":
        raise ProbeSpecError(f"{src}: selection.decision.rule: only 'interval_above_margin' is defined "
                             f"(got {dec.get('rule')!r}).")
    interval = dec.get("interval", "seeds")
    if interval not in INTERVALS:
        raise ProbeSpecError(f"{src}: selection.decision.interval must be one of {list(INTERVALS)} "
                             f"(got {interval!r}): 'seeds' generalises over SFT seeds on the piloted items, "
                             "'seeds+items' also over a new draw of transfer items.")
    if interval == "seeds+items" and metric in WEIGHTED_METRICS:
        raise ProbeSpecError(f"{src}: selection.decision.interval 'seeds+items' needs a primary metric whose seed "
                             f"value is the item mean; {metric!r} is token/byte weighted. Use `interval: seeds` or "
                             "an item-mean metric such as task_accuracy.")
    tie = _num(src, "selection.decision.tie_margin", dec.get("tie_margin", 0.0), minimum=0.0)
    against = dec.get("against")
    if against is not None and against not in REFERENCES:
        raise ProbeSpecError(f"{src}: selection.decision.against must be one of {list(REFERENCES)} (the default a team "
                             f"would post-train) or absent, got {against!r}.")
    cm = dec.get("confirm_margin")
    cm = None if cm is None else _num(src, "selection.decision.confirm_margin", cm, minimum=0.0)
    if cm is not None and cm > tie:
        raise ProbeSpecError(f"{src}: selection.decision.confirm_margin ({cm}) is above tie_margin ({tie}): the "
                             "confirmation re-tests a claim the pilot made with tie_margin, so its margin is at most "
                             "that (0 = the claim must not reverse). Lower it or remove the key.")
    unc = raw.get("uncertainty") or {}
    if not isinstance(unc, dict):
        raise ProbeSpecError(f"{src}: selection.uncertainty must be a mapping like {{bootstrap: 2000, seed: 0}}.")
    _only(src, "selection.uncertainty: ", unc, ("bootstrap", "seed", "level"))
    boot = _num(src, "selection.uncertainty.bootstrap", unc.get("bootstrap", 2000), minimum=100, integer=True)
    seed = _num(src, "selection.uncertainty.seed", unc.get("seed", 0), minimum=0, integer=True)
    level = _num(src, "selection.uncertainty.level", unc.get("level", 0.95))
    if not 0.5 <= level < 1:
        raise ProbeSpecError(f"{src}: selection.uncertainty.level must be in [0.5, 1), got {level}.")
    null = raw.get("selection_effect") or {}
    if not isinstance(null, dict):
        raise ProbeSpecError(f"{src}: selection.selection_effect must be a mapping like {{random_proxies: 4}}.")
    _only(src, "selection.selection_effect: ", null, ("random_proxies",))
    m = null.get("random_proxies")
    m = None if m is None else _num(src, "selection.selection_effect.random_proxies", m, minimum=1, integer=True)
    min_seeds = _num(src, "selection.min_sft_seeds", raw.get("min_sft_seeds", 3), minimum=2, integer=True)
    return SelectionSpec(primary=metric, direction=direction, constraints=tuple(cons), tie_margin=tie,
                         bootstrap=boot, seed=seed, level=level, random_proxies=m, min_sft_seeds=min_seeds,
                         interval=interval, against=against, confirm_margin=cm)


def load_selection_plan(path: str | Path) -> SelectionPlan:
    """Read a plan file: validate both parts and record its sha256 and text."""
    path = Path(path)
    raw = load_yaml(path)
    sl = plan_from_dict(raw, source=str(path), path=path)
    sel_raw = raw.get("selection") if isinstance(raw, dict) else None
    sel = selection_spec_from_dict(sel_raw, source=str(path))
    data = path.read_bytes()
    return SelectionPlan(shortlist=sl, selection=sel, path=path, sha256=sha256_bytes(data),
                         text=data.decode("utf-8"), declared=sel_raw is not None)


# ---------------------------------------------------------------------------
# Validation against what the run can produce (at lock)
# ---------------------------------------------------------------------------


def _check_against_run(plan: Plan, summary: pd.DataFrame, src: str) -> None:
    families = list(dict.fromkeys(summary["family"].astype(str)))
    for what, items in (("proxy", plan.proxies), ("capability floor", plan.floors)):
        for p in items:
            if p.family not in families:
                raise ProbeSpecError(f"{src}: {what} {p.id}: family {p.family!r} is not in this run.{did_you_mean(p.family, families)} "
                                     f"Families in the run: {families}. Score it first or fix the plan.")
            fam_rows = summary[summary["family"] == p.family]
            variants = list(dict.fromkeys(fam_rows["variant"].astype(str)))
            if p.variant not in (None, "*") and p.variant not in variants:
                raise ProbeSpecError(f"{src}: {what} {p.id}: family {p.family!r} has no variant {p.variant!r} in this run."
                                     f"{did_you_mean(p.variant, variants)} Variants in the run: {variants}.")
            numeric = [c for c in summary.columns if pd.api.types.is_numeric_dtype(summary[c]) and c not in _NON_METRICS]
            if p.metric not in numeric:
                raise ProbeSpecError(f"{src}: {what} {p.id}: metric {p.metric!r} is not a numeric summary.csv column."
                                     f"{did_you_mean(p.metric, numeric)} Available: {numeric}.")
            if fam_rows[p.metric].isna().all():
                raise ProbeSpecError(f"{src}: {what} {p.id}: the run has no {p.metric} values for family {p.family!r}; "
                                     "pick a metric this family records.")


def _resolve_candidates(plan: Plan, order: list[str], steps: dict[str, Any], src: str) -> list[str]:
    if plan.candidates is None:
        return list(order)
    by_step = {int(s): c for c, s in steps.items() if pd.notna(s)}
    out = []
    for c in plan.candidates:
        if isinstance(c, int) and c in by_step:
            out.append(by_step[c])
        elif str(c) in order:
            out.append(str(c))
        else:
            raise ProbeSpecError(f"{src}: candidate {c!r} is not a checkpoint of this run.{did_you_mean(str(c), order)} "
                                 f"Checkpoints: {order}.")
    return [c for c in order if c in set(out)]


def validate_plan_against_run(plan: SelectionPlan, run_dir: Path, *, recipe: Any = None) -> list[str]:
    """Check every name in ``plan`` against what the run can produce; return warnings.

    Shortlist part (proxies, capability floors, candidates): families, variants and metrics
    must be in the score run's ``summary.csv``. Selection part (primary and constraint
    metrics): they must be transfer metrics (:data:`probeselect.transfer.METRIC_NAMES`) and,
    when the pilot ``recipe`` (a :class:`probeselect.sft.recipe.Recipe`) is given, produced by
    a part of its transfer suite (:data:`probeselect.transfer.METRICS_BY_PART`). Raises
    :class:`ProbeSpecError` naming the plan file, the bad name and the closest valid one.
    """
    from .transfer import METRIC_NAMES, METRICS_BY_PART

    src = str(plan.path)
    summary_path = run_dir / "summary.csv"
    if not summary_path.is_file():
        raise SelectionError(f"{summary_path}: no summary; score the run before locking the plan "
                             f"(`probeselect score ... --out {run_dir}`).")
    summary = pd.read_csv(summary_path)
    _check_against_run(plan.shortlist, summary, src)
    from .dynamics import checkpoint_order

    order = checkpoint_order(summary)
    steps = summary.drop_duplicates("checkpoint").set_index("checkpoint")["step"].to_dict()
    cands = _resolve_candidates(plan.shortlist, order, steps, src)
    run_strata(plan.shortlist, run_dir, summary, cands, src)
    run_window_ends(plan.shortlist, run_dir, summary, cands, src)
    produced = list(METRIC_NAMES)
    why = "a transfer metric"
    if recipe is not None:
        parts = [k for k in METRICS_BY_PART if (recipe.transfer or {}).get(k)]
        produced = [m for k in parts for m in METRICS_BY_PART[k]]
        why = f"produced by the transfer suite of {recipe.source} (parts: {', '.join(parts) or 'none'})"
    sel = plan.selection
    named = [("selection.primary.metric", sel.primary)] + [
        (f"selection.constraints[{i}].metric", c.metric) for i, c in enumerate(sel.constraints)]
    for where, metric in named:
        if metric not in produced:
            raise ProbeSpecError(f"{src}: {where} {metric!r} is not {why}.{did_you_mean(metric, produced)} "
                                 f"Valid: {produced}. Fix the plan and lock again.")
    warnings = []
    if recipe is not None and len(recipe.seeds) < sel.min_sft_seeds:
        warnings.append(f"the pilot recipe {recipe.source} trains {len(recipe.seeds)} SFT seed(s) but the plan asks "
                        f"for selection.min_sft_seeds = {sel.min_sft_seeds}: the selection will name no clear winner. "
                        "Add seeds to the recipe (e.g. seeds=[0,1,2]).")
    return warnings


def run_strata(plan: Plan, run_dir: Path, summary: pd.DataFrame, cands: list[str], src: str) -> dict[str, str] | None:
    """The strata of the plan's ``stratify:`` on this run: checkpoint -> stratum label, or None
    without ``stratify``. ``data_windows`` needs ``data_lineage.json`` next to the scored
    checkpoints (:func:`probeselect.attribution.find_lineage`); without it this is an error that
    names the step-range alternative, never a silent top-k shortlist."""
    if plan.stratify is None:
        return None
    if plan.stratify == "data_windows":
        from .attribution import load_windows

        path = _lineage_or_error(run_dir, src, "stratify: data_windows",
                                 "stratify by step ranges, declared now, before the scores: `stratify: {by: steps, "
                                 "strata: 3}` (or `{by: tokens, edges: [...]}`), or drop `stratify:` for the plain top k")
        windows = load_windows(path)
        info = summary.drop_duplicates("checkpoint").set_index("checkpoint")["step"].to_dict()

        def window_of(c: str) -> str:
            t = info.get(c)
            for w in windows:
                if w.holds(t):
                    return w.name
            return "(no window)"

        return {c: window_of(c) for c in info}  # every checkpoint (shortlist.csv shows each one's window)
    info = summary.drop_duplicates("checkpoint").set_index("checkpoint")
    steps = info["step"].to_dict()
    tokens = info["tokens"].to_dict() if "tokens" in info.columns else {}
    return step_strata(plan, cands, steps, tokens, src)


def _lineage_or_error(run_dir: Path, src: str, what: str, instead: str) -> Path:
    """The run's ``data_lineage.json`` (:func:`probeselect.attribution.find_lineage`), or a
    :class:`ProbeSpecError` naming the plan setting that needs it and what to declare instead."""
    from .attribution import find_lineage

    path = find_lineage(run_dir)
    if path is None:
        raise ProbeSpecError(
            f"{src}: {what} needs data_lineage.json next to the scored checkpoints, and the run {run_dir} has none "
            f"(looked next to the checkpoints named in {Path(run_dir) / 'manifest.json'}). A ladder built from a known "
            "curriculum has one (`probeselect toy-ladder`); for your own run, write it next to the checkpoint folders "
            'from your data schedule: {"windows": [{"name": ..., "start_step": ..., "end_step": ...}, ...]} '
            "(docs/real-checkpoints.md). Without one, " + instead + ".")
    return path


def run_window_ends(plan: Plan, run_dir: Path, summary: pd.DataFrame, cands: list[str],
                    src: str) -> dict[str, str | None] | None:
    """``references: [window_ends]`` on this run (None when the plan does not name it):
    ``"window_end:NAME"`` -> the candidate of the highest step in data window NAME (a checkpoint at
    step t is in the window with start_step < t <= end_step, as for ``stratify: data_windows``), or
    None for a window without a candidate, in window order. The plan's constraints do not apply (a
    reference is piloted whatever its probes and constraints say). Needs ``data_lineage.json`` next to
    the scored checkpoints: without it, an error (at ``plan lock`` and at ``shortlist``), never a
    silent omission."""
    if "window_ends" not in plan.references:
        return None
    from .attribution import load_windows

    path = _lineage_or_error(run_dir, src, "references: [window_ends]", "drop window_ends from `references:`")
    steps = summary.drop_duplicates("checkpoint").set_index("checkpoint")["step"].to_dict()
    out: dict[str, str | None] = {}
    for w in load_windows(path):
        inside = [c for c in cands if w.holds(steps.get(c))]
        out[f"window_end:{w.name}"] = max(inside, key=lambda c: (steps[c], cands.index(c))) if inside else None
    return out


def min_p_best_of_m(n_bases: int, candidates: int) -> float:
    """The smallest best-of-M p-value any proxy can reach with ``n_bases`` piloted bases and
    ``candidates`` candidates without ties: a perfect rank agreement, P = 1 - (1 - 1/n!)^M."""
    return 1.0 - (1.0 - 1.0 / math.factorial(n_bases)) ** candidates


def smallest_beatable_k(candidates: int, alpha: float = 0.05, k_max: int = 12) -> int | None:
    """The smallest shortlist size whose best-of-M null a perfect proxy can beat at ``alpha``."""
    for k in range(2, k_max + 1):
        if min_p_best_of_m(k, candidates) < alpha:
            return k
    return None


def max_beatable_candidates(k: int, alpha: float = 0.05, m_max: int = 1000) -> int:
    """The most candidates (proxies + the aggregate) whose best-of-M null a perfect proxy over
    ``k`` bases still beats at ``alpha`` (0 when not even one can)."""
    m = 0
    while m < m_max and min_p_best_of_m(k, m + 1) < alpha:
        m += 1
    return m


def proxy_null_strength(plan: SelectionPlan, n_candidates: int | None = None) -> dict[str, Any]:
    """Can the best-of-M proxy null be beaten at 95% with the plan's shortlist size?

    Candidates = the declared proxies (or ``selection_effect.random_proxies``) + the
    aggregate. ``min_p``: the best-of-M p-value of a perfect proxy over k bases;
    ``smallest_k``: the smallest k with ``min_p`` < 0.05; ``max_proxies_at_k``: the most
    proxies (plus the aggregate) the plan's k can afford (0: none); ``n_candidates``: the
    checkpoints the run offers (when known). ``designs`` names the plans that can work
    (more bases, fewer proxies, or none on this ladder) and ``message`` says it in one line.
    """
    k = plan.shortlist.k
    n_proxies = plan.selection.random_proxies or len(plan.shortlist.proxies)
    m = n_proxies + 1
    p = min_p_best_of_m(k, m)
    smallest = smallest_beatable_k(m)
    max_at_k = max(max_beatable_candidates(k) - 1, 0)
    # the cheapest design overall: the smallest k at which 2 proxies (the plan minimum) + the aggregate can win
    k_min2 = smallest_beatable_k(3)
    designs: list[str] = []
    if p >= 0.05:
        if smallest is not None and (n_candidates is None or smallest <= n_candidates):
            designs.append(f"k = {smallest} with these {n_proxies} proxies (min p {min_p_best_of_m(smallest, m):.2g})")
        if max_at_k >= 2:
            designs.append(f"k = {k} with at most {max_at_k} proxies (min p {min_p_best_of_m(k, max_at_k + 1):.2g})")
        for kk in range(k + 1, (n_candidates or (smallest or k)) + 1):
            cap = max_beatable_candidates(kk) - 1
            if kk != smallest and 2 <= cap < n_proxies:
                designs.append(f"k = {kk} with at most {cap} proxies (min p {min_p_best_of_m(kk, cap + 1):.2g})")
                break
        if not designs:
            designs.append(
                f"none on this ladder: the run has {n_candidates} candidate checkpoint(s), and even 2 proxies need "
                f"k >= {k_min2} (with {n_proxies}: k >= {smallest}). Score more checkpoints (at least {k_min2}, "
                f"with at most {max_beatable_candidates(k_min2) - 1} proxies), or lock with --allow-weak and read proxy "
                "validation as descriptive only")
    if p < 0.05:
        msg = (f"proxy null: k = {k} bases, {m} candidates looked at ({m - 1} proxies + the aggregate): a perfect proxy "
               f"reaches best-of-M p = {p:.2g} < 0.05, so proxy validation can succeed.")
    else:
        msg = (f"proxy null: k = {k} bases, {m} candidates looked at ({m - 1} proxies + the aggregate): even a perfect "
               f"proxy has best-of-M p >= {p:.2g} > 0.05. "
               + (f"The smallest k that could beat the null is {smallest}" if smallest else "No k up to 12 beats it")
               + (f" (the run has {n_candidates} candidate checkpoints)" if n_candidates is not None else "")
               + ". Designs that can work: " + "; ".join(designs) + ".")
    return {"k": k, "candidates": m, "min_p": p, "alpha": 0.05, "beatable": p < 0.05, "smallest_k": smallest,
            "max_proxies_at_k": max_at_k, "n_candidates": n_candidates, "designs": designs, "message": msg}


# ---------------------------------------------------------------------------
# Lock
# ---------------------------------------------------------------------------


def is_outcome_file(rel: str) -> bool:
    """Whether a run-relative path is a pilot/transfer/selection outcome (module docstring)."""
    parts = Path(rel).parts
    name = parts[-1]
    if name.startswith("transfer") and name.endswith((".csv", ".parquet")):
        return True
    if parts[0] in ("pilot", "confirm") and name in ("diagnostics.csv", "done.json"):
        return True
    return len(parts) == 1 and name in ("selection.json", "selection.csv", "confirm.json")


def _list_files(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for root, dirs, files in os.walk(run_dir):
        rel_root = Path(root).relative_to(run_dir)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        dirs.sort()
        for f in sorted(files):
            rel = (rel_root / f).as_posix()
            if rel == LOCK_NAME or f.startswith(".") and f.endswith(".tmp"):
                continue
            p = Path(root) / f
            out.append({"path": rel, "size": p.stat().st_size, "sha256": sha256_file(p)})
    return out


@dataclass
class LockStatus:
    """What :func:`check_lock` found: ``post_hoc`` with its ``reasons`` (empty when predeclared)."""

    lock: dict[str, Any]
    plan_path: Path
    plan_sha256: str
    reasons: list[str] = field(default_factory=list)

    @property
    def post_hoc(self) -> bool:
        return bool(self.reasons)


def read_lock(run_dir: str | Path) -> dict[str, Any]:
    """The lock record of ``run_dir``; :class:`SelectionError` when there is none."""
    p = Path(run_dir) / LOCK_NAME
    if not p.is_file():
        raise SelectionError(f"{p}: no plan lock. Fix the plan before any pilot result exists and lock it: "
                             f"`probeselect plan lock recipes/selection.yaml --run {run_dir}`.")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SelectionError(f"{p}: not valid JSON ({exc}); the lock is damaged. Restore it from version control.") from None


def lock_plan(plan_path: str | Path, run_dir: str | Path, *, force: bool = False, allow_weak: bool = False,
              recipe: str | Path | None = None, recipe_overrides=()) -> dict[str, Any]:
    """Write ``run_dir/plan.lock.json`` for the plan at ``plan_path`` and return the record.

    Lock after scoring and BEFORE the shortlist. Validates the plan first: its syntax, every
    name in it against the run (:func:`validate_plan_against_run`; the pilot ``recipe``
    with ``recipe_overrides`` when given), and the strength of the proxy null
    (:func:`proxy_null_strength`): a shortlist size whose null no proxy can beat at 95% is
    refused unless ``allow_weak``. Refuses when a lock exists unless ``force`` (the old
    record is kept under ``previous_locks``). The record names the outcome files that already
    existed (``outcome_files_at_lock``) and the shortlist files (``shortlist_files_at_lock``);
    either makes every later selection post-hoc. ``warnings`` lists what the CLI prints.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SelectionError(f"{run_dir}: run folder not found; score first (`probeselect score ... --out {run_dir}`).")
    plan = load_selection_plan(plan_path)
    rec_obj = None
    if recipe is not None:
        from .sft.recipe import load_recipe

        rec_obj = load_recipe(recipe, list(recipe_overrides), check_files=False)
        from .sft.check_data import check_recipe_data

        check_recipe_data(rec_obj)  # every data file of the recipe (sft, heldout, transfer) is read and checked
    warnings = validate_plan_against_run(plan, run_dir, recipe=rec_obj)
    summary = pd.read_csv(run_dir / "summary.csv")
    from .dynamics import checkpoint_order

    order = checkpoint_order(summary)
    steps = summary.drop_duplicates("checkpoint").set_index("checkpoint")["step"].to_dict()
    cands = _resolve_candidates(plan.shortlist, order, steps, str(plan.path))
    strata = run_strata(plan.shortlist, run_dir, summary, cands, str(plan.path))
    window_ends = run_window_ends(plan.shortlist, run_dir, summary, cands, str(plan.path))
    strength = proxy_null_strength(plan, n_candidates=len(cands))
    if not strength["beatable"]:
        msg = (f"{plan.path}: with k = {strength['k']} shortlisted bases and {strength['candidates']} candidates looked at "
               f"({strength['candidates'] - 1} proxies + the aggregate), even a perfect proxy has best-of-M p >= "
               f"{strength['min_p']:.2g} > 0.05: proxy validation cannot succeed. "
               + (f"The smallest k that could beat the null is {strength['smallest_k']}"
                  if strength["smallest_k"] else "No k up to 12 beats it")
               + f" (the run has {len(cands)} candidate checkpoints). Designs that can work: "
               + "; ".join(strength["designs"]))
        if not allow_weak:
            raise SelectionError(msg + ". Change `k:` or `proxies:` accordingly, or pass --allow-weak to lock anyway.")
        warnings.append(msg + " (locked with --allow-weak).")
    lock_path = run_dir / LOCK_NAME
    previous = []
    if lock_path.is_file():
        old = read_lock(run_dir)
        if not force:
            same = old.get("plan_sha256") == plan.sha256
            raise SelectionError(
                f"{lock_path}: the run already has a plan lock from {old.get('locked_utc')} "
                f"({'same plan' if same else 'a DIFFERENT plan'}, sha256 {str(old.get('plan_sha256'))[:12]}). "
                "A lock is taken once, before results exist. Pass --force to replace it; the old record is kept "
                "and a lock taken after pilot results exist marks the selection POST-HOC.")
        previous = list(old.pop("previous_locks", [])) + [old]
    files = _list_files(run_dir)
    outcomes = [f["path"] for f in files if is_outcome_file(f["path"])]
    shortlists = [f["path"] for f in files if f["path"] in SHORTLIST_FILES]
    record = {
        "kind": "plan_lock",
        "locked_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "plan_path": str(plan.path),
        "plan_sha256": plan.sha256,
        "plan_text": plan.text,
        "selection_declared": plan.declared,
        "selection": plan.selection.to_dict(),
        "git": git_state(),
        "files": files,
        "outcome_files_at_lock": outcomes,
        "shortlist_files_at_lock": shortlists,
        "proxy_null": strength | {"allowed_weak": bool(allow_weak and not strength["beatable"])},
        "strata": None if strata is None else {lab: [c for c in cands if strata[c] == lab]
                                               for lab in dict.fromkeys(strata[c] for c in cands)},
        "window_ends": window_ends,   # references: [window_ends] -> the bases piloted for it, fixed at the lock
        "recipe": None if rec_obj is None else {"path": str(recipe), "overrides": list(recipe_overrides),
                                                "seeds": list(rec_obj.seeds)},
        "warnings": warnings,
        "previous_locks": previous,
    }
    atomic_write_json(lock_path, record)
    from ._posthoc import record as record_history

    record_history(run_dir, "locked", plan_sha256=plan.sha256, plan_path=str(plan.path))  # the plan history
    return record


def check_lock(run_dir: str | Path, plan_path: str | Path | None = None) -> LockStatus:
    """Compare the plan (default: the locked plan's path) with the lock; list post-hoc reasons."""
    run_dir = Path(run_dir)
    lock = read_lock(run_dir)
    path = Path(plan_path) if plan_path is not None else Path(lock.get("plan_path", ""))
    reasons: list[str] = []
    if not path.is_file():
        raise SelectionError(f"{path}: the locked plan file is not there; pass --plan PATH (its sha256 must equal "
                             f"the lock's {str(lock.get('plan_sha256'))[:12]}).")
    sha = sha256_file(path)
    if sha != lock.get("plan_sha256"):
        reasons.append(f"the plan {path} changed after it was locked on {lock.get('locked_utc')} (sha256 "
                       f"{str(lock.get('plan_sha256'))[:12]} at lock, {sha[:12]} now)")
    out = lock.get("outcome_files_at_lock") or []
    if out:
        shown = ", ".join(out[:5]) + (f" and {len(out) - 5} more" if len(out) > 5 else "")
        reasons.append(f"pilot/transfer results already existed when the plan was locked ({shown})")
    pre = lock.get("shortlist_files_at_lock") or []
    if pre:
        reasons.append(f"the shortlist ({', '.join(pre)}) existed before the plan was locked, so its proxies, "
                       "constraints and k could have been chosen after seeing it")
    sl_json = run_dir / "shortlist.json"
    if sl_json.is_file():
        try:
            sl_sha = json.loads(sl_json.read_text(encoding="utf-8")).get("plan_sha256")
        except (json.JSONDecodeError, AttributeError):
            sl_sha = None
        if sl_sha != lock.get("plan_sha256"):
            reasons.append(f"{sl_json} was computed with a plan other than the locked one (plan sha256 "
                           f"{str(sl_sha)[:12]}, locked {str(lock.get('plan_sha256'))[:12]})")
    if not lock.get("selection_declared", True):
        reasons.append("the locked plan had no `selection:` block, so the primary metric and decision rule were "
                       "not declared (defaults used)")
    from ._posthoc import sticky_reasons

    reasons += sticky_reasons(run_dir)  # once a selection of the run was POST-HOC, every later one is
    return LockStatus(lock=lock, plan_path=path, plan_sha256=sha, reasons=reasons)
