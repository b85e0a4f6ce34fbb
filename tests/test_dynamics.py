"""Dynamics statistics on synthetic tables with hand-computed answers."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet
from probeselect.dynamics import (HOP_K, compute_dynamics, flip_rates, hop_stats, hop_threshold, spearman_matrix,
                                  trajectory_stats, zigzag_legs)
from probeselect.errors import ProbeselectError
from probeselect.tables import summarize_scores

STEPS = [10, 20, 30, 40, 50]
OFFSETS = [-0.3, -0.1, 0.1, 0.3]  # per-item offsets: mean 0, so the mean margin is exactly m


def _scores(family, variant, means, *, offsets=OFFSETS, seed_delta=0.1, kind=None):
    """Per-item rows whose mean margin at checkpoint i is means[i]; seed s adds +-seed_delta."""
    rows = []
    for step, m in zip(STEPS, means):
        for seed, sgn in ((0, 1), (1, -1)):
            for i, off in enumerate(offsets):
                margin = m + off + sgn * seed_delta
                rows.append(dict(checkpoint=f"checkpoint-{step}", step=step, tokens=step * 100, family=family,
                                 variant=variant, seed=seed, item_id=f"{family}/{variant}/{i}", margin=margin,
                                 margin_per_token=margin, correct=margin > 0, candidate_correct=margin > 0))
    return pd.DataFrame(rows)


def make_run(path, parts, *, extra_rows=(), extra_cols=None, status="complete"):
    """A run folder with scores.parquet, summary.csv (+ optional NLL rows / columns), manifest.json."""
    scores = pd.concat(parts, ignore_index=True)
    summary = summarize_scores(scores)
    summary["kind"] = np.where(summary["family"].str.startswith("cap"), "capability", "conflict")
    for col, fn in (extra_cols or {}).items():
        summary[col] = [fn(r) for r in summary.itertuples()]
    if extra_rows:
        summary = pd.concat([summary, pd.DataFrame(list(extra_rows))], ignore_index=True)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(path / "scores.parquet", scores)
    atomic_write_csv(path / "summary.csv", summary)
    atomic_write_json(path / "manifest.json", {"status": status, "created_utc": "2020-01-01T00:00:00+00:00",
                                               "checkpoints": [], "seeds": [0, 1]})
    return path


# --- pure statistics --------------------------------------------------------------------


def test_trajectory_stats_by_hand():
    st = trajectory_stats([1.0, -0.5, 0.5, 2.0, 1.0], steps=STEPS, seed_sd=[0.1, 0.2, 0.3, 0.2, 0.2], noise_window=3)
    assert st["n_checkpoints"] == 5
    assert st["sign_changes"] == 2  # 1 -> -0.5 and -0.5 -> 0.5
    assert st["total_variation"] == pytest.approx(1.5 + 1.0 + 1.5 + 1.0)
    assert st["mean_abs_change"] == pytest.approx(5.0 / 4)
    assert st["excess_variation"] == pytest.approx(5.0 - 0.0)  # ends where it started
    assert st["largest_drop"] == pytest.approx(1.5) and st["largest_drop_step"] == 20
    assert st["signal_range"] == pytest.approx(2.5)
    assert st["signal_sd"] == pytest.approx(math.sqrt(3.3 / 4))
    assert st["noise_seed_sd"] == pytest.approx(0.2)
    # last 3 values 0.5, 2, 1: population sd; differences 1.5, -1 -> sd (ddof=1) 1.25*sqrt(2), / sqrt(2)
    assert st["noise_last_sd"] == pytest.approx(math.sqrt(((0.5 - 7 / 6) ** 2 + (2 - 7 / 6) ** 2 + (1 - 7 / 6) ** 2) / 3))
    assert st["noise_last_diff_sd"] == pytest.approx(1.25)
    assert st["snr_last"] == pytest.approx(2.5 / st["noise_last_sd"])
    assert st["snr_last_diff"] == pytest.approx(2.0)
    assert st["snr_seed"] == pytest.approx(12.5)


def test_trajectory_stats_lower_is_better_and_edge_cases():
    st = trajectory_stats([1.0, 1.2, 1.1], higher_is_better=False, signed=False)
    assert math.isnan(st["sign_changes"])
    assert st["largest_drop"] == pytest.approx(0.2) and st["largest_drop_step"] == 1  # bpb went up at index 1
    mono = trajectory_stats([0.0, 1.0, 3.0])
    assert mono["largest_drop"] == 0 and math.isnan(mono["largest_drop_step"]) and mono["excess_variation"] == 0
    flat = trajectory_stats([0.0, 1.0, 1.0, 1.0], noise_window=3)
    assert flat["noise_last_sd"] == 0 and flat["snr_last"] == math.inf
    const = trajectory_stats([2.0, 2.0, 2.0])
    assert const["signal_range"] == 0 and math.isnan(const["snr_last"])
    one = trajectory_stats([0.5])
    assert math.isnan(one["total_variation"]) and math.isnan(one["snr_last"])


def test_flip_rates_by_hand():
    pattern = {"A": [True, True, False, False], "B": [True, False, False, True], "C": [True, False, False, True]}
    rows = []
    for step, (ck, corr) in enumerate(pattern.items()):
        for u, c in enumerate(corr):
            rows.append(dict(checkpoint=ck, step=step, family="f", variant="v", item_id=f"i{u // 2}", seed=u % 2,
                             margin=1.0 if c else -1.0, correct=c))
    fr = flip_rates(pd.DataFrame(rows))
    assert fr["flip_rate"].tolist() == [0.5, 0.0]
    assert fr["n_units"].tolist() == [4, 4]
    assert fr[["from_checkpoint", "to_checkpoint"]].values.tolist() == [["A", "B"], ["B", "C"]]


def test_spearman_known_answers():
    wide = pd.DataFrame({"a": [1, 2, 3, 4, 5], "b": [1, 3, 2, 5, 4], "c": [5, 4, 3, 2, 1],
                         "d": [1, 1, 2, 3, np.nan], "e": [7, 7, 7, 7, 7]}, dtype=float)
    rho, n = spearman_matrix(wide)
    assert rho.loc["a", "b"] == pytest.approx(1 - 6 * 4 / (5 * 24))  # = 0.8
    assert rho.loc["a", "c"] == pytest.approx(-1.0)
    assert n.loc["a", "b"] == 5 and n.loc["a", "d"] == 4
    from scipy.stats import spearmanr

    assert rho.loc["a", "d"] == pytest.approx(spearmanr([1, 2, 3, 4], [1, 1, 2, 3]).statistic)  # ties averaged
    assert math.isnan(rho.loc["a", "e"])  # constant track
    rho3, _ = spearman_matrix(wide.iloc[:2])
    assert math.isnan(rho3.loc["a", "b"])  # fewer than 3 checkpoints


# --- hops ------------------------------------------------------------------------------

H = 0.5  # threshold for the synthetic trajectories below (their seed noise is far smaller)


def _hops(values, threshold=H):
    return hop_stats(values, threshold=threshold).hops


def test_monotone_learning_is_never_a_hop():
    x = np.linspace(-6, 6, 12)
    sigmoid = 10 / (1 + np.exp(-x)) - 5  # steep, crosses zero once
    st = hop_stats(sigmoid, threshold=H)
    assert st.hops == 0 and len(st.legs) == 1 and st.learning_crossings == 1 and st.sign_changes == 1
    assert _hops(-sigmoid) == 0  # monotone fall (e.g. bits per byte)
    assert _hops(np.linspace(0, 100, 30)) == 0


def test_dip_and_recover_beyond_noise_is_one_hop():
    rise_dip_recover = [0.0, 1.0, 2.0, 3.0, 1.5, 1.0, 2.5, 4.0]  # legs up 0->3, down 3->1, up 1->4
    st = hop_stats(rise_dip_recover, threshold=H)
    assert st.hops == 1 and [(leg.start, leg.end) for leg in st.legs] == [(0, 3), (3, 5), (5, 7)]
    assert st.legs[1].change == pytest.approx(-2.0)
    assert _hops([2.0, 2.0, 0.5, 0.4, 2.1, 2.0]) == 1  # flat, dip, back
    assert _hops([0.0, 2.0, 0.0]) == 1  # gained then lost


def test_wiggles_within_noise_are_not_hops():
    rng = np.random.default_rng(0)
    wiggle = 3.0 + rng.uniform(-0.2, 0.2, size=20)  # range < 0.4 < H
    assert _hops(wiggle) == 0 and zigzag_legs(wiggle, H) == []
    trend_with_wiggles = np.linspace(0, 5, 20) + rng.uniform(-0.2, 0.2, size=20)
    assert _hops(trend_with_wiggles) == 0
    # the same dip counts only when both legs exceed the threshold
    assert _hops([0.0, 1.0, 0.6, 1.5], threshold=0.5) == 0  # dip of 0.4
    assert _hops([0.0, 1.0, 0.4, 1.5], threshold=0.5) == 1  # dip of 0.6, recovery of 1.1
    assert _hops([0.0, 1.0, 0.4, 0.45], threshold=0.5) == 1  # gain of 1.0, then 0.6 of it lost: both legs count


def test_two_dips_are_two_hops():
    assert _hops([0.0, 2.0, 1.0, 3.0, 1.5, 4.0]) == 2
    assert _hops([2.0, 0.0, 2.0, 0.0, 2.0]) == 2  # down up down up


def test_hop_edge_cases():
    two = hop_stats([0.0, 5.0], threshold=H)
    assert math.isnan(two.hops) and two.learning_crossings == 0  # a hop needs >= 3 checkpoints
    assert _hops([1.0, 1.0, 1.0, 1.0]) == 0 and _hops([1.0, 1.0, 1.0], threshold=0.0) == 0  # constant track
    assert math.isnan(_hops([0.0, 2.0, 0.0], threshold=float("nan")))  # unknown noise: n/a, not 0
    assert _hops([0.0, np.nan, 2.0, 0.0]) == 1  # a missing checkpoint is skipped
    assert math.isnan(hop_threshold([np.nan, np.nan], [2, 2]))  # NaN seed sd
    assert math.isnan(hop_threshold([0.1, 0.1], [1, 1]))  # one evaluation seed: no noise estimate
    # pooled seed sd = sqrt(mean(sd^2)); n = smallest seed count
    assert hop_threshold([0.3, 0.4], [4, 3]) == pytest.approx(HOP_K * math.sqrt(2 / 3) * math.sqrt((0.09 + 0.16) / 2))
    # the floor: seeds that agree to 0.001 nats do not turn 0.005-nat wiggles into hops
    assert hop_threshold([0.001, 0.001], [3, 3], floor=0.1) == 0.1
    assert math.isnan(hop_threshold([np.nan], [3], floor=0.1))  # a floor is not a noise estimate
    wiggle = [0.0, 0.01, 0.005, 0.012, 0.004, 0.02]
    assert trajectory_stats(wiggle, seed_sd=[0.001] * 6, n_seeds=[3] * 6)["hops"] == 2
    assert trajectory_stats(wiggle, seed_sd=[0.001] * 6, n_seeds=[3] * 6, min_hop=0.1)["hops"] == 0
    st = trajectory_stats([0.0, 2.0, 0.0], seed_sd=[np.nan] * 3, n_seeds=[2] * 3)
    assert math.isnan(st["hops"]) and st["learning_crossings"] == 0
    with pytest.raises(ValueError):
        zigzag_legs([0.0, np.nan], 1.0)


def test_hop_threshold_rarely_calls_pure_noise_a_hop():
    """The stated rule (k = 3 standard errors of a difference) on tracks of pure evaluation
    noise: 10 checkpoints whose values are the mean of 3 seeds; the sample seed sd sets h."""
    rng = np.random.default_rng(1)
    n_tracks, n_ck, n_seeds, false = 2000, 10, 3, 0
    for _ in range(n_tracks):
        per_seed = rng.normal(0.0, 1.0, size=(n_ck, n_seeds))
        h = hop_threshold(per_seed.std(axis=1, ddof=1), [n_seeds] * n_ck)
        false += hop_stats(per_seed.mean(axis=1), threshold=h).hops > 0
    assert false / n_tracks <= 0.05


# --- the run-folder entry point ---------------------------------------------------------


@pytest.fixture
def run(tmp_path):
    parts = [
        _scores("conf", "v", [1.0, -0.5, 0.5, 2.0, 1.0]),
        # accuracy 0.25 -> 0.75 while the mean margin moves 0.06 nats: a zero-crossing artefact
        _scores("conf", "w", [-0.03, 0.03, 1.0, 2.0, 3.0], offsets=[-0.04, -0.02, 0.02, 0.04], seed_delta=0.0),
        _scores("cap", "v", [1.0, 2.0, 3.0, 4.0, 5.0]),
        _scores("cap", "w", [5.0, 4.0, 3.0, 2.0, 1.0]),
    ]
    nll = [dict(checkpoint=f"checkpoint-{s}", step=s, tokens=s * 100, family="heldout_nll", variant="bpb", kind="nll",
                bits_per_byte=b) for s, b in zip(STEPS, [1.5, 1.4, 1.45, 1.3, 1.2])]
    gen = {"gen_consistency": lambda r: {10: 0.2, 20: 0.4, 30: 0.3, 40: 0.5, 50: 0.6}[r.step] if r.family == "cap" and r.variant == "v" else np.nan}
    return make_run(tmp_path / "run", parts, extra_rows=nll, extra_cols=gen)


def test_compute_dynamics_tables(run):
    res = compute_dynamics(run)
    st = res.stats.set_index("track")
    assert list(st.index) == ["conf/v", "conf/w", "cap/v", "cap/w", "heldout_nll/bpb", "cap/v:gen_consistency"]
    v = st.loc["conf/v"]
    assert v["sign_changes"] == 2 and v["total_variation"] == pytest.approx(5.0)
    assert v["largest_drop"] == pytest.approx(1.5) and v["largest_drop_step"] == 20
    assert v["noise_seed_sd"] == pytest.approx(0.2 / math.sqrt(2))  # per-seed means m +- 0.1
    assert v["signal_range"] == pytest.approx(2.5)
    assert v["snr_seed"] == pytest.approx(2.5 / (0.2 / math.sqrt(2)))
    # hop threshold 3 * sqrt(2/2) * 0.1414 = 0.424: legs 1 -> -0.5 -> 2 -> 1, i.e. 3 legs = 1 hop
    assert v["hop_threshold"] == pytest.approx(3 * 0.2 / math.sqrt(2))
    assert v["hops"] == 1 and v["hop_legs"] == 3 and v["hop_turning_steps"] == "20;40"
    assert v["learning_crossings"] == 0 and v["undone_crossings"] == 2
    w = st.loc["conf/w"]  # -0.03 -> 3.0: learns and crosses zero once (seed sd 0: h is the 0.1-nat floor); one leg
    assert w["hop_threshold"] == pytest.approx(0.1)
    assert w["hops"] == 0 and w["learning_crossings"] == 1 and w["sign_changes"] == 1 and w["undone_crossings"] == 0
    assert st.loc["cap/v", "hops"] == 0 and st.loc["cap/w", "hops"] == 0
    nll = st.loc["heldout_nll/bpb"]
    assert nll["metric"] == "bits_per_byte" and not nll["higher_is_better"]
    assert nll["largest_drop"] == pytest.approx(0.05) and nll["largest_drop_step"] == 30
    assert math.isnan(nll["sign_changes"]) and math.isnan(nll["flip_rate"])
    assert math.isnan(nll["hops"]) and math.isnan(nll["hop_threshold"])  # no seed noise for bits per byte
    assert st.loc["cap/v:gen_consistency", "kind"] == "generation"

    # flip rate = mean over pairs of the per-pair flip fraction (hand count for conf/w)
    w_pairs = res.pairs[res.pairs["track"] == "conf/w"]
    assert w_pairs["flip_rate"].tolist() == pytest.approx([0.5, 0.25, 0.0, 0.0])
    assert st.loc["conf/w", "flip_rate"] == pytest.approx(0.1875)
    assert st.loc["conf/w", "flip_rate_max"] == pytest.approx(0.5)
    first = w_pairs.iloc[0]
    assert first["d_accuracy"] == pytest.approx(0.5) and first["d_mean_margin"] == pytest.approx(0.06)
    assert first["flag_acc_moves_margin_still"] and not first["flag_margin_moves_acc_still"]
    assert w_pairs["flag_acc_moves_margin_still"].sum() == 1
    assert w_pairs["flag_margin_moves_acc_still"].tolist() == [False, False, True, True]
    assert st.loc["conf/w", "n_flag_acc_moves_margin_still"] == 1

    rho, n = res.correlation, res.correlation_n
    assert rho.loc["cap/v", "cap/w"] == pytest.approx(-1.0) and n.loc["cap/v", "cap/w"] == 5
    # bits per byte is oriented (negated) before correlating: bpb ranks 5,3,4,2,1 -> oriented 1,3,2,4,5,
    # so a falling bpb agrees with a rising margin
    assert rho.loc["cap/v", "heldout_nll/bpb"] == pytest.approx(0.9)
    corr = pd.read_csv(run / "dynamics" / "correlation.csv")
    row = corr[(corr.track_a == "cap/v") & (corr.track_b == "cap/w")].iloc[0]
    assert row.spearman_rho == pytest.approx(-1.0) and row.n_checkpoints == 5

    traj = res.trajectories[res.trajectories["track"] == "conf/v"]
    assert traj["seed_min"].tolist() == pytest.approx([0.9, -0.6, 0.4, 1.9, 0.9])
    assert traj["seed_max"].tolist() == pytest.approx([1.1, -0.4, 0.6, 2.1, 1.1])
    bpb = res.trajectories[res.trajectories["track"] == "heldout_nll/bpb"]
    assert bpb["oriented_value"].tolist() == pytest.approx([-1.5, -1.4, -1.45, -1.3, -1.2])

    out = run / "dynamics"
    for name in ("dynamics.csv", "trajectories.csv", "pairs.csv", "correlation.csv", "manifest.json",
                 "margin_trajectories.png", "accuracy_vs_margin.png", "correlation.png"):
        assert (out / name).is_file(), name
    assert (out / "margin_trajectories.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    disk = pd.read_csv(out / "dynamics.csv")
    for col in ("hops", "hop_legs", "hop_threshold", "learning_crossings", "excess_variation", "sign_changes",
                "total_variation", "flip_rate", "largest_drop", "signal_range", "noise_seed_sd",
                "noise_last_sd", "noise_last_diff_sd", "snr_last", "snr_seed", "noise_window"):
        assert col in disk.columns
    assert json.loads((out / "manifest.json").read_text())["kind"] == "dynamics"


def test_works_without_scores_or_kind(tmp_path):
    run = make_run(tmp_path / "run", [_scores("conf", "v", [1.0, -0.5, 0.5, 2.0, 1.0])])
    (run / "scores.parquet").unlink()
    s = pd.read_csv(run / "summary.csv").drop(columns=["kind"])
    atomic_write_csv(run / "summary.csv", s)
    res = compute_dynamics(run, plots=False)
    assert res.stats.loc[0, "sign_changes"] == 2 and math.isnan(res.stats.loc[0, "flip_rate"])
    assert any("scores.parquet" in n for n in res.notes)
    assert res.stats.loc[0, "kind"] == "conflict"


def test_incomplete_or_missing_run_is_refused(tmp_path):
    run = make_run(tmp_path / "run", [_scores("conf", "v", [1.0, 0.5, 0.2, 0.1, 0.0])], status="running")
    with pytest.raises(ProbeselectError, match="not 'complete'"):
        compute_dynamics(run)
    with pytest.raises(ProbeselectError, match="does not exist"):
        compute_dynamics(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProbeselectError, match="no summary.csv"):
        compute_dynamics(tmp_path / "empty")


def test_trajectory_plot_shades_planted_windows(tmp_path, monkeypatch):
    import probeselect._plots as plots
    from probeselect.attribution import Window
    from probeselect.dynamics import plot_trajectories

    figs = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path: figs.append(fig) or path)
    steps = [200, 400, 600, 800]
    traj = pd.DataFrame({"family": "fam", "metric": "mean_margin", "variant": "v", "kind": "conflict", "step": steps,
                         "value": [1.0, 2.0, 0.5, 2.5], "seed_min": np.nan, "seed_max": np.nan, "seed_sd": 0.1,
                         "ci_low": np.nan, "ci_high": np.nan})
    wins = [Window("base", 0, 400), Window("parrot", 400, 600, planted="parrot"), Window("after", 600, 800)]
    plot_trajectories(traj, tmp_path / "a.png", windows=wins)
    plot_trajectories(traj, tmp_path / "b.png")
    shaded, plain = figs
    spans = [p for ax in shaded.axes for p in ax.patches]
    assert len(spans) == 1  # only the planted window is shaded
    x0, x1 = spans[0].get_x(), spans[0].get_x() + spans[0].get_width()
    assert (x0, x1) == (400, 600) and "parrot window" in spans[0].get_label()
    assert not [p for ax in plain.axes for p in ax.patches]
