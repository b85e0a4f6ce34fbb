"""Shortlist checkpoints for matched pilot SFT from a predeclared selection plan.

``shortlist(run_dir, plan_path)`` ranks every candidate checkpoint of a scored run on every
proxy of the plan, aggregates the ranks, applies the plan's constraints, flags one-probe
winners and writes ``shortlist.csv`` (one row per checkpoint) and ``shortlist.json``
(plan, hashes, the shortlist and notes). A shortlist is a hypothesis to test with matched
pilot SFT, not a selection.

Plan (YAML; ``recipes/selection.yaml`` is the commented example)::

    proxies:                      # at least two; fix them before looking at results
      - {family: arith_pattern, variant: "*", metric: mean_margin, direction: higher}
      - {family: arith_plain, variant: eq, metric: candidate_accuracy}
    constraints:
      heldout_bpb_within: 0.05    # bits per byte above the best candidate (absolute); or {relative: 0.01}
                                #   or {spread: 0.25} (below)
      capability_floor:
        - {family: arith_plain, metric: candidate_accuracy, min: 0.5}
    aggregation: mean_rank        # or median_rank
    k: 3
    candidates: [checkpoint-180, checkpoint-200]   # optional; default every checkpoint
    stratify: {by: steps, strata: 3}   # optional: span the ladder (step/token ranges, or data_windows; below)
    references: [latest, lowest_bpb]   # optional: pilot the naive choices too (below)

Definitions:

* A proxy's ``metric`` is any numeric ``summary.csv`` column (``mean_margin``,
  ``accuracy``, ``candidate_accuracy``, ``mean_margin_per_token``, ``bits_per_byte``,
  ``gen_consistency``, ...). ``direction`` defaults to the metric's direction in
  :mod:`probeselect.metrics` (``lower`` for bits per byte, losses and ``seed_sd``; ``higher``
  for margins, accuracies and consistency); a metric with no known direction needs an
  explicit ``direction``, and one that contradicts the known direction is an error.
* Values are **oriented** before ranking (:func:`probeselect.metrics.oriented`: multiplied
  by +1 for ``higher``, -1 for ``lower``), so every rank, score and correlation downstream
  reads "higher = better". ``score[proxy]`` is the oriented quantity the shortlist ranks:
  the oriented value for a one-variant proxy, minus the mean per-variant rank for a
  ``variant: "*"`` proxy. Proxy validation (:func:`probeselect.select.proxy_validation`)
  correlates exactly this column with transfer.
* Ranks are among the candidates: 1 = best, ties get the average rank. A proxy with
  ``variant: "*"`` is ranked on every prompt variant separately (variants that never
  record the metric are skipped); its rank is the rank of
  the checkpoint's mean per-variant rank (so the proxy counts once in the aggregate) and
  its value is the metric's mean over variants. ``topk_frac[proxy]`` is the fraction of
  variants on which the checkpoint's per-variant rank is <= k.
* Aggregate: mean (or median) of the proxy ranks. A checkpoint without a value on some
  proxy is not eligible.
* ``heldout_bpb_within: d`` (or ``{absolute: d}``) passes a checkpoint whose held-out bits
  per byte (mean over its NLL rows) is <= the best candidate's + d; ``{relative: r}``: <=
  best x (1 + r); ``{spread: f}``: <= best + f x (worst - best) over the candidates (0 keeps
  only the best, 1 every candidate). Skipped, with a note, when the run has no NLL rows. ``capability_floor`` passes when the metric (of ``variant``, or the mean over
  the family's variants) is >= ``min``.
* One-probe winner: first (best or tied best) on some proxy but in the bottom half
  (rank > (n+1)/2 among n candidates) on a strict majority of the other proxies. Never
  shortlisted. A first place shared by more than half of the candidates (e.g. every
  checkpoint at the same value: the proxy is constant) singles nobody out and makes no
  one-probe winner.
* Shortlist: eligible checkpoints (candidate, a value on every proxy, every constraint
  passed, not a one-probe winner) ordered by aggregate, then by worst proxy rank (prefer
  consistency), then by earlier step; the first k.
* ``references``: naive choices piloted next to the shortlist, whatever their probes say:
  ``latest`` (the candidate with the highest step) and ``lowest_bpb`` (the candidate with the
  lowest held-out bits per byte). Each one not already shortlisted is appended after the k
  shortlisted checkpoints (``reference`` column = its rule), so the pilot measures the
  transfer of the choice the tool must beat under the same matched SFT. ``window_ends`` adds
  the last candidate of every data window of ``data_lineage.json`` (rule ``window_end:NAME``;
  the base before each change of the data mixture, e.g. the last before an anneal; an error
  without a lineage file): a choice a team reads off its data schedule, without probes.
* ``stratify``: strata of the ladder, fixed by the plan before any score is seen. The best
  eligible checkpoint overall comes first, then the best eligible checkpoint of every other
  stratum (strata in the order of their best checkpoint), then the rest by aggregate, until
  k. The shortlist then tests the proxies: it contains bases the proxies rank low, from
  other stretches of pretraining, so the pilot can show whether the proxy ranking predicts
  transfer. Strata (:func:`probeselect.plan.run_strata`):

  - ``data_windows``: the ladder's data windows (``data_lineage.json`` next to the
    checkpoints; a checkpoint at step t is in the window with start_step < t <= end_step).
    Without a lineage file this is an error (at ``plan lock`` and here), never a silent top k.
  - ``{by: steps, strata: N}`` (or ``by: tokens``): the candidates in step (token) order cut
    into N contiguous groups as equal in size as possible, earlier groups taking the extra
    one; ``{by: steps, edges: [e1, e2]}``: the ranges x <= e1, e1 < x <= e2, x > e2. Works on
    any ladder whose checkpoints have steps (tokens); ``shortlist.csv`` has a ``stratum``
    column and ``plan.lock.json`` records the strata.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._io import atomic_write_csv, atomic_write_json, sha256_file
from .manifest import base_manifest
from .metrics import oriented
# The plan model lives in probeselect.plan; its names stay importable from here.
from .plan import (AGGREGATIONS, LOCK_NAME, Floor, Plan, Proxy, _check_against_run, _resolve_candidates,  # noqa: F401
                   load_plan, plan_from_dict, read_lock, run_strata, run_window_ends)

__all__ = ["Plan", "Proxy", "Floor", "ShortlistResult", "load_plan", "shortlist", "AGGREGATIONS"]

@dataclass
class ShortlistResult:
    """What :func:`shortlist` returns; ``table`` is ``shortlist.csv``."""

    table: pd.DataFrame
    selected: list[str]
    notes: list[str]
    plan: Plan
    csv_path: Path | None = None
    json_path: Path | None = None
    excluded: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Values from the run
# ---------------------------------------------------------------------------


def _per_variant(summary: pd.DataFrame, family: str, variant: str | None, metric: str, order: list[str]) -> pd.DataFrame:
    """checkpoint x variant table of ``metric`` (one column when ``variant`` is named)."""
    rows = summary[summary["family"] == family]
    if variant not in (None, "*"):
        rows = rows[rows["variant"] == variant]
    wide = rows.pivot_table(index="checkpoint", columns="variant", values=metric, aggfunc="mean", dropna=False)
    wide = wide.reindex(index=order)
    # Variants that never record this metric (e.g. generation columns on span-only variants) do not count.
    return wide.loc[:, wide.notna().any(axis=0)] if wide.notna().any(axis=None) else wide


def _rank(values: pd.Series, higher: bool) -> pd.Series:
    """Rank 1 = best (ties: average rank); ``higher`` says which way ``values`` are better."""
    from scipy.stats import rankdata

    v = oriented(values.astype(float), sign=1 if higher else -1)  # higher = better from here on
    ok = v.notna()
    out = pd.Series(np.nan, index=v.index, dtype=float)
    if ok.any():
        out[ok] = rankdata(-v[ok].to_numpy(), method="average")
    return out


# ---------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.4g}"


def shortlist(run_dir: str | Path, plan_path: str | Path, *, out_dir: str | Path | None = None) -> ShortlistResult:
    """Rank, constrain and shortlist the checkpoints of ``run_dir`` under the plan at
    ``plan_path``; write ``shortlist.csv`` and ``shortlist.json`` to ``out_dir`` (default
    ``run_dir``). Definitions: module docstring. Raises :class:`ProbeSpecError` for an
    invalid plan or one that names families/variants/metrics the run lacks.

    Stages: read the plan and the run (:func:`_read_inputs`), rank every proxy and aggregate
    (:func:`_rank_proxies`), flag one-probe winners (:func:`_one_probe_winners`), apply the
    constraints (:func:`_apply_constraints`), choose the shortlist (:func:`_choose`), give
    every checkpoint its reason (:func:`_reasons`) and write the files (:func:`_write`). Each
    stage adds its columns to the one table, in this order, and its notes to ``notes``.
    """
    inp = _read_inputs(run_dir, plan_path)
    table = pd.DataFrame({"checkpoint": inp.order})
    table["step"] = table["checkpoint"].map(inp.steps)
    table["tokens"] = table["checkpoint"].map(inp.tokens)
    table["candidate"] = table["checkpoint"].isin(inp.cands)
    table = table.set_index("checkpoint")
    ranking = _rank_proxies(inp, table)
    one_probe = _one_probe_winners(ranking, inp.notes)
    table["one_probe_winner"] = [c in one_probe for c in inp.order]
    checks = _apply_constraints(inp, table)
    choice = _choose(inp, ranking, checks, one_probe, table)
    reasons, excluded = _reasons(inp, ranking, checks, one_probe, choice, table)
    table["reason"] = [reasons[c] for c in inp.order]

    lead = ["step", "tokens", "candidate", "selected", "shortlist_position", inp.plan.aggregation, "aggregate_rank",
            "worst_rank", "one_probe_winner", "passes_constraints", "reason"]
    rest = [c for c in table.columns if c not in lead]
    table = table[lead + rest].reset_index()
    csv_path, json_path = _write(inp, table, ranking, one_probe, choice, reasons,
                                 Path(out_dir) if out_dir is not None else inp.run.run_dir)
    return ShortlistResult(table=table, selected=choice.chosen, notes=inp.notes, plan=inp.plan, csv_path=csv_path,
                           json_path=json_path, excluded=excluded)


@dataclass
class _Inputs:
    """Stage 1: the plan, the run's summary and the checkpoints to rank."""

    plan: Plan
    plan_path: str | Path
    src: str  # the plan path as the error messages name it
    run: Any  # dynamics.Run
    summary: pd.DataFrame  # summary.csv with a ``kind`` column
    order: list[str]  # every checkpoint, in ladder order
    steps: dict[str, Any]
    tokens: dict[str, Any]
    cands: list[str]
    lock_state: dict[str, Any]
    notes: list[str]  # every stage appends its notes here, in order


