"""Shortlist: ranks, aggregation, constraints, one-probe winners, variant stability, plan validation."""

import json
from pathlib import Path

import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json
from probeselect.errors import ProbeSpecError
from probeselect.shortlist import load_plan, shortlist

REPO = Path(__file__).resolve().parents[1]
CKPTS = [f"c{i}" for i in range(1, 7)]
# conf (3 prompt variants, mean_margin): c6 is best on every variant.
CONF = {"a": [0.1, 0.2, 0.5, 0.4, 0.3, 0.9], "b": [0.1, 0.3, 0.6, 0.5, 0.2, 0.9], "c": [0.2, 0.1, 0.4, 0.6, 0.45, 0.9]}
CAP = [0.3, 0.5, 0.8, 0.6, 0.7, 0.4]  # cap/x candidate_accuracy: c6 in the bottom half
REL = [-1.0, 0.0, 2.0, 1.5, 1.0, -0.5]  # rel/x mean_margin: c6 in the bottom half
BPB = [1.50, 1.40, 1.46, 1.30, 1.33, 1.31]


def _summary(with_nll=True):
    rows = []
    for i, ck in enumerate(CKPTS):
        base = dict(checkpoint=ck, step=i + 1, tokens=(i + 1) * 1000)
        for v, vals in CONF.items():
            rows.append(dict(base, family="conf", variant=v, kind="conflict", mean_margin=vals[i], accuracy=0.5,
                             candidate_accuracy=0.5))
        rows.append(dict(base, family="cap", variant="x", kind="capability", mean_margin=0.0, accuracy=0.5,
                         candidate_accuracy=CAP[i]))
        rows.append(dict(base, family="rel", variant="x", kind="capability", mean_margin=REL[i], accuracy=0.5,
                         candidate_accuracy=0.5))
        if with_nll:
            rows.append(dict(base, family="heldout_nll", variant="bpb", kind="nll", bits_per_byte=BPB[i]))
    return pd.DataFrame(rows)


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    atomic_write_csv(d / "summary.csv", _summary())
    atomic_write_json(d / "manifest.json", {"status": "complete", "created_utc": "2999-01-01T00:00:00+00:00"})
    return d


PROXIES = """
proxies:
  - {family: conf, variant: "*", metric: mean_margin, direction: higher}
  - {family: cap, variant: x, metric: candidate_accuracy}
  - {family: rel, variant: x, metric: mean_margin}
"""


def _lineage(run, tmp_path, extra=()):
    """Put the run's checkpoints in a ladder folder with a data_lineage.json of windows A (steps 1-2),
    B (3-4, planted) and C (5-6), plus ``extra`` windows."""
    ladder = tmp_path / "ladder"
    ladder.mkdir()
    atomic_write_json(run / "manifest.json", {"status": "complete", "created_utc": "2999-01-01T00:00:00+00:00",
                                              "checkpoints": [{"name": c, "path": str(ladder / c)} for c in CKPTS]})
    atomic_write_json(ladder / "data_lineage.json", {"windows": [
        {"name": "A", "start_step": 0, "end_step": 2, "planted": None},
        {"name": "B", "start_step": 2, "end_step": 4, "planted": "parrot"},
        {"name": "C", "start_step": 4, "end_step": 6, "planted": None}, *extra]})


