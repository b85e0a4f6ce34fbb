"""The first screen of the base-selection report: the decision in two lines, then two figures.

* post-SFT transfer of every piloted base (the plan's primary metric, seed mean with its
  interval) against the base's pretraining step, with the latest checkpoint and the
  checkpoint of lowest pretraining held-out bits per byte marked, piloted or not;
* the conflict families' mean margin per checkpoint with the ladder's data windows shaded
  (when the ladder has a ``data_lineage.json``).

Figures are SVG written byte-stable (a fixed ``svg.hashsalt``, no date in the metadata, text
as paths so no font on the reader's machine matters), so two runs that decide the same thing
write the same files and the same self-contained ``report.html``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from ._io import _atomic_write
from ._report_blocks import Figure, Para, Section, fmt
from .dynamics import LowestBpb, lowest_heldout_bpb
from .manifest import checkpoint_steps

__all__ = ["front_page", "FIGURE_DIR"]

#: Where the front page's figures go, relative to the run folder (report.md links them there).
FIGURE_DIR = "report_figures"

_SVG_RC = {"svg.hashsalt": "probeselect", "svg.fonttype": "path", "font.family": "DejaVu Sans", "font.size": 9.0}


def save_svg(fig, path: Path) -> Path:
    """Write ``fig`` as a byte-stable SVG (module docstring) atomically."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    FigureCanvasSVG(fig)
    with matplotlib.rc_context(_SVG_RC):
        _atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="svg", metadata={"Date": None}))
    return Path(path)


def _figure(size: tuple[float, float]):
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=size, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


class Headline(NamedTuple):
    verdict: str  # line 1: which base (or none), confirmed or not
    how_sure: str  # line 2: the primary metric of the pick and the runner-up with their intervals


def _headline(sel: dict, cs, n_seeds: int, min_seeds: int | None) -> Headline:
    """The decision in two lines, worded as the Decision section's first bullets."""
    d = sel["decision"]
    prim = sel["selection_plan"]["primary"]
    metric, level = prim["metric"], d.get("level", 0.95)
    top, ru, verdict = d.get("top"), d.get("runner_up"), d.get("verdict")
    bases = {b["base"]: b for b in sel["bases"]}
    few = min_seeds is not None and n_seeds < min_seeds
    prov = f" (provisional: {n_seeds} of the {min_seeds} SFT seeds the plan requires)" if few else ""
    if cs.status == "replicated":
        cv = "a clear winner" if cs.confirm_verdict == "winner" else "better than the default"
        line1 = (f"**Recommended base: `{cs.recommended}`**: a claim of the confirmation at the intended budget "
                 f"({cv}), not of the pilot, replicated on fresh SFT seeds.")
    elif verdict in ("winner", "single_eligible", "beats_default"):
        line1 = {"confirmed": f"**Recommended base: `{top}`**{prov}, confirmed at the intended budget"
                              f"{cs.retest_words()}.",
                 "default_beaten": f"**Recommended base: `{cs.recommended}`**{prov}, not the default: {cs.claim_words()}.",
                 "not_run": f"**Recommended base (pilot only, not yet confirmed): `{top}`**{prov}.",
                 "not_included": f"**Pilot pick `{top}` not confirmed**{prov}: the confirmation did not retrain it."}.get(
            cs.status, f"**Pilot pick `{top}` not confirmed**{prov}: no recommendation stands.")
    elif verdict == "no_clear_winner":
        line1 = f"**No clear winner** between `{top}` and `{ru}`{prov}."
    else:
        line1 = "**No recommendation**: no piloted base passes the transfer constraints."
    if sel.get("post_hoc"):
        line1 = "**POST-HOC selection** (exploratory, not a predeclared test). " + line1

    def val(b: str) -> str:
        r = bases.get(b, {})
        return f"{fmt(r.get('value'))} ({100 * level:.0f}% interval {fmt(r.get('ci_lo'))} to {fmt(r.get('ci_hi'))})"

    parts = []
    if top:
        parts.append(f"{metric} ({prim['direction']} is better) of `{top}` {val(top)}"
                     + (f" vs runner-up `{ru}` {val(ru)}" if ru else ""))
    parts.append(f"{n_seeds} SFT seed{'s' if n_seeds != 1 else ''} x {d.get('n_items')} held-out items")
    line2 = "; ".join(parts) + ". Figures below; the evidence and caveats follow."
    return Headline(line1, line2)


