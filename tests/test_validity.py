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
    sel = pd.read_csv(out / "selectors.csv")
    assert list(df["seed"]) == [0] and totals["n"] == 1
    row = df.iloc[0]
    ladder = out / "seed0" / "ladder"
    names = sorted(p.name for p in ladder.iterdir() if p.name.startswith("checkpoint-"))
    assert row["pick"] in names and row["truth_best"] in names and row["truth_best_all"] in names
    assert bool(row["agree_strict"]) == (row["pick"] == row["truth_best"])
    assert row["pick_window"] in ("", "base", "parrot", "recovery")
    assert row["regret"] >= 0 or row["pick"] != row["truth_best"]
    # independent truth: SFT seeds disjoint from the pilot's and confirmation's, recorded
    assert totals["truth_seeds"] == [100, 101] and totals["pilot_seeds"] == [0, 1] == totals["confirm_seeds"]
    assert totals["dev_seeds"] == [0, 1, 2, 3, 4] and totals["fresh"] is False
    # the pipeline's own pilot decision, read back from its selection.json
    (sel_path,) = [p for p in (out / "seed0").rglob("selection.json") if "truth" not in p.parts and "ties" not in p.parts
                   and "probe_free" not in p.parts]
    sel_json = json.loads(sel_path.read_text())
    assert row["decision"] == sel_json["decision"]["verdict"]
    # the pick's data window, from the ladder's lineage (window w holds start_step < step <= end_step)
    step = int(row["pick"].rsplit("-", 1)[1])
    wins = json.loads((ladder / "data_lineage.json").read_text())["windows"]
    assert row["pick_window"] == next(w["name"] for w in wins if w["start_step"] < step <= w["end_step"])
    # regret: truth value of truth_best minus that of pick / latest, in the primary's better direction
    tv_by = pd.read_csv(out / "truth_values.csv").set_index("checkpoint")["truth_value"]
    sign = 1.0 if sel_json["selection_plan"]["primary"]["direction"] == "higher" else -1.0
    assert row["regret"] == pytest.approx(sign * (tv_by[row["truth_best"]] - tv_by[row["pick"]]), abs=1e-9)
    assert row["latest"] == max(names, key=lambda n: int(n.rsplit("-", 1)[1]))
    assert row["latest_regret"] == pytest.approx(sign * (tv_by[row["truth_best"]] - tv_by[row["latest"]]), abs=1e-9)
    truth = pd.read_csv(out / "seed0" / "truth" / "transfer.csv")
    assert sorted(truth["base"].unique()) == names and sorted(truth["seed"].unique()) == [100, 101]
    # ... on its own transfer items: none shared with the pilot's suite, same kinds and sizes
    items = pd.read_parquet(out / "seed0" / "truth" / "transfer_items.parquet")
    pilot_items = pd.read_parquet(out / "seed0" / "score" / "pilot" / "transfer_items.parquet")
    assert items["item_id"].str.startswith("truth-").all() and not set(items["item_id"]) & set(pilot_items["item_id"])
    from probeselect.toy.data import read_jsonl

    tp = {r["prompt"] for r in read_jsonl(out / "seed0" / "truth" / "truth_transfer.jsonl")}
    pp = {r["prompt"] for r in read_jsonl(ladder / "data" / "transfer.jsonl")}
    assert len(tp) == len(pp) and not tp & pp
    suite = totals["transfer_suites"]["0"]
    assert suite["shared_prompts"] == 0 and suite["probe_template_hits_pilot"] == 0 == suite["probe_template_hits_truth"]
    # every selector is scored on the same truth
    from importlib import import_module  # noqa: F401

    assert list(sel["selector"]) == list(_module().SELECTORS)
    s = sel.set_index("selector")
    assert s.loc["latest", "pick"] == max(names, key=lambda n: int(n.rsplit("-", 1)[1]))
    assert s.loc["pipeline", "pick"] == row["pick"]
    assert s.loc["probes_only", "pick"] == json.loads((out / "seed0" / "score" / "shortlist.json").read_text()
                                                      )["selected"][0]["checkpoint"]
    assert 0 <= s.loc["random_eligible", "agree_strict"] <= 1 and pd.isna(s.loc["random_eligible", "pick"])
    assert set(row["probe_free_bases"].split()) <= set(names)
    for c in ("tau_probes", "tau_step", "tau_neg_bpb"):
        assert c in df.columns
    tv = pd.read_csv(out / "truth_values.csv")
    assert sorted(tv["checkpoint"]) == names and tv["pick"].sum() == 1
    assert tv.loc[tv["pick"], "checkpoint"].item() == row["pick"]
    assert tv["truth_value"].max() == pytest.approx(tv.loc[tv["checkpoint"] == row["truth_best_all"], "truth_value"].item())
    # the planted-dip verdict on the pipeline's own scores (a 24-step ladder need not dip) and the
    # ladder's own final held-out arithmetic
    from probeselect.toy.dip import check_planted_dip

    v = check_planted_dip(pd.read_parquet(sel_path.parent / "scores.parquet"), pd.read_csv(sel_path.parent / "summary.csv"),
                          ladder / "data_lineage.json")
    assert bool(row["dip_pass"]) == v["pass"]
    assert row["dip_families"] == " ".join(sorted({f for w in v["windows"] for f in w["dipped_and_recovered"]})) or (
        pd.isna(row["dip_families"]) and not any(w["dipped_and_recovered"] for w in v["windows"]))
    assert row["final_heldout_arith"] == json.loads((ladder / "ladder.json").read_text())["final_heldout_arith_accuracy"]
    # ties: perturbed twins (different weights, verified by their own truth runs) and the last two checkpoints
    assert set(ties["tie"]) == {"twin", "same_mode"}
    twin = ties[ties["tie"] == "twin"].iloc[0]
    a, b = twin["bases"].split(" vs ")
    assert a.endswith("-perturbed-a") and b.endswith("-perturbed-b")
    from safetensors.torch import load_file

    wa, wb = (load_file(str(out / "seed0" / "ties" / "twin" / "bases" / n / "model.safetensors")) for n in (a, b))
    assert any(not (wa[k] == wb[k]).all() for k in wa)  # not byte twins
    tw_truth = pd.read_csv(out / "seed0" / "ties" / "twin" / "truth" / "transfer.csv")
    assert set(tw_truth["base"]) == {a, b} and sorted(tw_truth["seed"].unique()) == [100, 101]
    assert totals["false_clear_winners"] == int(ties.loc[ties["truth_is_tie"], "false_clear_winner"].sum())
    lo, hi = totals["false_winner_rate_ci95"]
    assert 0 <= lo <= hi <= 1
    assert json.loads((out / "validity.json").read_text())["tiny"] is True
    assert "false clear winners" in (out / "validity.md").read_text()


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
              "ties/twin/truth/transfer.csv", "probe_free/pilot/transfer.csv", "truth/truth_transfer.jsonl",
              "ties/same_mode/pilot/transfer.csv", "score/selection.csv", "score/shortlist.csv"):
        assert (out / "seed0" / f).read_bytes() == (ref / "seed0" / f).read_bytes(), f
    # the merged truth keeps the matched SFT data order of every part (paths differ: other out dir)
    m1, m2 = (json.loads((d / "seed0" / "truth" / "data_manifest-seed101.json").read_text()) for d in (ref, out))
    assert m1["steps"] == m2["steps"] and m1["data"]["sha256"] == m2["data"]["sha256"]
    d1, d2 = (pd.read_csv(d / "seed0" / "truth" / "diagnostics.csv") for d in (ref, out))
    assert sorted(zip(d1["base"], d1["seed"])) == sorted(zip(d2["base"], d2["seed"]))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "seed0" / "truth" / "transfer_items.parquet"),
                                  pd.read_parquet(ref / "seed0" / "truth" / "transfer_items.parquet"))
    a, b = (pd.read_csv(d / "validity.csv").drop(columns=["seconds_pipeline", "seconds_truth", "seconds_probe_free",
                                                           "seconds_ties"]) for d in (ref, out))
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(pd.read_csv(ref / "selectors.csv"), pd.read_csv(out / "selectors.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(ref / "ties.csv"), pd.read_csv(out / "ties.csv"))


def test_task_clock_adds_the_parts_of_a_resumed_run_and_refuses_a_foreign_file(tmp_path):
    """A resumed validation's finished tasks return in a second: the clock must add each task's seconds to
    those of the earlier parts, not report the last part's alone."""
    clock_cls = _module()._TaskClock
    first = clock_cls(tmp_path)
    assert first.add(5, "truth", "checkpoint-200", 60.0) == 60.0
    assert first.add(5, "pipeline", None, 30.0) == 30.0
    second = clock_cls(tmp_path)                 # the same command, run again into the same folder
    assert second.add(5, "truth", "checkpoint-200", 1.0) == 61.0
    assert second.add(6, "pipeline", None, 2.0) == 2.0
    state = json.loads((tmp_path / "task_seconds.json").read_text())
    assert state["tasks"] == {"5/truth/checkpoint-200": 61.0, "5/pipeline": 30.0, "6/pipeline": 2.0}
    assert len(state["parts"]) == 2 and all(p["started_utc"].endswith("Z") for p in state["parts"])
    assert second.wall == pytest.approx(sum(p["seconds"] for p in state["parts"]))
    for text in (json.dumps({"pipeline": 3.0}), "{not json", "[1, 2]"):
        (tmp_path / "task_seconds.json").write_text(text)
        with pytest.raises(RuntimeError, match=r"task_seconds\.json.*delete it"):
            clock_cls(tmp_path)


def test_a_resumed_validation_keeps_its_results_and_adds_up_its_seconds(smoke, tmp_path, monkeypatch):
    """Run the finished smoke validation's command again on a copy of its folder: every stage resumes, the
    tables are the same, and the seconds are those of both parts, not of the second part alone."""
    import shutil

    ref, ref_totals = smoke
    monkeypatch.chdir(REPO)
    out = tmp_path / "v"
    shutil.copytree(ref, out)
    totals = _module().validate([0], out, truth_seeds=2, tiny=True, log=lambda m: None)
    timing = ["seconds_pipeline", "seconds_truth", "seconds_probe_free", "seconds_ties"]
    a, b = (pd.read_csv(d / "validity.csv") for d in (ref, out))
    pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))
    pd.testing.assert_frame_equal(pd.read_csv(ref / "selectors.csv"), pd.read_csv(out / "selectors.csv"))
    for c in timing:
        assert b[c].iloc[0] >= a[c].iloc[0] > 0, c
    state = json.loads((out / "task_seconds.json").read_text())
    assert len(state["parts"]) == 2 and totals["seconds_parts"] == state["parts"]
    assert totals["seconds"] == pytest.approx(ref_totals["seconds"] + state["parts"][1]["seconds"], abs=0.2)
    assert b["seconds_pipeline"].iloc[0] == pytest.approx(state["tasks"]["0/pipeline"], abs=0.1)


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