def _read_inputs(run_dir: str | Path, plan_path: str | Path) -> _Inputs:
    """Load and check the plan against the run; the candidates; the predeclared and lock notes."""
    from .dynamics import _kind_column, checkpoint_order, load_run

    plan = load_plan(plan_path)
    src = str(plan_path)
    run = load_run(run_dir, need_scores=False)
    summary = run.summary.copy()
    summary["kind"] = _kind_column(summary)
    _check_against_run(plan, summary, src)
    order = checkpoint_order(summary)
    info = summary.drop_duplicates("checkpoint").set_index("checkpoint")
    steps = info["step"].to_dict()
    tokens = info["tokens"].to_dict() if "tokens" in info.columns else {}
    cands = _resolve_candidates(plan, order, steps, src)
    notes: list[str] = []
    notes.extend(_predeclared_note(plan_path, run.manifest))
    lock_state = _lock_state(Path(run_dir), Path(plan_path))
    if lock_state["note"]:
        notes.append(lock_state["note"])
    return _Inputs(plan=plan, plan_path=plan_path, src=src, run=run, summary=summary, order=order, steps=steps,
                   tokens=tokens, cands=cands, lock_state=lock_state, notes=notes)


@dataclass
class _Ranking:
    """Stage 2: every candidate's rank on every proxy and its aggregate."""

    ranks: pd.DataFrame  # candidate x proxy id, 1 = best
    stability: dict[str, pd.Series]  # proxy id -> topk_frac (``variant: "*"`` proxies)
    complete: pd.Series  # candidate -> a rank on every proxy
    agg: pd.Series  # candidate -> mean/median rank (NaN when not complete)
    n: int  # candidates with a rank on every proxy


