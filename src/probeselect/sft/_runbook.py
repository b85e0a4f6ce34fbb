"""The per-run bookkeeping of an SFT run, shared by the single-run loop (:func:`.loop.train`) and
the batched-seeds loop (:func:`.batched.train_seeds`), so that both write the same files the same way.

A :class:`RunBook` owns one run folder:

- ``state/``: the resume point (:meth:`RunBook.resume` loads the latest state, checking its hashes)
  and the checkpoints (:meth:`RunBook.save`, every ``checkpointing.every`` steps and at the last);
- ``data_manifest.json``: written when the run has no state; with a state it must still match the
  run's manifest (else :class:`ManifestMismatchError`);
- ``train_log.jsonl``: cut back to the resume cursor on resume (the rows after it are counted as
  the new segment's ``discarded_log_rows``), then one row a step (:meth:`RunBook.log`);
- ``lineage.json``: one segment per (re)start; a segment left ``running`` by a kill is closed as
  ``complete`` (it had reached the last step) or ``interrupted``; the new segment ends ``complete``
  or ``failed`` (:meth:`RunBook.close`, :meth:`RunBook.fail_nonfinite`);
- ``nonfinite_batch.json`` and ``state/nonfinite-step-<N>/`` for a fail-fast nonfinite step.

The loops keep the numerics (forward/backward, clipping, optimizer steps); the book keeps the
files, the segment, the spike detector and the step row.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any, Callable

from .._io import atomic_write_json, atomic_write_jsonl
from ..errors import ManifestMismatchError, NonfiniteGradientError
from .diagnostics import SpikeDetector, summarize_train_log
from .manifest import compare_manifests, manifest_hash
from .recipe import Recipe
from .state import latest_state, load_state, save_state, set_rng_state

__all__ = ["RunBook"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill; everything after it is stale anyway
    return rows


def _append_row(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()


def _summary(rows: list[dict[str, Any]], lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """Train-log summary plus wall seconds of training steps (all segments), resumes (segments
    that continued from a saved state and trained at least one step) and supervised tokens per
    second of step time."""
    summary = summarize_train_log(rows)
    secs = sum(seg.get("seconds") or 0.0 for seg in lineage)
    toks = sum(seg.get("sup_tokens") or 0 for seg in lineage)
    resumes = sum(1 for seg in lineage if seg["parent_state"] and seg.get("end_step", 0) > seg.get("start_step", 0))
    summary.update(seconds=secs, resumes=resumes, tokens_per_s=toks / secs if secs else None)
    return summary


class RunBook:
    """The files and the lineage segment of one run (``run_dir``) trained on ``manifest``.

    ``model`` (anything with ``named_parameters``; its trainable tensors are saved), ``optimizer``,
    ``scheduler`` and ``scaler`` are what a state holds. Under DDP every rank has a book; only
    ``is_main`` writes the log, lineage and manifest, and ``barrier`` synchronises the ranks while
    a state is saved. ``own_rng`` (batched seeds, where several runs share one process): the run's
    own RNG streams, restored before each save so that the state holds them.

    Usage: :meth:`resume` (True: the run had already finished; nothing to train), then
    :meth:`open_segment`, then per step :meth:`step_row` and :meth:`log` (or
    :meth:`fail_nonfinite`), then :meth:`close`.
    """

    def __init__(self, run_dir: str | Path, recipe: Recipe, manifest: dict[str, Any], base_fingerprint: str | None,
                 *, model, optimizer, scheduler, scaler=None, world: int = 1, rank: int = 0, is_main: bool = True,
                 barrier: Callable[[], None] = lambda: None):
        self.run_dir = Path(run_dir)
        self.recipe, self.manifest, self.n_steps = recipe, manifest, manifest["n_steps"]
        # States and finished runs are keyed by the training hash; the full recipe hash is recorded.
        self.hashes = {"train_sha256": recipe.train_sha256, "manifest_sha256": manifest_hash(manifest),
                       "base_fingerprint": base_fingerprint}
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.world, self.rank, self.is_main, self.barrier = world, rank, is_main, barrier
        self.log_path = self.run_dir / "train_log.jsonl"
        self.lineage_path = self.run_dir / "lineage.json"
        self.state_dir = self.run_dir / "state"
        self.manifest_path = self.run_dir / "data_manifest.json"
        self.cursor, self.parent, self.discarded = 0, None, 0
        self.rows: list[dict[str, Any]] = []
        self.lineage: list[dict[str, Any]] = []
        self.segment: dict[str, Any] | None = None
        self.spikes: SpikeDetector | None = None
        self.meta_base: dict[str, Any] = {}
        self.seconds, self.seg_tokens = 0.0, 0
        self.own_rng: dict[str, Any] | None = None

    # -- start ----------------------------------------------------------------------------------

    def resume(self) -> bool:
        """Load the latest state (if any) into the model/optimizer/scheduler/scaler, check the saved
        data manifest against it, cut the log back to the cursor, close killed segments and write
        the log and (without a state) the manifest. True when the run is already at its last step
        (then the lineage is written and nothing else is to be done)."""
        lineage_path, dm_path = self.lineage_path, self.manifest_path
        self.lineage = json.loads(lineage_path.read_text(encoding="utf-8"))["segments"] if lineage_path.is_file() else []
        prev = latest_state(self.state_dir)
        if prev is not None:
            meta = load_state(prev, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                              scaler=self.scaler, expect={**self.hashes, "world_size": self.world}, rank=self.rank)
            self.cursor, self.parent = meta["cursor"], str(prev)
        if prev is not None and dm_path.is_file():
            diff = compare_manifests(json.loads(dm_path.read_text(encoding="utf-8")), self.manifest)
            if diff is not None:
                raise ManifestMismatchError(
                    f"{dm_path}: differs from the data manifest of this run and of its saved state {prev} ({diff}); "
                    f"the file was modified. Restore it, or delete {self.run_dir} to retrain this (base, seed).")
        all_rows = _read_rows(self.log_path)
        self.rows = [r for r in all_rows if r["step"] <= self.cursor]
        self.discarded = len(all_rows) - len(self.rows)
        for seg in self.lineage:
            if seg["status"] == "running":  # killed: after its last step (complete) or before (interrupted)
                seg["status"] = "complete" if seg.get("end_step", 0) >= self.n_steps else "interrupted"
        if self.is_main:
            atomic_write_jsonl(self.log_path, self.rows)
            if prev is None or not dm_path.is_file():  # no state: a manifest left from an earlier run is stale
                atomic_write_json(dm_path, self.manifest)
        if self.cursor >= self.n_steps:  # finished earlier: reload only (no empty lineage segment, not a resume)
            self.write_lineage()
            return True
        return False

    def open_segment(self, **extra) -> None:
        """Append this (re)start's ``running`` segment (``extra``: more keys, after the standard ones),
        write the lineage and set up the spike detector on the kept rows' losses."""
        seg_id = len(self.lineage)
        self.segment = {"segment": seg_id, "start_step": self.cursor, "end_step": self.cursor,
                        "parent_state": self.parent, "discarded_log_rows": self.discarded, "status": "running",
                        "world_size": self.world, "started_utc": _now(), "ended_utc": None,
                        "recipe_sha256": self.recipe.sha256, **self.hashes, **extra}
        self.lineage.append(self.segment)
        self.write_lineage()
        r = self.recipe
        self.spikes = SpikeDetector(r.spike_window, r.spike_threshold, r.spike_min_history,
                                    [row["loss"] for row in self.rows], z=r.spike_z)
        self.meta_base = {**self.hashes, "recipe_sha256": r.sha256, "world_size": self.world,
                          "parent_state": self.parent, "segment": seg_id}

    # -- per step -------------------------------------------------------------------------------

    @property
    def untrained(self) -> bool:
        """No update applied yet (every logged step, if any, was skipped): the model is the base."""
        return not any(not r.get("skipped") for r in self.rows)

    def write_lineage(self) -> None:
        if self.is_main:
            atomic_write_json(self.lineage_path, {"segments": self.lineage})

    def save(self, step: int, meta: dict[str, Any] | None = None, **kw) -> Path:
        """A state at ``step`` (``kw``: ``name``/``set_latest`` of :func:`.state.save_state`)."""
        if self.own_rng is not None:
            set_rng_state(self.own_rng)
        return save_state(self.state_dir, step=step, model=self.model, optimizer=self.optimizer,
                          scheduler=self.scheduler, scaler=self.scaler, meta={**self.meta_base, **(meta or {})},
                          rank=self.rank, is_main=self.is_main, barrier=self.barrier,
                          keep=self.recipe.checkpoint_keep, **kw)

    def step_row(self, s: int, *, loss: float, norm: float, clip_coef: float, clipped: bool, nonfinite: bool,
                 skipped: bool, retries: int, n_sup: int, lr: float, update_norm: float,
                 layer: dict[str, Any]) -> dict[str, Any]:
        """The log row of 0-based step ``s``; feeds the loss to the spike detector and counts the
        step's supervised tokens into the segment."""
        spike, median = self.spikes.update(loss)
        self.seg_tokens += n_sup
        return {"step": s + 1, "segment": self.segment["segment"], "loss": loss, "grad_norm_preclip": norm,
                "clip_coef": clip_coef, "clipped": clipped, "nonfinite": nonfinite, "skipped": skipped,
                "scaler_retries": retries, "sup_tokens": n_sup, "lr": lr, "update_norm": update_norm,
                "layer_grad_norms": layer, "spike": spike, "loss_median_prev": median,
                "spike_margin": self.spikes.last_margin}

    def log(self, row: dict[str, Any]) -> None:
        """Record a finished step: append its row, advance the segment and checkpoint when due."""
        step = row["step"]
        self.rows.append(row)
        if self.is_main:
            _append_row(self.log_path, row)
        self.segment.update(end_step=step, seconds=self.seconds, sup_tokens=self.seg_tokens)
        every = self.recipe.checkpoint_every
        if (every and step % every == 0) or step == self.n_steps:
            self.save(step)
            self.write_lineage()

    def fail_nonfinite(self, s: int, *, ids: list[str], loss: float, norm: float, layer: dict[str, Any],
                       retries: int, base_broken: tuple[bool, str] | None, note: str = "") -> NonfiniteGradientError:
        """Fail-fast for 0-based step ``s`` (the caller has restored the pre-step state): save it as
        ``state/nonfinite-step-<s+1>/`` (latest.json untouched), write the batch ids to
        ``nonfinite_batch.json``, mark the segment failed. Returns the error to raise or record
        (``note`` ends its message)."""
        where = self.save(s, meta={"reason": "nonfinite", "failed_step": s + 1, "scaler_retries": retries},
                          name=f"nonfinite-step-{s + 1:06d}", set_latest=False)
        what = "loss" if not math.isfinite(loss) else (
            f"gradient after {retries} loss-scale reductions" if self.scaler is not None else "gradient")
        bad = {"step": s + 1, "ids": ids, "loss": loss, "grad_norm_preclip": norm, "layer_grad_norms": layer,
               "scaler_retries": retries, "state": str(where)}
        if self.is_main:
            atomic_write_json(self.run_dir / "nonfinite_batch.json", bad)
        self.segment.update(status="failed", end_step=s, ended_utc=_now())
        self.write_lineage()
        if base_broken:
            return NonfiniteGradientError(
                f"{self.run_dir}: optimizer step {s + 1}: {base_broken[1]} (loss {loss}, before any update). The "
                f"batch is not the cause; nothing was trained (state before the step: {where}).")
        return NonfiniteGradientError(
            f"{self.run_dir}: optimizer step {s + 1}: nonfinite {what} (loss {loss}, pre-clip norm {norm}). Batch "
            f"ids saved to {self.run_dir / 'nonfinite_batch.json'}, the state before the step to {where} "
            "(latest.json still names the last regular checkpoint). Inspect those examples; "
            f"diagnostics.nonfinite=skip skips such steps (counted) instead.{note}")

    # -- end ------------------------------------------------------------------------------------

    def close(self, base) -> NonfiniteGradientError | None:
        """End the segment after the last step: ``complete``, or ``failed`` (returned as an error) when
        every step was skipped, since then no update was applied and the "trained" model is ``base``."""
        if self.rows and all(r.get("skipped") for r in self.rows):
            self.segment.update(status="failed", ended_utc=_now(), seconds=self.seconds, sup_tokens=self.seg_tokens)
            self.write_lineage()
            return NonfiniteGradientError(
                f"{self.run_dir}: all {len(self.rows)} optimizer steps were nonfinite and skipped "
                "(diagnostics.nonfinite=skip); no update was applied, so this run is failed, not a result. Check "
                f"the base {base} (`probeselect score` on it) and the steps in train_log.jsonl.")
        self.segment.update(status="complete", ended_utc=_now(), seconds=self.seconds, sup_tokens=self.seg_tokens)
        self.write_lineage()
        return None

    def summary(self) -> dict[str, Any]:
        return _summary(self.rows, self.lineage)
