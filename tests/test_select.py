"""Selection: ranking under constraints, paired bootstrap, tie rule, proxy validation, the
selection-effect null, POST-HOC marking, outputs and the base-selection report."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from _selection_fakes import PLAN, make_score_run, write_fake_pilot

from probeselect.cli import main
from probeselect.errors import PostHocError, SelectionError
from probeselect.plan import SelectionSpec, lock_plan
from probeselect.select import PilotTables, best_of_m_null, rank_bases, select
from probeselect.shortlist import shortlist


@pytest.fixture
def run(tmp_path):
    """A scored + shortlisted run (checkpoint-40, -60, -50 shortlisted) with the plan locked."""
    d = make_score_run(tmp_path / "run")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    sl = shortlist(d, plan)
    assert sl.selected == ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
    lock_plan(plan, d)
    return d, plan


def _truth(acc, term=(0.9, 0.9, 0.9)):
    names = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
    return {b: {"task_accuracy": a, "termination": t} for b, a, t in zip(names, acc, term)}


def test_clear_winner_with_interval_and_outputs(run):
    d, _ = run
    write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.40)))
    res = select(d)
    r = res.ranking
    assert r.verdict == "winner" and r.recommended == "checkpoint-40" and r.runner_up in ("checkpoint-60", "checkpoint-50")
    assert r.p_top_beats_runner_up > 0.99
    assert r.diff_ci[0] > 0.02 and r.diff_ci[0] < r.diff < r.diff_ci[1]
    t = r.table.set_index("base")
    tr = pd.read_csv(d / "pilot" / "transfer.csv")
    acc = tr[tr.metric == "task_accuracy"].pivot(index="base", columns="seed", values="value")
    for b in t.index:  # per-seed values and the seed mean come from transfer.csv
        assert t.loc[b, "seed0"] == pytest.approx(acc.loc[b, 0], abs=1e-12)
        assert t.loc[b, "value"] == pytest.approx(acc.loc[b].mean(), abs=1e-12)
        assert t.loc[b, "ci_lo"] <= t.loc[b, "value"] <= t.loc[b, "ci_hi"]
    assert t["p_best"].sum() == pytest.approx(1.0, abs=1e-9)
    csv = pd.read_csv(d / "selection.csv")
    assert list(csv["base"]) == list(r.table["base"]) and not csv["post_hoc"].any() and csv["predeclared"].all()
    js = json.loads((d / "selection.json").read_text())
    assert js["status"] == "predeclared" and js["decision"]["recommended"] == "checkpoint-40"
    assert js["bootstrap"]["seed"] == 0 and js["bootstrap"]["replicates"] == 500
    # same seed, same answer
    assert select(d).ranking.diff_ci == r.diff_ci


def test_tie_gives_no_clear_winner(run):
    d, _ = run
    write_fake_pilot(d / "pilot", _truth((0.6, 0.6, 0.6)), n_items=40)
    r = select(d).ranking
    assert r.verdict == "no_clear_winner" and r.recommended is None
    assert r.diff_ci[0] <= 0.02
    assert 0.3 < r.p_top_beats_runner_up < 1.0


def test_constraint_excludes_the_best_transfer_base(run):
    d, _ = run
    write_fake_pilot(d / "pilot", _truth((0.9, 0.5, 0.1), term=(0.2, 0.9, 0.9)))
    r = select(d).ranking
    t = r.table.set_index("base")
    assert not t.loc["checkpoint-40", "eligible"] and "termination" in t.loc["checkpoint-40", "failed_constraints"]
    assert r.top == "checkpoint-60" and list(r.table["base"])[-1] == "checkpoint-40"
    assert math.isnan(t.loc["checkpoint-40", "p_best"])


def test_bootstrap_matches_the_binomial_interval_and_degenerate_cases(tmp_path):
    """One seed, 400 Bernoulli items at p=0.5: the 95% interval half-width ~ 1.96*sqrt(.25/400) = 0.049.
    A base that is always right vs one always wrong: difference 1 with a zero-width interval."""
    n = 400
    rows = [dict(base=b, seed=0, metric="task_accuracy", item_id=i, value=v)
            for i in range(n) for b, v in (("a", float(i % 2)), ("one", 1.0), ("zero", 0.0))]
    items = pd.DataFrame(rows)
    transfer = items.groupby(["base", "seed", "metric"], as_index=False)["value"].mean()
    spec = SelectionSpec(primary="task_accuracy", bootstrap=4000, seed=1)
    r = rank_bases(PilotTables(tmp_path, transfer, items, None), spec)
    t = r.table.set_index("base")
    half = (t.loc["a", "ci_hi"] - t.loc["a", "ci_lo"]) / 2
    assert half == pytest.approx(1.96 * math.sqrt(0.25 / n), rel=0.1)
    assert (t.loc["one", "ci_lo"], t.loc["one", "ci_hi"]) == pytest.approx((1.0, 1.0), abs=1e-12)
    assert r.top == "one" and r.runner_up == "a" and r.diff == pytest.approx(0.5)
    assert r.p_top_beats_runner_up == 1.0 and r.verdict == "winner"
    assert any("one SFT seed" in n for n in r.notes)


def test_lower_is_better_token_weighted_metric_is_centred_on_its_point(tmp_path):
    rng = np.random.default_rng(0)
    rows = [dict(base=b, seed=s, metric="heldout_loss", item_id=i, value=float(rng.normal(mu, 0.2)))
            for b, mu in (("good", 1.0), ("bad", 1.5)) for s in (0, 1) for i in range(50)]
    items = pd.DataFrame(rows)
    transfer = items.groupby(["base", "seed", "metric"], as_index=False)["value"].mean()
    transfer["value"] += 0.01  # token weighting makes the run value differ from the item mean
    r = rank_bases(PilotTables(tmp_path, transfer, items, None),
                   SelectionSpec(primary="heldout_loss", direction="lower", bootstrap=500))
    t = r.table.set_index("base")
    assert r.recommended == "good" and r.diff == pytest.approx(t.loc["bad", "value"] - t.loc["good", "value"])
    mid = (t["ci_lo"] + t["ci_hi"]) / 2
    assert np.allclose(mid, t["value"], atol=0.02)
    assert any("token weighted" in n for n in r.notes)


def test_exact_null_for_three_bases():
    null = best_of_m_null(np.array([3.0, 2.0, 1.0]), m=4)
    assert null.method == "exact"
    assert np.allclose(null.support["spearman"], [-1, -0.5, 0.5, 1])
    assert np.allclose(null.prob["spearman"], [1 / 6, 1 / 3, 1 / 3, 1 / 6])
    assert null.p_single("spearman", 1.0) == pytest.approx(1 / 6)
    assert null.p_best_of_m("spearman", 1.0) == pytest.approx(1 - (5 / 6) ** 4)
    assert null.p_best_of_m("spearman", 0.5) == pytest.approx(1 - (1 / 2) ** 4)  # P(all four < 0.5)
    assert null.quantile("spearman", 0.95) == 1.0
    assert best_of_m_null(np.array([3.0, 2.0, 1.0]), m=1).quantile("spearman", 0.5) == -0.5
    assert np.allclose(null.support["kendall"], [-1, -1 / 3, 1 / 3, 1])


def test_monte_carlo_null_for_many_bases():
    """n = 12 > 8: Monte Carlo. A single random proxy's one-sided 5% Spearman critical value for n = 12
    is about 0.50; the best of 5 random proxies is much higher (the selection effect)."""
    single = best_of_m_null(np.arange(12.0), m=1, seed=3)
    assert single.method == "monte_carlo"
    assert single.quantile("spearman", 0.95) == pytest.approx(0.50, abs=0.04)
    best5 = best_of_m_null(np.arange(12.0), m=5, seed=3)
    assert best5.quantile("spearman", 0.5) > 0.3 and best5.quantile("spearman", 0.95) > single.quantile("spearman", 0.95)


def test_proxy_validation_signs_and_small_n_notes(run):
    d, _ = run
    # transfer order 40 > 60 > 50 ...
    write_fake_pilot(d / "pilot", {"checkpoint-40": {"task_accuracy": 1.0, "termination": 1.0},
                                   "checkpoint-60": {"task_accuracy": 0.5, "termination": 1.0},
                                   "checkpoint-50": {"task_accuracy": 0.0, "termination": 1.0}})
    res = select(d)
    pv = res.proxies.set_index("proxy")
    sl = pd.read_csv(d / "shortlist.csv").set_index("checkpoint")
    v = sl.loc[["checkpoint-40", "checkpoint-60", "checkpoint-50"], "value[rel/x:mean_margin]"].to_numpy()
    from scipy.stats import spearmanr
    assert pv.loc["rel/x:mean_margin", "spearman"] == pytest.approx(spearmanr(v, [1.0, 0.5, 0.0]).statistic)
    assert (pv["n_bases"] == 3).all() and res.null.m == 2 and res.null.method == "exact"
    assert pv["p_best_of_m_spearman"].ge(pv["p_single_spearman"]).all()
    assert any("with 3 bases" in n for n in res.notes)
    js = json.loads((d / "selection.json").read_text())
    assert js["null"]["m_random_proxies"] == 2 and len(js["proxy_validation"]) == 3  # 2 proxies + the aggregate


def test_select_refuses_without_lock_and_post_hoc_is_marked_everywhere(run, tmp_path):
    d, plan = run
    write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.40)))
    (d / "plan.lock.json").rename(tmp_path / "saved.lock")
    with pytest.raises(SelectionError, match="no plan lock"):
        select(d)
    (tmp_path / "saved.lock").rename(d / "plan.lock.json")
    plan.write_text(PLAN.replace("tie_margin: 0.02", "tie_margin: 0.0"))  # change the plan after the lock
    with pytest.raises(PostHocError, match="POST-HOC.*changed after it was locked.*--allow-post-hoc"):
        select(d)
    res = select(d, allow_post_hoc=True)
    assert res.post_hoc
    js = json.loads((d / "selection.json").read_text())
    assert js["post_hoc"] and js["status"] == "POST-HOC" and "changed" in js["post_hoc_reasons"][0]
    assert pd.read_csv(d / "selection.csv")["post_hoc"].all()
    from probeselect.report import write_report

    md, html = write_report(d)
    text = md.read_text()
    assert text.startswith("# POST-HOC probeselect base selection")
    decision = text[text.index("## Decision"):text.index("## Pilot transfer")]
    assert "**POST-HOC selection.**" in decision and "Predeclared" not in decision
    assert "POST-HOC" in html.read_text()[:300]


def test_cli_select(run, capsys):
    d, plan = run
    write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.40)))
    assert main(["select", str(d)]) == 0
    out = capsys.readouterr().out
    assert "recommended: checkpoint-40" in out and "selection:" in out
    plan.write_text(PLAN + "# edited\n")
    assert main(["select", str(d)]) == 2
    assert "--allow-post-hoc" in capsys.readouterr().err
    assert main(["select", str(d), "--allow-post-hoc"]) == 0
    assert "[POST-HOC]" in capsys.readouterr().out


def test_selection_report_sections(run):
    d, _ = run
    write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.40)),
                     diagnostics={("checkpoint-60", 1): {"resumes": 1, "spikes": 2}})
    select(d)
    from probeselect.report import write_report

    md_path, html_path = write_report(d)
    md, page = md_path.read_text(), html_path.read_text()
    order = ["## Decision", "## Pilot transfer", "## Run correctness", "## Proxy validation", "## Confirmation",
             "## Probe evidence summary", "## Shortlist", "## Margin trajectories", "## Caveats", "## Provenance"]
    pos = [md.index(s) for s in order]
    assert pos == sorted(pos)
    top = md[pos[0]:pos[1]]
    assert "**Recommended base (pilot only, not yet confirmed): `checkpoint-40`**" in top and "**Predeclared**" in top
    assert "beats" in top and "Confirmation**: not run" in top
    assert "1 resumes (`checkpoint-60` seed 1: 1)" in top and "2 loss spikes (`checkpoint-60` seed 1: 2)" in top
    caveats = md[md.index("## Caveats"):md.index("## Provenance")]
    assert "reverse" in caveats and "not free-generation accuracy" in caveats and "One-probe evidence" in caveats
    assert "<script" not in page and 'src="data:image/png;base64,' in page


def test_proxy_validation_correlates_the_oriented_quantity_the_shortlist_ranks(tmp_path):
    """A bits-per-byte proxy that falls while transfer rises agrees (+1), and a "*" proxy is
    judged on its mean per-variant rank (what the shortlist ranks), not on its mean value."""
    from probeselect.plan import load_selection_plan
    from probeselect.select import proxy_validation

    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.replace('  - {family: rel, variant: x, metric: mean_margin}\n',
                              '  - {family: heldout_nll, variant: bpb, metric: bits_per_byte}\n'))
    plan = load_selection_plan(p)
    bases = ["b1", "b2", "b3", "b4"]
    # conf/*: variant means favour b4 (one huge variant value) but its mean per-variant rank is the worst
    sl = pd.DataFrame({"checkpoint": bases,
                       "value[conf/*:mean_margin]": [0.3, 0.2, 0.1, 5.0],
                       "score[conf/*:mean_margin]": [-1.0, -2.0, -3.0, -3.5],
                       "value[heldout_nll/bpb:bits_per_byte]": [0.9, 1.0, 1.1, 1.2],
                       "score[heldout_nll/bpb:bits_per_byte]": [-0.9, -1.0, -1.1, -1.2],
                       "mean_rank": [1.0, 2.0, 3.0, 4.0]})
    point = pd.Series([0.9, 0.7, 0.5, 0.1], index=bases)  # transfer falls b1 -> b4
    rows, _, _ = proxy_validation(sl, plan, point, plan.selection)
    r = rows.set_index("proxy")["spearman"]
    assert r["heldout_nll/bpb:bits_per_byte"] == pytest.approx(1.0)  # raw bpb would give -1
    assert r["conf/*:mean_margin"] == pytest.approx(1.0)  # the mean value would give 0.4
    assert r["shortlist aggregate (mean_rank)"] == pytest.approx(1.0)
