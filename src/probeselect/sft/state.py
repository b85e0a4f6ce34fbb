"""Full-state training checkpoints: everything the next optimizer step depends on.

``state/step-<N>/`` holds the trainable weights (safetensors; the LoRA adapter or the full
model), AdamW moments, the scheduler position, the grad scaler, every process's RNG
streams (python, numpy, torch, CUDA), the data cursor (the next manifest step) and the
recipe, manifest and base hashes. It is written to a temporary folder and renamed into
place, then ``state/latest.json`` is pointed at it, so a kill leaves the previous state
intact. A state is only ever loaded into a run with the same hashes, onto any device
(tensors are read to the CPU first).

A fail-fast state (``state/nonfinite-step-<N>/``, the state before the failed step N) is
written with ``name=`` and ``set_latest=False``: it never becomes the resume point and is
never pruned.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .._io import atomic_write_json
from ..errors import ResumeError

__all__ = ["save_state", "load_state", "latest_state", "rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """All RNG streams of this process, in a form ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state()
    out = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save_state(state_dir: Path, *, step: int, model, optimizer, scheduler, scaler, meta: dict[str, Any],
               rank: int = 0, is_main: bool = True, barrier: Callable[[], None] = lambda: None,
               keep: int = 2, name: str | None = None, set_latest: bool = True) -> Path:
    """Write ``state_dir/step-<step>/`` (or ``state_dir/<name>/``; every rank writes its own RNG
    file). With ``set_latest`` point latest.json at it and prune old ``step-*`` states."""
    state_dir = Path(state_dir)
    name = name or f"step-{step:06d}"
    final = state_dir / name
    tmp = state_dir / f".tmp-{name}"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")
    barrier()
    if is_main:
        save_file({n: p.detach().cpu().contiguous() for n, p in _trainable(model).items()}, str(tmp / "trainable.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        full_meta = dict(meta, step=step, cursor=step, created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds"))
        atomic_write_json(tmp / "meta.json", full_meta)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if set_latest:
            atomic_write_json(state_dir / "latest.json", {"step": step, "dir": final.name})
            old = sorted(p for p in state_dir.glob("step-*") if p.is_dir() and p != final)
            for p in old[: max(0, len(old) - (keep - 1))]:
                shutil.rmtree(p, ignore_errors=True)
    barrier()
    return final


def latest_state(state_dir: Path) -> Path | None:
    """The folder ``latest.json`` points at, or None when no state was saved."""
    f = Path(state_dir) / "latest.json"
    if not f.is_file():
        return None
    d = Path(state_dir) / json.loads(f.read_text(encoding="utf-8"))["dir"]
    return d if (d / "meta.json").is_file() else None


def load_state(path: Path, *, model, optimizer, scheduler, scaler, expect: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    """Restore a state saved by :func:`save_state`; ``expect`` holds hashes that must match its meta."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    for k, v in expect.items():
        if meta.get(k) != v:
            raise ResumeError(f"{path}: saved state has {k}={meta.get(k)!r}, this run has {v!r}; it belongs to a "
                              "different run. Delete the run folder's state/ (and train_log) or use a new --out.")
    params = _trainable(model)
    saved = load_file(str(path / "trainable.safetensors"))
    if set(saved) != set(params):
        missing = sorted(set(params) ^ set(saved))[:3]
        raise ResumeError(f"{path}: saved trainable tensors do not match the model (e.g. {missing}).")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n].to(p.device, p.dtype))
    # map_location="cpu": a state saved on one device loads on any other (optimizer.load_state_dict
    # moves the moments to the parameters' device).
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    if scaler is not None and (path / "scaler.pt").is_file():
        scaler.load_state_dict(torch.load(path / "scaler.pt", map_location="cpu", weights_only=True))
    rng_file = path / f"rng-rank{rank}.pt"
    if not rng_file.is_file():
        raise ResumeError(f"{path}: no RNG state for rank {rank}; resume with the process count it was saved with "
                          f"({meta.get('world_size')}).")
    set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))
    return meta
