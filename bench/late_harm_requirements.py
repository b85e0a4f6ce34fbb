"""Issue 23's late-harm ladder requirements, per seed, from a finished ``bench/validity.py`` run.

For every seed of a validity record (``truth_values.csv``, ``validity.csv``, ``selectors.csv``) and its run folder
(``<run>/seed<S>/score/scores.parquet``), one row with:

* ``truth_best`` and ``before_final``: the truth's best checkpoint and whether it lies at or before
  ``--final-start`` (the first step of the last data window; a checkpoint at that step is trained before it);
* ``separated``: the truth's own rule separates the best from the latest (the record's ``latest`` selector row
  does not ``agree``), with the latest's regret and its 95% interval;
* ``bpb_best``, ``bpb_latest`` and ``loss_prefers_latest`` (the latest's held-out bpb at most the best's);
* ``transfer_falls_at``: the first checkpoint after the truth's best whose truth value is below the best's by
  more than ``--margin`` (None when none is);
* ``families_down``: the conflict families (``probeselect.toy.dip.CONFLICT_FAMILIES``) below their value at
  ``--harm-start`` by more than 3 x the larger of the two checkpoints' evaluation-seed sds at some checkpoint
  after it, at or before ``transfer_falls_at`` (every later checkpoint when transfer does not fall), each with
  the first such step;
* ``capability_falls``: the capability families whose margin at the latest is below the truth's best's by more
  than 3 x the larger evaluation-seed sd (empty when the best is the latest);
* ``capability_acc_falls``: the same rule on the capability families' headline metric, candidate accuracy (the
  share of items whose task answer beats the foil and the distractor; ``probes/capability/*.yaml``), a second
  reading added after attempt 22's screen (bench/late_harm_notes.md, thirty-fifth session), where the two disagreed.

Used for ``bench/VALIDITY.md``'s late-harm sections. No training, no model: seconds.

    python bench/late_harm_requirements.py RUN_DIR RECORD_DIR --harm-start 2400 --final-start 2800 [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from probeselect._io import atomic_write_csv
from probeselect.toy.dip import CAPABILITY_FAMILIES, CONFLICT_FAMILIES, family_trajectories


def _step(name: str) -> int:
    return int(str(name).rsplit("-", 1)[-1])


def _first_down(traj: pd.DataFrame, ref_step: int, steps: list[int], sd_factor: float) -> int | None:
    t = traj.set_index("step")
    if ref_step not in t.index:
        return None
    ref, ref_sd = float(t.loc[ref_step, "value"]), float(t.loc[ref_step, "seed_sd"])
    for s in steps:
        if s in t.index and t.loc[s, "value"] < ref - sd_factor * max(ref_sd, float(t.loc[s, "seed_sd"])):
            return s
    return None


def requirements(run_dir: Path, record: Path, harm_start: int, final_start: int, margin: float = 0.02,
                 sd_factor: float = 3.0) -> pd.DataFrame:
    """One row per seed of ``record`` (module docstring)."""
    for name in ("truth_values.csv", "validity.csv", "selectors.csv"):
        if not (record / name).is_file():
            raise SystemExit(f"{record / name}: missing; pass the folder of a finished bench/validity.py run "
                             "(OUT/<curriculum>/ or a bench/validity_runs/ record)")
    need = {"truth_values.csv": {"seed", "checkpoint", "truth_value", "heldout_bpb"},
            "validity.csv": {"seed", "truth_best"},
            "selectors.csv": {"seed", "selector", "agree", "regret", "regret_lo", "regret_hi"}}
    tables = {}
    for name, cols in need.items():
        try:
            tables[name] = pd.read_csv(record / name)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise SystemExit(f"{record / name}: not a readable CSV ({e}); rerun bench/validity.py or restore the record")
        missing = sorted(cols - set(tables[name].columns))
        if missing:
            raise SystemExit(f"{record / name}: no column(s) {', '.join(missing)}; pass the folder of a finished "
                             "bench/validity.py run")
    tv, val, sel = tables["truth_values.csv"], tables["validity.csv"], tables["selectors.csv"]
    rows = []
    for seed, g in tv.groupby("seed"):
        g = g[~g["checkpoint"].astype(str).str.contains("perturbed")].copy()
        g["step"] = g["checkpoint"].map(_step)
        g = g.sort_values("step").set_index("step")
        v = val[val["seed"] == seed].iloc[0]
        best, latest = _step(v["truth_best"]), int(g.index.max())
        lat = sel[(sel["seed"] == seed) & (sel["selector"] == "latest")].iloc[0]
        later = [s for s in g.index if s > best]
        falls = [s for s in later if g.loc[s, "truth_value"] < g.loc[best, "truth_value"] - margin]
        fall = falls[0] if falls else None
        scores = run_dir / f"seed{seed}" / "score" / "scores.parquet"
        if not scores.is_file():
            raise SystemExit(f"{scores}: missing; RUN_DIR must be the validity run's OUT/<curriculum>/ folder "
                             "(the record does not keep the scores)")
        sc = pd.read_parquet(scores)
        if "candidate_correct" not in sc.columns:
            raise SystemExit(f"{scores}: no candidate_correct column (scored before candidate accuracy was recorded); "
                             "rescore the run with `probeselect score`")
        traj = family_trajectories(sc, list(CONFLICT_FAMILIES) + list(CAPABILITY_FAMILIES))
        if not traj.empty and int(traj["n_seeds"].min()) < 2:   # the sd would be NaN and every fall would pass
            raise SystemExit(f"{scores}: one evaluation seed; the 3-sd rule needs the seed sd (rerun the validation "
                             "with two or more score seeds)")
        acc = family_trajectories(sc, CAPABILITY_FAMILIES, column="candidate_correct")
        window = [s for s in sorted(set(traj["step"])) if s > harm_start and (fall is None or s <= fall)]
        down = []
        for f in CONFLICT_FAMILIES:
            s = _first_down(traj[traj["family"] == f], harm_start, window, sd_factor)
            if s is not None:
                down.append(f"{f}@{s}")
        cap, cap_acc = [], []
        if best != latest:
            for f in CAPABILITY_FAMILIES:
                if _first_down(traj[traj["family"] == f], best, [latest], sd_factor) is not None:
                    cap.append(f)
                if _first_down(acc[acc["family"] == f], best, [latest], sd_factor) is not None:
                    cap_acc.append(f)
        rows.append({"seed": int(seed), "truth_best": best, "truth_best_value": float(g.loc[best, "truth_value"]),
                     "before_final": best <= final_start, "separated": not bool(lat["agree"]),
                     "latest_regret": float(lat["regret"]), "latest_regret_lo": float(lat["regret_lo"]),
                     "latest_regret_hi": float(lat["regret_hi"]), "bpb_best": float(g.loc[best, "heldout_bpb"]),
                     "bpb_latest": float(g.loc[latest, "heldout_bpb"]),
                     "loss_prefers_latest": bool(g.loc[latest, "heldout_bpb"] <= g.loc[best, "heldout_bpb"]),
                     "transfer_falls_at": fall, "families_down": " ".join(down), "n_families_down": len(down),
                     "capability_falls": " ".join(cap), "capability_acc_falls": " ".join(cap_acc)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="the validity run's OUT/<curriculum>/ folder (seed<S>/score/...)")
    ap.add_argument("record", type=Path, help="its record (bench/validity_runs/<name>/) or the same folder")
    ap.add_argument("--harm-start", type=int, required=True, help="first step of the first harm window")
    ap.add_argument("--final-start", type=int, required=True, help="first step of the last data window")
    ap.add_argument("--margin", type=float, default=0.02, help="the plan's tie margin (default 0.02)")
    ap.add_argument("--csv", type=Path, help="also write the table as CSV")
    a = ap.parse_args(argv)
    df = requirements(a.run_dir, a.record, a.harm_start, a.final_start, a.margin)
    if a.csv:
        atomic_write_csv(a.csv, df)   # an interrupted write leaves no partial table
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
