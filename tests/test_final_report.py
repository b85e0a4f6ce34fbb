"""The base-selection report's top lines: never contradictory, honest about seeds, flags,
confirmation runs and metric names. Fixtures are hand-written selection.json / confirm.json
files (the contract), so every contradictory case is built directly."""

import json
import re

import pandas as pd
import pytest
from _selection_fakes import lock_for, make_score_run

from probeselect._io import atomic_write_csv, atomic_write_json, sha256_file
from probeselect.final_report import confirmation_status, floor_ceiling, write_selection_report

BASES = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]


@pytest.fixture(autouse=True)
def _no_dynamics(monkeypatch):
    """These tests are about the decision lines: skip recomputing the probe dynamics and plots
    (tested in test_report.py / test_dynamics.py) to keep them fast."""
    import probeselect.final_report as fr
    from probeselect._probe_sections import ProbeSections
    from probeselect._report_blocks import Section

    def fake(run_dir, **_):
        man = json.loads((run_dir / "manifest.json").read_text())
        return ProbeSections(Section("Summary"), [], man)

    monkeypatch.setattr(fr, "probe_sections", fake)


def _selection(verdict="winner", top="checkpoint-40", runner_up="checkpoint-60", **extra):
    recommended = top if verdict in ("winner", "single_eligible") else None
    return {
        "status": "complete", "created_utc": "2026-01-01T00:00:00+00:00", "plan_path": "plan.yaml",
        "plan_sha256": "ab" * 32, "post_hoc": False, "lock": {"locked_utc": "2026-01-01T00:00:00+00:00"},
        "selection_plan": {"primary": {"metric": "task_logprob", "direction": "higher"},
                           "constraints": [{"metric": "termination", "min": 0.5}]},
        "decision": {"verdict": verdict, "recommended": recommended, "top": top, "runner_up": runner_up,
                     "diff": 0.4, "diff_ci": [0.1, 0.7], "tie_margin": 0.05, "level": 0.95, "seeds": [0, 1, 2],
                     "n_items": 50, **extra.pop("decision", {})},
        "bootstrap": {"replicates": 100, "seed": 0, "level": 0.95},
        "bases": [{"base": b, "position": i + 1, "eligible": True, "value": -1.0 - i, "ci_lo": -2.0 - i,
                   "ci_hi": -0.5 - i} for i, b in enumerate(BASES)],
        "proxy_validation": [], "null": None, "notes": [], "inputs": {}, **extra,
    }


def _confirm(top, verdict, held, sel_path):
    return {"bases": BASES[:2], "config": {"recipe": "recipes/confirm.yaml", "top": 2}, "primary": {"metric": "task_logprob"},
            "confirm_decision": {"top": top, "verdict": verdict, "runner_up": [b for b in BASES[:2] if b != top][0],
                                 "seeds": [0, 1, 2]},
            "held": held, "statement": "The pilot decision held: whatever confirm.py said.",
            "pilot_values": {b: -1.0 for b in BASES[:2]}, "confirm_values": {b: -1.0 for b in BASES[:2]},
            "confirm_table": [], "kendall_tau": 1.0, "reversals": [], "notes": [],
            "selection_sha256": sha256_file(sel_path), "created_utc": "2026-01-02T00:00:00+00:00"}


def _write(tmp_path, sel, conf_args=None, *, transfer=None, conf_diag=None):
    return _write_in(make_score_run(tmp_path / "run"), sel, conf_args, transfer=transfer, conf_diag=conf_diag)


def _write_in(d, sel, conf_args=None, *, transfer=None, conf_diag=None):
    if not sel.get("post_hoc"):
        sel = lock_for(d, sel)  # the report checks the lock and plan as they are now
    atomic_write_json(d / "selection.json", sel)
    if conf_args is not None:
        atomic_write_json(d / "confirm.json", _confirm(*conf_args, d / "selection.json"))
    if transfer is not None:
        atomic_write_csv(d / "pilot" / "transfer.csv", transfer)
    atomic_write_csv(d / "pilot" / "diagnostics.csv", pd.DataFrame(
        [dict(base=b, seed=s, clip_fraction=0.1, nonfinite=0, skipped=0, spikes=0, resumes=0) for b in BASES
         for s in (0, 1, 2)]))
    if conf_diag is not None:
        atomic_write_csv(d / "confirm" / "diagnostics.csv", conf_diag)
    md = write_selection_report(d).md.read_text()
    top = md[md.index("## Decision"):md.index("## Pilot transfer")]
    return md, [line[2:] for line in top.splitlines() if line.startswith("- ")]


