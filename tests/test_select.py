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
    lock_plan(plan, d, allow_weak=True)  # the whole plan, before the shortlist; k = 3 cannot beat the proxy null
    sl = shortlist(d, plan)
    assert sl.selected == ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
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


def test_an_exact_tie_ranks_in_the_comparisons_order(tmp_path):
    """Two bases with the same accuracy sum (508 of 840 items over 3 seeds), whose float means pandas'
    groupby and numpy round differently: ranking must not stop (it did, on an assert, in a late-harm
    pilot) and the tie is no clear winner."""
    counts = {"checkpoint-1200": [191, 133, 184], "checkpoint-1400": [185, 155, 168], "checkpoint-2000": [118, 118, 103]}
    transfer = pd.DataFrame([dict(base=b, seed=s, metric="task_accuracy", value=c / 280)
                             for b, cs in counts.items() for s, c in enumerate(cs)])
    grouped = transfer.groupby("base")["value"].mean()
    rows = {b: float(np.mean([c / 280 for c in cs])) for b, cs in counts.items()}
    assert (grouped["checkpoint-1200"] >= grouped["checkpoint-1400"]) != (rows["checkpoint-1200"] >= rows["checkpoint-1400"])
    r = rank_bases(PilotTables(tmp_path, transfer, None, None), SelectionSpec(primary="task_accuracy", bootstrap=2000))
    assert {r.top, r.runner_up} == {"checkpoint-1200", "checkpoint-1400"} and r.verdict != "winner"
    assert r.diff == pytest.approx(0.0, abs=1e-12)
    assert list(r.table["base"])[:2] == [r.top, r.runner_up] and list(r.table["base"])[-1] == "checkpoint-2000"


def test_t_intervals_match_the_formula_and_one_seed_has_none(tmp_path):
    """Three seeds: the per-base interval is mean +- t_{.975,2} sd/sqrt(3) of the seed values, the top-vs-
    runner-up interval the same on the paired seed differences (k = 2: no Bonferroni factor), and
    P(top beats runner-up) the t CDF of mean/se. One seed: no interval, no clear winner."""
    from scipy.stats import t as student_t

    vals = {"a": [0.50, 0.62, 0.58], "b": [0.40, 0.45, 0.52]}
    transfer = pd.DataFrame([dict(base=b, seed=s, metric="task_accuracy", value=v)
                             for b, vs in vals.items() for s, v in enumerate(vs)])
    r = rank_bases(PilotTables(tmp_path, transfer, None, None), SelectionSpec(primary="task_accuracy", bootstrap=4000))
    t = r.table.set_index("base")
    q = student_t.ppf(0.975, 2)
    for b, vs in vals.items():
        half = q * np.std(vs, ddof=1) / math.sqrt(3)
        assert (t.loc[b, "ci_lo"], t.loc[b, "ci_hi"]) == pytest.approx((np.mean(vs) - half, np.mean(vs) + half), abs=1e-12)
    d = np.subtract(vals["a"], vals["b"])
    se = np.std(d, ddof=1) / math.sqrt(3)
    assert r.top == "a" and r.diff == pytest.approx(d.mean(), abs=1e-12)
    assert r.diff_ci == pytest.approx((d.mean() - q * se, d.mean() + q * se), abs=1e-12)
    assert r.p_top_beats_runner_up == pytest.approx(student_t.cdf(d.mean() / se, 2), abs=1e-12)
    assert r.verdict == ("winner" if d.mean() - q * se > 0 else "no_clear_winner")
    # p_best from the multivariate t posterior agrees with the exact t probability (Monte Carlo, 4000 draws)
    assert t.loc["a", "p_best"] == pytest.approx(r.p_top_beats_runner_up, abs=0.02)

    one = transfer[transfer["seed"] == 0]
    r1 = rank_bases(PilotTables(tmp_path, one, None, None), SelectionSpec(primary="task_accuracy"))
    assert r1.verdict == "no_clear_winner" and r1.diff_ci is None and r1.p_top_beats_runner_up is None
    assert r1.table["ci_lo"].isna().all() and any("one SFT seed" in n for n in r1.notes)


