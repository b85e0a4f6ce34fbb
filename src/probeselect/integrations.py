"""Probes inside the training loop: a ``transformers.Trainer`` callback and a plain function.

:class:`ProbeCallback` scores every checkpoint the ``Trainer`` saves (``on_save``, i.e.
``OUTPUT_DIR/checkpoint-<global_step>``) into one run folder, the same folder
``probeselect watch``, ``dynamics`` and ``report`` use (it runs the same code:
:class:`probeselect.watch.Watcher`, with the saved checkpoint known to be complete), and
logs the checkpoint's probe scalars through ``Trainer.log`` so that ``report_to`` sends them
to TensorBoard / W&B / MLflow and they land in ``trainer.state.log_history``:
``probes/<family>/<variant>/margin`` (mean margin, nats), ``.../accuracy``,
``.../margin_seed_sd``, ``probes/heldout_nll/bpb/bits_per_byte`` when ``heldout`` is given,
``probes/checkpoint_step`` (the step of the scored checkpoint) and ``probes/alerts`` (alerts
raised by that checkpoint; they are in ``RUN/alerts.jsonl``).

* ``background=False`` (default): scored inside ``on_save``; training waits. The scalars
  are logged at the checkpoint's own step.
* ``background=True``: scored in a child process (``python -m probeselect.integrations``),
  one checkpoint at a time in save order, so the training step is not blocked (it competes
  for CPU/GPU with training). Finished results are logged at the next step end, i.e. at a
  later ``global_step`` than the checkpoint's (``probes/checkpoint_step`` says which
  checkpoint; ``probeselect export`` writes the series at the true steps). At
  ``on_train_end`` the callback waits for the queue (``wait_at_end``) and logs the rest.

Only the world process zero scores: ``TrainerState.is_world_process_zero``, else
``torch.distributed``'s rank, else ``$RANK`` (:func:`is_rank_zero`). Under a multi-process
launch (``WORLD_SIZE`` > 1) in-process scoring runs in a single-process child too (waited
for), because :func:`probeselect.score.score_checkpoints` would otherwise shard its work
over the training's process group, whose other ranks are training. ``Trainer.log`` needs
the trainer: bind it with ``callback.bind(trainer)`` or use :func:`add_probe_callback`;
unbound, the scalars are appended to ``state.log_history`` only.

For a custom loop, call :func:`score_checkpoint_now` after each save.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from transformers import TrainerCallback

__all__ = ["ProbeCallback", "add_probe_callback", "score_checkpoint_now", "is_rank_zero"]


def is_rank_zero(state: Any = None) -> bool:
    """True in the process that should score: ``state.is_world_process_zero`` when a
    Trainer state is given, else rank 0 of an initialised ``torch.distributed`` group, else
    ``$RANK`` unset or 0."""
    if state is not None and hasattr(state, "is_world_process_zero"):
        return bool(state.is_world_process_zero)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank() == 0
    except ImportError:  # pragma: no cover - torch without distributed
        pass
    return int(os.environ.get("RANK", "0") or 0) == 0


def _metrics_for(out: Path, name: str) -> dict[str, float] | None:
    f = Path(out) / "watch" / "log.jsonl"
    if not f.is_file():
        return None
    rec = None
    for line in f.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("checkpoint") == name:
            rec = r
    if rec is None:
        return None
    return {**rec.get("metrics", {}), "probes/checkpoint_step": float(rec["step"]),
            "probes/alerts": float(rec.get("alerts", 0))}


def score_checkpoint_now(ckpt_dir: str | Path, name: str, probes: Sequence, out: str | Path, *, state: Any = None,
                         report: bool = False, echo=None, **score_kwargs: Any) -> dict[str, float] | None:
    """Score the just-saved checkpoint ``ckpt_dir/name`` into the run folder ``out`` (with
    any earlier checkpoint of ``ckpt_dir`` not yet scored) and return its probe scalars
    (module docstring), or None on a process other than rank 0 or when the folder is
    gone (recorded as ``vanished`` in ``out/watch/state.json``). ``score_kwargs`` go to
    :func:`probeselect.score.score_checkpoints` (``seeds``, ``heldout`` ...)."""
    from .watch import Watcher

    if not is_rank_zero(state):
        return None
    if _in_multiprocess_launch():
        # score_checkpoints shards its work over the launch's process group, and the other
        # ranks are training: score in a single-process child instead (blocking here).
        proc = _spawn(str(ckpt_dir), name, probes, Path(out), report, score_kwargs)
        if proc.wait():
            raise RuntimeError(f"scoring {name} in a child process failed (exit {proc.returncode}); see the messages "
                               "above")
        return _metrics_for(Path(out), name)
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    w = Watcher(ckpt_dir, probes, out, report=report, echo=echo, **score_kwargs)
    try:
        w._open()
        if not (Path(ckpt_dir) / name).is_dir():
            echo(f"[probes] {name}: deleted before it was scored (save_total_limit?); skipped")
            w.state["vanished"][name] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            w._save_state()
            return None
        w.poll_once(assume_complete=[name])
    finally:
        w.close()
    return _metrics_for(Path(out), name)


def _in_multiprocess_launch() -> bool:
    """True under torchrun/accelerate (``WORLD_SIZE`` > 1) or an initialised process group of > 1 ranks."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return True
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except ImportError:  # pragma: no cover
        return False


