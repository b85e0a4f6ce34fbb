"""bench/validity.py: the one-seed smoke version of the toy validation (tiny ladder and budgets)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("validity", REPO / "bench" / "validity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kendall_tau_b_known_values():
    tau = _module()._kendall_tau_b
    assert tau(np.array([1, 2, 3, 4.0]), np.array([1, 2, 3, 4.0])) == pytest.approx(1.0)
    assert tau(np.array([1, 2, 3, 4.0]), np.array([4, 3, 2, 1.0])) == pytest.approx(-1.0)
    # one discordant pair of 3, no ties: (2 - 1) / 3
    assert tau(np.array([1, 2, 3.0]), np.array([1, 3, 2.0])) == pytest.approx(1 / 3)
    # tie in x: pairs (1,2) tied in x -> tau-b = (2 - 0) / sqrt(2 * 3)
    assert tau(np.array([1, 1, 2.0]), np.array([1, 2, 3.0])) == pytest.approx(2 / np.sqrt(6))
    assert np.isnan(tau(np.array([1, 1.0]), np.array([1, 2.0])))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One tiny validation of seed 0 in this process (jobs=1), shared by the tests below."""
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    try:
        mod = _module()
        out = tmp_path_factory.mktemp("validity") / "v"
        totals = mod.validate([0], out, truth_seeds=2, tiny=True, log=lambda m: None)
    finally:
        mp.undo()
    return out, totals


def test_validity_smoke_one_seed(smoke):
    out, totals = smoke
    df = pd.read_csv(out / "validity.csv")
    ties = pd.read_csv(out / "ties.csv")
    assert list(df["seed"]) == [0] and totals["n"] == 1
    row = df.iloc[0]
    ladder = out / "seed0" / "ladder"
    names = sorted(p.name for p in ladder.iterdir() if p.name.startswith("checkpoint-"))
    assert row["pick"] in names and row["truth_best"] in names
    assert bool(row["agree_strict"]) == (row["pick"] == row["truth_best"])
    # tie-aware agreement: exact, or the truth runs cannot separate pick from truth's best
    assert bool(row["agree"]) == (bool(row["agree_strict"]) or not bool(row["truth_separates_pick"]))
    # the pipeline's own decision and pick, read back from its selection.json
    (sel_path,) = [p for p in (out / "seed0").rglob("selection.json") if "truth" not in p.parts and "ties" not in p.parts]
    sel = json.loads(sel_path.read_text())
    assert row["decision"] == sel["decision"]["verdict"]
    assert row["pick"] == (sel["decision"]["recommended"] or sel["decision"]["top"])
    # the pick's data window, from the ladder's lineage (window w holds start_step < step <= end_step)
    step = int(row["pick"].rsplit("-", 1)[1])
    wins = json.loads((ladder / "data_lineage.json").read_text())["windows"]
    assert row["pick_window"] == next(w["name"] for w in wins if w["start_step"] < step <= w["end_step"])
    # gaps: truth value of truth_best minus that of pick / latest, in the primary's better direction
    tv_by = pd.read_csv(out / "truth_values.csv").set_index("checkpoint")["truth_value"]
    sign = 1.0 if sel["selection_plan"]["primary"]["direction"] == "higher" else -1.0
    assert row["pick_truth_gap"] == pytest.approx(sign * (tv_by[row["truth_best"]] - tv_by[row["pick"]]), abs=1e-12)
    assert row["pick_truth_gap"] >= 0
    # the naive baseline "post-train the latest checkpoint", scored with the same rule
    assert row["latest"] == max(names, key=lambda n: int(n.rsplit("-", 1)[1]))
    assert row["latest_truth_gap"] == pytest.approx(sign * (tv_by[row["truth_best"]] - tv_by[row["latest"]]), abs=1e-12)
    if row["latest"] == row["truth_best"]:
        assert row["latest_agree"] and row["latest_truth_gap"] == 0
    assert totals["latest_agree"] == int(bool(row["latest_agree"]))
    # the truth trained every checkpoint under 2 SFT seeds at the confirmation recipe
    truth = pd.read_csv(out / "seed0" / "truth" / "transfer.csv")
    assert sorted(truth["base"].unique()) == names and sorted(truth["seed"].unique()) == [0, 1]
    tv = pd.read_csv(out / "truth_values.csv")
    assert sorted(tv["checkpoint"]) == names and tv["pick"].sum() == 1
    assert tv.loc[tv["pick"], "checkpoint"].item() == row["pick"]
    assert tv["truth_value"].max() == pytest.approx(tv.loc[tv["checkpoint"] == row["truth_best"], "truth_value"].item())
    # the planted-dip verdict on the pipeline's own scores (a 24-step ladder need not dip) and the
    # ladder's own final held-out arithmetic
    from probeselect.toy.dip import check_planted_dip

    v = check_planted_dip(pd.read_parquet(sel_path.parent / "scores.parquet"), pd.read_csv(sel_path.parent / "summary.csv"),
                          ladder / "data_lineage.json")
    assert bool(row["dip_pass"]) == v["pass"]
    assert row["dip_families"] == " ".join(sorted({f for w in v["windows"] for f in w["dipped_and_recovered"]})) or (
        pd.isna(row["dip_families"]) and not any(w["dipped_and_recovered"] for w in v["windows"]))
    assert row["final_heldout_arith"] == json.loads((ladder / "ladder.json").read_text())["final_heldout_arith_accuracy"]
    assert set(ties["tie"]) == {"twin", "same_mode"}
    twin = ties[ties["tie"] == "twin"].iloc[0]
    # a byte copy trained under the same seeds and data gives identical numbers: never a winner
    assert twin["truth_is_tie"] and twin["verdict"] != "winner" and not twin["false_clear_winner"]
    assert twin["diff"] == pytest.approx(0.0, abs=1e-12)
    assert totals["false_clear_winners"] == int(ties.loc[ties["truth_is_tie"], "false_clear_winner"].sum())
    assert json.loads((out / "validity.json").read_text())["tiny"] is True
    assert "agreement" in (out / "validity.md").read_text()


