"""Confirmation: the top N pilot bases are retrained (run_pilot monkeypatched), ranked with the
same plan; Kendall tau, every reversal named, whether the decision held."""

import json

import pytest
from _selection_fakes import PLAN, make_score_run, write_fake_pilot

import probeselect.confirm as confirm_mod
from probeselect.cli import main
from probeselect.confirm import compare_rankings, confirm
from probeselect.errors import SelectionError
from probeselect.plan import lock_plan
from probeselect.select import select
from probeselect.shortlist import shortlist

NAMES = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]


@pytest.fixture
def selected(tmp_path):
    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    write_fake_pilot(d / "pilot", {b: {"task_accuracy": a, "termination": 0.9} for b, a in zip(NAMES, (0.9, 0.6, 0.3))})
    select(d)
    return d


def _fake_pilot(truth, calls):
    def run_pilot(bases, recipe, out_dir, *, progress=True, device="auto", overrides=()):
        calls.append({"bases": [str(b) for b in bases], "recipe": str(recipe), "out": str(out_dir),
                      "overrides": list(overrides)})
        names = [b.name for b in bases]
        write_fake_pilot(out_dir, {n: truth[n] for n in names}, seeds=(0, 1, 2), rng_seed=1)
    return lambda: run_pilot


def test_decision_held(selected, monkeypatch):
    calls = []
    truth = {"checkpoint-40": {"task_accuracy": 0.95, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.5, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, calls))
    res = confirm(selected, "recipes/confirm.yaml", top=2, overrides=["budget.optimizer_steps=80"])
    assert calls == [{"bases": ["/ladder/checkpoint-40", "/ladder/checkpoint-60"], "recipe": "recipes/confirm.yaml",
                      "out": str(selected / "confirm"), "overrides": ["budget.optimizer_steps=80"]}]
    assert res.held is True and res.kendall_tau == pytest.approx(1.0) and res.reversals == []
    assert "held" in res.statement and "did NOT" not in res.statement
    js = json.loads((selected / "confirm.json").read_text())
    assert js["held"] is True and js["bases"] == ["checkpoint-40", "checkpoint-60"]
    assert js["confirm_decision"]["seeds"] == [0, 1, 2]


def test_reversal_is_named_and_decision_did_not_hold(selected, monkeypatch):
    truth = {"checkpoint-40": {"task_accuracy": 0.2, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.9, "termination": 0.9},
             "checkpoint-50": {"task_accuracy": 0.55, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, []))
    res = confirm(selected, "recipes/confirm.yaml", top=3)
    assert res.held is False and res.ranking.top == "checkpoint-60"
    pairs = {(r["pilot_ahead"], r["confirm_ahead"]) for r in res.reversals}
    assert pairs == {("checkpoint-40", "checkpoint-60"), ("checkpoint-40", "checkpoint-50")}
    assert res.kendall_tau == pytest.approx(-1 / 3)
    assert "did NOT hold" in res.statement and "checkpoint-40 was ahead of checkpoint-60" in res.statement
    from probeselect.report import write_report

    md = write_report(selected).md.read_text()
    top = md[md.index("## Decision"):md.index("## Pilot transfer")]
    # the pilot's winner lost its place at confirmation: "not confirmed" in the headline and the confirmation line
    assert top.count("**Pilot pick `checkpoint-40` not confirmed**") == 1 and "Recommended base" not in top
    assert "**Confirmation does not confirm `checkpoint-40`**" in top and "Confirmation held" not in top
    conf = md[md.index("## Confirmation"):md.index("## Probe evidence summary")]
    assert "Reversal: `checkpoint-40` ahead of `checkpoint-60`" in conf


def test_compare_rankings_lower_is_better():
    tau, rev = compare_rankings({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 3.0, "c": 2.0}, "lower")
    assert tau == pytest.approx(1 / 3) and [(r["pilot_ahead"], r["confirm_ahead"]) for r in rev] == [("b", "c")]


def test_confirm_needs_a_selection(tmp_path):
    with pytest.raises(SelectionError, match="run `probeselect select"):
        confirm(tmp_path, "recipes/confirm.yaml")


