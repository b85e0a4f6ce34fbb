"""The decision report: both files written, HTML self-contained, summary and caveats present."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet
from probeselect.errors import ProbeselectError
from probeselect.manifest import base_manifest
from probeselect.report import Figure, Para, Section, Table, render_html, render_markdown, write_report
from probeselect.shortlist import shortlist
from probeselect.tables import summarize_scores

MEANS = {("conf", "a"): [0.5, -0.2, 0.4, 0.9, 0.1, 0.6], ("conf", "b"): [0.3, 0.1, -0.3, 0.8, 0.2, 0.7],
         ("cap", "x"): [0.1, 0.4, 0.6, 0.8, 0.9, 1.0]}


def _make_run(path, steps, shift=0.0):
    rows = []
    for (fam, var), means in MEANS.items():
        for step, m in zip(steps, means):
            for seed in (0, 1):
                for i, off in enumerate((-0.4, -0.1, 0.1, 0.4)):
                    mg = m + shift + off + (0.05 if seed else -0.05)
                    rows.append(dict(checkpoint=f"checkpoint-{step}", step=step, tokens=step * 64, family=fam,
                                     variant=var, seed=seed, item_id=f"{fam}/{var}/{i}", margin=mg,
                                     margin_per_token=mg / 2, correct=mg > 0, candidate_correct=mg > 0.2))
    scores = pd.DataFrame(rows)
    summary = summarize_scores(scores, n_boot=50)
    summary["kind"] = np.where(summary["family"] == "cap", "capability", "conflict")
    man = base_manifest("score", {"seeds": [0, 1]})
    man.update(status="complete", seeds=[0, 1], items_hash="abc123",
               checkpoints=[{"name": f"checkpoint-{s}", "step": s, "tokens": s * 64, "fingerprint": f"fp{s:04d}",
                             "tokenizer_hash": "tok", "path": f"/ladder/checkpoint-{s}"} for s in steps],
               probes=[{"family": "conf", "path": "probes/conf.yaml", "spec_hash": "spec1", "file_sha256": "f1",
                        "n_items_per_seed": 8}],
               created_utc="2000-01-01T00:00:00+00:00")
    atomic_write_parquet(path / "scores.parquet", scores)
    atomic_write_csv(path / "summary.csv", summary)
    atomic_write_json(path / "manifest.json", man)
    return path


PLAN = """
proxies:
  - {family: conf, variant: "*", metric: mean_margin}
  - {family: cap, variant: x, metric: candidate_accuracy}