def _transfer_figure(sel: dict, steps: dict[str, float], lowest: LowestBpb | None, path: Path,
                     top: str | None) -> Path:
    """The pilot's transfer per base; ``top``: the base marked as recommended (the report's recommendation)."""
    prim = sel["selection_plan"]["primary"]
    level = sel["decision"].get("level", 0.95)
    bases = sel["bases"]
    use_steps = all(b["base"] in steps for b in bases)
    fig, ax = _figure((6.4, 3.4))
    xs = []
    for i, b in enumerate(bases):
        x = steps[b["base"]] if use_steps else float(i)
        xs.append(x)
        v, lo, hi = (b.get(k) for k in ("value", "ci_lo", "ci_hi"))
        if v is None or not np.isfinite(float(v)):
            continue
        err = None
        if lo is not None and hi is not None and np.isfinite([float(lo), float(hi)]).all():
            err = [[float(v) - float(lo)], [float(hi) - float(v)]]
        best = b["base"] == top
        ax.errorbar([x], [float(v)], yerr=err, fmt="o", ms=7 if best else 5,
                    mfc=("#d62728" if best else "#1f77b4") if b.get("eligible") else "white",
                    mec="#d62728" if best else "#1f77b4", ecolor="#555555", capsize=4, lw=1.2)
        ax.annotate(b["base"] + (" (recommended)" if best else "") + ("" if b.get("eligible") else " (not eligible)"),
                    (x, float(v)), textcoords="offset points", xytext=(6, 4), fontsize=8)
    marks = []
    if steps:
        latest = max(steps, key=lambda n: steps[n])
        marks.append(("latest", latest, "#7f7f7f", "--"))
    if lowest is not None:
        marks.append(("lowest held-out bpb", lowest.checkpoint, "#2ca02c", ":"))
    piloted = {b["base"] for b in bases}
    for what, name, col, ls in marks:
        if use_steps and name in steps:
            ax.axvline(steps[name], color=col, ls=ls, lw=1.2,
                       label=f"{what}: {name}" + (" (piloted)" if name in piloted else " (not piloted)"))
    if any(use_steps and name in steps for _, name, _, _ in marks):
        ax.legend(fontsize=7, loc="best")
    if use_steps:
        ax.set_xlabel("pretraining step of the base")
        lo_x, hi_x = min(xs + [steps[n] for _, n, _, _ in marks if n in steps]), max(xs + [steps[n] for _, n, _, _ in
                                                                                           marks if n in steps])
        pad = 0.08 * (hi_x - lo_x or 1.0)
        ax.set_xlim(lo_x - pad, hi_x + 2.5 * pad)  # room for the point labels on the right
    else:
        ax.set_xticks(range(len(bases)), [b["base"] for b in bases])
    ax.set_ylabel(f"{prim['metric']} after pilot SFT")
    ax.set_title(f"Post-SFT transfer per piloted base (seed mean, {100 * level:.0f}% interval)", fontsize=9)
    ax.grid(alpha=0.3)
    return save_svg(fig, path)


