"""Probe families, their specs and items.

Families are Python generators registered by name; a YAML spec in ``probes/`` picks a
family and sets its item count, demonstration count, variants and parameters.
"""

# Importing a family module registers its families.
from . import _capability, _persona, _templates, _userdata  # noqa: F401
from . import _real_flipped, _real_intuitive, _real_persona, _real_repetitive, _real_successive, _real_truthy  # noqa: F401
from . import _calibration  # noqa: F401  (after the real families: registers their content-free <family>_cf)
from . import _real_plain  # noqa: F401  (after the real families: their capability twins real_<x>_plain)
from ._arithmetic import TEMPLATES as ARITH_TEMPLATES
from ..items import ProbeItem, item_rng
from ._registry import Family, get_family, list_families, register_family
from ._parse import load_spec, spec_from_dict
from ._spec import FamilySpec

__all__ = [
    "ARITH_TEMPLATES",
    "Family",
    "FamilySpec",
    "ProbeItem",
    "generate_items",
    "get_family",
    "item_rng",
    "list_families",
    "load_spec",
    "register_family",
    "spec_from_dict",
]


def generate_items(spec: FamilySpec, seeds) -> list[ProbeItem]:
    """All items of ``spec`` for each evaluation seed, in (seed, variant, index) order."""
    fam = get_family(spec.family)
    items: list[ProbeItem] = []
    for seed in seeds:
        items.extend(fam.generate(spec, int(seed)))
    return items
