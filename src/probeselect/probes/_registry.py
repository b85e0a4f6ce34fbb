"""The registry of probe families: Python generators registered by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..errors import ProbeSpecError, did_you_mean
from ..items import ProbeItem

Generator = Callable[..., Iterator[ProbeItem]]


@dataclass(frozen=True)
class Family:
    """A registered probe family.

    ``generate(spec, seed)`` yields the family's items for one evaluation seed, for
    every variant in ``spec.variants``.
    """

    name: str
    generate: Generator
    variants: tuple[str, ...]
    default_n_items: int = 64
    default_n_demos: int = 4
    default_params: dict[str, Any] = field(default_factory=dict)
    validate: Callable | None = None
    description: str = ""
    kind: str = "conflict"
    requires: str | None = None  # "toy_world": only meaningful on checkpoints of the toy ladder


KINDS = ("conflict", "capability", "calibration")  # calibration: content-free references (_calibration)
REQUIREMENTS = ("toy_world",)
_FAMILIES: dict[str, Family] = {}
#: Data-defined families (user specs with ``data:`` or a template), keyed by name.
_USER_FAMILIES: dict[str, Family] = {}


def register_family(
    name: str,
    *,
    variants: tuple[str, ...],
    default_n_items: int = 64,
    default_n_demos: int = 4,
    default_params: dict[str, Any] | None = None,
    validate: Callable | None = None,
    kind: str = "conflict",
    requires: str | None = None,
) -> Callable[[Generator], Generator]:
    """Decorator: register ``fn(spec, seed) -> Iterator[ProbeItem]`` as family ``name``.

    ``kind`` is ``"conflict"`` (a tempting shortcut disagrees with the task; measures
    shortcut resistance) or ``"capability"`` (plain, non-conflicting items of the same
    skill; separates "cannot do it" from "prefers the shortcut"). ``requires="toy_world"``
    marks a family whose content only means something to models trained on the toy
    corpus; scoring it on another checkpoint is an error.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if requires is not None and requires not in REQUIREMENTS:
        raise ValueError(f"requires must be None or one of {REQUIREMENTS}, got {requires!r}")

    def deco(fn: Generator) -> Generator:
        if name in _FAMILIES:
            raise ValueError(f"probe family {name!r} is already registered")
        _FAMILIES[name] = Family(
            name=name,
            generate=fn,
            variants=tuple(variants),
            default_n_items=default_n_items,
            default_n_demos=default_n_demos,
            default_params=dict(default_params or {}),
            validate=validate,
            description=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
            kind=kind,
            requires=requires,
        )
        return fn

    return deco


def get_family(name: str, *, source: str = "") -> Family:
    """Look up a family by name; unknown names get a "did you mean" error.

    Built-in families are looked up first, then data-defined (user) families registered
    by loading their spec (see :func:`register_user_family`).
    """
    if name in _FAMILIES:
        return _FAMILIES[name]
    if name in _USER_FAMILIES:
        return _USER_FAMILIES[name]
    where = f"{source}: " if source else ""
    known = sorted(_FAMILIES) + sorted(_USER_FAMILIES)
    raise ProbeSpecError(
        f"{where}unknown probe family {name!r}.{did_you_mean(name, known)} Registered families: {sorted(_FAMILIES)}."
    )


def list_families() -> list[Family]:
    """The built-in (code-registered) families, sorted by name."""
    return [_FAMILIES[k] for k in sorted(_FAMILIES)]


def is_builtin_family(name: str) -> bool:
    """True if ``name`` is a family registered in code with :func:`register_family`."""
    return name in _FAMILIES


def register_user_family(family: Family, *, source: str = "") -> None:
    """Register (or replace) a data-defined family under ``family.name``.

    Called when a user spec (``data:`` / template form) is loaded, so that
    :func:`get_family` and ``generate_items`` find it; its generator reads the data from
    the spec it is given, so re-registering the same name is harmless. A name that is
    already a built-in family is an error.
    """
    if family.name in _FAMILIES:
        where = f"{source}: " if source else ""
        raise ProbeSpecError(
            f"{where}family name {family.name!r} is already a built-in probe family; give your data-defined "
            f"family another name (e.g. {family.name + '_custom'!r})."
        )
    _USER_FAMILIES[family.name] = family


