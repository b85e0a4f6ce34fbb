"""Probe family specs: a small YAML file that configures a registered family.

The resolved spec (``FamilySpec``) lives here; reading and validating a spec file
(``spec_from_dict``, ``load_spec``) is in ``_parse``, above the data-defined forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import canonical_json_hash


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
            # Make the data-defined family visible to get_family()/generate_items(): the data
            # (a _userdata.UserData or a _gdsuite.GDsuiteData) registers its own family.
            self.user_data.register(self)

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
