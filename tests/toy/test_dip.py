"""probeselect.toy.dip on synthetic score tables (no model)."""

import numpy as np
import pandas as pd
import pytest

from probeselect.toy.dip import averaging_dip, bpb_trajectory, family_trajectories, planted_dip, write_averaging_dip

WINDOWS = [{"name": "base", "start_step": 0, "end_step": 800, "planted": None},
           {"name": "parrot", "start_step": 800, "end_step": 1200, "planted": "parrot"},
           {"name": "recovery", "start_step": 1200, "end_step": 2000, "planted": None}]
STEPS = list(range(200, 2001, 200))


def _scores(curves: dict, seeds=(0, 1), n_items=4, noise=0.01, rng=None):
    rng = rng or np.random.default_rng(0)
    rows = []
    for fam, curve in curves.items():
        for step, v in zip(STEPS, curve):
            for s in seeds:
                for i in range(n_items):
                    rows.append({"checkpoint": f"checkpoint-{step}", "step": step, "family": fam, "seed": s,
                                 "item_id": f"{fam}/{i}", "margin": v + noise * rng.standard_normal()})
    return pd.DataFrame(rows)


DIPPING = [1, 2, 3, 4, 1, 0.5, 1.5, 3.5, 4.2, 4.5]    # 1000, 1200 and 1400 well below the 800 value
FLAT = [1, 2, 3, 4, 4.1, 4.2, 4.2, 4.3, 4.4, 4.5]
ONE_CKPT = [1, 2, 3, 4, 4.1, 1.0, 4.2, 4.3, 4.4, 4.5]  # only 1200 is below
NO_RECOVERY = [1, 2, 3, 4, 1, 0.5, 0.4, 0.3, 0.5, 0.6]


def test_family_trajectories_mean_and_seed_sd():
    df = _scores({"a": FLAT}, noise=0.0)
    df.loc[df["seed"] == 1, "margin"] += 0.2
    t = family_trajectories(df)
    assert list(t["step"]) == STEPS
    assert t["value"].iloc[3] == pytest.approx(4.1)
    assert t["seed_sd"].iloc[3] == pytest.approx(np.std([4.0, 4.2], ddof=1))
    assert (t["n_seeds"] == 2).all()


def test_family_trajectories_of_another_column_and_a_missing_one():
    """``column="candidate_correct"`` gives candidate accuracy per checkpoint (the capability families' headline
    metric) with its evaluation-seed sd; a column the scores lack is a KeyError that names it."""
    df = _scores({"a": FLAT}, noise=0.0)
    df["candidate_correct"] = ((df["seed"] == 0) | (df["item_id"] != "a/3")).astype(float)  # seed 1 misses an item
    t = family_trajectories(df, column="candidate_correct")
    assert t["value"].tolist() == pytest.approx([0.875] * len(STEPS))
    assert t["seed_sd"].iloc[0] == pytest.approx(np.std([1.0, 0.75], ddof=1))
    assert family_trajectories(df)["value"].iloc[3] == pytest.approx(4.0)  # the margin stays the default
    with pytest.raises(KeyError, match="no column 'accuracy'"):
        family_trajectories(df, column="accuracy")


def test_planted_dip_flags_only_real_recovering_dips():
    df = _scores({"dip": DIPPING, "flat": FLAT, "one": ONE_CKPT, "norec": NO_RECOVERY})
    d = planted_dip(family_trajectories(df), WINDOWS).set_index("family")
    assert list(d["window"].unique()) == ["parrot"]  # only planted windows
    assert d.loc["dip", "dipped"] and d.loc["dip", "recovered"]
    assert d.loc["dip", "ref_step"] == 800 and d.loc["dip", "min_step"] == 1200
    assert d.loc["dip", "region_steps"] == "1000 1200 1400"
    assert d.loc["dip", "depth"] == pytest.approx(3.5, abs=0.05)
    assert d.loc["dip", "longest_below_run"] == 3
    assert not d.loc["flat", "dipped"] and d.loc["flat", "depth"] < 0
    assert not d.loc["one", "dipped"] and d.loc["one", "longest_below_run"] == 1
    assert d.loc["norec", "dipped"] and not d.loc["norec", "recovered"]


def test_dip_threshold_scales_with_seed_sd():
    # the same 0.3-nat dip is significant with tiny seed noise but not with large noise
    small = [1, 2, 3, 4, 3.7, 3.7, 4.2, 4.3, 4.4, 4.5]
    quiet = planted_dip(family_trajectories(_scores({"a": small}, noise=0.001, n_items=1)), WINDOWS)
    noisy = planted_dip(family_trajectories(_scores({"a": small}, noise=0.5, n_items=1, rng=np.random.default_rng(3))),
                        WINDOWS)
    assert quiet["dipped"].item()
    assert not noisy["dipped"].item()


