"""Selection plan `selection:` block and the plan lock (predeclaration, post-hoc detection)."""

import json
from pathlib import Path

import pytest

from probeselect._io import atomic_write_json, sha256_file
from probeselect.cli import main
from probeselect.errors import ProbeSpecError, SelectionError
from probeselect.plan import (TRANSFER_METRICS, check_lock, is_outcome_file, load_selection_plan, lock_plan,
                              selection_spec_from_dict)
from probeselect.shortlist import load_plan, shortlist
from _selection_fakes import make_score_run

REPO = Path(__file__).resolve().parents[1]


def test_repo_plan_declares_the_final_comparison_and_still_shortlists():
    plan = load_selection_plan(REPO / "recipes" / "selection.yaml")
    sel = plan.selection
    assert plan.declared
    assert sel.primary in TRANSFER_METRICS and sel.direction == TRANSFER_METRICS[sel.primary]
    assert {c.metric for c in sel.constraints} == {"termination", "robust_recovery"}
    assert sel.tie_margin > 0 and sel.bootstrap == 2000 and sel.level == pytest.approx(0.95)
    assert len(plan.sha256) == 64 and "selection:" in plan.text
    # the shortlist parser accepts the extended file unchanged
    assert load_plan(REPO / "recipes" / "selection.yaml").k == 3


@pytest.mark.parametrize("raw, match", [
    ({"primary": {"metric": "task_accuracy"}, "tie": 0.1}, "unknown key 'tie'"),
    ({"primary": {"metric": "task_accuracy", "direction": "up"}}, "direction must be"),
    ({"primary": {"metric": "my_metric"}}, "give its `direction"),
    ({"constraints": [{"metric": "termination"}]}, "needs `min:` or `max:`"),
    ({"decision": {"tie_margin": -0.1}}, "must be >= 0"),
    ({"decision": {"rule": "majority"}}, "only 'interval_above_margin'"),
    ({"decision": {"interval": "items"}}, r"interval must be one of \['seeds', 'seeds\+items'\]"),
    ({"primary": "sft_heldout_bpb", "decision": {"interval": "seeds+items"}}, "is token/byte weighted"),
    ({"uncertainty": {"bootstrap": 10}}, "must be >= 100"),
    ({"uncertainty": {"level": 1.0}}, r"level must be in \[0.5, 1\)"),
])
def test_bad_selection_blocks_name_the_problem(raw, match):
    with pytest.raises(ProbeSpecError, match=match):
        selection_spec_from_dict(raw, source="plan.yaml")


def test_defaults_and_lower_is_better_metrics():
    s = selection_spec_from_dict({"primary": "sft_heldout_bpb", "constraints": [{"metric": "heldout_loss", "max": 3}]})
    assert s.direction == "lower" and s.constraints[0].passes(2.9) and not s.constraints[0].passes(3.1)
    assert not s.constraints[0].passes(float("nan"))
    assert selection_spec_from_dict(None).primary == "task_accuracy"
    # decision.interval: the default is the seed-level interval, and the resolved plan names another one only
    # when the plan asks for it (older plans' outputs stay byte-identical)
    assert selection_spec_from_dict(None).interval == "seeds"
    assert "interval" not in selection_spec_from_dict(None).to_dict()["decision"]
    si = selection_spec_from_dict({"decision": {"tie_margin": 0.02, "interval": "seeds+items"}})
    assert si.interval == "seeds+items" and si.to_dict()["decision"]["interval"] == "seeds+items"


@pytest.mark.parametrize("rel, outcome", [
    ("pilot/transfer.csv", True), ("pilot/transfer_items.parquet", True),
    ("pilot/checkpoint-40/seed0/transfer_items.parquet", True), ("pilot/checkpoint-40/seed0/done.json", True),
    ("pilot/diagnostics.csv", True), ("confirm/diagnostics.csv", True), ("selection.json", True),
    ("confirm.json", True), ("pilot/manifest.json", False), ("summary.csv", False), ("shortlist.csv", False),
    ("dynamics/dynamics.csv", False),
])
def test_outcome_files(rel, outcome):
    assert is_outcome_file(rel) is outcome


PLAN = """\
proxies:
  - {family: conf, variant: "*", metric: mean_margin}
  - {family: rel, variant: x, metric: mean_margin}
k: 5
selection:
  primary: {metric: task_accuracy}
  decision: {tie_margin: 0.0}
"""


@pytest.fixture
def run(tmp_path):
    d = make_score_run(tmp_path / "run")
    (d / "cache").mkdir(parents=True)
    (d / "cache" / "part.parquet").write_text("x")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    return d, plan