def test_fewer_seeds_than_min_sft_seeds_names_no_winner(run):
    d, _ = run
    write_fake_pilot(d / "pilot", _truth((0.95, 0.2, 0.1)), seeds=(0, 1))
    r = select(d).ranking
    assert r.verdict == "no_clear_winner" and r.recommended is None and r.top == "checkpoint-40"
    assert r.reason.startswith("2 SFT seeds < min_sft_seeds 3")
    js = json.loads((d / "selection.json").read_text())
    assert js["n_sft_seeds"] == 2 and js["min_sft_seeds"] == 3 and js["decision"]["reason"] == r.reason


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_simulated_coverage_and_false_winner_rate(n_seeds):
    """Synthetic pilots with seed effects shared across bases, base x seed interaction, item difficulty and item
    noise (tests/_selection_fakes.simulate_pilot_items), decided by the same compare_top that rank_bases uses:
    95% intervals of top - runner-up cover the true difference of the picked pair in >= 93% of studies (k = 2
    and k = 3), and with equal bases a clear winner is declared in <= 5% of studies (k = 2: exactly 5% in
    theory, so the bound allows 2 Monte Carlo standard errors; k = 3: Bonferroni makes it far smaller).
    The table for both the old bootstrap and this method: bench/README.md (bench/selection_coverage.py)."""
    from _selection_fakes import simulate_pilot_items

    from probeselect.select import compare_top

    rng = np.random.default_rng(100 + n_seeds)
    studies = 4000
    se = math.sqrt(0.05 * 0.95 / studies)
    for means in ([0.2, 0.0], [0.2, 0.0, -0.1]):
        mu = np.asarray(means)
        c = compare_top(simulate_pilot_items(rng, studies=studies, true_means=mu, n_seeds=n_seeds).mean(-1), 0.95)
        _, lo, hi = c.runner_up_diff()
        truth = mu[c.top] - mu[c.runner_up]
        assert np.mean((lo <= truth) & (truth <= hi)) >= 0.93, means
        null = compare_top(simulate_pilot_items(rng, studies=studies, true_means=[0.0] * len(mu),
                                                n_seeds=n_seeds).mean(-1), 0.95)
        assert np.mean(null.winner(0.0)) <= 0.05 + 2 * se, len(mu)


def test_exact_null_for_three_bases():
    null = best_of_m_null(np.array([3.0, 2.0, 1.0]), m=4)
    assert null.method == "exact" and null.m == 4
    assert np.allclose(null.support["spearman"][0], [-1, -0.5, 0.5, 1])
    assert np.allclose(null.prob["spearman"][0], [1 / 6, 1 / 3, 1 / 3, 1 / 6])
    assert null.p_single("spearman", 1.0) == pytest.approx(1 / 6)
    assert null.p_best_of_m("spearman", 1.0) == pytest.approx(1 - (5 / 6) ** 4)
    assert null.p_best_of_m("spearman", 0.5) == pytest.approx(1 - (1 / 2) ** 4)  # P(all four < 0.5)
    assert null.quantile("spearman", 0.95) == 1.0
    assert best_of_m_null(np.array([3.0, 2.0, 1.0]), m=1).quantile("spearman", 0.5) == -0.5
    assert np.allclose(null.support["kendall"][0], [-1, -1 / 3, 1 / 3, 1])