def _rank_proxies(inp: _Inputs, table: pd.DataFrame) -> _Ranking:
    """Rank the candidates on every proxy and aggregate; adds the value/score/rank columns."""
    plan, order = inp.plan, inp.order
    ranks = pd.DataFrame(index=inp.cands)
    stability: dict[str, pd.Series] = {}
    for p in plan.proxies:
        score = _proxy_score(p, inp, table, stability)
        ranks[p.id] = _rank(score, higher=True)
        table[f"score[{p.id}]"] = score.reindex(order)
        table[f"rank[{p.id}]"] = ranks[p.id].reindex(order)

    complete = ranks.notna().all(axis=1)
    agg = ranks.mean(axis=1) if plan.aggregation == "mean_rank" else ranks.median(axis=1)
    agg[~complete] = np.nan
    table[plan.aggregation] = agg.reindex(order)
    table["aggregate_rank"] = _rank(agg, higher=False).reindex(order)
    table["worst_rank"] = ranks.max(axis=1).where(complete).reindex(order)
    return _Ranking(ranks=ranks, stability=stability, complete=complete, agg=agg, n=int(complete.sum()))


def _proxy_score(p: Proxy, inp: _Inputs, table: pd.DataFrame, stability: dict[str, pd.Series]) -> pd.Series:
    """The oriented score of one proxy per candidate (minus the mean per-variant rank for a
    several-variant proxy, whose per-variant columns and ``topk_frac`` this adds)."""
    order, k = inp.order, inp.plan.k
    wide = _per_variant(inp.summary, p.family, p.variant, p.metric, inp.cands)
    ow = oriented(wide, sign=1 if p.direction == "higher" else -1)  # higher = better
    table[f"value[{p.id}]"] = wide.mean(axis=1, skipna=False).reindex(order)
    if wide.shape[1] <= 1:
        return ow.iloc[:, 0]
    per_var = pd.DataFrame({v: _rank(ow[v], higher=True) for v in ow.columns})
    for v in per_var.columns:
        table[f"value[{p.family}/{v}:{p.metric}]"] = wide[v].reindex(order)
        table[f"rank[{p.family}/{v}:{p.metric}]"] = per_var[v].reindex(order)
    score = -per_var.mean(axis=1, skipna=False)
    frac = (per_var <= k + 1e-9).sum(axis=1) / per_var.shape[1]
    frac[per_var.isna().any(axis=1)] = np.nan
    stability[p.id] = frac
    table[f"topk_frac[{p.id}]"] = frac.reindex(order)
    return score


