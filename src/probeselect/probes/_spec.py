"""Probe family specs: a small YAML file that configures a registered family."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import canonical_json_hash
from .._yaml import load_yaml
from ..errors import ProbeSpecError, did_you_mean

_SPEC_KEYS = {"family", "n_items", "n_demos", "variants", "params", "description", "requires"}
#: Keys that make a spec a data-defined (user) family; see ``_userdata``.
USER_FORM_KEYS = ("data", "template", "templates", "demo_pool", "query_pool")


@dataclass(frozen=True)
class FamilySpec:
    """A resolved probe family spec.

    ``variants`` are prompt-format variant names understood by the family; ``params``
    holds family-specific options (e.g. operand ranges). ``path`` is the YAML file it
    came from (None when built in code). ``user_data`` is set for data-defined families
    (a ``_userdata.UserData``: the parsed rows or template pools and their content hash);
    it is None for families registered in code.
    """

    family: str
    n_items: int
    n_demos: int
    variants: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    path: Path | None = None
    user_data: Any = None

    def __post_init__(self) -> None:
        if self.user_data is not None:
            # Make the data-defined family visible to get_family()/generate_items().
            register = getattr(self.user_data, "register", None)  # GDsuite-format data registers itself
            if register is not None:
                register(self)
            else:
                from ._userdata import register_user_spec

                register_user_spec(self)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "family": self.family,
            "n_items": self.n_items,
            "n_demos": self.n_demos,
            "variants": list(self.variants),
            "params": dict(self.params),
            "description": self.description,
            "path": str(self.path) if self.path else None,
        }
        if self.user_data is not None:
            d["data"] = self.user_data.summary()
        return d

    @property
    def spec_hash(self) -> str:
        """Hash of the resolved settings (not of the file path).

        For a data-defined family it covers the content hash of the data (so editing the
        data file changes it) but not where the data files live.
        """
        d = self.to_dict()
        d.pop("path")
        if "data" in d:
            d["data"] = {k: v for k, v in d["data"].items() if k != "files"}
        return canonical_json_hash(d)


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
