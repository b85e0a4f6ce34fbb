"""Content-free calibration families: a chance reference for conflict margins.

A margin ``log p(task) - log p(shortcut)`` mixes what the model reads in the query with what
it prefers anyway: its prior over the two answers given the demonstrations and the format
(a small model that always says " True" gets a large margin on every item whose answer is
True, and a random-init model gets margins from its arbitrary token preferences). Contextual
calibration (Zhao et al. 2021, "Calibrate before use") measures that prior by scoring the
same candidates after a *content-free* input ("N/A") in place of the query's content.

For every supported conflict family ``F`` this module registers ``F_cf`` (kind
``calibration``): the same items as ``F`` (same evaluation seeds, demonstrations, format,
candidates and random draws), except that each query's content (the statement, review,
expression, word, equation, code or question) is replaced by :data:`CONTENT_FREE`. Its
``mean_margin`` is the family's chance reference per variant, and

    calibrated margin = margin(F) - margin(F_cf)

(per checkpoint and variant, a difference of means over the same items) says how far the
query's content moves the model beyond that prior: about 0 for a model that ignores the
query (a random-init model), whatever its raw margin. ``probeselect score --calibrate`` adds
the ``_cf`` family of every supported family that is scored; :func:`calibrated_margins`
builds the raw-vs-calibrated table the report shows.

Supported: the real families whose query has a content slot (``real_truthy``,
``real_flipped``, ``real_successive``, ``real_repetitive``, ``real_intuitive``) and
``arith_pattern`` (its expression; "N/A =" / "Q: What is N/A? A:" / "N/A is").
``real_persona`` is generative multi-hop QA whose answer cue repeats the question's
content, so it has no content-free form here.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from ..items import ProbeItem
from ._registry import get_family, is_builtin_family, register_family
from ._spec import FamilySpec

CONTENT_FREE = "N/A"
SUFFIX = "_cf"
#: Families with a content-free companion ``<family>_cf``.
CALIBRATED = ("real_truthy", "real_flipped", "real_successive", "real_repetitive", "real_intuitive", "arith_pattern")


def cf_name(family: str) -> str:
    return family + SUFFIX


def base_of(family: str) -> str | None:
    """The family a ``_cf`` family calibrates (None for any other family)."""
    if family.endswith(SUFFIX) and family[: -len(SUFFIX)] in CALIBRATED:
        return family[: -len(SUFFIX)]
    return None


def _register(base: str) -> None:
    fam = get_family(base)
    name = cf_name(base)

    def generate(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
        bspec = dataclasses.replace(spec, family=base, params={**spec.params, "content_free": CONTENT_FREE})
        for it in fam.generate(bspec, seed):
            yield dataclasses.replace(it, family=name, item_id=name + it.item_id[len(base):],
                                      metadata={**it.metadata, "calibrates": it.item_id, "content_free": CONTENT_FREE})

    generate.__doc__ = f"Content-free reference for {base}: its items with each query's content replaced by {CONTENT_FREE!r}."
    register_family(name, variants=fam.variants, default_n_items=fam.default_n_items,
                    default_n_demos=fam.default_n_demos, default_params=fam.default_params, validate=fam.validate,
                    kind="calibration")(generate)


for _b in CALIBRATED:
    if not is_builtin_family(cf_name(_b)):
        _register(_b)


def calibration_specs(specs: Sequence[FamilySpec]) -> list[FamilySpec]:
    """The ``_cf`` spec of every spec in ``specs`` whose family is calibrated and whose ``_cf``
    family is not already given (same items, variants, demonstrations and params)."""
    given = {s.family for s in specs}
    return [dataclasses.replace(s, family=cf_name(s.family), path=None,
                                description=f"content-free reference for {s.family}")
            for s in specs if s.family in CALIBRATED and cf_name(s.family) not in given]


def calibrated_margins(summary: pd.DataFrame) -> pd.DataFrame:
    """Raw and calibrated mean margins per checkpoint, family and variant.

    One row per (checkpoint, family, variant) of every family that has its ``_cf`` rows in
    ``summary`` (a ``summary.csv`` table): ``mean_margin`` (raw), ``cf_mean_margin`` (the
    content-free reference), ``calibrated_mean_margin`` (their difference), ``accuracy``
    (raw) and ``cf_accuracy`` (share of content-free items on which the task answer wins:
    the accuracy a model gets from its prior alone). Empty when nothing was calibrated.
    """
    cols = ["checkpoint", "step", "family", "variant", "mean_margin", "cf_mean_margin", "calibrated_mean_margin",
            "accuracy", "cf_accuracy"]
    if "family" not in summary.columns or "mean_margin" not in summary.columns:
        return pd.DataFrame(columns=cols)
    fam = summary["family"].astype(str)
    cf = summary[fam.map(lambda f: base_of(f) is not None)].copy()
    if cf.empty:
        return pd.DataFrame(columns=cols)
    cf["base"] = cf["family"].astype(str).map(base_of)
    keep = ["checkpoint", "variant", "mean_margin"] + (["accuracy"] if "accuracy" in cf.columns else [])
    ref = cf[["base"] + keep].rename(columns={"base": "family", "mean_margin": "cf_mean_margin",
                                              "accuracy": "cf_accuracy"})
    raw_cols = ["checkpoint", "step", "family", "variant", "mean_margin"] + (
        ["accuracy"] if "accuracy" in summary.columns else [])
    raw = summary.loc[fam.isin(set(cf["base"])), raw_cols]
    out = raw.merge(ref, on=["checkpoint", "family", "variant"], how="inner")
    out["calibrated_mean_margin"] = out["mean_margin"] - out["cf_mean_margin"]
    for c in cols:
        if c not in out.columns:
            out[c] = np.nan
    return out[cols].reset_index(drop=True)
