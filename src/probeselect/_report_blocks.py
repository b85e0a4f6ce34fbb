"""Building blocks shared by every probeselect report (:mod:`probeselect.report` and
:mod:`probeselect.final_report`): one document model (sections of paragraphs, bullet
lists, tables and figures), two renderers that always say the same thing (markdown that
refers to the PNGs by relative path; self-contained HTML with the PNGs embedded as base64
data URIs), cell formatting, the caveats and the provenance section, and the run name
used in report titles.

This module imports no report module, so each report imports it and neither imports the
other's internals.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd

from ._io import atomic_write_text

__all__ = ["ReportPaths", "Para", "Bullets", "Table", "Figure", "Section", "fmt", "df_table", "render_markdown",
           "render_html", "write_documents", "CAVEATS", "provenance_section", "run_name", "shown_path"]


class ReportPaths(NamedTuple):
    """The two files :func:`write_report` writes."""

    md: Path
    html: Path


# ---------------------------------------------------------------------------
# Document model: one section list, two renderers
# ---------------------------------------------------------------------------


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Figure:
    path: Path
    caption: str
    alt: str


@dataclass
class Section:
    title: str
    blocks: list[Any] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def fmt(v: Any) -> str:
    """A table cell: 3 significant digits, n/a for missing, yes/no for booleans."""
    if v is None or v is pd.NA:
        return "n/a"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        if np.isnan(v):
            return "n/a"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, sections: Sequence[Section], base: Path) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        if s.title:  # a section without a title is a front page: its blocks follow the title directly
            out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Para):
                out += [b.text, ""]
            elif isinstance(b, Bullets):
                out += [f"- {i}" for i in b.items] + [""]
            elif isinstance(b, Table):
                out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
                out.append("|" + "|".join("---" for _ in b.header) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
                out.append("")
            elif isinstance(b, Figure):
                rel = b.path.relative_to(base) if b.path.is_relative_to(base) else b.path
                out += [f"![{b.alt}]({rel.as_posix()})", "", f"*{b.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


def _inline(text: str) -> str:
    esc = html.escape(text, quote=False)
    esc = re.sub(r"`([^`]+)`", r"<code>\1</code>", esc)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", esc)


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}th,td{border:1px solid #ccc;padding:3px 7px;
vertical-align:top}th{background:#f3f3f3;text-align:left}tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-style:italic;color:#444}
code{background:#f4f4f4;padding:0 3px;border-radius:3px}nav a{margin-right:.8em}
.front{display:flex;flex-wrap:wrap;gap:0 1.2em}.front p{flex:1 1 100%;margin:.3em 0}
.front figure{flex:1 1 480px;margin:.6em 0}.front figcaption{font-size:.85em}
"""


_MIME = {".png": "image/png", ".svg": "image/svg+xml"}


def render_html(title: str, sections: Sequence[Section]) -> str:
    """One self-contained page. A first section without a title is a front page: its blocks come right
    after the title, before the navigation and the titled sections."""
    nav = "<nav>" + "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections if s.title) + "</nav>"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if not (sections and not sections[0].title):
        parts.append(nav)
    for n, s in enumerate(sections):
        if s.title:
            parts.append(f'<h2 id="{s.anchor}">{html.escape(s.title)}</h2>')
        else:
            parts.append('<div class="front">')
        for b in s.blocks:
            if isinstance(b, Para):
                parts.append(f"<p>{_inline(b.text)}</p>")
            elif isinstance(b, Bullets):
                parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{_inline(h)}</th>" for h in b.header)
                body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b.rows)
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif isinstance(b, Figure):
                data = base64.b64encode(b.path.read_bytes()).decode("ascii")
                mime = _MIME.get(b.path.suffix.lower(), "image/png")
                parts.append(f'<figure><img alt="{html.escape(b.alt)}" src="data:{mime};base64,{data}">'
                             f"<figcaption>{_inline(b.caption)}</figcaption></figure>")
        if not s.title:
            parts.append("</div>")
            if n == 0:
                parts.append(nav)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def df_table(df: pd.DataFrame, cols: Sequence[str], labels: Sequence[str] | None = None) -> Table:
    cols = [c for c in cols if c in df.columns]
    header = list(labels) if labels is not None and len(labels) == len(cols) else list(cols)
    return Table(header=header, rows=[[fmt(v) for v in r] for r in df[cols].itertuples(index=False)])



