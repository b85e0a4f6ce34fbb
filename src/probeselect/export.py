"""Export a run's probe series as steps, to lay next to the training run's loss curves.

``export_run(run_dir, fmt="csv")`` writes ``RUN/export/probe_series.csv`` (long form:
``step, tokens, checkpoint, tag, value``); ``fmt="tensorboard"`` writes TensorBoard event
files to ``RUN/export/tensorboard/`` (:class:`torch.utils.tensorboard.SummaryWriter`, one
scalar per tag and checkpoint at ``global_step`` = the checkpoint's step). Tags are the
ones :class:`probeselect.integrations.ProbeCallback` logs:
``probes/<family>/<variant>/<metric>`` with metric ``margin`` (mean margin, nats),
``accuracy``, ``margin_seed_sd``, ``bits_per_byte`` (held-out NLL) and ``gen_consistency``.
TensorBoard output needs the ``tensorboard`` package (``pip install 'probeselect[tensorboard]'``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ._io import atomic_write_csv, reading
from .errors import ProbeselectError, UsageError

__all__ = ["probe_series", "export_run"]


def probe_series(run_dir: str | Path) -> pd.DataFrame:
    """The long table ``step, tokens, checkpoint, tag, value`` of a run's ``summary.csv``."""
    from .watch import probe_metrics

    f = Path(run_dir) / "summary.csv"
    if not f.is_file():
        raise ProbeselectError(f"{f}: not found; RUN_DIR must be a folder written by `probeselect score` or `watch`.")
    with reading(f, ProbeselectError, also=(ValueError,)):
        summary = pd.read_csv(f)
    summary["variant"] = summary["variant"].astype(str)
    rows = []
    ck = summary.drop_duplicates("checkpoint")
    for r in ck.to_dict("records"):
        tokens = r.get("tokens")
        for tag, v in probe_metrics(summary, str(r["checkpoint"])).items():
            rows.append({"step": r["step"], "tokens": tokens, "checkpoint": r["checkpoint"], "tag": tag, "value": v})
    out = pd.DataFrame(rows, columns=["step", "tokens", "checkpoint", "tag", "value"])
    return out.sort_values(["step", "tag"], kind="stable").reset_index(drop=True)


def export_run(run_dir: str | Path, *, fmt: str = "csv", out: str | Path | None = None) -> Path:
    """Write the series (module docstring); returns the file or folder written."""
    run = Path(run_dir)
    series = probe_series(run)
    if fmt == "csv":
        path = Path(out) if out else run / "export" / "probe_series.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_csv(path, series)
        return path
    if fmt == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError("--format tensorboard needs the tensorboard package: pip install 'probeselect[tensorboard]' "
                             "(or pip install tensorboard), or use --format csv.") from None
        path = Path(out) if out else run / "export" / "tensorboard"
        if path.exists() and any(path.glob("events.out.tfevents.*")):
            raise UsageError(f"--out {path}: already holds TensorBoard event files; TensorBoard would show both "
                             "copies. Remove it or pass another --out.")
        path.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(path))
        try:
            for r in series.itertuples(index=False):
                if pd.notna(r.step):
                    writer.add_scalar(r.tag, float(r.value), global_step=int(r.step))
        finally:
            writer.close()
        return path
    raise UsageError(f"--format {fmt!r}: choose csv or tensorboard.")
