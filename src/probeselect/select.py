"""Select a base by held-out transfer after matched pilot SFT, with uncertainty.

``select(run_dir)`` reads the locked plan (:mod:`probeselect.plan`), the pilot tables
(``run_dir/pilot/transfer.csv``, ``transfer_items.parquet``, ``diagnostics.csv``) and the
shortlist (``run_dir/shortlist.csv``), and writes ``selection.json`` and
``selection.csv``. Definitions:

* **Point value** of a base: the primary metric of ``transfer.csv`` (run level; token
  weighted for ``heldout_loss`` / ``sft_heldout_bpb``) averaged over the SFT seeds that every
  piloted base has.
* **Constraints**: each ``selection.constraints`` metric, averaged over seeds, must be
  within its ``min`` / ``max``. Eligible = passes every constraint. Ranking: eligible
  bases by point value (best first), then the ineligible ones.
* **Bootstrap** (``B`` replicates, ``numpy.random.default_rng(seed)``, both recorded):
  each replicate resamples the SFT seeds with replacement and, independently, the
  transfer items with replacement; the same resampled seeds and items are used for every
  base (paired: every base is trained under the same seeds' data manifests and evaluated
  on the same items). A base's replicate value is the mean over resampled seeds of the
  mean over resampled items of its per-item values (``transfer_items.parquet``), shifted
  by (point value - plug-in per-item mean), which is zero for item-mean metrics
  (accuracy, log-prob, recovery, termination) and makes the token-weighted held-out
  metrics' intervals centre on their point values (the resampling itself is per item,
  not per token). Intervals are percentile intervals at ``level`` (default 95%).
* **P(top beats runner-up)**: the fraction of replicates in which the top eligible base's
  replicate value is better than the runner-up's (ties count half). ``p_best`` per base:
  the fraction of replicates in which it is the best eligible base.
* **Decision rule** (``interval_above_margin``): let d = top - runner-up in the better
  direction and [lo, hi] its bootstrap interval. The top base is a **clear winner** when
  lo > ``tie_margin``; otherwise the interval overlaps the tie band [-margin, margin] (or
  lies below it) and the verdict is **no clear winner**. With margin 0 this is "the
  interval excludes zero".
* **Proxy validation**: for each predeclared shortlist proxy (``score[<proxy>]`` of
  ``shortlist.csv``: the oriented quantity the shortlist ranks, higher = better; see
  :mod:`probeselect.shortlist`) and for the shortlist aggregate, the
  Spearman and Kendall (tau-b) correlations with the transfer point values over the
  piloted bases (positive = the proxy ranks bases the way transfer does).
* **Selection-effect null**: a random proxy ranks the n bases by a uniformly random
  permutation. The null is the distribution of the *best* correlation among M random
  proxies (M = the number of declared proxies, or ``selection.selection_effect.random_proxies``).
  For n <= 8 the single-proxy distribution is exact (every permutation) and the best-of-M
  CDF is F(x)^M; for larger n it is estimated from 20,000 random permutations. Reported:
  its median, 90% and 95% quantiles, and for each proxy ``p_best_of_m`` = P(best of M
  random >= observed) next to ``p_single`` = P(one random >= observed). A proxy picked
  after seeing results must beat the best-of-M null; a predeclared one only the single.
  With n = 2 every correlation is +-1 and with n = 3 Spearman takes only 4 values: the
  output says so.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._io import atomic_write_csv, atomic_write_json, sha256_file
from .errors import PostHocError, SelectionError
from .manifest import base_manifest
from .metrics import oriented
from .plan import LOCK_NAME, SelectionPlan, SelectionSpec, check_lock, load_selection_plan

__all__ = ["PilotTables", "Ranking", "SelectionResult", "NullDistribution", "load_pilot_tables", "rank_bases",
           "proxy_validation", "best_of_m_null", "select"]

_EXACT_MAX_N = 8
_MC_PERMUTATIONS = 20_000


class PilotTables:
    """The three tables of a pilot output folder (contract layout)."""

    def __init__(self, out_dir: Path, transfer: pd.DataFrame, items: pd.DataFrame | None,
                 diagnostics: pd.DataFrame | None):
        self.out_dir, self.transfer, self.items, self.diagnostics = out_dir, transfer, items, diagnostics

    def hashes(self) -> dict[str, str | None]:
        return {n: sha256_file(self.out_dir / n) if (self.out_dir / n).is_file() else None
                for n in ("transfer.csv", "transfer_items.parquet", "diagnostics.csv")}


def load_pilot_tables(out_dir: str | Path) -> PilotTables:
    """Read ``transfer.csv`` (required), ``transfer_items.parquet`` and ``diagnostics.csv``."""
    out = Path(out_dir)
    tp = out / "transfer.csv"
    if not tp.is_file():
        raise SelectionError(f"{tp}: no transfer table. Run the matched pilot first: "
                             f"`probeselect pilot --bases RUN_DIR/shortlist.csv --recipe recipes/pilot.yaml --out {out}`.")
    transfer = pd.read_csv(tp)
    need = {"base", "seed", "metric", "value"}
    if not need <= set(transfer.columns):
        raise SelectionError(f"{tp}: expected columns {sorted(need)}, got {list(transfer.columns)}.")
    transfer["base"] = transfer["base"].astype(str)
    ip = out / "transfer_items.parquet"
    items = pd.read_parquet(ip) if ip.is_file() else None
    if items is not None:
        need_i = {"base", "seed", "metric", "item_id", "value"}
        if not need_i <= set(items.columns):
            raise SelectionError(f"{ip}: expected columns {sorted(need_i)}, got {list(items.columns)}.")
        items["base"] = items["base"].astype(str)
    dp = out / "diagnostics.csv"
    diag = pd.read_csv(dp) if dp.is_file() else None
    return PilotTables(out, transfer, items, diag)


# ---------------------------------------------------------------------------
# Ranking with a paired bootstrap
# ---------------------------------------------------------------------------


@dataclass
class Ranking:
    """What :func:`rank_bases` returns. ``table`` has one row per base, best first."""

    table: pd.DataFrame
    verdict: str            # winner | no_clear_winner | single_eligible | none_eligible
    recommended: str | None
    top: str | None
    runner_up: str | None
    diff: float | None      # top - runner-up, in the better direction (primary metric units)
    diff_ci: tuple[float, float] | None
    p_top_beats_runner_up: float | None
    seeds: list[int]
    n_items: int
    notes: list[str] = field(default_factory=list)

    def summary(self, spec: SelectionSpec) -> dict[str, Any]:
        return {"verdict": self.verdict, "recommended": self.recommended, "top": self.top,
                "runner_up": self.runner_up, "diff": self.diff,
                "diff_ci": list(self.diff_ci) if self.diff_ci else None,
                "p_top_beats_runner_up": self.p_top_beats_runner_up, "tie_margin": spec.tie_margin,
                "seeds": self.seeds, "n_items": self.n_items}


def _seed_means(transfer: pd.DataFrame, metric: str, bases: list[str], seeds: list[int], src: str) -> pd.Series:
    rows = transfer[(transfer["metric"] == metric) & transfer["seed"].isin(seeds)]
    if rows.empty:
        raise SelectionError(f"{src}: no rows for metric {metric!r}; metrics present: "
                             f"{sorted(transfer['metric'].unique())}. Fix the plan's selection block or re-run transfer.")
    return rows.groupby("base")["value"].mean().reindex(bases)


def _item_cube(items: pd.DataFrame, metric: str, bases: list[str], seeds: list[int], src: str,
               notes: list[str]) -> tuple[np.ndarray, list[Any]]:
    """(bases, seeds, items) per-item values over the items every (base, seed) has."""
    rows = items[(items["metric"] == metric) & items["seed"].isin(seeds) & items["base"].isin(bases)]
    if rows.empty:
        raise SelectionError(f"{src}: no per-item rows for metric {metric!r}; the bootstrap needs them. "
                             "Re-run the pilot's transfer evaluation.")
    rows = rows.groupby(["base", "seed", "item_id"], sort=False)["value"].mean()
    cells = {}
    for (b, s), grp in rows.groupby(level=[0, 1]):
        cells[(b, s)] = grp.droplevel([0, 1])
    missing = [(b, s) for b in bases for s in seeds if (b, s) not in cells]
    if missing:
        raise SelectionError(f"{src}: no per-item {metric} rows for (base, seed) {missing[0]}; re-run that pilot run.")
    common = None
    for v in cells.values():
        idx = v.dropna().index
        common = idx if common is None else common.intersection(idx)
    all_ids = set().union(*[set(v.index) for v in cells.values()])
    if common is None or len(common) == 0:
        raise SelectionError(f"{src}: the piloted runs share no {metric} items; they were not evaluated on one suite.")
    if len(common) < len(all_ids):
        notes.append(f"{len(all_ids) - len(common)} {metric} item(s) are missing for some (base, seed) and are left "
                     f"out of the bootstrap ({len(common)} items used).")
    ids = sorted(common, key=str)
    cube = np.stack([np.stack([cells[(b, s)].reindex(ids).to_numpy(float) for s in seeds]) for b in bases])
    return cube, ids


def rank_bases(tables: PilotTables, spec: SelectionSpec, *, bases: list[str] | None = None) -> Ranking:
    """Rank the piloted ``bases`` (default: all in ``transfer.csv``) under ``spec`` (module docstring)."""
    transfer = tables.transfer
    src = str(tables.out_dir / "transfer.csv")
    notes: list[str] = []
    bases = list(dict.fromkeys(transfer["base"])) if bases is None else [str(b) for b in bases]
    absent = [b for b in bases if b not in set(transfer["base"])]
    if absent:
        raise SelectionError(f"{src}: base {absent[0]!r} has no transfer rows; pilot it first.")
    prim = transfer[transfer["metric"] == spec.primary]
    seed_sets = {b: set(prim.loc[prim["base"] == b, "seed"].astype(int)) for b in bases}
    seeds = sorted(set.intersection(*seed_sets.values())) if seed_sets else []
    all_seeds = sorted(set.union(*seed_sets.values())) if seed_sets else []
    if not seeds:
        raise SelectionError(f"{src}: no SFT seed has {spec.primary!r} for every base; the pilot is incomplete.")
    if seeds != all_seeds:
        notes.append(f"seeds {sorted(set(all_seeds) - set(seeds))} are missing for some bases; only seeds {seeds}, "
                     "which every base has, are compared.")
    if len(seeds) == 1:
        notes.append("one SFT seed: the interval covers item sampling only, not seed-to-seed variation.")
    sign = 1.0 if spec.direction == "higher" else -1.0
    point = _seed_means(transfer, spec.primary, bases, seeds, src)
    per_seed = (prim[prim["seed"].isin(seeds)].pivot_table(index="base", columns="seed", values="value", aggfunc="mean")
                .reindex(index=bases))
    table = pd.DataFrame({"base": bases, "primary_metric": spec.primary, "direction": spec.direction,
                          "value": point.to_numpy(float)})
    for s in seeds:
        table[f"seed{s}"] = per_seed[s].to_numpy(float) if s in per_seed.columns else np.nan
    fails: dict[str, list[str]] = {b: [] for b in bases}
    for c in spec.constraints:
        vals = _seed_means(transfer, c.metric, bases, seeds, src)
        col = c.metric if c.metric != spec.primary else f"{c.metric}_constraint"
        table[col] = vals.to_numpy(float)
        table[f"pass[{c.id}]"] = [c.passes(v) for v in vals]
        for b, v in vals.items():
            if not c.passes(v):
                fails[b].append(f"{c.metric} {v:.4g} fails {c.id}" if v == v else f"no {c.metric} value")
    table["eligible"] = [not fails[b] for b in bases]
    table["failed_constraints"] = ["; ".join(fails[b]) for b in bases]

    # Bootstrap over items and seeds, paired across bases.
    if tables.items is None:
        raise SelectionError(f"{tables.out_dir / 'transfer_items.parquet'}: missing; the bootstrap needs per-item rows.")
    cube, ids = _item_cube(tables.items, spec.primary, bases, seeds, str(tables.out_dir / "transfer_items.parquet"), notes)
    rng = np.random.default_rng(spec.seed)
    B, n_i, n_s = spec.bootstrap, len(ids), len(seeds)
    w_items = rng.multinomial(n_i, np.full(n_i, 1.0 / n_i), size=B) / n_i       # (B, I)
    w_seeds = rng.multinomial(n_s, np.full(n_s, 1.0 / n_s), size=B) / n_s       # (B, S)
    per_seed_rep = np.einsum("bsi,ri->bsr", np.nan_to_num(cube), w_items)         # (bases, S, B)
    reps = np.einsum("bsr,rs->rb", per_seed_rep, w_seeds)                         # (B, bases)
    plug_in = cube.mean(axis=(1, 2))
    reps = reps + (point.to_numpy(float) - plug_in)[None, :]
    alpha = (1 - spec.level) / 2
    table["ci_lo"] = np.quantile(reps, alpha, axis=0)
    table["ci_hi"] = np.quantile(reps, 1 - alpha, axis=0)
    table["n_items"] = n_i
    if spec.primary in ("heldout_loss", "sft_heldout_bpb", "heldout_bpb"):
        notes.append(f"{spec.primary} point values are token weighted; the bootstrap resamples items (per-item means) "
                     "and shifts the interval to centre on the token-weighted value.")

    elig = [b for b in bases if not fails[b]]
    elig.sort(key=lambda b: -sign * point[b])
    rest = sorted([b for b in bases if fails[b]], key=lambda b: -sign * point[b] if point[b] == point[b] else math.inf)
    order = elig + rest
    col = {b: i for i, b in enumerate(bases)}
    if elig:
        e_idx = [col[b] for b in elig]
        best = np.argmax(sign * reps[:, e_idx], axis=1)
        p_best = {b: float(np.mean(best == k)) for k, b in enumerate(elig)}
    else:
        p_best = {}
    table["p_best"] = [p_best.get(b, np.nan) for b in bases]
    table["position"] = [elig.index(b) + 1 if b in elig else np.nan for b in bases]
    table["transfer_rank"] = pd.Series(-sign * point.to_numpy(float)).rank(method="average").to_numpy()
    table = table.set_index("base").loc[order].reset_index()

    top = elig[0] if elig else None
    ru = elig[1] if len(elig) > 1 else None
    diff = diff_ci = p_beat = None
    if top is None:
        verdict, rec = "none_eligible", None
        notes.append("no piloted base passes the selection constraints.")
    elif ru is None:
        verdict, rec = "single_eligible", top
        notes.append(f"only {top} passes the selection constraints; it is recommended without a comparison.")
    else:
        d = sign * (reps[:, col[top]] - reps[:, col[ru]])
        diff = float(sign * (point[top] - point[ru]))
        diff_ci = (float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha)))
        p_beat = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
        if diff_ci[0] > spec.tie_margin:
            verdict, rec = "winner", top
        else:
            verdict, rec = "no_clear_winner", None
    table["recommended"] = table["base"].eq(rec) if rec else False
    return Ranking(table=table, verdict=verdict, recommended=rec, top=top, runner_up=ru, diff=diff, diff_ci=diff_ci,
                   p_top_beats_runner_up=p_beat, seeds=seeds, n_items=n_i, notes=notes)


# ---------------------------------------------------------------------------
# Proxy validation and the selection-effect null
# ---------------------------------------------------------------------------


def _rank_avg(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, method="average")


def _spearman_perm(perms: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Spearman of each permutation row (distinct ranks) with ``t`` (ties averaged)."""
    rt = _rank_avg(t)
    rt = rt - rt.mean()
    rp = perms - perms.mean(axis=1, keepdims=True)
    den = np.sqrt((rp ** 2).sum(axis=1) * (rt ** 2).sum())
    return (rp @ rt) / den if den.all() else np.full(len(perms), np.nan)