def _one_probe_winners(ranking: _Ranking, notes: list[str]) -> dict[str, str]:
    """Stage 3: checkpoint -> why it is a one-probe winner; notes a proxy that ranks every candidate the same."""
    ranks, complete, n = ranking.ranks, ranking.complete, ranking.n
    for p in ranks.columns:
        if n > 1 and ranks.loc[complete, p].nunique() == 1:
            notes.append(f"proxy {p} ranks every candidate the same (an all-way tie, e.g. prompt variants whose ranks "
                         "mirror each other): it does not discriminate and makes no one-probe winner. For a family whose "
                         "variants swap the task and shortcut labels (real_truthy) rank `calibrated_mean_margin` "
                         "(`score --calibrate`) instead.")
    half = (n + 1) / 2
    one_probe: dict[str, str] = {}
    for c in ranks.index[complete]:
        for p in ranks.columns:
            if ranks.loc[c, p] > ranks.loc[complete, p].min():
                continue
            # first place shared by more than half of the candidates (an all-way tie: the proxy is
            # constant) singles nobody out: no one-probe winner on that proxy
            if 2 * int((ranks.loc[complete, p] == ranks.loc[c, p]).sum()) > n:
                continue
            others = [q for q in ranks.columns if q != p]
            bottom = [q for q in others if ranks.loc[c, q] > half]
            if others and len(bottom) * 2 > len(others):
                tied = int((ranks.loc[complete, p] == ranks.loc[c, p]).sum()) - 1
                first = f"first on {p}" + (f" (tied with {tied} other{'s' if tied > 1 else ''})" if tied else "")
                one_probe[c] = (f"{first} but in the bottom half on {len(bottom)} of {len(others)} other proxies "
                                f"({', '.join(f'{q} rank {ranks.loc[c, q]:g}' for q in bottom)})")
                break
    return one_probe


@dataclass
class _Checks:
    """Stage 4: what each checkpoint fails and passes among the plan's constraints."""

    fails: dict[str, list[str]]
    passes: dict[str, list[str]]


def _apply_constraints(inp: _Inputs, table: pd.DataFrame) -> _Checks:
    """Held-out bpb limit and capability floors; adds their columns and ``passes_constraints``."""
    checks = _Checks(fails={c: [] for c in inp.order}, passes={c: [] for c in inp.order})
    if inp.plan.heldout_bpb_within is not None:
        _heldout_bpb_limit(inp, table, checks)
    for f in inp.plan.floors:
        vals = _per_variant(inp.summary, f.family, f.variant, f.metric, inp.order).mean(axis=1, skipna=False)
        ok = vals >= f.min - 1e-12
        table[f"capability[{f.id}]"] = vals
        table[f"pass_capability[{f.id}]"] = ok
        for c in inp.cands:
            if pd.isna(vals[c]):
                checks.fails[c].append(f"no {f.id} value recorded")
            elif not ok[c]:
                checks.fails[c].append(f"{f.id} {vals[c]:.4g} < floor {f.min:g}")
            else:
                checks.passes[c].append(f"{f.id} {vals[c]:.4g} >= {f.min:g}")
    table["passes_constraints"] = [(not checks.fails[c]) if c in set(inp.cands) else pd.NA for c in inp.order]
    return checks


