"""Shared pieces of the built-in families for real English LMs (``real_*``).

Each real family mirrors one GDsuite family and builds its prompts with the shared
demonstration machinery of :mod:`._demos` (strategies, ``prompt + " " + answer`` blocks,
joiners). Hand-written content ships inside the package under ``probes/data/real/``;
:func:`load_data` reads it. Every real family accepts ``params.boundary``: ``lmeval``
(probeselect's span contract, the default) or ``gdsuite`` (GDsuite's answer-boundary
rule, which also adds GDsuite's per-item columns and ``hard_accuracy``/``prob_margin``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from ..errors import ProbeSpecError
from ..items import ProbeItem

BOUNDARIES = ("lmeval", "gdsuite")


@lru_cache(maxsize=None)
def load_data(name: str) -> Any:
    """A JSON file shipped in ``probeselect/probes/data/real/`` (parsed)."""
    path = resources.files("probeselect.probes").joinpath("data", "real", name)
    return json.loads(path.read_text(encoding="utf-8"))


def content_free(spec) -> str | None:
    """The content-free string (e.g. "N/A") that replaces each query's content when ``spec`` is
    a calibration spec (``params.content_free``, set by :mod:`probeselect.probes._calibration`),
    else None. Demonstrations, formats, candidates and random draws stay those of the family."""
    cf = spec.params.get("content_free")
    return None if cf in (None, False) else str(cf)


def check_boundary(spec, source: str) -> None:
    b = spec.params.get("boundary", "lmeval")
    if b not in BOUNDARIES:
        raise ProbeSpecError(f"{source}: params.boundary must be one of {list(BOUNDARIES)}, got {b!r}.")


def check_int(source: str, family: str, key: str, v, lo: int, hi: int | None = None) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ProbeSpecError(f"{source}: {family} {key} must be an integer {rng}, got {v!r}.")


def check_tasks(source: str, family: str, tasks, known: Sequence[str]) -> None:
    if (not isinstance(tasks, list) or not tasks or any(t not in known for t in tasks)
            or len(set(tasks)) != len(tasks)):
        raise ProbeSpecError(f"{source}: {family} params.tasks must be a non-empty list of distinct names from "
                             f"{list(known)}, got {tasks!r}.")


def variant_names(tasks: Sequence[str], formats: Sequence[str]) -> tuple[str, ...]:
    """Variant names ``<task>.<format>``: the summary then has one row per task and format."""
    return tuple(f"{t}.{f}" for t in tasks for f in formats)


def selected(spec, tasks_key: str = "tasks") -> list[tuple[str, str, str]]:
    """``(variant, task, format)`` for the spec's variants whose task is in params.tasks."""
    tasks = spec.params.get(tasks_key)
    out = []
    for v in spec.variants:
        t, f = v.split(".", 1)
        if tasks is None or t in tasks:
            out.append((v, t, f))
    return out


def make_item(spec, variant: str, seed: int, index: int, prompt: str, task: str, shortcut: str,
              distractors: Sequence[str] = (), metadata: dict | None = None) -> ProbeItem:
    """A ProbeItem whose candidates are ``" " + answer`` (as GDsuite appends answers)."""
    cands = [" " + task, " " + shortcut]
    for d in distractors:
        if " " + d not in cands:
            cands.append(" " + d)
    meta = dict(metadata or {})
    meta["boundary"] = spec.params.get("boundary", "lmeval")
    return ProbeItem(item_id=f"{spec.family}/{variant}/{index:04d}", family=spec.family, variant=variant, seed=seed,
                     prompt=prompt, task_answer=cands[0], shortcut_answer=cands[1], candidates=tuple(cands),
                     metadata=meta)