def _plan(tmp_path, text, name="plan.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_ranks_one_probe_winner_and_variant_stability(tmp_path, run):
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 3\n"))
    t = res.table.set_index("checkpoint")
    # per-variant ranks of conf (c6 first everywhere; c3/c4 tie on the mean per-variant rank)
    assert t["rank[conf/a:mean_margin]"].tolist() == [6, 5, 2, 3, 4, 1]
    assert t["rank[conf/c:mean_margin]"].tolist() == [5, 6, 4, 2, 3, 1]
    assert t["rank[conf/*:mean_margin]"].tolist() == [6, 5, 2.5, 2.5, 4, 1]
    assert t["rank[cap/x:candidate_accuracy]"].tolist() == [6, 4, 1, 3, 2, 5]
    assert t["rank[rel/x:mean_margin]"].tolist() == [6, 4, 1, 2, 3, 5]
    assert t["mean_rank"].tolist() == pytest.approx([6, 13 / 3, 1.5, 2.5, 3, 11 / 3])
    # fraction of the 3 conf variants on which each checkpoint is in the top k=3
    assert t["topk_frac[conf/*:mean_margin]"].tolist() == pytest.approx([0, 0, 2 / 3, 1, 1 / 3, 1])
    assert t["value[conf/*:mean_margin]"]["c6"] == pytest.approx(0.9)

    assert t["one_probe_winner"].tolist() == [False] * 5 + [True]
    assert t.loc["c6", "aggregate_rank"] == 4  # first on conf, but not first overall
    assert "one-probe winner" in t.loc["c6", "reason"] and "bottom half on 2 of 2" in t.loc["c6", "reason"]
    assert res.selected == ["c3", "c4", "c5"]
    assert t.loc["c3", "shortlist_position"] == 1 and t.loc["c3", "selected"]
    assert t.loc["c3", "reason"].startswith("shortlisted #1: mean rank 1.5")
    assert "top 3 on 67% of conf variants" in t.loc["c3", "reason"]
    assert t.loc["c2", "reason"].startswith("not shortlisted")
    assert set(res.excluded) == {"c1", "c2", "c6"}

    disk = pd.read_csv(run / "shortlist.csv")
    assert len(disk) == 6 and disk["selected"].sum() == 3
    for col in ("checkpoint", "step", "selected", "reason", "mean_rank", "one_probe_winner", "passes_constraints"):
        assert col in disk.columns
    meta = json.loads((run / "shortlist.json").read_text())
    assert [s["checkpoint"] for s in meta["selected"]] == ["c3", "c4", "c5"]
    assert meta["plan_sha256"] and meta["summary_sha256"] and "c6" in meta["one_probe_winners"]
    assert not any("modified" in n for n in res.notes)  # run "scored" after the plan was written


def test_references_pilot_the_naive_choices_next_to_the_shortlist(tmp_path, run):
    """``references: [latest, lowest_bpb]``: the latest candidate (c6, a one-probe winner the shortlist
    leaves out) is appended after the k shortlisted with its own reason; the lowest-bpb candidate (c4)
    is already shortlisted and is not added twice. Without the key the outputs have no reference column."""
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 3\nreferences: [latest, lowest_bpb]\n"))
    t = res.table.set_index("checkpoint")
    assert res.selected == ["c3", "c4", "c5", "c6"]
    assert t.loc["c6", "shortlist_position"] == 4 and t.loc["c6", "selected"]
    assert t.loc["c6", "reference"] == "latest" and t.loc["c4", "reference"] == "lowest_bpb"
    assert t.loc["c6", "reason"].startswith("reference #4 (the latest checkpoint): the naive choice")
    assert "one-probe winner" in t.loc["c6", "reason"]
    assert "c6" not in res.excluded
    assert any("reference lowest_bpb: c4 is already shortlisted" in n for n in res.notes)
    meta = json.loads((run / "shortlist.json").read_text())
    assert [s["checkpoint"] for s in meta["selected"]] == ["c3", "c4", "c5", "c6"]
    assert meta["selected"][-1]["reference"] == "latest" and "reference" not in meta["selected"][0]
    assert meta["plan"]["references"] == ["latest", "lowest_bpb"]
    # both rules on one checkpoint outside the shortlist: piloted once, named by both
    bpb = _summary()
    bpb.loc[(bpb.checkpoint == "c6") & (bpb.family == "heldout_nll"), "bits_per_byte"] = 1.0
    atomic_write_csv(run / "summary.csv", bpb)
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 3\nreferences: [latest, lowest_bpb]\n"))
    t = res.table.set_index("checkpoint")
    assert res.selected == ["c3", "c4", "c5", "c6"] and t.loc["c6", "reference"] == "latest, lowest_bpb"
    assert t.loc["c6", "reason"].startswith("reference #4 (the latest checkpoint and the lowest held-out bits per byte)")
    plain = shortlist(run, _plan(tmp_path, PROXIES + "k: 3\n"))
    assert "reference" not in plain.table.columns and plain.selected == ["c3", "c4", "c5"]
    assert "references" not in json.loads((run / "shortlist.json").read_text())["plan"]


def test_lowest_bpb_reference_is_among_the_candidates_and_a_tie_goes_to_the_earlier_step(tmp_path, run):
    """``lowest_bpb`` picks among the plan's candidates only (c4, the run's lowest, is not one), by the
    mean of each checkpoint's held-out NLL rows (NaN rows skipped); an exact tie goes to the earlier
    step. The ``heldout_bpb`` column holds the same means for every checkpoint."""
    s = _summary()
    nll = s[s.family == "heldout_nll"]
    extra = nll[nll.checkpoint.isin(["c5", "c2"])].copy()
    extra["bits_per_byte"] = [float("nan"), 1.5]  # c2: 1.40 and NaN -> 1.40; c5: mean(1.25, 1.5) = 1.375
    s.loc[(s.checkpoint == "c5") & (s.family == "heldout_nll"), "bits_per_byte"] = 1.25
    s = pd.concat([s, extra], ignore_index=True)
    s.loc[(s.checkpoint == "c6") & (s.family == "heldout_nll"), "bits_per_byte"] = 1.375  # ties c5
    atomic_write_csv(run / "summary.csv", s)
    plan = PROXIES + "k: 2\ncandidates: [c1, c2, c3, c5, c6]\nreferences: [lowest_bpb]\n"
    res = shortlist(run, _plan(tmp_path, plan + "constraints: {heldout_bpb_within: 1.0}\n"))
    t = res.table.set_index("checkpoint")
    assert t["reference"].tolist() == ["", "", "", "", "lowest_bpb", ""]
    assert t["heldout_bpb"].tolist() == pytest.approx([1.50, 1.40, 1.46, 1.30, 1.375, 1.375])
    assert "c5" in res.selected and "c4" not in res.selected


def test_constraints_exclude_with_reasons(tmp_path, run):
    plan = PROXIES + """
constraints:
  heldout_bpb_within: 0.05
  capability_floor:
    - {family: cap, metric: candidate_accuracy, min: 0.55}
k: 3
"""
    res = shortlist(run, _plan(tmp_path, plan))
    t = res.table.set_index("checkpoint")
    assert t["pass_heldout_bpb"].tolist() == [False, False, False, True, True, True]  # best 1.30, limit 1.35
    assert t["pass_capability[cap/*:candidate_accuracy]"].tolist() == [False, False, True, True, True, False]
    assert res.selected == ["c4", "c5"]  # c3 fails bpb, c6 is a one-probe winner
    assert "held-out bpb 1.4600 is more than 0.05 above the best candidate (1.3000)" in t.loc["c3", "reason"]
    assert t.loc["c3", "reason"].startswith("excluded:")
    assert "cap/*:candidate_accuracy 0.3 < floor 0.55" in t.loc["c1", "reason"]
    assert not t.loc["c3", "passes_constraints"] and t.loc["c4", "passes_constraints"]
    assert "passes held-out bpb 1.3000 <= 1.3500" in t.loc["c4", "reason"]
    assert any("only 2 checkpoint(s) are eligible" in n for n in res.notes)


def test_missing_nll_is_skipped_with_a_note(tmp_path):
    d = tmp_path / "run"
    atomic_write_csv(d / "summary.csv", _summary(with_nll=False))
    atomic_write_json(d / "manifest.json", {"status": "complete", "created_utc": "2000-01-01T00:00:00+00:00"})
    res = shortlist(d, _plan(tmp_path, PROXIES + "constraints: {heldout_bpb_within: 0.05}\n"))
    assert any("heldout_bpb_within skipped" in n for n in res.notes)
    assert res.selected == ["c3", "c4", "c5"]
    assert any("after the run was scored" in n for n in res.notes)  # plan written after the run


def test_candidates_restrict_the_ranking(tmp_path, run):
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 1\ncandidates: [c3, c4, 5]\n"))
    t = res.table.set_index("checkpoint")
    assert t.loc[["c3", "c4", "c5"], "rank[rel/x:mean_margin]"].tolist() == [1, 2, 3]
    assert pd.isna(t.loc["c1", "mean_rank"]) and t.loc["c1", "reason"].startswith("not a candidate")
    assert res.selected == ["c3"]


@pytest.mark.parametrize("text, match", [
    (PROXIES + "proxy: []\n", r"unknown key 'proxy'\. Did you mean \"proxies\""),
    (PROXIES.replace("metric: mean_margin, direction", "metirc: mean_margin, direction"), r"Did you mean \"metric\""),
    (PROXIES + "aggregation: borda\n", "aggregation 'borda' is not supported"),
    (PROXIES + "k: 0\n", "k must be a positive integer"),
    (PROXIES + "constraints: {heldout_bpb: 0.1}\n", r"Did you mean \"heldout_bpb_within\""),
    (PROXIES + "constraints: {capability_floor: [{family: cap, metric: accuracy}]}\n", "missing required key `min`"),
    (PROXIES.replace("direction: higher", "direction: up"), "direction must be 'higher' or 'lower'"),
    ("proxies:\n  - {family: conf, metric: mean_margin}\n", "only one proxy"),
    (PROXIES + "  - {family: conf, variant: '*', metric: mean_margin}\n", "listed twice"),
    (PROXIES + "k: 2\nk: 3\n", "duplicate key"),
    (PROXIES + "references: [newest]\n", "references must be a list of distinct naive choices"),
    (PROXIES + "references: [window_end]\n", r"Did you mean \"window_ends\""),
    (PROXIES + "references: [latest, latest]\n", "distinct"),
    (PROXIES + "references: latest\n", "must be a list"),
])
def test_bad_plans_are_rejected(tmp_path, run, text, match):
    with pytest.raises(ProbeSpecError, match=match):
        shortlist(run, _plan(tmp_path, text))


@pytest.mark.parametrize("text, match", [
    (PROXIES.replace("family: rel", "family: rell"), r"family 'rell' is not in this run\. Did you mean \"rel\""),
    (PROXIES.replace("variant: x, metric: candidate", "variant: y, metric: candidate"), "has no variant 'y'"),
    (PROXIES.replace("metric: candidate_accuracy", "metric: candidate_acc"), r"not a numeric summary.csv column"),
    (PROXIES.replace("metric: candidate_accuracy", "metric: bits_per_byte"), "no bits_per_byte values for family 'cap'"),
    (PROXIES + "candidates: [c3, c9]\n", "candidate 'c9' is not a checkpoint of this run"),
])
def test_plan_must_match_the_run(tmp_path, run, text, match):
    with pytest.raises(ProbeSpecError, match=match) as exc:
        shortlist(run, _plan(tmp_path, text))
    assert "plan.yaml" in str(exc.value)


def test_every_recipe_plan_is_valid():
    plans = [p for p in sorted((REPO / "recipes").rglob("*.y*ml")) if "proxies:" in p.read_text()]
    assert plans, "recipes/selection.yaml is missing"
    for p in plans:
        plan = load_plan(p)
        assert len(plan.proxies) >= 2 and plan.k >= 1
    text = (REPO / "recipes" / "selection.yaml").read_text()
    assert "probeselect shortlist" in text.splitlines()[1]


def test_ranks_and_scores_are_oriented(tmp_path, run):
    """bits per byte ranks lowest first without a `direction:`; score[...] is the oriented
    quantity that is ranked (higher = better), which proxy validation correlates."""
    plan = PROXIES.replace("  - {family: rel, variant: x, metric: mean_margin}\n",
                           "  - {family: heldout_nll, variant: bpb, metric: bits_per_byte}\n")
    t = shortlist(run, _plan(tmp_path, plan + "k: 2\n")).table.set_index("checkpoint")
    assert t["rank[heldout_nll/bpb:bits_per_byte]"].tolist() == [6, 4, 5, 1, 3, 2]  # BPB 1.50 1.40 1.46 1.30 1.33 1.31
    assert t["score[heldout_nll/bpb:bits_per_byte]"].tolist() == pytest.approx([-b for b in BPB])
    # a "*" proxy is ranked by its mean per-variant rank: the score is minus that mean
    per_var = t[["rank[conf/a:mean_margin]", "rank[conf/b:mean_margin]", "rank[conf/c:mean_margin]"]].mean(axis=1)
    assert t["score[conf/*:mean_margin]"].tolist() == pytest.approx((-per_var).tolist())
    for col in [c for c in t.columns if c.startswith("score[")]:
        pid = col[len("score["):-1]
        assert (t[col].rank(ascending=False) == t[f"rank[{pid}]"]).all(), pid  # higher score = better rank


def test_stratify_by_data_windows(tmp_path, run):
    """`stratify: data_windows`: the best eligible overall, then the best of each other window."""
    plan = _plan(tmp_path, PROXIES + "k: 3\nstratify: data_windows\n")
    # without a lineage file: an error naming the step-range alternative, never a silent top k
    with pytest.raises(ProbeSpecError, match=r"plan\.yaml: stratify: data_windows needs data_lineage\.json.*"
                                             r"stratify: \{by: steps, strata: 3\}"):
        shortlist(run, plan)
    assert not (run / "shortlist.csv").exists()
    _lineage(run, tmp_path)
    res = shortlist(run, plan)
    # mean ranks: c3 1.5 (B), c4 2.5 (B), c5 3 (C), c2 4.33 (A); c6 is a one-probe winner (excluded)
    assert res.selected == ["c3", "c5", "c2"]
    t = res.table.set_index("checkpoint")
    assert t.loc[["c1", "c2", "c3", "c4", "c5", "c6"], "data_window"].tolist() == ["A", "A", "B", "B", "C", "C"]
    assert "as the best of data window 'A'" in t.loc["c2", "reason"]
    assert "best of data window" not in t.loc["c3", "reason"]
    assert any("stratified by data window" in n for n in res.notes)
    assert json.loads((run / "shortlist.json").read_text())["plan"]["stratify"] == "data_windows"
    with pytest.raises(ProbeSpecError, match="stratify"):
        load_plan(_plan(tmp_path, PROXIES + "stratify: windows\n", "bad.yaml"))


def test_window_ends_reference_pilots_the_last_base_of_every_data_window(tmp_path, run):
    """``references: [latest, window_ends]``: the last candidate of each data window (c2 of A, c4 of B,
    c6 of C) is piloted next to the shortlist; c4 is already shortlisted, c6 is also the latest (named by
    both rules, piloted once). Without data_lineage.json it is an error naming the plan, never a silent
    omission; a window with no candidate names none."""
    plan = _plan(tmp_path, PROXIES + "k: 3\nreferences: [latest, window_ends]\n")
    with pytest.raises(ProbeSpecError, match=r"plan\.yaml: references: \[window_ends\] needs data_lineage\.json"):
        shortlist(run, plan)
    assert not (run / "shortlist.csv").exists()
    _lineage(run, tmp_path, extra=[{"name": "D", "start_step": 6, "end_step": 9, "planted": None}])
    res = shortlist(run, plan)
    t = res.table.set_index("checkpoint")
    assert res.selected == ["c3", "c4", "c5", "c6", "c2"]
    assert t["reference"].tolist() == ["", "window_end:A", "", "window_end:B", "", "latest, window_end:C"]
    assert t.loc["c2", "reason"].startswith("reference #5 (the last base of data window 'A'): a lineage choice, "
                                            "piloted next to the shortlist")
    assert t.loc["c6", "reason"].startswith("reference #4 (the latest checkpoint and the last base of data window "
                                            "'C'): the naive choice")
    assert any("reference window_end:B: c4 is already shortlisted" in n for n in res.notes)
    assert any("no candidate checkpoint in data window(s) D; nothing piloted for them" in n for n in res.notes)
    assert any("reference window_end:A: c2 is piloted next to the shortlist (the last base of data window 'A', "
               "before the data changed)" in n for n in res.notes)
    meta = json.loads((run / "shortlist.json").read_text())
    assert meta["plan"]["references"] == ["latest", "window_ends"]
    # three rules on one checkpoint (c6 made the lowest bpb too): named once each, in a readable list
    low6 = _summary()
    low6.loc[(low6.checkpoint == "c6") & (low6.family == "heldout_nll"), "bits_per_byte"] = 1.0
    atomic_write_csv(run / "summary.csv", low6)
    three = shortlist(run, _plan(tmp_path, PROXIES + "k: 3\nreferences: [latest, lowest_bpb, window_ends]\n", "three.yaml"))
    assert three.table.set_index("checkpoint").loc["c6", "reason"].startswith(
        "reference #4 (the latest checkpoint, the lowest held-out bits per byte and the last base of data window 'C'): "
        "the naive choice")
    atomic_write_csv(run / "summary.csv", _summary())
    assert [s.get("reference") for s in meta["selected"]] == [None, None, None, "latest, window_end:C", "window_end:A"]
    # candidates restrict the window ends too: B's last candidate is then c3
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 2\ncandidates: [c1, c2, c3, c5]\nreferences: [window_ends]\n",
                               "sub.yaml"))
    assert res.table.set_index("checkpoint")["reference"].to_dict() == {
        "c1": "", "c2": "window_end:A", "c3": "window_end:B", "c4": "", "c5": "window_end:C", "c6": ""}