def test_null_keeps_each_candidates_ties():
    """A proxy with values (5, 5, 1) over 3 bases can only order them 3 distinct ways: its random counterpart
    reaches its best Spearman (0.866 against distinct transfer values) with probability 1/3, not 1/6;
    tau-b reaches 0.816. The best of the candidates multiplies each candidate's own CDF."""
    from scipy.stats import kendalltau, spearmanr

    t = np.array([3.0, 2.0, 1.0])
    tied = np.array([5.0, 5.0, 1.0])
    null = best_of_m_null(t, candidates=[tied, np.array([3.0, 2.0, 1.0])])
    top_rho = spearmanr(tied, t).statistic
    assert null.support["spearman"][0][-1] == pytest.approx(top_rho) and top_rho == pytest.approx(math.sqrt(3) / 2)
    assert null.p_single("spearman", top_rho, 0) == pytest.approx(1 / 3)
    assert null.support["kendall"][0][-1] == pytest.approx(kendalltau(tied, t).statistic)
    # P(best of the two >= 0.866) = 1 - P(tied < .866) * P(untied < .866) = 1 - (2/3)(5/6)
    assert null.p_best_of_m("spearman", top_rho) == pytest.approx(1 - (2 / 3) * (5 / 6))
    assert null.tied == [True, False]


def test_a_perfect_proxy_cannot_beat_the_null_with_three_bases():
    from probeselect.select import min_p_best_of_m, smallest_beatable_k

    assert min_p_best_of_m(3, 5) == pytest.approx(1 - (5 / 6) ** 5)       # 4 proxies + the aggregate: 0.60
    assert best_of_m_null(np.arange(3.0), m=5).p_best_of_m("spearman", 1.0) == pytest.approx(min_p_best_of_m(3, 5))
    assert smallest_beatable_k(5) == 5 and min_p_best_of_m(4, 5) > 0.05 > min_p_best_of_m(5, 5)
    assert smallest_beatable_k(1) == 4  # even a single predeclared proxy needs 4 bases (1/24 < 0.05 < 1/6)


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
    assert (pv["n_bases"] == 3).all() and res.null.m == 3 and res.null.method == "exact"  # 2 proxies + aggregate
    assert pv["p_best_of_m_spearman"].ge(pv["p_single_spearman"]).all()
    assert any("with 3 bases" in n for n in res.notes)
    js = json.loads((d / "selection.json").read_text())
    assert js["null"]["candidates"] == 3 and len(js["proxy_validation"]) == 3  # 2 proxies + the aggregate


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


def test_p_best_splits_exact_ties_evenly(tmp_path):
    """Twins with identical seed values are the best in every draw together: each gets half
    (argmax gave every draw to the first, 1.0 vs 0.0); a third, worse base keeps its share."""
    vals = {"twin-a": [0.60, 0.70, 0.65], "twin-b": [0.60, 0.70, 0.65], "c": [0.55, 0.72, 0.50]}
    transfer = pd.DataFrame([dict(base=b, seed=s, metric="task_accuracy", value=v)
                             for b, vs in vals.items() for s, v in enumerate(vs)])
    r = rank_bases(PilotTables(tmp_path, transfer, None, None), SelectionSpec(primary="task_accuracy", bootstrap=2000))
    t = r.table.set_index("base")
    assert t.loc["twin-a", "p_best"] == pytest.approx(t.loc["twin-b", "p_best"], abs=1e-12)
    assert t.loc["twin-a", "p_best"] > 0.25 and t["p_best"].sum() == pytest.approx(1.0, abs=1e-9)
    two = transfer[transfer["base"] != "c"]
    t2 = rank_bases(PilotTables(tmp_path, two, None, None), SelectionSpec(primary="task_accuracy")).table.set_index("base")
    assert t2["p_best"].tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


@pytest.mark.parametrize("n_bases", [2, 3])
def test_all_zero_tie_is_split_evenly_everywhere(tmp_path, n_bases):
    """Every base at 0 on every seed (a transfer metric at floor): p_best is 1/k for each and
    P(top beats runner-up) is 0.5, never 1 and 0 for whichever base happens to be listed first."""
    transfer = pd.DataFrame([dict(base=f"b{i}", seed=s, metric="task_accuracy", value=0.0)
                             for i in range(n_bases) for s in range(3)])
    r = rank_bases(PilotTables(tmp_path, transfer, None, None), SelectionSpec(primary="task_accuracy"))
    assert r.table["p_best"].tolist() == pytest.approx([1 / n_bases] * n_bases, abs=1e-12)
    assert r.p_top_beats_runner_up == pytest.approx(0.5) and r.verdict == "no_clear_winner" and r.recommended is None


