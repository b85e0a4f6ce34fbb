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