def test_cli_confirm(selected, monkeypatch, capsys):
    truth = {b: {"task_accuracy": a, "termination": 0.9} for b, a in zip(NAMES, (0.9, 0.5, 0.1))}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, []))
    assert main(["confirm", str(selected), "--recipe", "recipes/confirm.yaml", "--top", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "The pilot decision held" in out and "Kendall tau" in out


def test_references_retrain_the_naive_choices_and_the_report_sets_them_against_the_top(tmp_path, monkeypatch):
    """``references``: the latest checkpoint (piloted, 2nd) and the lowest-bpb one (never piloted) are
    retrained next to the top 1 under the same recipe, ranked with it; confirm.json says which base
    stands for which rule and how far the confirmation's top is ahead of each; the report's naive
    bullet carries the confirmation-budget numbers."""
    from _selection_fakes import make_selected_run

    from probeselect.report import write_report

    d = make_selected_run(tmp_path)
    calls = []
    truth = {"checkpoint-40": {"task_accuracy": 0.9, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.5, "termination": 0.9},
             "checkpoint-30": {"task_accuracy": 0.2, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, calls))
    res = confirm(d, "recipes/confirm.yaml", top=1, references=["latest", "lowest_bpb"])
    assert [p.rsplit("/", 1)[-1] for p in calls[0]["bases"]] == ["checkpoint-40", "checkpoint-60", "checkpoint-30"]
    js = json.loads((d / "confirm.json").read_text())
    assert js["bases"] == ["checkpoint-40", "checkpoint-60", "checkpoint-30"]
    assert js["references"] == {"latest": "checkpoint-60", "lowest_bpb": "checkpoint-30"}
    assert js["config"]["references"] == ["latest", "lowest_bpb"]
    naive = {n["base"]: n for n in js["naive"]}
    assert set(naive) == {"checkpoint-60", "checkpoint-30"} and res.ranking.top == "checkpoint-40"
    table = {r["base"]: r for r in js["confirm_table"]}
    for b in naive:  # the naive rows are the confirmation table's own numbers
        assert naive[b]["value"] == table[b]["value"] and naive[b]["diff_vs_top"] == table[b]["diff_vs_top"]
        assert naive[b]["diff_vs_top"] > 0 and naive[b]["diff_vs_top_lo"] < naive[b]["diff_vs_top"]
    assert naive["checkpoint-30"]["diff_vs_top"] > naive["checkpoint-60"]["diff_vs_top"]
    # the never-piloted reference has no pilot value: Kendall tau is over the piloted bases only
    assert set(js["pilot_values"]) == {"checkpoint-40", "checkpoint-60"} and res.kendall_tau == pytest.approx(1.0)
    assert "The naive choice checkpoint-60 (the latest checkpoint): checkpoint-40 is ahead of it by" in res.statement
    assert res.held is True  # the pilot's winner checkpoint-40 is still the best with the naive choices beside it
    md = write_report(d).md.read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("- **Against the naive choices**"))
    assert ("`checkpoint-60` (the latest checkpoint) has task_accuracy" in line
            and "`checkpoint-30` (the lowest pretraining held-out bits per byte) was not piloted; at the confirmation "
                "budget it has" in line)
    assert line.count("the confirmation's top `checkpoint-40` is ahead of it by") == 2
    assert line.count("(95% interval") == 6 and "not ruled out" not in line  # far apart: every interval above 0
    assert "did not retrain" not in line


def test_a_naive_choice_that_wins_at_confirmation_is_named(tmp_path, monkeypatch):
    """The latest checkpoint, behind in the pilot, comes first at the confirmation budget: the pick
    is not confirmed, and the statement and the report say the naive choice is the best base there."""
    from _selection_fakes import make_selected_run

    from probeselect.report import write_report

    d = make_selected_run(tmp_path)
    truth = {"checkpoint-40": {"task_accuracy": 0.3, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.95, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, []))
    res = confirm(d, "recipes/confirm.yaml", top=1, references=["latest"])
    assert res.ranking.top == "checkpoint-60" and res.held is False
    assert "The naive choice checkpoint-60 (the latest checkpoint) is the best base at the confirmation budget" \
        in res.statement
    line = next(ln for ln in write_report(d).md.read_text().splitlines()
                if ln.startswith("- **Against the naive choices**"))
    assert "the best of the confirmed bases" in line
    # lowest_bpb was not asked for: the report says it was not retrained and how to retrain it
    assert "the confirmation did not retrain `checkpoint-30`" in line and "--references latest lowest_bpb" in line


def test_a_reference_among_the_top_n_is_not_retrained_twice(tmp_path, monkeypatch):
    from _selection_fakes import make_selected_run

    d = make_selected_run(tmp_path)
    calls = []
    truth = {b: {"task_accuracy": a, "termination": 0.9} for b, a in (("checkpoint-40", 0.9), ("checkpoint-60", 0.5))}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, calls))
    res = confirm(d, "recipes/confirm.yaml", top=2, references=["latest"])
    assert [p.rsplit("/", 1)[-1] for p in calls[0]["bases"]] == ["checkpoint-40", "checkpoint-60"]
    js = json.loads((d / "confirm.json").read_text())
    assert js["references"] == {"latest": "checkpoint-60"} and [n["base"] for n in js["naive"]] == ["checkpoint-60"]
    assert any("checkpoint-60 is among the top 2 already" in n for n in js["notes"])
    assert res.kendall_tau == pytest.approx(1.0)