def _no_contradiction(lines):
    text = "\n".join(lines)
    assert "not applicable" not in text
    assert not ("Recommended base" in text and "not confirmed" in text)
    assert not ("No clear winner" in text and re.search(r"Confirmation (held|confirms)", text))
    return text


def test_pilot_winner_confirmed(tmp_path):
    _, lines = _write(tmp_path, _selection(), ("checkpoint-40", "winner", True))
    text = _no_contradiction(lines)
    assert lines[0].startswith("**Recommended base: `checkpoint-40`**") and "confirmation" in lines[0]
    assert "**Confirmation confirms `checkpoint-40`**" in text


def test_pilot_winner_held_on_top_but_no_clear_winner_at_confirmation_is_not_confirmed(tmp_path):
    # confirm.json says held=True (the same base is on top), but the confirmation calls no winner
    _, lines = _write(tmp_path, _selection(), ("checkpoint-40", "no_clear_winner", True))
    text = _no_contradiction(lines)
    assert lines[0].startswith("**Pilot pick `checkpoint-40` not confirmed**")
    assert "still the best there but not a clear winner" in lines[0]
    assert "**Confirmation does not confirm `checkpoint-40`**" in text and "held" not in text.replace("held-out", "")


def test_pilot_winner_reversed_at_confirmation(tmp_path):
    _, lines = _write(tmp_path, _selection(), ("checkpoint-60", "winner", False))
    _no_contradiction(lines)
    assert lines[0].startswith("**Pilot pick `checkpoint-40` not confirmed**") and "`checkpoint-60` is best" in lines[0]


def test_no_clear_winner_in_the_pilot_is_never_followed_by_held(tmp_path):
    sel = _selection(verdict="no_clear_winner")
    for conf in (("checkpoint-40", "no_clear_winner", None), ("checkpoint-40", "winner", None)):
        _, lines = _write(tmp_path / conf[1], sel, conf)
        text = _no_contradiction(lines)
        assert lines[0].startswith("**No clear winner** between `checkpoint-40` and `checkpoint-60`")
        assert "**Confirmation** (the pilot named no winner, so there was no pick to confirm)" in text
    assert "new, unreplicated result" in text  # a winner only at confirmation is named as such


def test_fewer_sft_seeds_than_the_plan_requires_is_said(tmp_path):
    sel = _selection(decision={"n_sft_seeds": 2, "min_sft_seeds": 3, "seeds": [0, 1]})
    _, lines = _write(tmp_path / "a", sel)
    assert "(provisional: 2 of the 3 SFT seeds the plan requires)" in lines[0]
    assert any(x.startswith("**Too few SFT seeds**: this decision rests on 2 SFT seeds; the plan requires at least 3")
               for x in lines)
    # top-level keys are read too; an old run without the minimum says nothing about it
    _, lines = _write(tmp_path / "b", _selection(n_sft_seeds=2, min_sft_seeds=3))
    assert any(x.startswith("**Too few SFT seeds**") for x in lines)
    _, lines = _write(tmp_path / "c", _selection())
    assert not any("Too few" in x or "provisional" in x for x in lines)


def test_run_correctness_covers_the_confirmation_runs(tmp_path):
    conf_diag = pd.DataFrame([dict(base="checkpoint-40", seed=0, clip_fraction=0.3, nonfinite=0, skipped=0, spikes=3,
                                   resumes=0),
                              dict(base="checkpoint-60", seed=0, clip_fraction=0.5, nonfinite=1, skipped=0, spikes=0,
                                   resumes=0)])
    _, lines = _write(tmp_path, _selection(), ("checkpoint-40", "winner", True), conf_diag=conf_diag)
    rc = [x for x in lines if x.startswith("**Run correctness**")]
    assert len(rc) == 1
    assert "9 pilot runs: no nonfinite gradient events" in rc[0]
    assert "2 confirmation runs: 1 nonfinite gradient events (`checkpoint-60` seed 0: 1)" in rc[0]
    assert "3 loss spikes (`checkpoint-40` seed 0: 3)" in rc[0] and "30% to 50% of steps" in rc[0]


