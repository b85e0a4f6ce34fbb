"""bench/late_harm_screen.py: the late-harm screen's criteria (a)-(d) on one seed, from its three outputs."""

import json
import subprocess

import pandas as pd
import pytest

from _bench import REPO, load_bench


@pytest.fixture(scope="module")
def lhs():
    return load_bench("late_harm_screen")


STEPS = [2000, 2400, 2800, 3200]


def _inputs(tmp_path, truth=(0.95, 0.97, 0.80, 0.70), best=2400, verdict="winner", bpb=(0.6, 0.55, 0.5, 0.45),
            cap=None, seeds=(0, 1)):
    """A truth folder, by-kind CSV and scores file; ``cap``: family -> per-step (seed-0, seed-1) margins
    (default: flat at 5.0 / 5.02 for both capability families)."""
    td = tmp_path / "truth"
    td.mkdir()
    (td / "truth_summary.json").write_text(json.dumps({
        "truth": {f"checkpoint-{s}": v for s, v in zip(STEPS, truth)}, "best": f"checkpoint-{best}",
        "latest": "checkpoint-3200", "verdict": verdict, "diff": 0.2, "diff_ci": [0.1, 0.3]}))
    bk = tmp_path / "bykind.csv"
    pd.DataFrame([{"checkpoint": s, "kind": k, "bpb": v if k == "all" else 9.0}
                  for s, v in zip(STEPS, bpb) for k in ("news", "all")]).to_csv(bk, index=False)
    cap = cap or {}
    rows = [{"checkpoint": f"checkpoint-{s}", "step": s, "family": f, "seed": e, "item_id": f"{f}/{i}",
             "margin": cap.get(f, [(5.0, 5.02)] * 4)[k][j], "candidate_correct": float(i == 0 or e == 0)}
            for f in ("arith_plain", "relation_plain") for k, s in enumerate(STEPS)
            for j, e in enumerate(seeds) for i in range(2)]
    sc = tmp_path / "scores.parquet"
    pd.DataFrame(rows).to_parquet(sc)
    return td, bk, sc


def test_a_seed_that_meets_every_criterion_passes_and_main_writes_the_verdict(lhs, tmp_path, capsys):
    td, bk, sc = _inputs(tmp_path)
    v = lhs.judge(td, bk, sc, final_start=2800)
    assert v["passes"] and v["best"] == 2400 and v["latest"] == 3200 and v["capability_falls"] == []
    assert v["capability_accuracy"]["arith_plain"][2400] == pytest.approx(0.75)  # seed 1 misses item 1
    assert lhs.main(["--truth", str(td), "--bykind", str(bk), "--scores", str(sc), "--final-start", "2800",
                     "--json", str(tmp_path / "v.json")]) == 0
    assert "=> PASS" in capsys.readouterr().out
    assert json.loads((tmp_path / "v.json").read_text())["passes"] is True


@pytest.mark.parametrize("kw, failed", [
    ({"best": 3200, "truth": (0.9, 0.9, 0.9, 0.95), "verdict": "best is the latest"},
     {"a_best_before_final", "b_separated"}),
    ({"verdict": "no clear winner"}, {"b_separated"}),
    ({"bpb": (0.6, 0.50, 0.5, 0.51)}, {"c_loss_prefers_latest"}),                  # the loss sees the harm
    ({"cap": {"relation_plain": [(5.0, 5.02)] * 3 + [(4.8, 4.82)]}}, {"d_capability_holds"}),   # 0.2 > 3 x 0.014
])
def test_each_criterion_fails_on_its_own(lhs, tmp_path, kw, failed):
    v = lhs.judge(*_inputs(tmp_path, **kw), final_start=2800)
    crit = {"a_best_before_final", "b_separated", "c_loss_prefers_latest", "d_capability_holds"}
    assert {c for c in crit if not v[c]} == failed and not v["passes"]


def test_a_capability_fall_within_the_seed_noise_holds(lhs, tmp_path):
    noisy = [(5.0, 5.02), (5.0, 5.3), (5.0, 5.02), (4.8, 5.0)]   # best 2400: sd 0.21; the latest 0.2 lower on average
    v = lhs.judge(*_inputs(tmp_path, cap={"arith_plain": noisy}), final_start=2800)
    assert v["d_capability_holds"] and v["passes"]


def test_missing_or_incomplete_inputs_name_the_file_and_the_fix(lhs, tmp_path):
    td, bk, sc = _inputs(tmp_path)
    with pytest.raises(SystemExit, match=r"nope/truth_summary.json: missing; run bench/late_harm_truth.py"):
        lhs.judge(tmp_path / "nope", bk, sc, 2800)
    short = tmp_path / "short.csv"
    pd.read_csv(bk).query("checkpoint != 3200").to_csv(short, index=False)
    with pytest.raises(SystemExit, match=r"short.csv: no row for checkpoint 3200; pass --checkpoints"):
        lhs.judge(td, short, sc, 2800)
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match=r"junk.csv: not a bench/heldout_by_kind.py table"):
        lhs.judge(td, tmp_path / "junk.csv", sc, 2800)
    one = tmp_path / "one"
    one.mkdir()
    with pytest.raises(SystemExit, match=r"scores.parquet: the capability families have one evaluation seed.*two or more --seeds"):
        lhs.judge(*_inputs(one, seeds=(0,)), 2800)
    (td / "truth_summary.json").write_text(json.dumps({"truth": {}, "best": "checkpoint-2400"}))
    with pytest.raises(SystemExit, match=r"truth_summary.json: no key\(s\) latest, verdict; rerun"):
        lhs.judge(td, bk, sc, 2800)


def test_the_screen_driver_checks_its_arguments():
    r = subprocess.run(["bash", str(REPO / "bench" / "late_harm_screen.sh"), "out", "cur.yaml"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "usage: bash bench/late_harm_screen.sh OUT_PREFIX CURRICULUM SEED" in r.stderr
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "late_harm_screen.sh")]).returncode == 0
