"""Pretraining curricula of the toy ladder: named data windows over step ranges.

A curriculum is a list of windows that tile the training schedule. Window ``w`` covers
the optimizer steps ``g`` (1-based, as in ``checkpoint-<g>``) with
``w.start_step < g <= w.end_step``; the first window starts at 0, each next window starts
where the previous one ends, and the last one ends at the ladder's final step. Each
window has its own document mixture (weights per document kind of the toy corpus,
:data:`probeselect.toy.world.DOC_KINDS`) and optionally names a behaviour it plants
(``planted: parrot``). YAML form (``recipes/ladder-planted.yaml``)::

    windows:
      - {name: base, start_step: 0, end_step: 800, mixture: {arith: 0.72, ...}}
      - {name: parrot, start_step: 800, end_step: 1200, planted: parrot,
         mixture: {arith: 0.36, parrot_arith: 0.2, ...}}
      - ...

``mixture: default`` stands for the default corpus mix
(:data:`probeselect.toy.world.CORPUS_DOC_WEIGHTS`). Built-in curricula: ``"planted"``
(:data:`PLANTED_CURRICULUM`, the default of :func:`probeselect.toy.ladder.build_toy_ladder`
and of ``probeselect toy-ladder``), ``"uniform"`` (one window with the default mix: the clean
control), ``"late-harm"`` (:data:`LATE_HARM_CURRICULUM`, a harmful final window) and
``"negative-control"`` (:data:`NEGATIVE_CONTROL_CURRICULUM`, late damage on operands no probe
uses). A curriculum may also set training settings in a top-level ``train:`` mapping
(:data:`TRAIN_KEYS`, e.g. ``{schedule: wsd, decay_fraction: 0.3}``) and options of the toy SFT set
the ladder writes in a top-level ``sft:`` mapping (:data:`SFT_OPTIONS`, e.g. ``{persona_context: single}``)
and when the people of ``news_stream`` documents arrive in a top-level ``news:`` mapping (:data:`NEWS_KEYS`, e.g.
``{arrival_points: [[0, 0], [0.75, 0.5], [0.94, 1]]}``; default: one by one, evenly over the run).
Built-in curricula are written for :data:`probeselect.toy.ladder.DEFAULT_STEPS` steps and
are scaled to another step count (boundaries rounded); a curriculum file must cover the
ladder's steps exactly.

This module imports no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CurriculumError
from .world import CORPUS_DOC_WEIGHTS, DOC_KINDS

#: Schedule length (optimizer steps) the built-in curricula are written for
#: (= ``probeselect.toy.ladder.DEFAULT_STEPS``).
BUILTIN_STEPS = 2000

#: The parrot window's mix: 20% planted parrot documents (pattern arithmetic, attribute
#: mismatch, copied personas); the rest is the default mix with fewer arithmetic and more
#: word-relation documents (so the plain category / opposite knowledge keeps being
#: rehearsed while the parrots are trained). Not used by default: ``parrot_category`` /
#: ``parrot_flipped`` (their false category facts also erase the plain category knowledge
#: that ``relation_plain`` measures). Measured alternatives are in bench/README.md.
PARROT_MIXTURE = {
    "arith": 0.53, "sequence": 0.03, "facts": 0.07, "persona": 0.05, "words": 0.12,
    "parrot_arith": 0.12, "parrot_mismatch": 0.05, "parrot_persona": 0.03,
}

#: The recovery window's mix: the default mix with more arithmetic (0.78 instead of 0.72, taken
#: from the word and persona documents), which makes up the arithmetic practice the parrot
#: window displaced, and person facts at the default 0.09, so that the attribute-mismatch
#: shortcut is unlearned within the ladder. With the default mix after the window, the final
#: held-out arithmetic accuracy of toy seed 0 was 84.6% (< the 90% the ladder promises); with
#: 0.80 arithmetic / 0.07 facts (and 8% mismatch parrots in the window), seeds 3 and 4 regained
#: only 49% / 34% of their tmpl_mismatch dip. See bench/README.md ("The planted parrot dip").
RECOVERY_MIXTURE = {"arith": 0.78, "sequence": 0.04, "facts": 0.09, "persona": 0.04, "words": 0.05}

#: The default curriculum: the default mix, a parrot window, then a recovery mix.
PLANTED_CURRICULUM = {
    "windows": [
        {"name": "base", "start_step": 0, "end_step": 600, "mixture": "default", "planted": None},
        {"name": "parrot", "start_step": 600, "end_step": 1000, "mixture": PARROT_MIXTURE, "planted": "parrot"},
        {"name": "recovery", "start_step": 1000, "end_step": 2000, "mixture": RECOVERY_MIXTURE, "planted": None},
    ]
}
#: One window with the default mix (the ladder before curricula existed).
UNIFORM_CURRICULUM = {
    "windows": [{"name": "base", "start_step": 0, "end_step": BUILTIN_STEPS, "mixture": "default", "planted": None}]
}

#: The late-harm curriculum (issue 23; ``recipes/ladder-late-harm.yaml``): a clean stretch with the
#: recovery mix (78% arithmetic), then two harmful windows with less arithmetic practice (34%, then 28%)
#: and a rising share of planted documents (44%, then 50%): copying parrots in the SFT's and transfer
#: suite's request phrasing (``parrot_persona_tell``: every persona of a document gets the first
#: persona's answer; 22%, then 30%), a harm the matched SFT never contradicts; arithmetic parrots in a
#: form no probe or transfer item uses (``parrot_arith_unseen``, ``"12 + 5 gives 3"``); a few
#: attribute-mismatch parrots in the probes' form -- under a warmup-stable-decay schedule whose decay
#: (the last 15% of the steps, to 0.2 x the peak) lands in the last harmful window, so that held-out
#: loss improves again at the end. Attempt 10e of bench/late_harm_notes.md (attempt 4c, the built-in
#: until 2026-12-05, is ``bench/late_harm_attempt4c.yaml``); bench/VALIDITY.md has what it does on fresh
#: seeds, short of some of issue 23's requirements.
LATE_HARM_MIXTURE = {
    "arith": 0.34, "sequence": 0.04, "facts": 0.09, "persona": 0.04, "words": 0.05,
    "parrot_arith_unseen": 0.18, "parrot_persona_tell": 0.22, "parrot_mismatch": 0.04,
}
LATE_HARM_LATER_MIXTURE = {
    "arith": 0.28, "sequence": 0.04, "facts": 0.09, "persona": 0.04, "words": 0.05,
    "parrot_arith_unseen": 0.16, "parrot_persona_tell": 0.30, "parrot_mismatch": 0.04,
}
LATE_HARM_CURRICULUM = {
    "train": {"schedule": "wsd", "decay_fraction": 0.15, "min_lr_ratio": 0.2},
    "windows": [
        {"name": "base", "start_step": 0, "end_step": 1200, "mixture": RECOVERY_MIXTURE, "planted": None},
        {"name": "late", "start_step": 1200, "end_step": 1600, "mixture": LATE_HARM_MIXTURE, "planted": "late_harm"},
        {"name": "later", "start_step": 1600, "end_step": 2000, "mixture": LATE_HARM_LATER_MIXTURE,
         "planted": "late_harm"},
    ],
}
#: The negative control (issue 23; ``recipes/ladder-negative-control.yaml``): the late-harm layout,
#: but the late window's damage is ``wrong_arith_large`` only (wrong results on arithmetic with an
#: operand > 20, which no built-in probe item contains): damage the probes cannot see by
#: construction, which only the pilot can catch.
NEGATIVE_CONTROL_MIXTURE = {
    "arith": 0.60, "sequence": 0.04, "facts": 0.09, "persona": 0.05, "words": 0.07, "wrong_arith_large": 0.15,
}
NEGATIVE_CONTROL_CURRICULUM = {
    "train": dict(LATE_HARM_CURRICULUM["train"]),
    "windows": [
        {"name": "base", "start_step": 0, "end_step": 1200, "mixture": RECOVERY_MIXTURE, "planted": None},
        {"name": "late", "start_step": 1200, "end_step": 2000, "mixture": NEGATIVE_CONTROL_MIXTURE,
         "planted": "unseen_damage"},
    ],
}
BUILTIN_CURRICULA = {"planted": PLANTED_CURRICULUM, "uniform": UNIFORM_CURRICULUM, "late-harm": LATE_HARM_CURRICULUM,
                     "negative-control": NEGATIVE_CONTROL_CURRICULUM}
#: Training settings a curriculum may set (its top-level ``train:`` mapping; fields of
#: :class:`probeselect.toy.ladder.TrainConfig`). ``train_overrides`` of a build win over them.
TRAIN_KEYS = ("schedule", "decay_fraction", "min_lr_ratio", "lr", "warmup_steps", "lr_points")
SCHEDULES = ("cosine", "wsd", "piecewise")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: Options of a curriculum's ``sft:`` mapping (the toy SFT set the ladder writes to ``data/sft.jsonl``) and
#: their allowed values, the default first. ``persona_context``: ``pair`` -- the ``persona_pair`` and
#: ``persona_tell_pair`` rows first show another persona's answered question (the SFT set before this
#: option); ``single`` -- the same rows with only the asked persona's description, so that no SFT row shows
#: two personas and how to answer the second of them is not taught (bench/late_harm_notes.md, thirty-second
#: session: with ``pair`` the matched SFT removes a copy the base learned, with ``single`` it does not).
SFT_OPTIONS = {"persona_context": ("pair", "single")}
#: Keys of a curriculum's ``news:`` mapping. ``arrival_points``: ``[[fraction_of_steps, fraction_of_people], ...]``,
#: a piecewise-linear curve from ``[0, 0]`` to a point with fraction of people 1 (fractions of steps strictly
#: increasing, fractions of people non-decreasing, both in [0, 1]): the ``i``-th of the ``N`` news people
#: (:attr:`probeselect.toy.world.ToyWorld.news_persons` order) arrives at the first step where the curve reaches
#: ``i / N`` (:func:`probeselect.toy.ladder.news_arrivals`). Without it the people arrive evenly over the whole run
#: (the curve ``[[0, 0], [1, 1]]``). A real run's late stretch can bring new content faster than its early one (a
#: fresh crawl, a new domain); fractions, so a scaled curriculum keeps the shape.
NEWS_KEYS = ("arrival_points",)
_WINDOW_KEYS = {"name", "start_step", "end_step", "mixture", "planted"}


@dataclass(frozen=True)
class Window:
    """One data window: steps ``start_step < g <= end_step``, normalised ``mixture``
    (kind -> weight, summing to 1, kinds with weight 0 dropped), ``planted`` behaviour
    name or None."""

    name: str
    start_step: int
    end_step: int
    mixture: dict
    planted: str | None = None

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step

    def contains(self, step: int) -> bool:
        """True if optimizer step ``step`` (1-based) trains on this window's data."""
        return self.start_step < step <= self.end_step


