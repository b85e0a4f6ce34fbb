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


def test_export_tensorboard_without_package_names_the_extra(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    assert main(["export", str(_run(tmp_path)), "--format", "tensorboard"]) == 2
    assert "probeselect[tensorboard]" in capsys.readouterr().err


HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _wandb_records(path):
    """The records of a W&B ``.wandb`` file (its LevelDB-log framing: a 7-byte header, 32 KiB
    blocks of chunks with a 7-byte crc/length/type header each), parsed with wandb's protobuf."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, typ = struct.unpack("<IHB", data[pos:pos + 7])
        if typ == 0 and n == 0:
            pos += left
            continue
        chunk = data[pos + 7: pos + 7 + n]
        pos += 7 + n
        buf = chunk if typ in (1, 2) else buf + chunk  # FULL/FIRST start a record, MIDDLE/LAST continue it
        if typ in (1, 4):
            r = wandb_internal_pb2.Record()
            r.ParseFromString(buf)
            out.append(r)
            buf = b""
    return out


@pytest.mark.skipif(not HAS_WANDB, reason="the wandb package is not installed (pip install 'probeselect[wandb]')")
def test_export_wandb_offline_run_files(tmp_path, monkeypatch):
    import json

    for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(k, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")  # the export is offline whatever the environment says
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: no network was used
    run = _run(tmp_path)
    out = export_run(run, fmt="wandb-offline")
    (rf,) = out.glob("wandb/offline-run-*/run-*.wandb")
    recs = _wandb_records(rf)
    runs = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].run_id.startswith("probeselect-") and runs[0].display_name == "run"
    hist = [{it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in r.history.item}
            for r in recs if r.WhichOneof("record_type") == "history"]
    got = {(h["_step"], k): v for h in hist for k, v in h.items() if k.startswith("probes/")}
    want = {(int(r.step), r.tag): r.value for r in probe_series(run).itertuples()}
    assert got == want
    assert [h["train/global_step"] for h in hist] == [10, 20]
    with pytest.raises(Exception, match="already holds a W&B offline run"):
        export_run(run, fmt="wandb-offline")
    assert not list(run.glob("export/.*"))  # no staging folder left behind


def test_export_wandb_offline_without_package_names_the_extra(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    assert main(["export", str(_run(tmp_path)), "--format", "wandb-offline"]) == 2
    err = capsys.readouterr().err
    assert "probeselect[wandb]" in err and "--format csv" in err
    assert not (tmp_path / "run" / "export").exists()


def test_cli_format_choices_are_the_exporters_formats():
    from probeselect._watch_cli import EXPORT_FORMATS
    from probeselect.export import FORMATS

    assert EXPORT_FORMATS == FORMATS
