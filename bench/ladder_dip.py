"""Measure the planted parrot dip of a toy ladder (issue 13 criteria).

Scores every checkpoint of LADDER with the demo's probe set (recipes/demo.yaml
``score.probes``, ``n_items`` items per variant) under the given evaluation seeds, then
prints the dynamics table (mean margin per checkpoint per family; capability and held-out
bits per byte next to it) and, per planted window of LADDER/data_lineage.json, the dip
statistics of :func:`probeselect.toy.dip.planted_dip`.

    python bench/ladder_dip.py LADDER [--seeds 0 1] [--n-items 24] [--out DIR] [--json FILE]

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
    out = Path(args.out) if args.out else ladder.parent / f"{ladder.name}-dipscore"
    t0 = time.time()
    res = score_checkpoints(ladder, specs, seeds=args.seeds, out=out, heldout=ladder / "data" / "heldout.txt",
                            audit_items=0, device="cpu", progress=False)
    score_s = time.time() - t0
    windows = load_windows(ladder / "data_lineage.json")

    traj = family_trajectories(res.scores, CONFLICT + CAPABILITY)
    bpb = bpb_trajectory(res.summary)
    wide = traj.pivot(index="step", columns="family", values="value")
    wide["bpb"] = bpb.set_index("step")["value"]
    sd = traj.pivot(index="step", columns="family", values="seed_sd")
    win_of = {}
    for st in wide.index:
        win_of[st] = next((w["name"] for w in windows if w["start_step"] < st <= w["end_step"]), "")
    wide.insert(0, "window", pd.Series(win_of))
    cols = ["window"] + [c for c in CONFLICT + CAPABILITY if c in wide] + ["bpb"]
    print(f"# {ladder}  seed={info['seed']}  eval seeds={args.seeds}  n_items={args.n_items}  "
          f"final held-out arith={info['final_heldout_arith_accuracy']:.3f}  scoring {score_s:.0f}s")
    print("\nmean margin (nats) per checkpoint; bpb = held-out bits per byte")
    print(wide[cols].round(3).to_string())
    print("\nevaluation-seed sd of the family mean")
    print(sd[[c for c in CONFLICT + CAPABILITY if c in sd]].round(3).to_string())

    res_dip = check_planted_dip(res.scores, res.summary, ladder / "data_lineage.json")
    show = ["window", "family", "ref_step", "ref_value", "min_step", "min_value", "depth", "seed_sd",
            "longest_below_run", "dipped", "last_value", "recovery", "recovered"]
    print("\nplanted dips (bpb: lower is better; tolerance 1% instead of a seed sd)")
    print(res_dip["dips"][show].round(3).to_string(index=False))
    verdict = {"seed": info["seed"], "windows": res_dip["windows"],
               "final_heldout_arith": info["final_heldout_arith_accuracy"],
               "pass": res_dip["pass"] and info["final_heldout_arith_accuracy"] >= 0.9}
    print("\nverdict:", json.dumps(verdict))
    if args.json:
        Path(args.json).write_text(json.dumps({"verdict": verdict, "table": wide[cols].reset_index().to_dict("records"),
                                               "seed_sd": sd.reset_index().to_dict("records"),
                                               "dips": res_dip["dips"].to_dict("records")}, indent=1, default=str))
    return 0 if verdict["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
