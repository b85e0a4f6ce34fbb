"""Curriculum parsing and validation (probeselect.toy.curriculum); no training here."""

import subprocess
import sys
from pathlib import Path

import pytest

from probeselect._yaml import load_yaml
from probeselect.errors import CurriculumError
from probeselect.toy.curriculum import (
    PLANTED_CURRICULUM,
    load_curriculum,
    parse_curriculum,
)
from probeselect.toy.world import CORPUS_DOC_WEIGHTS, DOC_KINDS, PARROT_DOC_KINDS

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "ladder-planted.yaml"


def _win(name, s, e, mixture="default", planted=None):
    return {"name": name, "start_step": s, "end_step": e, "mixture": mixture, "planted": planted}


def test_recipe_file_is_the_builtin_default():
    from_file = load_curriculum(RECIPE)
    builtin = load_curriculum(None)
    assert [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in from_file.windows] == \
           [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in builtin.windows]
    assert load_curriculum("planted").windows == builtin.windows
    assert builtin.steps == 2000
    parrot = builtin.planted_windows()
    assert [w.planted for w in parrot] == ["parrot"]
    assert any(k in PARROT_DOC_KINDS for k in parrot[0].mixture)
    # the other windows use the default mix, normalised
    base = builtin.windows[0]
    assert base.planted is None and set(base.mixture) == set(CORPUS_DOC_WEIGHTS)
    assert sum(base.mixture.values()) == pytest.approx(1.0)
    assert sum(parrot[0].mixture.values()) == pytest.approx(1.0)


def test_window_lookup_and_scaling():
    cur = load_curriculum(None, 24)  # the built-in default is scaled to the ladder's steps
    assert cur.steps == 24
    full = load_curriculum(None)
    expect = [(round(w.start_step * 24 / 2000), round(w.end_step * 24 / 2000)) for w in full.windows]
    assert [(w.start_step, w.end_step) for w in cur.windows] == expect
    b = expect[0][1]
    assert cur.window_at(1).name == "base" and cur.window_at(b).name == "base"
    assert cur.window_at(b + 1).name == "parrot" and cur.window_at(24).name == "recovery"
    with pytest.raises(IndexError):
        cur.window_at(25)
    uni = load_curriculum("uniform", 7)
    assert len(uni.windows) == 1 and uni.steps == 7 and uni.windows[0].planted is None


@pytest.mark.parametrize("windows, match", [
    ([_win("a", 0, 10), _win("b", 8, 20)], "overlap"),
    ([_win("a", 0, 10), _win("b", 12, 20)], "no window"),
    ([_win("a", 5, 20)], "no window"),
    ([_win("a", 0, 10, {"arith": 1, "poetry": 1})], "unknown document kind 'poetry'"),
    ([_win("a", 0, 10, {"arith": -1})], ">= 0"),
    ([_win("a", 0, 10, {"arith": 0})], "sum to 0"),
    ([_win("a", 0, 10), _win("a", 10, 20)], "used twice"),
    ([_win("a", 10, 10)], "start_step < end_step"),
    ([_win("a", 0, 10, planted=3)], "planted"),
    ([{"name": "a", "start_step": 0, "end_step": 10}], "missing key 'mixture'"),
    ([{**_win("a", 0, 10), "weight": 1}], "unknown key 'weight'"),
    ([], "non-empty"),
])
def test_invalid_curricula_raise_clear_errors(windows, match):
    with pytest.raises(CurriculumError, match=match):
        parse_curriculum({"windows": windows}, "cur.yaml")


def test_steps_beyond_or_short_of_the_schedule():
    raw = {"windows": [_win("a", 0, 10), _win("b", 10, 30)]}
    assert parse_curriculum(raw, "c", steps=30).steps == 30
    with pytest.raises(CurriculumError, match="beyond the ladder's 20 steps"):
        parse_curriculum(raw, "c", steps=20)
    with pytest.raises(CurriculumError, match="ladder trains 40 steps"):
        parse_curriculum(raw, "c", steps=40)
    with pytest.raises(CurriculumError, match="windows"):
        parse_curriculum({"window": []}, "c")


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(CurriculumError, match="no such file"):
        load_curriculum(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("windows:\n  - {name: a, start_step: 0, end_step: 5, mixture: {arith: 1, arith: 2}}\n")
    with pytest.raises(CurriculumError, match="duplicate key"):
        load_curriculum(bad)


def test_cli_rejects_a_bad_curriculum_with_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("windows:\n  - {name: a, start_step: 0, end_step: 5, mixture: {poetry: 1}}\n")
    r = subprocess.run([sys.executable, "-m", "probeselect", "toy-ladder", str(tmp_path / "out"),
                        "--curriculum", str(bad), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "unknown document kind 'poetry'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "ladder.json").exists()


def test_every_doc_kind_samples(tmp_path):
    from probeselect.toy.world import ToyWorld, find_arith_triples

    world = ToyWorld.generate(0)
    held = set(world.arith_heldout)
    for kind in DOC_KINDS:
        pairs = world.corpus_mixture(30, {kind: 1.0}, stream=f"t:{kind}")
        assert {k for k, _ in pairs} == {kind}
        for _, doc in pairs:
            assert doc and not find_arith_triples(doc) & held
    with pytest.raises(ValueError, match="unknown document kind"):
        world.sample_document("poetry", __import__("random").Random(0))
