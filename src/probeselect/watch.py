"""``probeselect watch``: score checkpoints while the pretraining run writes them.

:class:`Watcher` polls a checkpoint folder (``CKPT_DIR``, laid out as ``probeselect
score`` expects: ``checkpoint-<N>/``, OLMo ``step<N>-tokens<M>B/``, ``step<N>/`` ... or
any model folder whose step is in ``trainer_state.json``), and every time a new checkpoint
is **complete** it scores it into one run folder with :func:`probeselect.score.score_checkpoints`
(the list of every checkpoint scored so far plus the new ones: the per-checkpoint cache of
the run folder makes the earlier ones free), then recomputes the dynamics
(:func:`probeselect.dynamics.compute_dynamics`, or the whole report with
:func:`probeselect.report.write_report`), prints one line per checkpoint with the margins
that moved beyond noise, and raises alerts.

**When is a checkpoint complete?** (:func:`checkpoint_ready`) A folder is scored only when

1. it is a checkpoint by the rules of :func:`probeselect.checkpoints.discover_checkpoints`
   (name or ``trainer_state.json`` step), holds ``config.json`` and loadable weights: every
   shard named by ``model.safetensors.index.json`` is present, and every ``.safetensors``
   file is exactly as long as its header says (a file still being written is shorter);
   folders named ``*.tmp``, ``tmp-*`` or ``.*`` (staging folders of the toy ladder and of
   HF Trainer) are never looked at; and
2. either a completion marker (``trainer_state.json``, written by HF ``Trainer`` and the
   toy ladder after the weights and tokenizer, or ``probeselect_checkpoint.json``) is the
   most recently modified file of the folder, or the folder's list of files with their
   sizes and modification times is identical at two consecutive polls (plain
   ``save_pretrained``, OLMo conversions, copies, and a marker written first).

The marker alone is never trusted: rule 1 is checked as well. A checkpoint that is
complete by this rule but fails to load is reported and not retried by this process (a
restart retries it).

**Run folder.** Besides the files of ``probeselect score`` (``summary.csv`` ...,
``dynamics/``, ``report.md`` unless ``report=False``) the watcher keeps ``RUN/watch/``:
``state.json`` (every checkpoint processed, with its fingerprint; read at start so a
restart resumes and each checkpoint is processed once), ``log.jsonl`` (one line per
processed checkpoint: step, whether model work was done or the cache answered, the moved
tracks, the probe metrics; a run killed between that line and ``state.json`` does not add
a second one for the same checkpoint and fingerprint, and a line torn by a kill is left on
its own line), and ``RUN/alerts.jsonl`` (one JSON object per alert). A
checkpoint that disappears before it was scored (``save_total_limit``) is reported and
recorded in ``state.json`` (``vanished``); one already scored stays in the tables (its
scores come from the cache). The score step moves the previous ``dynamics/``,
``report.md`` and ``report.html`` aside whenever the tables change; the watcher rewrites
them at once, so those copies (its own previous output) are deleted instead of piling up
in ``superseded/`` (other downstream files keep the score step's rule).

**Alerts** (:func:`checkpoint_alerts`), evaluated for each newly processed checkpoint:

* ``undone_gain`` / ``hop`` - on a *conflict* margin track, the new checkpoint completes a
  hop under the rule of ``dynamics.csv``: the track's hop threshold ``hop_threshold`` as
  written there (:func:`probeselect.dynamics.hop_threshold`), and the zig-zag legs of
  :func:`probeselect.dynamics.hop_stats`; an alert is raised when ``hops`` of the values up
  to and including the new checkpoint exceeds ``hops`` of the values before it.
  ``undone_gain`` when the completing leg is a worsening (a gain given back), ``hop`` when
  it is a recovery from a dip;
* ``deeper_dip`` - the worsening leg that completed an ``undone_gain`` goes on falling: the new
  checkpoint extends it and is worse than the previous one by more than the threshold. Not a
  new hop (``dynamics.csv`` counts the leg once), but news: without it, a small dip that just
  crosses the threshold would hide a much larger fall at the next checkpoints. Its windows are
  those between the previous checkpoint and this one (where the further fall happened);
* ``bpb_worse`` - held-out bits per byte (``heldout_nll/bpb``) higher than at the previous
  checkpoint by more than ``bpb_tolerance`` (default 0: any increase; held-out NLL is
  deterministic, there is no seed noise to subtract).

The threshold is re-read from ``dynamics.csv`` at every checkpoint (the pooled seed sd
changes as checkpoints arrive), and both hop counts use the current one; so when the
threshold changes, one excursion can be alerted again at a later checkpoint.

Each alert names the checkpoint, its step, the track, values and threshold and, when the
windows are known, the data windows that overlap the steps between the previous checkpoint
and this one: from ``lineage`` (``--lineage``: a ``data_lineage.json`` or a CSV
``start_step,end_step,window[,planted]``, e.g. the planned curriculum), else from a
``data_lineage.json`` next to the checkpoints (:func:`probeselect.attribution.find_lineage`;
the toy ladder writes it only when the build ends, so pass ``--lineage`` while it builds).
``on_alert`` (``--on-alert CMD``) runs a shell command once per alert with the alert's JSON
on stdin; its failure is printed, never fatal.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from ._io import RunLock, atomic_write_json
from .checkpoints import Checkpoint, discover_checkpoints, parse_checkpoint_name
from .errors import CheckpointError, ProbeselectError, UsageError

__all__ = ["Watcher", "WatchResult", "checkpoint_ready", "folder_snapshot", "checkpoint_alerts", "moved_tracks",
           "probe_metrics", "MARKERS"]

#: Files whose presence says the writer finished the folder (still checked by rule 1).
MARKERS = ("trainer_state.json", "probeselect_checkpoint.json")
_OWN_DOWNSTREAM = ("dynamics", "report.md", "report.html")  # rewritten by the watcher after every score


class _DropSupersedeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("the scores changed: moved")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def folder_snapshot(path: Path) -> tuple:
    """(relative name, size, mtime_ns) of every file under ``path``, sorted; () when it vanished."""
    out = []
    try:
        for root, _dirs, files in os.walk(path):
            for f in files:
                p = Path(root) / f
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                out.append((str(p.relative_to(path)), st.st_size, st.st_mtime_ns))
    except FileNotFoundError:
        return ()
    return tuple(sorted(out))


def _is_staging(name: str) -> bool:
    return name.startswith(".") or name.startswith("tmp-") or name.endswith(".tmp")


def checkpoint_ready(path: Path, previous_snapshot: tuple | None) -> tuple[Checkpoint | None, str, tuple]:
    """Apply the completeness rule (module docstring) to one folder.

    Returns ``(checkpoint or None, reason, snapshot)``: the :class:`Checkpoint` when the
    folder is complete, else None and why not; ``snapshot`` is to be passed back at the
    next poll as ``previous_snapshot``.
    """
    path = Path(path)
    snap = folder_snapshot(path)
    if not snap:
        return None, "empty or vanished", snap
    if not (path / "config.json").is_file():
        return None, "no config.json yet", snap
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
        found = discover_checkpoints(path)  # validates the index, shards and safetensors lengths; fingerprints
    except (CheckpointError, OSError, ValueError) as exc:
        return None, f"incomplete ({str(exc).splitlines()[0][:160]})", snap
    ck = found[0]
    if ck.step is None:
        return None, "no step in its name or trainer_state.json", snap
    if folder_snapshot(path) != snap:  # changed while being read
        return None, "being written", folder_snapshot(path)
    newest = max(m for _n, _s, m in snap)
    if any(n in MARKERS and m == newest for n, _s, m in snap):  # the marker was written last
        return ck, "complete (marker)", snap
    if previous_snapshot is not None and previous_snapshot == snap:
        return ck, "complete (stable)", snap
    return None, "waiting for sizes and mtimes to settle", snap


def _windows_between(windows, lo_step, hi_step) -> list[dict]:
    """Data windows (start_step < t <= end_step) that overlap the steps (lo_step, hi_step]."""
    if not windows or hi_step is None:
        return []
    lo = -math.inf if lo_step is None or not np.isfinite(lo_step) else float(lo_step)
    return [{"window": w.name, "start_step": w.start_step, "end_step": w.end_step, "planted": w.planted}
            for w in windows if w.start_step < float(hi_step) and w.end_step > lo]


def _track_rows(trajectories: pd.DataFrame, track: str) -> pd.DataFrame:
    g = trajectories[trajectories["track"] == track].copy()
    g = g.assign(_s=pd.to_numeric(g["step"], errors="coerce")).sort_values("_s", kind="stable")
    return g[np.isfinite(pd.to_numeric(g["value"], errors="coerce").to_numpy(dtype=float))]


def checkpoint_alerts(trajectories: pd.DataFrame, stats: pd.DataFrame, checkpoint: str, *,
                      bpb_tolerance: float = 0.0, windows: Sequence = ()) -> list[dict]:
    """Alerts raised by ``checkpoint`` (rules: module docstring).

    ``trajectories`` and ``stats`` are ``dynamics/trajectories.csv`` and
    ``dynamics/dynamics.csv`` of the run (the hop threshold of each track is read from
    ``stats``); ``windows`` the ladder's data windows (:func:`probeselect.attribution.load_windows`).
    """
    from .dynamics import hop_stats
    from .metrics import direction

    out: list[dict] = []
    thresholds = dict(zip(stats["track"], pd.to_numeric(stats["hop_threshold"], errors="coerce")))
    for track in dict.fromkeys(trajectories["track"]):
        g = _track_rows(trajectories, track)
        names = g["checkpoint"].astype(str).tolist()
        if checkpoint not in names:
            continue
        i = names.index(checkpoint)
        if i == 0:
            continue
        first = g.iloc[0]
        values = g["value"].to_numpy(dtype=float)
        steps = g["_s"].to_numpy(dtype=float)
        base = {"checkpoint": checkpoint, "step": _num(steps[i]), "track": track, "family": str(first["family"]),
                "variant": str(first["variant"]), "metric": str(first["metric"]), "value": float(values[i]),
                "previous_checkpoint": names[i - 1], "previous_step": _num(steps[i - 1]),
                "previous_value": float(values[i - 1]), "change": float(values[i] - values[i - 1])}
        if first["kind"] == "conflict" and first["metric"] == "mean_margin":
            h = float(thresholds.get(track, float("nan")))
            if not np.isfinite(h):
                continue  # no seed noise estimate: the dynamics rule calls no hop either
            before = hop_stats(values[:i], threshold=h)
            now = hop_stats(values[: i + 1], threshold=h)
            n_before = len(before.legs) // 2
            n_now = len(now.legs) // 2
            leg = now.legs[-1] if now.legs else None
            turning = [_num(steps[lg.end]) for lg in now.legs[:-1]]
            if n_now <= n_before:
                sign = direction(first["metric"])
                if (leg is not None and len(now.legs) == len(before.legs) and len(now.legs) % 2 == 0
                        and leg.end == i and leg.change * sign < 0 and (values[i] - values[i - 1]) * sign < -h):
                    # the worsening leg of an alerted hop goes on falling, by more than the threshold here:
                    # named with the data seen since the previous checkpoint (where this fall happened)
                    out.append({**base, "kind": "deeper_dip", "threshold": h, "hops": n_now,
                                "leg_change": float(leg.change), "leg_from_step": _num(steps[leg.start]),
                                "turning_steps": turning, "windows": _windows_between(windows, steps[i - 1], steps[i]),
                                "rule": "the worsening leg of an alerted hop falls further by more than hop_threshold"})
                continue
            worse = leg.change * direction(first["metric"]) < 0
            lo = steps[now.legs[-1].start]
            out.append({**base, "kind": "undone_gain" if worse else "hop", "threshold": h, "hops": n_now,
                        "leg_change": float(leg.change), "leg_from_step": _num(lo), "turning_steps": turning,
                        "windows": _windows_between(windows, lo, steps[i]),
                        "rule": "dynamics.hop_stats with dynamics.csv hop_threshold"})
        elif first["metric"] == "bits_per_byte":
            if base["change"] > bpb_tolerance:
                out.append({**base, "kind": "bpb_worse", "threshold": float(bpb_tolerance),
                            "windows": _windows_between(windows, steps[i - 1], steps[i]),
                            "rule": "held-out bits per byte above the previous checkpoint's"})
    return out


def _jsonl_keys(f: Path, fields: tuple[str, ...]) -> set:
    """The ``fields`` tuples of the JSON lines of ``f`` (none when it does not exist)."""
    keys = set()
    if f.is_file():
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
                keys.add(tuple(r[k] for k in fields))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line of a killed run
    return keys


def _num(x):
    x = float(x)
    return int(x) if np.isfinite(x) and x.is_integer() else (x if np.isfinite(x) else None)


def moved_tracks(trajectories: pd.DataFrame, stats: pd.DataFrame, checkpoint: str) -> list[dict]:
    """Margin tracks whose value moved by more than their hop threshold (``dynamics.csv``)
    from the previous checkpoint to ``checkpoint``, and the held-out bpb change if any."""
    thresholds = dict(zip(stats["track"], pd.to_numeric(stats["hop_threshold"], errors="coerce")))
    out = []
    for track in dict.fromkeys(trajectories["track"]):
        g = _track_rows(trajectories, track)
        names = g["checkpoint"].astype(str).tolist()
        if checkpoint not in names or names.index(checkpoint) == 0:
            continue
        i = names.index(checkpoint)
        d = float(g["value"].iloc[i] - g["value"].iloc[i - 1])
        metric = g["metric"].iloc[0]
        h = float(thresholds.get(track, float("nan")))
        if metric == "mean_margin" and np.isfinite(h) and abs(d) > h:
            out.append({"track": track, "change": d, "threshold": h})
        elif metric == "bits_per_byte":
            out.append({"track": track, "change": d, "threshold": None})
    return out


def probe_metrics(summary: pd.DataFrame, checkpoint: str) -> dict[str, float]:
    """``probes/<family>/<variant>/<metric>`` scalars of one checkpoint from ``summary.csv``
    (margin = mean margin in nats, accuracy, seed_sd; bits_per_byte for held-out NLL)."""
    rows = summary[summary["checkpoint"].astype(str) == checkpoint]
    out: dict[str, float] = {}
    for r in rows.to_dict("records"):
        key = f"probes/{r['family']}/{r['variant']}"
        for col, name in (("mean_margin", "margin"), ("accuracy", "accuracy"), ("seed_sd", "margin_seed_sd"),
                          ("bits_per_byte", "bits_per_byte"), ("gen_consistency", "gen_consistency")):
            v = r.get(col)
            if v is not None and isinstance(v, (int, float)) and np.isfinite(v):
                out[f"{key}/{name}"] = float(v)
    return out


@dataclass
class WatchResult:
    """What :meth:`Watcher.run` returns."""

    processed: list[str] = field(default_factory=list)  # checkpoints processed by this call, in order
    model_scored: list[str] = field(default_factory=list)  # of those, the ones that needed model work
    alerts: list[dict] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stop_reason: str = ""


class Watcher:
    """Poll ``ckpt_dir`` and score each complete checkpoint once into ``out`` (module docstring).

    ``score_kwargs`` go to :func:`probeselect.score.score_checkpoints` (``seeds``,
    ``heldout``, ``device`` ...). ``every`` is the poll interval in seconds; ``until_step``
    stops after a checkpoint at that step or later; ``idle_exit`` (minutes) stops when no
    checkpoint was processed for that long. ``report=False`` recomputes only the dynamics
    (no report.md/html); ``plots=False`` skips the dynamics plots too. ``echo`` prints a line.
    """

    def __init__(self, ckpt_dir: str | Path, probes: Sequence, out: str | Path, *, every: float = 60.0,
                 until_step: int | None = None, idle_exit: float | None = None, on_alert: str | None = None,
                 bpb_tolerance: float = 0.0, report: bool = True, plots: bool = True,
                 lineage: str | Path | None = None,
                 echo: Callable[[str], None] | None = None, **score_kwargs: Any):
        self.ckpt_dir = Path(ckpt_dir)
        self.probes = list(probes)
        self.out = Path(out)
        if every <= 0:
            raise UsageError(f"--every must be a positive number of seconds, got {every}.")
        if idle_exit is not None and idle_exit < 0:
            raise UsageError(f"--idle-exit must be >= 0 minutes, got {idle_exit}.")
        if bpb_tolerance < 0:
            raise UsageError(f"--bpb-tolerance must be >= 0 bits per byte, got {bpb_tolerance}.")
        self.every, self.until_step, self.idle_exit = float(every), until_step, idle_exit
        self.on_alert, self.bpb_tolerance = on_alert, float(bpb_tolerance)
        self.report, self.plots = report, plots
        self.lineage = Path(lineage) if lineage is not None else None
        if self.lineage is not None:
            from .attribution import AttributionError, load_windows

            try:
                load_windows(self.lineage)
            except AttributionError as exc:
                raise UsageError(f"--lineage: {exc}") from None
        self.echo = echo or (lambda s: print(s, flush=True))
        score_kwargs.setdefault("progress", False)
        self.score_kwargs = score_kwargs
        self.wdir = self.out / "watch"
        self._snapshots: dict[str, tuple] = {}
        self._pending_seen: set[str] = set()
        self._failed_now: set[str] = set()
        self._lock: RunLock | None = None
        self.state = {"ckpt_dir": str(self.ckpt_dir), "processed": {}, "vanished": {}, "failed": {}}

    # -- state -------------------------------------------------------------------------
    def _open(self) -> None:
        if not self.ckpt_dir.is_dir():
            raise UsageError(f"{self.ckpt_dir}: not a folder; pass the folder the training run saves checkpoints "
                             "into (it may be empty at first, but must exist).")
        try:
            self.wdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {self.out}: cannot create the run folder ({exc.strerror}).") from None
        if self._lock is None:
            self._lock = RunLock(self.wdir, error_cls=UsageError).acquire()
        f = self.wdir / "state.json"
        if f.is_file():
            try:
                st = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageError(f"{f}: unreadable watch state ({exc}); delete it to re-process every checkpoint "
                                 "(scores come from the cache).") from None
            if Path(st.get("ckpt_dir", "")).resolve() != self.ckpt_dir.resolve():
                raise UsageError(f"{f}: this run folder watches {st.get('ckpt_dir')}, not {self.ckpt_dir}; "
                                 "use another --out.")
            self.state.update(st)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _save_state(self) -> None:
        atomic_write_json(self.wdir / "state.json", self.state)

    def _append(self, path: Path, rows: list[dict]) -> None:
        if rows:
            torn = False
            if path.is_file() and path.stat().st_size:
                with open(path, "rb") as fh:  # a line torn by a kill: start on a line of our own
                    fh.seek(-1, os.SEEK_END)
                    torn = fh.read(1) != b"\n"
            with open(path, "a", encoding="utf-8") as fh:
                if torn:
                    fh.write("\n")
                for r in rows:
                    fh.write(json.dumps(r, sort_keys=True, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    # -- one poll ----------------------------------------------------------------------
    def _candidates(self) -> list[Path]:
        root = self.ckpt_dir
        if (root / "config.json").is_file():
            return [root]  # a single model folder that is being written
        out = []
        for p in sorted(root.iterdir()):
            if not p.is_dir() or _is_staging(p.name):
                continue
            if parse_checkpoint_name(p.name) or (p / "trainer_state.json").is_file() or (p / "config.json").is_file():
                out.append(p)
        return out

    def _ready_new(self, assume_complete: Sequence[str] = ()) -> list[Checkpoint]:
        done = self.state["processed"]
        ready = []
        present = set()
        for p in self._candidates():
            present.add(p.name)
            if p.name in done or p.name in self._failed_now:
                continue
            prev = self._snapshots.get(p.name)
            if p.name in assume_complete:
                prev = folder_snapshot(p)
            ck, reason, snap = checkpoint_ready(p, prev)
            self._snapshots[p.name] = snap
            self._pending_seen.add(p.name)
            if ck is not None:
                ready.append(ck)
        for name in sorted(self._pending_seen - present - set(done)):
            if name not in self.state["vanished"]:
                self.echo(f"[watch] {name}: deleted before it was scored (save_total_limit?); skipped")
                self.state["vanished"][name] = _now()
                self._save_state()
            self._pending_seen.discard(name)
        return sorted(ready, key=lambda c: (c.step, c.name))

    def _scored_list(self, new: list[Checkpoint]) -> list[Checkpoint]:
        old = []
        for d in self.state["processed"].values():
            c = d["checkpoint"]
            old.append(Checkpoint(name=c["name"], path=Path(c["path"]), step=c["step"], tokens=c["tokens"],
                                  fingerprint=c["fingerprint"], tokenizer_hash=c["tokenizer_hash"],
                                  weight_files=tuple(c["weight_files"])))
        return sorted(old + new, key=lambda c: (c.step, c.name))

    def poll_once(self, assume_complete: Sequence[str] = ()) -> WatchResult:
        """One poll: score every new complete checkpoint, update the tables, raise alerts.
        ``assume_complete`` names folders known to be complete (a Trainer's ``on_save``)."""
        from .score import score_checkpoints

        self._open()
        res = WatchResult()
        new = self._ready_new(assume_complete)
        if not new:
            return res
        t0 = time.perf_counter()
        ckpts = self._scored_list(new)
        quiet = _DropSupersedeWarning()
        slog = logging.getLogger("probeselect.score")
        slog.addFilter(quiet)  # the watcher rewrites dynamics/ and the report itself; it reports other moves
        try:
            sres = score_checkpoints(ckpts, self.probes, out=self.out, keep_going=True, **self.score_kwargs)
        finally:
            slog.removeFilter(quiet)
        self._clean_superseded(sres.superseded)
        secs = time.perf_counter() - t0
        for name, err in sres.failed.items():
            if any(c.name == name for c in new):
                gone = not (self.ckpt_dir / name).exists()
                if gone:
                    self.echo(f"[watch] {name}: deleted while it was being scored (save_total_limit?); skipped")
                    self.state["vanished"][name] = _now()
                else:
                    self.echo(f"[watch] {name}: FAILED to score: {err}")
                    self.state["failed"][name] = err
                    self._failed_now.add(name)
                    res.failed[name] = err
        ok = [c for c in new if c.name not in sres.failed]
        if not ok:
            self._save_state()
            return res
        traj, stats, notes = self._downstream()
        windows = self._windows()
        summary = sres.summary
        seen = self._alert_keys()
        logged = self._logged_keys()
        for c in ok:
            alerts = checkpoint_alerts(traj, stats, c.name, bpb_tolerance=self.bpb_tolerance,
                                       windows=windows) if len(traj) else []
            alerts = [{"time_utc": _now(), "run": str(self.out), **a} for a in alerts
                      if (a["checkpoint"], a["track"], a["kind"]) not in seen]
            self._append(self.out / "alerts.jsonl", alerts)
            moved = moved_tracks(traj, stats, c.name) if len(traj) else []
            model = c.name in sres.scored
            rec = {"checkpoint": c.name, "step": c.step, "tokens": c.tokens, "fingerprint": c.fingerprint,
                   "processed_utc": _now(), "model_work": model, "seconds": round(secs, 3),
                   "moved": moved, "alerts": len(alerts), "metrics": probe_metrics(summary, c.name)}
            if (c.name, c.fingerprint) not in logged:  # a run killed between this line and state.json logged it
                self._append(self.wdir / "log.jsonl", [rec])
            self.state["processed"][c.name] = {"checkpoint": c.to_dict(), "processed_utc": rec["processed_utc"]}
            self._save_state()
            res.processed.append(c.name)
            if model:
                res.model_scored.append(c.name)
            res.alerts.extend(alerts)
            self.echo(self._line(c, moved, model, secs, len(ok)))
            for a in alerts:
                self._raise(a)
        return res

    def _line(self, c: Checkpoint, moved: list[dict], model: bool, secs: float, batch: int = 1) -> str:
        how = (f"scored in {secs:.1f}s" + (f" (with {batch - 1} other(s) in one batch)" if batch > 1 else "")
               if model else "from cache")
        parts = []
        for m in moved:
            if m["threshold"] is None:
                parts.append(f"{m['track']} {m['change']:+.4f} bits/byte")
            else:
                parts.append(f"{m['track']} {m['change']:+.3f} nats (noise {m['threshold']:.3f})")
        body = "; ".join(parts) if parts else "no margin moved beyond noise"
        return f"[watch] {c.name} (step {c.step}): {how}; {body}"

    def _raise(self, a: dict) -> None:
        win = ""
        if a.get("windows"):
            win = " in data window " + ", ".join(
                f"{w['window']} ({w['start_step']}..{w['end_step']}" + (f", planted {w['planted']})" if w.get("planted")
                                                                       else ")") for w in a["windows"])
        self.echo(f"[watch] ALERT {a['kind']}: {a['track']} at {a['checkpoint']} (step {a['step']}): "
                  f"{a['previous_value']:.3f} -> {a['value']:.3f} (threshold {a['threshold']:.3f}){win}")
        if not self.on_alert:
            return
        try:
            p = subprocess.run(self.on_alert, shell=True, input=json.dumps(a, default=str) + "\n", text=True,
                               capture_output=True, timeout=300)
            if p.returncode:
                self.echo(f"[watch] --on-alert command exited {p.returncode}: {p.stderr.strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.echo(f"[watch] --on-alert command failed: {exc}")

    def _alert_keys(self) -> set:
        return _jsonl_keys(self.out / "alerts.jsonl", ("checkpoint", "track", "kind"))

    def _logged_keys(self) -> set:
        return _jsonl_keys(self.wdir / "log.jsonl", ("checkpoint", "fingerprint"))

    def _clean_superseded(self, paths: list[str]) -> None:
        for p in map(Path, paths):
            if p.name not in _OWN_DOWNSTREAM:
                self.echo(f"[watch] note: the scores changed; moved the previous {p.name} to {p.parent}/ "
                          "(re-run that stage on the new scores)")
            else:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                try:
                    p.parent.rmdir()  # the stamp folder, when nothing else was moved there
                    p.parent.parent.rmdir()
                except OSError:
                    pass

    def _downstream(self) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
        from .dynamics import compute_dynamics

        notes: list[str] = []
        try:
            if self.report:
                from .report import write_report

                write_report(self.out)
            else:
                compute_dynamics(self.out, plots=self.plots)
        except ProbeselectError as exc:
            self.echo(f"[watch] note: dynamics/report not updated: {exc}")
        d = self.out / "dynamics"
        if not (d / "trajectories.csv").is_file():
            return pd.DataFrame(columns=["track"]), pd.DataFrame(columns=["track", "hop_threshold"]), notes
        traj = pd.read_csv(d / "trajectories.csv")
        traj["variant"] = traj["variant"].astype(str)
        return traj, pd.read_csv(d / "dynamics.csv"), notes

    def _windows(self):
        from .attribution import AttributionError, find_lineage, load_windows

        path = self.lineage or find_lineage(self.out)
        if path is None:
            return []
        try:
            return load_windows(path)
        except AttributionError:
            return []

    # -- loop --------------------------------------------------------------------------
    def run(self, *, max_polls: int | None = None) -> WatchResult:
        """Poll until ``until_step``, ``idle_exit`` or Ctrl-C (``KeyboardInterrupt`` propagates;
        what was processed is in ``state.json``, so the same call resumes)."""
        total = WatchResult()
        self._open()
        last_new = time.monotonic()
        polls = 0
        try:
            done_steps = [d["checkpoint"]["step"] for d in self.state["processed"].values()]
            while True:
                r = self.poll_once()
                polls += 1
                for k in ("processed", "model_scored", "alerts"):
                    getattr(total, k).extend(getattr(r, k))
                total.failed.update(r.failed)
                if r.processed or r.failed:
                    last_new = time.monotonic()
                    done_steps += [self.state["processed"][n]["checkpoint"]["step"] for n in r.processed]
                if self.until_step is not None and any(s is not None and s >= self.until_step for s in done_steps):
                    total.stop_reason = f"reached step {self.until_step}"
                    break
                if self.idle_exit is not None and time.monotonic() - last_new >= self.idle_exit * 60:
                    total.stop_reason = f"no new checkpoint for {self.idle_exit:g} min"
                    break
                if max_polls is not None and polls >= max_polls:
                    total.stop_reason = f"{polls} polls"
                    break
                time.sleep(self.every)
        finally:
            total.vanished = sorted(self.state["vanished"])
            self.close()
        return total
