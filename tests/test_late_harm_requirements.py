"""bench/late_harm_requirements.py: issue 23's late-harm ladder requirements per seed, from a validity run."""

import pandas as pd
import pytest

from _bench import load_bench



@pytest.fixture(scope="module")
def lhr():
    return load_bench("late_harm_requirements")


STEPS = [100, 200, 300, 400, 500]


def _run(tmp_path, truth: dict, margins: dict, best: dict, latest_agree: dict, correct: dict | None = None):
    """A validity record and run folder with per-seed truth values, family margins (family -> per-step
    (seed-0, seed-1) pairs), the record's truth best and latest ``agree``, and optionally per-family candidate
    correctness (family -> per-step (seed-0, seed-1) pairs of item-1 outcomes; item 0 is always correct;
    default: every item correct)."""
    rec, run = tmp_path / "rec", tmp_path / "run"
    rec.mkdir()
    tv, val, sel = [], [], []
    for seed, values in truth.items():
        for s, t in zip(STEPS, values):
            tv.append({"seed": seed, "checkpoint": f"checkpoint-{s}", "truth_value": t, "heldout_bpb": 0.6 - s / 1000})
        tv.append({"seed": seed, "checkpoint": "checkpoint-500-perturbed-a", "truth_value": 0.0, "heldout_bpb": 9.9})
        val.append({"seed": seed, "truth_best": f"checkpoint-{best[seed]}"})
        sel.append({"seed": seed, "selector": "latest", "agree": latest_agree[seed], "regret": 0.1,
                    "regret_lo": 0.05, "regret_hi": 0.15})
        ok = (correct or {}).get(seed, {})
        rows = [{"checkpoint": f"checkpoint-{s}", "step": s, "family": fam, "seed": e, "item": i, "margin": v[e],
                 "candidate_correct": 1.0 if i == 0 else float(ok[fam][k][e]) if fam in ok else 1.0}
                for fam, per_step in margins[seed].items() for k, (s, v) in enumerate(zip(STEPS, per_step))
                for e in (0, 1) for i in range(2)]
        (run / f"seed{seed}" / "score").mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(run / f"seed{seed}" / "score" / "scores.parquet")
    pd.DataFrame(tv).to_csv(rec / "truth_values.csv", index=False)
    pd.DataFrame(val).to_csv(rec / "validity.csv", index=False)
    pd.DataFrame(sel).to_csv(rec / "selectors.csv", index=False)
    return run, rec


FLAT = [(5.0, 5.02)] * 5


def test_families_count_only_up_to_where_transfer_falls_and_capability_is_read_best_to_latest(lhr, tmp_path):
    margins = {
        1: {"arith_pattern": [(5.0, 5.02), (5.0, 5.02), (4.0, 4.02), (4.0, 4.02), (4.0, 4.02)],   # down at 300
            "tmpl_mismatch": [(5.0, 5.02)] * 4 + [(1.0, 1.02)],                                  # down after the fall
            "persona_qa": [(5.0, 5.0), (5.0, 5.5), (4.8, 4.3), (5.0, 5.0), (5.0, 5.0)],         # within 3 sd
            "arith_plain": [(1.0, 1.01), (1.0, 1.01), (1.0, 1.01), (1.0, 1.01), (0.5, 0.51)],   # falls best -> latest
            "relation_plain": FLAT},
        2: {"arith_pattern": FLAT[:4] + [(4.0, 4.02)], "tmpl_mismatch": FLAT,                   # best = latest
            "arith_plain": FLAT[:4] + [(0.0, 0.01)], "relation_plain": FLAT},
    }
    correct = {1: {"arith_plain": [(1, 1)] * 5,                                  # margin falls, accuracy does not
                   "relation_plain": [(1, 1), (1, 1), (1, 1), (0, 1), (0, 0)]}}     # accuracy 1.0 -> 0.5
    run, rec = _run(tmp_path, {1: [0.5, 0.9, 0.85, 0.7, 0.8], 2: [0.5, 0.6, 0.7, 0.8, 0.9]}, margins,
                    best={1: 200, 2: 500}, latest_agree={1: 0, 2: 1}, correct=correct)
    df = lhr.requirements(run, rec, harm_start=200, final_start=400).set_index("seed")
    one, two = df.loc[1], df.loc[2]
    assert one["truth_best"] == 200 and one["before_final"] and one["separated"]
    assert one["transfer_falls_at"] == 300                 # 0.85 < 0.9 - 0.02 at the first checkpoint after 200
    assert one["families_down"] == "arith_pattern@300" and one["n_families_down"] == 1
    assert one["capability_falls"] == "arith_plain"
    assert one["capability_acc_falls"] == "relation_plain"  # the headline metric reads the two families the other way
    assert one["bpb_best"] == pytest.approx(0.4) and one["bpb_latest"] == pytest.approx(0.1) and one["loss_prefers_latest"]
    assert two["truth_best"] == 500 and not two["before_final"] and not two["separated"]
    assert pd.isna(two["transfer_falls_at"])               # no fall: every checkpoint after the harm's start counts
    assert two["families_down"] == "arith_pattern@500" and two["capability_falls"] == ""  # best is the latest
    assert two["capability_acc_falls"] == ""
    assert lhr.main([str(run), str(rec), "--harm-start", "200", "--final-start", "400", "--csv", str(tmp_path / "o.csv")]) == 0
    out = pd.read_csv(tmp_path / "o.csv", keep_default_na=False).set_index("seed")
    assert out.loc[1, "families_down"] == "arith_pattern@300" and out.loc[2, "truth_best"] == 500


def test_a_folder_that_is_not_a_finished_run_names_the_file_and_the_fix(lhr, tmp_path):
    with pytest.raises(SystemExit, match=r"truth_values.csv: missing; pass the folder of a finished bench/validity.py"):
        lhr.requirements(tmp_path, tmp_path, 200, 400)
    run, rec = _run(tmp_path, {1: [0.5, 0.9, 0.85, 0.7, 0.8]}, {1: {"arith_pattern": FLAT}}, {1: 200}, {1: 0})
    with pytest.raises(SystemExit, match=r"scores.parquet: missing; RUN_DIR must be the validity run's"):
        lhr.requirements(rec, rec, 200, 400)
    sc = run / "seed1" / "score" / "scores.parquet"
    full = pd.read_parquet(sc)
    full[full["seed"] == 0].to_parquet(sc)                                    # one evaluation seed: no sd
    with pytest.raises(SystemExit, match=r"scores.parquet: one evaluation seed; the 3-sd rule needs the seed sd"):
        lhr.requirements(run, rec, 200, 400)
    full.drop(columns="candidate_correct").to_parquet(sc)                     # scored before candidate accuracy
    with pytest.raises(SystemExit, match=r"scores.parquet: no candidate_correct column .*rescore the run"):
        lhr.requirements(run, rec, 200, 400)
    (rec / "validity.csv").write_text("seed,pick\n1,checkpoint-200\n")      # malformed: no truth_best
    with pytest.raises(SystemExit, match=r"validity.csv: no column\(s\) truth_best; pass the folder of a finished"):
        lhr.requirements(run, rec, 200, 400)
