"""How much wider the pipeline's decision interval would be if it also generalised over transfer items.

The selection's difference interval (src/probeselect/select.py, ``compare_top``) is a seed-level paired t:
each seed's value is a mean over the SAME transfer items, so it says how a new SFT seed would rank the
bases on these items, not how a new draw of items would. This script recomputes, for the top vs the
runner-up of every pilot and confirmation of a finished validation (bench/validity.py OUT folder), the
seed-only interval next to one that adds the item variance: the pigeonhole estimate
se^2 = var(seed means of d) / S + var(item means of d) / I for d = top - runner-up per (item, seed)
(Owen 2007; it counts the item x seed residual twice, so it is slightly conservative), with Satterthwaite
degrees of freedom and the same Bonferroni factor as the decision. Development analysis, not a selector.

    python bench/interval_items.py OUT/late_harm_attempt10e --seeds 50 51 52 53 54
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a validation folder holding seed<S>/score/")
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--metric", default="task_accuracy")
    a = ap.parse_args(argv)
    print("| seed | stage | top vs runner-up | diff | seed-only interval | seeds + items | widening | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for s in a.seeds:
        run = a.out / f"seed{s}" / "score"
        for stage, file, key in (("pilot", "selection.json", "decision"), ("confirm", "confirm.json", "confirm_decision")):
            if not (run / file).is_file():
                continue
            d = json.loads((run / file).read_text(encoding="utf-8"))[key]
            if not d.get("runner_up"):
                continue
            r = intervals(pd.read_parquet(run / stage / "transfer_items.parquet"), d["top"], d["runner_up"],
                          a.metric, int(d.get("n_comparisons") or 1))
            print(f"| {s} | {stage} | {d['top']} vs {d['runner_up']} | {r['diff']:.3f} | {r['seed_lo']:.3f} to "
                  f"{r['seed_hi']:.3f} | {r['both_lo']:.3f} to {r['both_hi']:.3f} | {r['widen']:.1f}x | {d['verdict']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