def _margin_figure(traj: pd.DataFrame, windows: list, top_step: float | None, path: Path) -> Path | None:
    m = traj[(traj["metric"] == "mean_margin") & (traj["kind"] == "conflict")].copy()
    m["step"] = pd.to_numeric(m["step"], errors="coerce")
    if m.empty or m["step"].isna().any():
        return None
    fig, ax = _figure((6.4, 3.4))
    planted_seen = other_seen = False
    for w in windows:
        planted = bool(getattr(w, "planted", None))
        label = None
        if planted and not planted_seen:
            label, planted_seen = "planted data window", True
        elif not planted and not other_seen:
            label, other_seen = "data window", True
        ax.axvspan(w.start_step, w.end_step, color="#ff7f0e" if planted else "#9e9e9e",
                   alpha=0.18 if planted else 0.08, lw=0, label=label)
        ax.annotate(w.name + (f" ({w.planted})" if planted else ""), ((w.start_step + w.end_step) / 2, 0.02),
                    xycoords=("data", "axes fraction"), ha="center", fontsize=7, color="#444444")
    from ._plots import color

    per = m.groupby(["family", "step"], sort=False)["value"].mean().reset_index()
    for i, (fam, g) in enumerate(per.groupby("family", sort=False)):
        g = g.sort_values("step")
        ax.plot(g["step"], g["value"], marker="o", ms=3, lw=1.5, color=color(i), label=str(fam))
    if top_step is not None:
        ax.axvline(top_step, color="#d62728", lw=1.0, ls="--", label="recommended base")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("mean margin (nats), mean over variants")
    ax.set_title("Conflict-probe margins per checkpoint" + (" with the data windows shaded" if windows else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return save_svg(fig, path)


def front_page(run_dir: Path, sel: dict, cs, seeds: tuple[int, int | None], manifest: dict | None,
               shown: Callable[[Any], str]) -> Section:
    """The report's first screen (module docstring): a section without a heading."""
    import matplotlib

    with matplotlib.rc_context(_SVG_RC):  # fonts and sizes are read when the texts are made
        return _front_page(run_dir, sel, cs, seeds, manifest, shown)


def _front_page(run_dir: Path, sel: dict, cs, seeds: tuple[int, int | None], manifest: dict | None,
                shown: Callable[[Any], str]) -> Section:
    from .attribution import AttributionError, find_lineage, load_windows

    n_seeds, min_seeds = seeds
    head = _headline(sel, cs, n_seeds, min_seeds)
    blocks: list = [Para(head.verdict), Para(head.how_sure)]
    fig_dir = run_dir / FIGURE_DIR
    fig_dir.mkdir(parents=True, exist_ok=True)
    steps = checkpoint_steps(manifest)
    summary = pd.read_csv(run_dir / "summary.csv") if (run_dir / "summary.csv").is_file() else None
    lowest = lowest_heldout_bpb(summary)  # among every checkpoint, piloted or not
    piloted = {b["base"] for b in sel["bases"]}
    notes = []
    if steps:
        latest = max(steps, key=lambda n: steps[n])
        notes.append(f"latest checkpoint `{latest}` ({'piloted' if latest in piloted else 'not piloted'})")
    if lowest is not None:
        notes.append(f"lowest pretraining held-out bits per byte: `{lowest.checkpoint}` ({fmt(lowest.bpb)}; "
                     f"{'piloted' if lowest.checkpoint in piloted else 'not piloted'})")
    else:
        notes.append("no pretraining held-out bits per byte was scored, so no lowest-loss checkpoint is marked")
    shown_rec = cs.recommended if cs.status in ("default_beaten", "replicated") else sel["decision"].get("recommended")
    blocks.append(Figure(_transfer_figure(sel, steps, lowest, fig_dir / "transfer.svg", shown_rec),
                         "Post-SFT transfer of each piloted base: seed mean and interval of the primary metric "
                         "(filled = eligible, red = recommended). Marked: " + "; ".join(notes) + ".",
                         "post-SFT transfer per piloted base with intervals"))
    traj_path = run_dir / "dynamics" / "trajectories.csv"
    if traj_path.is_file():
        lineage = find_lineage(run_dir)
        windows, wnote = [], "no data lineage next to the checkpoints, so no data window is shaded"
        if lineage is not None:
            try:
                windows = load_windows(lineage)
                wnote = f"data windows from `{shown(lineage)}` shaded (orange = planted)"
            except AttributionError as exc:
                wnote = f"the data lineage could not be read ({exc}), so no window is shaded"
        top = shown_rec
        fig = _margin_figure(pd.read_csv(traj_path), windows, steps.get(top) if top else None,
                             fig_dir / "margins.svg")
        if fig is not None:
            blocks.append(Figure(fig, "Mean margin of each conflict family per checkpoint (mean over prompt variants; "
                                      f"per-variant panels with seed bands under Margin trajectories); {wnote}.",
                                 "conflict-probe margin trajectories with data windows"))
    return Section("", blocks)