def _heldout_bpb_limit(inp: _Inputs, table: pd.DataFrame, checks: _Checks) -> None:
    """``heldout_bpb_within``: skipped with a note when the run has no held-out NLL rows."""
    from .dynamics import heldout_bpb

    order, cands, plan = inp.order, inp.cands, inp.plan
    per = heldout_bpb(inp.summary)
    if per.empty:
        inp.notes.append("constraint heldout_bpb_within skipped: the run has no held-out NLL rows "
                         "(family heldout_nll with a bits_per_byte value). Score with held-out NLL to apply it.")
        table["heldout_bpb"] = np.nan
        table["pass_heldout_bpb"] = pd.NA
        return
    bpb = per.reindex(order)
    best = bpb.reindex(cands).min()
    worst = bpb.reindex(cands).max()
    w, mode = plan.heldout_bpb_within, plan.heldout_bpb_mode
    limit = {"absolute": best + w, "relative": best * (1 + w), "spread": best + w * (worst - best)}[mode]
    how = {"absolute": f"{w:g} above the best candidate ({best:.4f})",
           "relative": f"{w:.3g} x the best candidate's {best:.4f} above it (limit {limit:.4f})",
           "spread": f"{w:.3g} of the candidates' range {best:.4f}-{worst:.4f} above the best (limit {limit:.4f})"}[mode]
    ok = bpb <= limit + 1e-12
    table["heldout_bpb"] = bpb
    table["pass_heldout_bpb"] = ok
    for c in cands:
        if pd.isna(bpb[c]):
            checks.fails[c].append("no held-out bits per byte recorded")
        elif not ok[c]:
            checks.fails[c].append(f"held-out bpb {bpb[c]:.4f} is more than {how}")
        else:
            checks.passes[c].append(f"held-out bpb {bpb[c]:.4f} <= {limit:.4f}")


@dataclass
class _Choice:
    """Stage 5: the eligible checkpoints in shortlist order and the ones chosen."""

    eligible: list[str]  # by aggregate, then worst rank, then step
    chosen: list[str]
    stratum: dict[str, str]  # checkpoint -> stratum label (empty without ``stratify``)
    pos: dict[str, int]  # chosen checkpoint -> shortlist position (1 = first)
    appended: dict[str, list[str]] = field(default_factory=dict)  # references piloted beyond the shortlist -> rules


def _choose(inp: _Inputs, ranking: _Ranking, checks: _Checks, one_probe: dict[str, str],
            table: pd.DataFrame) -> _Choice:
    """The first k eligible checkpoints (stratified when the plan says so); adds the
    stratum, ``selected`` and ``shortlist_position`` columns and the selection notes."""
    ranks, agg, steps, k = ranking.ranks, ranking.agg, inp.steps, inp.plan.k
    eligible = [c for c in inp.cands if ranking.complete[c] and not checks.fails[c] and c not in one_probe]
    eligible.sort(key=lambda c: (agg[c], ranks.loc[c].max(), steps.get(c) if pd.notna(steps.get(c)) else -1))
    chosen = eligible[:k]
    stratum: dict[str, str] = {}
    if inp.plan.stratify is not None:
        stratum = run_strata(inp.plan, inp.run.run_dir, inp.summary, inp.cands, inp.src) or {}
        chosen = _stratified(eligible, k, stratum)
        _note_strata(inp, stratum, chosen, table)
    _note_selection(inp, ranking, checks, one_probe, eligible, chosen)
    refs = _references(inp, table)
    appended: dict[str, list[str]] = {}  # reference checkpoints piloted in addition to the shortlist -> their rules
    for rule, c in refs.items():
        if c in chosen and c not in appended:
            inp.notes.append(f"reference {rule}: {c} is already shortlisted.")
            continue
        if c in appended:
            inp.notes.append(f"reference {rule}: {c}, the same checkpoint as reference {', '.join(appended[c])}.")
        else:
            chosen = chosen + [c]
            why = (f"the last base of data window {rule.split(':', 1)[1]!r}, before the data changed"
                   if rule.startswith("window_end:") else
                   "the naive choice the shortlist must beat, measured under the same matched SFT")
            inp.notes.append(f"reference {rule}: {c} is piloted next to the shortlist ({why}).")
        appended.setdefault(c, []).append(rule)
    pos = {c: i + 1 for i, c in enumerate(chosen)}
    table["selected"] = [c in pos for c in inp.order]
    table["shortlist_position"] = [pos.get(c, np.nan) for c in inp.order]
    if inp.plan.references:
        table["reference"] = [", ".join(r for r, c2 in refs.items() if c2 == c) for c in inp.order]
    return _Choice(eligible=eligible, chosen=chosen, stratum=stratum, pos=pos, appended=appended)