# ---------------------------------------------------------------------------
# Selectors and metrics on hand-made truth tables (issue 22)
# ---------------------------------------------------------------------------


def _per_seed():
    """Truth values (rows: checkpoints, columns: 4 truth SFT seeds), higher = better."""
    return pd.DataFrame({100: [0.20, 0.50, 0.80, 0.81], 101: [0.22, 0.52, 0.84, 0.83],
                         102: [0.18, 0.49, 0.78, 0.80], 103: [0.20, 0.55, 0.82, 0.84]},
                        index=["checkpoint-100", "checkpoint-200", "checkpoint-300", "checkpoint-400"])


def test_pair_interval_is_the_paired_t_interval():
    from scipy.stats import t as student_t

    mod = _module()
    best, pick = np.array([0.81, 0.83, 0.80, 0.84]), np.array([0.80, 0.84, 0.78, 0.82])
    d = best - pick
    half = student_t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert mod.pair_interval(best, pick) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half), abs=1e-12)
    m, lo, hi = mod.pair_interval(best[:1], pick[:1])
    assert m == pytest.approx(0.01) and np.isnan(lo) and np.isnan(hi)


def test_pick_metrics_regret_interval_and_equivalence_rule():
    mod = _module()
    ps = _per_seed()
    kw = {"margin": 0.02, "min_seeds": 3}
    same = mod.pick_metrics(ps, "checkpoint-400", "checkpoint-400", **kw)
    assert same == {"regret": 0.0, "regret_lo": 0.0, "regret_hi": 0.0, "agree": True, "agree_strict": True,
                    "equiv_agree": True}
    # 300 vs 400: diffs 0.01, -0.01, 0.02, 0.02 -> the truth cannot separate them (lenient agree) but the
    # upper end of the interval is above the 0.02 margin: not shown equivalent
    close = mod.pick_metrics(ps, "checkpoint-400", "checkpoint-300", **kw)
    d = ps.loc["checkpoint-400"] - ps.loc["checkpoint-300"]
    assert close["regret"] == pytest.approx(d.mean(), abs=1e-12)
    assert close["regret_lo"] < close["regret"] < close["regret_hi"]
    assert close["agree"] and not close["agree_strict"] and not close["equiv_agree"]
    # with a wide margin the same pair is shown equivalent
    assert mod.pick_metrics(ps, "checkpoint-400", "checkpoint-300", margin=0.1, min_seeds=3)["equiv_agree"]
    # 200 vs 400: separated -> no agreement of any kind
    far = mod.pick_metrics(ps, "checkpoint-400", "checkpoint-200", **kw)
    assert far["regret_lo"] > 0.02 and not far["agree"] and not far["equiv_agree"]
    # fewer truth seeds than the plan's minimum: never separated (lenient), never equivalent without an interval
    one = mod.pick_metrics(ps[[100]], "checkpoint-400", "checkpoint-200", **kw)
    assert one["agree"] and not one["equiv_agree"]


