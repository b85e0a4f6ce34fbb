"""Small plotting helpers shared by ``dynamics``, ``average`` and ``report``.

Figures are built with matplotlib's object API (``Figure`` + the Agg canvas), never
``pyplot``: no global backend is switched, no window is opened, and nothing leaks
between figures. Every PNG is written atomically.
"""

from __future__ import annotations

from pathlib import Path

from ._io import _atomic_write

#: Line colours, one per variant / series (matplotlib's tab10, colour-blind friendly enough).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def new_figure(n_panels: int, *, ncols: int = 3, panel_size: tuple[float, float] = (5.0, 3.2)):
    """A figure with ``n_panels`` axes in a grid; returns ``(fig, axes_list)``.

    Unused grid cells are hidden.
    """
    from matplotlib.figure import Figure

    n_panels = max(1, n_panels)
    ncols = max(1, min(ncols, n_panels))
    nrows = -(-n_panels // ncols)
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows), layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def save_png(fig, path: Path, *, dpi: int = 110) -> Path:
    """Render ``fig`` with the Agg canvas and write it to ``path`` atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = Path(path)
    _atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
    return path


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]