def test_lock_records_hash_text_and_files(run):
    d, plan = run
    rec = lock_plan(plan, d)
    on_disk = json.loads((d / "plan.lock.json").read_text())
    assert on_disk == json.loads(json.dumps(rec))
    assert rec["plan_sha256"] == sha256_file(plan) and rec["plan_text"] == PLAN
    assert [f["path"] for f in rec["files"]] == ["manifest.json", "scores.parquet", "summary.csv"]  # cache/: not a result
    assert rec["files"][2]["sha256"] == sha256_file(d / "summary.csv")
    assert rec["outcome_files_at_lock"] == [] and rec["locked_utc"]
    st = check_lock(d)
    assert not st.post_hoc and st.reasons == []


def test_second_lock_is_refused_and_force_keeps_history(run):
    d, plan = run
    lock_plan(plan, d)
    with pytest.raises(SelectionError, match="already has a plan lock"):
        lock_plan(plan, d)
    rec = lock_plan(plan, d, force=True)
    assert len(rec["previous_locks"]) == 1 and not check_lock(d).post_hoc


def test_changed_plan_is_post_hoc(run):
    d, plan = run
    lock_plan(plan, d)
    plan.write_text(PLAN.replace("tie_margin: 0.0", "tie_margin: 0.5"))
    st = check_lock(d)
    assert st.post_hoc and "changed after it was locked" in st.reasons[0]


def test_lock_after_pilot_results_is_post_hoc(run):
    d, plan = run
    (d / "pilot").mkdir()
    (d / "pilot" / "transfer.csv").write_text("base,seed,metric,value\n")
    rec = lock_plan(plan, d)
    assert rec["outcome_files_at_lock"] == ["pilot/transfer.csv"]
    st = check_lock(d)
    assert st.post_hoc and "already existed" in st.reasons[0]


def test_no_lock_and_missing_plan_are_clear_errors(run, tmp_path):
    d, plan = run
    with pytest.raises(SelectionError, match="no plan lock.*plan lock"):
        check_lock(d)
    with pytest.raises(SelectionError, match="run folder not found"):
        lock_plan(plan, tmp_path / "nope")


def test_cli_plan_lock(run, capsys):
    d, plan = run
    assert main(["plan", "lock", str(plan), "--run", str(d)]) == 0
    assert (d / "plan.lock.json").is_file() and "locked" in capsys.readouterr().out
    assert main(["plan", "lock", str(plan), "--run", str(d)]) == 2      # refused, one-line error
    assert "already has a plan lock" in capsys.readouterr().err


@pytest.mark.parametrize("edit, match", [
    (("task_accuracy}", "task_logprb, direction: higher}"),
     r"selection.primary.metric 'task_logprb' is not a transfer metric\. Did you mean \"task_logprob\"\?"),
    (("decision:", "constraints: [{metric: terminaton, min: 0.5}]\n  decision:"),
     r"selection.constraints\[0\].metric 'terminaton'.*Did you mean \"termination\""),
    (("family: rel,", "family: rell,"), r"family 'rell' is not in this run\. Did you mean \"rel\""),
    (("variant: x,", "variant: y,"), r"has no variant 'y'"),
    (("metric: mean_margin}\n  - {family: rel", "metric: mean_margn, direction: higher}\n  - {family: rel"),
     r"metric 'mean_margn' is not a numeric summary.csv column\. Did you mean \"mean_margin\""),
    (("k: 5", "k: 5\ncandidates: [checkpoint-70]"), r"candidate 'checkpoint-70' is not a checkpoint"),
])
def test_lock_validates_every_name_against_the_run(run, edit, match, capsys):
    """A misspelled name fails at `plan lock` (exit 2, naming the plan file and the fix), not at select."""
    d, plan = run
    plan.write_text(PLAN.replace(*edit))
    with pytest.raises(ProbeSpecError, match=match) as e:
        lock_plan(plan, d)
    assert str(plan) in str(e.value) and not (d / "plan.lock.json").exists()
    assert main(["plan", "lock", str(plan), "--run", str(d)]) == 2
    err = capsys.readouterr().err
    assert str(plan) in err and "Traceback" not in err