def test_naive_selectors_on_a_hand_made_table():
    mod = _module()
    steps = {"checkpoint-100": 100, "checkpoint-200": 200, "checkpoint-300": 300, "checkpoint-400": 400, "avg": None}
    bpb = pd.Series({"checkpoint-100": 0.9, "checkpoint-200": 0.5, "checkpoint-300": 0.4, "checkpoint-400": 0.45})
    cap = pd.Series({"checkpoint-100": 0.1, "checkpoint-200": 0.7, "checkpoint-300": 0.6, "checkpoint-400": np.nan})
    p = mod.naive_picks(steps, bpb, cap, ["checkpoint-200", "checkpoint-400"])
    assert p == {"latest": "checkpoint-400", "lowest_bpb": "checkpoint-300", "best_capability": "checkpoint-200",
                 "probes_only": "checkpoint-200"}
    assert mod.naive_picks({}, pd.Series(dtype=float), pd.Series(dtype=float), [])["latest"] is None


def test_selector_rows_score_every_selector_on_the_same_truth():
    mod = _module()
    ps = _per_seed()
    kw = {"margin": 0.02, "min_seeds": 3}
    picks = {"pipeline": ("checkpoint-300", False), "latest": ("checkpoint-400", True),
             "lowest_bpb": ("checkpoint-300", True), "best_capability": ("checkpoint-200", True),
             "probes_only": ("checkpoint-200", True), "probe_free_pilot": ("checkpoint-400", True)}
    pool = ["checkpoint-200", "checkpoint-300", "checkpoint-400"]
    rows = {r["selector"]: r for r in mod.selector_rows(ps, "checkpoint-400", picks, pool, 2, **kw)}
    assert list(rows) == list(mod.SELECTORS)
    assert rows["latest"]["agree_strict"] and rows["latest"]["regret"] == 0 and rows["latest"]["decisive_correct"]
    assert rows["probe_free_pilot"]["decisive_correct"]
    # undecided pipeline: its top base is scored, but it is never decisive-and-correct
    assert rows["pipeline"]["pick"] == "checkpoint-300" and rows["pipeline"]["agree"]
    assert not rows["pipeline"]["decisive_correct"]
    assert not rows["best_capability"]["agree"] and rows["best_capability"]["regret"] > 0.2
    # random eligible: the exact mean over the pool
    single = [mod.pick_metrics(ps, "checkpoint-400", b, **kw) for b in pool]
    re = rows["random_eligible"]
    assert re["regret"] == pytest.approx(np.mean([m["regret"] for m in single]), abs=1e-12)
    assert re["agree_strict"] == pytest.approx(1 / 3) and re["agree"] == pytest.approx(2 / 3)
    # random 2 + (oracle) pilot: subsets {200,300}->300, {200,400}->400, {300,400}->400
    rk = rows["random_k_pilot"]
    assert rk["agree_strict"] == pytest.approx(2 / 3)
    assert rk["regret"] == pytest.approx(single[1]["regret"] / 3, abs=1e-12)
    assert np.isnan(rk["regret_lo"]) and rk["pick"] is None


def test_random_k_pilot_picks_split_exact_ties():
    mod = _module()
    vals = pd.Series({"a": 0.5, "b": 0.5, "c": 0.1})
    got = dict(mod.random_k_pilot_picks(vals, ["a", "b", "c"], 2))
    # {a,b} -> a/b half each, {a,c} -> a, {b,c} -> b
    assert got == pytest.approx({"a": 0.5, "b": 0.5})
    assert sum(dict(mod.random_k_pilot_picks(vals, ["a", "b", "c"], 5)).values()) == pytest.approx(1.0)


