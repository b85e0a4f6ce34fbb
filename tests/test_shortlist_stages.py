"""Characterization of :func:`probeselect.shortlist.shortlist` across its stages.

Golden values: sha256 hashes PINNED from the code before it was split into stages
(commit 20518a0), one per case. Each hash covers the bytes of ``shortlist.csv``, the whole
``shortlist.json`` except the fields that name the time, machine and git state
(``created_utc``, ``command``, ``platform``, ``versions``, ``git``; the lock time in the
post-hoc note is replaced by ``<LOCKED>``), the returned table's
columns and dtypes, ``selected``, ``notes``, ``excluded`` and the output paths (the test's
temporary folder replaced by ``<TMP>``). The cases use the 6-checkpoint run of
tests/test_shortlist.py: plain top k with a one-probe winner, median rank, a tie at the cut,
held-out bpb limits (relative, spread) with capability floors (one variant, every variant),
a short shortlist, multi-way ties on a proxy (an all-way tie and a 2-way first place), a
checkpoint missing a proxy value, a candidates list without held-out NLL, strata by steps,
tokens and data windows, a locked plan, a post-hoc plan, a plan edited after scoring, and an
``out_dir``. A changed hash means an output changed: compare with the old code before
updating it. tests/test_shortlist.py checks the same cases against hand-computed values.
"""

from __future__ import annotations

import hashlib
import json
import os

import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json
from probeselect.shortlist import shortlist
from test_shortlist import PROXIES, _lineage, _summary, _with_flat, run  # noqa: F401  (run: the fixture)

VOLATILE = ("created_utc", "command", "platform", "cpu", "versions", "git")
FLAT = PROXIES.replace("  - {family: rel, variant: x, metric: mean_margin}\n",
                       "  - {family: flat, variant: x, metric: mean_margin}\n")
TWO = """
proxies:
  - {family: cap, variant: x, metric: candidate_accuracy}
  - {family: rel, variant: x, metric: mean_margin}
"""
FLOORS = ("constraints:\n  heldout_bpb_within: {relative: 0.02}\n  capability_floor:\n"
          "    - {family: cap, variant: x, metric: candidate_accuracy, min: 0.55}\n")
FLOORS_ALL = ("constraints:\n  heldout_bpb_within: {spread: 0.5}\n  capability_floor:\n"
              "    - {family: conf, metric: mean_margin, min: 0.3}\n")


def _no_nll(run, tmp_path):
    atomic_write_csv(run / "summary.csv", _summary(with_nll=False))


def _missing_value(run, tmp_path):
    s = pd.read_csv(run / "summary.csv")
    atomic_write_csv(run / "summary.csv", s[~((s["checkpoint"] == "c2") & (s["family"] == "rel"))])


def _scored_before_plan(run, tmp_path):
    atomic_write_json(run / "manifest.json", {"status": "complete", "created_utc": "2000-01-01T00:00:00+00:00"})


CASES = {
    # name: (plan text, how the run is changed first, after-plan step, out_dir under tmp)
    "plain-one-probe-winner": (PROXIES + "k: 3\n", None, None, None),
    "median-rank": (PROXIES + "aggregation: median_rank\nk: 2\n", None, None, None),
    "tie-at-the-cut": (TWO + "k: 2\n", None, None, None),
    "bpb-relative-and-floor": (PROXIES + FLOORS + "k: 3\n", None, None, None),
    "bpb-spread-and-floor-over-variants": (PROXIES + FLOORS_ALL + "k: 3\n", None, None, None),
    "short-shortlist": (PROXIES + "k: 6\n", None, None, None),
    "all-way-tie": (FLAT + "k: 6\n", lambda r, t: _with_flat(r, [-2.5] * 6), None, None),
    "two-way-first-place": (FLAT + "k: 6\n", lambda r, t: _with_flat(r, [1.0, 1.0, 0, 0, 0, 0]), None, None),
    "missing-proxy-value": (PROXIES + "k: 3\n", _missing_value, None, None),
    "candidates-without-nll": (PROXIES + "constraints: {heldout_bpb_within: 0.05}\nk: 3\ncandidates: [c3, c4, 5]\n",
                               _no_nll, None, None),
    "strata-steps-4": (PROXIES + "k: 4\nstratify: {by: steps, strata: 4}\n", None, None, None),
    "strata-tokens-edges": (PROXIES + "k: 2\nstratify: {by: tokens, edges: [1500]}\n", None, None, None),
    "strata-data-windows": (PROXIES + "k: 3\nstratify: data_windows\n", _lineage, None, None),
    "locked-plan": (PROXIES + "k: 3\n", None, "lock", None),
    "post-hoc-plan": (PROXIES + "k: 3\n", None, "post_hoc", None),
    "plan-edited-after-scoring": (PROXIES + "k: 3\n", _scored_before_plan, None, "elsewhere"),
}