@pytest.mark.parametrize("stratify, k, selected, labels", [
    # mean ranks: c3 1.5, c4 2.5, c5 3, c2 4.33, c1 6; c6 is a one-probe winner (excluded)
    ("{by: steps, strata: 3}", 3, ["c3", "c5", "c2"], ["steps 1-2"] * 2 + ["steps 3-4"] * 2 + ["steps 5-6"] * 2),
    ("{by: steps, edges: [2, 4]}", 3, ["c3", "c5", "c2"], ["steps 1-2"] * 2 + ["steps 3-4"] * 2 + ["steps 5-6"] * 2),
    ("{by: tokens, edges: [1500]}", 2, ["c3", "c1"], ["tokens 1000"] + ["tokens 2000-6000"] * 5),
    # 6 candidates in 4 strata: sizes 2, 2, 1, 1; stratum 'steps 6' has no eligible checkpoint (c6), so the
    # fourth place goes to the best remaining by aggregate (c4)
    ("{by: steps, strata: 4}", 4, ["c3", "c4", "c5", "c2"], ["steps 1-2"] * 2 + ["steps 3-4"] * 2 + ["steps 5"]
     + ["steps 6"]),
])
def test_stratify_by_step_or_token_ranges_without_lineage(tmp_path, run, stratify, k, selected, labels):
    """Strata by step/token ranges need no data_lineage.json: the best eligible overall, then
    the best of each other stratum; the strata depend only on the ladder's positions."""
    res = shortlist(run, _plan(tmp_path, PROXIES + f"k: {k}\nstratify: {stratify}\n"))
    assert res.selected == selected
    t = res.table.set_index("checkpoint")
    assert t.loc[CKPTS, "stratum"].tolist() == labels
    assert any("strata fixed by the plan before the scores" in n for n in res.notes)
    plain = ["c3", "c4", "c5", "c2", "c1"][:k]  # the unstratified top k
    for c in selected:  # behind the plain top k: shortlisted for its stratum, and the reason says so
        assert (f"as the best of stratum {t.loc[c, 'stratum']!r}" in t.loc[c, "reason"]) == (c not in plain)
    assert json.loads((run / "shortlist.json").read_text())["plan"]["stratify"]["by"] in ("steps", "tokens")