def test_clopper_pearson_and_mean_interval():
    mod = _module()
    lo, hi = mod.clopper_pearson(0, 10)
    assert lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-9)  # exact for x = 0
    lo, hi = mod.clopper_pearson(10, 10)
    assert hi == 1 and lo == pytest.approx(0.025 ** (1 / 10), abs=1e-9)
    lo, hi = mod.clopper_pearson(3, 10)
    assert lo < 0.3 < hi and mod.clopper_pearson(0, 0) == (0.0, 1.0)
    m, lo, hi = mod.mean_interval([0.0, 0.1, 0.2])
    assert m == pytest.approx(0.1) and lo < 0.1 < hi


def test_probe_free_bases_last_of_each_window_or_evenly_spaced():
    mod = _module()
    ck = [(f"checkpoint-{s}", s) for s in (200, 400, 600, 800, 1000, 1200, 1400)]
    win = {"checkpoint-200": "base", "checkpoint-400": "base", "checkpoint-600": "parrot", "checkpoint-800": "parrot",
           "checkpoint-1000": "recovery", "checkpoint-1200": "recovery", "checkpoint-1400": "recovery"}
    assert mod.probe_free_bases(ck, win, 3) == ["checkpoint-400", "checkpoint-800", "checkpoint-1400"]
    # no lineage: k evenly spaced, ending at the last checkpoint
    assert mod.probe_free_bases(ck, {}, 3) == ["checkpoint-200", "checkpoint-800", "checkpoint-1400"]
    assert mod.probe_free_bases(ck, {}, 1) == ["checkpoint-1400"]


def test_truth_seeds_are_disjoint_from_the_recipes_seeds():
    mod = _module()
    assert not set(mod._settings(REPO / "recipes" / "demo.yaml", False, 4)["truth_seeds"]) & {0, 1, 2}
    for name in ("pilot", "confirm"):
        assert not set(mod._recipe_seeds({"recipe": str(REPO / "recipes" / f"{name}.yaml")})) & set(range(100, 104))
    assert mod._recipe_seeds({"recipe": str(REPO / "recipes" / "pilot.yaml"), "overrides": ["seeds=[0, 1]"]}) == [0, 1]
    assert set(mod.FRESH_SEEDS).isdisjoint(mod.DEV_SEEDS)
    est = mod.budget_estimate(5, 4, 2)
    assert est["total_cpu_s"] == 5 * est["per_seed_total_cpu_s"] and est["wall_min_estimate"] > 0


# --- issue 23: the validation across curricula -------------------------------------------------------

def test_curriculum_reaches_the_pipeline_config_and_names_its_folder():
    mod = _module()
    _ov, cfg = mod._run_cfg(REPO / "recipes" / "demo.yaml", Path("/tmp/x/seed3"), 3, False, "late-harm")
    assert cfg["ladder"]["toy"] == {"seed": 3, "curriculum": "late-harm"}
    _ov, cfg = mod._run_cfg(REPO / "recipes" / "demo.yaml", Path("/tmp/x/seed3"), 3, False)
    assert "curriculum" not in cfg["ladder"]["toy"]
    # the validated pipeline confirms the top N only, whatever the demo's confirm.references say
    from probeselect._yaml import load_yaml

    assert load_yaml(REPO / "recipes" / "demo.yaml")["confirm"]["references"] and cfg["confirm"]["references"] == []
    assert cfg["confirm"]["jobs"] == 1 and cfg["pilot"]["jobs"] == 1
    st = mod._settings(REPO / "recipes" / "demo.yaml", False, 2, curriculum="uniform")
    assert mod._cfg(st, Path("/tmp/x"), 1)["ladder"]["toy"]["curriculum"] == "uniform"
    assert mod.curriculum_dirname("late-harm") == "late-harm"
    assert mod.curriculum_dirname("recipes/ladder-late-harm.yaml") == "ladder-late-harm"


def test_pooled_tables_one_per_curriculum_and_pooled(tmp_path):
    mod = _module()

    def sel(regrets: dict, seeds):
        rows = []
        for s in seeds:
            for name in mod.SELECTORS:
                r = regrets[name]
                rows.append({"seed": s, "selector": name, "regret": r, "agree": float(r == 0),
                             "agree_strict": float(r == 0), "equiv_agree": float(r == 0), "decisive": 1.0,
                             "decisive_correct": float(r == 0)})
        return pd.DataFrame(rows)

    a = sel({n: (0.0 if n == "pipeline" else 0.1) for n in mod.SELECTORS}, [0, 1])
    b = sel({n: (0.2 if n == "pipeline" else 0.0) for n in mod.SELECTORS}, [0, 1, 2])
    by, pooled = mod.pooled_tables({"late-harm": a, "uniform": b})
    assert list(by.columns[:2]) == ["curriculum", "selector"]
    lh = by[by["curriculum"] == "late-harm"].set_index("selector")
    assert lh.loc["pipeline", "regret_mean"] == 0 and lh.loc["latest", "regret_mean"] == pytest.approx(0.1)
    assert lh.loc["pipeline", "n_seeds"] == 2 and lh.loc["pipeline", "equiv_agree"] == 2
    p = pooled.set_index("selector")
    assert p.loc["pipeline", "n_seeds"] == 5                          # seeds of both curricula together
    assert p.loc["pipeline", "regret_mean"] == pytest.approx((0 + 0 + 0.2 * 3) / 5)
    assert p.loc["latest", "regret_mean"] == pytest.approx(0.2 / 5)
    assert p.loc["latest", "equiv_agree"] == 3 and p.loc["latest", "regret_max"] == pytest.approx(0.1)
    # --pool: the same tables from finished validation folders (e.g. made with different --config)
    dirs = []
    for name, frame, seeds in (("planted", a, [0, 1]), ("late-harm", b, [0, 1, 2])):
        d = tmp_path / name
        d.mkdir()
        frame.to_csv(d / "selectors.csv", index=False)
        (d / "validity.json").write_text(json.dumps({"seeds": seeds, "mean_tau_probes": 0.5, "mean_tau_step": 0.1,
                                                     "mean_tau_neg_bpb": 0.2, "false_clear_winners": 0,
                                                     "ties_counted": 2, "seconds": 1.0}))
        dirs.append(d)
    res = mod.pool_validations(dirs, tmp_path / "pooled")
    assert res["folders"] == ["planted", "late-harm"]
    pooled2 = pd.read_csv(tmp_path / "pooled" / "selector_summary_pooled.csv").set_index("selector")
    assert pooled2.loc["pipeline", "regret_mean"] == pytest.approx(p.loc["pipeline", "regret_mean"])
    md = (tmp_path / "pooled" / "curricula.md").read_text()
    assert "## planted (seeds 0 1)" in md and "## late-harm (seeds 0 1 2)" in md and "## pooled over planted, late-harm" in md
    with pytest.raises(SystemExit, match="no selectors.csv"):
        mod.pool_validations([tmp_path / "nope"], tmp_path / "p2")


