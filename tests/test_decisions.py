"""Hand-worked numbers for the statistics behind every decision, and tests sitting exactly on
each decision threshold (issue 29). Each test names the mistake it catches; bench/mutations.py
puts those mistakes back one at a time and checks that these tests fail."""

import math

import numpy as np
import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json
from probeselect.dynamics import compute_dynamics, hop_stats, hop_threshold, zigzag_legs
from probeselect.select import compare_top
from probeselect.tables import summarize_scores


def t2_quantile(p: float) -> float:
    """Student t quantile with 2 degrees of freedom, closed form (no scipy):
    F(t) = 1/2 + t / (2 sqrt(2 + t^2))  =>  t_p = (2p - 1) sqrt(2 / (4 p (1 - p)))."""
    return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))


# --- compare_top: Bonferroni over the k - 1 comparisons ------------------------------------------

def test_compare_top_three_bases_by_hand():
    """k = 3 bases, n = 3 seeds. Seed values (higher = better):
        A: 3 4 5 (mean 4)   B: 1 3 2 (mean 2)   C: 0 1 2 (mean 1)
    top = A. d(A-B) = 2 1 3: mean 2, sd 1. d(A-C) = 3 3 3: mean 3, sd 0.
    Bonferroni over k - 1 = 2 comparisons at 95%: quantile 1 - 0.05 / (2 * 2) = 0.9875 of t_2
    = 0.975 * sqrt(2 / 0.049375) = 6.20535; half-width vs B = 6.20535 * 1 / sqrt(3) = 3.58266.
    (Without the factor the quantile would be t_2(0.975) = 4.30265 and the half-width 2.48414.)"""
    v = np.array([[3.0, 4.0, 5.0], [1.0, 3.0, 2.0], [0.0, 1.0, 2.0]])
    c = compare_top(v, 0.95)
    crit = t2_quantile(0.9875)
    assert crit == pytest.approx(6.20535, abs=1e-5)
    assert c.crit == pytest.approx(crit, rel=1e-9)
    assert list(c.order) == [0, 1, 2] and c.n_seeds == 3
    np.testing.assert_allclose(c.diff, [0.0, 2.0, 3.0])
    np.testing.assert_allclose(c.sd, [0.0, 1.0, 0.0], atol=1e-12)
    assert c.half[1] == pytest.approx(crit / math.sqrt(3), rel=1e-9)
    d, lo, hi = c.runner_up_diff()
    assert (d, lo, hi) == pytest.approx((2.0, 2.0 - 3.58266, 2.0 + 3.58266), abs=1e-5)
    # the interval vs C has zero width (every paired difference is 3)
    assert (c.lo[2], c.hi[2]) == pytest.approx((3.0, 3.0))
    # k = 2 (A vs B alone): no Bonferroni, t_2(0.975)
    c2 = compare_top(v[:2], 0.95)
    assert c2.crit == pytest.approx(t2_quantile(0.975), rel=1e-9)
    assert c2.half[1] == pytest.approx(t2_quantile(0.975) / math.sqrt(3), rel=1e-9)


def test_compare_top_bonferroni_changes_the_verdict():
    """A: 4 5 6, B: 1 3 2, C: -9 -9 -9. d(A-B) = 3 2 4: mean 3, sd 1. Corrected (k - 1 = 2):
    lower bound 3 - 6.20535 / sqrt(3) = -0.583 < 0, so no clear winner; without the correction it
    would be 3 - 4.30265 / sqrt(3) = +0.516 > 0 and A would wrongly be called the winner."""
    v = np.array([[4.0, 5.0, 6.0], [1.0, 3.0, 2.0], [-9.0, -9.0, -9.0]])
    c = compare_top(v, 0.95)
    assert c.lo[1] == pytest.approx(3.0 - t2_quantile(0.9875) / math.sqrt(3), rel=1e-9)
    assert c.lo[1] < 0 and not bool(c.winner(0.0))
    assert 3.0 - t2_quantile(0.975) / math.sqrt(3) > 0  # what a missing correction would have called a winner


# --- winner rule exactly at the tie margin --------------------------------------------------------