GOLDEN = {
    "plain-one-probe-winner": "84a5a93f46530862ff24f6e47f44029904e061482385d3c1fc3d26149a5ef1ef",
    "median-rank": "67c69e7600dfb3360882faefe716f06a5872833c55c8415462fdbdf3f4b410ed",
    "tie-at-the-cut": "8bc967bcf95b729c1733f9eafb57821107639ee835f05d30fe4c1886bb8c7fcf",
    "bpb-relative-and-floor": "ac921e85df96742518f73c61f179767c7a202fb02aa3437f2f9cd77e46acc24c",
    "bpb-spread-and-floor-over-variants": "ba361735295239e88a2c24fad04fb97b5ddfe367ad4e82e5386b1c7075d3d875",
    "short-shortlist": "c9d32a5aaa64d7befec5e3c0c57ddc1b70ff5a03b08b9e3f0263a592a6dd5ed0",
    "all-way-tie": "0aaa56ce08a3077ad2f015245cef936543bd73c6485614c310e7bfbb80236055",
    "two-way-first-place": "c56909a6f42762a1b29c68f9df06197c4d8b1992303cf4e2893647fa7658f68f",
    "missing-proxy-value": "7e93785a475436e963926ffc5a0c2b02ace9d3899eb24fd7263debe5e1803b61",
    "candidates-without-nll": "e64e1453777778d6270256c3289ec4c55e80251ce63c7f4fa92d15d1f50cb04f",
    "strata-steps-4": "134b1e9192ba77485094c6b26bc35da86bca33b30a67778ebd7827020f2b0447",
    "strata-tokens-edges": "8dd4cf934606f20f241c6a11a327be5612fa0d4c114d422c101381a4a9580794",
    "strata-data-windows": "54ea9e93880baaea422cb5b07e79bf4f6d26623fd153cd37c9235e79806c42a0",
    "locked-plan": "e09d5ac494fa695d584f23abbc31a5ba0c370928d140eda6cb0bc9776ca7e04f",
    "post-hoc-plan": "dd1c5d638b7a3c6707d3eda9ac7696cb546cfb085f1e07c1b8fc67b16cf7c515",
    "plan-edited-after-scoring": "4f4d58dce827d7376467e8f7f288f9767624ace1dcc507cf56fb49115e11404d",
}


def _canonical(res, run, tmp_path) -> str:
    tmp = str(tmp_path)
    man = json.loads(res.json_path.read_text())
    rec = {
        "csv": res.csv_path.read_text(),
        "json": {k: v for k, v in man.items() if k not in VOLATILE},
        "columns": list(res.table.columns),
        "dtypes": [str(t) for t in res.table.dtypes],
        "selected": res.selected,
        "notes": res.notes,
        "excluded": res.excluded,
        "paths": [str(res.csv_path), str(res.json_path)],
        "plan": res.plan.to_dict(),
    }
    text = json.dumps(rec, sort_keys=True, default=str).replace(tmp, "<TMP>")
    lock = run / "plan.lock.json"
    if lock.is_file():  # the post-hoc note names the time of the lock
        text = text.replace(json.loads(lock.read_text())["locked_utc"], "<LOCKED>")
    return text


@pytest.mark.parametrize("case", list(CASES))
def test_shortlist_matches_the_pinned_outputs(case, tmp_path, run):
    from probeselect.plan import lock_plan

    text, change, after, out = CASES[case]
    if change is not None:
        change(run, tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    os.utime(plan, (1e9, 1e9))  # 2001-09-09: a fixed modification time for the predeclared note
    if after in ("lock", "post_hoc"):
        lock_plan(plan, run, allow_weak=True)
    if after == "post_hoc":
        plan.write_text(text + "# edited after the lock\n")
        os.utime(plan, (1e9, 1e9))
    res = shortlist(run, plan, out_dir=tmp_path / out if out else None)
    digest = hashlib.sha256(_canonical(res, run, tmp_path).encode()).hexdigest()
    assert digest == GOLDEN.get(case), case
