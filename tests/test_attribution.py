"""Data-window attribution on synthetic trajectories with a planted harmful window."""

import json

import numpy as np
import pandas as pd
import pytest

from probeselect._io import atomic_write_csv, atomic_write_json
from probeselect.attribution import (AttributionError, Window, attribute, family_summary, find_lineage, load_windows,
                                     write_attribution)
from probeselect.cli import main

STEPS = [200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000]
WINDOWS = [Window("early", 0, 800), Window("parrot", 800, 1200, "parrot"), Window("late", 1200, 2000)]
LINEAGE = {"windows": [
    {"name": "early", "start_step": 0, "end_step": 800, "mixture": {"arith": 0.7}, "tokens_by_kind": {},
     "documents_sha256": "0" * 64, "planted": None},
    {"name": "parrot", "start_step": 800, "end_step": 1200, "mixture": {"arith": 0.7}, "tokens_by_kind": {},
     "documents_sha256": "1" * 64, "planted": "parrot"},
    {"name": "late", "start_step": 1200, "end_step": 2000, "mixture": {"arith": 0.7}, "tokens_by_kind": {},
     "documents_sha256": "2" * 64, "planted": None}]}

# affected: rises, dips in the parrot window (800 -> 1000 -> 1200), recovers; unaffected: rises steadily
AFFECTED = [1.0, 2.0, 3.0, 4.0, 2.5, 1.5, 3.5, 4.5, 5.0, 5.5]
STEADY = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5]
BPB = [3.0, 2.8, 2.6, 2.5, 2.45, 2.4, 2.35, 2.3, 2.28, 2.26]  # lower is better, improving throughout


def _summary() -> pd.DataFrame:
    rows = []
    for i, step in enumerate(STEPS):
        ck = f"checkpoint-{step}"
        for fam, kind, traj in (("arith_pattern", "conflict", AFFECTED), ("tmpl_repeated", "conflict", AFFECTED),
                                ("arith_plain", "capability", STEADY)):
            for v, off in (("eq", 0.0), ("qa", 0.2)):
                rows.append({"checkpoint": ck, "step": step, "tokens": step * 10, "family": fam, "variant": v,
                             "kind": kind, "mean_margin": traj[i] + off, "seed_sd": 0.05, "accuracy": 0.5,
                             "candidate_accuracy": 0.5, "n_items": 10, "n_seeds": 2})
        rows.append({"checkpoint": ck, "step": step, "tokens": step * 10, "family": "heldout_nll", "variant": "bpb",
                     "kind": "nll", "bits_per_byte": BPB[i]})
    return pd.DataFrame(rows)


def _traj() -> pd.DataFrame:
    from probeselect.dynamics import track_table

    return track_table(_summary())


def test_attribute_names_the_planted_window_and_orients_bpb():
    attr = attribute(_traj(), WINDOWS)
    a = attr[attr["track"] == "arith_pattern/eq"].set_index("window")
    # parrot: start = checkpoint-800 (4.0), end = checkpoint-1200 (1.5)
    assert a.loc["parrot", "start_checkpoint"] == "checkpoint-800"
    assert a.loc["parrot", "end_checkpoint"] == "checkpoint-1200"
    assert a.loc["parrot", "change"] == pytest.approx(-2.5)
    assert a.loc["parrot", "worst_change"] == pytest.approx(-2.5)
    assert a.loc["parrot", "n_checkpoints_in_window"] == 2
    assert a.loc["parrot", "noise_sd"] == pytest.approx(np.sqrt(2) * 0.05)
    assert a.loc["parrot", "prior_gain"] == pytest.approx(3.0)
    assert a.loc["parrot", "undone_fraction"] == pytest.approx(2.5 / 3.0)
    assert bool(a.loc["parrot", "undoes_gains"]) and bool(a.loc["parrot", "most_harmful"])
    assert bool(a.loc["parrot", "recovered_after"])
    assert a.loc["late", "change"] == pytest.approx(4.0) and not a.loc["late", "undoes_gains"]
    # no checkpoint before step 0: the early window is measured from its first checkpoint
    assert bool(a.loc["early", "start_inside"]) and a.loc["early", "change"] == pytest.approx(3.0)
    steady = attr[attr["track"] == "arith_plain/eq"]
    assert not steady["most_harmful"].any() and not steady["undoes_gains"].any()
    bpb = attr[attr["track"] == "heldout_nll/bpb"].set_index("window")
    assert bpb.loc["parrot", "change"] == pytest.approx(2.5 - 2.4)  # bpb fell: positive (better)
    assert not bpb["most_harmful"].any()

    fam = family_summary(attr)
    top = fam[fam["most_harmful"]]
    assert sorted(top["family"]) == ["arith_pattern", "tmpl_repeated"]
    assert set(top["window"]) == {"parrot"} and set(top["planted"]) == {"parrot"}
    assert (top["tracks_undoing_gains"] == 2).all()


