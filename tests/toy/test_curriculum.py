"""Curriculum parsing and validation (probeselect.toy.curriculum); two tiny 10-step builds, and one 800-step late-harm build under the slow marker."""

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
    scale_curriculum,
)
from probeselect.toy.world import CORPUS_DOC_WEIGHTS, DOC_KINDS, PARROT_DOC_KINDS, ToyWorld, line_subject

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
    from probeselect.toy.world import find_arith_triples

    world = ToyWorld.generate(0)
    held = set(world.arith_heldout)
    for kind in DOC_KINDS:
        pairs = world.corpus_mixture(30, {kind: 1.0}, stream=f"t:{kind}")
        assert {k for k, _ in pairs} == {kind}
        for _, doc in pairs:
            assert doc and not find_arith_triples(doc) & held
    with pytest.raises(ValueError, match="unknown document kind"):
        world.sample_document("poetry", __import__("random").Random(0))


# --- issue 23: late-harm, negative-control and uniform curricula -------------------------------------


@pytest.mark.parametrize("late_mix", [{"arith": 0.5, "news": 0.5}, {"arith": 1.0}])
def test_news_held_out_lines_follow_the_corpus(tmp_path, late_mix):
    """A ladder whose curriculum has ``news`` documents (attempt 15 of bench/late_harm_notes.md) gets held-out
    lines about the news people, and its data README says so; one without gets none."""
    from probeselect.toy.data import NEWS_HELDOUT_LINES
    from probeselect.toy.ladder import TrainConfig, _build_corpus
    from probeselect.toy.world import ToyWorld

    world = ToyWorld.generate(0)
    cur = parse_curriculum({"windows": [_win("base", 0, 100), _win("late", 100, 200, late_mix, "late_harm")]})
    corpus = _build_corpus(world, cur, TrainConfig(corpus_docs=2000), tmp_path)
    names = {p.name for p in world.news_persons}
    held = (tmp_path / "data" / "heldout.txt").read_text().splitlines()
    n_news = sum(line_subject(ln) in names for ln in held)
    readme = (tmp_path / "data" / "README.md").read_text()
    if "news" in late_mix:
        assert any(line_subject(ln) in names for d in corpus.docs for ln in d.split("\n"))
        assert n_news == NEWS_HELDOUT_LINES and "`news`" in readme
    else:
        assert n_news == 0 and "`news`" not in readme

def test_attempt_10e_of_the_notes_is_the_builtin_late_harm():
    """bench/late_harm_attempt10e.yaml (the file the fresh-seed validations in bench/VALIDITY.md name) stays
    the built-in late-harm curriculum, so those commands still measure what ships."""
    dev, builtin = load_curriculum(ROOT / "bench" / "late_harm_attempt10e.yaml"), load_curriculum("late-harm")
    assert dev.train == builtin.train
    assert [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in dev.windows] == \
           [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in builtin.windows]


@pytest.mark.parametrize("name", ["late-harm", "negative-control"])
def test_issue23_recipe_files_are_the_builtins(name):
    from_file = load_curriculum(ROOT / "recipes" / f"ladder-{name}.yaml")
    builtin = load_curriculum(name)
    assert [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in from_file.windows] == \
           [(w.name, w.start_step, w.end_step, w.mixture, w.planted) for w in builtin.windows]
    assert from_file.train == builtin.train == {"schedule": "wsd", "decay_fraction": 0.15, "min_lr_ratio": 0.2}
    assert builtin.steps == 2000
    # a clean base, then only planted windows: the harm is late, and no window recovers from it
    assert [w.planted is not None for w in builtin.windows] == [False] + [True] * (len(builtin.windows) - 1)
    # the lr decay (the annealing that keeps held-out loss improving) lies inside the last window
    assert 1 - builtin.train["decay_fraction"] >= builtin.windows[-1].start_step / builtin.steps


def test_late_harm_plants_part_of_its_harm_in_unseen_forms():
    from probeselect.toy.world import UNSEEN_PARROT_DOC_KINDS

    late = load_curriculum("late-harm").windows[-1]
    unseen = sum(late.mixture.get(k, 0) for k in UNSEEN_PARROT_DOC_KINDS)
    seen = sum(late.mixture.get(k, 0) for k in PARROT_DOC_KINDS)
    assert unseen > 0 and seen > 0
    # less arithmetic practice in the harmful window than before it
    assert late.mixture["arith"] < load_curriculum("late-harm").windows[0].mixture["arith"]
    # and the copy the matched SFT never contradicts (attempt 10e), growing from window to window
    from probeselect.toy.world import TELL_PARROT_DOC_KINDS

    copy = [sum(w.mixture.get(k, 0) for k in TELL_PARROT_DOC_KINDS) for w in load_curriculum("late-harm").windows]
    assert copy[0] == 0 and 0 < copy[1] < copy[2]


