"""Wall time of the validation's ground truth on some checkpoints, for any version of the code.

The truth of bench/validity.py for one checkpoint is the confirmation recipe (300 steps) under the
truth's SFT seeds (100, 101, ...) on the truth's transfer suite, robustness and held-out SFT loss
off, one torch thread. This script runs exactly that with whichever ``probeselect`` is importable,
so the same command times two versions in one session (issue 26's third goal)::

    python bench/late_harm_truth.py results/demo/ladder --checkpoints 2000 --truth-seeds 1 --out T   # writes T/truth_transfer.jsonl
    python bench/truth_time.py results/demo/ladder --checkpoints 1600 2000 --truth-seeds 6 \
        --suite T/truth_transfer.jsonl --out DIR                                        # this checkout
    python bench/truth_time.py ... --src OLD/src --out DIR2           # another version

``--src`` puts that source tree first on the import path (default: this checkout's ``src``).
Prints the seconds of the ``run_pilot`` call (model loading, training, evaluation; not the imports)
and the truth values, so that the versions can be checked to agree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("--checkpoints", type=int, nargs="+", required=True, help="steps")
    ap.add_argument("--truth-seeds", type=int, default=6, help="SFT seeds 100 .. 100+N-1 (default 6)")
    ap.add_argument("--suite", type=Path, required=True, help="the truth's transfer suite (JSONL)")
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="probeselect source tree to time")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(a.src.resolve()))

    import pandas as pd
    import torch

    import probeselect
    from probeselect.pilot import run_pilot

    if Path(probeselect.__file__).resolve().parent != (a.src.resolve() / "probeselect"):
        raise SystemExit(f"imported probeselect from {probeselect.__file__}, not from {a.src}")
    sys.path.insert(1, str(ROOT / "bench"))
    from validity import TRUTH_OFF, TRUTH_SEED_START  # after probeselect: the timed tree stays the imported one
    torch.set_num_threads(1)
    seeds = list(range(TRUTH_SEED_START, TRUTH_SEED_START + a.truth_seeds))
    ov = [f"data.train={a.ladder / 'data' / 'sft.jsonl'}", f"transfer.tasks={a.suite}", *TRUTH_OFF,
          f"seeds={json.dumps(seeds)}", *a.override]
    bases = [a.ladder / f"checkpoint-{s}" for s in a.checkpoints]
    t0 = time.perf_counter()
    run_pilot(bases, str(ROOT / "recipes" / "confirm.yaml"), a.out, progress=False, device="cpu", overrides=ov)
    secs = time.perf_counter() - t0
    tr = pd.read_csv(a.out / "transfer.csv")
    tr = tr[tr["metric"] == "task_accuracy"] if "metric" in tr.columns else tr
    print(tr.to_string(index=False))
    print(f"src {a.src}; {len(bases)} checkpoints x {len(seeds)} truth seeds: {secs:.1f} s "
          f"({secs / len(bases):.1f} s per checkpoint)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
