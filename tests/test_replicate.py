"""Replication of a claim only the confirmation made (run_pilot monkeypatched): it trains only when the pipeline
needs it, on fresh seeds, with the confirmation's recipe; a held replication becomes the report's recommendation,
one that fails is said so; stale or bad input is refused."""

import json
import shutil

import pytest
from _selection_fakes import PLAN, make_score_run, write_fake_pilot

import probeselect.confirm as confirm_mod
from probeselect.cli import main
from probeselect.confirm import confirm
from probeselect.errors import SelectionError
from probeselect.final_report import confirmation_status
from probeselect.plan import lock_plan
from probeselect.final_report import attach_replication
from probeselect.replicate import fresh_seeds, replicate, replication_claim
from probeselect.report import write_report
from probeselect.select import select
from probeselect.shortlist import shortlist

A = "task_accuracy"


def _truth(vals):
    return {b: {A: a, "termination": 0.9} for b, a in vals.items()}


def _run(tmp_path, monkeypatch, pilot, confirmation, *, against=False, plan_extra="", conf_seeds=(3, 4, 5)):
    """A run whose pilot (seeds 0-2) draws from ``pilot`` and whose confirmation (``conf_seeds``, top 3) from
    ``confirmation``; the confirmation recipe is a copy under tmp_path; ``plan_extra``: lines appended to the
    plan's selection block. Returns (run dir, recipe, calls)."""
    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    dec = "decision: {tie_margin: 0.02, against: latest}" if against else "decision: {tie_margin: 0.02}"
    plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}", dec) + plan_extra)
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    write_fake_pilot(d / "pilot", _truth(pilot), n_items=3000)
    select(d)
    recipe = tmp_path / "confirm.yaml"
    shutil.copy("recipes/confirm.yaml", recipe)
    calls = []
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn",
                        lambda: lambda bases, recipe, out_dir, **kw: write_fake_pilot(
                            out_dir, {b.name: _truth(confirmation)[b.name] for b in bases}, n_items=3000,
                            rng_seed=1, seeds=conf_seeds))
    confirm(d, recipe, top=3)
    return d, recipe, calls


def _replication_data(monkeypatch, vals, calls):
    def run_pilot(bases, recipe, out_dir, *, overrides=(), **kw):
        calls.append({"bases": [b.name for b in bases], "recipe": str(recipe), "overrides": list(overrides)})
        seeds = json.loads(overrides[-1].split("=", 1)[1])
        write_fake_pilot(out_dir, {b.name: _truth(vals)[b.name] for b in bases}, n_items=3000, rng_seed=2,
                         seeds=seeds)
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: run_pilot)


PILOT_TIE = {"checkpoint-40": 0.70, "checkpoint-60": 0.70, "checkpoint-50": 0.70}
CONF_WINNER = {"checkpoint-40": 0.60, "checkpoint-60": 0.60, "checkpoint-50": 0.90}


def _sel(d):
    return json.loads((d / "selection.json").read_text())


def _conf(d):
    return attach_replication(d, json.loads((d / "confirm.json").read_text()))


