"""A decision report for one scored run: ``report.md`` and a self-contained ``report.html``.

``write_report(run_dir)`` (re)computes the dynamics (``run_dir/dynamics/``), reads the
shortlist if one was made (``run_dir/shortlist.csv`` + ``shortlist.json``) and, when an
averaged ladder was scored, compares it with the raw one. The averaged run is found, in
this order:

1. the ``averaged_run_dir`` argument;
2. ``run_dir/averaged/`` when it holds a ``summary.csv`` (score the averaged ladder with
   ``--out RUN_DIR/averaged``);
3. ``run_dir/averaged.json`` = ``{"run_dir": "<path>"}`` (relative to ``run_dir`` or
   absolute).

Once ``run_dir/selection.json`` exists the base-selection report of
:mod:`probeselect.final_report` is written instead (it contains every section of this
one). Both reports are built from the shared blocks of :mod:`probeselect._report_blocks`
and the probe sections of :mod:`probeselect._probe_sections`; this module is the only one
that imports :mod:`probeselect.final_report`, which imports nothing from here.
"""

from __future__ import annotations

from pathlib import Path

from ._probe_sections import ProbeSections, find_averaged_run, plot_averaging, probe_sections
from ._report_blocks import (CAVEATS, Bullets, Figure, Para, ReportPaths, Section, Table, fmt, provenance_section,
                             render_html, render_markdown, run_name, write_documents)

__all__ = ["ReportPaths", "ProbeSections", "write_report", "probe_sections", "find_averaged_run", "plot_averaging",
           "Para", "Bullets", "Table", "Figure", "Section", "fmt", "render_markdown", "render_html"]


def write_report(run_dir: str | Path, *, averaged_run_dir: str | Path | None = None) -> ReportPaths:
    """Write ``run_dir/report.md`` and a self-contained ``run_dir/report.html``.

    Recomputes ``run_dir/dynamics/`` (tables and plots), includes the shortlist when
    ``shortlist.csv`` exists and the averaged-vs-raw comparison when an averaged run is
    found (see the module docstring). Once ``run_dir/selection.json`` exists (``probeselect
    select``) the base-selection report of :mod:`probeselect.final_report` is written
    instead; it contains every section of this one. Returns :class:`ReportPaths` ``(md, html)``.
    """
    run_dir = Path(run_dir)
    if (run_dir / "selection.json").is_file():
        from .final_report import write_selection_report

        return write_selection_report(run_dir, averaged_run_dir=averaged_run_dir)
    parts = probe_sections(run_dir, averaged_run_dir=averaged_run_dir)
    sections = [parts.summary, *parts.evidence, Section("Caveats", [Bullets(CAVEATS)]),
                provenance_section(parts.manifest, run_dir)]
    title = f"probeselect report: {run_name(run_dir, parts.manifest)}"
    sections[0].blocks.insert(0, Para("Decide with the summary; check the figures."))
    return write_documents(run_dir, title, sections)