def _item_tables(tmp_path, n_items=40, seeds=range(6), strong=4):
    """Three bases on the same binary items: ``a`` beats ``b`` on ``strong`` items under every SFT seed and
    ties it elsewhere except one item per seed that flips (small seed noise, large item heterogeneity);
    ``c`` is far behind. Returns (transfer, items)."""
    rows = []
    for s in seeds:
        for i in range(n_items):
            a = 1.0
            b = 0.0 if i < strong else 1.0
            if i == strong + s:  # one seed-specific flip
                b = 0.0 if s % 2 else 1.0
                a = 0.0 if s % 2 == 0 else 1.0
            c = 1.0 if i % 2 else 0.0
            for base, v in (("a", a), ("b", b), ("c", c)):
                rows.append(dict(base=base, seed=s, metric="task_accuracy", item_id=f"t/{i}", value=v))
    items = pd.DataFrame(rows)
    transfer = items.groupby(["base", "seed", "metric"], as_index=False)["value"].mean()
    return transfer, items


def test_seeds_items_interval_widens_to_the_item_draw_and_matches_the_validation_analysis(tmp_path):
    """decision.interval: seeds+items. Seed noise is small and the lead rests on 4 of 40 items: the seed-level
    interval names a winner, the seeds + items one does not. Its lower end is what the validation's secondary
    analysis (bench/interval_items.py, the independent computation behind bench/VALIDITY.md) reports, it is never
    narrower than the seed-level one for any base, and the seed-level default is unchanged."""
    import importlib.util
    from pathlib import Path

    transfer, items = _item_tables(tmp_path)
    tables = PilotTables(tmp_path, transfer, items, None)
    seed_only = rank_bases(tables, SelectionSpec(primary="task_accuracy", tie_margin=0.02))
    both = rank_bases(tables, SelectionSpec(primary="task_accuracy", tie_margin=0.02, interval="seeds+items"))
    assert seed_only.top == both.top == "a" and seed_only.runner_up == both.runner_up == "b"
    assert seed_only.verdict == "winner" and both.verdict == "no_clear_winner"
    assert both.diff == pytest.approx(seed_only.diff, abs=1e-12)
    spec = importlib.util.spec_from_file_location("interval_items", Path(__file__).parents[1] / "bench" / "interval_items.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref = mod.intervals(items, "a", "b", "task_accuracy", n_comparisons=2)
    assert seed_only.diff_ci[0] == pytest.approx(ref["seed_lo"], abs=1e-9)
    assert both.diff_ci[0] == pytest.approx(min(ref["seed_lo"], ref["both_lo"]), abs=1e-9)
    assert both.diff_ci[0] < ref["seed_lo"] - 0.02  # the item part matters here, by construction
    t1, t2 = seed_only.table.set_index("base"), both.table.set_index("base")
    for b in ("b", "c"):
        assert t2.loc[b, "diff_vs_top_lo"] <= t1.loc[b, "diff_vs_top_lo"] + 1e-12
    # P(top beats runner-up) and p_best stay seed-level
    assert both.p_top_beats_runner_up == pytest.approx(seed_only.p_top_beats_runner_up, abs=1e-12)
    assert "seeds + items" in both.summary(SelectionSpec(interval="seeds+items"))["interval"]
    # with the lead spread over many items, the item part is small and both rules name the winner
    transfer2, items2 = _item_tables(tmp_path, n_items=200, strong=60)
    r2 = rank_bases(PilotTables(tmp_path, transfer2, items2, None),
                    SelectionSpec(primary="task_accuracy", tie_margin=0.02, interval="seeds+items"))
    assert r2.verdict == "winner" and r2.top == "a"


def test_seeds_items_interval_refuses_tables_that_cannot_carry_it(tmp_path):
    """No per-item table, an item missing for one base and seed, or item means that are not the seed values (a
    token-weighted metric): a clear error naming transfer_items.parquet and the plan key, never a silent
    fallback to the seed-level interval."""
    transfer, items = _item_tables(tmp_path)
    spec = SelectionSpec(primary="task_accuracy", tie_margin=0.02, interval="seeds+items")
    with pytest.raises(SelectionError, match=r"transfer_items.parquet: missing.*interval: seeds"):
        rank_bases(PilotTables(tmp_path, transfer, None, None), spec)
    holed = items.drop(items[(items["base"] == "b") & (items["seed"] == 3) & (items["item_id"] == "t/7")].index)
    with pytest.raises(SelectionError, match=r"transfer_items.parquet: .*same items for every compared base"):
        rank_bases(PilotTables(tmp_path, transfer, holed, None), spec)
    weighted = transfer.copy()
    weighted.loc[weighted["base"] == "c", "value"] += 0.01
    with pytest.raises(SelectionError, match=r"item mean .* is not its seed value"):
        rank_bases(PilotTables(tmp_path, weighted, items, None), spec)
    # the seed-level default needs none of it
    assert rank_bases(PilotTables(tmp_path, transfer, None, None),
                      SelectionSpec(primary="task_accuracy", tie_margin=0.02)).verdict == "winner"


def test_a_plan_asking_for_seeds_items_is_used_end_to_end(tmp_path):
    """A locked plan with `decision.interval: seeds+items`: select() reads it, the intervals are at least as wide
    as the seed-level ones of the same pilot, selection.json records the rule, and the report's caveat says what
    the intervals cover."""
    from probeselect.final_report import SELECTION_CAVEATS, _caveats

    runs = {}
    for rule in ("seeds", "seeds+items"):
        d = make_score_run(tmp_path / rule / "run")
        plan = tmp_path / rule / "plan.yaml"
        plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}", f"decision: {{tie_margin: 0.02, interval: {rule}}}"))
        lock_plan(plan, d, allow_weak=True)
        shortlist(d, plan)
        write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.40)))
        runs[rule] = (select(d).ranking, json.loads((d / "selection.json").read_text()))
    (r1, j1), (r2, j2) = runs["seeds"], runs["seeds+items"]
    assert r1.top == r2.top == "checkpoint-40" and r2.diff == pytest.approx(r1.diff, abs=1e-12)
    assert r2.diff_ci[0] <= r1.diff_ci[0] + 1e-12 and r2.diff_ci[1] >= r1.diff_ci[1] - 1e-12
    assert "interval" not in j1["selection_plan"]["decision"]
    assert j2["selection_plan"]["decision"]["interval"] == "seeds+items"
    assert _caveats(j1) == SELECTION_CAVEATS
    c2 = _caveats(j2)
    assert any("new draw of transfer items" in c for c in c2) and not any(c.startswith("The intervals are seed-level")
                                                                        for c in c2)