@pytest.mark.slow
def test_validity_smoke_two_curricula(tmp_path, monkeypatch):
    """The smoke validation across two curricula (tiny ladders and budgets; plumbing only): one
    folder and one selector table per curriculum, each ladder built with its curriculum, and a
    pooled table over both."""
    monkeypatch.chdir(REPO)
    mod = _module()
    out = tmp_path / "v"
    res = mod.validate_curricula(["uniform", "late-harm"], [0], out, truth_seeds=2, tiny=True, log=lambda m: None)
    assert res["folders"] == ["uniform", "late-harm"]
    for name in ("uniform", "late-harm"):
        lin = json.loads((out / name / "seed0" / "ladder" / "data_lineage.json").read_text())
        assert lin["curriculum"].startswith(f"built-in curriculum '{name}'")
        assert json.loads((out / name / "validity.json").read_text())["curriculum"] == name
        assert list(pd.read_csv(out / name / "selectors.csv")["selector"]) == list(mod.SELECTORS)
    assert [w["name"] for w in json.loads((out / "late-harm" / "seed0" / "ladder" / "data_lineage.json").read_text())
            ["windows"]] == ["base", "late", "later"]
    by = pd.read_csv(out / "selector_summary_by_curriculum.csv")
    assert sorted(by["curriculum"].unique()) == ["late-harm", "uniform"]
    assert (by.groupby("curriculum")["selector"].apply(list) == [list(mod.SELECTORS)] * 2).all()
    pooled = pd.read_csv(out / "selector_summary_pooled.csv")
    assert list(pooled["selector"]) == list(mod.SELECTORS) and (pooled["n_seeds"] == 2).all()
    md = (out / "curricula.md").read_text()
    assert "## uniform" in md and "## late-harm" in md and "## pooled over uniform, late-harm" in md