def test_validity_scheduled_workers_give_the_same_results(smoke, tmp_path, monkeypatch):
    """jobs=2: every stage on single-threaded worker processes, the truth split into one task per
    checkpoint and merged: the same tables as the in-process run, byte for byte."""
    ref, _ = smoke
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # spawned workers import the module by name
    mod = _module()
    monkeypatch.setitem(sys.modules, "validity", mod)
    out = tmp_path / "v2"
    totals = mod.validate([0], out, truth_seeds=2, tiny=True, log=lambda m: None, jobs=2)
    assert totals["jobs"] == 2 and totals["n"] == 1
    for f in ("truth/transfer.csv", "truth/transfer_base.csv", "ties/twin/pilot/transfer.csv",
              "ties/same_mode/pilot/transfer.csv", "score/selection.csv", "score/shortlist.csv"):
        assert (out / "seed0" / f).read_bytes() == (ref / "seed0" / f).read_bytes(), f
    # the merged truth keeps the matched SFT data order of every part (paths differ: other out dir)
    m1, m2 = (json.loads((d / "seed0" / "truth" / "data_manifest-seed1.json").read_text()) for d in (ref, out))
    assert m1["steps"] == m2["steps"] and m1["data"]["sha256"] == m2["data"]["sha256"]
    d1, d2 = (pd.read_csv(d / "seed0" / "truth" / "diagnostics.csv") for d in (ref, out))
    assert sorted(zip(d1["base"], d1["seed"])) == sorted(zip(d2["base"], d2["seed"]))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "seed0" / "truth" / "transfer_items.parquet"),
                                  pd.read_parquet(ref / "seed0" / "truth" / "transfer_items.parquet"))
    a, b = (pd.read_csv(d / "validity.csv").drop(columns=["seconds_pipeline", "seconds_truth", "seconds_ties"])
            for d in (ref, out))
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(pd.read_csv(ref / "ties.csv"), pd.read_csv(out / "ties.csv"))


def test_merge_truth_concatenates_matched_parts_and_refuses_unmatched(tmp_path):
    """The truth is trained one checkpoint per worker; the merge must refuse parts whose SFT data
    differ (the matched-pilot guarantee), not silently concatenate them."""
    merge = _module()._merge_truth
    truth = tmp_path / "truth"
    for name, acc in (("checkpoint-100", 0.5), ("checkpoint-200", 0.7)):
        part = truth / "parts" / name
        part.mkdir(parents=True)
        (part / "data_manifest-seed0.json").write_text('{"sha256": "abc"}', encoding="utf-8")
        pd.DataFrame({"base": [name], "seed": [0], "task_accuracy": [acc]}).to_csv(part / "transfer.csv", index=False)
    merge(truth, ["checkpoint-100", "checkpoint-200"])
    merged = pd.read_csv(truth / "transfer.csv")
    assert merged["base"].tolist() == ["checkpoint-100", "checkpoint-200"]
    assert merged["task_accuracy"].tolist() == [0.5, 0.7]
    assert (truth / "data_manifest-seed0.json").read_text(encoding="utf-8") == '{"sha256": "abc"}'

    (truth / "parts" / "checkpoint-200" / "data_manifest-seed0.json").write_text('{"sha256": "def"}', encoding="utf-8")
    with pytest.raises(RuntimeError, match=r"checkpoint-200: its SFT data manifests differ .*Delete"):
        merge(truth, ["checkpoint-100", "checkpoint-200"])
    (truth / "parts" / "checkpoint-200" / "data_manifest-seed0.json").unlink()
    with pytest.raises(RuntimeError, match="differ"):
        merge(truth, ["checkpoint-100", "checkpoint-200"])
