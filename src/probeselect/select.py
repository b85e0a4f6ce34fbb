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
* **Seed values**: a base's value under SFT seed s is that run's primary metric in
  ``transfer.csv`` (the item mean of the seed's transfer items; token weighted for
  ``heldout_loss`` / ``sft_heldout_bpb``), so item noise is inside each seed value. Only seeds
  that every piloted base has are compared; n = their number.
* **Per-base interval**: mean +- t_{1-a/2, n-1} * sd / sqrt(n) over the n seed values
  (``level`` = 1 - a, default 95%). With one seed there is none (NaN).
* **Difference intervals** (seed-level paired t): for the top eligible base and every other
  eligible base j, d_s = value_top(s) - value_j(s) in the better direction, and the interval
  is mean(d) +- t_{1 - a/(2(k-1)), n-1} * sd(d) / sqrt(n), Bonferroni over the k - 1
  comparisons of the top with the other k eligible bases. Pairing cancels the seed effect
  shared by every base trained under a seed; what is left (base x seed interaction and item
  noise) is what the t quantile with n - 1 degrees of freedom is for, so the interval widens
  honestly with 2-3 seeds instead of never leaving the observed seeds, as a seed bootstrap
  does. ``diff_ci`` is the top - runner-up interval; ``diff_vs_top*`` columns hold the others.
  Simulated coverage and false-winner rates for 2, 3 and 5 seeds: bench/README.md
  (``bench/selection_coverage.py``) and ``tests/test_select.py``.
* **P(top beats runner-up)**: the t probability P(T_{n-1} < mean(d) / (sd(d)/sqrt(n))) (the
  interval excludes 0 at 95% exactly when it is above 0.975, for k = 2). ``p_best`` per base:
  the share of ``uncertainty.bootstrap`` draws (numpy ``default_rng(seed)``) from the
  multivariate t posterior of the seed means (flat prior; seed covariance across bases) in
  which it is the best eligible base (a draw in which m bases share the maximum, e.g. byte-identical
  twins, credits 1/m to each, so exact ties are split evenly); its top-vs-runner-up margins follow
  the same t distribution, so p_best agrees with the intervals. The intervals and p_best
  generalise over SFT seeds on a fixed item set: the seed values are means over the same transfer
  items, so they say how a new SFT seed would rank the bases on *these* items, not how a new
  draw of items (another transfer suite of the same kinds) would.
* **Seeds + items** (``selection.decision.interval: seeds+items``; default ``seeds``): the difference
  intervals also generalise over the transfer items. For top vs j, d[i, s] = value_top(i, s) -
  value_j(i, s) over the items x seeds grid of ``transfer_items.parquet``; se^2 = var_s(mean_i d) / n +
  var_i(mean_s d) / I (Owen's pigeonhole bound for a crossed design: it counts the item x seed residual
  twice, so it errs wide), Satterthwaite degrees of freedom, the same Bonferroni level; the half-width
  used is the larger of this one and the seed-only one (with few seeds the Satterthwaite t quantile can
  shrink faster than the standard error grows, and a rule meant to add the item draw must never call
  what the seed-only rule would not). It needs every base's per-item values for every compared seed,
  and a primary metric whose seed value is the item mean (not a token-weighted one); otherwise
  the plan check or selection stops with an error naming the file.
  ``p_best`` and P(top beats runner-up) stay seed-level. Measured on the toy validation:
  bench/VALIDITY.md ("Declared secondary analysis").
* **Decision rule** (``interval_above_margin``): the top base is a **clear winner** when
  n >= ``selection.min_sft_seeds`` (default 3) and every difference interval (top - j) lies
  above ``tie_margin``; otherwise the verdict is **no clear winner** and ``reason`` says why
  (one seed: no interval; fewer seeds than the plan's minimum; an interval overlaps the tie
  band [-margin, margin] or lies below it). ``selection.json`` records ``n_sft_seeds`` and
  ``min_sft_seeds``. With margin 0 the rule is "every interval excludes zero".
