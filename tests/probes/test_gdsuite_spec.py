"""`format: gdsuite` specs: defaults from GDsuite's config.yaml, and bad input -> one-line errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, load_spec, spec_from_dict
from probeselect.probes._demos import STRATEGIES, icl_prompts, select_demo_set
from probeselect.probes._gdsuite import FAMILY_CONFIG


def _jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "data"
    rows = [{"split": "demo", "prompt": f"Q: {i} A:", "answer": str(i), "demo_set": i % 2} for i in range(6)]
    rows += [{"split": "test", "prompt": "Q: x A:", "correct_answer": "1", "incorrect_answer": "2"}]
    for t in FAMILY_CONFIG["successive_answer"]["tasks"]:
        _jsonl(r / "successive_answer" / f"{t}.jsonl", rows)
    return r


def _spec(root, **kw):
    return spec_from_dict({"format": "gdsuite", "root": str(root), "family": "successive_answer", **kw})


def test_defaults_are_gdsuite_config(root):
    spec = _spec(root)
    assert spec.family == "gdsuite.successive_answer"
    assert spec.variants == ("number_words", "letters", "arithmetic", "even")
    assert spec.params["k"] == {"number_words": 10, "letters": 10, "arithmetic": 32, "even": 32}
    assert (spec.params["demo_strategy"], spec.params["joiner"], spec.params["boundary"]) == ("ordered", "\n", "gdsuite")
    assert FAMILY_CONFIG["flipped_answer"]["joiner"] == "\n\n" and FAMILY_CONFIG["flipped_answer"]["tasks"]["imdb"] == 24


def test_task_and_k_overrides(root):
    spec = _spec(root, tasks=["letters", {"name": "even", "k": 2}], k={"letters": 1})
    assert spec.params["k"] == {"letters": 1, "even": 2}
    items = generate_items(spec, [0, 1])
    assert [it.prompt for it in items if it.seed == 0] == ["Q: 0 A: 0\nQ: x A:", "Q: 0 A: 0\nQ: 2 A: 2\nQ: x A:"]
    assert [it.prompt for it in items if it.seed == 1][0] == "Q: 1 A: 1\nQ: x A:"  # seed 1 -> demo_set 1


def test_load_spec_relative_root(root):
    p = root.parent / "s.yaml"
    p.write_text("format: gdsuite\nroot: data\nfamily: successive_answer\ntasks: [letters]\n")
    assert load_spec(p).variants == ("letters",)


@pytest.mark.parametrize("kw, match", [
    ({"family": "successive"}, "Did you mean"),
    ({"root": "/nonexistent/x"}, "is not a folder"),
    ({"tasks": ["nope"]}, "file not found"),
    ({"tasks": ["letters"], "k": {"even": 3}}, "not in `tasks`"),
    ({"tasks": [{"name": "letters", "k": -1}]}, "k of task"),
    ({"boundary": "weird"}, "boundary"),
    ({"demo_strategy": "shuffle"}, "demo_strategy"),
    ({"n_seeds": 4}, "unknown key"),
])
def test_bad_specs(root, kw, match):
    raw = {"format": "gdsuite", "root": str(root), "family": "successive_answer", **kw}
    with pytest.raises(ProbeSpecError, match=match):
        spec_from_dict(raw)


def test_bad_rows(tmp_path):
    r = tmp_path / "d"
    _jsonl(r / "flipped_answer" / "sst2.jsonl", [{"split": "demo", "prompt": "a", "answer": "b"},
                                                {"split": "test", "prompt": "p", "correct_answer": "x",
                                                 "incorrect_answer": "y"}])
    with pytest.raises(ProbeSpecError, match="line 1: demo_strategy balanced needs `label`"):
        spec_from_dict({"format": "gdsuite", "root": str(r), "family": "flipped_answer", "tasks": ["sst2"]})
    _jsonl(r / "truthy_answer" / "t.jsonl", [{"split": "test", "prompt": "p", "correct_answer": "x",
                                             "incorrect_answer": "x"}])
    with pytest.raises(ProbeSpecError, match="correct_answer equals incorrect_answer"):
        spec_from_dict({"format": "gdsuite", "root": str(r), "family": "truthy_answer", "tasks": ["t"]})
    _jsonl(r / "truthy_answer" / "u.jsonl", [{"split": "train", "prompt": "p"}])
    with pytest.raises(ProbeSpecError, match="`split` must be"):
        spec_from_dict({"format": "gdsuite", "root": str(r), "family": "truthy_answer", "tasks": ["u"]})


def test_persona_stop_must_start_with_newline(tmp_path):
    d = tmp_path / "d" / "multihop_persona_qa" / "p"
    _jsonl(d / "facts.jsonl", [{"messages": [{"role": "user", "content": "a?"}, {"role": "assistant", "content": "b"}]}])
    (d / "test_questions.json").write_text(json.dumps([{"id": "q", "question": "a?", "expected_answer_regex": "b"}]))
    base = {"format": "gdsuite", "root": str(tmp_path / "d"), "family": "multihop_persona_qa", "personas": ["p"]}
    spec = spec_from_dict(base)
    assert spec.params["n_samples"] == 100 and spec.params["max_new_tokens"] == 300
    with pytest.raises(ProbeSpecError, match="start with a newline"):
        spec_from_dict({**base, "stop": ["Q:"]})
    (d / "test_questions.json").write_text(json.dumps([{"id": "q", "question": "a?", "expected_answer_regex": "("}]))
    with pytest.raises(ProbeSpecError, match="invalid regex"):
        spec_from_dict(base)


def test_strategies_match_gdsuite_semantics():
    demos = [{"prompt": f"p{i}", "answer": "a", "label": i % 2} for i in range(10)]
    rng = random.Random(3)
    out = STRATEGIES["balanced"](demos, 4, rng)
    assert sorted(d["label"] for d in out) == [0, 0, 1, 1]
    assert STRATEGIES["ordered"](demos, 3, rng) == demos[:3]
    assert STRATEGIES["none"](demos, 3, rng) == []
    assert len(STRATEGIES["random"](demos, 50, rng)) == 10
    assert select_demo_set([{"demo_set": 0}, {"demo_set": 1}], 5) == [{"demo_set": 1}]
    # random: one stream per seed, advanced per item -> items differ, reruns agree
    a = [p for p, _ in icl_prompts(demos, ["t1", "t2", "t3"], strategy="random", k=2, seed=0, joiner="\n")]
    b = [p for p, _ in icl_prompts(demos, ["t1", "t2", "t3"], strategy="random", k=2, seed=0, joiner="\n")]
    assert a == b and len({x.rsplit("\n", 1)[0] for x in a}) > 1
    # exactly GDsuite's draws: one random.Random(seed) stream, rng.sample(pool, k) per test item, in item order
    ref = random.Random(0)
    expected = [ref.sample(demos, 2) for _ in range(3)]
    got = list(icl_prompts(demos, ["t1", "t2", "t3"], strategy="random", k=2, seed=0, joiner="\n"))
    assert [used for _, used in got] == expected
    for (prompt, _), used, t in zip(got, expected, ["t1", "t2", "t3"]):
        lines = prompt.split("\n")
        assert lines[-1] == t and [ln.split()[0] for ln in lines[:-1]] == [d["prompt"] for d in used]