def test_a_winner_found_only_at_the_confirmation_is_replicated_and_recommended(tmp_path, monkeypatch):
    d, recipe, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    sel, conf = _sel(d), _conf(d)
    assert sel["decision"]["verdict"] == "no_clear_winner"           # the premise: the pilot made no claim
    assert conf["confirm_decision"]["verdict"] == "winner" and conf["confirm_decision"]["top"] == "checkpoint-50"
    assert replication_claim(sel, conf) == {"base": "checkpoint-50", "verdict": "winner", "default": None}
    assert confirmation_status(sel, conf).status == "nothing_to_confirm"
    _replication_data(monkeypatch, CONF_WINNER, calls)
    res = replicate(d)
    assert sorted(conf["bases"]) == ["checkpoint-40", "checkpoint-50", "checkpoint-60"]
    # every confirmed base, the confirmation's recipe and overrides, fresh seeds after 0-5 (as many as it had)
    assert calls == [{"bases": conf["bases"], "recipe": str(recipe),
                      "overrides": ["seeds=[6, 7, 8]"]}]
    assert json.loads((d / "replicate.json").read_text())["out_dir"] == str(d / "replicate" / "seeds-6-7-8")
    js = json.loads((d / "replicate.json").read_text())
    assert res.held is True and js["held"] is True and js["needed"] is True and js["seeds"] == [6, 7, 8]
    assert js["decision"]["top"] == "checkpoint-50" and js["decision"]["verdict"] == "winner"
    assert js["decision"]["seeds"] == [6, 7, 8] and js["claim"]["base"] == "checkpoint-50"
    assert "held on fresh SFT seeds [6, 7, 8]" in js["statement"]
    cs = confirmation_status(sel, _conf(d))
    assert cs.status == "replicated" and cs.recommended == "checkpoint-50"
    md = write_report(d).md.read_text()
    assert "**Recommended base: `checkpoint-50`**: a claim of the confirmation at the intended budget (a clear " \
           "winner), not of the pilot, replicated on fresh SFT seeds." in md                  # front page
    assert "**Recommended base: `checkpoint-50`**. The pilot named no winner" in md         # decision headline
    assert "**Confirmation's own claim replicated**" in md
    assert "a claim of its own (the pilot did not make it). The confirmation's own claim (checkpoint-50 is a clear " \
           "winner) held on fresh SFT seeds [6, 7, 8]" in md                                   # section
    assert "**How sure (the pilot)**" in md
    assert "checkpoint-50 - checkpoint-" in js["statement"] and "Bonferroni over 2 comparisons" in js["statement"]
    assert "not replicated" not in md and "unreplicated" not in md


def test_a_claim_that_fails_on_fresh_seeds_stands_nowhere(tmp_path, monkeypatch):
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    _replication_data(monkeypatch, {"checkpoint-40": 0.80, "checkpoint-60": 0.60, "checkpoint-50": 0.80}, calls)
    res = replicate(d)
    assert res.held is False
    cs = confirmation_status(_sel(d), _conf(d))
    assert cs.status == "nothing_to_confirm" and cs.recommended is None
    md = write_report(d).md.read_text()
    assert "Recommended base" not in md
    assert md.count("The confirmation's own claim (checkpoint-50 is a clear winner) did NOT hold on fresh SFT "
                    "seeds [6, 7, 8]") == 3                # decision headline, confirmation bullet, section


def test_nothing_is_trained_when_the_pilot_decision_was_confirmed(tmp_path, monkeypatch):
    won = {"checkpoint-40": 0.90, "checkpoint-60": 0.60, "checkpoint-50": 0.60}
    d, _, calls = _run(tmp_path, monkeypatch, won, won)
    assert confirmation_status(_sel(d), _conf(d)).status == "confirmed"
    _replication_data(monkeypatch, won, calls)
    res = replicate(d)
    assert calls == [] and res.needed is False and res.held is None
    js = json.loads((d / "replicate.json").read_text())
    assert js["needed"] is False and "nothing trained" in js["reason"] and not (d / "replicate").exists()
    md = write_report(d).md.read_text()
    assert "**Recommended base: `checkpoint-40`**" in md and "Nothing to replicate" in md


def test_a_claim_against_the_default_is_replicated_on_the_pair_alone(tmp_path, monkeypatch):
    """Under ``against: latest`` the confirmation (not the pilot) finds checkpoint-40 better than the latest with
    checkpoint-50 equivalent: only the pair is retrained, and the one comparison decides."""
    conf_vals = {"checkpoint-40": 0.86, "checkpoint-50": 0.85, "checkpoint-60": 0.60}
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, conf_vals, against=True)
    conf = _conf(d)
    assert conf["confirm_decision"]["verdict"] == "beats_default"
    _replication_data(monkeypatch, conf_vals, calls)
    res = replicate(d, seeds=[20, 21, 22, 23])
    assert [c["bases"] for c in calls] == [["checkpoint-40", "checkpoint-60"]]
    assert calls[0]["overrides"][-1] == "seeds=[20, 21, 22, 23]"
    js = json.loads((d / "replicate.json").read_text())
    assert res.held is True and js["retest"]["default"] == "checkpoint-60"
    assert js["retest"]["diff"] == pytest.approx(0.26, abs=0.02) and js["retest"]["diff_ci"][0] > 0.2
    assert confirmation_status(_sel(d), _conf(d)).recommended == "checkpoint-40"