* **Against the default** (``selection.decision.against: latest``, opt-in): when the top is no clear
  winner but the default a team would post-train (the run's latest checkpoint, ``default=`` of
  :func:`rank_bases`) is eligible and compared, is not the top, and the interval of (top - default)
  lies above ``tie_margin``, the verdict is **beats_default** and the top is recommended: it is
  better than the default, though not separated from every other base (those are equivalent
  candidates at this budget, and ``reason`` names them). The intervals are the same ones (Bonferroni
  over the top's k - 1 comparisons); for this claim they are exact: the k - 1 differences
  "base - default" are a family fixed before the data, and the top's is one of them. The default
  itself on top is never "beats_default" (it is a clear winner or no clear winner, as without the key).
* **Seed-sensitive bases** (:func:`seed_sensitive`, descriptive, no test): with 3 or more seeds and bases, a base
  whose seed sd of the primary metric is more than ``SPREAD_RATIO`` (3) times the median seed sd of
  the other bases gets a note and is listed in the decision's ``seed_sensitive``. Such a base's
  outcome is often bimodal (SFT undoes a defect under some seeds only), which a t interval over a
  few seeds does not describe; the verdict is unchanged, the report says to add seeds.
* **Proxy validation**: for each predeclared shortlist proxy (``score[<proxy>]`` of
  ``shortlist.csv``: the oriented quantity the shortlist ranks, higher = better; see
  :mod:`probeselect.shortlist`) and for the shortlist aggregate, the
  Spearman and Kendall (tau-b) correlations with the transfer point values over the
  piloted bases (positive = the proxy ranks bases the way transfer does).
* **Selection-effect null**: every candidate looked at counts: the M declared proxies AND
  the shortlist aggregate (M + 1 candidates; ``selection.selection_effect.random_proxies``
  R replaces the declared proxies by R untied random ones). Each candidate is replaced by a
  random proxy with the same tie structure: its observed values over the piloted bases in a
  uniformly random order. For n <= 8 bases each random proxy's correlation distribution is
  exact (every permutation); for larger n it is estimated from 20,000 random permutations.
  The best of the candidates has CDF prod_c F_c(x). Reported: its median, 90% and 95%
  quantiles, and per proxy ``p_best_of_m`` = P(best of the M + 1 random >= observed) next to
  ``p_single`` = P(its own random counterpart >= observed). A proxy picked after seeing
  results must beat the best-of-M null; a predeclared one only the single. A perfect proxy
  reaches at best p = 1 - (1 - 1/n!)^(M+1) (:func:`min_p_best_of_m`): with 3 bases and 5
  candidates 0.60, so the null cannot be beaten; ``plan lock`` refuses such a shortlist size
  without ``--allow-weak`` and names the smallest k that could (:func:`smallest_beatable_k`).
  With n = 2 every correlation is +-1 and with n = 3 Spearman takes only 4 values: the
  output says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ._io import atomic_write_csv, atomic_write_json, sha256_file
from .errors import PostHocError, SelectionError
from .manifest import base_manifest
from .metrics import oriented
# min_p_best_of_m / smallest_beatable_k live with the plan (the lock checks the null's strength); re-exported.
from .plan import (LOCK_NAME, SelectionPlan, SelectionSpec, check_lock, load_selection_plan, min_p_best_of_m,  # noqa: F401
                   smallest_beatable_k)
from ._posthoc import read_history, record as record_history, retire_selection

#: the name of the shortlist aggregate's row in ``proxy_validation`` (followed by " (<aggregation>)").
AGGREGATE_PROXY = "shortlist aggregate"

__all__ = ["PilotTables", "Ranking", "seed_sensitive", "SelectionResult", "NullDistribution", "TopComparison", "load_pilot_tables",
           "rank_bases", "compare_top", "base_intervals", "posterior_draws", "proxy_validation", "best_of_m_null",
           "min_p_best_of_m", "smallest_beatable_k", "select"]

_EXACT_MAX_N = 8
SPREAD_RATIO = 3.0   # seed_sensitive: seed sd > 3x the other bases' median (F(5, 5) 0.99 quantile: 3.3x in sd)
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
    _refuse_nonfinite(transfer, tp)
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


def _refuse_nonfinite(transfer: pd.DataFrame, path: Path) -> None:
    """A NaN/inf transfer value is invalid, never a number a base could be ranked on."""
    v = pd.to_numeric(transfer["value"], errors="coerce").astype(float)
    bad = transfer[~np.isfinite(v.to_numpy())]
    if len(bad):
        shown = "; ".join(f"{r.base} seed {r.seed} {r.metric} = {r.value}" for r in bad.head(5).itertuples())
        raise SelectionError(f"{path}: {len(bad)} transfer value(s) are invalid (NaN/inf or empty): {shown}. A base "
                             "whose training or evaluation went nonfinite cannot be ranked; fix or drop it (see the "
                             "pilot's diagnostics.csv and train_log.jsonl) and re-run the pilot.")


# ---------------------------------------------------------------------------
# Ranking with seed-level paired t intervals
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
    n_items: int | None
    notes: list[str] = field(default_factory=list)
    n_comparisons: int = 0          # k - 1 eligible comparisons of the top (Bonferroni)
    t_critical: float | None = None  # the t quantile behind the difference intervals
    reason: str | None = None        # why there is no clear winner, when there is none
    min_sft_seeds: int = 3
    default: str | None = None       # the base of selection.decision.against (None without the key)
    default_diff: float | None = None               # top - default, in the better direction
    default_ci: tuple[float, float] | None = None   # its interval (the same Bonferroni level)
    seed_sensitive: list[str] = field(default_factory=list)  # :func:`seed_sensitive` bases

    def summary(self, spec: SelectionSpec) -> dict[str, Any]:
        return {"verdict": self.verdict, "recommended": self.recommended, "top": self.top,
                "runner_up": self.runner_up, "diff": self.diff,
                "diff_ci": list(self.diff_ci) if self.diff_ci else None,
                "p_top_beats_runner_up": self.p_top_beats_runner_up, "tie_margin": spec.tie_margin,
                "seeds": self.seeds, "n_items": self.n_items, "n_sft_seeds": len(self.seeds),
                "min_sft_seeds": self.min_sft_seeds, "reason": self.reason, "n_comparisons": self.n_comparisons,
                "t_critical": self.t_critical,
                **({"against": spec.against, "default": self.default, "diff_vs_default": self.default_diff,
                    "diff_vs_default_ci": list(self.default_ci) if self.default_ci else None}
                   if spec.against else {}),
                **({"seed_sensitive": list(self.seed_sensitive)} if self.seed_sensitive else {}),
                "interval": ("seed-level paired t, Bonferroni over the comparisons" if spec.interval == "seeds" else
                             "seeds + items (Satterthwaite t, at least the seed-level width), Bonferroni over "
                             "the comparisons")}


@dataclass
class TopComparison:
    """:func:`compare_top` on oriented seed values (higher = better), vectorised over leading axes.

    ``order``: base indices best first (stable on ties). ``diff[..., j]``: mean over seeds of
    (top - base j) (0 for the top), ``half[..., j]`` the half-width of its interval
    (Student t with n - 1 degrees of freedom at the Bonferroni level over the k - 1
    comparisons; NaN with one seed), ``sd[..., j]`` the seed sd of the paired differences.
    """

    order: np.ndarray
    diff: np.ndarray
    half: np.ndarray
    sd: np.ndarray
    n_seeds: int
    crit: float

    @property
    def lo(self) -> np.ndarray:
        return self.diff - self.half

    @property
    def hi(self) -> np.ndarray:
        return self.diff + self.half

    @property
    def top(self) -> np.ndarray:
        return self.order[..., 0]

    @property
    def runner_up(self) -> np.ndarray:
        return self.order[..., 1]

    def _at(self, a: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, idx[..., None], axis=-1)[..., 0]

    def runner_up_diff(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(difference, lower, upper) of top - runner-up."""
        ru = self.runner_up
        return self._at(self.diff, ru), self._at(self.lo, ru), self._at(self.hi, ru)

    def winner(self, tie_margin: float) -> np.ndarray:
        """The top is a clear winner: every interval of top - other lies above ``tie_margin``."""
        lo = self.lo.copy()
        np.put_along_axis(lo, self.top[..., None], np.inf, axis=-1)
        return np.nanmin(np.where(np.isnan(lo), -np.inf, lo), axis=-1) > tie_margin


def compare_top(oriented: np.ndarray, level: float = 0.95) -> TopComparison:
    """Seed-level paired comparison of the best base with every other (module docstring).

    ``oriented``: array (..., k, n) of per-seed values, higher = better (multiply a
    lower-is-better metric by -1 first), k >= 2 bases, n seeds.
    """
    from scipy.stats import t as student_t

    v = np.asarray(oriented, float)
    k, n = v.shape[-2], v.shape[-1]
    if k < 2:
        raise ValueError("compare_top needs at least two bases")
    order = np.argsort(-v.mean(axis=-1), axis=-1, kind="stable")
    top = np.take_along_axis(v, order[..., :1, None], axis=-2)            # (..., 1, n)
    d = top - v                                                             # (..., k, n)
    diff = d.mean(axis=-1)
    if n >= 2:
        sd = d.std(axis=-1, ddof=1)
        crit = float(student_t.ppf(1 - (1 - level) / (2 * (k - 1)), n - 1))
        half = crit * sd / math.sqrt(n)
    else:
        sd = np.full(diff.shape, np.nan)
        crit = float("nan")
        half = np.full(diff.shape, np.nan)
    return TopComparison(order=order, diff=diff, half=half, sd=sd, n_seeds=n, crit=crit)


def base_intervals(values: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Per-base t intervals over seeds: mean +- t_{1-a/2, n-1} sd / sqrt(n); NaN with one seed."""
    from scipy.stats import t as student_t

    v = np.asarray(values, float)
    n = v.shape[-1]
    m = v.mean(axis=-1)
    if n < 2:
        return np.full(m.shape, np.nan), np.full(m.shape, np.nan)
    half = student_t.ppf(1 - (1 - level) / 2, n - 1) * v.std(axis=-1, ddof=1) / math.sqrt(n)
    return m - half, m + half


def posterior_draws(oriented: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Draws (draws, k) of the k base means from the multivariate t posterior of the seed
    means (flat prior, unknown covariance): mean + S^(1/2) z / sqrt(n) / sqrt(chi2_{n-1} / (n - 1)),
    with S the seed covariance across bases. Their top-vs-runner-up margins follow exactly
    the t distribution of :func:`compare_top` (so P(best) agrees with the intervals)."""
    v = np.asarray(oriented, float)
    k, n = v.shape
    m = v.mean(axis=1)
    if n < 2:
        return np.full((draws, k), np.nan)
    dev = v - m[:, None]                                                    # (k, n)
    z = rng.standard_normal((draws, n))
    w = np.sqrt(rng.chisquare(n - 1, size=draws) / (n - 1))
    return m[None, :] + (z @ dev.T) / math.sqrt(n * (n - 1)) / w[:, None]


def _seed_means(transfer: pd.DataFrame, metric: str, bases: list[str], seeds: list[int], src: str) -> pd.Series:
    rows = transfer[(transfer["metric"] == metric) & transfer["seed"].isin(seeds)]
    if rows.empty:
        raise SelectionError(f"{src}: no rows for metric {metric!r}; metrics present: "
                             f"{sorted(transfer['metric'].unique())}. Fix the plan's selection block or re-run transfer.")
    return rows.groupby("base")["value"].mean().reindex(bases)


def _n_items(tables: PilotTables, metric: str, bases: list[str], seeds: list[int]) -> int | None:
    """Items behind each seed value: distinct per-item ids of ``metric`` (or transfer.csv ``n``)."""
    if tables.items is not None:
        rows = tables.items[(tables.items["metric"] == metric) & tables.items["seed"].isin(seeds)
                            & tables.items["base"].isin(bases)]
        if len(rows):
            return int(rows["item_id"].nunique())
    tr = tables.transfer
    if "n" in tr.columns:
        n = pd.to_numeric(tr.loc[tr["metric"] == metric, "n"], errors="coerce").max()
        return int(n) if n == n else None
    return None


def default_base(run_dir: Path, spec: SelectionSpec) -> str | None:
    """The checkpoint of the run that the plan's ``decision.against`` rule names (None without the key, or
    when the run lacks the value the rule needs): :func:`probeselect.dynamics.naive_choices`."""
    if not spec.against:
        return None
    from .dynamics import naive_choices

    return next((b for b, rules in naive_choices(Path(run_dir)).items() if spec.against in rules), None)


def rank_bases(tables: PilotTables, spec: SelectionSpec, *, bases: list[str] | None = None,
               default: str | None = None) -> Ranking:
    """Rank the piloted ``bases`` (default: all in ``transfer.csv``) under ``spec`` (module docstring).
    ``default``: the base ``spec.against`` names (e.g. the run's latest checkpoint, from
    :func:`probeselect.dynamics.naive_choices`); read only when the plan has ``decision.against``.

    Steps: the SFT seeds every base has (:func:`_common_seeds`), the per-seed values and their
    means, the constraints (:func:`_constraint_columns`), the per-base intervals, the eligible bases
    against the top one (:func:`_compare_eligible`) and the verdict (:func:`_decide`).
    """
    transfer = tables.transfer
    src = str(tables.out_dir / "transfer.csv")
    notes: list[str] = []
    bases = list(dict.fromkeys(transfer["base"])) if bases is None else [str(b) for b in bases]
    absent = [b for b in bases if b not in set(transfer["base"])]
    if absent:
        raise SelectionError(f"{src}: base {absent[0]!r} has no transfer rows; pilot it first.")
    prim = transfer[transfer["metric"] == spec.primary]
    seeds = _common_seeds(prim, bases, spec, src, notes)
    n_s = len(seeds)
    sign = 1.0 if spec.direction == "higher" else -1.0
    per_seed = (prim[prim["seed"].isin(seeds)].pivot_table(index="base", columns="seed", values="value", aggfunc="mean")
                .reindex(index=bases, columns=seeds))
    # the seed means that compare_top ranks by (numpy's row mean). pandas' groupby mean can round two
    # exactly tied bases the other way (508/840 came out ...047 in both there and ...048 in numpy for one),
    # and the eligible order must be the comparison's: a 9d late-harm pilot stopped on that assert.
    point = pd.Series(per_seed.to_numpy(float).mean(axis=1), index=bases)
    table = pd.DataFrame({"base": bases, "primary_metric": spec.primary, "direction": spec.direction,
                          "value": point.to_numpy(float)})
    for s in seeds:
        table[f"seed{s}"] = per_seed[s].to_numpy(float)
    fails = _constraint_columns(table, transfer, spec, bases, seeds, src)

    values = per_seed.to_numpy(float)                                        # (bases, seeds)
    lo, hi = base_intervals(values, spec.level)
    table["ci_lo"], table["ci_hi"] = lo, hi
    n_i = _n_items(tables, spec.primary, bases, seeds)
    table["n_items"] = n_i
    table["n_seeds"] = n_s
    spread = seed_sensitive(values, bases, notes)

    elig = [b for b in bases if not fails[b]]
    elig.sort(key=lambda b: -sign * point[b])
    rest = sorted([b for b in bases if fails[b]], key=lambda b: -sign * point[b] if point[b] == point[b] else math.inf)
    cmp = _compare_eligible(table, values, bases, elig, sign, spec, n_s,
                            items=_items_grid(tables, spec, elig, seeds, values, bases) if (
                                spec.interval == "seeds+items" and len(elig) >= 2 and n_s >= 2) else None)
    table["position"] = [elig.index(b) + 1 if b in elig else np.nan for b in bases]
    table["transfer_rank"] = pd.Series(-sign * point.to_numpy(float)).rank(method="average").to_numpy()
    table = table.set_index("base").loc[elig + rest].reset_index()

    dec = _decide(spec, point, elig, cmp, n_s, sign, notes, default=default)
    table["recommended"] = table["base"].eq(dec.recommended) if dec.recommended else False
    return Ranking(table=table, verdict=dec.verdict, recommended=dec.recommended, top=dec.top, runner_up=dec.runner_up,
                   diff=dec.diff, diff_ci=dec.diff_ci, p_top_beats_runner_up=dec.p_beat, seeds=seeds, n_items=n_i,
                   notes=notes, n_comparisons=len(elig) - 1 if len(elig) > 1 else 0,
                   t_critical=None if cmp is None or cmp.crit != cmp.crit else cmp.crit, reason=dec.reason,
                   min_sft_seeds=spec.min_sft_seeds, default=dec.default if spec.against else None,
                   default_diff=dec.default_diff, default_ci=dec.default_ci, seed_sensitive=spread)


def seed_sensitive(values: np.ndarray, bases: list[str], notes: list[str] | None = None,
                   ratio: float = SPREAD_RATIO) -> list[str]:
    """The bases whose SFT outcome varies across seeds far more than the other bases' (module docstring,
    "Seed-sensitive bases"): seed sd above ``ratio`` times the median seed sd of the others. ``values``:
    (bases, seeds). Needs 3 or more seeds and 3 or more bases (with two, a flag could as well mean that the
    other base is unusually steady); appends one note per flagged base."""
    if values.ndim != 2 or values.shape[1] < 3 or values.shape[0] < 3:
        return []
    sd = np.std(values, axis=1, ddof=1)
    tiny = 1e-9 * max(1.0, float(np.nanmax(np.abs(values))))   # a constant row's sd is rounding, not spread
    out = []
    for j, b in enumerate(bases):
        others = np.delete(sd, j)
        others = others[np.isfinite(others)]
        ref = float(np.median(others)) if others.size else math.nan
        if not (ref > tiny and np.isfinite(sd[j]) and sd[j] > ratio * ref):
            continue
        out.append(b)
        if notes is not None:
            notes.append(f"{b}: its fine-tuning outcome varies across SFT seeds far more than the other bases' (seed sd "
                         f"{sd[j]:.3g}, {sd[j] / ref:.1f}x their median {ref:.3g}; seed values {np.nanmin(values[j]):.3g} "
                         f"to {np.nanmax(values[j]):.3g}). The t intervals that involve it assume roughly normal seed "
                         f"differences, which {values.shape[1]} seeds cannot check, so they are wide or misleading; "
                         "a base whose outcome depends this much on the SFT seed is itself a risk to post-train. "
                         "Add SFT seeds before relying on a comparison with it.")
    return out


def _common_seeds(prim: pd.DataFrame, bases: list[str], spec: SelectionSpec, src: str, notes: list[str]) -> list[int]:
    """The SFT seeds with a primary value for every base (an error when there is none); notes seeds
    some bases lack, a single seed and fewer seeds than ``min_sft_seeds``."""
    seed_sets = {b: set(prim.loc[prim["base"] == b, "seed"].astype(int)) for b in bases}
    seeds = sorted(set.intersection(*seed_sets.values())) if seed_sets else []
    all_seeds = sorted(set.union(*seed_sets.values())) if seed_sets else []
    if not seeds:
        raise SelectionError(f"{src}: no SFT seed has {spec.primary!r} for every base; the pilot is incomplete.")
    if seeds != all_seeds:
        notes.append(f"seeds {sorted(set(all_seeds) - set(seeds))} are missing for some bases; only seeds {seeds}, "
                     "which every base has, are compared.")
    n_s = len(seeds)
    if n_s == 1:
        notes.append("one SFT seed: seed-to-seed variation cannot be estimated, so there is no interval and no clear "
                     "winner is possible. Pilot at least 2 seeds (the plan asks for "
                     f"selection.min_sft_seeds = {spec.min_sft_seeds}).")
    elif n_s < spec.min_sft_seeds:
        notes.append(f"{n_s} SFT seeds < selection.min_sft_seeds = {spec.min_sft_seeds}: intervals are reported but no "
                     "clear winner is declared. Pilot more seeds.")
    return seeds


def _constraint_columns(table: pd.DataFrame, transfer: pd.DataFrame, spec: SelectionSpec, bases: list[str],
                        seeds: list[int], src: str) -> dict[str, list[str]]:
    """Each constraint's seed-mean column and pass column, then ``eligible`` and
    ``failed_constraints``; returns base -> the constraints it fails."""
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
    return fails


def _items_grid(tables: PilotTables, spec: SelectionSpec, elig: list[str], seeds: list[int], values: np.ndarray,
                bases: list[str]) -> np.ndarray:
    """Per-item values of the primary metric, array (eligible bases, items, seeds) in ``elig`` order,
    for ``decision.interval: seeds+items``; an error naming the file when they cannot stand behind
    the seed values."""
    ip = tables.out_dir / "transfer_items.parquet"
    fix = "or set `selection.decision.interval: seeds` in the plan."
    if tables.items is None:
        raise SelectionError(f"{ip}: missing, and the plan's selection.decision.interval is 'seeds+items', which "
                             f"needs the per-item transfer values. Re-run the pilot's transfer evaluation, {fix}")
    it = tables.items[(tables.items["metric"] == spec.primary) & tables.items["seed"].isin(seeds)
                      & tables.items["base"].isin(elig)]
    grid = it.pivot_table(index="item_id", columns=["base", "seed"], values="value", aggfunc="mean")
    cols = pd.MultiIndex.from_product([elig, seeds], names=["base", "seed"])
    grid = grid.reindex(columns=cols)
    if grid.empty or grid.isna().to_numpy().any():
        have = it.groupby(["base", "seed"])["item_id"].nunique()
        raise SelectionError(f"{ip}: selection.decision.interval 'seeds+items' needs {spec.primary!r} on the same "
                             f"items for every compared base and seed ({elig} x seeds {seeds}); items per (base, seed): "
                             f"{have.to_dict() or 'none'}. Re-run the transfer evaluation, {fix}")
    arr = grid.to_numpy(float).reshape(len(grid), len(elig), len(seeds)).transpose(1, 0, 2)
    col = {b: i for i, b in enumerate(bases)}
    seed_vals = values[[col[b] for b in elig]]
    if not np.allclose(arr.mean(axis=1), seed_vals, rtol=1e-6, atol=1e-9):
        raise SelectionError(f"{ip}: the item mean of {spec.primary!r} is not its seed value in transfer.csv (a "
                             "token-weighted metric, or tables from different runs); 'seeds+items' needs a primary "
                             f"metric whose seed value is the item mean, {fix}")
    return arr


def items_half_widths(d: np.ndarray, n_comparisons: int, level: float = 0.95) -> tuple[float, float]:
    """(half-width, degrees of freedom) of the seeds + items interval of mean(d), d an items x seeds
    array of paired differences (module docstring): se^2 = var_s(item mean) / n + var_i(seed mean) / I,
    Satterthwaite df, Student t at the Bonferroni level over ``n_comparisons``."""
    from scipy.stats import t as student_t

    n_items, n_seeds = d.shape
    a = float(d.mean(axis=0).var(ddof=1)) / n_seeds if n_seeds > 1 else float("nan")
    b = float(d.mean(axis=1).var(ddof=1)) / n_items if n_items > 1 else 0.0
    if not a == a:
        return float("nan"), float("nan")
    den = a * a / (n_seeds - 1) + (b * b / (n_items - 1) if n_items > 1 else 0.0)
    dfree = (a + b) ** 2 / den if den > 0 else float(n_seeds - 1)
    q = 1 - (1 - level) / (2 * max(1, n_comparisons))
    return float(student_t.ppf(q, dfree)) * math.sqrt(a + b), dfree


def _compare_eligible(table: pd.DataFrame, values: np.ndarray, bases: list[str], elig: list[str], sign: float,
                      spec: SelectionSpec, n_s: int, items: np.ndarray | None = None):
    """Every eligible base against the top one (``diff_vs_top`` columns, :func:`compare_top`) and
    each one's posterior probability of being best (``p_best``); the comparison, or None with
    fewer than two eligible bases. ``items`` (eligible x items x seeds, from :func:`_items_grid`)
    widens each difference interval to at least the seeds + items one."""
    col = {b: i for i, b in enumerate(bases)}
    table["diff_vs_top"] = np.nan
    table["diff_vs_top_lo"] = np.nan
    table["diff_vs_top_hi"] = np.nan
    p_best: dict[str, float] = {}
    cmp = None
    if len(elig) >= 2:
        ev = sign * values[[col[b] for b in elig]]
        cmp = compare_top(ev, spec.level)
        assert int(cmp.top) == 0  # elig is sorted by the same seed means (stable)
        if items is not None:
            oriented = sign * items
            half = cmp.half.copy()
            for j in range(1, len(elig)):
                h, _ = items_half_widths(oriented[0] - oriented[j], len(elig) - 1, spec.level)
                if h == h:
                    half[j] = max(float(half[j]), h)
            cmp = dataclasses.replace(cmp, half=half)
        for j, b in enumerate(elig):
            if j:
                table.loc[col[b], ["diff_vs_top", "diff_vs_top_lo", "diff_vs_top_hi"]] = (
                    float(cmp.diff[j]), float(cmp.lo[j]), float(cmp.hi[j]))
        if n_s >= 2:
            draws = posterior_draws(ev, spec.bootstrap, np.random.default_rng(spec.seed))
            # exact ties split evenly: a draw in which m bases share the maximum credits 1/m to each
            # (argmax would give every tied draw to the first; byte-identical twins got 1.0 and 0.0)
            at_max = draws >= draws.max(axis=1, keepdims=True) - 1e-12 * np.maximum(1.0, np.abs(draws).max(axis=1,
                                                                                                      keepdims=True))
            share = at_max / at_max.sum(axis=1, keepdims=True)
            p_best = {b: float(np.mean(share[:, j])) for j, b in enumerate(elig)}
    elif len(elig) == 1:
        p_best = {elig[0]: 1.0}
    table["p_best"] = [p_best.get(b, np.nan) for b in bases]
    return cmp


class _Decision(NamedTuple):
    verdict: str
    recommended: str | None
    top: str | None
    runner_up: str | None
    reason: str | None
    diff: float | None
    diff_ci: tuple[float, float] | None
    p_beat: float | None
    default: str | None = None
    default_diff: float | None = None
    default_ci: tuple[float, float] | None = None


def _decide(spec: SelectionSpec, point: pd.Series, elig: list[str], cmp, n_s: int, sign: float,
            notes: list[str], default: str | None = None) -> _Decision:
    """The verdict on the top eligible base against the runner-up, and against the plan's default
    (``decision.against``) when the top is no clear winner (module docstring)."""
    top = elig[0] if elig else None
    ru = elig[1] if len(elig) > 1 else None
    diff = diff_ci = p_beat = None
    reason = None
    if top is None:
        verdict, rec = "none_eligible", None
        notes.append("no piloted base passes the selection constraints.")
    elif ru is None:
        verdict, rec = "single_eligible", top
        notes.append(f"only {top} passes the selection constraints; it is recommended without a comparison.")
    else:
        from scipy.stats import t as student_t

        diff = float(sign * (point[top] - point[ru]))
        if n_s >= 2:
            diff_ci = (float(cmp.lo[1]), float(cmp.hi[1]))
            sd = float(cmp.sd[1])
            se = sd / math.sqrt(n_s)
            p_beat = (float(student_t.cdf(diff / se, n_s - 1)) if se > 0
                      else 1.0 if diff > 0 else 0.5 if diff == 0 else 0.0)
        above = bool(cmp.winner(spec.tie_margin)) if n_s >= 2 else False
        if n_s < 2:
            verdict, rec, reason = "no_clear_winner", None, "one SFT seed: no interval"
        elif n_s < spec.min_sft_seeds:
            verdict, rec = "no_clear_winner", None
            reason = (f"{n_s} SFT seeds < min_sft_seeds {spec.min_sft_seeds}"
                      + (f" (the intervals alone would name {top})" if above else ""))
        elif above:
            verdict, rec = "winner", top
        else:
            verdict, rec = "no_clear_winner", None
            reason = "an interval of top - other overlaps the tie margin"
    dflt = _against_default(spec, elig, cmp, default, notes)
    if verdict == "no_clear_winner" and n_s >= max(2, spec.min_sft_seeds) and dflt[0] is not None \
            and top != dflt[0] and dflt[2] is not None and dflt[2][0] > spec.tie_margin:
        others = [b for j, b in enumerate(elig) if j and b != dflt[0] and not cmp.lo[j] > spec.tie_margin]
        verdict, rec = "beats_default", top
        reason = (f"{top} beats the default {dflt[0]} ({spec.against}) by more than the tie margin, but an interval "
                  f"of top - other overlaps it for {', '.join(others)}: equivalent candidates at this budget")
    return _Decision(verdict, rec, top, ru, reason, diff, diff_ci, p_beat, *dflt)


def _against_default(spec: SelectionSpec, elig: list[str], cmp, default: str | None, notes: list[str]
                     ) -> tuple[str | None, float | None, tuple[float, float] | None]:
    """(default base, top - default, its interval) for ``decision.against``; Nones (and a note saying
    why no "beats_default" verdict is possible) when the plan has no such key or the default was not
    compared."""
    if not spec.against:
        return None, None, None
    if default is None:
        notes.append(f"the plan decides against the {spec.against} checkpoint, but the run names none (no checkpoint "
                     "steps or held-out bpb): only a clear winner over every base is recommended.")
        return None, None, None
    if default not in elig:
        notes.append(f"the plan decides against the {spec.against} checkpoint {default}, but it was not piloted or "
                     "fails a transfer constraint: only a clear winner over every base is recommended.")
        return default, None, None
    j = elig.index(default)
    if cmp is None or j == 0:
        return default, (0.0 if j == 0 else None), None
    ci = (float(cmp.lo[j]), float(cmp.hi[j])) if cmp.n_seeds >= 2 else None
    return default, float(cmp.diff[j]), ci


# ---------------------------------------------------------------------------
# Proxy validation and the selection-effect null
# ---------------------------------------------------------------------------


def _rank_avg(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, method="average")


def _spearman_perm(perms: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Spearman (ties averaged on both sides) of ``x`` permuted by each row of ``perms`` with ``t``."""
    rt = _rank_avg(t)
    rt = rt - rt.mean()
    rx = _rank_avg(x)[perms]
    rx = rx - rx.mean(axis=1, keepdims=True)
    den = math.sqrt((rx[0] ** 2).sum() * (rt ** 2).sum())
    return (rx @ rt) / den if den > 0 else np.full(len(perms), np.nan)


def _kendall_perm(perms: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Kendall tau-b (ties on both sides) of ``x`` permuted by each row of ``perms`` with ``t``."""
    n = len(t)
    i, j = np.triu_indices(n, 1)
    st = np.sign(t[i] - t[j])
    xp = x[perms]
    sx = np.sign(xp[:, i] - xp[:, j])
    n0 = len(i)
    tied_x = n0 - int(np.count_nonzero(np.sign(x[i] - x[j])))  # a permutation keeps the number of tied pairs
    den = math.sqrt((n0 - tied_x) * (n0 - int((st == 0).sum())))
    return (sx @ st) / den if den > 0 else np.full(len(perms), np.nan)


@dataclass
class NullDistribution:
    """Best-of-M random-proxy correlations. Candidate c (a declared proxy or the aggregate) is
    replaced by a random proxy with its own tie structure: its observed values in a uniformly
    random order. ``support[stat][c]`` / ``prob[stat][c]``: the distinct values of that random
    proxy's correlation with transfer and their probabilities. The best of the M candidates
    has CDF prod_c F_c(x)."""

    n: int
    m: int                                   # candidates looked at (declared proxies + the aggregate)
    method: str                              # exact | monte_carlo
    support: dict[str, list[np.ndarray]]
    prob: dict[str, list[np.ndarray]]
    tied: list[bool] = field(default_factory=list)   # per candidate: whether its values have ties

    def _cdf_lt(self, stat: str, x: float, c: int) -> float:
        v, p = self.support[stat][c], self.prob[stat][c]
        return float(p[v < x - 1e-9].sum()) if len(v) else 1.0

    def p_single(self, stat: str, x: float, c: int = 0) -> float:
        """P(one random proxy with candidate ``c``'s ties has correlation >= x)."""
        return float("nan") if x != x else 1.0 - self._cdf_lt(stat, x, c)

    def p_best_of_m(self, stat: str, x: float) -> float:
        """P(the best of the M random candidates has correlation >= x)."""
        if x != x:
            return float("nan")
        return 1.0 - float(np.prod([self._cdf_lt(stat, x, c) for c in range(self.m)]))

    def _best_cdf(self, stat: str) -> tuple[np.ndarray, np.ndarray]:
        sup = [v for v in self.support[stat] if len(v)]
        if not sup:
            return np.array([]), np.array([])
        xs = np.unique(np.concatenate(sup))
        cdf = np.ones(len(xs))
        for v, p in zip(self.support[stat], self.prob[stat]):
            if len(v):
                cdf *= np.array([p[v <= x + 1e-9].sum() for x in xs])
        return xs, cdf

    def quantile(self, stat: str, q: float) -> float:
        """The q-quantile of the best-of-M correlation (smallest x with prod_c F_c(x) >= q)."""
        xs, cdf = self._best_cdf(stat)
        if not len(xs):
            return float("nan")
        return float(xs[min(np.searchsorted(cdf, q - 1e-12), len(xs) - 1)])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_bases": self.n, "m_random_proxies": self.m, "candidates": self.m,
                               "counted": "declared proxies + the shortlist aggregate", "method": self.method,
                               "ties": "each random proxy keeps its candidate's tie structure",
                               "candidates_with_ties": int(sum(self.tied))}
        for s in self.support:
            xs, cdf = self._best_cdf(s)
            out[s] = {f"q{int(q * 100)}": self.quantile(s, q) for q in (0.5, 0.9, 0.95)}
            out[s]["mean"] = float((xs * np.diff(np.concatenate([[0.0], cdf]))).sum()) if len(xs) else float("nan")
            out[s]["p_min"] = self.p_best_of_m(s, float(xs[-1])) if len(xs) else float("nan")
        return out


def best_of_m_null(transfer_values: np.ndarray, m: int | None = None, *, seed: int = 0,
                   candidates: list[np.ndarray] | None = None) -> NullDistribution:
    """The selection-effect null over bases with these transfer values.

    ``candidates``: the observed values of every candidate looked at (each declared proxy
    and the aggregate, oriented or not: only their tie structure matters); default ``m``
    candidates without ties. n <= 8 bases: exact (every permutation); more: 20,000 random
    permutations (numpy seed ``seed``).
    """
    t = np.asarray(transfer_values, float)
    n = len(t)
    if candidates is None:
        if m is None:
            raise ValueError("best_of_m_null needs m or candidates")
        candidates = [np.arange(n, dtype=float)] * int(m)
    cands = [np.asarray(c, float) for c in candidates]
    if n <= _EXACT_MAX_N:
        perms = np.array(list(itertools.permutations(range(n))), dtype=int)
        method = "exact"
    else:
        rng = np.random.default_rng(seed)
        perms = np.array([rng.permutation(n) for _ in range(_MC_PERMUTATIONS)], dtype=int)
        method = "monte_carlo"
    support: dict[str, list[np.ndarray]] = {"spearman": [], "kendall": []}
    prob: dict[str, list[np.ndarray]] = {"spearman": [], "kendall": []}
    cache: dict[bytes, tuple] = {}
    for x in cands:
        key = _rank_avg(x).tobytes()  # same ranks -> same null
        if key not in cache:
            res = []
            for stat, fn in (("spearman", _spearman_perm), ("kendall", _kendall_perm)):
                vals = np.round(fn(perms, x, t), 12)
                vals = vals[np.isfinite(vals)]
                u, c = np.unique(vals, return_counts=True)
                res.append((u, c / c.sum() if c.sum() else c.astype(float)))
            cache[key] = tuple(res)
        for stat, (u, p) in zip(("spearman", "kendall"), cache[key]):
            support[stat].append(u)
            prob[stat].append(p)
    tied = [len(np.unique(x)) < n for x in cands]
    return NullDistribution(n=n, m=len(cands), method=method, support=support, prob=prob, tied=tied)


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
    proxies.append((f"{AGGREGATE_PROXY} ({agg})", agg, "lower"))
    # Every candidate looked at counts (the declared proxies AND the aggregate), each with its own ties.
    observed = {}
    for pid, col, direction in proxies:
        if col in sl.columns:
            observed[pid] = oriented(pd.to_numeric(sl.loc[bases, col], errors="coerce").to_numpy(float),
                                     sign=1 if direction == "higher" else -1)
    cand_vals = [v for v in observed.values() if np.isfinite(v).all()]
    if spec.random_proxies:
        cand_vals = [np.arange(n, dtype=float)] * spec.random_proxies + cand_vals[-1:]
    m = len(cand_vals)
    null = best_of_m_null(t, seed=seed + 1, candidates=cand_vals) if n >= 2 and m else None
    if n < 2:
        notes.append(f"proxy validation needs at least 2 piloted bases; there are {n}.")
    elif n == 2:
        notes.append("with 2 bases every rank correlation is +1 or -1: agreement is a coin flip and carries no evidence.")
    elif n <= 4 and null is not None and len(null.support["spearman"][0]):
        sp = null.support["spearman"][0]
        notes.append(f"with {n} bases Spearman takes only {len(sp)} values ({', '.join(f'{v:.2g}' for v in sp)}) and one "
                     f"random proxy reaches the top value {sp[-1]:.2g} with probability {null.prob['spearman'][0][-1]:.2g} "
                     f"(best of the {m} candidates looked at: {null.p_best_of_m('spearman', sp[-1]):.2g}): even a perfect "
                     "proxy is weak evidence.")
    if null is not None and any(null.tied):
        notes.append(f"{sum(null.tied)} of the {m} candidates have tied values over the piloted bases; their random "
                     "counterparts in the null keep the same ties.")
    if n >= 2 and np.ptp(t) == 0:
        notes.append("every piloted base has the same transfer value: correlations are undefined.")
    rows = []
    for c_idx, (pid, col, direction) in enumerate(proxies):
        if col not in sl.columns:
            notes.append(f"shortlist.csv has no column {col!r}; proxy {pid} is not validated. Re-run the shortlist.")
            continue
        v = observed[pid]
        ok = np.isfinite(v) & np.isfinite(t)
        rho = tau = float("nan")
        if ok.sum() >= 2 and np.ptp(v[ok]) > 0 and np.ptp(t[ok]) > 0:
            rho = float(spearmanr(v[ok], t[ok]).statistic)
            tau = float(kendalltau(v[ok], t[ok]).statistic)
        ci = next((i for i, x in enumerate(cand_vals) if x is v), None) if null else None
        if ci is None and null is not None and spec.random_proxies:
            ci = 0  # an explicit count of random proxies: untied random proxies
        single = (lambda stat, x: null.p_single(stat, x, ci)) if ci is not None else (lambda stat, x: np.nan)
        rows.append({"proxy": pid, "direction": direction, "n_bases": int(ok.sum()), "spearman": rho, "kendall": tau,
                     "tied_values": bool(ok.sum() and len(np.unique(v[ok])) < ok.sum()),
                     "p_single_spearman": single("spearman", rho),
                     "p_best_of_m_spearman": null.p_best_of_m("spearman", rho) if null else np.nan,
                     "p_single_kendall": single("kendall", tau),
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


_VOLATILE = ("created_utc", "command")


def _same_record(path: Path, rec: dict[str, Any]) -> bool:
    """Whether ``path`` already holds ``rec`` up to its time and command line.

    A re-run that reaches the same selection then leaves selection.json byte-identical, so
    what was derived from it (``confirm.json`` pins its sha256; ``probeselect run`` hashes it
    to decide whether the confirmation retraining is stale) stays valid, whatever the clock.
    """
    import json

    if not path.is_file():
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(old, dict):
        return False
    canon = lambda d: json.dumps({k: v for k, v in d.items() if k not in _VOLATILE}, sort_keys=True, default=str)  # noqa: E731
    return canon(old) == canon(json.loads(json.dumps(rec, default=str)))


def select(run_dir: str | Path, *, plan_path: str | Path | None = None, pilot_dir: str | Path | None = None,
           allow_post_hoc: bool = False) -> SelectionResult:
    """Select a base from the pilot of ``run_dir`` under its locked plan; write
    ``selection.json`` and ``selection.csv`` into ``run_dir``.

    Raises :class:`SelectionError` without a lock (``probeselect plan lock``), and
    :class:`PostHocError` when the selection would be post-hoc and ``allow_post_hoc`` is
    False. With ``allow_post_hoc`` every output is marked POST-HOC. POST-HOC is sticky: once a
    selection of the run was post-hoc, every later one is (``plan_history.jsonl``, see
    :mod:`probeselect._posthoc`). A refused selection moves the previous ``selection.json``/
    ``.csv`` to ``superseded/<UTC time>/``, so no report presents a stale predeclared selection.
    """
    run_dir = Path(run_dir)
    status = check_lock(run_dir, plan_path)
    if status.post_hoc and not allow_post_hoc:
        # no stale (predeclared) selection may stay next to a refusal for a later report to present
        moved = retire_selection(run_dir)
        record_history(run_dir, "select_refused", plan_sha256=status.plan_sha256, plan_path=str(status.plan_path),
                       post_hoc=True, reasons=status.reasons)
        raise PostHocError("this selection would be POST-HOC: " + "; ".join(status.reasons) +
                           ". Pass --allow-post-hoc to select anyway (every output is then marked POST-HOC), or start "
                           "a fresh run with the plan locked before the pilot." +
                           (f" The previous selection was moved to {moved[0]} so that no report presents it as "
                            "current." if moved else ""))
    plan = load_selection_plan(status.plan_path)
    spec = plan.selection
    tables = load_pilot_tables(pilot_dir if pilot_dir is not None else run_dir / "pilot")
    ranking = rank_bases(tables, spec, default=default_base(run_dir, spec))
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
    record_history(run_dir, "select", plan_sha256=plan.sha256, plan_path=str(plan.path), post_hoc=post_hoc,
                   reasons=status.reasons)
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
        plan_history=read_history(run_dir),
        selection_plan=spec.to_dict(),
        decision=ranking.summary(spec) | {"level": spec.level},
        n_sft_seeds=len(ranking.seeds),
        min_sft_seeds=spec.min_sft_seeds,
        uncertainty={"method": "seed-level paired t", "level": spec.level, "seeds": ranking.seeds,
                     "n_sft_seeds": len(ranking.seeds), "n_items": ranking.n_items,
                     "comparisons": ranking.n_comparisons, "t_critical": ranking.t_critical,
                     "p_best": {"draws": spec.bootstrap, "rng": "numpy.random.default_rng", "seed": spec.seed,
                                "model": "multivariate t posterior of the seed means"}},
        # kept for readers of the earlier layout: `replicates` are now posterior draws for p_best
        bootstrap={"replicates": spec.bootstrap, "rng": "numpy.random.default_rng", "seed": spec.seed,
                   "level": spec.level, "resampled": "none: seed-level paired t intervals (see uncertainty)",
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
    if not _same_record(json_path, rec):
        atomic_write_json(json_path, rec)
    return SelectionResult(ranking=ranking, proxies=proxies, null=null, post_hoc=post_hoc,
                           post_hoc_reasons=status.reasons, notes=notes, json_path=json_path, csv_path=csv_path,
                           record=rec)
