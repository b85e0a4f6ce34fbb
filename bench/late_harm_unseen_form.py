"""Issue 23 experiment: does ``arith_pattern`` in a line format that no corpus document, planted harm, probe
or transfer item uses follow the truth on a late-harm ladder? Not a shipped probe: the extra formats are
added to the family for this process only.

    python bench/late_harm_unseen_form.py LADDER TRUTH_CSV [TRUTH_CSV ...] --out DIR [--steps 1200 1400 ...]

TRUTH_CSV: ``transfer.csv`` files of truth runs on LADDER's checkpoints (``bench/late_harm_truth.py``'s
``OUT/truth/transfer.csv``; several are merged, the first value of a (checkpoint, seed) wins). Scores
``arith_pattern`` (48 items, evaluation seeds 0 and 1) in the variants ``eq`` (the corpus format), ``colon``
(``a + b : c``), ``equals`` (``a plus b equals c``) and ``arrow`` (``a + b -> c``, the transfer suite's
demonstration format, shown for reference only: a probe in the truth's own format would not be one that
generalises) on the checkpoints of ``--steps``, and prints the mean margin per checkpoint and variant next to
the truth (task accuracy, mean over its seeds), and Kendall tau-b of each variant and of the step with the truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

EXTRA = {"colon": "{a} {op} {b} : {c}", "arrow": "{a} {op} {b} -> {c}", "equals": "{a} {opword} {b} equals {c}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("truth", type=Path, nargs="+")
    ap.add_argument("--steps", type=int, nargs="+", default=[1200, 1400, 1600, 1800, 2000])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)

    import pandas as pd
    import torch

    import probeselect.probes._arithmetic as ar
    import probeselect.probes._registry as reg
    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from validity import _kendall_tau_b

    torch.set_num_threads(1)
    ar.TEMPLATES.update(EXTRA)
    reg._FAMILIES["arith_pattern"] = dataclasses.replace(reg._FAMILIES["arith_pattern"], variants=tuple(ar.TEMPLATES))
    spec = dataclasses.replace(load_spec(ROOT / "probes" / "arith_pattern.yaml"),
                               variants=("eq", "colon", "equals", "arrow"), n_items=48)
    truth = pd.concat([pd.read_csv(p) for p in a.truth])
    truth = truth[truth["metric"] == "task_accuracy"].drop_duplicates(["base", "seed"])
    names = [f"checkpoint-{s}" for s in a.steps]
    missing = [n for n in names if n not in set(truth["base"])]
    if missing:
        ap.error(f"no truth for {missing} in {[str(p) for p in a.truth]}")
    val = truth.groupby("base")["value"].mean().loc[names]
    with tempfile.TemporaryDirectory() as sub:  # only the chosen checkpoints
        for n in names:
            os.symlink((a.ladder / n).resolve(), Path(sub) / n)
        res = score_checkpoints(sub, [spec], seeds=[0, 1], out=a.out, audit_items=0, device="cpu", progress=False)
    m = res.scores.groupby(["checkpoint", "variant"])["margin"].mean().unstack("variant").loc[names]
    print(m.round(2).assign(truth=val.round(3)).to_string())
    taus = {"step": _kendall_tau_b(pd.Series(a.steps, dtype=float).to_numpy(), val.to_numpy(float))}
    taus.update({v: _kendall_tau_b(m[v].to_numpy(float), val.to_numpy(float)) for v in m.columns})
    print("tau with the truth: " + ", ".join(f"{k} {v:.2f}" for k, v in taus.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
