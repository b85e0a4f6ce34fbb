"""The item schema shared by every probe family and by the engines that score items.

It sits below both ``probes/`` and ``generation``; ``probeselect.probes`` re-exports it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProbeItem:
    """One conflict-probe item under one evaluation seed.

    ``prompt`` is the full text the model sees (demonstrations included). ``candidates``
    are the exact continuation strings that are scored, each with its leading
    word-boundary space; ``candidates[0]`` is ``task_answer`` and ``candidates[1]`` is
    ``shortcut_answer``, family-specific distractors follow. ``item_id`` is stable
    across evaluation seeds (the query is fixed, the demonstrations are resampled).
    """

    item_id: str
    family: str
    variant: str
    seed: int
    prompt: str
    task_answer: str
    shortcut_answer: str
    candidates: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task_answer == self.shortcut_answer:
            raise ValueError(f"item {self.item_id}: task_answer equals shortcut_answer ({self.task_answer!r})")
        if tuple(self.candidates[:2]) != (self.task_answer, self.shortcut_answer):
            raise ValueError(f"item {self.item_id}: candidates must start with (task_answer, shortcut_answer)")
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"item {self.item_id}: duplicate candidates {self.candidates}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidates"] = list(self.candidates)
        return d


def item_rng(*key: object) -> random.Random:
    """A random stream determined only by ``key`` (e.g. family, variant, seed, index).

    Uses SHA-256 of the key's repr, so it does not depend on Python's hash seed, on
    processing order, or on which other items were generated.
    """
    digest = hashlib.sha256(repr(key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def build_item(family: str, variant: str, seed: int, index: int, prompt: str, task: str, shortcut: str,
               distractors=(), metadata: dict[str, Any] | None = None) -> ProbeItem:
    """A :class:`ProbeItem` with the standard id (``family/variant/index``) and candidates
    ``(task, shortcut, *distractors)``, distractors de-duplicated in order."""
    cands = [task, shortcut]
    for d in distractors:
        if d not in cands:
            cands.append(d)
    return ProbeItem(
        item_id=f"{family}/{variant}/{index:04d}",
        family=family,
        variant=variant,
        seed=seed,
        prompt=prompt,
        task_answer=task,
        shortcut_answer=shortcut,
        candidates=tuple(cands),
        metadata=dict(metadata or {}),
    )