CAVEATS = [
    "Span margins compare the probabilities of predefined answers; they are not free-generation accuracy, and a third "
    "answer can win (compare `candidate_accuracy` with `accuracy`).",
    "One-probe evidence does not generalize: a checkpoint that is best on one probe can be poor on others. The shortlist "
    "needs agreement across proxies and prompt variants, and one-probe winners are excluded.",
    "Correlations across probes are often low (Wen et al.): a good conflict score need not predict capability, another "
    "conflict family, or transfer after post-training.",
    "Averaging a few checkpoints mitigates but does not remove fluctuation, and the tested averaging policy does not "
    "stand for every policy.",
    "Smooth training loss and stable common benchmarks do not certify shortcut resistance; \"mode-hopping\" names the "
    "measured switching, not an identified internal mechanism.",
    "A proxy chosen after seeing its winner is not evidence. Fix the plan before scoring; the plan's sha256 is recorded "
    "in shortlist.json.",
    "A shortlist is a hypothesis to test with matched pilot SFT (identical examples, masks, token budgets, recipes and "
    "harnesses; repeated seeds when feasible), then select on held-out transfer and robustness constraints and confirm "
    "at the intended post-training budget: different learning curves can reverse the pilot ranking.",
    "Every statistic here rests on the checkpoints and evaluation seeds listed under Provenance; few checkpoints or "
    "seeds make ranks and correlations fragile.",
]


def shown_path(path: Any, run_dir: Path) -> str:
    """A path as a report prints it, the same wherever the run folder lies.

    Inside the run folder: relative to it (``.`` for the folder itself). Else a relative
    path as recorded (relative to the working directory of the command that wrote it).
    Else (an absolute path outside the run) only its file name: absolute paths change when
    a run is moved or re-run elsewhere; the full path stays in the manifests.
    """
    if path is None or str(path) == "":
        return "n/a"
    p = Path(str(path))
    try:
        rel = p.resolve().relative_to(Path(run_dir).resolve())
    except (ValueError, OSError):
        return p.as_posix() if not p.is_absolute() else p.name
    return rel.as_posix() if str(rel) != "." else "."


def _short(h: Any, n: int = 16) -> str:
    return "n/a" if not h else f"`{str(h)[:n]}`"


def truncation_counts(manifest: dict) -> list[tuple[str, int, int]]:
    """``(what, cut, total)`` from a score manifest: span scoring (``scored``: checkpoint x item
    x seed rows), the generative ``audit``, ``sampling`` and ``persona`` generations (one row per
    checkpoint x prompt); ``cut`` counts prompts cut from the left to fit the context."""
    out = []
    if "truncated_rows" in manifest:
        out.append(("scored", int(manifest.get("truncated_rows") or 0), int(manifest.get("n_scored_rows") or 0)))
    cut = manifest.get("truncated_generation_rows") or {}
    for k, n in (manifest.get("generation_rows") or {}).items():
        if n:
            out.append((k, int(cut.get(k) or 0), int(n)))
    return out


def context_note(manifest: dict) -> str | None:
    """One sentence on prompts cut to fit the context (None when the run could not cut any)."""
    cfg = manifest.get("config", {}) or {}
    counts = truncation_counts(manifest)
    if cfg.get("on_overflow") != "truncate" and not any(k for _, k, _ in counts):
        return None
    limit = f"{cfg['max_length']} tokens" if cfg.get("max_length") else "the model's own"
    parts = [f"{k} of {n} {what}" for what, k, n in counts]
    if not any(k for _, k, _ in counts):
        return f"Context limit ({limit}, on_overflow truncate): no prompt had to be cut."
    return (f"Context limit ({limit}, on_overflow truncate): prompts cut from the left to fit, as lm-eval does: "
            + ", ".join(parts) + " (see truncated_tokens in scores.parquet, audit.parquet, generations.parquet; "
            "a cut prompt loses its first demonstrations, so its score is not comparable with an uncut one).")