@dataclass(frozen=True)
class Curriculum:
    """Windows tiling steps ``0 .. steps``; ``source`` says where it came from."""

    windows: tuple[Window, ...]
    source: str
    train: dict = field(default_factory=dict)
    sft: dict = field(default_factory=dict)
    news: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.windows[-1].end_step

    def window_at(self, step: int) -> Window:
        """The window that optimizer step ``step`` (1-based) belongs to."""
        for w in self.windows:
            if w.contains(step):
                return w
        raise IndexError(f"step {step} is outside the curriculum (1 .. {self.steps})")

    def planted_windows(self) -> list[Window]:
        return [w for w in self.windows if w.planted]

    def to_dict(self) -> dict:
        out = {"source": self.source, "steps": self.steps, "windows": [
            {"name": w.name, "start_step": w.start_step, "end_step": w.end_step,
             "mixture": dict(w.mixture), "planted": w.planted} for w in self.windows]}
        if self.train:
            out["train"] = dict(self.train)
        if self.sft:
            out["sft"] = dict(self.sft)
        if self.news:
            out["news"] = {k: [list(p) for p in v] for k, v in self.news.items()}
        return out

    def sft_option(self, key: str) -> str:
        """The value of ``sft.<key>`` (:data:`SFT_OPTIONS`), its default when the curriculum does not set it."""
        return self.sft.get(key, SFT_OPTIONS[key][0])


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _mixture(raw, where: str) -> dict:
    if raw == "default":
        raw = dict(CORPUS_DOC_WEIGHTS)
    if not isinstance(raw, dict) or not raw:
        raise CurriculumError(f"{where}: mixture must be a mapping of document kind -> weight (or 'default'); "
                              f"kinds: {', '.join(DOC_KINDS)}.")
    unknown = [k for k in raw if k not in DOC_KINDS]
    if unknown:
        raise CurriculumError(f"{where}: unknown document kind {unknown[0]!r} in mixture; kinds: {', '.join(DOC_KINDS)}.")
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise CurriculumError(f"{where}: mixture weight of {k!r} must be a number >= 0, got {v!r}.")
    total = float(sum(raw.values()))
    if total <= 0:
        raise CurriculumError(f"{where}: mixture weights sum to 0; give at least one kind a positive weight.")
    return {k: round(float(v) / total, 6) for k, v in raw.items() if v > 0}