@pytest.mark.parametrize("refs", [["newest"], ["latest", "latest"]])
def test_unknown_or_repeated_references_are_refused_before_training(selected, monkeypatch, refs):
    calls = []
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot({}, calls))
    with pytest.raises(SelectionError, match="distinct naive choices from \\['latest', 'lowest_bpb'\\]"):
        confirm(selected, "recipes/confirm.yaml", references=refs)
    assert calls == [] and not (selected / "confirm.json").exists()


def test_cli_confirm_references(tmp_path, monkeypatch, capsys):
    from _selection_fakes import make_selected_run

    from probeselect._select_cli import CONFIRM_REFERENCES
    from probeselect.plan import REFERENCES

    assert CONFIRM_REFERENCES == REFERENCES
    d = make_selected_run(tmp_path)
    calls = []
    truth = {b: {"task_accuracy": a, "termination": 0.9}
             for b, a in (("checkpoint-40", 0.9), ("checkpoint-60", 0.5), ("checkpoint-30", 0.4))}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, calls))
    assert main(["confirm", str(d), "--recipe", "recipes/confirm.yaml", "--top", "1", "--references", "lowest_bpb",
                 "--no-progress"]) == 0
    assert [p.rsplit("/", 1)[-1] for p in calls[0]["bases"]] == ["checkpoint-40", "checkpoint-30"]
    assert "The naive choice checkpoint-30 (the lowest held-out bpb)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["confirm", str(d), "--recipe", "recipes/confirm.yaml", "--references", "newest"])


def test_references_with_one_confirmation_seed_have_no_interval_and_do_not_crash(tmp_path, monkeypatch):
    """One SFT seed at confirmation: the lead over a naive choice has no interval (NaN bounds become
    None in confirm.json); the statement says so instead of failing after the training."""
    from _selection_fakes import make_selected_run

    from probeselect.report import write_report

    d = make_selected_run(tmp_path)
    truth = {"checkpoint-40": {"task_accuracy": 0.9, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.4, "termination": 0.9}}

    def run_pilot(bases, recipe, out_dir, *, progress=True, device="auto", overrides=()):
        write_fake_pilot(out_dir, {b.name: truth[b.name] for b in bases}, seeds=(0,), rng_seed=1)

    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: run_pilot)
    res = confirm(d, "recipes/confirm.yaml", top=1, references=["latest"])
    n = json.loads((d / "confirm.json").read_text())["naive"][0]
    assert n["base"] == "checkpoint-60" and n["diff_vs_top"] > 0 and n["diff_vs_top_lo"] is None
    assert "checkpoint-40 is ahead of it by" in res.statement and "(no interval: one SFT seed)" in res.statement
    md = write_report(d).md.read_text()
    assert "top 1 pilot bases, plus `checkpoint-60` (the latest checkpoint, a naive choice)." in md  # beyond the top 1
    assert "Kendall tau between pilot and confirmation rankings of 2 bases" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("- **Against the naive choices**"))
    assert "the confirmation's top `checkpoint-40` is ahead of it by" in line and "(no interval: one SFT seed)" in line


