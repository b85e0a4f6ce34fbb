"""The report's view of a selection: POST-HOC or predeclared recomputed from the lock and the
plan as they are now (never taken from an old selection.json), with the run's plan history.

Kept apart from :mod:`probeselect._posthoc` (the history file, which :mod:`probeselect.plan`
writes) because it reads the lock through :func:`probeselect.plan.check_lock`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._posthoc import read_history
from .errors import SelectionError
from .plan import check_lock


def live_selection(run_dir: str | Path, sel: dict[str, Any]) -> dict[str, Any]:
    """``sel`` (a selection.json record) with ``post_hoc``/``post_hoc_reasons`` recomputed from
    the lock and the plan as they are now, plus the run's plan history (``plan_history``).
    A selection that was predeclared when written but whose lock or plan changed since, or
    whose run has a POST-HOC selection in its history, is reported POST-HOC."""
    run_dir = Path(run_dir)
    reasons = list(sel.get("post_hoc_reasons") or [])
    try:
        status = check_lock(run_dir, sel.get("plan_path") or None)
        now = status.reasons
        if status.plan_sha256 != sel.get("plan_sha256"):
            now = now + [f"selection.json was computed with plan sha256 {str(sel.get('plan_sha256'))[:12]}; the "
                         f"plan {status.plan_path} is now {status.plan_sha256[:12]}"]
        if (status.lock.get("plan_sha256") != (sel.get("lock") or {}).get("plan_sha256")):
            now = now + [f"the lock now holds plan sha256 {str(status.lock.get('plan_sha256'))[:12]}, not the "
                         f"{str((sel.get('lock') or {}).get('plan_sha256'))[:12]} selection.json was made under"]
    except (SelectionError, OSError) as exc:
        now = [f"the lock cannot be checked now ({exc})"]
    for r in now:
        if r not in reasons:
            reasons.append(r)
    hist = read_history(run_dir)
    nonfinite = []
    with_man = run_dir / "manifest.json"
    if with_man.is_file():
        try:
            nonfinite = json.loads(with_man.read_text(encoding="utf-8")).get("nonfinite") or []
        except (OSError, ValueError, AttributeError):
            nonfinite = []
    return {**sel, "post_hoc": bool(reasons), "predeclared": not reasons, "post_hoc_reasons": reasons,
            "plan_history": hist, "score_nonfinite": nonfinite}
