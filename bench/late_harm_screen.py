"""The screen of a late-harm attempt on one seed: criteria (a)-(d) of bench/late_harm_notes.md (issue 23).

A declared attempt goes to fresh seeds only if it passes this screen on spent seeds (the notes say how many). For
one seed's ladder it reads three outputs, each made by a command of the screen (``bench/late_harm_screen.sh``):

* ``TRUTH/truth_summary.json`` of ``bench/late_harm_truth.py`` (the truth per checkpoint, its best, and its rule's
  verdict on the best vs the latest);
* the CSV of ``bench/heldout_by_kind.py --out`` (the held-out file's bits per byte, row ``all``);
* the ``scores.parquet`` of ``probeselect score`` with the capability families ``arith_plain`` and
  ``relation_plain`` on the same checkpoints (two or more evaluation seeds).

and judges:

* (a) the truth's best lies at or before ``--final-start`` (the last data window's first step);
* (b) the truth's rule separates the best from the latest (a ``winner`` verdict);
* (c) the latest's held-out bpb is at most the best's (loss prefers the latest);
* (d) neither capability family's margin at the latest is below the best's by more than ``--sd-factor`` x the
  larger of the two checkpoints' evaluation-seed sds (the rule of ``bench/late_harm_requirements.py``).

Candidate accuracy (the capability families' headline metric) is printed beside the margins, not judged: it is the
second reading of ``bench/late_harm_requirements.py``. No training, no model: seconds.

    python bench/late_harm_screen.py --truth DIR/truth --bykind DIR-bykind.csv --scores DIR-cap/scores.parquet \\
        --final-start 2800 [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from late_harm_requirements import _first_down, _step  # noqa: E402  (the requirements' rule, shared)

from probeselect._io import atomic_write_json  # noqa: E402
from probeselect.toy.dip import CAPABILITY_FAMILIES, family_trajectories  # noqa: E402


def _read(path: Path, what: str, fix: str):
    if not path.is_file():
        raise SystemExit(f"{path}: missing; {fix}")
    try:
        if path.suffix == ".json":
            return json.loads(path.read_text(encoding="utf-8"))
        return pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"{path}: not a readable {what} ({e}); {fix}")


def judge(truth_dir: Path, bykind: Path, scores: Path, final_start: int, sd_factor: float = 3.0) -> dict:
    """The screen's verdict on one seed (module docstring): per-checkpoint truth, bpb and capability, and (a)-(d)."""
    t = _read(truth_dir / "truth_summary.json", "truth summary", "run bench/late_harm_truth.py --out on the ladder")
    missing = sorted({"truth", "best", "latest", "verdict"} - set(t))
    if missing:
        raise SystemExit(f"{truth_dir / 'truth_summary.json'}: no key(s) {', '.join(missing)}; rerun "
                         "bench/late_harm_truth.py")
    bk = _read(bykind, "CSV", "run bench/heldout_by_kind.py LADDER --checkpoints ... --out on the same checkpoints")
    if not {"checkpoint", "kind", "bpb"} <= set(bk.columns):
        raise SystemExit(f"{bykind}: not a bench/heldout_by_kind.py table (needs checkpoint, kind, bpb)")
    sc = _read(scores, "scores file", "score arith_plain and relation_plain with probeselect score on the checkpoints")
    truth = {_step(b): float(v) for b, v in t["truth"].items()}
    best, latest = _step(t["best"]), _step(t["latest"])
    bpb = {int(r["checkpoint"]): float(r["bpb"]) for _, r in bk[bk["kind"] == "all"].iterrows()}
    cap = family_trajectories(sc, CAPABILITY_FAMILIES)
    acc = family_trajectories(sc, CAPABILITY_FAMILIES, column="candidate_correct")
    for step in (best, latest):
        if step not in bpb:
            raise SystemExit(f"{bykind}: no row for checkpoint {step}; pass --checkpoints with {best} and {latest}")
        for f in CAPABILITY_FAMILIES:
            if cap[(cap["family"] == f) & (cap["step"] == step)].empty:
                raise SystemExit(f"{scores}: no {f} scores at checkpoint {step}; score both capability families on "
                                 "every screened checkpoint")
    if int(cap["n_seeds"].min()) < 2:
        raise SystemExit(f"{scores}: the capability families have one evaluation seed; the rule needs their seed sd "
                         "(score with two or more --seeds)")
    falls = [f for f in CAPABILITY_FAMILIES if best != latest
             and _first_down(cap[cap["family"] == f], best, [latest], sd_factor) is not None]
    crit = {"a_best_before_final": best <= final_start, "b_separated": t["verdict"] == "winner",
            "c_loss_prefers_latest": bpb[latest] <= bpb[best], "d_capability_holds": not falls}
    per = lambda tr, f: {int(s): round(float(v), 4) for s, v in tr[tr["family"] == f].set_index("step")["value"].items()}
    return {"truth": truth, "best": best, "latest": latest, "verdict": t["verdict"], "diff": t.get("diff"),
            "diff_ci": t.get("diff_ci"), "bpb": bpb, "capability_margin": {f: per(cap, f) for f in CAPABILITY_FAMILIES},
            "capability_accuracy": {f: per(acc, f) for f in CAPABILITY_FAMILIES},
            "capability_seed_sd_max": float(cap["seed_sd"].max()), "capability_falls": falls, **crit,
            "passes": all(crit.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--truth", type=Path, required=True, help="bench/late_harm_truth.py's --out folder")
    ap.add_argument("--bykind", type=Path, required=True, help="bench/heldout_by_kind.py's --out CSV")
    ap.add_argument("--scores", type=Path, required=True, help="probeselect score's scores.parquet (capability)")
    ap.add_argument("--final-start", type=int, required=True, help="first step of the last data window")
    ap.add_argument("--sd-factor", type=float, default=3.0, help="evaluation-seed sds a fall must exceed (default 3)")
    ap.add_argument("--json", type=Path, help="also write the verdict as JSON")
    a = ap.parse_args(argv)
    v = judge(a.truth, a.bykind, a.scores, a.final_start, a.sd_factor)
    steps = sorted(v["truth"])
    print("truth " + " / ".join(f"{v['truth'][s]:.3f}" + ("*" if s == v["best"] else "") for s in steps))
    ci = v["diff_ci"]
    print(f"rule, best {v['best']} vs latest {v['latest']}: {v['verdict']}"
          + (f" {v['diff']:.3f} ({ci[0]:.3f} to {ci[1]:.3f})" if v["diff"] is not None and ci else ""))
    print("file bpb " + " / ".join(f"{v['bpb'][s]:.4f}" for s in sorted(v["bpb"])))
    for f in CAPABILITY_FAMILIES:
        m, acc = v["capability_margin"][f], v["capability_accuracy"][f]
        print(f"{f} margin " + " / ".join(f"{m[s]:.2f}" for s in sorted(m))
              + "; candidate accuracy " + " / ".join(f"{acc[s]:.3f}" for s in sorted(acc)))
    print(f"(a) {v['a_best_before_final']} (b) {v['b_separated']} (c) {v['c_loss_prefers_latest']} "
          f"(d) {v['d_capability_holds']} {' '.join(v['capability_falls'])} => {'PASS' if v['passes'] else 'FAIL'}")
    if a.json:
        atomic_write_json(a.json, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