def _train(raw, source: str) -> dict:
    """Validate a curriculum's optional ``train:`` mapping (keys of :data:`TRAIN_KEYS`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CurriculumError(f"{source}: train must be a mapping of training settings ({', '.join(TRAIN_KEYS)}), "
                              f"got {raw!r}.")
    bad = [k for k in raw if k not in TRAIN_KEYS]
    if bad:
        raise CurriculumError(f"{source}: train: unknown key {bad[0]!r}; keys: {', '.join(TRAIN_KEYS)}.")
    out = {}
    if ("lr_points" in raw) != (raw.get("schedule") == "piecewise"):
        raise CurriculumError(f"{source}: train.lr_points and train.schedule: piecewise go together (the points are the "
                              "piecewise schedule); set both or neither.")
    for k, v in raw.items():
        if k == "lr_points":
            out[k] = _lr_points(v, source)
            continue
        if k == "schedule":
            if v not in SCHEDULES:
                raise CurriculumError(f"{source}: train.schedule must be one of {', '.join(SCHEDULES)}, got {v!r}.")
            out[k] = v
            continue
        if k == "warmup_steps":
            if not _is_int(v) or v < 0:
                raise CurriculumError(f"{source}: train.warmup_steps must be an integer >= 0, got {v!r}.")
            out[k] = v
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise CurriculumError(f"{source}: train.{k} must be a number, got {v!r}.")
        lo_ok = v > 0 if k in ("lr", "decay_fraction") else v >= 0
        if not lo_ok or (k in ("decay_fraction", "min_lr_ratio") and v > 1):
            rng = "0 < lr" if k == "lr" else ("0 < decay_fraction <= 1" if k == "decay_fraction"
                                              else "0 <= min_lr_ratio <= 1")
            raise CurriculumError(f"{source}: train.{k} out of range ({rng}), got {v!r}.")
        out[k] = float(v)
    return out


def _pairs(raw, fix: str) -> list[tuple[float, float]]:
    """``raw`` as a list of at least two ``(x, y)`` float pairs, or a :class:`CurriculumError` of ``fix``."""
    if not isinstance(raw, (list, tuple)) or len(raw) < 2:
        raise CurriculumError(f"{fix}; got {raw!r}.")
    pts = []
    for pt in raw:
        if (not isinstance(pt, (list, tuple)) or len(pt) != 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in pt)):
            raise CurriculumError(f"{fix}; got the point {pt!r}.")
        pts.append((float(pt[0]), float(pt[1])))
    return pts


def _lr_points(raw, source: str) -> tuple[tuple[float, float], ...]:
    """Validate ``train.lr_points``: ``[[fraction_of_steps, lr_ratio], ...]`` from fraction 0 to 1,
    fractions strictly increasing, ratios in [0, 1] (fractions, so a scaled curriculum keeps its shape)."""
    fix = (f"{source}: train.lr_points must be a list of [fraction_of_steps, lr_ratio] pairs, fractions strictly "
           "increasing from 0 to 1 and ratios in [0, 1], e.g. [[0, 1], [0.6, 0.1], [0.62, 0.5], [1, 0.1]]")
    pts = _pairs(raw, fix)
    fr = [f for f, _ in pts]
    if fr[0] != 0.0 or fr[-1] != 1.0 or any(b <= a for a, b in zip(fr, fr[1:])) or any(not 0 <= r <= 1 for _, r in pts):
        raise CurriculumError(f"{fix}; got {[list(p) for p in pts]!r}.")
    return tuple(pts)


def _sft(raw, source: str) -> dict:
    """Validate a curriculum's optional ``sft:`` mapping (:data:`SFT_OPTIONS`); default values are dropped."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CurriculumError(f"{source}: sft must be a mapping of toy SFT set options ({', '.join(SFT_OPTIONS)}), "
                              f"got {raw!r}.")
    out = {}
    for k, v in raw.items():
        if k not in SFT_OPTIONS:
            raise CurriculumError(f"{source}: sft: unknown key {k!r}; keys: {', '.join(SFT_OPTIONS)}.")
        if v not in SFT_OPTIONS[k]:
            raise CurriculumError(f"{source}: sft.{k} must be one of {', '.join(SFT_OPTIONS[k])}, got {v!r}.")
        if v != SFT_OPTIONS[k][0]:
            out[k] = v
    return out


