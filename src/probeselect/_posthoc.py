"""POST-HOC is sticky: the history of a run's plan hashes, and what it implies.

``RUN/plan_history.jsonl`` gets one line per event, never rewritten except by appending:
``locked`` (``plan lock``), ``select`` (a selection written: ``post_hoc`` true or false,
with its reasons) and ``select_refused`` (``select`` refused as post-hoc), each with the
plan's sha256 and path and the UTC time. Once any selection of the run was made POST-HOC,
:func:`sticky_reasons` gives a reason for every later lock check, so restoring the plan's
original bytes cannot make a later selection (or report) of the run look predeclared.

:func:`probeselect._live_selection.live_selection` recomputes, for the report, whether ``selection.json`` is still
predeclared from the lock and the plan file as they are now (never from the old record),
and carries the score run's nonfinite checkpoints (``manifest.json`` ``nonfinite``) for the
report's run-correctness line.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

HISTORY = "plan_history.jsonl"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / HISTORY
    out: list[dict[str, Any]] = []
    if not p.is_file():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if isinstance(rec, dict):
            out.append(rec)
    return out


def record(run_dir: str | Path, event: str, *, plan_sha256: str | None, plan_path: str | None = None,
           post_hoc: bool | None = None, reasons: list[str] | None = None) -> dict[str, Any]:
    """Append one event to the run's plan history (one JSON line, flushed and fsynced). A
    ``select``/``select_refused`` event already recorded for the same plan and status is not
    repeated (re-running an unchanged selection leaves the history, and selection.json, as they were)."""
    rec = {"event": event, "utc": _now(), "plan_sha256": plan_sha256, "plan_path": plan_path}
    if post_hoc is not None:
        rec["post_hoc"] = bool(post_hoc)
    if reasons:
        rec["reasons"] = [r for r in reasons if not r.startswith(_STICKY)]
    key = (event, plan_sha256, rec.get("post_hoc"))
    for h in read_history(run_dir):  # the first time each (event, plan, post-hoc) happened is what counts
        if (h.get("event"), h.get("plan_sha256"), h.get("post_hoc")) == key and event != "locked":
            return h
    p = Path(run_dir) / HISTORY
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return rec


_STICKY = "an earlier selection of this run was POST-HOC"


def sticky_reasons(run_dir: str | Path) -> list[str]:
    """A reason when any earlier selection of the run was made POST-HOC (empty otherwise)."""
    hist = read_history(run_dir)
    earlier = [h for h in hist if h.get("event") == "select" and h.get("post_hoc")]
    if not earlier:
        return []
    h = earlier[0]
    return [f"{_STICKY} (at {h.get('utc')}, plan sha256 {str(h.get('plan_sha256'))[:12]}: "
            f"{'; '.join(h.get('reasons') or ['post-hoc'])}); once post-hoc, every later selection of the run is. "
            f"Plan history: {history_text(hist)}"]


def history_text(hist: list[dict[str, Any]]) -> str:
    """The history in one line: ``locked f4f9df92eb34 at T; select POST-HOC with b02a... at T; ...``."""
    words = []
    for h in hist:
        ev = h.get("event")
        sha = str(h.get("plan_sha256"))[:12]
        if ev == "select":
            ev = "select " + ("POST-HOC" if h.get("post_hoc") else "predeclared")
        words.append(f"{ev} with plan {sha} at {h.get('utc')}")
    return "; ".join(words) if words else "none recorded"


def retire_selection(run_dir: str | Path) -> list[str]:
    """Move ``selection.json``/``selection.csv`` aside to ``superseded/<UTC time>/`` after a
    refused selection, so no later report presents the old (predeclared) one as current."""
    run_dir = Path(run_dir)
    present = [n for n in ("selection.json", "selection.csv") if (run_dir / n).is_file()]
    if not present:
        return []
    dest = run_dir / "superseded" / _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest.mkdir(parents=True, exist_ok=True)
    moved = []
    for n in present:
        target = dest / n
        if target.exists():
            target = dest / f"{n}.{os.getpid()}"
        shutil.move(str(run_dir / n), str(target))
        moved.append(str(target))
    return moved
