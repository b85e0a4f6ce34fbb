"""Job arrays for ``score``: ``--shard I/N`` and ``--merge``.

A scoring run is a list of work units (checkpoint x family x item chunk, plus held-out,
generation and audit units; see ``score._plan_units``), planned deterministically from
the ladder, the probes and the flags. ``--shard I/N`` (``1 <= I <= N``) scores the I-th of N
contiguous blocks of that list (blocks differ by at most one unit; contiguous so that each
shard loads as few checkpoints as possible) into a shared run folder:

* every unit's cache file is written atomically under ``cache/`` (as in a plain run), so
  shards can run at the same time on different machines over a shared filesystem;
* a shard never writes the final tables, ``items.jsonl`` or ``manifest.json``, never
  deletes anything but its own units' orphaned temporary files, and takes no run-folder
  lock; its record is its own file ``shards/shard-I-of-N.json`` (status ``running`` while it
  works, then ``complete`` or ``incomplete`` with its failed checkpoints);
* the shard that finds every unit of the plan cached when it finishes claims the merge
  (an exclusive-create ``shards/merge-<plan>.claim`` file, so two shards finishing together
  do not both merge) and writes the final tables exactly as a one-process run would;
* ``--merge`` writes the final tables from the cache, or refuses, naming the shards whose
  units are missing and a few of the units, when any unit of the plan has no cache file.
  It never loads a model.

The plan hash (``shards/...json: plan_hash``) identifies the unit list; a merge run with
different flags (probes, seeds, dtype, device type, chunk size, ...) plans different units
and says so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from ._dist import split_contiguous
from ._io import atomic_write_json, canonical_json_hash
from .errors import ProbeselectError

__all__ = ["ShardError", "parse_shard", "owned_units", "plan_hash", "check_merge", "begin_shard", "finish_shard"]


class ShardError(ProbeselectError):
    """A ``--shard``/``--merge`` request cannot be honoured (bad spec, missing units)."""


_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(spec: str | tuple[int, int]) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``; shards are numbered 1..N (SLURM: ``--array=1-N``)."""
    if isinstance(spec, tuple):
        i, n = spec
    else:
        m = _SPEC.match(str(spec))
        if not m:
            raise ShardError(f"--shard {spec!r}: expected I/N, e.g. --shard 2/8 (shard 2 of 8).")
        i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise ShardError(f"--shard {i}/{n}: shards are numbered 1..N with N >= 1 (e.g. --shard 1/{max(n, 1)}).")
    return i, n


def owned_units(n_units: int, shard: tuple[int, int]) -> range:
    """Indices of the units shard ``(i, n)`` owns: the i-th contiguous block."""
    i, n = shard
    return split_contiguous(n_units, n, i - 1)


def plan_hash(units: Sequence[Any]) -> str:
    return canonical_json_hash([u.key for u in units])


def _shard_file(run_dir: Path, shard: tuple[int, int]) -> Path:
    i, n = shard
    return run_dir / "shards" / f"shard-{i}-of-{n}.json"


def _describe(unit, ckpts) -> str:
    return f"{ckpts[unit.ckpt_index].name}/{unit.task}:{unit.family}#{unit.chunk}"


def _shard_records(run_dir: Path) -> list[dict]:
    import json

    out = []
    for f in sorted((run_dir / "shards").glob("shard-*-of-*.json")):
        try:
            out.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # an unreadable record is reported as "no record" below
    return out