def test_bad_or_stale_input_is_refused_with_the_fix(tmp_path, monkeypatch):
    d, recipe, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    _replication_data(monkeypatch, CONF_WINNER, calls)
    with pytest.raises(SelectionError, match=r"must be distinct, non-negative and fresh.*used \[0, 1, 2, 3, 4, 5\]"):
        replicate(d, seeds=[5, 6])
    recipe.write_text(recipe.read_text() + "\n# edited\n")
    with pytest.raises(SelectionError, match="changed since .*confirm.json was written"):
        replicate(d)
    assert calls == []
    shutil.copy("recipes/confirm.yaml", recipe)
    replicate(d)
    conf = json.loads((d / "confirm.json").read_text())
    (d / "confirm.json").write_text(json.dumps({**conf, "notes": ["edited"]}))
    with pytest.raises(SelectionError, match="replicate.json: made from another confirm.json or selection.json"):
        attach_replication(d, json.loads((d / "confirm.json").read_text()), strict=True)
    md = write_report(d).md.read_text()               # the report leaves a stale replication out and says so
    assert "made from another confirm.json" in md and "Recommended base" not in md
    (d / "confirm.json").unlink()
    with pytest.raises(SelectionError, match="confirm.json: not found; run `probeselect confirm"):
        replicate(d)


def test_fresh_seeds_follow_every_used_seed(tmp_path):
    from probeselect.replicate import used_seeds

    assert fresh_seeds({0, 1, 2, 9}, 3) == [10, 11, 12] and fresh_seeds(set(), 2) == [0, 1]
    # seeds trained but left out of a decision (a failed run) and a confirmation written elsewhere count as used
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "transfer.csv").write_text("base,seed,metric,value\nb,0,m,1\nb,4,m,1\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "transfer.csv").write_text("base,seed,metric,value\nb,7,m,1\n")
    sel = {"decision": {"seeds": [0]}}
    conf = {"confirm_decision": {"seeds": [5]}, "config": {"out_dir": str(tmp_path / "elsewhere")}}
    assert used_seeds(tmp_path, sel, conf) == {0, 4, 5, 7}


def test_cli_replicate(tmp_path, monkeypatch, capsys):
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    _replication_data(monkeypatch, CONF_WINNER, calls)
    assert main(["replicate", str(d), "--seeds", "30", "31", "32", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "held on fresh SFT seeds [30, 31, 32]" in out and "replicate.json" in out


def test_after_a_confirmation_that_re_tested_the_pilot_with_confirm_margin_the_new_claim_needs_the_tie_margin(
        tmp_path, monkeypatch):
    """The pilot names checkpoint-40 a winner; the plan's confirm_margin 0 re-tests that, and at the confirmation
    checkpoint-50 is on top, a winner under margin 0 only. Its claim has never cleared the tie margin, so the
    replication asks for it (0.02), not for confirm_margin again."""
    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}", "decision: {tie_margin: 0.02, confirm_margin: 0}"))
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    write_fake_pilot(d / "pilot", _truth({"checkpoint-40": 0.90, "checkpoint-60": 0.60, "checkpoint-50": 0.60}),
                     n_items=3000)
    select(d)
    recipe = tmp_path / "confirm.yaml"
    shutil.copy("recipes/confirm.yaml", recipe)
    later = {"checkpoint-40": 0.80, "checkpoint-60": 0.60, "checkpoint-50": 0.90}
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: lambda bases, recipe, out_dir, **kw: write_fake_pilot(
        out_dir, {b.name: _truth(later)[b.name] for b in bases}, n_items=3000, rng_seed=1, seeds=(3, 4, 5)))
    confirm(d, recipe, top=3)
    conf = _conf(d)
    assert conf["retest_margin"] == 0.0 and conf["confirm_decision"]["top"] == "checkpoint-50"
    assert confirmation_status(_sel(d), conf).status == "not_confirmed"
    calls = []
    _replication_data(monkeypatch, later, calls)
    res = replicate(d)
    js = json.loads((d / "replicate.json").read_text())
    assert js["margin"] == 0.02 and js["decision"]["tie_margin"] == 0.02
    assert any("has not cleared the tie margin yet" in n for n in js["notes"])
    assert res.held is True and confirmation_status(_sel(d), _conf(d)).recommended == "checkpoint-50"
    md = write_report(d).md.read_text()
    assert "**Recommended base: `checkpoint-50`**. The pilot recommended `checkpoint-40`, which the confirmation did " \
           "not confirm" in md


def test_a_claim_against_the_default_that_fails_and_one_that_holds_are_worded(tmp_path, monkeypatch):
    conf_vals = {"checkpoint-40": 0.86, "checkpoint-50": 0.85, "checkpoint-60": 0.60}
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, conf_vals, against=True)
    _replication_data(monkeypatch, {"checkpoint-40": 0.70, "checkpoint-50": 0.85, "checkpoint-60": 0.71}, calls)
    assert replicate(d).held is False
    md = write_report(d).md.read_text()
    assert "The confirmation's own claim (checkpoint-40 beats the default checkpoint-60) did NOT hold" in md
    assert "Recommended base" not in md
    # a second attempt on other seeds that holds is recorded, but a claim that failed once is not replicated
    _replication_data(monkeypatch, conf_vals, calls)
    res = replicate(d, seeds=[40, 41, 42])
    js = json.loads((d / "replicate.json").read_text())
    assert res.held is True and [a["seeds"] for a in js["earlier_attempts"]] == [[6, 7, 8]]
    assert js["out_dir"].endswith("replicate/seeds-40-41-42") and (d / "replicate" / "seeds-6-7-8").is_dir()
    cs = confirmation_status(_sel(d), _conf(d))
    assert cs.status == "nothing_to_confirm" and cs.recommended is None
    assert "attempt 2; earlier attempts on other seeds: seeds [6, 7, 8]: did NOT hold; a claim that failed once is " \
           "not counted as replicated" in cs.replication_words()
    assert "Recommended base" not in write_report(d).md.read_text()