@pytest.mark.parametrize("text, match", [
    ("stratify: {by: steps, strata: 7}\n", r"stratify\.strata = 7 but the run has 6 candidate"),
    ("stratify: {by: epochs, strata: 2}\n", r"stratify\.by must be one of"),
    ("stratify: {by: steps}\n", r"exactly one of `strata: N`"),
    ("stratify: {by: steps, strata: 2, edges: [3]}\n", r"exactly one of `strata: N`"),
    ("stratify: {by: steps, edges: [4, 2]}\n", r"strictly increasing"),
    ("stratify: {by: steps, strata: 1}\n", r"integer >= 2"),
    ("stratify: steps\n", r"stratify must be null, 'data_windows'"),
])
def test_bad_stratify_is_rejected(tmp_path, run, text, match):
    with pytest.raises(ProbeSpecError, match=match):
        shortlist(run, _plan(tmp_path, PROXIES + text))


def _with_flat(run, values):
    """Add a family `flat` whose mean_margin is ``values`` per checkpoint (c1..c6)."""
    s = pd.read_csv(run / "summary.csv")
    extra = pd.DataFrame([dict(checkpoint=ck, step=i + 1, tokens=(i + 1) * 1000, family="flat", variant="x",
                               kind="conflict", mean_margin=v, accuracy=0.0, candidate_accuracy=0.0)
                          for i, (ck, v) in enumerate(zip(CKPTS, values))])
    atomic_write_csv(run / "summary.csv", pd.concat([s, extra], ignore_index=True))


