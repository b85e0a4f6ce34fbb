"""Capability twins of the real-LM conflict families: the same skill without the tempting pattern.

A low conflict margin can mean "prefers the shortcut" or "cannot do the task"; each
``real_<x>_plain`` family (kind ``capability``) asks the skill of ``real_<x>`` in the same
tasks, formats and variants, with correct demonstrations and nothing misleading, so the two
can be told apart (as ``arith_plain`` does for ``arith_pattern``). Candidates are those of
the conflict item; the conflict's shortcut becomes the **foil** (``shortcut_answer``), so the
margin is against that near miss and the headline metric is ``candidate_accuracy``.

* ``real_flipped_plain``: the demonstrations show the texts' *true* labels (no flip).
* ``real_successive_plain``: each demonstration set's problems in a random order, so the
  demonstration answers do not count 1, 2, 3 / a, b, c (the next-in-sequence answer stays a
  foil). A demonstration may show the query's answer (the sets are fixed per seed).
* ``real_repetitive_plain``: demonstrations of the same kind whose answers vary and are never
  the query's answer or the repeated answer R (letter counts: the two other values).
* ``real_truthy_plain``: plain statements that sound as true or false as they are (10 per
  label, never shown in any truthy prompt) after demonstrations balanced between True and
  False; ``common_misconception.*`` asks false ones, ``surprising_truth.*`` true ones, so each
  variant keeps its conflict twin's correct label.
* ``real_intuitive_plain``: the same CRT numbers, objects and answers asked without the trap
  ("The bat costs 105 cents." instead of "100 cents more than the ball"; "each of 100
  machines makes one widget in 5 minutes"; "it covered half one day before"; "m of them
  stayed"); the intuitive answer stays a foil.

* ``real_persona_plain``: the same two-hop questions over the same fact pool without the
  persona's own fact of the asked relation (no "I live in ..." before "In which town does your
  sister live?"), so the one-hop answer is not in context; it stays a foil.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from ..items import ProbeItem
from ._registry import get_family, is_builtin_family, register_family
from ._spec import FamilySpec

PLAIN = {"real_flipped": "real_flipped_plain", "real_successive": "real_successive_plain",
         "real_repetitive": "real_repetitive_plain", "real_truthy": "real_truthy_plain",
         "real_intuitive": "real_intuitive_plain", "real_persona": "real_persona_plain"}
FOIL_KIND = {"real_flipped": "flipped_label", "real_successive": "next_in_sequence",
             "real_repetitive": "repeated_answer", "real_truthy": "other_label", "real_intuitive": "intuitive_answer",
             "real_persona": "own_fact_not_in_context"}
DEFAULT_N_ITEMS = {"real_truthy": 10}


def _register(base: str, name: str) -> None:
    fam = get_family(base)

    def generate(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
        bspec = dataclasses.replace(spec, family=base, params={**spec.params, "plain": True})
        for it in fam.generate(bspec, seed):
            meta = {**it.metadata, "kind": "capability", "foil_kind": FOIL_KIND[base]}
            yield dataclasses.replace(it, family=name, item_id=name + it.item_id[len(base):], metadata=meta)

    generate.__doc__ = f"Capability twin of {base}: the same tasks and formats without the tempting pattern."
    register_family(name, variants=fam.variants, default_n_items=DEFAULT_N_ITEMS.get(base, fam.default_n_items),
                    default_n_demos=fam.default_n_demos, default_params=fam.default_params, validate=fam.validate,
                    kind="capability")(generate)


for _b, _n in PLAIN.items():
    if not is_builtin_family(_n):
        _register(_b, _n)