def check_merge(run_dir: Path | None, units: Sequence[Any], ckpts: Sequence[Any],
                cache_path: Callable[[Path, Any, Any], Path], *, keep_going: bool) -> dict[str, str]:
    """Refuse a merge unless every unit of the plan is cached.

    Returns the checkpoints that a shard recorded as failed (with ``keep_going``), which the
    merge records as failed instead of scoring them. Raises :class:`ShardError` naming the
    shards with missing units otherwise.
    """
    if run_dir is None:
        raise ShardError("--merge needs --out: the run folder the shards wrote into.")
    run_dir = Path(run_dir)
    ph = plan_hash(units)
    records = _shard_records(run_dir)
    mine = [r for r in records if r.get("plan_hash") == ph]
    failed: dict[str, str] = {}
    for r in mine:
        failed.update(r.get("failed") or {})
    missing = [k for k, u in enumerate(units) if not cache_path(run_dir, ckpts[u.ckpt_index], u).is_file()]
    if keep_going:
        missing = [k for k in missing if ckpts[units[k].ckpt_index].name not in failed]
    else:
        failed = {}
    if not missing:
        return failed
    ns = sorted({r["shard"][1] for r in mine if isinstance(r.get("shard"), list)})
    parts = []
    if len(ns) == 1:
        n = ns[0]
        status = {tuple(r["shard"]): r.get("status", "?") for r in mine}
        for i in range(1, n + 1):
            own = set(owned_units(len(units), (i, n)))
            lost = [k for k in missing if k in own]
            if lost:
                st = status.get((i, n))
                what = f"status {st}" if st else f"not started: no shards/shard-{i}-of-{n}.json"
                eg = ", ".join(_describe(units[k], ckpts) for k in lost[:3])
                parts.append(f"shard {i}/{n} ({what}): {len(lost)} unit(s) missing, e.g. {eg}")
    else:
        eg = ", ".join(_describe(units[k], ckpts) for k in missing[:5])
        parts.append(f"missing units include {eg}")
        if records and not mine:
            parts.append("the shard records in shards/ were written for a different plan (other ladder, probes or "
                         "flags, e.g. --device or --dtype); merge with exactly the shards' flags")
    raise ShardError(
        f"cannot merge {run_dir}: {len(missing)} of {len(units)} work units are not scored yet; "
        + "; ".join(parts) + ". Run the missing shard(s) with the same flags, then --merge again."
    )


def _record(manifest: dict, shard, units, own, status: str, **extra) -> dict:
    rec = {k: v for k, v in manifest.items() if k not in ("complete", "failed", "status")}
    rec.update(kind="score-shard", shard=list(shard), status=status, plan_hash=plan_hash(units),
               n_units_total=len(units), n_units_owned=len(own), **extra)
    return rec


def begin_shard(run_dir: Path | None, shard: tuple[int, int], manifest: dict, units, own: Sequence[int],
                ckpts, cache_path: Callable[[Path, Any, Any], Path]) -> None:
    """Create the run folder, clean this shard's own orphaned temporary files and write its record."""
    if run_dir is None:
        raise ShardError("--shard needs --out: a run folder shared by every shard.")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for k in own:
        u = units[k]
        p = cache_path(run_dir, ckpts[u.ckpt_index], u)
        for orphan in p.parent.glob(f".{p.name}.*.tmp"):  # only this shard's units: others may be writing
            orphan.unlink(missing_ok=True)
    atomic_write_json(_shard_file(run_dir, shard), _record(manifest, shard, units, own, "running"))


def finish_shard(run_dir: Path, shard: tuple[int, int], manifest: dict, units, own: Sequence[int], ckpts,
                 cache_path, *, failed: dict[str, str], scored: Sequence[str], dist) -> tuple[dict, bool]:
    """Write this shard's final record; return ``(record, merge_now)``.

    ``merge_now`` is True on every rank when every unit of the plan is cached and this
    shard won the merge claim.
    """
    run_dir = Path(run_dir)
    merge_now = False
    rec = _record(manifest, shard, units, own, "incomplete" if failed else "complete",
                  failed=dict(failed), scored_now=list(scored))
    if dist.is_main:
        pending = sum(1 for u in units if not cache_path(run_dir, ckpts[u.ckpt_index], u).is_file())
        rec["units_pending"] = pending  # of the whole plan, when this shard finished
        atomic_write_json(_shard_file(run_dir, shard), rec)
        if pending == 0:
            claim = run_dir / "shards" / f"merge-{rec['plan_hash'][:16]}.claim"
            try:
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass  # another shard merges (or merged); `--merge` re-merges explicitly
            else:
                os.write(fd, f"shard {shard[0]}/{shard[1]} pid {os.getpid()}\n".encode())
                os.close(fd)
                merge_now = True
    merge_now, pending = dist.all_gather((merge_now, rec.get("units_pending")))[0]
    rec["units_pending"] = pending
    return rec, merge_now