def test_winner_rule_at_the_tie_margin():
    """The top is a clear winner when every interval of top - other lies strictly ABOVE the margin:
    a lower bound equal to the margin is not a winner; one ulp above is."""
    v = np.array([[4.0, 5.0, 6.0], [1.0, 3.0, 2.0], [-9.0, -9.0, -9.0]])
    c = compare_top(v, 0.95)
    lo = float(np.min(c.lo[1:]))
    assert lo == pytest.approx(c.lo[1])
    assert not bool(c.winner(lo))                          # exactly at the margin: tie band touched
    assert bool(c.winner(float(np.nextafter(lo, -np.inf))))  # just inside: winner
    # a zero-width interval exactly at the margin (every paired difference equals the margin)
    z = np.array([[1.5, 2.5, 3.5], [1.0, 2.0, 3.0]])
    cz = compare_top(z, 0.95)
    assert (cz.lo[1], cz.hi[1]) == (0.5, 0.5)
    assert not bool(cz.winner(0.5)) and bool(cz.winner(0.4999))


# --- zig-zag filter and hop threshold exactly at the threshold -----------------------------------

def test_zigzag_legs_at_the_threshold():
    """A leg must move by MORE than the threshold: a move of exactly h is no leg."""
    h = 0.5  # exact in binary, as are all values below
    assert zigzag_legs([0.0, 0.5, 0.0], h) == []                 # first leg: rise of exactly h
    assert len(zigzag_legs([0.0, 0.625, 0.0], h)) == 2            # both legs > h
    assert len(zigzag_legs([0.0, 1.0, 0.5], h)) == 1              # up leg, then a fall of exactly h
    assert len(zigzag_legs([0.0, 1.0, 0.375], h)) == 2            # fall of 0.625 > h
    assert len(zigzag_legs([1.0, 0.0, 0.5], h)) == 1              # down leg, then a rise of exactly h
    assert len(zigzag_legs([1.0, 0.0, 0.625], h)) == 2
    assert hop_stats([0.0, 1.0, 0.5, 1.0], threshold=h).hops == 0  # no turn confirmed: 1 leg
    assert hop_stats([0.0, 1.0, 0.25, 1.0], threshold=h).hops == 1  # 3 legs


def test_hop_threshold_formula_and_floor_by_hand():
    """h = max(k sqrt(2/n) s, floor), s = RMS of the seed sds, n the smallest seed count."""
    # s = sqrt((0.1^2 + 0.2^2) / 2) = sqrt(0.025); n = 2 -> 3 * 1 * 0.158114 = 0.474342
    assert hop_threshold([0.1, 0.2], [2, 3], k=3.0) == pytest.approx(3 * math.sqrt(0.025), rel=1e-12)
    assert hop_threshold([0.01, 0.01], [4, 4], k=3.0, floor=0.1) == 0.1          # floor wins
    assert hop_threshold([0.1, 0.1], [2, 2], k=3.0, floor=0.1) == pytest.approx(0.3)
    assert math.isnan(hop_threshold([0.1], [1], floor=0.1))                       # one seed: no estimate
    assert math.isnan(hop_threshold([np.nan], [3], floor=0.1))


def _summary_row(family, variant, kind, step, value, seed_sd, **extra):
    return dict(checkpoint=f"checkpoint-{step}", step=step, tokens=step * 10, family=family, variant=variant,
                kind=kind, mean_margin=value, seed_sd=seed_sd, n_seeds=3, n_items=4, accuracy=0.5,
                candidate_accuracy=0.5, ci_low=value - 0.1, ci_high=value + 0.1, **extra)


