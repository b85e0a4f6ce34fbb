"""Measure the planted parrot dip of a toy ladder (issue 13 criteria).

Scores every checkpoint of LADDER with the demo's probe set (recipes/demo.yaml
``score.probes``, ``n_items`` items per variant) under the given evaluation seeds, then
prints the dynamics table (mean margin per checkpoint per family; capability and held-out
bits per byte next to it) and, per planted window of LADDER/data_lineage.json, the dip
statistics of :func:`probeselect.toy.dip.planted_dip`.

    python bench/ladder_dip.py LADDER [--seeds 0 1] [--n-items 24] [--out DIR] [--json FILE]
    python bench/ladder_dip.py LADDER --run RUN [--markdown]   # tables of an existing score run

``--run RUN`` reads ``RUN/scores.parquet`` and ``RUN/summary.csv`` of a finished score run of
LADDER (e.g. ``OUT/score`` of ``probeselect run recipes/demo.yaml out=OUT``: the pipeline's own
scores, every item and evaluation seed of the demo) instead of scoring; ``--markdown`` prints
the tables as Markdown (as in bench/README.md).

Criteria checked (issue 13 point 2): >= 2 conflict families dip (>= 2 consecutive
checkpoints inside or right after the window below the pre-window value by > 3x their
evaluation-seed sd) and recover (regain >= half the depth by the last checkpoint); arith_plain, relation_plain and held-out bpb do not dip.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CONFLICT = ["arith_pattern", "tmpl_repeated", "tmpl_flipped", "tmpl_mismatch", "persona_qa"]
CAPABILITY = ["arith_plain", "relation_plain"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--n-items", type=int, default=24)
    ap.add_argument("--gen-samples", type=int, default=None, help="override persona_qa gen_samples (speed)")
    ap.add_argument("--out", default=None, help="score run folder (default LADDER/../<name>-dipscore)")
    ap.add_argument("--world-seed", type=int, default=0, help="toy seed when LADDER has no ladder.json yet")
    ap.add_argument("--json", default=None, help="write the tables and verdict here")
    ap.add_argument("--run", default=None, help="tables of this finished score run of LADDER (no scoring)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args(argv)

    from probeselect._yaml import load_yaml
    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from probeselect.toy.dip import bpb_trajectory, check_planted_dip, family_trajectories, load_windows

    ladder = Path(args.ladder)
    lj = ladder / "ladder.json"
    # a ladder still being built has no ladder.json yet: score what is there (world seed from --world-seed)
    info = json.loads(lj.read_text()) if lj.is_file() else {"seed": args.world_seed,
                                                              "final_heldout_arith_accuracy": float("nan")}
    demo = load_yaml(ROOT / "recipes" / "demo.yaml")
    specs = []
    for p in demo["score"]["probes"]:
        s = load_spec(ROOT / p)
        s = dataclasses.replace(s, n_items=min(args.n_items, s.n_items))
        params = dict(s.params)
        if "world_seed" in params:
            params["world_seed"] = info["seed"]
        if args.gen_samples is not None and "gen_samples" in params:
            params["gen_samples"] = args.gen_samples
        specs.append(dataclasses.replace(s, params=params))
    t0 = time.time()
    if args.run:
        run = Path(args.run)
        if not (run / "scores.parquet").is_file():
            ap.error(f"{run}/scores.parquet not found: --run takes a finished score run folder")
        scores = pd.read_parquet(run / "scores.parquet")
        summary = pd.read_csv(run / "summary.csv") if (run / "summary.csv").is_file() else None
        args.seeds = sorted(int(x) for x in scores["seed"].unique()) if "seed" in scores else args.seeds
        args.n_items = int(scores.groupby(["checkpoint", "family", "variant", "seed"]).size().max()) \
            if {"variant", "seed"} <= set(scores.columns) else args.n_items
    else:
        out = Path(args.out) if args.out else ladder.parent / f"{ladder.name}-dipscore"
        res = score_checkpoints(ladder, specs, seeds=args.seeds, out=out, heldout=ladder / "data" / "heldout.txt",
                                audit_items=0, device="cpu", progress=False)
        scores, summary = res.scores, res.summary
    score_s = time.time() - t0
    windows = load_windows(ladder / "data_lineage.json")

    traj = family_trajectories(scores, CONFLICT + CAPABILITY)
    bpb = bpb_trajectory(summary)
    wide = traj.pivot(index="step", columns="family", values="value")
    wide["bpb"] = bpb.set_index("step")["value"]
    sd = traj.pivot(index="step", columns="family", values="seed_sd")
    win_of = {}
    for st in wide.index:
        win_of[st] = next((w["name"] for w in windows if w["start_step"] < st <= w["end_step"]), "")
    wide.insert(0, "window", pd.Series(win_of))
    cols = ["window"] + [c for c in CONFLICT + CAPABILITY if c in wide] + ["bpb"]
    print(f"# {ladder}  seed={info['seed']}  eval seeds={args.seeds}  n_items={args.n_items}  "
          f"final held-out arith={info['final_heldout_arith_accuracy']:.3f}  "
          + (f"scores of {args.run}" if args.run else f"scoring {score_s:.0f}s"))
    res_dip = check_planted_dip(scores, summary, ladder / "data_lineage.json")
    show = ["window", "family", "ref_step", "ref_value", "min_step", "min_value", "depth", "seed_sd",
            "longest_below_run", "dipped", "last_value", "recovery", "recovered"]
    if args.markdown:
        print("\nmean margin (nats) per checkpoint, ± evaluation-seed sd of the family mean; bpb = held-out bits per byte\n")
        print(_markdown_dynamics(wide, sd, cols))
        print("\nplanted dips (bpb: lower is better; tolerance 1% instead of a seed sd)\n")
        print(_markdown_table(res_dip["dips"].reindex(columns=show)))
    else:
        print("\nmean margin (nats) per checkpoint; bpb = held-out bits per byte")
        print(wide[cols].round(3).to_string())
        print("\nevaluation-seed sd of the family mean")
        print(sd[[c for c in CONFLICT + CAPABILITY if c in sd]].round(3).to_string())
        print("\nplanted dips (bpb: lower is better; tolerance 1% instead of a seed sd)")
        print(res_dip["dips"].reindex(columns=show).round(3).to_string(index=False))
    verdict = {"seed": info["seed"], "windows": res_dip["windows"],
               "final_heldout_arith": info["final_heldout_arith_accuracy"],
               "pass": res_dip["pass"] and info["final_heldout_arith_accuracy"] >= 0.9}
    print("\nverdict:", json.dumps(verdict))
    if args.json:
        Path(args.json).write_text(json.dumps({"verdict": verdict, "table": wide[cols].reset_index().to_dict("records"),
                                               "seed_sd": sd.reset_index().to_dict("records"),
                                               "dips": res_dip["dips"].to_dict("records")}, indent=1, default=str))
    return 0 if verdict["pass"] else 1


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if v != v else f"{v:.3f}"
    return str(v)


def _markdown_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _markdown_dynamics(wide: pd.DataFrame, sd: pd.DataFrame, cols: list[str]) -> str:
    """step | window | family means with ± seed sd (conflict families) | capability | bpb."""
    lines = ["| step | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for step, row in wide.iterrows():
        cells = [str(step)]
        for c in cols:
            v = row[c]
            if c in CONFLICT and c in sd and pd.notna(sd.loc[step, c]):
                cells.append(f"{v:.2f} ±{sd.loc[step, c]:.2f}")
            elif c == "bpb":
                cells.append(f"{v:.3f}")
            elif isinstance(v, float):
                cells.append(f"{v:.2f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