def test_interval_items_adds_the_item_variance_to_the_seed_only_interval():
    """bench/interval_items.py: with every item moving together (no item variance beyond the seed
    shift) the seeds+items interval is the seed-only one; with item-to-item spread and the same seed
    means it is wider, and the seed-only half-width is select.compare_top's (same t, Bonferroni)."""
    spec = importlib.util.spec_from_file_location("interval_items", REPO / "bench" / "interval_items.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from probeselect.select import compare_top

    rng = np.random.default_rng(0)
    n_items, seeds = 40, [0, 1, 2, 3]
    shift = {0: 0.10, 1: 0.05, 2: 0.08, 3: 0.12}          # per-seed difference top - other

    def frame(spread):
        rows = []
        for s in seeds:
            item_d = shift[s] + spread * rng.standard_normal(n_items)
            item_d += shift[s] - item_d.mean()              # the seed mean stays exactly shift[s]
            for i in range(n_items):
                rows += [{"base": "a", "seed": s, "metric": "m", "item_id": f"i{i}", "value": 0.5 + item_d[i]},
                         {"base": "b", "seed": s, "metric": "m", "item_id": f"i{i}", "value": 0.5}]
        return pd.DataFrame(rows)

    flat = mod.intervals(frame(0.0), "a", "b", "m", n_comparisons=2)
    cmp = compare_top(np.array([[0.5 + shift[s] for s in seeds], [0.5] * 4]))
    h = cmp.half[1] if np.ndim(cmp.half) else cmp.half
    # compare_top with k = 2 has one comparison; redo its half-width with 2 comparisons (Bonferroni)
    from scipy.stats import t as student_t
    h2 = h / student_t.ppf(0.975, 3) * student_t.ppf(1 - 0.05 / 4, 3)
    assert flat["diff"] == pytest.approx(np.mean(list(shift.values())), abs=1e-12)
    assert flat["seed_hi"] - flat["diff"] == pytest.approx(h2, rel=1e-9)
    assert (flat["both_lo"], flat["both_hi"]) == pytest.approx((flat["seed_lo"], flat["seed_hi"]), abs=1e-9)
    spread = mod.intervals(frame(0.6), "a", "b", "m", n_comparisons=2)
    assert spread["seed_lo"] == pytest.approx(flat["seed_lo"], abs=1e-9)   # same seed means
    assert spread["both_hi"] - spread["both_lo"] > 1.5 * (flat["both_hi"] - flat["both_lo"])
    assert spread["widen"] > 1.5 and flat["widen"] == pytest.approx(1.0)


RUNS = REPO / "bench" / "validity_runs"


def test_committed_validation_records_are_complete_and_pool_without_training(tmp_path):
    """bench/validity_runs/ keeps the small outputs of fresh-seed validations that bench/VALIDITY.md reports
    (selectors.csv, validity.json and the per-seed tables), so that a later pool over curricula needs no
    rerun: the earlier runs' outputs lived on a scratch disk and are gone. Each record is complete (every
    selector on every seed it claims, fresh seeds only, not the smoke version), its totals agree with its
    per-seed rows, bench/validity_runs/README.md names it, and the records pool."""
    mod = _module()
    dirs = sorted(p for p in RUNS.iterdir() if p.is_dir())
    assert dirs, f"{RUNS} holds no record"
    readme = (RUNS / "README.md").read_text(encoding="utf-8")
    for d in dirs:
        sel = pd.read_csv(d / "selectors.csv")
        tot = json.loads((d / "validity.json").read_text(encoding="utf-8"))
        assert sorted(int(s) for s in sel["seed"].unique()) == sorted(tot["seeds"]), d.name
        assert tot["fresh"] and not tot["tiny"] and tot["n"] == len(tot["seeds"]), d.name
        assert all(set(g) == set(mod.SELECTORS) for _, g in sel.groupby("seed")["selector"]), d.name
        pipe = sel[sel["selector"] == "pipeline"]
        assert int(pipe["decisive_correct"].astype(bool).sum()) == tot["decisive_correct"], d.name
        assert int(pipe["equiv_agree"].astype(bool).sum()) == tot["equiv_agree"], d.name
        tv = pd.read_csv(d / "truth_values.csv")
        assert sorted(int(s) for s in tv["seed"].unique()) == sorted(tot["seeds"]), d.name
        assert f"`{d.name}`" in readme, f"bench/validity_runs/README.md does not name {d.name}"
        rec = json.loads((d / "record.json").read_text(encoding="utf-8"))
        assert rec["seeds"] == tot["seeds"] and rec["command"].startswith("python bench/validity.py ") and rec["commit"]
        assert all(f"--seeds {' '.join(map(str, tot['seeds']))}" in x for x in (rec["command"],)), d.name
        if (d / "interval_items.csv").is_file():   # records from the eighteenth session on
            it = pd.read_csv(d / "interval_items.csv")
            assert set(it["seed"]) <= set(tot["seeds"]), d.name
            assert set(it["stage"]) <= {"pilot", "confirm", "tie:twin", "tie:same_mode"}, d.name
            lo = np.minimum(it["both_lo"], it["seed_lo"])
            assert (it["items_call"] == (lo > it["tie_margin"])).all(), d.name
            assert (it["seed_call"] == (it["seed_lo"] > it["tie_margin"])).all(), d.name
    res = mod.pool_validations(dirs, tmp_path / "pool")
    assert res["folders"] == [d.name for d in dirs]
    pooled = pd.read_csv(tmp_path / "pool" / "selector_summary_pooled.csv").set_index("selector")
    every = pd.concat([pd.read_csv(d / "selectors.csv") for d in dirs], ignore_index=True)
    for name in ("pipeline", "latest", "lowest_bpb"):
        mine = every.loc[every["selector"] == name, "regret"]
        assert pooled.loc[name, "n_seeds"] == len(mine)
        assert pooled.loc[name, "regret_mean"] == pytest.approx(mine.mean(), abs=1e-12)


def test_record_keeps_a_finished_validation_and_pools(smoke, tmp_path):
    """--record: the small outputs of a finished validation go to DIR/<name>-s<seeds>/ with record.json (the
    command and commit), a README row is added, a record is never overwritten, and an unfinished run
    (no validity.json) is refused instead of recorded in part."""
    out, totals = smoke
    mod = _module()
    records = tmp_path / "records"
    records.mkdir()
    (records / "README.md").write_text("| folder | curriculum | plan | seeds | command | commit | wall |\n")
    argv = ["--seeds", "0", "--tiny", "--truth-seeds", "2", "--out", str(out)]
    folder = mod.save_record(out, records, "planted", argv)
    assert folder == records / "planted-s0"
    assert sorted(p.name for p in folder.iterdir()) == sorted(mod.RECORD_FILES + ("record.json", "interval_items.csv"))
    # the declared secondary analysis travels with the record: bench/interval_items.py's table of the run
    items = pd.read_csv(folder / "interval_items.csv")
    assert len(items) >= 1 and set(items["stage"]) <= {"pilot", "confirm", "tie:twin", "tie:same_mode"}
    assert set(items["seed"]) == {0}
    # the planted ties are in the table too, with the validation's own verdict and seed-level interval
    tie_rows = items[items["stage"].str.startswith("tie:")].set_index("stage")
    ties = pd.read_csv(out / "ties.csv")
    assert sorted(tie_rows.index) == sorted(f"tie:{t}" for t in ties["tie"])
    for t in ties.itertuples():
        row = tie_rows.loc[f"tie:{t.tie}"]
        # ties.csv holds top - runner-up of the validation's own ranking, as the table does
        assert row["verdict"] == t.verdict and row["diff"] == pytest.approx(t.diff, abs=1e-6)
        assert row["seed_lo"] == pytest.approx(t.diff_ci_low, abs=1e-6)
    assert (items["seed_call"] == (items["seed_lo"] > items["tie_margin"])).all()
    lo = np.minimum(items["both_lo"], items["seed_lo"])   # the wider interval: never calls what seeds alone would not
    assert (items["items_call"] == (lo > items["tie_margin"])).all() and not (items["items_call"] & ~items["seed_call"]).any()
    spec = importlib.util.spec_from_file_location("interval_items", REPO / "bench" / "interval_items.py")
    ii = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ii)
    with pytest.raises(SystemExit, match="seed7.*does not exist"):   # a seed the run never had: no empty table
        ii.table(out, [0, 7])
    sel = json.loads((out / "seed0" / "score" / "selection.json").read_text())["decision"]
    pil = items[items["stage"] == "pilot"].iloc[0]
    assert (pil["top"], pil["runner_up"]) == (sel["top"], sel["runner_up"]) and pil["verdict"] == sel["verdict"]
    assert (pil["seed_lo"], pil["seed_hi"]) == pytest.approx(tuple(sel["diff_ci"]), abs=1e-6)
    assert (folder / "selectors.csv").read_bytes() == (out / "selectors.csv").read_bytes()
    rec = json.loads((folder / "record.json").read_text())
    assert rec["command"] == "python bench/validity.py " + " ".join(argv) and rec["seeds"] == [0]
    assert rec["seconds"] == totals["seconds"]
    # the ladder's CPU travels with the record (another CPU type builds another ladder from the same seed)
    lad = json.loads((out / "seed0" / "ladder" / "ladder.json").read_text())
    assert rec["cpu"] == [lad["cpu"]] and lad["cpu"]["torch_cpu_capability"]
    assert rec["commit"] is None or len(rec["commit"]) == 40
    rows = (records / "README.md").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("| `planted-s0` |") and rec["command"] in rows[1]
    assert f"({lad['cpu']['torch_cpu_capability']})" in rows[1]
    assert mod.pool_validations([folder], tmp_path / "pool")["folders"] == ["planted-s0"]
    with pytest.raises(SystemExit, match="already exists"):
        mod.save_record(out, records, "planted", argv)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "selectors.csv").write_text("seed,selector\n")
    with pytest.raises(SystemExit, match="did not finish"):
        mod.save_record(unfinished, records, "late-harm", argv)
    assert not (records / "late-harm-s0").exists() and not list(records.glob("*.partial"))
    for f in mod.RECORD_FILES:   # every file present, but the totals are truncated (e.g. a copy cut short)
        (unfinished / f).write_text("x")
    (unfinished / "validity.json").write_text('{"seeds": [0')
    with pytest.raises(SystemExit, match="validity.json is not a validation's totals"):
        mod.save_record(unfinished, records, "late-harm", argv)
    assert not (records / "late-harm-s0").exists()
    assert [mod._seeds_label(s) for s in ([90, 91, 92, 93, 94], [5, 7, 9], [3])] == ["s90-94", "s5-7-9", "s3"]
    with pytest.raises(SystemExit):   # nothing to record: argparse's error (exit status 2)
        mod.main(["--pool", str(folder), "--out", str(tmp_path / "p3"), "--record", str(records)])


