"""Export a run's probe series as steps, to lay next to the training run's loss curves.

``export_run(run_dir, fmt="csv")`` writes ``RUN/export/probe_series.csv`` (long form:
``step, tokens, checkpoint, tag, value``); ``fmt="tensorboard"`` writes TensorBoard event
files to ``RUN/export/tensorboard/`` (:class:`torch.utils.tensorboard.SummaryWriter`, one
scalar per tag and checkpoint at ``global_step`` = the checkpoint's step). Tags are the
ones :class:`probeselect.integrations.ProbeCallback` logs:
``probes/<family>/<variant>/<metric>`` with metric ``margin`` (mean margin, nats),
``accuracy``, ``margin_seed_sd``, ``bits_per_byte`` (held-out NLL) and ``gen_consistency``.
TensorBoard output needs the ``tensorboard`` package (``pip install 'probeselect[tensorboard]'``).

``fmt="wandb-offline"`` writes a Weights & Biases *offline* run to ``RUN/export/wandb/``
(``wandb.init(mode="offline")``: no network, no login; ``wandb sync RUN/export/wandb/wandb/offline-run-*``
uploads it later). Each checkpoint is one ``log`` call at ``step`` = the checkpoint's step,
with the same tags, plotted against ``train/global_step``; the W&B run id is derived from the
content of ``summary.csv`` (``probeselect-<12 hex>``: the same tables, the same id). Needs the ``wandb`` package (``pip install 'probeselect[wandb]'``);
the project is ``$WANDB_PROJECT`` or ``probeselect``, the run name the run folder's name.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ._io import atomic_write_csv, reading
from .errors import ProbeselectError, UsageError

__all__ = ["probe_series", "export_run", "FORMATS"]

#: The ``--format`` choices of ``probeselect export``.
FORMATS = ("csv", "tensorboard", "wandb-offline")


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
    if fmt == "wandb-offline":
        return _export_wandb_offline(run, series, Path(out) if out else run / "export" / "wandb")
    raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}.")


def _export_wandb_offline(run: Path, series: pd.DataFrame, path: Path) -> Path:
    """Write ``series`` as one W&B offline run under ``path`` (module docstring)."""
    import hashlib
    import os
    import shutil

    try:
        import wandb
    except ImportError:
        raise UsageError("--format wandb-offline needs the wandb package: pip install 'probeselect[wandb]' "
                         "(or pip install wandb), or use --format csv or tensorboard.") from None
    if path.exists() and any(path.glob("wandb/offline-run-*")):
        raise UsageError(f"--out {path}: already holds a W&B offline run; syncing both would upload the series "
                         "twice. Remove it or pass another --out.")
    run_id = "probeselect-" + hashlib.sha256((run / "summary.csv").read_bytes()).hexdigest()[:12]
    staging = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    quiet = dict(silent=True, console="off", x_disable_stats=True, x_disable_meta=True, save_code=False,
                 disable_git=True)  # no system metrics, no code or git capture: only the series
    known = getattr(wandb.Settings, "model_fields", None) or quiet  # older wandb lacks some of these settings
    settings = wandb.Settings(mode="offline", **{k: v for k, v in quiet.items() if k in known})
    wrun = wandb.init(dir=str(staging), project=os.environ.get("WANDB_PROJECT") or "probeselect", name=run.name,
                      id=run_id, mode="offline", config={"probeselect_run_dir": str(run.resolve())},
                      settings=settings)
    try:
        wrun.define_metric("train/global_step")
        wrun.define_metric("probes/*", step_metric="train/global_step")  # HF Trainer's W&B step axis
        for step, g in series[series["step"].notna()].groupby("step", sort=True):
            wrun.log({"train/global_step": int(step), **{t: float(v) for t, v in zip(g["tag"], g["value"])}},
                     step=int(step))
    finally:
        wrun.finish()
    (path / "wandb").mkdir(parents=True, exist_ok=True)
    for p in (staging / "wandb").iterdir():  # offline-run-<time>-<id>/ (and wandb's latest-run link)
        if p.is_symlink():
            continue
        os.replace(p, path / "wandb" / p.name)
    shutil.rmtree(staging, ignore_errors=True)
    return path