def provenance_section(manifest: dict | None, run_dir: Path) -> Section:
    s = Section("Provenance")
    if not manifest:
        s.blocks.append(Para("`manifest.json` is missing from this run folder: the provenance of these scores is "
                             "unknown."))
        return s
    git = manifest.get("git", {}) or {}
    cfg = manifest.get("config", {}) or {}
    vers = manifest.get("versions", {}) or {}
    items = [
        f"Scoring status {manifest.get('status', '?')}. Where and when it ran (paths, times, the command): "
        "`manifest.json` in this run folder; this report prints neither, so that it reads the same wherever and "
        "whenever the run was made.",
        f"probeselect git commit `{git.get('commit')}` (dirty: {fmt(git.get('dirty'))}).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v) + ".",
        f"Evaluation seeds: {manifest.get('seeds', cfg.get('seeds'))}; items hash `{str(manifest.get('items_hash'))[:16]}`; "
        f"scoring config: {json.dumps(manifest.get('scoring_config', {}), sort_keys=True)}.",
    ]
    note = context_note(manifest)
    if note:
        items.append(note)
    ckpts = manifest.get("checkpoints", [])
    fps = [c.get("fingerprint") for c in ckpts]
    if len(fps) > 1 and len(set(fps)) < len(fps):
        items.append(f"{len(fps) - len(set(fps)) + 1} checkpoints share a fingerprint: the fingerprint records file "
                     "layout, config and tokenizer, not weight values, so it does not tell these checkpoints apart.")
    repos = sorted({str(c["repo"]) for c in ckpts if c.get("repo")})
    if repos:
        items.append(f"Hub ladder: {', '.join(f'`{r}`' for r in repos)}, revisions "
                     + ", ".join(f"`{c.get('revision')}`" for c in ckpts if c.get("repo"))
                     + " (the commit of each revision in the table; the fingerprint includes it).")
    s.blocks.append(Bullets(items))
    if ckpts and repos:
        s.blocks.append(Table(["checkpoint", "repo", "revision", "commit", "step", "tokens", "fingerprint",
                               "tokenizer hash"],
                              [[str(c.get("name")), str(c.get("repo") or "-"), str(c.get("revision") or "-"),
                                str(c.get("commit") or "-"), fmt(c.get("step")), fmt(c.get("tokens")),
                                _short(c.get("fingerprint")), _short(c.get("tokenizer_hash"), 12)] for c in ckpts]))
    elif ckpts:
        s.blocks.append(Table(["checkpoint", "step", "tokens", "fingerprint", "tokenizer hash"],
                              [[str(c.get("name")), fmt(c.get("step")), fmt(c.get("tokens")),
                                _short(c.get("fingerprint")), _short(c.get("tokenizer_hash"), 12)]
                               for c in ckpts]))
    probes = manifest.get("probes", [])
    if probes:
        s.blocks.append(Table(["family", "spec file", "spec hash", "file sha256", "items per seed"],
                              [[str(p.get("family")), shown_path(p.get("path"), run_dir), _short(p.get("spec_hash")),
                                _short(p.get("file_sha256")), fmt(p.get("n_items_per_seed"))] for p in probes]))
    return s



def write_documents(run_dir: Path, title: str, sections: Sequence[Section]) -> ReportPaths:
    """Render ``sections`` and write ``run_dir/report.md`` and ``run_dir/report.html`` atomically."""
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    atomic_write_text(md_path, render_markdown(title, sections, run_dir))
    atomic_write_text(html_path, render_html(title, sections))
    return ReportPaths(md=md_path, html=html_path)


_STAGE_NAMES = {"score", "scores", "run", "runs", "out", "output", "outputs", "results", "ladder", "checkpoints",
                "ckpt", "ckpts"}


def run_name(run_dir: Path, manifest: dict | None) -> str:
    """A human name for a scored run, for report titles.

    In this order: the Hub repo when every checkpoint is a revision of one repo; the run
    config of ``probeselect run CONFIG`` (its file stem, e.g.
    ``demo``); else the checkpoint ladder's folder (with its parent when the folder has a
    generic name such as ``ladder``); else the run folder (with its parent when the
    folder is a stage name such as ``score``).
    """
    man = manifest or {}
    repos = {str(c.get("repo")) for c in man.get("checkpoints") or [] if isinstance(c, dict) and c.get("repo")}
    if len(repos) == 1:  # Hub revisions of one repo: the repo names the ladder
        return repos.pop()
    cmd = [str(c) for c in (man.get("command") or [])]
    if "run" in cmd:
        after = cmd[cmd.index("run") + 1:]
        cfg = next((c for c in after if c.endswith((".yaml", ".yml"))), None)
        if cfg:
            return Path(cfg).stem
    ck = (man.get("config") or {}).get("checkpoints")

    def named(p: Path) -> str:
        p = Path(p)
        if p.name.lower() in _STAGE_NAMES and p.parent.name:
            return f"{p.parent.name}/{p.name}"
        return p.name

    if isinstance(ck, str) and ck:  # a list when score_checkpoints got Checkpoint objects (watch, the callback)
        return named(Path(ck))
    return named(Path(run_dir).resolve())