def test_floor_and_ceiling_metrics_are_flagged_and_sft_heldout_bpb_is_labelled(tmp_path):
    rows = []
    for i, b in enumerate(BASES):
        for s in (0, 1, 2):
            rows += [dict(base=b, seed=s, metric="termination", value=1.0),
                     dict(base=b, seed=s, metric="robust_recovery", value=0.003 * s),
                     dict(base=b, seed=s, metric="task_accuracy", value=0.2 + 0.1 * i),
                     dict(base=b, seed=s, metric="task_logprob", value=-5.0),
                     dict(base=b, seed=s, metric="heldout_bpb", value=2.0 + 0.1 * i)]  # the old name
    transfer = pd.DataFrame(rows)
    flags = {f["metric"]: f["why"] for f in floor_ceiling(transfer)}
    assert flags == {"termination": "ceiling", "robust_recovery": "floor", "task_logprob": "identical"}
    md, lines = _write(tmp_path, _selection(), transfer=transfer)
    fc = [x for x in lines if x.startswith("**Metrics that cannot separate bases**")]
    assert len(fc) == 1
    assert "`termination` is at the ceiling for every base (seed means 1, 1, 1; all within 0.01 of 1)" in fc[0]
    assert "its constraint cannot exclude or separate any base" in fc[0]
    assert "`robust_recovery` is at the floor" in fc[0] and "`task_logprob` is identical for every base" in fc[0]
    assert "the primary metric" in fc[0] and "task_accuracy" not in fc[0]
    pilot = md[md.index("## Pilot transfer"):md.index("## Run correctness")]
    assert "SFT held-out bits per byte" in pilot and "| heldout_bpb |" not in pilot


def test_confirmation_status_contract():
    sel = _selection()
    assert confirmation_status(sel, None).status == "not_run"
    base = {"bases": BASES[:2]}
    assert confirmation_status(sel, dict(base, confirm_decision={"top": "checkpoint-40", "verdict": "winner"})).status \
        == "confirmed"
    assert confirmation_status(sel, dict(base, confirm_decision={"top": "checkpoint-40",
                                                                 "verdict": "no_clear_winner"})).status == "not_confirmed"
    assert confirmation_status(sel, {"bases": ["checkpoint-60"], "confirm_decision": {"top": "checkpoint-60",
                                                                                      "verdict": "winner"}}).status \
        == "not_included"
    assert confirmation_status(_selection(verdict="no_clear_winner"), dict(base, confirm_decision={})).status \
        == "nothing_to_confirm"


@pytest.mark.parametrize("ctop, cverdict, pick_lo, held, status, recommended", [
    ("checkpoint-40", "beats_default", None, True, "confirmed", "checkpoint-40"),   # same top, a claim: confirmed
    # the top moved and leads the pick by more than the plan's tie margin (0.05): the confirmation's top
    ("checkpoint-60", "winner", 0.06, True, "default_beaten", "checkpoint-60"),
    # ... by less (a claim only under a looser confirm_margin): the pilot's pick, whose claim was replicated
    ("checkpoint-60", "winner", 0.01, True, "default_beaten", "checkpoint-40"),
    ("checkpoint-60", "no_clear_winner", -0.02, True, "default_beaten", "checkpoint-40"),
    ("checkpoint-40", "no_clear_winner", None, True, "default_beaten", "checkpoint-40"),
    ("checkpoint-60", "winner", 0.06, False, "not_confirmed", None),                # the claim did not hold
    ("checkpoint-60", "winner", 0.06, None, "not_confirmed", None),                 # an older confirm.json
])
def test_confirmation_status_of_a_beats_default_claim(ctop, cverdict, pick_lo, held, status, recommended):
    sel = _selection(verdict="beats_default", decision={"recommended": "checkpoint-40", "against": "latest",
                                                         "default": "checkpoint-50"})
    table = [{"base": ctop}] + ([{"base": "checkpoint-40", "diff_vs_top_lo": pick_lo}] if ctop != "checkpoint-40"
                                else [])
    conf = {"bases": BASES, "confirm_decision": {"top": ctop, "verdict": cverdict}, "confirm_table": table}
    claim = {"claim": "beats_default", "base": "checkpoint-40", "default": "checkpoint-50", "diff": 0.1,
             "diff_ci": [0.05, 0.15], "margin": 0.0, "held": held}
    if held is not None:
        conf["claim_retest"] = claim
    cs = confirmation_status(sel, conf)
    assert cs.status == status and cs.recommended == recommended
    words = cs.claim_words()
    assert bool(words) is (status == "default_beaten")
    if words:
        assert words.startswith("the pilot's claim that `checkpoint-40` beats the default `checkpoint-50` held")
        assert "(difference 0.1, interval 0.05 to 0.15; margin 0, one pre-specified comparison)" in words
        assert ("not replicated" in words) is (recommended != "checkpoint-40")
        assert ("so the pick stands" in words) is (ctop != "checkpoint-40" and recommended == "checkpoint-40")
    # with the plan's confirm_margin the words say the claim did not reverse, not that it cleared the margin
    if status == "default_beaten":
        loose = confirmation_status(sel, dict(conf, retest_margin=0.0)).claim_words()
        assert "re-tested with the plan's confirm_margin: the claim did not reverse" in loose
    # a claim record for another base, or after a verdict other than beats_default, never gives "default_beaten"
    held_claim = dict(claim, held=True)
    assert confirmation_status(sel, dict(conf, claim_retest=dict(held_claim, base="checkpoint-60"))).status \
        != "default_beaten"
    assert confirmation_status(_selection(), dict(conf, claim_retest=held_claim)).status != "default_beaten"