@pytest.mark.parametrize("values, winners", [
    ([-2.5] * 6, []),                          # all-way tie: the proxy is constant, nobody is first on it
    # 4 of 6 share first place: singles nobody out (c6, first on conf and bottom on cap and flat, still is one)
    ([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], ["c6"]),
    ([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], ["c1", "c2", "c6"]),  # a 2-way tie at the top still picks c1 and c2 out
])
def test_a_multi_way_tie_is_never_a_one_probe_winner(tmp_path, run, values, winners):
    """conf ranks c1 6, c2 5 and cap ranks c1 6, c2 4 (bottom half on both): being tied first
    on a proxy with most candidates makes neither a one-probe winner (the old rule excluded
    c1 and c2 as 'first on flat (tied with 5 others)')."""
    _with_flat(run, values)
    proxies = PROXIES.replace("  - {family: rel, variant: x, metric: mean_margin}\n",
                              "  - {family: flat, variant: x, metric: mean_margin}\n")
    res = shortlist(run, _plan(tmp_path, proxies + "k: 6\n"))
    t = res.table.set_index("checkpoint")
    assert sorted(t.index[t["one_probe_winner"]]) == winners
    assert sorted(res.excluded) == winners
    for c in set(winners) - {"c6"}:
        assert "first on flat/x:mean_margin (tied with 1 other)" in t.loc[c, "reason"]
    assert any(f"only {6 - len(winners)} checkpoint(s)" in n for n in res.notes) == bool(winners)
    assert any("proxy flat/x:mean_margin ranks every candidate the same" in n for n in res.notes) == (len(set(values)) == 1)