# --- selection.decision.against: a base shown better than the default (the latest checkpoint) ---

_AGAINST = {"A": [0.90, 0.91, 0.89, 0.92, 0.90, 0.91],      # the top
            "B": [0.90, 0.90, 0.90, 0.91, 0.90, 0.90],      # within the tie margin of A: an equivalent candidate
            "L": [0.80, 0.82, 0.79, 0.81, 0.80, 0.82]}      # the default, ~0.1 below both


def _tables(tmp_path, values):
    rows = [dict(base=b, seed=s, metric="task_accuracy", value=v) for b, vs in values.items() for s, v in enumerate(vs)]
    return PilotTables(tmp_path, pd.DataFrame(rows), None, None)


def test_against_default_names_a_base_better_than_the_latest_with_its_equivalents(tmp_path):
    from scipy.stats import t as student_t

    tabs = _tables(tmp_path, _AGAINST)
    plain = rank_bases(tabs, SelectionSpec(tie_margin=0.02, min_sft_seeds=6), default="L")
    assert plain.verdict == "no_clear_winner" and plain.default is None   # without the key nothing changes
    spec = SelectionSpec(tie_margin=0.02, min_sft_seeds=6, against="latest")
    r = rank_bases(tabs, spec, default="L")
    assert r.verdict == "beats_default" and r.recommended == "A" and r.top == "A" and r.default == "L"
    d = np.subtract(_AGAINST["A"], _AGAINST["L"])
    half = student_t.ppf(1 - 0.05 / (2 * 2), 5) * d.std(ddof=1) / math.sqrt(6)   # Bonferroni over k - 1 = 2
    assert r.default_diff == pytest.approx(d.mean(), abs=1e-12)
    assert r.default_ci == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-9)
    assert r.default_ci[0] > 0.02 and "B" in r.reason and "equivalent" in r.reason
    s = r.summary(spec)
    assert s["against"] == "latest" and s["default"] == "L" and s["verdict"] == "beats_default"
    assert "against" not in plain.summary(SelectionSpec(tie_margin=0.02))   # earlier outputs stay byte-identical