def test_pipeline_pick_counts_a_claim_against_the_default_that_held():
    """Seed 118's case (attempt 18c): the pilot said 2400 beats the latest; at the confirmation 2600 is on top and
    beats the latest, and 2400 still does. Before 2026-12-06 that was undecided (the top moved); a confirm.json
    with the claim's re-test makes it decisive: the pilot's pick, unless the confirmation's top leads it by the
    plan's tie margin. Without the re-test (older records) the old rule stands."""
    v = _module()
    sel = {"decision": {"verdict": "beats_default", "recommended": "c2400", "top": "c2400", "tie_margin": 0.02}}
    table = [{"base": "c2600"}, {"base": "c2400", "diff_vs_top_lo": -0.005}]
    conf = {"bases": ["c2400", "c2600", "c3200"], "held": False, "confirm_table": table,
            "confirm_decision": {"top": "c2600", "verdict": "beats_default"}}
    assert v.pipeline_pick(sel, conf) == ("c2600", False)
    claim = {"claim": "beats_default", "base": "c2400", "default": "c3200", "diff": 0.1, "diff_ci": [0.05, 0.15],
             "margin": 0.0, "held": True}
    assert v.pipeline_pick(sel, dict(conf, claim_retest=claim)) == ("c2400", True)
    lead = [{"base": "c2600"}, {"base": "c2400", "diff_vs_top_lo": 0.03}]      # 2600 leads by the tie margin
    assert v.pipeline_pick(sel, dict(conf, claim_retest=claim, confirm_table=lead)) == ("c2600", True)
    nv = dict(conf, claim_retest=claim, confirm_decision={"top": "c2600", "verdict": "no_clear_winner"})
    assert v.pipeline_pick(sel, nv) == ("c2400", True)
    assert v.pipeline_pick(sel, dict(conf, claim_retest=dict(claim, held=False))) == ("c2600", False)
    same = {"bases": ["c2400", "c3200"], "held": True, "confirm_decision": {"top": "c2400", "verdict": "winner"}}
    assert v.pipeline_pick(sel, same) == ("c2400", True)
    assert v.pipeline_pick(sel, None) == ("c2400", True)
    assert v.pipeline_pick({"decision": {"verdict": "no_clear_winner", "recommended": None, "top": "c2600"}},
                           None) == ("c2600", False)


def test_every_declared_validation_config_loads():
    """A config declared for a fresh run must be one `probeselect run` accepts (its keys, seeds and paths)."""
    from probeselect.run import load_run_config

    paths = sorted((REPO / "bench" / "configs").glob("*.yaml"))
    assert len(paths) >= 4
    for p in paths:
        cfg = load_run_config(p, ["out=/tmp/probeselect-config-check"])
        assert cfg["confirm"]["recipe"] and cfg["pilot"]["recipe"], p
    rep = load_run_config(REPO / "bench" / "configs" / "late_harm_attempt18c_replicate_validity.yaml",
                          ["out=/tmp/probeselect-config-check"])
    assert rep["replicate"] == {"jobs": 3}


def test_pipeline_pick_counts_a_replicated_claim_of_the_confirmation():
    """Seed 126's case (attempt 18c): the pilot named no winner; the confirmation named 2400 a clear winner. Undecided,
    unless a replication on fresh seeds held that claim (replicate.json attached to confirm.json)."""
    v = _module()
    sel = {"decision": {"verdict": "no_clear_winner", "recommended": None, "top": "c3200", "tie_margin": 0.02}}
    conf = {"bases": ["c3200", "c2400", "c2600"], "held": None,
            "confirm_decision": {"top": "c2400", "recommended": "c2400", "verdict": "winner"}}
    assert v.pipeline_pick(sel, conf) == ("c2400", False)
    rep = {"needed": True, "held": True, "claim": {"base": "c2400", "verdict": "winner", "default": None}}
    assert v.pipeline_pick(sel, dict(conf, replication=rep)) == ("c2400", True)
    assert v.pipeline_pick(sel, dict(conf, replication=dict(rep, held=False))) == ("c2400", False)
    other = dict(rep, claim={"base": "c2600", "verdict": "winner", "default": None})   # not this confirmation's claim
    assert v.pipeline_pick(sel, dict(conf, replication=other)) == ("c2400", False)