def test_short_shortlist_note_counts_what_passed(tmp_path, run):
    """The note separates checkpoints that pass the constraints from one-probe winners."""
    res = shortlist(run, _plan(tmp_path, PROXIES + "k: 6\n"))
    assert res.selected == ["c3", "c4", "c5", "c2", "c1"]
    note = next(n for n in res.notes if n.startswith("only 5 checkpoint(s) are eligible"))
    assert "6 of 6 candidates have a value on every proxy and pass the constraints" in note
    assert "1 of them (c6) are excluded as one-probe winners" in note


@pytest.mark.parametrize("within, passing", [
    ("0.05", ["c4", "c5", "c6"]),                             # absolute: best 1.30 + 0.05
    ("{absolute: 0.05}", ["c4", "c5", "c6"]),
    ("{relative: 0.02}", ["c4", "c6"]),                       # 1.30 x 1.02 = 1.326
    ("{spread: 0.5}", ["c2", "c4", "c5", "c6"]),              # 1.30 + 0.5 x (1.50 - 1.30) = 1.40
    ("{spread: 0}", ["c4"]),
    ("{spread: 1}", CKPTS),
])
def test_heldout_bpb_within_absolute_relative_or_spread(tmp_path, run, within, passing):
    res = shortlist(run, _plan(tmp_path, PROXIES + f"constraints: {{heldout_bpb_within: {within}}}\nk: 3\n"))
    t = res.table.set_index("checkpoint")
    assert list(t.index[t["pass_heldout_bpb"].astype(bool)]) == passing
    if "relative" in within:
        assert "more than 0.02 x the best candidate's 1.3000 above it (limit 1.3260)" in t.loc["c5", "reason"]
    if "spread: 0.5" in within:
        assert "0.5 of the candidates' range 1.3000-1.5000 above the best (limit 1.4000)" in t.loc["c3", "reason"]