def _references(inp: _Inputs, table: pd.DataFrame) -> dict[str, str]:
    """The plan's naive choices among the candidates: rule -> checkpoint (a rule with no value is noted)."""
    out: dict[str, str] = {}
    for rule in inp.plan.references:
        if rule == "window_ends":
            out.update(_window_end_references(inp))
            continue
        if rule == "latest":
            steps = {c: inp.steps.get(c) for c in inp.cands if pd.notna(inp.steps.get(c))}
            if steps:
                out[rule] = max(steps, key=lambda c: (steps[c], inp.order.index(c)))
            else:
                out[rule] = inp.cands[-1] if inp.cands else None
        else:
            from .dynamics import lowest_heldout_bpb

            lowest = lowest_heldout_bpb(inp.summary, among=inp.cands)
            out[rule] = None if lowest is None else lowest.checkpoint
        if out[rule] is None:
            inp.notes.append(f"reference {rule}: no candidate has the value it needs (step / held-out bits per byte); "
                             "not piloted.")
    return {r: c for r, c in out.items() if c is not None}


def _window_end_references(inp: _Inputs) -> dict[str, str]:
    """``references: [window_ends]``: rule ``window_end:NAME`` -> the last candidate of data window NAME
    (:func:`probeselect.plan.run_window_ends`). Windows without a candidate, and window ends that differ
    from those the plan lock recorded (the lineage changed after the lock), are said in the notes."""
    ends = run_window_ends(inp.plan, inp.run.run_dir, inp.summary, inp.cands, inp.src) or {}
    empty = [r.split(":", 1)[1] for r, c in ends.items() if c is None]
    if empty:
        inp.notes.append(f"reference window_ends: no candidate checkpoint in data window(s) {', '.join(empty)}; "
                         "nothing piloted for them.")
    lock = Path(inp.run.run_dir) / LOCK_NAME
    locked = read_lock(inp.run.run_dir).get("window_ends") if lock.is_file() else None
    if locked is not None and locked != ends:
        inp.notes.append(f"reference window_ends: {ends} differs from the window ends recorded at the plan lock "
                         f"({locked}): the data lineage or the candidates changed after the lock.")
    return {r: c for r, c in ends.items() if c is not None}


def _note_strata(inp: _Inputs, stratum: dict[str, str], chosen: list[str], table: pd.DataFrame) -> None:
    """The ``data_window`` / ``stratum`` column and the note on how the strata shaped the shortlist."""
    order, cands, plan = inp.order, inp.cands, inp.plan
    if plan.stratify == "data_windows":
        from .attribution import find_lineage

        table["data_window"] = [stratum.get(c, "") for c in order]
        inp.notes.append(f"stratified by data window ({find_lineage(inp.run.run_dir)}): the best eligible checkpoint of "
                         f"each window is shortlisted before any second one from the same window "
                         f"({len({stratum[c] for c in chosen})} window(s) among the {len(chosen)} shortlisted).")
    else:
        table["stratum"] = [stratum.get(c, "") for c in order]
        labels = list(dict.fromkeys(stratum[c] for c in cands))
        inp.notes.append(f"stratified by {plan.stratify} range ({len(labels)} strata fixed by the plan before the scores: "
                         f"{', '.join(labels)}): the best eligible checkpoint of each stratum is shortlisted before any "
                         f"second one from the same stratum ({len({stratum[c] for c in chosen})} strata among the "
                         f"{len(chosen)} shortlisted).")