def test_a_naive_choice_close_to_the_top_is_not_ruled_out(tmp_path, monkeypatch):
    from _selection_fakes import make_selected_run

    from probeselect.report import write_report

    d = make_selected_run(tmp_path)
    truth = {"checkpoint-40": {"task_accuracy": 0.52, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.5, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, []))
    confirm(d, "recipes/confirm.yaml", top=1, references=["latest"])
    n = json.loads((d / "confirm.json").read_text())["naive"][0]
    assert n["diff_vs_top_lo"] < 0 < n["diff_vs_top_hi"]
    line = next(ln for ln in write_report(d).md.read_text().splitlines()
                if ln.startswith("- **Against the naive choices**"))
    assert "it reaches below 0, so the naive choice is not ruled out" in line


def test_a_plan_against_the_latest_retrains_it_and_confirms_beats_default(tmp_path, monkeypatch):
    """``selection.decision.against: latest``: the pilot names checkpoint-40 better than the latest
    (checkpoint-50 equivalent to it); the confirmation retrains the latest although no reference was
    asked for, confirms the claim there, and the report's headline says what was shown."""
    from _selection_fakes import PLAN, make_score_run

    from probeselect.report import write_report

    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}", "decision: {tie_margin: 0.02, against: latest}"))
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    truth = {"checkpoint-40": {"task_accuracy": 0.86, "termination": 0.9},
             "checkpoint-50": {"task_accuracy": 0.85, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.45, "termination": 0.9}}
    write_fake_pilot(d / "pilot", truth, n_items=3000)
    sel = select(d).ranking
    assert sel.verdict == "beats_default" and sel.default == "checkpoint-60"
    calls = []
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn",
                        lambda: lambda bases, recipe, out_dir, **kw: (
                            calls.append([b.name for b in bases]),
                            write_fake_pilot(out_dir, {b.name: truth[b.name] for b in bases}, n_items=3000,
                                             rng_seed=1))[-1])
    res = confirm(d, "recipes/confirm.yaml", top=1)
    assert calls == [[sel.top, "checkpoint-60"]]         # the latest retrained next to the top 1
    js = json.loads((d / "confirm.json").read_text())
    assert js["references"] == {"latest": "checkpoint-60"}
    assert any("decides against the latest" in n for n in js["notes"])
    assert res.ranking.default == "checkpoint-60" and res.held is True
    assert res.ranking.verdict == "winner"                # two bases: beating the default is beating every other
    md = write_report(d).md.read_text()
    assert f"**Recommended base: `{sel.top}`**" in md and "beats the default `checkpoint-60` (latest)" in md
    assert "against the default `checkpoint-60` (latest, the plan's `decision.against`): difference" in md


def test_confirm_spec_retests_only_a_claim_the_pilot_made():
    """``confirm_margin`` applies to a comparison the pilot claimed (winner or beats_default); without one
    (no clear winner, or a single eligible base: no comparison) the confirmation decides under the pilot's own
    margin, and a plan without the key is used as it is."""
    from probeselect.plan import SelectionSpec

    spec = SelectionSpec(tie_margin=0.02, against="latest", confirm_margin=0.0)
    notes = []
    assert confirm_mod.confirm_spec(spec, {"verdict": "no_clear_winner", "recommended": None}, notes) is spec
    assert confirm_mod.confirm_spec(spec, {"verdict": "single_eligible", "recommended": "checkpoint-40"},
                                    notes) is spec and notes == []
    plain = SelectionSpec(tie_margin=0.02)
    assert confirm_mod.confirm_spec(plain, {"verdict": "winner", "recommended": "checkpoint-40"}, notes) is plain
    assert notes == []
    for verdict in ("winner", "beats_default"):
        notes = []
        got = confirm_mod.confirm_spec(spec, {"verdict": verdict, "recommended": "checkpoint-40"}, notes)
        assert got.tie_margin == 0.0 and got.against == "latest" and spec.tie_margin == 0.02
        assert len(notes) == 1 and "confirm_margin 0" in notes[0] and "checkpoint-40" in notes[0]


