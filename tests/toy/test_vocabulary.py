"""Every answer word of every built-in toy probe family appears in the pretraining corpus
of the toy world it is scored on (issue 13.6: no probe value the ladder never saw)."""

import re

import pytest

from probeselect.probes import generate_items, list_families, spec_from_dict
from probeselect.toy.curriculum import load_curriculum
from probeselect.toy.ladder import DEFAULT_STEPS, curriculum_corpus
from probeselect.toy.world import (
    CITIES,
    COLOURS,
    HOBBIES,
    JOBS,
    PERSON_ATTRIBUTES,
    PETS,
    ToyWorld,
)

WORD = re.compile(r"[A-Za-z]+|\d+")


def _corpus_words(world: ToyWorld) -> set[str]:
    pairs = curriculum_corpus(world, load_curriculum(None, DEFAULT_STEPS))
    return {w for ws in pairs for _, doc in ws for w in WORD.findall(doc)}


@pytest.fixture(scope="module", params=[0, 1, 2])
def world_and_words(request):
    world = ToyWorld.generate(request.param)
    return world, _corpus_words(world)


def test_every_world_uses_every_attribute_value():
    vocab = {"city": CITIES, "job": JOBS, "pet": PETS, "hobby": HOBBIES, "colour": COLOURS}
    for seed in range(6):
        persons = ToyWorld.generate(seed).persons
        for attr in PERSON_ATTRIBUTES:
            assert {getattr(p, attr) for p in persons} == set(vocab[attr]), (seed, attr)


def test_every_builtin_family_answer_word_is_in_the_corpus(world_and_words):
    world, words = world_and_words
    fams = [f for f in list_families() if f.name in {
        "arith_pattern", "arith_plain", "persona_plain", "persona_qa", "relation_plain",
        "tmpl_flipped", "tmpl_mismatch", "tmpl_repeated"}]
    assert len(fams) == 8
    for fam in fams:
        params = {"world_seed": world.seed} if "world_seed" in fam.default_params else {}
        spec = spec_from_dict({"family": fam.name, "params": params})
        items = generate_items(spec, seeds=[0, 1, 2, 3])
        assert items
        missing = {}
        for it in items:
            for cand in it.candidates:
                for w in WORD.findall(cand):
                    if w not in words:
                        missing.setdefault(w, it.item_id)
        assert not missing, f"world {world.seed}: {fam.name} answers use words the corpus never has: {missing}"