def test_lock_checks_metrics_against_the_pilot_recipe(run, tmp_path):
    d, plan = run
    sft, tasks = tmp_path / "sft.jsonl", tmp_path / "x.jsonl"
    sft.write_text(json.dumps({"id": "s1", "prompt": "Q: 1 + 1? A:", "response": " 2"}) + "\n")
    tasks.write_text(json.dumps({"id": "t1", "kind": "k", "prompt": "Q: 2 + 2? A:", "response": " 4"}) + "\n")
    files = [f"data.train={sft}", f"transfer.tasks={tasks}", "transfer.heldout=null", "transfer.robustness=null",
             "eval.every=0"]
    plan.write_text(PLAN.replace("task_accuracy}", "sft_heldout_bpb}"))
    with pytest.raises(ProbeSpecError, match=r"'sft_heldout_bpb' is not produced by the transfer suite of .*parts: tasks\)"):
        lock_plan(plan, d, recipe=REPO / "recipes" / "pilot.yaml", recipe_overrides=files)
    plan.write_text(PLAN)
    # every data file of the recipe is read at lock (issue 24): a missing held-out file is named
    with pytest.raises(Exception, match=r"nope.jsonl: transfer.heldout file not found"):
        lock_plan(plan, d, recipe=REPO / "recipes" / "pilot.yaml",
                  recipe_overrides=[*files[:2], "transfer.robustness=null", f"transfer.heldout={tmp_path / 'nope.jsonl'}"])
    assert not (d / "plan.lock.json").exists()
    rec = lock_plan(plan, d, recipe=REPO / "recipes" / "pilot.yaml", recipe_overrides=[*files, "seeds=[0,1]"])
    # a recipe that trains 2 seeds; the plan asks for 3 by default
    assert rec["recipe"]["seeds"] == [0, 1] and any("min_sft_seeds = 3" in w for w in rec["warnings"])


def test_weak_proxy_null_is_refused_without_allow_weak(run, capsys):
    """k = 3 bases with 2 proxies + the aggregate: a perfect proxy reaches p = 1 - (5/6)^3 = 0.42 > 0.05."""
    d, plan = run
    plan.write_text(PLAN.replace("k: 5", "k: 3"))
    with pytest.raises(SelectionError, match=r"k = 3 shortlisted bases and 3 candidates.*p >= 0\.42.*smallest k that "
                                             r"could beat the null is 5.*--allow-weak"):
        lock_plan(plan, d)
    assert main(["plan", "lock", str(plan), "--run", str(d)]) == 2
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "smallest k that could beat the null is 5" in err
    rec = json.loads((d / "plan.lock.json").read_text())
    assert rec["proxy_null"]["allowed_weak"] and rec["proxy_null"]["smallest_k"] == 5


def test_shortlist_before_the_lock_or_with_another_plan_is_post_hoc(run, tmp_path):
    d, plan = run
    lock_plan(plan, d)
    res = shortlist(d, plan)
    assert not check_lock(d).post_hoc and json.loads(res.json_path.read_text())["post_hoc"] is False
    other = tmp_path / "other.yaml"
    other.write_text(PLAN.replace("k: 5", "k: 6"))   # any change to the shortlist part counts
    res = shortlist(d, other)
    assert json.loads(res.json_path.read_text())["post_hoc"] is True and any("POST-HOC" in n for n in res.notes)
    st = check_lock(d)
    assert st.post_hoc and "plan other than the locked one" in st.reasons[0]
    # a lock taken after the shortlist exists: POST-HOC too
    lock_plan(plan, d, force=True)
    st = check_lock(d)
    assert st.post_hoc and any("existed before the plan was locked" in r for r in st.reasons)


def test_lock_names_the_smallest_k_and_designs_that_can_work(run, capsys):
    """An unbeatable null names the smallest useful k and a design that fits the run (more
    bases, fewer proxies) or says that none does on this ladder; `plan lock` prints it."""
    d, plan = run
    plan.write_text(PLAN.replace("k: 5", "k: 3"))  # k = 3, 2 proxies, 6 candidate checkpoints
    with pytest.raises(SelectionError, match=r"smallest k that could beat the null is 5 \(the run has 6 candidate "
                                             r"checkpoints\)\. Designs that can work: k = 5 with these 2 proxies"):
        lock_plan(plan, d)
    four = PLAN.replace("k: 5", "k: 3\ncandidates: [10, 20, 30, 40]")
    plan.write_text(four)
    with pytest.raises(SelectionError, match=r"none on this ladder: the run has 4 candidate checkpoint\(s\), and even "
                                             r"2 proxies need k >= 5.*Score more checkpoints \(at least 5"):
        lock_plan(plan, d)
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 0
    err = capsys.readouterr().err
    assert "Designs that can work: none on this ladder" in err
    rec = json.loads((d / "plan.lock.json").read_text())
    assert rec["proxy_null"]["n_candidates"] == 4 and rec["proxy_null"]["max_proxies_at_k"] == 0
    plan.write_text(PLAN)  # k = 5
    assert main(["plan", "lock", str(plan), "--run", str(d), "--force"]) == 0
    out = capsys.readouterr().out
    assert "proxy null: k = 5 bases, 3 candidates looked at" in out and "can succeed" in out