def _note_selection(inp: _Inputs, ranking: _Ranking, checks: _Checks, one_probe: dict[str, str],
                    eligible: list[str], chosen: list[str]) -> None:
    """Notes on a tie at the cut, a shortlist shorter than k and too few ranked candidates."""
    ranks, agg, k, n, plan = ranking.ranks, ranking.agg, inp.plan.k, ranking.n, inp.plan
    if len(eligible) > k:
        a, b = eligible[k - 1], eligible[k]
        if agg[a] == agg[b] and ranks.loc[a].max() == ranks.loc[b].max():
            inp.notes.append(f"tie at the cut: {a} and {b} have the same {plan.aggregation} ({agg[a]:.3g}) and worst "
                             f"rank; the earlier step was kept. Treat both as shortlisted for pilot SFT if budget allows.")
    if len(chosen) < k:
        passing = [c for c in inp.cands if ranking.complete[c] and not checks.fails[c]]
        opw = [c for c in passing if c in one_probe]
        inp.notes.append(f"only {len(chosen)} checkpoint(s) are eligible; the shortlist is shorter than k={k}: "
                         f"{len(passing)} of {len(inp.cands)} candidates have a value on every proxy and pass the "
                         f"constraints"
                         + (f", and {len(opw)} of them ({', '.join(opw)}) are excluded as one-probe winners" if opw else "")
                         + ".")
    if n and n <= k:
        inp.notes.append(f"only {n} ranked candidates for k={k}: the shortlist does not discriminate.")