@pytest.mark.parametrize("values, default, verdict", [
    ({"A": _AGAINST["A"], "L": _AGAINST["B"]}, "L", "no_clear_winner"),   # top within the margin of the default
    ({"L": _AGAINST["A"], "B": _AGAINST["B"]}, "L", "no_clear_winner"),   # the default on top: never beats_default
    (_AGAINST, None, "no_clear_winner"),                                  # the run names no default
    ({"A": _AGAINST["A"], "B": _AGAINST["B"]}, "L", "no_clear_winner"),   # the default was not piloted
])
def test_against_default_needs_the_default_compared_and_beaten(tmp_path, values, default, verdict):
    r = rank_bases(_tables(tmp_path, values), SelectionSpec(tie_margin=0.02, min_sft_seeds=6, against="latest"),
                   default=default)
    assert r.verdict == verdict and r.recommended is None
    if default is None or default not in values:
        assert any("only a clear winner" in n for n in r.notes)


def test_against_default_respects_min_sft_seeds(tmp_path):
    r = rank_bases(_tables(tmp_path, _AGAINST), SelectionSpec(tie_margin=0.02, min_sft_seeds=7, against="latest"),
                   default="L")
    assert r.verdict == "no_clear_winner" and r.reason.startswith("6 SFT seeds < min_sft_seeds 7")


def test_select_against_latest_end_to_end(tmp_path, capsys):
    d = make_score_run(tmp_path / "run")          # checkpoint-60 is the latest
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("decision: {tie_margin: 0.02}", "decision: {tie_margin: 0.02, against: latest}"))
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    write_fake_pilot(d / "pilot", _truth((0.85, 0.45, 0.84)), n_items=3000)
    r = select(d).ranking
    assert r.verdict == "beats_default" and r.default == "checkpoint-60" and r.recommended == r.top
    assert r.top in ("checkpoint-40", "checkpoint-50") and r.default_ci[0] > 0.02
    js = json.loads((d / "selection.json").read_text())
    assert js["decision"]["against"] == "latest" and js["decision"]["default"] == "checkpoint-60"
    assert js["selection_plan"]["decision"]["against"] == "latest"
    assert main(["select", str(d)]) == 0
    assert "better than the default checkpoint-60" in capsys.readouterr().out


def test_plan_against_must_name_a_naive_choice(tmp_path):
    from probeselect.errors import ProbeSpecError
    from probeselect.plan import load_selection_plan

    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.replace("decision: {tie_margin: 0.02}", "decision: {tie_margin: 0.02, against: earliest}"))
    with pytest.raises(ProbeSpecError, match=r"plan.yaml: selection.decision.against must be one of"):
        load_selection_plan(p)