def _spawn(ckpt_dir: str, name: str, probes: Sequence, out: Path, report: bool,
           score_kwargs: dict) -> subprocess.Popen:
    """Start ``python -m probeselect.integrations`` scoring ``ckpt_dir/name`` as a single process."""
    cfg = {"ckpt_dir": ckpt_dir, "name": name, "probes": [_probe_arg(p) for p in probes], "out": str(out),
           "report": report, "score_kwargs": score_kwargs}
    env = {**os.environ, "RANK": "0"}  # the child scores alone, whatever the launcher's variables say
    for k in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "probeselect.integrations", json.dumps(cfg, default=str)], env=env)


def _probe_arg(p) -> dict:
    from .probes import FamilySpec

    if isinstance(p, FamilySpec):
        if p.path is not None:
            return {"path": str(p.path)}
        if p.user_data is not None:
            raise TypeError(f"ProbeCallback(background=True): pass the spec file of family {p.family!r} "
                            "(a data-defined spec without a file cannot be sent to the scoring process).")
        d = p.to_dict()
        return {"dict": {k: d[k] for k in ("family", "n_items", "n_demos", "variants", "params", "description")}}
    return {"path": str(p)}


def _probe_from_arg(a: dict):
    from .probes import spec_from_dict

    return spec_from_dict(a["dict"]) if "dict" in a else a["path"]


class ProbeCallback(TrainerCallback):
    """Score each saved checkpoint with conflict probes (module docstring).

    ``probes``: spec files or :class:`~probeselect.probes.FamilySpec`; ``out``: the run
    folder; ``background``: score in a child process; ``report``: also rewrite
    ``report.md/html`` after each checkpoint (default: only ``dynamics/``);
    ``score_kwargs``: passed to :func:`probeselect.score.score_checkpoints`.
    """

    def __init__(self, probes: Sequence, out: str | Path, *, background: bool = False, report: bool = False,
                 wait_at_end: bool = True, trainer: Any = None, **score_kwargs: Any):
        self.probes = list(probes)
        self.out = Path(out)
        self.background = background
        self.report = report
        self.wait_at_end = wait_at_end
        self.trainer = trainer
        self.score_kwargs = score_kwargs
        self._queue: list[tuple[str, str]] = []  # (ckpt_dir, name)
        self._child: tuple[subprocess.Popen, str] | None = None
        self.logged: list[dict[str, float]] = []  # every scalar dict logged, in order
        self.blocked_s = 0.0  # seconds the training loop spent inside this callback

    def bind(self, trainer) -> "ProbeCallback":
        """Log through ``trainer.log`` (so ``report_to`` integrations receive the scalars)."""
        self.trainer = trainer
        return self

    # -- logging -------------------------------------------------------------------------
    def _log(self, metrics: dict[str, float] | None, state) -> None:
        if not metrics:
            return
        self.logged.append(metrics)
        if self.trainer is not None:
            self.trainer.log(dict(metrics))
        elif state is not None:
            state.log_history.append({**metrics, "step": state.global_step})

    # -- background queue ----------------------------------------------------------------
    def _start_next(self) -> None:
        if self._child is not None or not self._queue:
            return
        ckpt_dir, name = self._queue.pop(0)
        self._child = (_spawn(ckpt_dir, name, self.probes, self.out, self.report, self.score_kwargs), name)

    def _pump(self, state, *, wait: bool = False) -> None:
        while self._child is not None:
            proc, name = self._child
            if proc.poll() is None:
                if not wait:
                    return
                proc.wait()
            self._child = None
            if proc.returncode:
                print(f"[probes] scoring {name} in the background failed (exit {proc.returncode}); see the "
                      "messages above", file=sys.stderr, flush=True)
            else:
                self._log(_metrics_for(self.out, name), state)
            self._start_next()

    # -- Trainer events ------------------------------------------------------------------
    def on_save(self, args, state, control, **kwargs):
        if not is_rank_zero(state):
            return control
        t0 = time.perf_counter()
        name = f"checkpoint-{state.global_step}"
        if self.background:
            self._queue.append((str(args.output_dir), name))
            self._pump(state)
            self._start_next()
        else:
            self._log(score_checkpoint_now(args.output_dir, name, self.probes, self.out, state=state,
                                           report=self.report, **self.score_kwargs), state)
        self.blocked_s += time.perf_counter() - t0
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.background and self._child is not None and is_rank_zero(state):
            t0 = time.perf_counter()
            self._pump(state)
            self.blocked_s += time.perf_counter() - t0
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.background and is_rank_zero(state):
            self._pump(state, wait=self.wait_at_end)
        return control


def add_probe_callback(trainer, probes: Sequence, out: str | Path, **kwargs: Any) -> ProbeCallback:
    """Create a :class:`ProbeCallback`, bind it to ``trainer`` and add it; returns it."""
    cb = ProbeCallback(probes, out, **kwargs).bind(trainer)
    trainer.add_callback(cb)
    # Run before the reporting integrations (TensorBoard, W&B, ...): in background mode the last results are
    # logged in on_train_end, which must happen before those integrations close their writers in theirs.
    cbs = trainer.callback_handler.callbacks
    first = next((i for i, c in enumerate(cbs) if type(c).__module__.startswith("transformers.integrations")), None)
    if first is not None:
        cbs.remove(cb)
        cbs.insert(first, cb)
    return cb


def _child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    kw = cfg["score_kwargs"]
    if "seeds" in kw:
        kw["seeds"] = list(kw["seeds"])
    score_checkpoint_now(cfg["ckpt_dir"], cfg["name"], [_probe_from_arg(a) for a in cfg["probes"]], cfg["out"],
                         report=cfg["report"], **kw)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
