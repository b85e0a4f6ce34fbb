"""The documentation does not rot: every relative link in README.md and docs/*.md resolves
to a file (and a heading, for links with an anchor), and every flag the docs name after a
`probeselect <subcommand>` exists in that subcommand's argparse parser (built from
probeselect.cli, so a renamed or removed flag fails here)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9-]*")


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    h = heading.strip().lower().replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def dead_links(path: Path) -> list[str]:
    """Relative links in ``path`` whose file (or heading anchor) does not exist."""
    text = _SPAN.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    bad = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


def _commands(text: str) -> list[str]:
    """Command-like snippets: every inline code span, and every line of a fenced block (lines
    continued with a backslash joined)."""
    out = []
    for block in _FENCE.findall(text):
        out += block.replace("\\\n", " ").splitlines()[1:-1]
    out += _SPAN.findall(_FENCE.sub("", text))
    return out


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def unknown_flags(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """``probeselect SUB [ACTION] ... --flag`` snippets in ``text`` whose flag SUB (ACTION)
    does not define. ``probeselect probes list / validate FILE / show ...`` checks each
    alternative against its own action."""
    top = _subparsers(parser)
    bad = []
    for snippet in _commands(text):
        for m in re.finditer(r"(?<![\w/.-])probeselect\s+([\w-]+)(.*?)(?=(?<![\w/.-])probeselect\s|$)", snippet):
            sub, rest = m.group(1), m.group(2)
            if sub not in top:
                continue
            nested = _subparsers(top[sub])
            parts = [(top[sub], rest)]
            if nested:
                parts = []
                for alt in rest.split(" / "):
                    words = alt.split()
                    if words and words[0] in nested:
                        parts.append((nested[words[0]], alt))
            for p, seg in parts:
                seg = seg.split(" # ")[0]  # a shell comment after the command
                bad += [f"probeselect {sub}: {f}  (in `{snippet.strip()}`)" for f in _FLAG.findall(seg)
                        if f not in _flags(p)]
    return bad


@pytest.fixture(scope="module")
def parser():
    from probeselect.cli import build_parser

    return build_parser()


def test_the_docs_pages_exist_and_the_readme_is_short():
    names = {p.name for p in DOCS}
    assert {"scoring.md", "real-checkpoints.md", "pilot-sft.md", "selection.md", "validation.md",
            "benchmarks.md"} <= names
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(path):
    assert dead_links(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_named_flag_exists(path, parser):
    assert unknown_flags(path.read_text(encoding="utf-8"), parser) == []


def test_the_checks_catch_a_made_up_flag_and_a_dead_link(parser, tmp_path):
    doc = ("Run `probeselect score CKPT --probes a.yaml --made-up-flag 3` and\n\n```bash\n"
           "probeselect plan lock recipes/selection.yaml --run RUN --no-such-lock-flag \\\n    --recipe r.yaml\n```\n"
           "`probeselect probes list / validate FILE... / show FAMILY --seed 0 --bogus`\n"
           "See [gone](nowhere.md), [here](#no-heading) and [ok](#title).\n\n# Title\n")
    bad = unknown_flags(doc, parser)
    assert [b.split("  (")[0] for b in bad] == ["probeselect plan: --no-such-lock-flag",
                                                 "probeselect score: --made-up-flag",
                                                 "probeselect probes: --bogus"]
    page = tmp_path / "page.md"
    page.write_text(doc, encoding="utf-8")
    assert dead_links(page) == ["nowhere.md (no such file)", "#no-heading (no heading #no-heading in page.md)"]