@pytest.mark.parametrize("within, match", [
    ("{relativ: 0.02}", r"Did you mean \"relative\""),
    ("{spread: 2}", r"fraction of the candidates' range"),
    ("{relative: -0.1}", r"must be >= 0"),
    ("{relative: 0.1, spread: 0.2}", r"must be a number .* or one of"),
])
def test_bad_heldout_bpb_within_is_rejected(tmp_path, run, within, match):
    with pytest.raises(ProbeSpecError, match=match):
        shortlist(run, _plan(tmp_path, PROXIES + f"constraints: {{heldout_bpb_within: {within}}}\n"))


def test_window_ends_on_a_built_late_harm_ladder(tmp_path):
    """End to end at toy scale: a tiny late-harm ladder (its data_lineage.json written by the build),
    scored on two conflict families, shortlisted with ``references: [window_ends]``: every data window's
    piloted reference is its checkpoint of the highest step, read from the lineage the build wrote."""
    import dataclasses

    from probeselect.attribution import load_windows
    from probeselect.checkpoints import discover_checkpoints
    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from probeselect.toy.ladder import build_toy_ladder

    lad = tmp_path / "ladder"
    build_toy_ladder(lad, seed=0, steps=30, save_every=5, progress=False, curriculum="late-harm")
    specs = [dataclasses.replace(load_spec(REPO / "probes" / f"{f}.yaml"), n_items=4)
             for f in ("arith_pattern", "tmpl_mismatch")]
    run = tmp_path / "score"
    score_checkpoints(discover_checkpoints(lad), specs, seeds=[0], out=run, audit_items=0, device="cpu",
                      progress=False)
    plan = _plan(tmp_path, "proxies:\n  - {family: arith_pattern, variant: '*', metric: mean_margin}\n"
                           "  - {family: tmpl_mismatch, variant: '*', metric: mean_margin}\n"
                           "k: 1\nreferences: [window_ends]\n")
    res = shortlist(run, plan)
    t = res.table.set_index("checkpoint")
    steps = t["step"].to_dict()
    want = {}
    for w in load_windows(lad / "data_lineage.json"):
        inside = [c for c, s in steps.items() if w.start_step < s <= w.end_step]
        want[max(inside, key=steps.get)] = f"window_end:{w.name}"
    assert len(want) == 3 and "checkpoint-30" in want  # three windows; the last one ends at the latest
    got = {c: r for c, r in t["reference"].items() if r}
    assert got == want
    assert set(want) <= set(res.selected)