k: 2
"""


def test_full_report_is_self_contained(tmp_path):
    run = _make_run(tmp_path / "run", [10, 20, 30, 40, 50, 60])
    _make_run(run / "averaged", [30, 40, 50, 60], shift=0.01)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    sl = shortlist(run, plan)
    md_path, html_path = write_report(run)
    assert md_path == run / "report.md" and html_path == run / "report.html"
    md, page = md_path.read_text(), html_path.read_text()

    for title in ("Summary", "Shortlist", "Margin trajectories", "Accuracy against margin", "Hops", "Signal and noise",
                  "Correlation across probes", "Averaging vs raw", "Caveats", "Provenance"):
        assert f"## {title}" in md
        assert f">{title}</h2>" in page
    assert md.index("## Summary") < md.index("## Shortlist") < md.index("## Caveats")
    summary_md = md[md.index("## Summary"):md.index("## Shortlist")]
    assert sl.selected and all(f"`{c}`" in summary_md for c in sl.selected)
    assert "Hops (conflict tracks)" in summary_md and "Signal to noise" in summary_md and "Averaging" in summary_md
    assert "pilot SFT" in md[md.index("## Caveats"):]
    assert "a third answer can win" in page

    # self-contained: every image inline, nothing fetched from anywhere
    assert page.count('src="data:image/png;base64,') == 4  # trajectories, accuracy/margin, heatmap, averaging
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<link" not in page and "<script" not in page
    for rel in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (run / rel).is_file(), rel
    assert "fp0010" in md and "spec1" in md  # provenance: fingerprints, spec hashes
    assert "Seeds" in md or "seeds" in md


def test_summary_counts_the_shortlist_apart_from_the_references_piloted_next_to_it(tmp_path):
    """With ``references:`` the Summary's count is the probes' shortlist (k); the naive choices appended
    for the pilot are listed apart, each with its rule, never counted as shortlisted."""
    run = _make_run(tmp_path / "run", [10, 20, 30, 40, 50, 60])
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("k: 2", "k: 1") + "references: [latest]\n")
    sl = shortlist(run, plan)
    assert sl.selected == ["checkpoint-40", "checkpoint-60"]   # the probes' one, then the latest
    md = write_report(run).md.read_text()
    summary_md = md[md.index("## Summary"):md.index("## Shortlist")]
    assert "**Shortlisted (1)**: `checkpoint-40` (plan `" in summary_md
    assert "; **piloted next to them (1)**: `checkpoint-60` (latest). Each is a hypothesis" in summary_md


def test_report_without_shortlist_or_averaging_says_what_to_do(tmp_path):
    run = _make_run(tmp_path / "run", [1, 2, 3, 4])
    md_path, html_path = write_report(run)
    md = md_path.read_text()
    assert "No shortlist yet" in md and "probeselect shortlist" in md
    assert "No averaged run found" in md and "probeselect average" in md
    assert html_path.read_text().count("data:image/png;base64,") == 3


def test_averaged_run_found_through_pointer_file(tmp_path):
    run = _make_run(tmp_path / "run", [1, 2, 3, 4, 5])
    _make_run(tmp_path / "avg_run", [3, 4, 5])
    atomic_write_json(run / "averaged.json", {"run_dir": "../avg_run"})
    md = write_report(run).md.read_text()
    assert "Averaged run:" in md and "TV ratio" in md
    atomic_write_json(run / "averaged.json", {"run_dir": "../missing"})
    with pytest.raises(ProbeselectError, match="averaged.json: points to"):
        write_report(run)


def test_both_renderers_share_one_section_list(tmp_path):
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    secs = [Section("Summary", [Para("Use `k` **now** <b>"), Table(["a|b", "c"], [["1|2", "3"]]),
                                Figure(png, "look here", "alt text")])]
    md = render_markdown("T", secs, tmp_path)
    page = render_html("T", secs)
    assert "| a\\|b | c |" in md and "| 1\\|2 | 3 |" in md and "![alt text](f.png)" in md
    assert "<code>k</code>" in page and "<strong>now</strong>" in page and "&lt;b&gt;" in page
    assert "data:image/png;base64," in page and json.dumps("look here")[1:-1] in page


# --- report text -----------------------------------------------------------------------


def test_hop_headline_counts_conflict_tracks_and_names_capability_separately(tmp_path):
    from probeselect._probe_sections import hop_headline

    stats = pd.DataFrame([
        dict(track="conf/a", kind="conflict", metric="mean_margin", hops=2.0, hop_threshold=0.3, learning_crossings=0.0),
        dict(track="conf/b", kind="conflict", metric="mean_margin", hops=0.0, hop_threshold=0.3, learning_crossings=1.0),
        dict(track="conf/c", kind="conflict", metric="mean_margin", hops=np.nan, hop_threshold=np.nan,
             learning_crossings=0.0),
        dict(track="cap/x", kind="capability", metric="mean_margin", hops=1.0, hop_threshold=0.2, learning_crossings=1.0),
        dict(track="heldout_nll/bpb", kind="nll", metric="bits_per_byte", hops=np.nan, hop_threshold=np.nan,
             learning_crossings=np.nan),
    ])
    conflict, capability = hop_headline(stats, 6)
    assert conflict.startswith("**Hops (conflict tracks)**: 2 hop(s) on 1 of 3 conflict tracks over 6 checkpoints")
    assert "`conf/a` 2" in conflict and "cap/x" not in conflict
    assert "1 track(s) n/a" in conflict and "`conf/b`" in conflict and "learning crossings, not hops" in conflict
    assert capability.startswith("**Capability tracks**") and "1 hop(s) on 1 of 1 tracks (`cap/x` 1)" in capability
    assert hop_headline(stats, 2) == [hop_headline(stats, 2)[0]] and "n/a (needs >= 3 checkpoints" in hop_headline(stats, 2)[0]


def test_two_checkpoint_run_never_prints_nan(tmp_path):
    run = _make_run(tmp_path / "run", [1, 2])
    md = write_report(run).md.read_text()
    assert not re.search(r"\bnan\b", md, flags=re.IGNORECASE), re.search(r".{60}\bnan\b.{20}", md, flags=re.I)
    assert "n/a (needs >= 3 checkpoints" in md


def test_title_names_the_run_not_the_stage_folder(tmp_path):
    from probeselect._report_blocks import run_name

    assert run_name(tmp_path / "score", {"command": ["probeselect", "run", "recipes/demo.yaml", "out=x"]}) == "demo"
    assert run_name(tmp_path / "score", {"config": {"checkpoints": "results/demo/ladder"}}) == "demo/ladder"
    assert run_name(tmp_path / "x" / "score", None) == "x/score"
    run = _make_run(tmp_path / "demo" / "score", [1, 2, 3])
    assert write_report(run).md.read_text().splitlines()[0] == "# probeselect report: demo/score"


def test_rank_tables_are_split_and_figures_are_readable(tmp_path):
    from probeselect._probe_sections import _rank_tables
    from probeselect.dynamics import MIN_FONT_PT, accuracy_vs_margin_figure, correlation_figure

    ck = [f"c{i}" for i in range(4)]
    cols = {f"rank[f/v{j}:mean_margin]": [1.0, 2.0, 3.0, 4.0] for j in range(10)}
    sl = pd.DataFrame({"checkpoint": ck, **cols, "rank[f/*:mean_margin]": [1.0, 2.0, 3.0, 4.0],
                       "topk_frac[f/*:mean_margin]": [1.0, 1.0, 0.0, 0.0]})
    blocks = _rank_tables(sl, {"proxies": [{"id": "f/*:mean_margin"}]}, max_cols=7)
    tables = [b for b in blocks if isinstance(b, Table)]
    assert len(tables) == 2 and all(len(t.header) <= 10 for t in tables)
    assert sum(len(t.header) - 1 for t in tables) == 12  # 10 variants + proxy rank + top-k share, nothing lost

    # 23 tracks: every track is in a legend, every label >= 9 pt
    rows = []
    for f in range(8):
        for v in range(3 if f < 7 else 2):
            for i, step in enumerate((10, 20, 30)):
                rows.append(dict(track=f"fam{f}/v{v}", family=f"fam{f}", variant=f"v{v}", kind="conflict",
                                 metric="mean_margin", step=step, value=0.1 * i + v, accuracy=0.5 + 0.1 * i))
    traj = pd.DataFrame(rows)
    assert traj["track"].nunique() == 23
    pairs = pd.DataFrame({"family": ["fam0"], "d_mean_margin": [0.1], "d_accuracy": [0.2],
                          "flag_acc_moves_margin_still": [False]})
    fig = accuracy_vs_margin_figure(traj, pairs)
    legends = {(ax.get_title().split(" (")[0], t.get_text()) for ax in fig.axes if ax.get_legend()
               for t in ax.get_legend().get_texts()}
    assert {(r.family, r.variant) for r in traj.itertuples()} <= legends
    names = sorted(traj["track"].unique())
    rho = pd.DataFrame(np.eye(23), index=names, columns=names)
    heat = correlation_figure(rho, pd.DataFrame(3, index=names, columns=names))
    ax = heat.axes[0]
    labels = ax.get_xticklabels() + ax.get_yticklabels() + ax.texts
    assert len(ax.texts) == 23 * 23 and min(t.get_fontsize() for t in labels) >= MIN_FONT_PT >= 9


# --- module structure -------------------------------------------------------------------


@pytest.mark.parametrize("module", ["probeselect._report_blocks", "probeselect._probe_sections",
                                    "probeselect.report", "probeselect.final_report", "probeselect.metrics"])
def test_each_report_module_imports_alone(module):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_report_modules_do_not_import_each_other():
    """report -> final_report is the only edge between the two reports; the shared blocks import neither."""
    import ast
    from pathlib import Path

    import probeselect

    pkg = Path(probeselect.__file__).parent

    def imports(name):
        tree = ast.parse((pkg / f"{name}.py").read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}

    assert "report" not in imports("final_report")
    for shared in ("_report_blocks", "_probe_sections"):
        assert not {"report", "final_report"} & imports(shared), shared


def test_averaging_dip_is_stated_raw_vs_averaged(tmp_path):
    from probeselect._probe_sections import _averaging_dip_blocks

    assert _averaging_dip_blocks(tmp_path) == []  # no averaging_dip.csv: nothing to say
    pd.DataFrame([
        {"window": "parrot", "family": "tmpl_mismatch", "k": 5, "depth_raw": 4.0, "min_step_raw": 1000.0,
         "ref_step_raw": 600.0, "dipped_raw": True, "depth_avg": 1.0, "min_step_avg": 1200.0, "ref_step_avg": 1000.0,
         "dipped_avg": True, "reduction": 0.75},
        {"window": "parrot", "family": "arith_pattern", "k": 5, "depth_raw": 1.2, "min_step_raw": 800.0,
         "ref_step_raw": 600.0, "dipped_raw": True, "depth_avg": -0.5, "min_step_avg": 1200.0, "ref_step_avg": 1000.0,
         "dipped_avg": False, "reduction": 1.4},
        {"window": "parrot", "family": "tmpl_flipped", "k": 5, "depth_raw": -0.3, "min_step_raw": 800.0,
         "ref_step_raw": 600.0, "dipped_raw": False, "depth_avg": -1.0, "min_step_avg": 1200.0, "ref_step_avg": 1000.0,
         "dipped_avg": False, "reduction": float("nan")},
    ]).to_csv(tmp_path / "averaging_dip.csv", index=False)
    para, bullets = _averaging_dip_blocks(tmp_path)
    assert "5-checkpoint" in para.text
    text = " ".join(bullets.items)
    assert len(bullets.items) == 2 and "tmpl_flipped" not in text  # only dips of the raw ladder
    assert "depth 4 nats raw (lowest at step 1000) vs 1 nats averaged" in text and "removes 75% of its depth" in text
    # an averaged track that does not fall at all is "hides the whole dip", never "removes 140%"
    assert "hides the whole dip" in text and "140%" not in text
