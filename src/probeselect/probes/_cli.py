"""Listing, validation and preview helpers for probe families (no argparse, no model).

The CLI wires these into subcommands; each returns a string or a plain structure.

* :func:`list_probes` -- a table of the built-in families and the data-defined families
  whose specs live under a folder.
* :func:`validate_probe_files` -- load specs (and their data) and generate the items of
  evaluation seed 0, reporting the first error of each file.
* :func:`show_items` -- render a few items exactly as the model sees them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import ProbeSpecError, did_you_mean
from ..items import ProbeItem
from ._registry import get_family, is_builtin_family, list_families
from ._parse import load_spec, spec_from_dict
from ._spec import FamilySpec

SPEC_SUFFIXES = (".yaml", ".yml")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [fmt(headers), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def _spec_files(root: Path) -> list[Path]:
    """``root`` itself if it is a file, else every *.yaml / *.yml below it (sorted)."""
    if root.is_dir():
        return sorted(p for p in root.rglob("*") if p.suffix.lower() in SPEC_SUFFIXES and p.is_file())
    return [root]


def _item_errors(spec: FamilySpec, seed: int = 0) -> list[ProbeItem]:
    """Generate the items of one seed, turning item-construction errors into ProbeSpecError."""
    fam = get_family(spec.family)
    where = str(spec.path) if spec.path else spec.family
    try:
        return list(fam.generate(spec, seed))
    except ProbeSpecError:
        raise
    except (ValueError, KeyError, IndexError) as exc:  # e.g. ProbeItem's duplicate-candidate check
        raise ProbeSpecError(f"{where}: generating items for seed {seed} failed: {exc}") from None


def list_probes(spec_dir: Path | None = None) -> str:
    """A table of every built-in family plus the data-defined families under ``spec_dir``;
    toy-world families (``requires: toy_world``) are listed in a second table.

    Built-in rows show the default item count per variant; data-defined rows (found by
    loading every *.yaml below ``spec_dir``) show the actual item count of each variant.
    Spec files that fail to load are listed after the table with their error.
    """
    headers = ["family", "kind", "variants", "items/variant", "source", "description"]
    rows = [
        [f.name, f.kind, ",".join(f.variants), str(f.default_n_items), "built-in", f.description]
        for f in list_families() if f.requires is None
    ]
    toy_rows = [
        [f.name, f.kind, ",".join(f.variants), str(f.default_n_items), "built-in", f.description]
        for f in list_families() if f.requires == "toy_world"
    ]
    problems: list[str] = []
    if spec_dir is not None:
        spec_dir = Path(spec_dir)
        if not spec_dir.exists():
            problems.append(f"{spec_dir}: folder not found.")
        else:
            for p in _spec_files(spec_dir):
                try:
                    spec = load_spec(p)
                except ProbeSpecError as exc:
                    problems.append(str(exc))
                    continue
                if spec.user_data is None:
                    continue  # a spec of a built-in family: already listed
                counts = spec.user_data.counts()
                per = ",".join(f"{v}={min(counts[v], spec.n_items)}" for v in spec.variants)
                fam = get_family(spec.family)
                rows.append([spec.family, fam.kind, ",".join(spec.variants), per, str(p), fam.description])
    out = _table(headers, rows)
    from ._shipped import COLLECTIONS, SPEC_ROOT, shipped_names

    names = shipped_names()
    out += ("\n\nSpecs shipped with the package (pass the name to --probes from any directory; "
            f"files under {SPEC_ROOT}):\n" + _table(
                ["name", "spec files"],
                [[n, ", ".join(str(p.relative_to(SPEC_ROOT)) for p in names[n])]
                 for n in list(COLLECTIONS) + sorted(n for n in names if n not in COLLECTIONS)]))
    if toy_rows:
        out += ("\n\nToy-world families (requires: toy_world; only for checkpoints of the toy ladder, "
                "an error on any other model):\n" + _table(headers, toy_rows))
    if problems:
        out += f"\n\n{len(problems)} spec file(s) could not be loaded:\n" + "\n".join(f"  {m}" for m in problems)
    return out


def validate_probe_files(paths: list[Path]) -> list[tuple[Path, str | None]]:
    """Check probe spec files without loading any model.

    Each path is a spec file or a folder (walked recursively for *.yaml / *.yml). Each
    spec is loaded (with its data file) and the items of evaluation seed 0 are
    generated. Returns ``(path, None)`` for a good file and ``(path, message)`` for a
    bad one. Two files defining the same data-defined family are an error too.
    """
    results: list[tuple[Path, str | None]] = []
    user_owner: dict[str, Path] = {}
    for root in paths:
        root = Path(root)
        if not root.exists():
            results.append((root, f"{root}: not found."))
            continue
        files = _spec_files(root)
        if root.is_dir() and not files:
            results.append((root, f"{root}: no *.yaml spec files in this folder."))
            continue
        for p in files:
            try:
                spec = load_spec(p)
                _item_errors(spec, 0)
                if spec.user_data is not None:
                    prev = user_owner.get(spec.family)
                    if prev is not None and prev.resolve() != p.resolve():
                        raise ProbeSpecError(
                            f"{p}: family {spec.family!r} is also defined by {prev}; give each data-defined family its own name."
                        )
                    user_owner[spec.family] = p
            except ProbeSpecError as exc:
                results.append((p, str(exc)))
            else:
                results.append((p, None))
    return results


def _resolve_spec(family_or_spec: str) -> FamilySpec:
    p = Path(family_or_spec)
    if p.suffix.lower() in SPEC_SUFFIXES or p.is_file():
        return load_spec(p)
    if not is_builtin_family(family_or_spec):
        names = [f.name for f in list_families()]
        raise ProbeSpecError(
            f"{family_or_spec!r} is neither a spec file nor a built-in family.{did_you_mean(family_or_spec, names)} "
            f"Built-in families: {names}; data-defined families are shown by their spec path."
        )
    return spec_from_dict({"family": family_or_spec}, source=family_or_spec)


def render_item(item: ProbeItem) -> str:
    """One item as the model sees it: the raw prompt, then every candidate as repr()."""
    roles = ["task", "shortcut"] + ["distractor"] * (len(item.candidates) - 2)
    lines = [
        f"=== {item.item_id}  (family {item.family}, variant {item.variant}, seed {item.seed}) ===",
        "--- prompt ---",
        item.prompt,
        f"--- prompt ends with {item.prompt[-16:]!r}; scored continuations ---",
    ]
    w = max(len(r) for r in roles) + 2
    lines += [f"  {('[' + r + ']').ljust(w)} {c!r}" for r, c in zip(roles, item.candidates)]
    return "\n".join(lines)


def show_items(family_or_spec: str, *, seed: int = 0, n: int = 3, variant: str | None = None) -> str:
    """Render the first ``n`` items of each variant (or of ``variant``) for ``seed``.

    ``family_or_spec`` is a built-in family name (its defaults are used) or a spec YAML
    path (built-in or data-defined). Prompts are printed verbatim; candidates with
    repr() so their leading spaces are visible, each marked task / shortcut /
    distractor.
    """
    if not isinstance(n, int) or n < 1:
        raise ProbeSpecError(f"show_items: n must be a positive integer, got {n!r}.")
    spec = _resolve_spec(str(family_or_spec))
    variants = spec.variants
    if variant is not None:
        if variant not in spec.variants:
            raise ProbeSpecError(
                f"{spec.path or spec.family}: no variant {variant!r}.{did_you_mean(variant, spec.variants)} "
                f"Variants: {list(spec.variants)}."
            )
        variants = (variant,)
    blocks = []
    for v in variants:
        # Item i does not depend on n_items or on the other variants, so this is a prefix.
        small = dataclasses.replace(spec, variants=(v,), n_items=min(n, spec.n_items))
        blocks += [render_item(it) for it in _item_errors(small, int(seed))[:n]]
    return "\n\n".join(blocks)