def test_hop_floor_applies_to_margin_tracks_only(tmp_path):
    """compute_dynamics: conflict and capability tracks (mean margins) get the 0.1-nat floor, so a
    0.08-nat zig-zag with near-identical seeds (seed sd 0.001 -> k sqrt(2/3) s = 0.0024) is no hop,
    while a 0.3-nat one is; held-out bits per byte and generation columns have no seed sd, so no
    threshold and no hop count (NaN) - the floor alone does not make a noise estimate."""
    steps = [10, 20, 30, 40]
    small, big = [0.0, 0.08, 0.0, 0.08], [0.0, 0.3, 0.0, 0.3]
    rows = []
    for fam, var, kind, vals in (("conf", "small", "conflict", small), ("conf", "big", "conflict", big),
                                 ("cap", "small", "capability", small), ("cap", "big", "capability", big)):
        rows += [_summary_row(fam, var, kind, s, v, 0.001, gen_consistency=(0.5 + v if fam == "cap" and
                                                                           var == "big" else np.nan))
                 for s, v in zip(steps, vals)]
    rows += [dict(checkpoint=f"checkpoint-{s}", step=s, tokens=s * 10, family="heldout_nll", variant="bpb",
                  kind="nll", bits_per_byte=b) for s, b in zip(steps, [1.5, 1.0, 1.5, 1.0])]
    run = tmp_path / "run"
    run.mkdir()
    atomic_write_csv(run / "summary.csv", pd.DataFrame(rows))
    atomic_write_json(run / "manifest.json", {"status": "complete", "checkpoints": [], "seeds": [0, 1, 2]})
    st = compute_dynamics(run, plots=False).stats.set_index("track")
    for t in ("conf/small", "cap/small", "conf/big", "cap/big"):
        assert st.loc[t, "hop_threshold"] == pytest.approx(0.1), t
    for t in ("conf/small", "cap/small"):
        assert st.loc[t, "hops"] == 0 and st.loc[t, "hop_legs"] == 0, t
    for t in ("conf/big", "cap/big"):
        assert st.loc[t, "hops"] == 1 and st.loc[t, "hop_legs"] == 3, t
    for t in ("heldout_nll/bpb", "cap/big:gen_consistency"):
        assert math.isnan(st.loc[t, "hop_threshold"]) and math.isnan(st.loc[t, "hops"]), t
    # without the floor the small zig-zag is three legs above the seed noise
    st0 = compute_dynamics(run, plots=False, min_hop_nats=0.0).stats.set_index("track")
    assert st0.loc["conf/small", "hop_threshold"] == pytest.approx(3 * math.sqrt(2 / 3) * 0.001)
    assert st0.loc["conf/small", "hops"] == 1


# --- summary interval: items are the resampling unit ---------------------------------------------

def _scores(margins: dict[tuple[str, int], float]) -> pd.DataFrame:
    return pd.DataFrame([dict(checkpoint="checkpoint-1", step=1, tokens=1, family="f", variant="v", kind="conflict",
                              item_id=i, seed=s, margin=m, margin_per_token=m / 2, correct=m > 0,
                              candidate_correct=m > 0) for (i, s), m in margins.items()])


def test_summary_interval_resamples_items_by_hand():
    """Two items x two seeds. Case 1: item a = 0, 0 and item b = 2, 2 (per-item means 0 and 2;
    per-seed means 1 and 1). Resampling the 2 items, a bootstrap mean is 0 (both draws a), 1 or 2
    (both b) with probabilities 1/4, 1/2, 1/4, so with 1000 draws the 2.5% and 97.5% percentiles
    are exactly 0 and 2 (about 250 draws at each end). Resampling seeds would give (1, 1).
    Case 2: a = 0, 2 and b = 0, 2: per-item means 1 and 1, so the interval is exactly (1, 1);
    resampling seeds (means 0 and 2) or raw rows would give (0, 2)."""
    s1 = summarize_scores(_scores({("a", 0): 0.0, ("a", 1): 0.0, ("b", 0): 2.0, ("b", 1): 2.0}))
    assert (s1.loc[0, "ci_low"], s1.loc[0, "ci_high"]) == (0.0, 2.0)
    assert s1.loc[0, "mean_margin"] == 1.0 and s1.loc[0, "seed_sd"] == 0.0
    s2 = summarize_scores(_scores({("a", 0): 0.0, ("a", 1): 2.0, ("b", 0): 0.0, ("b", 1): 2.0}))
    assert (s2.loc[0, "ci_low"], s2.loc[0, "ci_high"]) == (1.0, 1.0)
    assert s2.loc[0, "seed_sd"] == pytest.approx(math.sqrt(2.0))
    assert s2.loc[0, "n_items"] == 2 and s2.loc[0, "n_seeds"] == 2