def test_lock_refuses_data_windows_without_lineage_and_prints_step_strata(run, capsys):
    d, plan = run
    plan.write_text(PLAN + "stratify: data_windows\n")
    with pytest.raises(ProbeSpecError, match=r"stratify: data_windows needs data_lineage\.json"):
        lock_plan(plan, d, allow_weak=True)
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 2
    assert "by: steps, strata: 3" in capsys.readouterr().err and not (d / "plan.lock.json").exists()
    plan.write_text(PLAN + "stratify: {by: steps, strata: 3}\n")
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 0
    out = capsys.readouterr().out
    assert "stratum steps 10-20: checkpoint-10, checkpoint-20" in out and "stratum steps 50-60" in out
    rec = json.loads((d / "plan.lock.json").read_text())
    assert rec["strata"] == {"steps 10-20": ["checkpoint-10", "checkpoint-20"],
                             "steps 30-40": ["checkpoint-30", "checkpoint-40"],
                             "steps 50-60": ["checkpoint-50", "checkpoint-60"]}


def test_lock_refuses_window_ends_without_lineage(run, capsys):
    """``references: [window_ends]`` needs data_lineage.json: `plan lock` refuses before anything is
    written, naming the setting and what to do instead (never a pilot without the window ends)."""
    d, plan = run
    plan.write_text(PLAN + "references: [latest, window_ends]\n")
    with pytest.raises(ProbeSpecError, match=r"references: \[window_ends\] needs data_lineage\.json"):
        lock_plan(plan, d, allow_weak=True)
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 2
    err = capsys.readouterr().err
    assert "write it next to the checkpoint folders" in err and "drop window_ends from `references:`" in err
    assert not (d / "plan.lock.json").exists()
    plan.write_text(PLAN + "references: [latest]\n")
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 0


def test_lock_records_the_window_ends_and_the_shortlist_notes_a_lineage_changed_after_it(tmp_path, capsys):
    """The lock fixes the bases window_ends will pilot (recorded and printed, a window without a candidate
    included); a lineage edited after the lock changes them, and the shortlist says so."""
    ladder = tmp_path / "ladder"
    ladder.mkdir()
    d = make_score_run(tmp_path / "run", ladder=str(ladder))
    windows = [{"name": "A", "start_step": 0, "end_step": 20}, {"name": "B", "start_step": 20, "end_step": 45},
               {"name": "C", "start_step": 45, "end_step": 60}, {"name": "D", "start_step": 60, "end_step": 90}]
    atomic_write_json(ladder / "data_lineage.json", {"windows": windows})
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("k: 5", "k: 2") + "references: [window_ends]\n")
    assert main(["plan", "lock", str(plan), "--run", str(d), "--allow-weak"]) == 0
    out = capsys.readouterr().out
    assert "reference window_end:B: checkpoint-40" in out and "reference window_end:D: (no candidate in this window)" in out
    ends = {"window_end:A": "checkpoint-20", "window_end:B": "checkpoint-40", "window_end:C": "checkpoint-60",
            "window_end:D": None}
    assert json.loads((d / "plan.lock.json").read_text())["window_ends"] == ends
    res = shortlist(d, plan)
    assert {c for c, r in res.table.set_index("checkpoint")["reference"].items() if r} == {
        "checkpoint-20", "checkpoint-40", "checkpoint-60"}
    assert any("no candidate checkpoint in data window(s) D; nothing piloted for them" in n for n in res.notes)
    assert not any("differs from the window ends recorded" in n for n in res.notes)
    windows[1]["end_step"] = 30   # the lineage edited after the lock: B now ends at 30
    windows[2]["start_step"] = 30
    atomic_write_json(ladder / "data_lineage.json", {"windows": windows})
    res = shortlist(d, plan)
    assert res.table.set_index("checkpoint").loc["checkpoint-30", "reference"] == "window_end:B"
    assert any("differs from the window ends recorded at the plan lock" in n and "changed after the lock" in n
               for n in res.notes)


def test_the_late_harm_demo_plan_is_the_declared_window_ends_plan():
    """recipes/selection-late-harm.yaml (the demo's plan) holds exactly the settings of the plan declared and
    measured as bench/plans/selection_late_harm_window_ends.yaml (fresh seeds 140-149, issue 23), so those
    records measure the demo's plan; the declared file itself stays as it ran."""
    from probeselect._yaml import load_yaml

    demo = load_yaml(REPO / "recipes" / "selection-late-harm.yaml")
    cand = load_yaml(REPO / "bench" / "plans" / "selection_late_harm_window_ends.yaml")
    assert demo["k"] == 3 and demo["references"] == ["latest", "lowest_bpb", "window_ends"]
    assert demo == cand