@pytest.mark.parametrize("decision, match", [
    ("{tie_margin: 0.02, confirm_margin: 0.05}", r"plan.yaml: selection.decision.confirm_margin \(0.05\) is above "
                                                 r"tie_margin \(0.02\)"),
    ("{tie_margin: 0.02, confirm_margin: -0.01}", r"plan.yaml: selection.decision.confirm_margin must be >= 0"),
    ("{tie_margin: 0.02, confirm_margin: low}", r"plan.yaml: selection.decision.confirm_margin must be a number"),
])
def test_plan_confirm_margin_is_checked(tmp_path, decision, match):
    from probeselect.errors import ProbeSpecError
    from probeselect.plan import load_selection_plan

    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.replace("decision: {tie_margin: 0.02}", f"decision: {decision}"))
    with pytest.raises(ProbeSpecError, match=match):
        load_selection_plan(p)


def test_plan_confirm_margin_is_written_only_when_set(tmp_path):
    from probeselect.plan import load_selection_plan

    p = tmp_path / "plan.yaml"
    p.write_text(PLAN)
    assert "confirm_margin" not in load_selection_plan(p).selection.to_dict()["decision"]
    p.write_text(PLAN.replace("decision: {tie_margin: 0.02}", "decision: {tie_margin: 0.02, confirm_margin: 0}"))
    spec = load_selection_plan(p).selection
    assert spec.confirm_margin == 0.0 and spec.to_dict()["decision"]["confirm_margin"] == 0.0


# --- seed-sensitive bases: an outcome that depends on the SFT seed far more than the others' ---

_BIMODAL = {"A": [0.97, 0.95, 0.99, 0.98, 0.96, 0.97],
            "B": [0.99, 0.98, 0.99, 0.98, 0.98, 0.97],
            "L": [0.79, 0.76, 0.99, 0.79, 0.79, 0.99]}     # SFT undoes the defect under two seeds only


def test_seed_sensitive_flags_a_bimodal_base_and_leaves_the_verdict_alone(tmp_path):
    from probeselect.select import SPREAD_RATIO, seed_sensitive

    spec = SelectionSpec(tie_margin=0.02, min_sft_seeds=6, against="latest")
    r = rank_bases(_tables(tmp_path, _BIMODAL), spec, default="L")
    assert r.seed_sensitive == ["L"] and r.summary(spec)["seed_sensitive"] == ["L"]
    sd = {b: np.std(v, ddof=1) for b, v in _BIMODAL.items()}
    ratio = sd["L"] / np.median([sd["A"], sd["B"]])
    assert ratio > SPREAD_RATIO
    note = next(n for n in r.notes if n.startswith("L: its fine-tuning outcome varies"))
    assert f"seed sd {sd['L']:.3g}, {ratio:.1f}x" in note and "seed values 0.76 to 0.99" in note
    assert "Add SFT seeds" in note
    # the flag describes; the rule decides as without it (same tables, flag threshold out of reach)
    assert seed_sensitive(np.array(list(_BIMODAL.values())), list(_BIMODAL), ratio=ratio + 0.01) == []
    assert r.verdict == "no_clear_winner" and r.default_ci[0] < 0.02


@pytest.mark.parametrize("values", [
    _AGAINST,                                                  # ordinary seed noise: nothing flagged
    {b: v[:2] for b, v in _BIMODAL.items()},                   # 2 seeds: an sd ratio means nothing
    {"L": _BIMODAL["L"]},                                      # one base: nothing to compare with
    {"A": _BIMODAL["A"], "L": _BIMODAL["L"]},                  # two: L's spread, or A's steadiness?
    {"A": [0.9] * 6, "B": [0.8] * 6, "L": _BIMODAL["L"]},      # the others have no spread: no ratio
])
def test_seed_sensitive_needs_seeds_and_a_reference(tmp_path, values):
    from probeselect.select import seed_sensitive

    notes = []
    assert seed_sensitive(np.array(list(values.values()), float), list(values), notes) == [] and notes == []
    r = rank_bases(_tables(tmp_path, values), SelectionSpec(tie_margin=0.02, min_sft_seeds=2))
    assert r.seed_sensitive == [] and "seed_sensitive" not in r.summary(SelectionSpec(tie_margin=0.02))
