"""Coverage of the decision interval and the false "clear winner" rate with 2-5 SFT seeds.

Synthetic pilots (tests/_selection_fakes.simulate_pilot_items: seed effects shared across
bases, base x seed interaction, shared item difficulty and item noise; 100 items per run)
with a known true difference. For each number of seeds and each method, over STUDIES
simulated studies:

* coverage: share of 95% intervals of (top - runner-up) that contain the true difference of
  the two bases the data picked as top and runner-up (bases 0.2 apart; with k = 3 the third
  base is another 0.1 below);
* false winner: share of studies declaring a clear winner (lower bound > 0) when all k
  bases are equal (k = 2 and k = 3);
* width: mean interval width (true-difference studies, units of the simulated metric).

Methods: ``old`` = the earlier paired percentile bootstrap resampling SFT seeds and items
(500 replicates); ``new`` = probeselect.select.compare_top (seed-level paired t, Bonferroni
over the k - 1 comparisons of the top).

Run from the repository root:  PYTHONPATH=src python bench/selection_coverage.py [STUDIES]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _selection_fakes import simulate_pilot_items  # noqa: E402

from probeselect.select import compare_top  # noqa: E402

LEVEL = 0.95


def old_bootstrap(y: np.ndarray, rng: np.random.Generator, B: int = 500, chunk: int = 50):
    """The earlier method: top/runner-up by item-and-seed means, percentile interval of the
    difference over B paired replicates resampling seeds and items (every base alike)."""
    z, k, n, n_i = y.shape
    v = y.mean(-1)
    order = np.argsort(-v.mean(-1), axis=-1, kind="stable")
    top, ru = order[:, 0], order[:, 1]
    lo = np.empty(z)
    hi = np.empty(z)
    lo_all = np.empty((z, k))  # lower bound of top - j for every j (winner: all above 0)
    for a in range(0, z, chunk):
        b = min(z, a + chunk)
        w_i = rng.multinomial(n_i, np.full(n_i, 1 / n_i), size=(b - a, B)) / n_i      # (c, B, I)
        w_s = rng.multinomial(n, np.full(n, 1 / n), size=(b - a, B)) / n             # (c, B, S)
        per_seed = np.einsum("cksi,cbi->cksb", y[a:b], w_i)                           # (c, k, S, B)
        reps = np.einsum("cksb,cbs->cbk", per_seed, w_s)                              # (c, B, k)
        t_rep = np.take_along_axis(reps, top[a:b, None, None], axis=2)               # (c, B, 1)
        d = t_rep - reps                                                               # (c, B, k)
        q_lo = np.quantile(d, (1 - LEVEL) / 2, axis=1)                                 # (c, k)
        q_hi = np.quantile(d, 1 - (1 - LEVEL) / 2, axis=1)
        idx = np.arange(b - a)
        lo[a:b], hi[a:b] = q_lo[idx, ru[a:b]], q_hi[idx, ru[a:b]]
        q_lo[idx, top[a:b]] = np.inf
        lo_all[a:b] = q_lo
    return top, ru, lo, hi, lo_all.min(axis=1) > 0


def new_t(y: np.ndarray):
    c = compare_top(y.mean(-1), LEVEL)
    _, lo, hi = c.runner_up_diff()
    return c.top, c.runner_up, lo, hi, c.winner(0.0)


def main(studies: int = 1000) -> None:
    rng = np.random.default_rng(2026)
    rows = []
    t0 = time.perf_counter()
    for n in (2, 3, 5):
        for k, diff_means in ((2, [0.2, 0.0]), (3, [0.2, 0.0, -0.1])):
            y_diff = simulate_pilot_items(rng, studies=studies, true_means=diff_means, n_seeds=n)
            y_null = simulate_pilot_items(rng, studies=studies, true_means=[0.0] * k, n_seeds=n)
            mu = np.asarray(diff_means)
            for name, fn in (("old", lambda y: old_bootstrap(y, rng)), ("new", new_t)):
                top, ru, lo, hi, _ = fn(y_diff)
                truth = mu[top] - mu[ru]
                cov = np.mean((lo <= truth) & (truth <= hi))
                width = np.mean(hi - lo)
                fw = np.mean(fn(y_null)[4])
                rows.append((n, k, name, cov, fw, width))
    print(f"| SFT seeds | bases k | method | coverage of true diff | false winner (equal bases) | mean width |")
    print("|---|---|---|---|---|---|")
    for n, k, name, cov, fw, width in rows:
        print(f"| {n} | {k} | {name} | {cov:.1%} | {fw:.1%} | {width:.3f} |")
    print(f"\n{studies} studies per cell; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