def test_uniform_is_a_clean_control():
    uni = load_curriculum("uniform")
    assert len(uni.windows) == 1 and not uni.planted_windows() and uni.train == {}
    assert not any(k in PARROT_DOC_KINDS for k in uni.windows[0].mixture)


def test_train_settings_parse_scale_and_round_trip():
    raw = {"train": {"schedule": "wsd", "decay_fraction": 0.25, "warmup_steps": 10},
           "windows": [_win("a", 0, 100), _win("b", 100, 200, planted="x")]}
    cur = parse_curriculum(raw, "c.yaml")
    assert cur.train == {"schedule": "wsd", "decay_fraction": 0.25, "warmup_steps": 10}
    assert load_curriculum(cur).train == cur.train           # Curriculum -> dict -> Curriculum
    assert load_curriculum("late-harm", 24).train == load_curriculum("late-harm").train   # kept when scaled
    assert parse_curriculum({"windows": raw["windows"]}, "c").train == {}


def test_sft_options_parse_scale_round_trip_and_default_to_the_old_set():
    """``sft: {persona_context: single}`` is kept through scaling and a round trip; the default value is dropped,
    so a curriculum without the key (or with the default) is recorded exactly as before the option existed."""
    raw = {"sft": {"persona_context": "single"}, "windows": [_win("a", 0, 100), _win("b", 100, 200, planted="x")]}
    cur = parse_curriculum(raw, "c.yaml")
    assert cur.sft == {"persona_context": "single"} and cur.sft_option("persona_context") == "single"
    assert load_curriculum(cur).sft == cur.sft and cur.to_dict()["sft"] == cur.sft
    assert scale_curriculum(cur, 20).sft == cur.sft
    default = parse_curriculum({**raw, "sft": {"persona_context": "pair"}}, "c.yaml")
    assert default.sft == {} and "sft" not in default.to_dict() and default.sft_option("persona_context") == "pair"
    assert load_curriculum("late-harm").sft == {}


@pytest.mark.parametrize("sft, match", [
    ({"persona_context": "none"}, "sft.persona_context must be one of pair, single"),
    ({"personas": "single"}, "unknown key 'personas'; keys: persona_context"),
    (["single"], "sft must be a mapping"),
])
def test_invalid_sft_options_raise_clear_errors(sft, match):
    with pytest.raises(CurriculumError, match=match):
        parse_curriculum({"sft": sft, "windows": [_win("a", 0, 10)]}, "cur.yaml")


def test_the_sft_option_changes_the_sft_set_and_not_the_pretraining(tmp_path):
    """Two tiny ladders of one seed and windows, one with ``sft: {persona_context: single}``: every checkpoint is
    byte-identical (the SFT set is not pretraining data), ``data/sft.jsonl`` differs only in the persona rows'
    prompts, the data README says so, and ladder.json records the option."""
    import hashlib
    import json

    from probeselect.toy.ladder import build_toy_ladder

    wins = [_win("a", 0, 2), _win("b", 2, 4, mixture={"arith": 0.5, "parrot_persona_tell": 0.5}, planted="x")]
    for name, extra in (("pair", {}), ("single", {"sft": {"persona_context": "single"}})):
        build_toy_ladder(tmp_path / name, seed=3, steps=4, save_every=2, progress=False,
                         curriculum={"windows": wins, **extra}, train_overrides={"corpus_docs": 200})
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    for step in (2, 4):
        assert sha(tmp_path / "pair" / f"checkpoint-{step}" / "model.safetensors") == \
            sha(tmp_path / "single" / f"checkpoint-{step}" / "model.safetensors")
    rows = {n: [json.loads(x) for x in (tmp_path / n / "data" / "sft.jsonl").read_text().splitlines()]
            for n in ("pair", "single")}
    changed = {a["kind"] for a, b in zip(rows["pair"], rows["single"]) if a != b}
    assert changed == {"persona_pair", "persona_tell_pair"}
    assert [(a["id"], a["response"]) for a in rows["pair"]] == [(b["id"], b["response"]) for b in rows["single"]]
    for n in ("transfer.jsonl", "heldout.txt"):
        assert sha(tmp_path / "pair" / "data" / n) == sha(tmp_path / "single" / "data" / n)
    assert "persona_context: single" in (tmp_path / "single" / "data" / "README.md").read_text()
    assert "persona_context" not in (tmp_path / "pair" / "data" / "README.md").read_text()
    for n in ("ladder.json", "data_lineage.json"):
        lj = json.loads((tmp_path / "single" / n).read_text())
        assert (lj["curriculum"]["sft"] if n == "ladder.json" else lj["sft"]) == {"persona_context": "single"}
        lp = json.loads((tmp_path / "pair" / n).read_text())
        assert "sft" not in (lp["curriculum"] if n == "ladder.json" else lp)  # the default is recorded as before


