"""probeselect export: the probe series as steps (csv, TensorBoard event files)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from probeselect.cli import main
from probeselect.export import export_run, probe_series

HAS_TB = importlib.util.find_spec("tensorboard") is not None
NO_TB = "the tensorboard package is not installed (pip install 'probeselect[tensorboard]')"


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame([
        {"checkpoint": "checkpoint-10", "step": 10, "family": "fam", "variant": "plain", "kind": "conflict",
         "mean_margin": -0.5, "accuracy": 0.25, "seed_sd": 0.1},
        {"checkpoint": "checkpoint-20", "step": 20, "family": "fam", "variant": "plain", "kind": "conflict",
         "mean_margin": 0.75, "accuracy": 0.5, "seed_sd": 0.2},
        {"checkpoint": "checkpoint-20", "step": 20, "family": "heldout_nll", "variant": "bpb", "kind": "nll",
         "bits_per_byte": 1.25},
    ]).to_csv(run / "summary.csv", index=False)
    return run


def test_export_csv_long_series(tmp_path, capsys):
    run = _run(tmp_path)
    assert main(["export", str(run), "--format", "csv"]) == 0
    df = pd.read_csv(run / "export" / "probe_series.csv")
    got = {(r.step, r.tag): r.value for r in df.itertuples()}
    assert got[(10, "probes/fam/plain/margin")] == -0.5
    assert got[(20, "probes/fam/plain/margin")] == 0.75
    assert got[(20, "probes/fam/plain/accuracy")] == 0.5
    assert got[(20, "probes/heldout_nll/bpb/bits_per_byte")] == 1.25
    assert (10, "probes/heldout_nll/bpb/bits_per_byte") not in got  # no value, no point
    assert len(df) == len(probe_series(run))


def test_export_missing_summary_is_a_clear_error(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--format", "csv"]) == 2
    assert "summary.csv: not found" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_TB, reason=NO_TB)
def test_export_tensorboard_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _run(tmp_path)
    out = export_run(run, fmt="tensorboard")
    ea = EventAccumulator(str(out))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("probes/fam/plain/margin")] == [(10, -0.5), (20, 0.75)]
    assert [(e.step, e.value) for e in ea.Scalars("probes/heldout_nll/bpb/bits_per_byte")] == [(20, 1.25)]
    with pytest.raises(Exception, match="already holds TensorBoard event files"):
        export_run(run, fmt="tensorboard")


@pytest.mark.skipif(HAS_TB, reason="tensorboard is installed; this checks the message shown without it")
def test_export_tensorboard_without_package_names_the_extra(tmp_path, capsys):
    assert main(["export", str(_run(tmp_path)), "--format", "tensorboard"]) == 2
    assert "probeselect[tensorboard]" in capsys.readouterr().err