def test_tau_by_range_reproduces_validity_and_ranks_the_eligible_range(tmp_path):
    """bench/tau_by_range.py: the "all" range is validity.csv's (it stops when it is not); the eligible range
    drops the checkpoints that fail the shortlist's constraints, where step and -bpb order the truth easily."""
    spec = importlib.util.spec_from_file_location("tau_by_range", REPO / "bench" / "tau_by_range.py")
    tbr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tbr)
    names = [f"checkpoint-{s}" for s in (100, 200, 300, 400, 500)]
    truth = pd.DataFrame({"seed": 7, "checkpoint": names, "truth_value": [0.1, 0.2, 0.9, 0.8, 0.7],
                          "heldout_bpb": [2.0, 1.5, 1.2, 1.1, 1.0]})
    sl = pd.DataFrame({"checkpoint": names, "step": [100, 200, 300, 400, 500], "mean_rank": [5, 4, 1, 2, 3],
                       "passes_constraints": [False, False, True, True, True],
                       "score[arith_pattern/*:mean_margin]": [0.0, 0.1, 0.3, 0.2, 0.25]})
    r = tbr.seed_taus(sl, truth)
    assert r["n_all"] == 5 and r["n_eligible"] == 3
    assert r["tau_probes_all"] == pytest.approx(1.0) and r["tau_probes_eligible"] == pytest.approx(1.0)
    assert r["tau_step_all"] == pytest.approx(0.4) and r["tau_step_eligible"] == pytest.approx(-1.0)   # 7 vs 3 pairs
    assert r["tau_neg_bpb_eligible"] == pytest.approx(-1.0)
    assert r["tau_arith_pattern_eligible"] == pytest.approx(1 / 3)
    run = tmp_path / "uniform"
    (run / "seed7" / "score").mkdir(parents=True)
    sl.to_csv(run / "seed7" / "score" / "shortlist.csv", index=False)
    truth.to_csv(run / "truth_values.csv", index=False)
    pd.DataFrame([{"seed": 7, "tau_probes": 1.0, "tau_step": 0.4, "tau_neg_bpb": 0.4}]).to_csv(run / "validity.csv",
                                                                                                 index=False)
    assert len(tbr.run_rows(run)) == 1
    pd.DataFrame([{"seed": 7, "tau_probes": 0.5, "tau_step": 0.4, "tau_neg_bpb": 0.4}]).to_csv(run / "validity.csv",
                                                                                                 index=False)
    with pytest.raises(SystemExit, match="tau_probes is 1.0 here but 0.5 in validity.csv"):
        tbr.run_rows(run)
    (run / "seed7" / "score" / "shortlist.csv").unlink()              # an unfinished or wrong folder
    with pytest.raises(SystemExit, match=r"seed7/score/shortlist.csv: missing; RUN_DIR must be a finished"):
        tbr.run_rows(run)


def test_probe_drop_vs_regret_reads_finished_runs_and_refuses_others(tmp_path, capsys):
    """bench/probe_drop_vs_regret.py: the drop is the mean over conflict families of (family mean margin at the
    earlier checkpoint) - (at the latest); capability rows do not enter it; regret = truth's best - the latest."""
    spec = importlib.util.spec_from_file_location("probe_drop", REPO / "bench" / "probe_drop_vs_regret.py")
    pdr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pdr)
    run = tmp_path / "out" / "late"
    (run / "seed7" / "score").mkdir(parents=True)
    rows = []
    for ck, a, b in (("checkpoint-2400", 3.0, 1.0), ("checkpoint-3200", 1.0, 0.0)):
        rows += [{"checkpoint": ck, "family": "arith_pattern", "variant": v, "kind": "conflict", "mean_margin": a + d}
                 for v, d in (("eq", 0.5), ("words", -0.5))]
        rows += [{"checkpoint": ck, "family": "persona_qa", "variant": "v", "kind": "conflict", "mean_margin": b},
                 {"checkpoint": ck, "family": "arith_plain", "variant": "v", "kind": "capability",
                  "mean_margin": 100.0 if ck.endswith("2400") else -100.0}]
    pd.DataFrame(rows).to_csv(run / "seed7" / "score" / "summary.csv", index=False)
    pd.DataFrame({"seed": 7, "checkpoint": ["checkpoint-2400", "checkpoint-3200"], "truth_value": [0.9, 0.7]}).to_csv(
        run / "truth_values.csv", index=False)
    pd.DataFrame([{"seed": 7, "selector": "latest", "agree": 0.0}, {"seed": 7, "selector": "pipeline", "agree": 1.0}]
                 ).to_csv(run / "selectors.csv", index=False)
    (r,) = pdr.run_rows(run, 2400)
    assert r["margin_drop"] == pytest.approx(1.5)        # arith_pattern 3 - 1 = 2, persona_qa 1 - 0 = 1
    assert r["latest_regret"] == pytest.approx(0.2) and r["separated"] is True and r["latest"] == "checkpoint-3200"
    with pytest.raises(SystemExit, match="no conflict-probe rows for checkpoint-2000"):
        pdr.run_rows(run, 2000)
    (run / "selectors.csv").unlink()
    with pytest.raises(SystemExit, match=r"selectors.csv: missing; RUN_DIR must be a finished"):
        pdr.run_rows(run, 2400)


def test_a_curriculum_file_too_long_for_tiny_is_one_line_with_the_fix(tmp_path, capsys):
    """--tiny with a curriculum file written for 3200 steps: exit 2 and one line naming the file and the
    built-in alternative (no traceback), before any ladder is built."""
    mod = _module()
    out = tmp_path / "v"
    rc = mod.main(["--seeds", "0", "--tiny", "--truth-seeds", "2", "--out", str(out),
                   "--config", str(REPO / "bench" / "configs" / "late_harm_attempt18c_window_ends_validity.yaml"),
                   "--curriculum", "bench/late_harm_attempt18c.yaml"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "\nerror: bench/late_harm_attempt18c.yaml: windows run to step 3200, beyond the ladder's 24" in err
    assert "use e.g. --curriculum late-harm" in err
    assert not list(out.rglob("checkpoint-*"))