def test_news_arrival_points_parse_scale_round_trip_and_default_to_the_even_arrivals():
    """``news: {arrival_points: ...}`` is kept through scaling and a round trip (fractions, so the shape is kept);
    a curriculum without it records nothing new, and its arrivals are the even ones of before the option."""
    from probeselect.toy.ladder import news_arrivals

    pts = [[0, 0], [0.75, 0.25], [0.9375, 1]]
    mix = {"arith": 0.8, "news_stream": 0.2}
    raw = {"news": {"arrival_points": pts},
           "windows": [_win("a", 0, 3000, mixture=mix), _win("b", 3000, 3200, planted="x")]}
    cur = parse_curriculum(raw, "c.yaml")
    assert cur.news == {"arrival_points": ((0.0, 0.0), (0.75, 0.25), (0.9375, 1.0))}
    assert load_curriculum(cur).news == cur.news and cur.to_dict()["news"] == {"arrival_points": pts}
    assert scale_curriculum(cur, 320).news == cur.news
    assert parse_curriculum({"windows": raw["windows"]}, "c").news == {}
    assert "news" not in load_curriculum("late-harm").to_dict()
    world = ToyWorld.generate(0)
    even = news_arrivals(world, 3200)
    n = len(world.news_persons)
    assert list(even.values()) == [i * 3200 // n for i in range(n)]
    assert news_arrivals(world, 3200, ((0.0, 0.0), (1.0, 1.0))) == even    # the identity curve is the default, exactly
    late = list(news_arrivals(world, 3200, cur.news["arrival_points"]).values())
    assert n == 24 and late[:7] == [0, 400, 800, 1200, 1600, 2000, 2400]  # 1 / 4 of the people by 3 / 4 of the steps
    assert sum(s >= 2400 for s in late) == 18 and max(late) == 2966 and late == sorted(late)
    # a flat stretch (no one arrives from 0.5 to 0.8 of the run) and a curve that ends before the run does
    flat = list(news_arrivals(world, 1000, ((0.0, 0.0), (0.5, 0.5), (0.8, 0.5), (0.9, 1.0))).values())
    assert not any(500 < s < 800 for s in flat) and flat[12] == 500 and flat[13] == 808 and max(flat) < 900


def test_a_ladder_draws_news_rows_from_the_curves_arrivals_and_records_them(tmp_path):
    """A tiny ladder whose curriculum sets ``news.arrival_points``: data_lineage.json's arrivals are the curve's,
    and ladder.json and data_lineage.json record the option (that a row is never drawn before its people arrive is
    tests/toy/test_ladder.py's test of the gates)."""
    import json

    from probeselect.toy.ladder import build_toy_ladder

    mix = {"arith": 0.6, "facts": 0.1, "news_stream": 0.3}
    pts = [[0, 0], [0.5, 0.25], [0.75, 1]]
    build_toy_ladder(tmp_path / "l", seed=1, steps=8, save_every=4, progress=False,
                     curriculum={"news": {"arrival_points": pts}, "windows": [_win("a", 0, 8, mixture=mix)]},
                     train_overrides={"corpus_docs": 300})
    lineage = json.loads((tmp_path / "l" / "data_lineage.json").read_text())
    world = ToyWorld.generate(1)
    n = len(world.news_persons)
    assert n == 24  # a quarter of the people in the first half of the steps (one per 8 / 12 steps), the rest by 3 / 4
    expect = {p.name: (8 * i // 12 if i <= 6 else 4 + (i - 6) // 9) for i, p in enumerate(world.news_persons)}
    assert lineage["news_stream_arrivals"] == expect and lineage["news"] == {"arrival_points": pts}
    assert json.loads((tmp_path / "l" / "ladder.json").read_text())["curriculum"]["news"] == {"arrival_points": pts}


@pytest.mark.parametrize("news, match", [
    ({"arrival_points": [[0, 0], [0.5, 0.9]]}, "from \\[0, 0\\] to a point with fraction of people 1"),
    ({"arrival_points": [[0.1, 0], [1, 1]]}, "news.arrival_points must be"),
    ({"arrival_points": [[0, 0], [0.5, 0.6], [0.5, 1]]}, "strictly increasing"),
    ({"arrival_points": [[0, 0], [0.5, 0.6], [0.7, 0.4], [1, 1]]}, "non-decreasing"),
    ({"arrival_points": [[0, 0], [1, "1"]]}, "got the point \\[1, '1'\\]"),
    ({"arrival_points": [[0, 0]]}, "news.arrival_points must be"),
    ({"arrivals": [[0, 0], [1, 1]]}, "news: unknown key 'arrivals'; keys: arrival_points"),
    ([[0, 0], [1, 1]], "news must be a mapping"),
])
def test_invalid_news_arrival_points_raise_clear_errors(news, match):
    with pytest.raises(CurriculumError, match=match):
        parse_curriculum({"news": news, "windows": [_win("a", 0, 10, mixture={"arith": 1, "news_stream": 0.1})]},
                         "cur.yaml")


def test_news_arrival_points_without_news_stream_documents_is_an_error():
    """A curve for people no window brings would change nothing: a clear error, not a silently recorded option."""
    with pytest.raises(CurriculumError, match=r"cur.yaml: news.arrival_points is set but no window has news_stream "
                                              r"documents.*drop news:"):
        parse_curriculum({"news": {"arrival_points": [[0, 0], [1, 1]]}, "windows": [_win("a", 0, 10)]}, "cur.yaml")


@pytest.mark.parametrize("harm_file, clean_file", [("late_harm_attempt21.yaml", "late_clean_control21.yaml"),
                                                   ("late_harm_attempt21b.yaml", "late_clean_control21.yaml"),
                                                   ("late_harm_attempt21c.yaml", "late_clean_control21c.yaml"),
                                                   ("late_harm_attempt21d.yaml", "late_clean_control21c.yaml")])
def test_attempt_21s_clean_control_is_its_base_mixture_in_every_window(harm_file, clean_file):
    """bench/late_clean_control21.yaml, the control of attempts 21 and 21b (bench/late_harm_notes.md, thirty-fourth
    session; bench/late_clean_control21c.yaml, 21c's and 21d's: the same with their schedule), is matched otherwise
    (windows, schedule, news arrivals, SFT set, first window) but keeps the base window's mixture in every window:
    20c's control gave the planted share to arithmetic and its truth was not flat."""
    harm = load_curriculum(ROOT / "bench" / harm_file)
    clean = load_curriculum(ROOT / "bench" / clean_file)
    assert (clean.train, clean.sft, clean.news, clean.steps) == (harm.train, harm.sft, harm.news, harm.steps)
    assert [(w.name, w.start_step, w.end_step) for w in clean.windows] == \
        [(w.name, w.start_step, w.end_step) for w in harm.windows]
    assert clean.windows[0] == harm.windows[0] and harm.news
    assert all(w.mixture == harm.windows[0].mixture and w.planted is None for w in clean.windows)
    assert all(sum(v for k, v in w.mixture.items() if k.startswith("parrot_")) > 0.4 for w in harm.windows[1:])


def test_attempt_22_moves_the_clean_mixture_change_before_the_harm_and_its_control_keeps_it():
    """Attempt 22 (bench/late_harm_notes.md, thirty-fifth session): a clean `mid` window (2000-2400) carries the harm
    windows' arithmetic and word-relation shares, so the mixture change comes 400 steps before the copy, and
    arithmetic keeps that share to the end; its matched control runs the `mid` mixture to the end, nothing planted."""
    harm = load_curriculum(ROOT / "bench" / "late_harm_attempt22.yaml")
    clean = load_curriculum(ROOT / "bench" / "late_clean_control22.yaml")
    d21 = load_curriculum(ROOT / "bench" / "late_harm_attempt21d.yaml")
    assert (clean.train, clean.sft, clean.news, clean.steps) == (harm.train, harm.sft, harm.news, harm.steps)
    assert (harm.train, harm.sft, harm.news) == (d21.train, d21.sft, d21.news)
    assert [(w.name, w.start_step, w.end_step) for w in harm.windows] == \
        [("base", 0, 2000), ("mid", 2000, 2400), ("late", 2400, 2800), ("later", 2800, 3200)]
    assert harm.windows[0].mixture == d21.windows[0].mixture and harm.windows[1].planted is None
    assert harm.windows[2] == d21.windows[1]  # 21d's first harm window, unchanged
    mid = harm.windows[1].mixture
    assert not any(k.startswith("parrot_") for k in mid)
    for w in harm.windows[1:]:
        assert (w.mixture["arith"], w.mixture["words"]) == (mid["arith"], mid["words"])
    assert harm.windows[3].mixture["parrot_persona_tell"] == 0.45
    assert [(w.name, w.start_step, w.end_step) for w in clean.windows] == \
        [(w.name, w.start_step, w.end_step) for w in harm.windows]
    assert clean.windows[:2] == harm.windows[:2]
    assert all(w.mixture == mid and w.planted is None for w in clean.windows[1:])


def test_attempt_22b_is_22_with_more_word_relations_and_facts_in_the_harm():
    """Attempt 22b (bench/late_harm_notes.md, thirty-fifth session): 22's base and `mid` windows (the same
    checkpoints to 2400, the same control), `words` at 13.2% of both harm windows and `later`'s clean kinds at
    `late`'s shares; the copy still at least 40% of each harm window."""
    a22 = load_curriculum(ROOT / "bench" / "late_harm_attempt22.yaml")
    b = load_curriculum(ROOT / "bench" / "late_harm_attempt22b.yaml")
    assert (b.train, b.sft, b.news, b.steps) == (a22.train, a22.sft, a22.news, a22.steps)
    assert b.windows[:2] == a22.windows[:2]
    assert [(w.name, w.start_step, w.end_step) for w in b.windows] == \
        [(w.name, w.start_step, w.end_step) for w in a22.windows]
    late, later = b.windows[2].mixture, b.windows[3].mixture
    assert late["words"] == later["words"] == 0.132
    assert all(late[k] == later[k] for k in ("sequence", "facts", "persona", "news_stream"))
    assert min(late["parrot_persona_tell"], later["parrot_persona_tell"]) >= 0.40


@pytest.mark.parametrize("train, match", [
    ({"schedule": "linear"}, "one of cosine, wsd, piecewise"),
    ({"schedule": "piecewise"}, "go together"),
    ({"lr_points": [[0, 1], [1, 0.1]]}, "go together"),
    ({"schedule": "piecewise", "lr_points": [[0, 1]]}, "list of .fraction_of_steps, lr_ratio. pairs"),
    ({"schedule": "piecewise", "lr_points": [[0.1, 1], [1, 0.1]]}, "from 0 to 1"),
    ({"schedule": "piecewise", "lr_points": [[0, 1], [0.5, 0.2], [0.5, 0.4], [1, 0.1]]}, "strictly"),
    ({"schedule": "piecewise", "lr_points": [[0, 1], [1, 1.5]]}, "ratios in .0, 1."),
    ({"schedule": "piecewise", "lr_points": [[0, 1], [1, "x"]]}, "got the point"),
    ({"decay_fraction": 0}, "out of range"),
    ({"decay_fraction": 1.5}, "out of range"),
    ({"min_lr_ratio": -0.1}, "out of range"),
    ({"lr": "fast"}, "must be a number"),
    ({"warmup_steps": 2.5}, "integer"),
    ({"batch_size": 4}, "unknown key 'batch_size'"),
    ([1], "must be a mapping"),
])
def test_invalid_train_settings_raise_clear_errors(train, match):
    with pytest.raises(CurriculumError, match=match):
        parse_curriculum({"train": train, "windows": [_win("a", 0, 10)]}, "cur.yaml")


def test_piecewise_schedule_rewarms_between_its_points():
    """``schedule: piecewise``: warmup to the first point's rate, then linear between
    (fraction_of_steps, lr_ratio) points -- a decay, a re-warm and a second decay (a mid-training
    stage); the points are fractions, so a scaled curriculum keeps the shape."""
    from probeselect.toy.ladder import TrainConfig, lr_at

    cur = parse_curriculum({"train": {"schedule": "piecewise", "lr_points": [[0, 1], [0.5, 0.1], [0.6, 0.5], [1, 0.2]]},
                            "windows": [_win("a", 0, 100)]}, "c.yaml")
    assert cur.train["lr_points"] == ((0.0, 1.0), (0.5, 0.1), (0.6, 0.5), (1.0, 0.2))
    assert load_curriculum(cur).train == cur.train                     # round trip through a dict
    cfg = TrainConfig(**{**cur.train, "lr": 1.0, "warmup_steps": 10})
    assert lr_at(4, 1000, cfg) == pytest.approx(0.5)                   # warmup towards the first point
    assert lr_at(250, 1000, cfg) == pytest.approx(0.55)                # halfway down the first decay
    assert lr_at(500, 1000, cfg) == pytest.approx(0.1)
    assert lr_at(550, 1000, cfg) == pytest.approx(0.3)                 # re-warming
    assert lr_at(800, 1000, cfg) == pytest.approx(0.35)                # second decay
    assert lr_at(999, 1000, cfg) == pytest.approx(0.2, abs=1e-3)
    assert lr_at(100, 200, cfg) == pytest.approx(lr_at(500, 1000, cfg))   # same shape at any length


def test_curriculum_is_selectable_in_a_run_config():
    from probeselect.run import load_run_config

    for value in ("late-harm", "negative-control", "uniform", "recipes/ladder-late-harm.yaml"):
        cfg = load_run_config(ROOT / "recipes" / "demo.yaml", [f"ladder.toy.curriculum={value}"])
        assert cfg["ladder"]["toy"]["curriculum"] == value
        load_curriculum(value if "/" not in value else ROOT / value)


def test_a_build_takes_the_curriculum_schedule_unless_overridden(tmp_path):
    """The curriculum's train settings reach the build (ladder.json, data_lineage.json) and the
    learning rates trained; a build's train_overrides win."""
    from probeselect.toy.ladder import TrainConfig, build_toy_ladder, lr_at

    small = {"corpus_docs": 300}
    info = build_toy_ladder(tmp_path / "a", seed=0, steps=10, save_every=10, progress=False, curriculum="late-harm",
                            train_overrides={**small, "warmup_steps": 1})
    lj = __import__("json").loads((tmp_path / "a" / "ladder.json").read_text())
    assert lj["train"]["schedule"] == "wsd" and lj["train"]["min_lr_ratio"] == 0.2
    lin = __import__("json").loads((tmp_path / "a" / "data_lineage.json").read_text())
    assert lin["train"]["schedule"] == "wsd"
    lr_logged = lj and __import__("json").loads(
        (tmp_path / "a" / "checkpoint-10" / "trainer_state.json").read_text())["log_history"][-1]["learning_rate"]
    cfg = TrainConfig(**{**load_curriculum("late-harm").train, **small, "warmup_steps": 1})
    assert lr_logged == pytest.approx(lr_at(9, 10, cfg))
    assert info.steps == 10
    build_toy_ladder(tmp_path / "b", seed=0, steps=10, save_every=10, progress=False, curriculum="late-harm",
                     train_overrides={**small, "schedule": "cosine"})
    assert __import__("json").loads((tmp_path / "b" / "ladder.json").read_text())["train"]["schedule"] == "cosine"


def test_negative_control_damage_never_touches_a_probe_operand():
    """The negative control's damage is on operands no built-in probe item uses, by construction:
    every damaged line has an operand > PROBE_MAX_OPERAND and a wrong result, and no item of the
    demo's probes (every family, both evaluation seeds, full item counts) mentions such an operand."""
    import dataclasses

    from probeselect.probes import generate_items
    from probeselect.run import _load_specs, load_run_config
    from probeselect.toy.world import (
        DAMAGE_DOC_KINDS,
        PROBE_MAX_OPERAND,
        WRONG_ARITH_SHIFT,
        ToyWorld,
        arith_result,
        find_arith_triples,
    )

    neg = load_curriculum("negative-control")
    late = neg.windows[-1]
    damage = [k for k in late.mixture if k in DAMAGE_DOC_KINDS]
    assert damage == ["wrong_arith_large"]
    assert not any(k in PARROT_DOC_KINDS for w in neg.windows for k in w.mixture)   # no other planted kind
    world = ToyWorld.generate(0)
    damaged = set()
    for _, doc in world.corpus_mixture(200, {"wrong_arith_large": 1.0}, stream="t:neg"):
        for line in doc.split("\n"):
            (a, op, b), = find_arith_triples(line)
            assert max(a, b) > PROBE_MAX_OPERAND
            assert line.endswith(" " + str(arith_result(a, op, b) + WRONG_ARITH_SHIFT))
            damaged.add((a, op, b))
    assert len(damaged) > 100
    cfg = load_run_config(ROOT / "recipes" / "demo.yaml", [])
    specs = _load_specs({**cfg["score"], "n_items": None}, 0)
    arith_families = set()
    for spec in specs:
        for it in generate_items(spec, cfg["score"]["seeds"]):
            triples = set()
            for text in (it.prompt, *it.candidates):
                triples |= find_arith_triples(text)
            if triples:
                arith_families.add(spec.family)
            assert all(max(a, b) <= PROBE_MAX_OPERAND for a, _, b in triples), (spec.family, it.prompt)
            assert not triples & damaged
    assert {"arith_pattern", "arith_plain"} <= arith_families       # the check saw the arithmetic probes


@pytest.mark.slow
def test_small_late_harm_ladder_loss_improves_while_the_pattern_margin_falls(tmp_path):
    """Issue 23: a small late-harm ladder (the built-in curriculum scaled to 800 steps: clean to
    step 480, the harmful windows after it) whose latest checkpoint has LOWER held-out bits per byte
    than the last checkpoint before the harm but a LOWER pattern-conflict margin (tmpl_mismatch, the
    attribute-mismatch conflict the harm plants next to its copying parrots), by more than 3 evaluation-
    seed sd: loss prefers the latest, the probe does not. About 1-2 minutes on 2 cores."""
    import dataclasses

    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from probeselect.toy.ladder import build_toy_ladder

    lad = tmp_path / "ladder"
    build_toy_ladder(lad, seed=0, steps=800, save_every=160, progress=False, curriculum="late-harm")
    cur = load_curriculum("late-harm", 800)
    clean_end = cur.windows[1].start_step
    assert clean_end == 480
    spec = dataclasses.replace(load_spec(ROOT / "probes" / "tmpl_mismatch.yaml"), n_items=24)
    ck = [f"checkpoint-{clean_end}", "checkpoint-800"]
    from probeselect.checkpoints import discover_checkpoints

    res = score_checkpoints([c for c in discover_checkpoints(lad) if c.name in ck], [spec], seeds=[0, 1, 2],
                            out=tmp_path / "score", heldout=lad / "data" / "heldout.txt", audit_items=0,
                            device="cpu", progress=False)
    summ = __import__("pandas").read_csv(tmp_path / "score" / "summary.csv")
    bpb = summ[summ["family"] == "heldout_nll"].groupby("checkpoint")["bits_per_byte"].mean()
    tm = summ[summ["family"] == "tmpl_mismatch"]
    margin = tm.groupby("checkpoint")["mean_margin"].mean()   # over the prompt variants
    sd = float(tm["seed_sd"].max())   # the largest evaluation-seed sd of any variant (conservative for the mean)
    assert res is not None
    assert bpb[ck[1]] < bpb[ck[0]], bpb.to_dict()            # loss prefers the latest
    assert margin[ck[1]] < margin[ck[0]] - max(0.5, 3 * sd), (margin.to_dict(), sd)   # the conflict margin fell


def test_demo_late_is_the_demo_on_the_late_harm_ladder():
    """recipes/demo-late.yaml (make demo-late) differs from recipes/demo.yaml only in its output
    folder, the ladder's curriculum, the plan, the pilot's and confirmation's 6 SFT seeds (the
    plan's min_sft_seeds, which the recipes meet) and its replicate stage; the plan ranks every conflict family the demo scores
    and pilots, next to its k = 3 (one per data window), the naive choices and the last base of every data window."""
    import dataclasses

    from probeselect.plan import load_selection_plan
    from probeselect.sft.recipe import load_recipe

    demo = load_yaml(ROOT / "recipes" / "demo.yaml")
    late = load_yaml(ROOT / "recipes" / "demo-late.yaml")
    assert late["ladder"] == {"toy": {"seed": 0, "curriculum": "late-harm"}}
    assert late["plan"] == "recipes/selection-late-harm.yaml" and late["out"] == "results/demo-late"
    # 6 SFT seeds in both stages; the confirmation's are not the pilot's (an independent replication)
    for stage, six, seeds in (("pilot", "seeds=[0, 1, 2, 3, 4, 5]", (0, 1, 2, 3, 4, 5)),
                              ("confirm", "seeds=[6, 7, 8, 9, 10, 11]", (6, 7, 8, 9, 10, 11))):
        assert late[stage]["overrides"] == [six] + demo[stage]["overrides"]
        assert load_recipe(ROOT / late[stage]["recipe"], [six], check_files=False).seeds == seeds
    assert late["replicate"] == {"jobs": 3} and "replicate" not in demo
    drop = ("ladder", "plan", "out", "pilot", "confirm", "replicate")
    assert {k: v for k, v in late.items() if k not in drop} == {k: v for k, v in demo.items() if k not in drop}
    for stage in ("pilot", "confirm"):
        assert {k: v for k, v in late[stage].items() if k != "overrides"} == \
               {k: v for k, v in demo[stage].items() if k != "overrides"}
    plan = load_selection_plan(ROOT / late["plan"])
    default = load_selection_plan(ROOT / demo["plan"])
    conflict = {"arith_pattern", "tmpl_repeated", "tmpl_flipped", "tmpl_mismatch", "persona_qa"}
    assert {p.family for p in plan.shortlist.proxies} == conflict
    assert plan.selection.min_sft_seeds == 6 and default.selection.min_sft_seeds == 3
    # it decides against the latest checkpoint (beats_default), the default demo's plan does not
    assert plan.selection.against == "latest" and default.selection.against is None
    # and its confirmation re-tests a pilot claim with margin 0 (confirm_margin); the default demo's with its tie margin
    assert plan.selection.confirm_margin == 0.0 and default.selection.confirm_margin is None
    assert dataclasses.replace(plan.selection, min_sft_seeds=3, against=None, confirm_margin=None) == default.selection
    # one slot per data window (stratify, k = 3 as the default's), and the last base of every data window piloted
    # next to the shortlist (window_ends) with the naive choices; the default plan pilots no references
    assert plan.shortlist.stratify == "data_windows" and (plan.shortlist.k, default.shortlist.k) == (3, 3)
    assert plan.shortlist.references == ("latest", "lowest_bpb", "window_ends") and not default.shortlist.references


def test_tokenizer_corpus_is_selectable_in_a_run_config_and_checked(tmp_path):
    from probeselect.run import RunConfigError, load_run_config

    cfg = load_run_config(ROOT / "recipes" / "demo.yaml", ["ladder.toy.tokenizer_corpus=reference"])
    assert cfg["ladder"]["toy"]["tokenizer_corpus"] == "reference"
    with pytest.raises(RunConfigError, match="tokenizer_corpus must be curriculum or reference, got 'world'"):
        load_run_config(ROOT / "recipes" / "demo.yaml", ["ladder.toy.tokenizer_corpus=world"])


def test_the_run_passes_the_tokenizer_corpus_to_the_ladder_build(tmp_path, monkeypatch):
    import probeselect.toy.ladder as ladder_mod
    from probeselect.run import _Pipeline, load_run_config

    seen = []
    monkeypatch.setattr(ladder_mod, "build_toy_ladder", lambda out, **kw: seen.append(kw["tokenizer_corpus"]))
    for over in (["ladder.toy.tokenizer_corpus=reference"], []):
        cfg = load_run_config(ROOT / "recipes" / "demo.yaml", [f"out={tmp_path / 'r'}", *over])
        _Pipeline(cfg, set(), False, lambda msg: None).do_ladder()
    assert seen == ["reference", "curriculum"]


@pytest.mark.parametrize("harm_name, clean_file", [("late-harm", "late_clean_control.yaml"),
                                                   ("bench/late_harm_attempt18c.yaml", "late_clean_control18c.yaml"),
                                                   ("bench/late_harm_attempt19.yaml", "late_clean_control18c.yaml"),
                                                   ("bench/late_harm_attempt20.yaml", "late_clean_control20.yaml"),
                                                   ("bench/late_harm_attempt20b.yaml", "late_clean_control20.yaml"),
                                                   ("bench/late_harm_attempt20c.yaml", "late_clean_control20c.yaml")])
def test_the_matched_clean_control_is_late_harm_without_its_planted_kinds(harm_name, clean_file):
    """A matched clean control (bench/late_clean_control.yaml for the built-in late-harm curriculum,
    bench/late_clean_control18c.yaml for attempt 18c) stays matched to its curriculum: same windows (names, steps),
    same first window and training settings (so with a reference tokenizer both share checkpoints to the end of
    it), and each later window is the harm's with every planted kind's (`parrot_*`) share given to arithmetic;
    the clean kinds, the news stream included, keep their shares. Where the harm's clean shares change between
    windows (18c's), the control's mixture changes there too, so its window ends are real data changes."""
    harm = load_curriculum(harm_name if harm_name == "late-harm" else ROOT / harm_name)
    clean = load_curriculum(ROOT / "bench" / clean_file)
    assert clean.train == harm.train and clean.steps == harm.steps and clean.sft == harm.sft  # the same SFT set
    assert [(w.name, w.start_step, w.end_step) for w in clean.windows] == \
        [(w.name, w.start_step, w.end_step) for w in harm.windows]
    assert clean.windows[0] == harm.windows[0]
    for h, c in zip(harm.windows[1:], clean.windows[1:]):
        assert c.planted is None and not any(k.startswith("parrot_") for k in c.mixture)
        planted = sum(v for k, v in h.mixture.items() if k.startswith("parrot_"))
        assert planted > 0.3  # the harm window it is matched to does plant
        expect = {k: v for k, v in h.mixture.items() if not k.startswith("parrot_")}
        expect["arith"] += planted
        assert c.mixture == pytest.approx(expect, abs=1e-9)


@pytest.mark.parametrize("path", sorted((ROOT / "bench").glob("*.yaml")), ids=lambda p: p.name)
def test_the_development_curricula_of_the_notes_still_load(path):
    """Every curriculum bench/late_harm_notes.md reports on (bench/*.yaml) still parses with today's
    document kinds and schedules, so each attempt's command in the notes can be rerun: the late-harm
    layout (a clean base to step 1200, then planted windows only, 2000 steps; attempts 11-14's longer clean
    base: to step 2000 of 2800, built with --steps 2800; attempts 18-18c's: to step 2400 of 3200). Run
    configs of the notes live in bench/configs/, not here."""
    cur = load_curriculum(path)
    long_base = {f"late_harm_attempt{n}.yaml" for n in (11, 12, 13, 14, 15, "15b", "15c", 16, "16b", 17)}
    longer_base = {f"late_harm_attempt{n}.yaml"
                   for n in (18, "18b", "18c", 19, 20, "20b", "20c", 21, "21b", "21c", "21d")} | \
        {"late_clean_control18c.yaml", "late_clean_control20.yaml", "late_clean_control20c.yaml",
         "late_clean_control21.yaml", "late_clean_control21c.yaml"}
    mid_window = {"late_harm_attempt22.yaml", "late_harm_attempt22b.yaml",
                  "late_clean_control22.yaml"}  # base to 2000, a clean `mid` to 2400
    steps, base_end = ((2800, 2000) if path.name in long_base else (3200, 2400) if path.name in longer_base
                       else (3200, 2000) if path.name in mid_window else (2000, 1200))
    assert cur.steps == steps and cur.windows[0].planted is None and cur.windows[0].end_step == base_end
    assert all(k in DOC_KINDS for w in cur.windows for k in w.mixture), path
    if not path.name.startswith("late_clean_control"):
        first_planted = 2 if path.name in mid_window else 1
        assert all(w.planted is None for w in cur.windows[:first_planted]), path
        assert all(w.planted is not None for w in cur.windows[first_planted:]), path


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_validation_configs_of_the_notes_load_and_name_a_curriculum_that_loads(path):
    """bench/configs/*.yaml (run configs of declared fresh-seed validations, bench/late_harm_notes.md) stay valid
    run configs whose toy ladder's curriculum file loads with the steps the config builds."""
    from probeselect.run import load_run_config

    cfg = load_run_config(path)
    toy = cfg["ladder"]["toy"]
    cur = load_curriculum(ROOT / toy["curriculum"], steps=toy["steps"])
    assert cur.steps == toy["steps"] and toy["tokenizer_corpus"] == "reference"
    assert (ROOT / toy["curriculum"]).name in path.read_text().split("--curriculum ")[1]  # the command in its header
