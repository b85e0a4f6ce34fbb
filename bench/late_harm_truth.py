"""Single-seed ground truth on some checkpoints of one toy ladder (issue 23 development tool).

The truth of bench/validity.py, for a few checkpoints of a ladder that is already built: the
confirmation recipe (300 steps) under truth SFT seeds 100.. on the truth's own transfer suite
(stream ``transfer-truth``, every pilot prompt excluded; robustness and held-out SFT loss off).
Prints, per checkpoint, the truth value (task accuracy, mean over the seeds) with its per-seed
values; per kind, the accuracy, the share of shortcut answers (``task_shortcut_rate``) and the
post-SFT shortcut margin (``task_shortcut_margin``, nats); and the truth's own rule (the plan's
interval rule) on best vs latest; ``OUT/truth_summary.json`` keeps the values and the verdict for
``bench/late_harm_screen.py``. Used while designing the late-harm curriculum; the numbers go to
bench/late_harm_notes.md.

    python bench/late_harm_truth.py LADDER --checkpoints 1200 1400 2000 --truth-seeds 2 --out DIR
    python bench/late_harm_truth.py LADDER ... --override batch_seeds=false   # the single-run loop
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("--checkpoints", type=int, nargs="+", required=True, help="steps")
    ap.add_argument("--truth-seeds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra recipe override, e.g. batch_seeds=false (the single-run loop); repeatable")
    a = ap.parse_args(argv)

    import pandas as pd
    import torch

    from probeselect.pilot import run_pilot
    from probeselect.plan import load_selection_plan
    from probeselect.select import load_pilot_tables, rank_bases
    from probeselect.toy.data import make_transfer_rows, read_jsonl
    from probeselect.toy.world import ToyWorld
    from validity import TRUTH_OFF, TRUTH_SEED_START, TRUTH_STREAM, _truth_spec

    torch.set_num_threads(1)
    lad = a.ladder
    seed = int(json.loads((lad / "ladder.json").read_text())["seed"])
    data = lad / "data"
    pilot = read_jsonl(data / "transfer.jsonl")
    sft = {r["prompt"] for r in read_jsonl(data / "sft.jsonl")}
    kinds = tuple(dict.fromkeys(r["kind"] for r in pilot))
    truth = make_transfer_rows(ToyWorld.generate(seed), sft, stream=TRUTH_STREAM,
                               exclude_prompts={r["prompt"] for r in pilot}, kinds=kinds)
    for r in truth:
        r["id"] = "truth-" + r["id"]
    a.out.mkdir(parents=True, exist_ok=True)
    suite = a.out / "truth_transfer.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in truth))
    seeds = list(range(TRUTH_SEED_START, TRUTH_SEED_START + a.truth_seeds))
    ov = [f"data.train={data / 'sft.jsonl'}", f"transfer.tasks={suite}", *TRUTH_OFF, f"seeds={json.dumps(seeds)}",
          *a.override]
    bases = [lad / f"checkpoint-{s}" for s in a.checkpoints]
    t0 = time.perf_counter()
    run_pilot(bases, str(ROOT / "recipes" / "confirm.yaml"), a.out / "truth", progress=False, device="cpu", overrides=ov)
    spec = _truth_spec(load_selection_plan(ROOT / "recipes" / "selection.yaml").selection)
    rk = rank_bases(load_pilot_tables(a.out / "truth"), spec)
    tab = rk.table.copy()
    print(tab.to_string())
    items = a.out / "truth" / "transfer_items.parquet"
    if items.is_file():  # per base and kind: accuracy, share of shortcut answers, post-SFT shortcut margin (nats)
        it = pd.read_parquet(items)
        it = it[it["metric"].isin(["task_accuracy", "task_shortcut_rate", "task_shortcut_margin"])]
        print(it.groupby(["metric", "base", "kind"])["value"].mean().unstack("kind").round(3).to_string())
    last = f"checkpoint-{max(a.checkpoints)}"
    sub = rank_bases(load_pilot_tables(a.out / "truth"), spec, bases=[str(tab.iloc[0]["base"]), last]) \
        if str(tab.iloc[0]["base"]) != last else None
    print(f"truth best {rk.top}; vs latest {last}: "
          + ((f"{sub.verdict} diff " + (f"{sub.diff:.3f}" if sub.diff is not None else "n/a (one truth seed)")
              + f" CI {sub.diff_ci}") if sub else "best is the latest"))
    from probeselect._io import atomic_write_json

    atomic_write_json(a.out / "truth_summary.json", {   # what bench/late_harm_screen.py reads
        "ladder": str(lad), "seed": seed, "truth_seeds": seeds,
        "truth": {str(b): float(v) for b, v in zip(tab["base"], tab["value"])},
        "best": str(rk.top), "latest": last, "verdict": sub.verdict if sub else "best is the latest",
        "diff": None if sub is None or sub.diff is None else float(sub.diff),
        "diff_ci": None if sub is None or sub.diff_ci is None else [float(x) for x in sub.diff_ci]})
    print(f"seconds {time.perf_counter() - t0:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