def test_small_dip_within_noise_is_not_harmful():
    t = _traj()
    t.loc[t["family"] != "heldout_nll", "seed_sd"] = 5.0  # a 2.5-nat dip is now inside the evaluation noise
    attr = attribute(t, WINDOWS)
    assert not attr["most_harmful"].any() and not attr["undoes_gains"].any()
    assert not family_summary(attr)["most_harmful"].any()


def test_window_without_checkpoint_uses_the_next_one():
    t = _traj()
    attr = attribute(t, [Window("a", 0, 800), Window("gap", 1210, 1300), Window("z", 1300, 2000)])
    g = attr[(attr["track"] == "arith_pattern/eq") & (attr["window"] == "gap")].iloc[0]
    assert g["end_after_window"] and g["start_checkpoint"] == "checkpoint-1200" and g["end_checkpoint"] == "checkpoint-1400"
    assert g["n_checkpoints_in_window"] == 0


def test_load_windows_json_csv_and_errors(tmp_path):
    p = tmp_path / "data_lineage.json"
    atomic_write_json(p, LINEAGE)
    assert load_windows(p) == WINDOWS
    c = tmp_path / "w.csv"
    c.write_text("start_step,end_step,window\n800,1200,parrot\n0,800,early\n", encoding="utf-8")
    assert [w.name for w in load_windows(c)] == ["early", "parrot"]
    bad = tmp_path / "bad.csv"
    bad.write_text("start,end,window\n0,1,a\n", encoding="utf-8")
    with pytest.raises(AttributionError, match="lacks columns"):
        load_windows(bad)
    ov = tmp_path / "ov.csv"
    ov.write_text("start_step,end_step,window\n0,900,a\n800,1200,b\n", encoding="utf-8")
    with pytest.raises(AttributionError, match="overlap"):
        load_windows(ov)
    with pytest.raises(AttributionError, match="not found"):
        load_windows(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{\"windows\": [{\"name\": \"a\"}]}", encoding="utf-8")
    with pytest.raises(AttributionError, match="needs name, start_step and end_step"):
        load_windows(tmp_path / "x.json")
    with pytest.raises(AttributionError, match="does not belong"):
        attribute(_traj(), [Window("after", 5000, 6000)])


def _run(tmp_path, ladder=None):
    run = tmp_path / "run"
    run.mkdir()
    atomic_write_csv(run / "summary.csv", _summary())
    ckpts = [{"name": f"checkpoint-{s}", "path": str(ladder / f"checkpoint-{s}") if ladder else None} for s in STEPS]
    atomic_write_json(run / "manifest.json", {"status": "complete", "checkpoints": ckpts, "seeds": [0, 1]})
    return run


def test_cli_dynamics_lineage_flag_and_auto_discovery(tmp_path, capsys):
    ladder = tmp_path / "ladder"
    ladder.mkdir()
    run = _run(tmp_path, ladder)
    assert find_lineage(run) is None
    assert write_attribution(run) is None  # no lineage: nothing written
    csv = tmp_path / "windows.csv"
    csv.write_text("start_step,end_step,window,planted\n0,800,early,\n800,1200,parrot,parrot\n1200,2000,late,\n",
                   encoding="utf-8")
    assert main(["dynamics", str(run), "--no-plots", "--lineage", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "attribution:" in out
    attr = pd.read_csv(run / "dynamics" / "attribution.csv")
    fam = pd.read_csv(run / "dynamics" / "attribution_families.csv")
    assert set(fam.loc[fam["most_harmful"], "window"]) == {"parrot"}
    assert len(attr) == attr["track"].nunique() * 3
    # found automatically next to the checkpoints (parent of the checkpoint folders)
    atomic_write_json(ladder / "data_lineage.json", LINEAGE)
    (run / "dynamics" / "attribution.csv").unlink()
    assert find_lineage(run) == ladder / "data_lineage.json"
    assert main(["dynamics", str(run), "--no-plots"]) == 0
    assert (run / "dynamics" / "attribution.csv").is_file()
    # a bad lineage file: one-line error, exit 2
    (tmp_path / "bad.json").write_text("[1]", encoding="utf-8")
    assert main(["dynamics", str(run), "--no-plots", "--lineage", str(tmp_path / "bad.json")]) == 2
    assert "windows" in capsys.readouterr().err


def test_report_shows_attribution(tmp_path):
    from probeselect.report import write_report

    ladder = tmp_path / "ladder"
    ladder.mkdir()
    run = _run(tmp_path, ladder)
    atomic_write_json(ladder / "data_lineage.json", LINEAGE)
    md = write_report(run).md.read_text(encoding="utf-8")
    assert "## Data-window attribution" in md
    assert "Most harmful window: `arith_pattern` (mean_margin): **parrot** (planted: parrot)" in md
    assert "Most harmful window: `arith_plain`" not in md
    data = json.loads((ladder / "data_lineage.json").read_text())
    assert data["windows"][1]["planted"] == "parrot"