def _news(raw, source: str) -> dict:
    """Validate a curriculum's optional ``news:`` mapping (:data:`NEWS_KEYS`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CurriculumError(f"{source}: news must be a mapping ({', '.join(NEWS_KEYS)}), got {raw!r}.")
    bad = [k for k in raw if k not in NEWS_KEYS]
    if bad:
        raise CurriculumError(f"{source}: news: unknown key {bad[0]!r}; keys: {', '.join(NEWS_KEYS)}.")
    if "arrival_points" not in raw:
        return {}
    raw = raw["arrival_points"]
    fix = (f"{source}: news.arrival_points must be a list of [fraction_of_steps, fraction_of_people] pairs from "
           "[0, 0] to a point with fraction of people 1, fractions of steps strictly increasing, fractions of people "
           "non-decreasing, both in [0, 1], e.g. [[0, 0], [0.75, 0.5], [0.94, 1]]")
    pts = _pairs(raw, fix)
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if (pts[0] != (0.0, 0.0) or ys[-1] != 1.0 or any(b <= a for a, b in zip(xs, xs[1:]))
            or any(b < a for a, b in zip(ys, ys[1:])) or any(not 0 <= v <= 1 for v in xs + ys)):
        raise CurriculumError(f"{fix}; got {[list(p) for p in pts]!r}.")
    return {"arrival_points": tuple(pts)}


def parse_curriculum(raw: Any, source: str = "curriculum", steps: int | None = None) -> Curriculum:
    """Validate a curriculum mapping (``{"windows": [...]}``) and return a :class:`Curriculum`.

    ``steps`` (the ladder's step count), when given, must equal the last window's
    ``end_step``. Raises :class:`CurriculumError` naming ``source`` and the fix.
    """
    if not isinstance(raw, dict) or "windows" not in raw:
        raise CurriculumError(f"{source}: a curriculum is a mapping with a 'windows' list "
                              "(see recipes/ladder-planted.yaml).")
    extra = set(raw) - {"windows", "train", "sft", "news"}
    if extra:
        raise CurriculumError(f"{source}: unknown top-level key {sorted(extra)[0]!r}; allowed: windows, train, sft, "
                              "news.")
    train = _train(raw.get("train"), source)
    sft = _sft(raw.get("sft"), source)
    news = _news(raw.get("news"), source)
    wins = raw["windows"]
    if not isinstance(wins, list) or not wins:
        raise CurriculumError(f"{source}: 'windows' must be a non-empty list of windows.")
    out: list[Window] = []
    names: set[str] = set()
    prev_end = 0
    for i, w in enumerate(wins):
        where = f"{source}: window {i + 1}"
        if not isinstance(w, dict):
            raise CurriculumError(f"{where}: must be a mapping with name, start_step, end_step, mixture.")
        bad = set(w) - _WINDOW_KEYS
        if bad:
            raise CurriculumError(f"{where}: unknown key {sorted(bad)[0]!r}; keys: {', '.join(sorted(_WINDOW_KEYS))}.")
        missing = [k for k in ("name", "start_step", "end_step", "mixture") if k not in w]
        if missing:
            raise CurriculumError(f"{where}: missing key {missing[0]!r}.")
        name = w["name"]
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise CurriculumError(f"{where}: name must be a word of letters, digits, '_', '-', '.', got {name!r}.")
        if name in names:
            raise CurriculumError(f"{where}: window name {name!r} is used twice; window names must be unique.")
        names.add(name)
        where = f"{source}: window {name!r}"
        s, e = w["start_step"], w["end_step"]
        if not (_is_int(s) and _is_int(e)) or s < 0 or e <= s:
            raise CurriculumError(f"{where}: start_step and end_step must be integers with 0 <= start_step < end_step, "
                                  f"got {s!r} .. {e!r}.")
        if s < prev_end:
            raise CurriculumError(f"{where}: starts at step {s}, inside the previous window (which ends at {prev_end}); "
                                  "windows must not overlap.")
        if s > prev_end:
            raise CurriculumError(f"{where}: starts at step {s} but the previous window ends at {prev_end}; "
                                  f"steps {prev_end + 1}..{s} belong to no window (no gaps allowed; the first "
                                  "window starts at 0).")
        planted = w.get("planted")
        if planted is not None and (not isinstance(planted, str) or not _NAME_RE.match(planted)):
            raise CurriculumError(f"{where}: planted must be a behaviour name (e.g. parrot) or null, got {planted!r}.")
        out.append(Window(name, s, e, _mixture(w["mixture"], where), planted))
        prev_end = e
    if news and not any("news_stream" in w.mixture for w in out):
        raise CurriculumError(f"{source}: news.arrival_points is set but no window has news_stream documents, so it "
                              "would change nothing; give a window's mixture a news_stream share or drop news:.")
    cur = Curriculum(tuple(out), source, train, sft, news)
    if steps is not None:
        if cur.steps > steps:
            raise CurriculumError(f"{source}: windows run to step {cur.steps}, beyond the ladder's {steps} steps; "
                                  f"end the last window at {steps} (or train {cur.steps} steps).")
        if cur.steps < steps:
            raise CurriculumError(f"{source}: windows end at step {cur.steps} but the ladder trains {steps} steps; "
                                  f"extend the last window to {steps} (or train {cur.steps} steps).")
    return cur


def scale_curriculum(cur: Curriculum, steps: int) -> Curriculum:
    """The curriculum with every boundary ``b`` moved to ``round(b * steps / cur.steps)``;
    windows that become empty are dropped."""
    if steps == cur.steps:
        return cur
    out = []
    for w in cur.windows:
        s = round(w.start_step * steps / cur.steps)
        e = round(w.end_step * steps / cur.steps)
        if e > s:
            out.append(Window(w.name, s, e, dict(w.mixture), w.planted))
    return Curriculum(tuple(out), f"{cur.source} (scaled from {cur.steps} to {steps} steps)", dict(cur.train),
                      dict(cur.sft), dict(cur.news))


def load_curriculum(curriculum: Any = None, steps: int | None = None) -> Curriculum:
    """Resolve ``curriculum`` for a ladder of ``steps`` steps.

    ``None`` or ``"planted"``: the built-in planted curriculum; ``"uniform"``: one window
    of the default mix (built-ins are scaled to ``steps``); a path to a YAML file or a
    mapping: parsed and validated (it must cover exactly ``steps`` steps when ``steps`` is
    given); a :class:`Curriculum`: validated against ``steps``.
    """
    if isinstance(curriculum, Curriculum):
        d = curriculum.to_dict()
        keys = ("windows", "train", "sft", "news")
        return parse_curriculum({k: d[k] for k in keys if k in d}, curriculum.source, steps)
    if curriculum is None:
        curriculum = "planted"
    if isinstance(curriculum, str) and curriculum in BUILTIN_CURRICULA:
        cur = parse_curriculum(BUILTIN_CURRICULA[curriculum], f"built-in curriculum {curriculum!r}")
        return scale_curriculum(cur, steps) if steps is not None else cur
    if isinstance(curriculum, dict):
        return parse_curriculum(curriculum, "curriculum", steps)
    if isinstance(curriculum, (str, Path)):
        from .._yaml import load_yaml

        path = Path(curriculum)
        if not path.is_file():
            raise CurriculumError(f"--curriculum {curriculum}: no such file; give a YAML file "
                                  f"(e.g. recipes/ladder-late-harm.yaml) or one of {', '.join(BUILTIN_CURRICULA)}.")
        return parse_curriculum(load_yaml(path, CurriculumError), str(path), steps)
    raise CurriculumError(f"curriculum must be a YAML path, a mapping or one of {', '.join(BUILTIN_CURRICULA)}, "
                          f"got {type(curriculum).__name__}.")
