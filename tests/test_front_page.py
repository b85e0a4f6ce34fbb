"""The base-selection report opens with a front page: the decision in two lines, post-SFT
transfer per piloted base (latest and lowest-held-out-bpb checkpoints marked, piloted or
not) and the margin trajectories with the data windows shaded; the navigation, tables and
caveats follow. Checked on the HTML's structure and, when a chromium binary is found, in a
real headless browser (the page renders, every figure loads, the first screen is not blank)."""

import base64
import json
import re
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser

import pytest
from _selection_fakes import make_selected_run

from probeselect.report import write_report


class _Outline(HTMLParser):
    """The body's top-level elements in order (tag, attrs, text), and every img's src."""

    def __init__(self):
        super().__init__()
        self.depth, self.top, self.front, self.imgs = 0, [], [], []
        self._in_front = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        if tag in ("html", "head", "body", "meta", "img"):
            if tag == "img" and self._in_front and self.front and self.front[-1][0] == "figure":
                self.front[-1][1]["img"] = a
            return
        if self.depth == 0:
            self.top.append([tag, a, ""])
            self._in_front = a.get("class") == "front"
        elif self.depth == 1 and self._in_front:
            self.front.append([tag, a, ""])
        self.depth += 1

    def handle_endtag(self, tag):
        if tag in ("html", "head", "body", "meta", "img"):
            return
        self.depth -= 1

    def handle_data(self, data):
        if self.depth >= 1 and self.top:
            self.top[-1][2] += data
        if self.depth >= 2 and self._in_front and self.front:
            self.front[-1][2] += data


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = make_selected_run(tmp_path_factory.mktemp("front") / "proj")
    return run, write_report(run)


def test_the_first_elements_are_the_decision_and_the_figures(report):
    run, paths = report
    out = _Outline()
    out.feed(paths.html.read_text(encoding="utf-8"))
    tops = [t for t, _, _ in out.top if t not in ("title", "style")]
    assert tops[:4] == ["h1", "div", "nav", "h2"], tops[:6]
    assert out.top[[t for t, _, _ in out.top].index("h2")][2] == "Decision"
    kinds = [t for t, _, _ in out.front]
    assert kinds == ["p", "p", "figure", "figure"]  # two decision lines, then the two figures; nothing else
    line1, line2 = out.front[0][2], out.front[1][2]
    assert line1.startswith("Recommended base (pilot only, not yet confirmed): checkpoint-40")
    assert "checkpoint-60" in line2 and "95% interval" in line2
    transfer, margins = out.front[2], out.front[3]
    # the latest checkpoint (checkpoint-60, piloted) and the lowest-bpb one (checkpoint-30, never piloted) are named
    assert "latest checkpoint checkpoint-60 (piloted)" in transfer[2]
    assert "lowest pretraining held-out bits per byte: checkpoint-30 (1.2; not piloted)" in transfer[2]
    assert "data windows from data_lineage.json shaded" in margins[2]
    for fig in (transfer, margins):
        src = fig[1]["img"]["src"]
        assert src.startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(src.split(",", 1)[1]).decode("utf-8")
        assert "<svg" in svg and "<dc:date>" not in svg  # embedded, self-contained, no date
    # markdown: the same order, figures by relative path
    md = paths.md.read_text(encoding="utf-8").splitlines()
    body = [ln for ln in md[1:] if ln.strip()]
    assert body[0].startswith("**Recommended base") and body[2] == (
        "![post-SFT transfer per piloted base with intervals](report_figures/transfer.svg)")
    assert body[4].startswith("![conflict-probe margin trajectories with data windows](report_figures/margins.svg)")
    assert body[6] == "## Decision"
    assert (run / "report_figures" / "transfer.svg").is_file()


def test_without_a_lineage_no_window_is_shaded_and_the_caption_says_so(tmp_path):
    run = make_selected_run(tmp_path / "proj", lineage=False)
    md = write_report(run).md.read_text(encoding="utf-8")
    front = md[:md.index("## Decision")]
    assert "no data lineage next to the checkpoints, so no data window is shaded" in front
    assert "report_figures/margins.svg" in front


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if shutil.which(n)), None)
_HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
_PROBE = """<script>window.addEventListener("load", () => {
  const r = [...document.images].map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                                           top: i.getBoundingClientRect().top}));
  const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});</script>"""


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (chromium, chromium-browser, google-chrome); "
                                              "Debian: apt-get install chromium")
