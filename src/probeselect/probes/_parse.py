"""Reading a probe spec: validate a raw mapping or YAML file and resolve it to a ``FamilySpec``.

A spec with ``format:`` goes to the GDsuite reader, one with data keys to the
data-defined (user) reader, any other to its registered family's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._yaml import load_yaml
from ..errors import ProbeSpecError, did_you_mean
from ._spec import FamilySpec

_SPEC_KEYS = {"family", "n_items", "n_demos", "variants", "params", "description", "requires"}
#: Keys that make a spec a data-defined (user) family; see ``_userdata``.
USER_FORM_KEYS = ("data", "template", "templates", "demo_pool", "query_pool")


def spec_from_dict(raw: Any, *, source: str = "<dict>", path: Path | None = None) -> FamilySpec:
    """Validate a raw mapping and resolve it against its family's defaults."""
    from ._registry import get_family, is_builtin_family, list_families

    if not isinstance(raw, dict):
        raise ProbeSpecError(f"{source}: a probe spec must be a YAML mapping with at least `family:`.")
    if "format" in raw:
        from ._gdsuite import gdsuite_spec_from_dict

        return gdsuite_spec_from_dict(raw, source=source, path=path)
    if any(k in raw for k in USER_FORM_KEYS):
        from ._userdata import user_spec_from_dict

        return user_spec_from_dict(raw, source=source, path=path)
    unknown = sorted(set(raw) - _SPEC_KEYS, key=str)
    if unknown:
        from ._userdata import ALL_USER_KEYS

        hint = did_you_mean(str(unknown[0]), _SPEC_KEYS | set(ALL_USER_KEYS))
        raise ProbeSpecError(f"{source}: unknown key {unknown[0]!r}.{hint} Allowed keys: {sorted(_SPEC_KEYS)}.")
    if "family" not in raw:
        raise ProbeSpecError(f"{source}: missing required key `family`.")
    name = str(raw["family"])
    if not is_builtin_family(name):
        builtins = [f.name for f in list_families()]
        raise ProbeSpecError(
            f"{source}: unknown probe family {name!r}.{did_you_mean(name, builtins)} Built-in families: {builtins}. "
            "To define a new family from a data file instead, add `data:` (see probes/README.md)."
        )
    fam = get_family(name, source=source)
    if "requires" in raw and raw["requires"] != fam.requires:
        raise ProbeSpecError(
            f"{source}: `requires: {raw['requires']}` does not match family {fam.name!r}, which "
            + (f"requires {fam.requires!r}." if fam.requires else "has no requirement; remove the key.")
        )
    variants = raw.get("variants", list(fam.variants))
    if isinstance(variants, str):
        variants = [variants]
    if not variants:
        raise ProbeSpecError(f"{source}: `variants` is empty; list at least one of {list(fam.variants)}.")
    for v in variants:
        if v not in fam.variants:
            raise ProbeSpecError(
                f"{source}: family {fam.name!r} has no variant {v!r}.{did_you_mean(str(v), fam.variants)} "
                f"Known variants: {list(fam.variants)}."
            )
    params = dict(fam.default_params)
    user_params = raw.get("params") or {}
    if not isinstance(user_params, dict):
        raise ProbeSpecError(f"{source}: `params` must be a mapping.")
    for k, v in user_params.items():
        if k not in fam.default_params:
            raise ProbeSpecError(
                f"{source}: family {fam.name!r} has no parameter {k!r}.{did_you_mean(str(k), fam.default_params)} "
                f"Known parameters: {sorted(fam.default_params)}."
            )
        params[k] = v
    n_items = raw.get("n_items", fam.default_n_items)
    n_demos = raw.get("n_demos", fam.default_n_demos)
    for key, val, lo in (("n_items", n_items, 1), ("n_demos", n_demos, 0)):
        if not isinstance(val, int) or isinstance(val, bool) or val < lo:
            raise ProbeSpecError(f"{source}: `{key}` must be an integer >= {lo}, got {val!r}.")
    spec = FamilySpec(
        family=fam.name,
        n_items=n_items,
        n_demos=n_demos,
        variants=tuple(variants),
        params=params,
        description=str(raw.get("description", "")),
        path=path,
    )
    if fam.validate is not None:
        fam.validate(spec, source)
    return spec


def load_spec(path: str | Path) -> FamilySpec:
    """Load and validate a probe spec YAML file (duplicate keys are rejected)."""
    path = Path(path)
    return spec_from_dict(load_yaml(path), source=str(path), path=path)
