"""Kendall tau of the truth with the probes, the step and -bpb, over two ranges of checkpoints, from finished
``bench/validity.py`` runs.

``validity.csv``'s ``tau_probes`` / ``tau_step`` / ``tau_neg_bpb`` rank every checkpoint the shortlist ranked: on a
toy ladder that includes the first, barely trained ones, where anything that grows with training (the step, -bpb)
orders the truth well. A selection chooses among the **plan-eligible** checkpoints only (those that pass the
shortlist's constraints, ``passes_constraints`` in ``shortlist.csv``). This script reports both ranges, and each
proxy family's own tau (``score[...]`` columns: the oriented quantity the shortlist ranks), per seed and as a
mean over seeds. The "all" columns must reproduce ``validity.csv``; the script stops if they do not.

A descriptive secondary analysis, added on 2026-12-06 (twenty-sixth session) after seeing seeds 110-119: no rule
or goal is judged on it. No training, no model: seconds.

    python bench/tau_by_range.py RUN_DIR [RUN_DIR ...] [--csv OUT.csv]

RUN_DIR: a curriculum folder of a validity run (``OUT/<curriculum>``, holding ``validity.csv``,
``truth_values.csv`` and ``seed<S>/score/shortlist.csv``).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validity import _kendall_tau_b  # noqa: E402


def seed_taus(shortlist: pd.DataFrame, truth: pd.DataFrame) -> dict[str, float]:
    """One seed's taus. ``truth``: that seed's rows of ``truth_values.csv`` (checkpoint, truth_value,
    heldout_bpb); ``shortlist``: its ``shortlist.csv``."""
    t = truth.set_index("checkpoint")
    sl = shortlist.copy()
    sl["checkpoint"] = sl["checkpoint"].astype(str)
    agg = next(c for c in ("mean_rank", "median_rank") if c in sl.columns)
    sl = sl[sl[agg].notna() & sl["checkpoint"].isin(t.index)]
    out: dict[str, float] = {}
    ranges = {"all": sl, "eligible": sl[sl["passes_constraints"].astype(bool)]}
    for name, part in ranges.items():
        y = t["truth_value"].reindex(part["checkpoint"]).to_numpy(float)
        out[f"n_{name}"] = int(len(part))
        out[f"tau_probes_{name}"] = _kendall_tau_b(-part[agg].to_numpy(float), y)
        out[f"tau_step_{name}"] = _kendall_tau_b(part["step"].to_numpy(float), y)
        out[f"tau_neg_bpb_{name}"] = _kendall_tau_b(-t["heldout_bpb"].reindex(part["checkpoint"]).to_numpy(float), y)
        if name == "eligible":
            cols = [c for c in part.columns if c.startswith("score[")]
            fams = [c[6:-1].split("/")[0] for c in cols]
            for c, fam in zip(cols, fams):   # a family with two proxies is keyed by the whole proxy name
                key = fam if fams.count(fam) == 1 else c[6:-1]
                out[f"tau_{key}_eligible"] = _kendall_tau_b(part[c].to_numpy(float), y)
    return out


def run_rows(run_dir: Path) -> pd.DataFrame:
    """Per-seed taus of one validity run folder, checked against its ``validity.csv``."""
    tv = pd.read_csv(run_dir / "truth_values.csv")
    val = pd.read_csv(run_dir / "validity.csv").set_index("seed")
    rows = []
    for seed in sorted(tv["seed"].unique()):
        sl_path = run_dir / f"seed{seed}" / "score" / "shortlist.csv"
        if not sl_path.is_file():
            raise SystemExit(f"{sl_path}: missing; RUN_DIR must be a finished validity run's curriculum folder.")
        r = {"run": run_dir.name, "seed": int(seed), **seed_taus(pd.read_csv(sl_path), tv[tv["seed"] == seed])}
        for k in ("tau_probes", "tau_step", "tau_neg_bpb"):
            want, got = float(val.loc[seed, k]), r[f"{k}_all"]
            if not (math.isclose(want, got, abs_tol=1e-9) or (want != want and got != got)):
                raise SystemExit(f"{run_dir}: seed {seed} {k} is {got} here but {want} in validity.csv; the ranges "
                                 "differ from bench/validity.py's.")
        rows.append(r)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--csv", type=Path, default=None)
    a = ap.parse_args(argv)
    df = pd.concat([run_rows(r) for r in a.runs], ignore_index=True)
    if a.csv:
        df.to_csv(a.csv, index=False)
    cols = ["seed", "n_all", "tau_probes_all", "tau_step_all", "tau_neg_bpb_all", "n_eligible", "tau_probes_eligible",
            "tau_step_eligible", "tau_neg_bpb_eligible"]
    fam = sorted(c for c in df.columns if c.startswith("tau_") and c.endswith("_eligible") and c not in cols)
    show = df[cols + fam]
    print(show.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    means = show.drop(columns=["seed"]).mean(numeric_only=True)
    sds = show.drop(columns=["seed"]).std(numeric_only=True, ddof=1)
    print(f"\nmean over {len(df)} seeds (sd):")
    for c in means.index:
        print(f"  {c:<28} {means[c]:6.2f} ({sds[c]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