def test_report_renders_in_a_headless_browser(report, tmp_path):
    import numpy as np
    from matplotlib.image import imread

    run, paths = report
    page = paths.html.read_text(encoding="utf-8")
    assert "<script" not in page
    # a copy with a tiny probe that writes, after load, every image's natural size into the DOM
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = subprocess.run([CHROMIUM, *_HEADLESS, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"chromium did not run the page (rc {dom.returncode}): {dom.stderr[-2000:]}"
    imgs = json.loads(unescape(m.group(1)))
    assert len(imgs) == page.count("<img ") >= 5
    bad = [i["alt"] for i in imgs if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not bad, f"figures that did not load: {bad}"
    # the two front-page figures come first on the page
    assert [i["alt"] for i in imgs[:2]] == ["post-SFT transfer per piloted base with intervals",
                                            "conflict-probe margin trajectories with data windows"]
    # the first screen, as a reader sees it: not blank, and the front figure's red (recommended base) is on it
    shot = tmp_path / "first_screen.png"
    subprocess.run([CHROMIUM, *_HEADLESS, "--window-size=1200,1000", f"--screenshot={shot}", paths.html.as_uri()],
                   capture_output=True, timeout=180, cwd=tmp_path)
    assert shot.is_file(), "chromium wrote no screenshot"
    px = imread(str(shot))[..., :3]
    assert px.shape[:2] == (1000, 1200)
    non_white = (px < 0.95).any(axis=-1).mean()
    assert 0.03 < non_white < 0.9, f"first screen looks blank or broken ({non_white:.1%} non-white pixels)"
    red = ((np.abs(px[..., 0] - 214 / 255) < 0.06) & (np.abs(px[..., 1] - 39 / 255) < 0.06)
           & (np.abs(px[..., 2] - 40 / 255) < 0.06)).sum()
    assert red > 20, "the recommended base's red marker is not on the first screen"


def test_lowest_bpb_is_the_mean_over_nll_rows_among_every_checkpoint_first_listed_wins_a_tie():
    """The front page marks the lowest held-out bpb among every checkpoint of summary.csv (no
    candidate list): the mean of its held-out NLL rows, NaN rows skipped; an exact tie goes to the
    checkpoint listed first in summary.csv (ladder order), not to the first name in sort order."""
    import pandas as pd

    from probeselect.dynamics import lowest_heldout_bpb as _lowest_bpb  # what the front page calls

    def rows(*spec):
        return pd.DataFrame([dict(checkpoint=c, step=s, family=f, variant="bpb" if f == "heldout_nll" else "x",
                                  kind="nll" if f == "heldout_nll" else "conflict", bits_per_byte=b,
                                  mean_margin=None if f == "heldout_nll" else 0.5) for c, s, f, b in spec])

    nan = float("nan")
    summary = rows(("checkpoint-30", 30, "conf", nan), ("checkpoint-30", 30, "heldout_nll", 1.0),
                   ("checkpoint-30", 30, "heldout_nll", 1.5), ("checkpoint-100", 100, "conf", nan),
                   ("checkpoint-100", 100, "heldout_nll", 1.25), ("checkpoint-100", 100, "heldout_nll", nan),
                   ("checkpoint-200", 200, "heldout_nll", 1.3))
    low = _lowest_bpb(summary)
    # 30: mean(1.0, 1.5) = 1.25 ties 100's 1.25 (its NaN row skipped); 30 is listed first
    assert low is not None and low.checkpoint == "checkpoint-30" and low.bpb == 1.25
    summary.loc[summary["checkpoint"].eq("checkpoint-200"), "bits_per_byte"] = 1.0
    assert _lowest_bpb(summary).checkpoint == "checkpoint-200"
    assert _lowest_bpb(summary.drop(columns="bits_per_byte")) is None
    assert _lowest_bpb(summary.assign(bits_per_byte=nan)) is None
    assert _lowest_bpb(None) is None