@pytest.mark.parametrize("name", ["report.md"])
def test_selection_report_title_names_the_run(tmp_path, name):
    sel = _selection()
    d = make_score_run(tmp_path / "demo" / "score")
    man = json.loads((d / "manifest.json").read_text())
    man["command"] = ["probeselect", "run", "recipes/demo.yaml", "out=results/demo"]
    atomic_write_json(d / "manifest.json", man)
    atomic_write_json(d / "selection.json", lock_for(d, sel))
    first = write_selection_report(d).md.read_text().splitlines()[0]
    assert first == "# probeselect base selection: demo"


@pytest.mark.parametrize("sel_kw, conf", [
    ({}, ("checkpoint-40", "winner", True)),
    ({}, ("checkpoint-40", "no_clear_winner", True)),
    ({}, ("checkpoint-60", "winner", False)),
    ({}, None),
    ({"verdict": "no_clear_winner"}, ("checkpoint-40", "winner", None)),
    ({"verdict": "none_eligible", "top": None, "runner_up": None}, None),
    ({"decision": {"n_sft_seeds": 2, "min_sft_seeds": 3, "seeds": [0, 1]}}, None),
    ({"post_hoc": True, "post_hoc_reasons": ["the plan changed after the lock"]}, None),
], ids=["confirmed", "not-a-winner-at-confirmation", "reversed", "not-run", "no-clear-winner", "none-eligible",
        "provisional", "post-hoc"])
def test_the_front_page_line_says_what_the_decision_says(tmp_path, sel_kw, conf):
    md, lines = _write(tmp_path, _selection(**sel_kw), conf)
    front = [ln for ln in md[:md.index("## Decision")].splitlines()[1:] if ln.strip()][0]
    bold = re.compile(r"\*\*(.+?)\*\*")
    headline = lines[1] if sel_kw.get("post_hoc") else lines[0]
    assert bold.findall(headline)[0] in bold.findall(front)  # the same verdict words, base and qualifier
    assert ("provisional" in front) == ("provisional" in headline)
    assert ("POST-HOC" in front) == bool(sel_kw.get("post_hoc"))