def list_user_families() -> list[Family]:
    """Data-defined families registered so far in this process, sorted by name."""
    return [_USER_FAMILIES[k] for k in sorted(_USER_FAMILIES)]


def is_toy_checkpoint(path) -> bool:
    """Whether the checkpoint folder ``path`` comes from the toy ladder (``probeselect.toy``).

    Recognised by the ``ladder.json`` that ``build_toy_ladder`` writes next to its
    checkpoints, or (for a checkpoint copied out of its ladder) by a tokenizer whose
    BOS/EOS/PAD tokens are the toy tokenizer's special tokens.
    """
    import json
    from pathlib import Path

    from ..toy.ladder import SPECIAL_TOKENS

    path = Path(path)
    if (path / "ladder.json").is_file() or (path.parent / "ladder.json").is_file():
        return True
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    toks = set()
    for k in ("bos_token", "eos_token", "pad_token"):
        v = cfg.get(k)
        toks.add(v.get("content") if isinstance(v, dict) else v)
    return set(SPECIAL_TOKENS) <= toks


def toy_ladder_seed(path) -> int | None:
    """The toy-world seed of a toy ladder folder or of a checkpoint inside one (``seed`` of the
    ``ladder.json`` that ``build_toy_ladder`` writes), else None (not a toy ladder, or a
    checkpoint copied out of its ladder)."""
    import json
    from pathlib import Path

    path = Path(path)
    for lj in (path / "ladder.json", path.parent / "ladder.json"):
        if lj.is_file():
            try:
                return int(json.loads(lj.read_text(encoding="utf-8"))["seed"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def bind_world_seed(specs, seed: int | None) -> list:
    """``specs`` with ``params.world_seed`` set to ``seed`` for every toy-world family that has
    one (their items use that world's people and facts); unchanged when ``seed`` is None."""
    import dataclasses

    if seed is None:
        return list(specs)
    return [dataclasses.replace(s, params={**s.params, "world_seed": int(seed)})
            if "world_seed" in s.params and get_family(s.family).requires == "toy_world" else s for s in specs]


def check_requirements(specs, checkpoints) -> None:
    """Refuse toy-world families on checkpoints that are not from the toy ladder, and a family
    whose ``world_seed`` is not the seed of the toy ladder it is scored on."""
    toy = sorted({s.family for s in specs if get_family(s.family).requires == "toy_world"})
    if not toy:
        return
    bad = [c for c in checkpoints if not is_toy_checkpoint(c.path)]
    if bad:
        raise ProbeSpecError(
            f"probe famil{'y' if len(toy) == 1 else 'ies'} {toy} use the toy world's vocabulary and people "
            f"(requires: toy_world) and mean nothing to a model not trained on the toy corpus, but checkpoint "
            f"{bad[0].name!r} ({bad[0].path}) is not from a toy ladder (no ladder.json beside it, no toy tokenizer). "
            "Score real checkpoints with probes/real/*.yaml or --suite gdsuite."
        )
    ladder_seeds = [(c, toy_ladder_seed(c.path)) for c in checkpoints]  # each ladder.json read once
    for s in specs:
        ws = s.params.get("world_seed")
        if ws is None or get_family(s.family).requires != "toy_world":
            continue
        for c, seed in ladder_seeds:
            if seed is not None and seed != int(ws):
                raise ProbeSpecError(
                    f"{s.path or s.family}: params.world_seed is {ws}, but checkpoint {c.name!r} ({c.path}) comes "
                    f"from a toy ladder built with seed {seed} (its ladder.json): world {ws}'s people and facts "
                    f"are not the ones this model was trained on, so the {s.family} items would test facts it never "
                    f"saw. Set `world_seed: {seed}` under `params:` in the spec (`probeselect run` sets it from "
                    "the ladder it builds or reads)."
                )