def _reasons(inp: _Inputs, ranking: _Ranking, checks: _Checks, one_probe: dict[str, str], choice: _Choice,
             table: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """Stage 6: every checkpoint's reason, and the reasons of the candidates left out."""
    ranks, cands, plan = ranking.ranks, set(inp.cands), inp.plan
    reasons, excluded = {}, {}
    for c in inp.order:
        if c not in cands:
            reasons[c] = "not a candidate: the plan's `candidates:` list leaves it out."
        elif c in choice.appended:   # before the exclusions: a reference is piloted whatever its probes say
            reasons[c] = _reference_reason(c, choice, checks, one_probe, ranking)
        elif not ranking.complete[c]:
            missing = [p for p in ranks.columns if pd.isna(ranks.loc[c, p])]
            reasons[c] = f"excluded: no value on proxy {', '.join(missing)}."
        elif c in one_probe:
            reasons[c] = f"excluded as a one-probe winner: {one_probe[c]}."
        elif checks.fails[c]:
            reasons[c] = "excluded: " + "; ".join(checks.fails[c]) + "."
        elif c in choice.pos:
            reasons[c] = _shortlisted_reason(c, inp, ranking, checks, choice)
        else:
            reasons[c] = (f"not shortlisted: {plan.aggregation.replace('_', ' ')} {ranking.agg[c]:.3g} is behind the "
                          f"{len(choice.chosen)} shortlisted checkpoints.")
        if not table.loc[c, "selected"] and c in cands:
            excluded[c] = reasons[c]
    return reasons, excluded


def _reference_reason(c: str, choice: _Choice, checks: _Checks, one_probe: dict[str, str], ranking: _Ranking) -> str:
    """Why a reference checkpoint is piloted, and what the shortlist rules say of it."""
    what = {"latest": "the latest checkpoint", "lowest_bpb": "the lowest held-out bits per byte"}
    rules = choice.appended[c]
    what.update({r: f"the last base of data window {r.split(':', 1)[1]!r}" for r in rules if r.startswith("window_end:")})
    said = ("; left out of the shortlist as a one-probe winner: " + one_probe[c] if c in one_probe
            else "; it fails " + "; ".join(checks.fails[c]) if checks.fails[c]
            else f"; its aggregate {ranking.agg[c]:.3g} is behind the shortlist" if pd.notna(ranking.agg[c])
            else "; it has no value on some proxy")
    kind = "the naive choice" if any(not r.startswith("window_end:") for r in rules) else "a lineage choice"
    named = [what[r] for r in rules]
    named = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 2 else " and ".join(named)
    return (f"reference #{choice.pos[c]} ({named}): {kind}, piloted next to "
            f"the shortlist{said}.")


def _shortlisted_reason(c: str, inp: _Inputs, ranking: _Ranking, checks: _Checks, choice: _Choice) -> str:
    """Why ``c`` is shortlisted: its position, aggregate, proxy ranks, variant stability and constraints passed."""
    plan, k, ranks, stratum = inp.plan, inp.plan.k, ranking.ranks, choice.stratum
    what = "data window" if plan.stratify == "data_windows" else "stratum"
    why = f" as the best of {what} {stratum[c]!r}" if stratum and c not in choice.eligible[:k] else ""
    parts = [f"shortlisted #{choice.pos[c]}{why}: {plan.aggregation.replace('_', ' ')} {ranking.agg[c]:.3g} over "
             f"{len(ranks.columns)} proxies among {ranking.n} candidates ("
             + ", ".join(f"{p} rank {ranks.loc[c, p]:g}" for p in ranks.columns) + ")"]
    for pid, frac in ranking.stability.items():
        if pd.notna(frac[c]):
            parts.append(f"top {k} on {frac[c]:.0%} of {pid.split(':')[0].split('/')[0]} variants")
    if checks.passes[c]:
        parts.append("passes " + ", ".join(checks.passes[c]))
    return "; ".join(parts) + "."


def _write(inp: _Inputs, table: pd.DataFrame, ranking: _Ranking, one_probe: dict[str, str], choice: _Choice,
           reasons: dict[str, str], out: Path) -> tuple[Path, Path]:
    """Stage 7: ``shortlist.csv`` and ``shortlist.json`` (atomic writes) in ``out``."""
    run, plan_path = inp.run, inp.plan_path
    csv_path, json_path = out / "shortlist.csv", out / "shortlist.json"
    atomic_write_csv(csv_path, table)
    man = base_manifest("shortlist", {"run_dir": str(run.run_dir), "plan": str(plan_path)})
    man.update(
        plan=inp.plan.to_dict(),
        plan_sha256=sha256_file(Path(plan_path)),
        plan_locked=inp.lock_state["locked"],
        post_hoc=inp.lock_state["post_hoc"],
        summary_sha256=sha256_file(run.run_dir / "summary.csv"),
        run_created_utc=(run.manifest or {}).get("created_utc"),
        n_candidates=len(inp.cands),
        selected=[{"checkpoint": c, "step": inp.steps.get(c), "position": choice.pos[c],
                   "aggregate": float(ranking.agg[c]) if pd.notna(ranking.agg[c]) else None,
                   **({"reference": ", ".join(choice.appended[c])} if c in choice.appended else {}),
                   "reason": reasons[c]} for c in choice.chosen],
        one_probe_winners=one_probe,
        notes=inp.notes,
        table="shortlist.csv",
    )
    atomic_write_json(json_path, man)
    return csv_path, json_path


def _lock_state(run_dir: Path, plan_path: Path) -> dict[str, Any]:
    """Whether the run's plan lock (``plan.lock.json``, taken before the shortlist) covers this plan."""
    if not (run_dir / LOCK_NAME).is_file():
        return {"locked": False, "post_hoc": None,
                "note": f"no plan lock in {run_dir}: this shortlist is exploratory. Lock the plan BEFORE the shortlist "
                        f"(`probeselect plan lock {plan_path} --run {run_dir}`) so the selection can be predeclared."}
    lock = read_lock(run_dir)
    if lock.get("plan_sha256") == sha256_file(plan_path):
        return {"locked": True, "post_hoc": False, "note": None}
    return {"locked": True, "post_hoc": True,
            "note": f"POST-HOC: {plan_path} is not the plan locked in {run_dir / LOCK_NAME} ({lock.get('plan_path')}, "
                    f"locked {lock.get('locked_utc')}); a selection from this shortlist is POST-HOC."}


def _stratified(eligible: list[str], k: int, stratum: dict[str, str]) -> list[str]:
    """Stratified shortlist: the best eligible checkpoint overall, then the best of each other
    stratum (strata taken in the order of their best checkpoint), then the rest by aggregate
    until k; returned in aggregate order. Strata: :func:`probeselect.plan.run_strata` (data
    windows of data_lineage.json, or step/token ranges fixed by the plan)."""
    chosen: list[str] = []
    for c in eligible:  # eligible is in aggregate order: the first of each new stratum is that stratum's best
        if len(chosen) < k and stratum[c] not in {stratum[x] for x in chosen}:
            chosen.append(c)
    for c in eligible:
        if len(chosen) < k and c not in chosen:
            chosen.append(c)
    chosen.sort(key=eligible.index)
    return chosen


def _predeclared_note(plan_path: str | Path, manifest: dict | None) -> list[str]:
    """A note when the plan file was last changed after the run was scored."""
    created = (manifest or {}).get("created_utc")
    if not created:
        return []
    try:
        run_time = _dt.datetime.fromisoformat(created)
        mtime = _dt.datetime.fromtimestamp(Path(plan_path).stat().st_mtime, tz=_dt.timezone.utc)
    except (ValueError, OSError):
        return []
    if mtime > run_time:
        return [f"the plan file was last modified ({mtime.isoformat(timespec='seconds')}) after the run was scored "
                f"({created}). If proxies were chosen after seeing results, this shortlist is exploratory: a proxy "
                "chosen after seeing its winner is not evidence. Commit the plan before scoring (its sha256 is recorded)."]
    return []
