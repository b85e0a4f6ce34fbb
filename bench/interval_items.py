"""How much wider the pipeline's decision interval would be if it also generalised over transfer items.

The selection's difference interval (src/probeselect/select.py, ``compare_top``) is a seed-level paired t:
each seed's value is a mean over the SAME transfer items, so it says how a new SFT seed would rank the
bases on these items, not how a new draw of items would. This script recomputes, for the top vs the
runner-up of every pilot and confirmation of a finished validation (bench/validity.py OUT folder), the
seed-only interval next to one that adds the item variance: the pigeonhole estimate
se^2 = var(seed means of d) / S + var(item means of d) / I for d = top - runner-up per (item, seed)
(Owen 2007; it counts the item x seed residual twice, so it is slightly conservative), with Satterthwaite
degrees of freedom and the same Bonferroni factor as the decision. Development analysis, not a selector.

    python bench/interval_items.py OUT/late_harm_attempt10e --seeds 50 51 52 53 54 [--csv FILE]

Rows: every pilot and confirmation decision with a runner-up, and (since 2026-12-05, nineteenth session)
every planted tie pilot of the validation (stage ``tie:twin``, ``tie:same_mode``).

``bench/validity.py --record`` keeps this table as ``interval_items.csv`` in the record.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
from scipy.stats import t as student_t


def intervals(items: pd.DataFrame, top: str, other: str, metric: str, n_comparisons: int,
              level: float = 0.95) -> dict:
    """Seed-only and seeds+items intervals of mean(top - other) over the items x seeds grid."""
    it = items[items["metric"] == metric]
    grid = it.pivot_table(index="item_id", columns=["base", "seed"], values="value")
    d = grid[top] - grid[other]                                   # items x seeds
    n_items, n_seeds = d.shape
    a = float(d.mean(axis=0).var(ddof=1)) / n_seeds              # seed part
    b = float(d.mean(axis=1).var(ddof=1)) / n_items              # item part
    dfree = (a + b) ** 2 / (a * a / (n_seeds - 1) + b * b / (n_items - 1)) if a + b > 0 else float(n_seeds - 1)
    q = 1 - (1 - level) / (2 * max(1, n_comparisons))
    m = float(d.to_numpy().mean())
    h1 = float(student_t.ppf(q, n_seeds - 1)) * math.sqrt(a)
    h2 = float(student_t.ppf(q, dfree)) * math.sqrt(a + b)
    return {"diff": m, "seed_lo": m - h1, "seed_hi": m + h1, "both_lo": m - h2, "both_hi": m + h2,
            "widen": h2 / h1 if h1 > 0 else float("nan"), "items": n_items, "seeds": n_seeds}


def margin_of(run: Path) -> float:
    """The plan's tie margin, from the seed's selection.json (0 when there is none)."""
    sel = run / "selection.json"
    if not sel.is_file():
        return 0.0
    return float(json.loads(sel.read_text(encoding="utf-8"))["decision"].get("tie_margin") or 0.0)


def _tie_rows(out: Path, seed: int, metric: str, margin: float) -> list[dict]:
    """The planted ties of a validation seed (``seed<S>/ties/<name>/pilot``, two bases, one comparison), with
    the validation's verdict from ``OUT/ties.csv`` when the run wrote it: stage ``tie:<name>``."""
    rows = []
    verdicts = {}
    if (out / "ties.csv").is_file():
        tc = pd.read_csv(out / "ties.csv")
        verdicts = {(int(r.seed), str(r.tie)): str(r.verdict) for r in tc.itertuples()}
    ties = out / f"seed{seed}" / "ties"
    for tdir in sorted(ties.iterdir()) if ties.is_dir() else []:
        ip = tdir / "pilot" / "transfer_items.parquet"
        if not ip.is_file():
            continue
        items = pd.read_parquet(ip)
        means = items[items["metric"] == metric].groupby("base")["value"].mean().sort_values(ascending=False,
                                                                                             kind="stable")
        if len(means) != 2:
            continue
        top, other = str(means.index[0]), str(means.index[1])
        r = intervals(items, top, other, metric, 1)
        rows.append({"seed": seed, "stage": f"tie:{tdir.name}", "top": top, "runner_up": other, **r,
                     "tie_margin": margin, "verdict": verdicts.get((seed, tdir.name), ""),
                     "seed_call": r["seed_lo"] > margin, "items_call": min(r["both_lo"], r["seed_lo"]) > margin})
    return rows


def table(out: Path, seeds: list[int], metric: str = "task_accuracy") -> pd.DataFrame:
    """One row per (seed, stage) of the validation folder ``out`` (``seed<S>/score/``) whose decision had a
    runner-up, and one per planted tie (stage ``tie:<name>``, from ``seed<S>/ties/<name>/pilot``): the seed-only
    and the seeds+items intervals of top - runner-up, the plan's verdict, and whether
    the lower end clears the plan's tie margin: ``seed_call`` on the seed-only interval, ``items_call`` on the
    wider of the two. The seeds+items interval alone is not always the wider: its Satterthwaite degrees of
    freedom grow with the item part, so with few seeds its t quantile can shrink more than its standard error
    grows (up to 4% narrower at 6 seeds, 44% at 3), and a rule meant to add the item draw must never call what
    the seed-only rule would not."""
    rows = []
    for s in seeds:
        run = Path(out) / f"seed{s}" / "score"
        if not run.is_dir():
            raise SystemExit(f"interval_items: {run} does not exist: pass a bench/validity.py OUT/<curriculum> "
                             f"folder and seeds that it ran (--seeds).")
        for stage, file, key in (("pilot", "selection.json", "decision"), ("confirm", "confirm.json", "confirm_decision")):
            if not (run / file).is_file():
                continue
            d = json.loads((run / file).read_text(encoding="utf-8"))[key]
            if not d.get("runner_up"):
                continue
            r = intervals(pd.read_parquet(run / stage / "transfer_items.parquet"), d["top"], d["runner_up"],
                          metric, int(d.get("n_comparisons") or 1))
            margin = float(d.get("tie_margin") or 0.0)
            rows.append({"seed": s, "stage": stage, "top": d["top"], "runner_up": d["runner_up"], **r,
                         "tie_margin": margin, "verdict": d["verdict"],
                         "seed_call": r["seed_lo"] > margin,
                         "items_call": min(r["both_lo"], r["seed_lo"]) > margin})
        rows.extend(_tie_rows(Path(out), s, metric, margin_of(run)))
    return pd.DataFrame(rows, columns=["seed", "stage", "top", "runner_up", "diff", "seed_lo", "seed_hi", "both_lo",
                                       "both_hi", "widen", "items", "seeds", "tie_margin", "verdict", "seed_call",
                                       "items_call"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a validation folder holding seed<S>/score/")
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--metric", default="task_accuracy")
    ap.add_argument("--csv", type=Path, default=None, help="also write the table as CSV to this file")
    a = ap.parse_args(argv)
    t = table(a.out, a.seeds, a.metric)
    if a.csv:
        t.to_csv(a.csv, index=False, float_format="%.6g")
    print("| seed | stage | top vs runner-up | diff | seed-only interval | seeds + items | widening | verdict | "
          "called with items |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in t.itertuples():
        print(f"| {r.seed} | {r.stage} | {r.top} vs {r.runner_up} | {r.diff:.3f} | {r.seed_lo:.3f} to "
              f"{r.seed_hi:.3f} | {r.both_lo:.3f} to {r.both_hi:.3f} | {r.widen:.1f}x | {r.verdict} | "
              f"{'yes' if r.items_call else 'no'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