def test_a_held_claim_against_the_default_is_worded_so(tmp_path, monkeypatch):
    conf_vals = {"checkpoint-40": 0.86, "checkpoint-50": 0.85, "checkpoint-60": 0.60}
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, conf_vals, against=True)
    _replication_data(monkeypatch, conf_vals, calls)
    replicate(d)
    md = write_report(d).md.read_text()
    assert "**Recommended base: `checkpoint-40`**: a claim of the confirmation at the intended budget (better than " \
           "the default), not of the pilot, replicated on fresh SFT seeds." in md


def test_too_few_replication_seeds_are_refused_before_training(tmp_path, monkeypatch):
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    _replication_data(monkeypatch, CONF_WINNER, calls)
    with pytest.raises(SelectionError, match=r"2 seed\(s\), but the plan's selection.min_sft_seeds is 3"):
        replicate(d, seeds=[30, 31])
    assert calls == []


def test_a_pilot_with_too_few_seeds_does_not_make_a_replicated_recommendation_provisional(tmp_path, monkeypatch):
    """The plan asks for 4 SFT seeds; the pilot trained 3, the confirmation 4. The replication trains 4 (the plan's
    minimum), so its recommendation is not "provisional", and the seed warning names the pilot."""
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER, plan_extra="  min_sft_seeds: 4\n",
                       conf_seeds=(3, 4, 5, 6))
    _replication_data(monkeypatch, CONF_WINNER, calls)
    res = replicate(d)
    assert res.held is True and json.loads((d / "replicate.json").read_text())["seeds"] == [7, 8, 9, 10]
    md = write_report(d).md.read_text()
    assert "**Recommended base: `checkpoint-50`**: a claim of the confirmation" in md
    assert "**Recommended base: `checkpoint-50`**. The pilot named no winner" in md
    assert "**Too few SFT seeds in the pilot**: 3 of the 4" in md and "this decision rests on 3" not in md


def test_malformed_records_and_an_interrupted_replication(tmp_path, monkeypatch):
    """A corrupt confirm.json or replicate.json is named with the fix; a replication killed mid-training leaves no
    replicate.json (nothing that looks complete), and the rerun finishes it."""
    d, _, calls = _run(tmp_path, monkeypatch, PILOT_TIE, CONF_WINNER)
    good = (d / "confirm.json").read_text()
    (d / "confirm.json").write_text("{not json")
    with pytest.raises(SelectionError, match=r"confirm.json: not valid JSON .*probeselect confirm"):
        replicate(d)
    (d / "confirm.json").write_text(good)

    def killed(bases, recipe, out_dir, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: killed)
    with pytest.raises(KeyboardInterrupt):
        replicate(d)
    assert not (d / "replicate.json").exists()
    _replication_data(monkeypatch, CONF_WINNER, calls)
    assert replicate(d).held is True
    (d / "replicate.json").write_text("{broken")
    with pytest.raises(SelectionError, match=r"replicate.json: not valid JSON"):
        write_report(d)