def _kendall_perm(perms: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Kendall tau-b of each permutation row (no ties) with ``t``."""
    n = len(t)
    i, j = np.triu_indices(n, 1)
    st = np.sign(t[i] - t[j])
    n0 = len(i)
    n_tied_t = int((st == 0).sum())
    den = math.sqrt(n0 * (n0 - n_tied_t))
    if den == 0:
        return np.full(len(perms), np.nan)
    return (np.sign(perms[:, i] - perms[:, j]) @ st) / den


@dataclass
class NullDistribution:
    """Best-of-M random-proxy correlations: values with probabilities, per statistic."""

    n: int
    m: int
    method: str                              # exact | monte_carlo
    support: dict[str, np.ndarray]           # statistic -> sorted distinct single-proxy values
    prob: dict[str, np.ndarray]              # statistic -> P(single = value)

    def _cdf_lt(self, stat: str, x: float) -> float:
        v, p = self.support[stat], self.prob[stat]
        return float(p[v < x - 1e-9].sum())

    def p_single(self, stat: str, x: float) -> float:
        """P(one random proxy's correlation >= x)."""
        return float("nan") if x != x else 1.0 - self._cdf_lt(stat, x)

    def p_best_of_m(self, stat: str, x: float) -> float:
        """P(the best of M random proxies' correlations >= x)."""
        return float("nan") if x != x else 1.0 - self._cdf_lt(stat, x) ** self.m

    def quantile(self, stat: str, q: float) -> float:
        """The q-quantile of the best-of-M correlation (smallest x with F(x)^M >= q)."""
        v, p = self.support[stat], self.prob[stat]
        if not len(v):
            return float("nan")
        cdf = np.cumsum(p) ** self.m
        return float(v[min(np.searchsorted(cdf, q - 1e-12), len(v) - 1)])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_bases": self.n, "m_random_proxies": self.m, "method": self.method}
        for s in self.support:
            out[s] = {f"q{int(q * 100)}": self.quantile(s, q) for q in (0.5, 0.9, 0.95)}
            out[s]["mean"] = float((self.support[s] * np.diff(np.concatenate([[0.0], np.cumsum(self.prob[s]) ** self.m])))
                                   .sum()) if len(self.support[s]) else float("nan")
        return out


def best_of_m_null(transfer_values: np.ndarray, m: int, *, seed: int = 0) -> NullDistribution:
    """The selection-effect null for ``m`` random proxies over bases with these transfer values."""
    t = np.asarray(transfer_values, float)
    n = len(t)
    if n <= _EXACT_MAX_N:
        perms = np.array(list(itertools.permutations(range(1, n + 1))), dtype=float)
        method = "exact"
    else:
        rng = np.random.default_rng(seed)
        perms = np.array([rng.permutation(n) + 1 for _ in range(_MC_PERMUTATIONS)], dtype=float)
        method = "monte_carlo"
    support, prob = {}, {}
    for stat, fn in (("spearman", _spearman_perm), ("kendall", _kendall_perm)):
        vals = np.round(fn(perms, t), 12)
        vals = vals[np.isfinite(vals)]
        u, c = np.unique(vals, return_counts=True)
        support[stat], prob[stat] = u, c / c.sum() if c.sum() else c.astype(float)
    return NullDistribution(n=n, m=int(m), method=method, support=support, prob=prob)


def proxy_validation(shortlist_table: pd.DataFrame, plan: SelectionPlan, point: pd.Series, spec: SelectionSpec,
                     *, seed: int = 0) -> tuple[pd.DataFrame, NullDistribution | None, list[str]]:
    """Correlate each proxy with transfer over the bases of ``point`` (see the module docstring)."""
    from scipy.stats import kendalltau, spearmanr

    notes: list[str] = []
    bases = [b for b in point.index if point[b] == point[b]]
    sl = shortlist_table.set_index(shortlist_table["checkpoint"].astype(str))
    missing = [b for b in bases if b not in sl.index]
    if missing:
        notes.append(f"piloted base(s) {missing} are not rows of shortlist.csv; they are left out of proxy validation.")
        bases = [b for b in bases if b in sl.index]
    n = len(bases)
    sign = 1.0 if spec.direction == "higher" else -1.0
    t = sign * point.reindex(bases).to_numpy(float)
    # The oriented quantity the shortlist ranks (score[...], higher = better); value[...] of an older shortlist.csv.
    proxies = [(p.id, f"score[{p.id}]", "higher") if f"score[{p.id}]" in sl.columns else
               (p.id, f"value[{p.id}]", p.direction) for p in plan.shortlist.proxies]
    agg = plan.shortlist.aggregation
    proxies.append((f"shortlist aggregate ({agg})", agg, "lower"))
    m = spec.random_proxies or len(plan.shortlist.proxies)
    null = best_of_m_null(t, m, seed=seed + 1) if n >= 2 else None
    if n < 2:
        notes.append(f"proxy validation needs at least 2 piloted bases; there are {n}.")
    elif n == 2:
        notes.append("with 2 bases every rank correlation is +1 or -1: agreement is a coin flip and carries no evidence.")
    elif n <= 4 and null is not None and len(null.support["spearman"]):
        sp = null.support["spearman"]
        notes.append(f"with {n} bases Spearman takes only {len(sp)} values ({', '.join(f'{v:.2g}' for v in sp)}) and one "
                     f"random proxy reaches the top value {sp[-1]:.2g} with probability {null.prob['spearman'][-1]:.2g} "
                     f"(best of {m}: {null.p_best_of_m('spearman', sp[-1]):.2g}): even a perfect proxy is weak evidence.")
    if n >= 2 and np.ptp(t) == 0:
        notes.append("every piloted base has the same transfer value: correlations are undefined.")
    rows = []
    for pid, col, direction in proxies:
        if col not in sl.columns:
            notes.append(f"shortlist.csv has no column {col!r}; proxy {pid} is not validated. Re-run the shortlist.")
            continue
        v = oriented(pd.to_numeric(sl.loc[bases, col], errors="coerce").to_numpy(float),
                     sign=1 if direction == "higher" else -1)
        ok = np.isfinite(v) & np.isfinite(t)
        rho = tau = float("nan")
        if ok.sum() >= 2 and np.ptp(v[ok]) > 0 and np.ptp(t[ok]) > 0:
            rho = float(spearmanr(v[ok], t[ok]).statistic)
            tau = float(kendalltau(v[ok], t[ok]).statistic)
        rows.append({"proxy": pid, "direction": direction, "n_bases": int(ok.sum()), "spearman": rho, "kendall": tau,
                     "p_single_spearman": null.p_single("spearman", rho) if null else np.nan,
                     "p_best_of_m_spearman": null.p_best_of_m("spearman", rho) if null else np.nan,
                     "p_single_kendall": null.p_single("kendall", tau) if null else np.nan,
                     "p_best_of_m_kendall": null.p_best_of_m("kendall", tau) if null else np.nan,
                     "null_q95_spearman": null.quantile("spearman", 0.95) if null else np.nan,
                     "beats_null_q95": bool(rho == rho and null is not None and rho > null.quantile("spearman", 0.95) + 1e-9)})
    return pd.DataFrame(rows), null, notes


# ---------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------


@dataclass
class SelectionResult:
    ranking: Ranking
    proxies: pd.DataFrame
    null: NullDistribution | None
    post_hoc: bool
    post_hoc_reasons: list[str]
    notes: list[str]
    json_path: Path
    csv_path: Path
    record: dict[str, Any]


def _plain(v: Any) -> Any:
    """A JSON-ready scalar: numpy scalars to Python, NaN/NA to None."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is pd.NA or (isinstance(v, float) and v != v):
        return None
    return v


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-ready dicts."""
    return [{str(k): _plain(v) for k, v in r.items()} for r in df.to_dict(orient="records")]


def _diag_flags(diag: pd.DataFrame | None) -> list[str]:
    if diag is None or diag.empty:
        return ["no diagnostics.csv in the pilot folder: run correctness is unchecked."]
    out = []
    for col, what in (("nonfinite", "nonfinite gradient events"), ("skipped", "skipped steps"),
                      ("resumes", "resumes"), ("spikes", "loss spikes")):
        if col in diag.columns:
            bad = diag[pd.to_numeric(diag[col], errors="coerce").fillna(0) > 0]
            for r in bad.itertuples():
                out.append(f"{r.base} seed {r.seed}: {getattr(r, col)} {what}")
    return out


def select(run_dir: str | Path, *, plan_path: str | Path | None = None, pilot_dir: str | Path | None = None,
           allow_post_hoc: bool = False) -> SelectionResult:
    """Select a base from the pilot of ``run_dir`` under its locked plan; write
    ``selection.json`` and ``selection.csv`` into ``run_dir``.

    Raises :class:`SelectionError` without a lock (``probeselect plan lock``), and
    :class:`PostHocError` when the selection would be post-hoc and ``allow_post_hoc`` is
    False. With ``allow_post_hoc`` every output is marked POST-HOC.
    """
    run_dir = Path(run_dir)
    status = check_lock(run_dir, plan_path)
    if status.post_hoc and not allow_post_hoc:
        raise PostHocError("this selection would be POST-HOC: " + "; ".join(status.reasons) +
                           ". Pass --allow-post-hoc to select anyway (every output is then marked POST-HOC), or start "
                           "a fresh run with the plan locked before the pilot.")
    plan = load_selection_plan(status.plan_path)
    spec = plan.selection
    tables = load_pilot_tables(pilot_dir if pilot_dir is not None else run_dir / "pilot")
    ranking = rank_bases(tables, spec)
    sl_path = run_dir / "shortlist.csv"
    if not sl_path.is_file():
        raise SelectionError(f"{sl_path}: no shortlist; run `probeselect shortlist {run_dir} --plan {plan.path}` first.")
    sl = pd.read_csv(sl_path)
    notes = list(ranking.notes)
    shortlisted = set(sl.loc[sl["selected"].astype(bool), "checkpoint"].astype(str)) if "selected" in sl else set()
    stray = [b for b in ranking.table["base"] if b not in shortlisted]
    if stray:
        notes.append(f"piloted base(s) {stray} were not on the shortlist.")
    point = ranking.table.set_index("base")["value"]
    proxies, null, pnotes = proxy_validation(sl, plan, point, spec, seed=spec.seed)
    notes += pnotes
    diag_flags = _diag_flags(tables.diagnostics)
    post_hoc = status.post_hoc
    table = ranking.table.copy()
    table.insert(1, "verdict", ranking.verdict)
    table["post_hoc"] = post_hoc
    table["predeclared"] = not post_hoc
    csv_path, json_path = run_dir / "selection.csv", run_dir / "selection.json"
    sl_json = run_dir / "shortlist.json"
    rec = base_manifest("selection", {"run_dir": str(run_dir), "plan": str(plan.path), "pilot_dir": str(tables.out_dir),
                                      "allow_post_hoc": allow_post_hoc})
    rec.update(
        status="POST-HOC" if post_hoc else "predeclared",
        post_hoc=post_hoc,
        post_hoc_reasons=status.reasons,
        predeclared=not post_hoc,
        plan_path=str(plan.path),
        plan_sha256=plan.sha256,
        lock={"locked_utc": status.lock.get("locked_utc"), "plan_sha256": status.lock.get("plan_sha256"),
              "sha256": sha256_file(run_dir / LOCK_NAME),
              "outcome_files_at_lock": status.lock.get("outcome_files_at_lock", [])},
        selection_plan=spec.to_dict(),
        decision=ranking.summary(spec) | {"level": spec.level},
        bootstrap={"replicates": spec.bootstrap, "rng": "numpy.random.default_rng", "seed": spec.seed,
                   "level": spec.level, "resampled": "items and SFT seeds, paired across bases",
                   "n_items": ranking.n_items, "seeds": ranking.seeds},
        bases=records(ranking.table),
        proxy_validation=records(proxies),
        null=null.to_dict() if null is not None else None,
        diagnostics_flags=diag_flags,
        notes=notes,
        inputs={"shortlist.csv": sha256_file(sl_path),
                "shortlist.json": sha256_file(sl_json) if sl_json.is_file() else None,
                **{f"pilot/{k}": v for k, v in tables.hashes().items()}},
        table="selection.csv",
    )
    atomic_write_csv(csv_path, table)
    atomic_write_json(json_path, rec)
    return SelectionResult(ranking=ranking, proxies=proxies, null=null, post_hoc=post_hoc,
                           post_hoc_reasons=status.reasons, notes=notes, json_path=json_path, csv_path=csv_path,
                           record=rec)