def test_seed_overlap_names_the_shared_seeds_and_suggests_fresh_ones():
    notes = []
    assert confirm_mod.seed_overlap([0, 1, 2], [6, 7, 8], notes) == [] and notes == []
    assert confirm_mod.seed_overlap([0, 1, 2], [2, 3, 4], notes) == [2]
    assert "reuses the pilot's SFT seeds [2]" in notes[0] and "not an independent replication" in notes[0]
    assert "seeds=[5, 6, 7]" in notes[0]                 # past every seed either stage used
    assert confirm_mod.seed_overlap(None, [0], []) == []   # an old selection.json without seeds


def test_decision_held_with_the_pilot_seeds_says_it_is_no_independent_replication(selected, monkeypatch):
    truth = {"checkpoint-40": {"task_accuracy": 0.95, "termination": 0.9},
             "checkpoint-60": {"task_accuracy": 0.5, "termination": 0.9}}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", _fake_pilot(truth, []))
    confirm(selected, "recipes/confirm.yaml", top=2)
    js = json.loads((selected / "confirm.json").read_text())
    assert js["seeds_shared_with_pilot"] == [0, 1, 2]
    assert any("not an independent replication" in n for n in js["notes"])


def _claim_against_latest(tmp_path, monkeypatch, later):
    """A run whose pilot (6 seeds) shows checkpoint-40 better than the latest (checkpoint-60) under a plan with
    ``against: latest, confirm_margin: 0``; the confirmation (seeds 6-11) draws from ``later``. Returns
    (run dir, plan path, the pilot ranking)."""
    from _selection_fakes import PLAN, make_score_run

    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}",
                                 "decision: {tie_margin: 0.02, against: latest, confirm_margin: 0}"))
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    write_fake_pilot(d / "pilot", {"checkpoint-40": {"task_accuracy": 0.86, "termination": 0.9},
                                   "checkpoint-50": {"task_accuracy": 0.85, "termination": 0.9},
                                   "checkpoint-60": {"task_accuracy": 0.45, "termination": 0.9}},
                     n_items=3000, seeds=range(6))
    sel = select(d).ranking
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn",
                        lambda: lambda bases, recipe, out_dir, **kw: write_fake_pilot(
                            out_dir, {b.name: later[b.name] for b in bases}, n_items=3000, rng_seed=3,
                            seeds=range(6, 12)))
    return d, plan, sel


def test_confirm_margin_zero_holds_a_claim_that_shrank_but_did_not_reverse(tmp_path, monkeypatch):
    """The pilot shows checkpoint-40 better than the latest by more than the margin (0.02). At the
    confirmation (other SFT seeds) the gap shrank: its interval lies above 0 but not above 0.02. With
    ``confirm_margin: 0`` the claim holds, the record says with which margin, and the report says the claim was
    re-tested; under the pilot's own margin the same numbers give no clear winner."""
    from dataclasses import replace

    from probeselect.plan import load_selection_plan
    from probeselect.report import write_report
    from probeselect.select import load_pilot_tables, rank_bases

    d, plan, sel = _claim_against_latest(tmp_path, monkeypatch,
                                         {"checkpoint-40": {"task_accuracy": 0.86, "termination": 0.9},
                                          "checkpoint-60": {"task_accuracy": 0.835, "termination": 0.9}})
    assert sel.verdict == "beats_default" and sel.recommended == "checkpoint-40"
    res = confirm(d, "recipes/confirm.yaml", top=1)
    lo = res.ranking.default_ci[0]
    assert 0 < lo < 0.02                                   # the case: above 0, not above the pilot's margin
    assert res.held is True and res.ranking.verdict == "winner" and res.ranking.top == "checkpoint-40"
    js = json.loads((d / "confirm.json").read_text())
    assert js["confirm_decision"]["tie_margin"] == 0.0 and "seeds_shared_with_pilot" not in js
    assert any("confirm_margin 0" in n for n in js["notes"]) and "re-tested with margin 0" in js["statement"]
    assert js["retest_margin"] == 0.0
    spec = load_selection_plan(plan).selection
    plain = rank_bases(load_pilot_tables(d / "confirm"), replace(spec, confirm_margin=None),
                       bases=["checkpoint-40", "checkpoint-60"], default="checkpoint-60")
    assert plain.verdict == "no_clear_winner" and plain.default_ci[0] == pytest.approx(lo)
    md = write_report(d).md.read_text()
    assert "tie margin 0, not the pilot's 0.02" in md
    # every line that says "confirmed" says with which margin (front page, headline, confirmation bullet, section)
    assert "confirmed at the intended budget (re-tested with margin 0, the plan's confirm_margin: the claim did not " \
           "reverse" in md
    assert md.count("re-tested with margin 0, the plan's confirm_margin") == 4