def test_the_naive_choices_are_set_against_the_top_base(tmp_path):
    """The Decision names the naive choices (latest checkpoint; no pretraining bpb is scored in this
    fake run) with their piloted transfer and difference to the top base, or says that they were
    not piloted and how to pilot them."""
    from _selection_fakes import STEPS

    latest = f"checkpoint-{max(STEPS)}"
    assert latest == "checkpoint-60" and latest in BASES
    sel = _selection()
    b = next(x for x in sel["bases"] if x["base"] == latest)
    b.update(diff_vs_top=1.0, diff_vs_top_lo=-0.4, diff_vs_top_hi=2.4)   # oriented: top - base
    _, lines = _write(tmp_path / "a", sel)
    naive = [ln for ln in lines if ln.startswith("**Against the naive choices**")]
    assert naive == [f"**Against the naive choices**: `{latest}` (the latest checkpoint) has task_logprob -2 "
                     "(95% interval -3 to -1.5); the top `checkpoint-40` is ahead of it by 1 (95% interval -0.4 to 2.4; "
                     "an interval reaching below 0 does not rule out the naive choice)."]
    sel = _selection(runner_up="checkpoint-50")
    sel["bases"] = [x for x in sel["bases"] if x["base"] != latest]
    _, lines = _write(tmp_path / "b", sel)
    naive = [ln for ln in lines if ln.startswith("**Against the naive choices**")]
    assert naive == [f"**Against the naive choices**: `{latest}` (the latest checkpoint) was not piloted, so its "
                     "transfer is unknown (the plan's `references: [latest, lowest_bpb]` pilots it next to the "
                     "shortlist)."]
    _, lines = _write(tmp_path / "c", _selection(top=latest, runner_up="checkpoint-40"))
    assert [ln for ln in lines if ln.startswith("**Against the naive choices**")] == [
        f"**Against the naive choices**: `{latest}` (the latest checkpoint) is the top base (task_logprob -2)."]


def _pv(proxy, rho, p_single, p_best, n=3):
    return {"proxy": proxy, "spearman": rho, "kendall": rho, "n_bases": n, "p_single_spearman": p_single,
            "p_best_of_m_spearman": p_best, "p_best_of_m_kendall": p_best, "beats_null_q95": False}


_NULL = {"m_random_proxies": 3, "method": "exact", **{k: {"q50": 0.5, "q90": 1.0, "q95": 1.0, "mean": 0.4}
                                                        for k in ("spearman", "kendall")}}


@pytest.mark.parametrize("rho,p1,expect", [
    (-0.5, 0.83, "did not predict transfer: the recommendation rests on the pilot"),
    (0.5, 0.5, "within what a random order gives"),
    (1.0, 0.0417, None),
])
def test_decision_says_whether_the_probes_aggregate_predicted_the_pilot(tmp_path, rho, p1, expect):
    """The predeclared shortlist aggregate is reported against the pilot before any single proxy (a proxy picked
    because it agreed is not evidence), with the probes' first choice placed in the pilot; a single proxy that
    agrees perfectly does not hide an aggregate that did not."""
    sel = _selection(proxy_validation=[_pv("arith_pattern/*:mean_margin", 1.0, 0.1667, 0.42),
                                       _pv("shortlist aggregate (mean_rank)", rho, p1, 0.9)], null=_NULL)
    d = make_score_run(tmp_path / "run")
    atomic_write_json(d / "shortlist.json", {"selected": [{"checkpoint": "checkpoint-50", "position": 1},
                                                          {"checkpoint": "checkpoint-40", "position": 2}]})
    _, lines = _write_in(d, sel)
    probes = [ln for ln in lines if ln.startswith("**Probes vs the pilot**")]
    assert len(probes) == 1, lines
    assert f"Spearman {rho:g} against pilot transfer" in probes[0]
    assert "the probes' first choice `checkpoint-50` is #3 of 3 in the pilot" in probes[0]
    if expect:
        assert expect in probes[0]
    else:
        assert "did not predict" not in probes[0] and "within what a random order" not in probes[0]
    prox = [ln for ln in lines if ln.startswith("**Proxies**")]
    assert len(prox) == 1 and "`arith_pattern/*:mean_margin` has Spearman 1" in prox[0]
    assert "shortlist aggregate" not in prox[0]  # the aggregate is never offered as "the best-agreeing proxy"
    assert lines.index(probes[0]) < lines.index(prox[0])


def test_decision_without_a_shortlist_file_omits_only_the_first_choice(tmp_path):
    sel = _selection(proxy_validation=[_pv("shortlist aggregate (mean_rank)", -1.0, 1.0, 1.0)], null=_NULL)
    _, lines = _write(tmp_path, sel)
    probes = [ln for ln in lines if ln.startswith("**Probes vs the pilot**")]
    assert len(probes) == 1 and "first choice" not in probes[0] and "did not predict" in probes[0]
    assert not [ln for ln in lines if ln.startswith("**Proxies**")]  # no single proxy declared: no such line
