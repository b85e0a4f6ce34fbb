"""The spec files that ship with the package, usable by name from any directory.

The repository's ``probes/`` folder is the user-facing copy (its layout is documented);
``probes/data/specs/`` inside the package holds byte-identical copies of its built-in
specs (``probes/*.yaml``, ``probes/capability/*.yaml``, ``probes/real/*.yaml``) so that
an installed package finds them without the repository. ``tests/test_shipped_specs.py``
fails if the two copies drift apart.

``--probes`` (score) and ``score.probes`` (run configs) accept, besides spec files:

* a folder: every ``*.yaml`` / ``*.yml`` directly in it;
* a collection name: ``real`` (the six real-LM conflict families and their capability twins) or ``capability``;
* a family name that has a shipped spec (``real_successive``, ``arith_pattern`` ...): that
  spec file (its item counts and variants, not the family's bare defaults).

An existing file or folder always wins over a name.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .._yaml import load_yaml
from ..errors import ProbeSpecError, did_you_mean

SPEC_ROOT = Path(__file__).resolve().parent / "data" / "specs"
#: Sub-folders of ``SPEC_ROOT`` that are usable as one name (all their specs).
COLLECTIONS = ("real", "capability")
_SUFFIXES = (".yaml", ".yml")


def shipped_spec_files() -> list[Path]:
    """Every shipped spec file: the top level of ``SPEC_ROOT`` and each collection folder."""
    files = sorted(p for p in SPEC_ROOT.glob("*.yaml") if p.is_file())
    for c in COLLECTIONS:
        files += sorted(p for p in (SPEC_ROOT / c).glob("*.yaml") if p.is_file())
    return files


@lru_cache(maxsize=1)
def _names() -> dict[str, tuple[Path, ...]]:
    names: dict[str, tuple[Path, ...]] = {}
    for c in COLLECTIONS:
        names[c] = tuple(sorted((SPEC_ROOT / c).glob("*.yaml")))
    for p in shipped_spec_files():
        raw = load_yaml(p)
        fam = raw.get("family") if isinstance(raw, dict) else None
        if not isinstance(fam, str):
            raise ProbeSpecError(f"{p}: shipped spec without a `family:` name; the package is damaged, reinstall it.")
        if fam in names:
            raise ProbeSpecError(f"{p}: family {fam!r} has two shipped specs; the package is damaged, reinstall it.")
        names[fam] = (p,)
    return names


def shipped_names() -> dict[str, tuple[Path, ...]]:
    """``{name: spec files}`` for every collection and every family with a shipped spec."""
    return dict(_names())


def resolve_probe_args(args, *, where: str = "--probes") -> list:
    """Turn ``--probes`` arguments into spec files (``FamilySpec`` objects pass through).

    Each argument is an existing spec file, an existing folder (its ``*.yaml`` files), or a
    shipped name (see the module docstring). Anything else is an error that lists the
    shipped names.
    """
    from ._spec import FamilySpec

    if isinstance(args, (str, Path)):
        args = [args]
    out: list = []
    for a in args:
        if isinstance(a, FamilySpec):
            out.append(a)
            continue
        p = Path(a)
        if p.is_file():
            out.append(p)
            continue
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in _SUFFIXES)
            if not files:
                raise ProbeSpecError(f"{where} {a}: a folder without *.yaml spec files.")
            out.extend(files)
            continue
        names = _names()
        if str(a) in names:
            out.extend(names[str(a)])
            continue
        key = p.stem if p.suffix.lower() in _SUFFIXES else str(a)
        hint = did_you_mean(key, list(names))
        if not hint and p.parent.name in COLLECTIONS and f"{p.parent.name}_{key}" in names:
            hint = f' Did you mean "{p.parent.name}_{key}"?'
        raise ProbeSpecError(
            f"{where} {a}: no such spec file or folder, and not the name of a shipped spec.{hint} "
            f"Shipped names (usable from any directory): {', '.join(COLLECTIONS)} (every spec of that collection), "
            f"or one family: {', '.join(n for n in sorted(names) if n not in COLLECTIONS)}."
        )
    return out
