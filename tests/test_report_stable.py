"""Two runs that decide the same thing write the same report: report.md and report.html hold
no absolute path and no wall-clock time (those stay in the manifests), so a run moved to
another folder, or re-run on another day, gives byte-identical report files."""

import json
import shutil

import pandas as pd
from _selection_fakes import make_selected_run

from probeselect.report import write_report

LATER = "2031-05-05T05:05:05+00:00"


def _as_if_run_later(run):
    """Every recorded wall-clock time moves and the pilot's throughput changes, as on a re-run."""

    def walk(o):
        if isinstance(o, dict):
            return {k: (LATER if k.endswith("_utc") and isinstance(v, str) else walk(v)) for k, v in o.items()}
        return [walk(v) for v in o] if isinstance(o, list) else o

    changed = 0
    for p in run.rglob("*.json"):
        obj = json.loads(p.read_text())
        if (new := walk(obj)) != obj:
            p.write_text(json.dumps(new, indent=2))
            changed += 1
    diag = pd.read_csv(run / "pilot" / "diagnostics.csv")
    diag["seconds"] *= 3.7
    diag["tokens_per_s"] /= 3.7
    diag.to_csv(run / "pilot" / "diagnostics.csv", index=False)
    return changed


def test_the_report_is_the_same_for_a_run_moved_and_rerun_later(tmp_path):
    a_root, b_root = tmp_path / "first place" / "proj", tmp_path / "elsewhere" / "second" / "proj"
    a = make_selected_run(a_root)  # (the report's title names the run by its folder and parent: "proj/run")
    shutil.copytree(a_root, b_root)
    # the copy records paths of the first place: rewrite them as if the run had been made in the second one
    for p in b_root.rglob("*.json"):
        p.write_text(p.read_text().replace(str(a_root), str(b_root)))
    b = b_root / "run"
    assert _as_if_run_later(b) >= 3  # manifest, plan lock, selection, shortlist at least
    ra, rb = write_report(a), write_report(b)
    for x, y in zip(ra, rb):
        text = x.read_text(encoding="utf-8")
        assert str(tmp_path) not in text and LATER not in y.read_text(encoding="utf-8")
        assert x.read_bytes() == y.read_bytes(), f"{x.name} differs between the two runs"
    md = ra.md.read_text(encoding="utf-8")
    assert "## Decision" in md and "data_lineage.json" in md  # the lineage is still named (by its file name)