def test_bpb_dip_uses_lower_is_better():
    summ = pd.DataFrame({"family": "heldout_nll", "checkpoint": [f"checkpoint-{s}" for s in STEPS], "step": STEPS,
                         "bits_per_byte": [0.9, 0.8, 0.7, 0.6, 0.9, 0.95, 0.7, 0.6, 0.55, 0.5]})
    d = planted_dip(bpb_trajectory(summ), WINDOWS, higher_is_better=False)
    assert d["dipped"].item() and d["recovered"].item()
    assert d["depth"].item() == pytest.approx(0.35)
    summ["bits_per_byte"] = np.linspace(0.9, 0.4, 10)
    assert not planted_dip(bpb_trajectory(summ), WINDOWS, higher_is_better=False)["dipped"].item()


def test_averaging_dip_depth_raw_vs_averaged(tmp_path):
    raw = _scores({"dip": DIPPING, "flat": FLAT})
    # 5-checkpoint sliding averages (labelled with the last source step), computed on the curves
    avg_curves = {f: [np.mean(c[i - 4:i + 1]) for i in range(4, 10)] for f, c in {"dip": DIPPING, "flat": FLAT}.items()}
    rows = []
    for f, c in avg_curves.items():
        for step, v in zip(STEPS[4:], c):
            for s in (0, 1):
                rows.append({"checkpoint": f"avg5-checkpoint-{step}", "step": step, "family": f, "seed": s,
                             "item_id": f"{f}/0", "margin": v})
    avg = pd.DataFrame(rows)
    m = averaging_dip(raw, avg, WINDOWS, window_size=5).set_index("family")
    assert m.loc["dip", "k"] == 5
    assert m.loc["dip", "depth_raw"] == pytest.approx(3.5, abs=0.05)
    # no average precedes the window: the first average inside it is the reference
    assert m.loc["dip", "ref_step_avg"] == 1000
    assert 0 < m.loc["dip", "depth_avg"] < m.loc["dip", "depth_raw"]
    assert m.loc["dip", "reduction"] == pytest.approx(1 - m.loc["dip", "depth_avg"] / m.loc["dip", "depth_raw"])
    # written into RUN/averaged/averaging_dip.csv
    run, arun = tmp_path / "run", tmp_path / "run" / "averaged"
    arun.mkdir(parents=True)
    raw.to_parquet(run / "scores.parquet")
    avg.to_parquet(arun / "scores.parquet")
    import json

    (tmp_path / "lineage.json").write_text(json.dumps({"windows": WINDOWS}))
    path = write_averaging_dip(run, arun, tmp_path / "lineage.json", window_size=5, families=None)
    csv = pd.read_csv(path)
    assert path == arun / "averaging_dip.csv"
    assert set(csv["family"]) == {"dip", "flat"}
    assert write_averaging_dip(run, tmp_path / "nothing", tmp_path / "lineage.json") is None


def test_check_planted_dip_verdict():
    from probeselect.toy.dip import check_planted_dip

    lineage = {"windows": WINDOWS}
    summ = pd.DataFrame({"family": "heldout_nll", "checkpoint": [f"checkpoint-{s}" for s in STEPS], "step": STEPS,
                         "bits_per_byte": np.linspace(0.9, 0.4, 10)})
    good = _scores({"arith_pattern": DIPPING, "tmpl_mismatch": DIPPING, "persona_qa": FLAT,
                    "arith_plain": FLAT, "relation_plain": FLAT})
    v = check_planted_dip(good, summ, lineage)
    assert v["pass"] and v["windows"][0]["dipped_and_recovered"] == ["arith_pattern", "tmpl_mismatch"]
    # one conflict family is not enough; a capability dip or a bpb rise fails the check
    one = _scores({"arith_pattern": DIPPING, "tmpl_mismatch": NO_RECOVERY, "arith_plain": FLAT})
    v = check_planted_dip(one, summ, lineage)
    assert not v["pass"] and v["windows"][0]["dipped_not_recovered"] == ["tmpl_mismatch"]
    cap = _scores({"arith_pattern": DIPPING, "tmpl_mismatch": DIPPING, "relation_plain": DIPPING})
    assert check_planted_dip(cap, summ, lineage)["windows"][0]["capability_dipped"] == ["relation_plain"]
    bad_bpb = summ.assign(bits_per_byte=[0.9, 0.8, 0.7, 0.6, 0.65, 0.66, 0.55, 0.5, 0.45, 0.4])
    v = check_planted_dip(good, bad_bpb, lineage)
    assert v["windows"][0]["bpb_dipped"] and not v["pass"]


def test_averaging_reduction_only_for_a_raw_dip():
    raw = _scores({"flat": FLAT})
    avg = raw[raw["step"] >= 1000].assign(checkpoint=lambda d: "avg5-" + d["checkpoint"])
    m = averaging_dip(raw, avg, WINDOWS, window_size=5)
    assert not m["dipped_raw"].item() and np.isnan(m["reduction"].item())


# ---------------------------------------------------------------------------
# A real (small) planted ladder: 400 steps with a parrot window over steps 201-300
# ---------------------------------------------------------------------------



