"""Do the probes see a late harm that matched SFT does not undo? Per seed of finished ``bench/validity.py`` runs:
how far the conflict families' margins fall from one checkpoint to the latest, next to the truth's regret of the
latest (truth's best minus the latest's post-SFT value) and whether the truth's rule separates them.

The drop is the mean over the conflict families (``kind == "conflict"`` rows of ``summary.csv``) of the family's
mean margin (mean over its prompt variants and evaluation seeds) at ``--from-step`` minus at the latest checkpoint:
positive = the probes prefer the earlier base. Reported per seed, and the Spearman correlation of the drop with the
latest's regret over all seeds given. A descriptive secondary analysis, added on 2026-12-07 (twenty-eighth session)
after seeing seeds 110-134 of attempt 18c: no rule or goal is judged on it. No training, no model: seconds.

    python bench/probe_drop_vs_regret.py RUN_DIR [RUN_DIR ...] --from-step 2400 [--csv OUT.csv]

RUN_DIR: a curriculum folder of a finished validity run (``OUT/<curriculum>``, holding ``truth_values.csv``,
``selectors.csv`` and ``seed<S>/score/summary.csv``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def _need(path: Path) -> Path:
    if not path.is_file():
        raise SystemExit(f"{path}: missing; RUN_DIR must be a finished bench/validity.py curriculum folder "
                         "(OUT/<curriculum>, with truth_values.csv, selectors.csv and seed<S>/score/summary.csv)")
    return path


def margin_drop(summary: pd.DataFrame, from_ckpt: str, latest: str) -> float:
    """Mean over conflict families of (family mean margin at ``from_ckpt``) - (at ``latest``)."""
    c = summary[summary["kind"] == "conflict"].groupby(["checkpoint", "family"])["mean_margin"].mean().unstack()
    missing = [n for n in (from_ckpt, latest) if n not in c.index]
    if missing:
        raise SystemExit(f"summary.csv has no conflict-probe rows for {', '.join(missing)}; pass a --from-step that "
                         "the ladder saved")
    return float((c.loc[from_ckpt] - c.loc[latest]).mean())


def run_rows(run: Path, from_step: int) -> list[dict]:
    truth = pd.read_csv(_need(run / "truth_values.csv"))
    sel = pd.read_csv(_need(run / "selectors.csv"))
    rows = []
    for seed, t in truth.groupby("seed"):
        t = t.assign(step=t["checkpoint"].str.rsplit("-", n=1).str[-1].astype(int)).sort_values("step")
        latest = str(t["checkpoint"].iloc[-1])
        summary = pd.read_csv(_need(run / f"seed{seed}" / "score" / "summary.csv"))
        lat = sel[(sel["seed"] == seed) & (sel["selector"] == "latest")]
        if len(lat) != 1:
            raise SystemExit(f"{run / 'selectors.csv'}: no single 'latest' row for seed {seed}")
        vals = t.set_index("checkpoint")["truth_value"]
        rows.append({"run": run.parent.name, "seed": int(seed), "latest": latest,
                     "margin_drop": margin_drop(summary, f"checkpoint-{from_step}", latest),
                     "latest_regret": float(vals.max() - vals[latest]),
                     "separated": not bool(lat["agree"].iloc[0])})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="OUT/<curriculum> folders of finished bench/validity.py runs")
    ap.add_argument("--from-step", type=int, required=True, help="the earlier checkpoint's step (e.g. the harm start)")
    ap.add_argument("--csv", type=Path, default=None)
    a = ap.parse_args(argv)
    df = pd.DataFrame([r for run in a.runs for r in run_rows(run, a.from_step)]).sort_values("seed")
    pd.set_option("display.width", 200)
    print(df.round(4).to_string(index=False))
    rho = df["margin_drop"].corr(df["latest_regret"], method="spearman") if len(df) > 2 else float("nan")
    print(f"\n{len(df)} seeds; margin drop > 0 on {int((df['margin_drop'] > 0).sum())}; truth separates the latest on "
          f"{int(df['separated'].sum())}; Spearman(margin drop, latest's regret) = {rho:.2f}")
    if a.csv:
        df.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
