"""Demonstration sampling and prompt assembly, shared by the built-in real-LM families and
the GDsuite-format reader (``_gdsuite``).

This reproduces GDsuite's protocol (``run_eval.py`` of the GDsuite repository) exactly:

* a demonstration row is a mapping with ``prompt`` and ``answer`` (and optionally
  ``label`` 0/1 and ``demo_set``); its block is ``f"{prompt} {answer}"``;
* the prompt of a test item is ``joiner.join(demo blocks + [test prompt])``;
* strategies (``STRATEGIES``), each ``fn(pool, k, rng) -> demos``:

  ``none``      no demonstrations (zero-shot);
  ``random``    ``rng.sample(pool, min(k, len(pool)))``, **resampled for every test
                item** from one stream per (task, seed), so item j's demonstrations
                depend on the draws of items 0..j-1;
  ``ordered``   the first ``k`` rows of the pool, in file order;
  ``balanced``  ``k // 2`` rows of label 0 and ``k // 2`` of label 1 (each class
                shuffled, then the union shuffled), drawn once per seed;

* the stream is ``random.Random(seed)`` for the evaluation seed, fresh per task;
* when demo rows carry ``demo_set``, seed ``s`` uses the rows of set
  ``s % n_sets`` (``n_sets = max(demo_set) + 1``), in file order;
* a task without demo rows, or with strategy ``none``, is zero-shot: every seed sees the
  same prompts.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator, Mapping, Sequence

Demo = Mapping[str, object]
Strategy = Callable[[Sequence[Demo], int, random.Random], list]


def _balanced(demos: Sequence[Demo], k: int, rng: random.Random) -> list:
    """``k // 2`` demonstrations per class of the ``label`` field (0 and 1), shuffled."""
    c0 = [d for d in demos if d["label"] == 0]
    c1 = [d for d in demos if d["label"] == 1]
    rng.shuffle(c0)
    rng.shuffle(c1)
    out = c0[: k // 2] + c1[: k // 2]
    rng.shuffle(out)
    return out


STRATEGIES: dict[str, Strategy] = {
    "none": lambda demos, k, rng: [],
    "random": lambda demos, k, rng: rng.sample(list(demos), min(k, len(demos))),
    "ordered": lambda demos, k, rng: list(demos[:k]),
    "balanced": _balanced,
}

#: Joiners by name (specs may also give the string itself).
JOINERS = {"newline": "\n", "blank_line": "\n\n"}


def select_demo_set(demos: Sequence[Demo], seed: int) -> list:
    """The demo rows of set ``seed % n_sets`` when rows carry ``demo_set``, else all rows."""
    demos = list(demos)
    if not demos or "demo_set" not in demos[0]:
        return demos
    n_sets = max(int(d.get("demo_set", 0)) for d in demos) + 1
    return [d for d in demos if int(d.get("demo_set", 0)) == seed % n_sets]


def demo_block(demo: Demo) -> str:
    """One demonstration as the model sees it: ``prompt + " " + answer``."""
    return f"{demo['prompt']} {demo['answer']}"


def build_icl_prompt(blocks: Sequence[str], test_prompt: str, joiner: str = "\n\n") -> str:
    """Demonstration blocks and the test prompt joined by ``joiner``."""
    return joiner.join(list(blocks) + [test_prompt])


def is_zero_shot(strategy: str, demos: Sequence[Demo]) -> bool:
    return strategy == "none" or not demos


def icl_prompts(demos: Sequence[Demo], test_prompts: Sequence[str], *, strategy: str, k: int, seed: int,
                joiner: str) -> Iterator[tuple[str, list]]:
    """``(prompt, demos used)`` for every test prompt under one evaluation seed.

    Zero-shot tasks (see :func:`is_zero_shot`) give the bare test prompts whatever the
    seed. Otherwise the stream ``random.Random(seed)`` drives the strategy, once per
    seed, or once per test item for ``random``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown demo strategy {strategy!r}; choose one of {sorted(STRATEGIES)}")
    if is_zero_shot(strategy, demos):
        for t in test_prompts:
            yield t, []
        return
    sample = STRATEGIES[strategy]
    rng = random.Random(seed)
    pool = select_demo_set(demos, seed)
    chosen: list = [] if strategy == "random" else sample(pool, k, rng)
    for t in test_prompts:
        if strategy == "random":
            chosen = sample(pool, k, rng)
        yield build_icl_prompt([demo_block(d) for d in chosen], t, joiner), list(chosen)