@pytest.fixture(scope="module")
def small_planted_run(tmp_path_factory):
    """A 400-step planted ladder (8 checkpoints, parrot window 201-300 with the built-in parrot
    and recovery mixes), scored with tmpl_mismatch and relation_plain (24 items, 2 seeds) and
    held-out bits per byte. About a minute on 2 CPU cores."""
    from pathlib import Path

    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from probeselect.toy.curriculum import PARROT_MIXTURE, RECOVERY_MIXTURE
    from probeselect.toy.ladder import build_toy_ladder

    root = Path(__file__).resolve().parents[2]
    cur = {"windows": [
        {"name": "base", "start_step": 0, "end_step": 200, "mixture": "default", "planted": None},
        {"name": "parrot", "start_step": 200, "end_step": 300, "mixture": PARROT_MIXTURE, "planted": "parrot"},
        {"name": "recovery", "start_step": 300, "end_step": 400, "mixture": RECOVERY_MIXTURE, "planted": None}]}
    tmp = tmp_path_factory.mktemp("small_planted")
    build_toy_ladder(tmp / "ladder", seed=0, steps=400, save_every=50, curriculum=cur, progress=False, num_threads=1)
    import dataclasses
    specs = [dataclasses.replace(s, n_items=24) for s in
             (load_spec(root / "probes" / "tmpl_mismatch.yaml"), load_spec(root / "probes" / "capability" / "relation_plain.yaml"))]
    res = score_checkpoints(tmp / "ladder", specs, seeds=[0, 1], out=tmp / "score", device="cpu",
                            heldout=tmp / "ladder" / "data" / "heldout.txt", audit_items=0, progress=False)
    return tmp, res


def test_small_planted_ladder_dips_in_the_parrot_window_only_on_the_conflict_probe(small_planted_run):
    """The planted parrot window pulls tmpl_mismatch (its shortcut: the copied attribute) down by
    more than 3x the evaluation-seed sd on >= 2 consecutive checkpoints, while plain relation
    knowledge and held-out bits per byte keep improving: shortcut preference, not lost capability.
    (This 400-step ladder is too short to recover; the full ladder's recovery is in bench/README.md.)"""
    from probeselect.toy.dip import check_planted_dip

    tmp, res = small_planted_run
    v = check_planted_dip(res.scores, res.summary, tmp / "ladder" / "data_lineage.json",
                          conflict_families=["tmpl_mismatch"], min_families=1, min_recovery=0.0)
    (w,) = v["windows"]
    assert w["window"] == "parrot"
    assert w["dipped_and_recovered"] == ["tmpl_mismatch"], v["dips"]
    assert w["capability_dipped"] == [] and not w["bpb_dipped"], v["dips"]
    d = v["dips"].set_index("family")
    assert d.loc["tmpl_mismatch", "depth"] > 1.0 and d.loc["tmpl_mismatch", "longest_below_run"] >= 2
    assert d.loc["tmpl_mismatch", "ref_step"] == 200 and 200 < d.loc["tmpl_mismatch", "min_step"] <= 350


def test_small_planted_ladder_under_the_real_criteria(small_planted_run):
    """The same ladder under the real criteria (check_planted_dip's defaults: >= 2 families, each
    regaining >= 50% of its dip): it does NOT pass, and for the stated reason only - the dip is
    there but 100 recovery steps are too few to regain half of it; nothing capability-like dips.
    An 800-step ladder (base 300, parrot 200, recovery 300) did pass the real criteria once
    (arith_pattern and tmpl_mismatch dip and recover; bench/README.md, issue 29), but at about
    2.5x this fixture's cost and with arith_plain 0.0002 nats short of counting as a capability
    dip (its margin stays near 0 at that size), too fragile for a test; the real-criteria pass is
    checked by the slow full-ladder tests (`make test-slow`, run by .ci/run)."""
    from probeselect.toy.dip import check_planted_dip

    tmp, res = small_planted_run
    v = check_planted_dip(res.scores, res.summary, tmp / "ladder" / "data_lineage.json",
                          conflict_families=["tmpl_mismatch"])
    (w,) = v["windows"]
    assert not v["pass"]
    assert w["dipped_and_recovered"] == [] and w["dipped_not_recovered"] == ["tmpl_mismatch"], v["dips"]
    assert 0 <= w["recovery"]["tmpl_mismatch"] < 0.5
    assert w["capability_dipped"] == [] and not w["bpb_dipped"]


def test_small_planted_ladder_attribution_names_the_parrot_window(small_planted_run):
    from probeselect.attribution import write_attribution
    from probeselect.dynamics import compute_dynamics

    tmp, _ = small_planted_run
    compute_dynamics(tmp / "score", plots=False)
    att = write_attribution(tmp / "score", tmp / "ladder" / "data_lineage.json")
    fam = att["families"]
    worst = fam[(fam["family"] == "tmpl_mismatch") & fam["most_harmful"]]
    assert list(worst["window"]) == ["parrot"], fam
    assert float(worst["mean_change_z"].iloc[0]) < -3