def test_confirm_margin_zero_still_refuses_a_claim_that_reversed(tmp_path, monkeypatch):
    """Margin 0 is no free pass: the pilot's claim (checkpoint-40 better than the latest) reverses at the
    confirmation budget (the latest ahead), the decision does not hold, and no line says "confirmed"."""
    from probeselect.report import write_report

    d, _, sel = _claim_against_latest(tmp_path, monkeypatch,
                                      {"checkpoint-40": {"task_accuracy": 0.80, "termination": 0.9},
                                       "checkpoint-60": {"task_accuracy": 0.88, "termination": 0.9}})
    assert sel.recommended == "checkpoint-40"
    res = confirm(d, "recipes/confirm.yaml", top=1)
    assert res.held is False and res.ranking.top == "checkpoint-60"
    md = write_report(d).md.read_text()
    assert "Pilot pick `checkpoint-40` not confirmed" in md and "re-tested with margin" not in md


@pytest.mark.parametrize("later, status, recommended", [
    # the top moves to the pilot's equivalent candidate, which the confirmation calls a clear winner
    ({"checkpoint-40": 0.86, "checkpoint-50": 0.90, "checkpoint-60": 0.80}, "default_beaten", "checkpoint-50"),
    # the pick stays on top, but with three bases the (Bonferroni) interval against the default reaches below 0:
    # no verdict; the one pre-specified comparison clears 0, so the pick stands
    ({"checkpoint-40": 0.866, "checkpoint-50": 0.86, "checkpoint-60": 0.855}, "default_beaten", "checkpoint-40"),
    # the pick no longer beats the default (within 0 of it): nothing stands
    ({"checkpoint-40": 0.80, "checkpoint-50": 0.90, "checkpoint-60": 0.80}, "not_confirmed", None),
])
def test_a_beats_default_claim_is_retested_against_the_default(tmp_path, monkeypatch, later, status, recommended):
    """The pilot said "checkpoint-40 beats the latest, checkpoint-50 is equivalent". That claim is about the
    default, so the confirmation re-tests it against the default alone (one comparison, the plan's confirm_margin
    0), whatever the top does; the report then recommends a base other than the default."""
    from dataclasses import replace

    from probeselect.final_report import confirmation_status
    from probeselect.plan import load_selection_plan
    from probeselect.report import write_report
    from probeselect.select import load_pilot_tables, rank_bases

    d, plan, sel = _claim_against_latest(tmp_path, monkeypatch, {b: {"task_accuracy": a, "termination": 0.9}
                                                                  for b, a in later.items()})
    assert sel.verdict == "beats_default" and sel.recommended == "checkpoint-40"
    res = confirm(d, "recipes/confirm.yaml", top=2)
    js = json.loads((d / "confirm.json").read_text())
    c = js["claim_retest"]
    assert c["base"] == "checkpoint-40" and c["default"] == "checkpoint-60" and c["margin"] == 0.0
    # the pair's own interval (one comparison), not the full ranking's Bonferroni one
    pair = rank_bases(load_pilot_tables(d / "confirm"),
                      replace(load_selection_plan(plan).selection, tie_margin=0.0, against=None),
                      bases=["checkpoint-40", "checkpoint-60"])
    assert c["diff"] == pytest.approx(later["checkpoint-40"] - later["checkpoint-60"], abs=0.01)
    assert c["held"] is (status == "default_beaten")
    if pair.top == "checkpoint-40":
        assert c["diff_ci"] == pytest.approx(list(pair.diff_ci))
    if recommended == "checkpoint-40":   # the case's premise: the full ranking would not have said it
        assert res.ranking.top == "checkpoint-40" and res.ranking.verdict == "no_clear_winner"
        assert res.ranking.default_ci[0] < 0 < c["diff_ci"][0]
    assert ("The pilot's claim that checkpoint-40 beats the default checkpoint-60 "
            + ("held" if c["held"] else "did NOT hold")) in js["statement"]
    cs = confirmation_status(json.loads((d / "selection.json").read_text()), js)
    assert cs.status == status and cs.recommended == recommended
    md = write_report(d).md.read_text()
    if status == "default_beaten":
        assert f"**Recommended base: `{recommended}`**, not the default: the pilot's claim that `checkpoint-40` " \
               "beats the default `checkpoint-60` held at the intended budget" in md          # front page
        assert f"**Recommended base: `{recommended}`**, not the default. In the pilot `checkpoint-40`" in md
        assert "**Confirmation confirms the claim against the default**" in md
        assert "The confirmation confirms the pilot's claim against the default" in md     # section
        assert ("ahead of the pilot's pick by more than the plan's tie margin" in md) is (recommended != "checkpoint-40")
        assert "the claim did not reverse" in md                       # confirm_margin 0: not "cleared the margin"
        assert "not confirmed" not in md
    else:
        assert "Pilot pick `checkpoint-40` not confirmed" in md and "Recommended base" not in md


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_retest_against_default_orients_the_difference_and_flips_a_reversed_interval(tmp_path, direction):
    """The re-test's difference is "pick better than the default" in the metric's direction; when the default comes
    out ahead, the pair's interval (default - pick) is flipped; a default failing a constraint is said so."""
    from dataclasses import replace

    import pandas as pd

    from probeselect.confirm import retest_against_default
    from probeselect.plan import SelectionSpec, TransferConstraint
    from probeselect.select import PilotTables

    sign = 1.0 if direction == "higher" else -1.0
    pick = [0.80, 0.82, 0.79, 0.81, 0.80, 0.83]
    dflt = [0.70, 0.75, 0.72, 0.69, 0.74, 0.71]
    spec = SelectionSpec(tie_margin=0.02, min_sft_seeds=6, primary="task_accuracy", direction=direction)
    dec = {"verdict": "beats_default", "recommended": "P"}

    def tables(p, d):
        rows = [dict(base=b, seed=s, metric="task_accuracy", value=sign * v) for b, vs in (("P", p), ("D", d))
                for s, v in enumerate(vs)]
        return PilotTables(tmp_path, pd.DataFrame(rows), None, None)

    ahead = retest_against_default(tables(pick, dflt), spec, dec, "D", ["P", "D"], range(6))
    import numpy as np
    from scipy.stats import t as student_t

    d = np.subtract(pick, dflt)
    half = student_t.ppf(0.975, 5) * d.std(ddof=1) / np.sqrt(6)           # one comparison: no Bonferroni
    assert ahead["held"] is True and ahead["diff"] == pytest.approx(d.mean())
    assert ahead["diff_ci"] == pytest.approx([d.mean() - half, d.mean() + half])
    behind = retest_against_default(tables(dflt, pick), spec, dec, "D", ["P", "D"], range(6))
    assert behind["held"] is False and behind["diff"] == pytest.approx(-d.mean())
    assert behind["diff_ci"] == pytest.approx([-d.mean() - half, -d.mean() + half])     # flipped: below 0
    # fewer seeds than the ranking's: only the ranking's seeds are compared, and the pair's notes are kept
    few = retest_against_default(tables(pick, dflt), spec, dec, "D", ["P", "D"], range(3))
    assert few["seeds"] == [0, 1, 2] and few["held"] is False and any("min_sft_seeds" in n for n in few["notes"])
    # the default fails a constraint the pick passes: held although the default scores higher, and said so
    spec_c = replace(spec, constraints=(TransferConstraint("termination", min=0.5),))
    tabs = tables(dflt, pick)
    tabs.transfer = pd.concat([tabs.transfer, pd.DataFrame(
        [dict(base=b, seed=s, metric="termination", value=t) for b, t in (("P", 0.9), ("D", 0.3)) for s in range(6)])])
    gate = retest_against_default(tabs, spec_c, dec, "D", ["P", "D"], range(6))
    assert gate["held"] is True and gate["default_fails_constraint"] is True and gate["diff"] < 0
    assert "the default fails a selection constraint" in confirm_mod._claim_words(gate)
    assert retest_against_default(tables(pick, dflt), spec, {"verdict": "winner", "recommended": "P"}, "D",
                                  ["P", "D"], range(6)) is None           # only a beats_default claim is re-tested
