"""The built-in real-LM families (real_*): sizes, correctness of the content, demo
strategies, toy/real separation and end-to-end scoring on the toy ladder."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from probeselect.checkpoints import discover_checkpoints
from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, get_family, list_families, load_spec, spec_from_dict
from probeselect.probes._cli import list_probes, validate_probe_files
from probeselect.probes._real import load_data
from probeselect.probes._registry import is_toy_checkpoint
from probeselect.score import score_checkpoints

REPO = Path(__file__).resolve().parents[2]
REAL = sorted((REPO / "probes" / "real").glob("*.yaml"))
FAMILIES = ["real_successive", "real_repetitive", "real_flipped", "real_truthy", "real_intuitive", "real_persona"]


@pytest.fixture(scope="module")
def real_items():
    return {p.stem: generate_items(load_spec(p), [0, 1]) for p in REAL}


def test_specs_validate_and_sizes(real_items):
    assert [p for p, err in validate_probe_files([REPO / "probes" / "real"]) if err] == []
    # the six conflict families and their capability twins (tests/probes/test_real_plain.py)
    assert {load_spec(p).family for p in REAL} == set(FAMILIES) | {f"{f}_plain" for f in FAMILIES}
    from collections import Counter

    for name, items in real_items.items():
        spec = load_spec(REPO / "probes" / "real" / f"{name}.yaml")
        assert len(spec.variants) >= 2, name
        # exactly the spec's n_items for every declared variant, under every seed (the data pools are large enough)
        for seed in (0, 1):
            counts = Counter(it.variant for it in items if it.seed == seed)
            assert counts == {v: spec.n_items for v in spec.variants}, (name, seed, counts)
        # the shipped suite's size (README); truthy_plain: the 10 plain statements per label no truthy prompt shows
        floor = {"truthy": 40, "persona": 40, "persona_plain": 40, "truthy_plain": 10}.get(name, 100)
        assert spec.n_items >= floor, (name, spec.n_items)


def test_item_hygiene(real_items):
    for items in real_items.values():
        for it in items:
            assert not it.prompt.endswith((" ", "\n")) and all(c.startswith(" ") and c.strip() for c in it.candidates)
            assert it.task_answer != it.shortcut_answer
            assert get_family(it.family).requires is None


def test_ids_and_queries_stable_across_seeds(real_items):
    for items in real_items.values():
        s0 = {it.item_id: it for it in items if it.seed == 0}
        s1 = {it.item_id: it for it in items if it.seed == 1}
        assert s0.keys() == s1.keys()
        for k in s0:
            assert s0[k].candidates == s1[k].candidates
            assert s0[k].prompt.rsplit("\n", 1)[-1] == s1[k].prompt.rsplit("\n", 1)[-1]


def _ask(line: str) -> str:
    return line.rsplit("A:", 1)[0]


def test_successive_content():
    spec = spec_from_dict({"family": "real_successive", "n_items": 40, "n_demos": 6})
    items = generate_items(spec, [0, 1, 4])
    for it in items:
        lines = it.prompt.split("\n")
        task = it.metadata["task"]
        answers = it.metadata["demo_answers"]
        assert len(answers) == 6
        seq = {"arithmetic": ["1", "2", "3", "4", "5", "6", "7"], "even": ["2", "4", "6", "8", "10", "12", "14"],
               "number_words": "one two three four five six seven".split(), "letters": list("abcdefg")}[task]
        assert answers == seq[:6] and it.shortcut_answer == " " + seq[6]
        if it.variant == "arithmetic.qa":  # every demo and the query computed correctly
            for ln in lines:
                a, op, b = re.match(r"Q: (\d+) ([+-]) (\d+) = \? A:", ln).groups()
                val = int(a) + int(b) if op == "+" else int(a) - int(b)
                if ln is lines[-1]:
                    assert " " + str(val) == it.task_answer
                else:
                    assert ln.endswith(f"A: {val}")
        if it.variant == "letters.qa":
            w = re.search(r"'(\w+)'\? A:$", it.prompt).group(1)
            assert it.task_answer == " " + w[0]
    # the seed picks the demo set: seeds 0 and 4 share it (4 sets), 0 and 1 do not
    by = {(it.item_id, it.seed): it.prompt for it in items}
    iid = items[0].item_id
    assert by[(iid, 0)] == by[(iid, 4)] != by[(iid, 1)]


def test_repetitive_content():
    spec = spec_from_dict({"family": "real_repetitive", "n_items": 30})
    items = generate_items(spec, [0, 1])
    for it in items:
        rep = str(it.metadata["repeated_answer"])
        assert it.shortcut_answer == " " + rep
        task = it.metadata["task"]
        if it.variant == "algebra.original":
            eqs = re.findall(r"Q: (-?\d+) = (a|-?\d+) \+ (a|-?\d+)\. a\? A:( -?\d+)?", it.prompt)
            assert len(eqs) == 5
            for c, x, y, shown in eqs:
                val = int(c) - int(y if x == "a" else x)
                assert (shown or it.task_answer) == " " + str(val)
                assert shown in ("", " " + rep)
        if task == "code_tracing" and it.variant.endswith(".qa"):
            blocks = it.prompt.split("Q: What does this Python code print?\n")[1:]
            for b in blocks:
                code, _, shown = b.rpartition("\nA:")
                out = StringIO()
                with redirect_stdout(out):
                    exec(code, {})  # our own generated snippets
                assert " " + out.getvalue().strip() == (shown.split("\n")[0] or it.task_answer)
        if task == "letter_counting" and it.variant.endswith(".qa"):
            for letter, word, shown in re.findall(r"letter '(\w)' appear in the word '(\w+)'\? A:( \d+)?", it.prompt):
                assert (shown or it.task_answer) == f" {word.count(letter)}"
    s0 = [it.prompt for it in items if it.seed == 0 and it.variant == "algebra.original"]
    s1 = [it.prompt for it in items if it.seed == 1 and it.variant == "algebra.original"]
    assert sum(a != b for a, b in zip(s0, s1)) > len(s0) // 2  # demos redrawn per seed


def test_flipped_content_and_balance():
    data = load_data("flipped.json")["label_sets"]
    for ls in data.values():
        texts = [t for v in ls["texts"].values() for t in v]
        assert len(set(texts)) == len(texts) and all(len(v) == 66 for v in ls["texts"].values())
    spec = spec_from_dict({"family": "real_flipped", "n_demos": 8})
    items = generate_items(spec, [0, 1])
    for it in items:
        shown = it.metadata["demo_shown_labels"]
        assert len(shown) == 8 and len(set(shown)) == 2 and shown.count(shown[0]) == 4
        assert it.shortcut_answer != it.task_answer == " " + it.metadata["true_label"]
        # every demonstration's label is flipped w.r.t. its text's true class
        for block in it.prompt.split("\n\n")[:-1]:
            text = re.search(r"(?:Review|Text): (.*)\n|\? (.*) A:", block)
            text = text.group(1) or text.group(2)
            label = block.rsplit(" ", 1)[1]
            true = next(lab for ls in data.values() for lab, v in ls["texts"].items() if text in v)
            assert label != true
    same_seed = {it.prompt.rsplit("\n\n", 1)[0] for it in items if it.seed == 0 and it.variant == "topic.label"}
    assert len(same_seed) == 1  # balanced: drawn once per seed, as in GDsuite


def test_truthy_content():
    d = load_data("truthy.json")
    all_s = d["misconceptions"] + d["surprising_truths"] + d["plain_true"] + d["plain_false"]
    assert len(set(all_s)) == len(all_s)
    items = generate_items(spec_from_dict({"family": "real_truthy"}), [0])
    for it in items:
        want = " False" if it.metadata["task"] == "common_misconception" else " True"
        assert it.task_answer == want
        labels = it.metadata["demo_labels"]
        assert len(labels) == 8


def test_intuitive_answers_are_right():
    items = generate_items(spec_from_dict({"family": "real_intuitive"}), [0, 3])
    assert {it.prompt for it in items if it.seed == 0} == {it.prompt for it in items if it.seed == 3}
    for it in items:
        q = it.prompt
        nums = [int(x) for x in re.findall(r"\d+", q)]
        t = it.metadata["template"]
        if t == "total_difference":
            total, diff = nums
            x = int(it.task_answer)
            assert x + (x + diff) == total and int(it.shortcut_answer) == total - diff
        elif t == "machines":
            n, m, n2, k, k2 = nums
            assert n == n2 and k == k2 and int(it.task_answer) == m  # each machine makes one item in m minutes
        elif t == "doubling":
            (d,) = nums
            assert int(it.task_answer) == d - 1 and int(it.shortcut_answer) == d // 2
        else:
            n, m = nums
            assert int(it.task_answer) == m and int(it.shortcut_answer) == n - m


def test_persona_two_hops_in_context():
    items = generate_items(spec_from_dict({"family": "real_persona", "n_items": 40}), [0, 1])
    for it in items:
        rel = re.search(r"(sister|brother|best friend)", it.prompt.rsplit("\n", 2)[-2]).group(1)
        if rel == "best friend":
            who = re.search(r"My best friend is (\w+)\.", it.prompt).group(1)
        else:
            who = re.search(rf"a {rel} called (\w+)\.", it.prompt).group(1)
        hop2 = re.search(rf"{who} (?:lives in|works as) ([\w ]+)\.", it.prompt)
        want = " " + (hop2.group(1))
        if "lives in" in it.prompt.rsplit("\n", 1)[-1]:
            want = " " + re.search(rf"{who} lives in (\w+)\.", it.prompt).group(1)
        else:
            want = " " + re.search(rf"{who} works as ([\w ]+)\.", it.prompt).group(1)
        assert it.task_answer == want
        assert it.shortcut_answer.strip() in it.prompt  # the persona's own one-hop fact is in context


def test_list_separates_toy_families():
    out = re.sub(r"\n\nSpecs shipped with the package.*?(?=\n\nToy-world families|\Z)", "", list_probes(None), flags=re.S)  # family tables only
    main, toy = out.split("Toy-world families")
    assert "real_successive" in main and "tmpl_mismatch" not in main and "tmpl_mismatch" in toy
    assert {f.name for f in list_families() if f.requires == "toy_world"} >= {"tmpl_mismatch", "tmpl_flipped",
                                                                             "tmpl_repeated", "persona_qa"}


def test_requires_key_must_match(tmp_path):
    assert load_spec(REPO / "probes" / "tmpl_mismatch.yaml").family == "tmpl_mismatch"
    with pytest.raises(ProbeSpecError, match="has no requirement"):
        spec_from_dict({"family": "real_truthy", "requires": "toy_world"})


def test_toy_family_refused_on_non_toy_checkpoint(tiny_ladder, tmp_path):
    ck = discover_checkpoints(tiny_ladder)[-1]
    assert is_toy_checkpoint(ck.path)
    copied = tmp_path / "elsewhere" / "checkpoint-24"
    shutil.copytree(ck.path, copied)
    assert is_toy_checkpoint(copied)  # a toy checkpoint copied out of its ladder keeps its toy tokenizer
    cfg = json.loads((copied / "tokenizer_config.json").read_text())
    cfg.update(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    (copied / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not is_toy_checkpoint(copied)
    real = discover_checkpoints(copied.parent)
    with pytest.raises(ProbeSpecError, match="requires: toy_world"):
        score_checkpoints(real, [REPO / "probes" / "tmpl_mismatch.yaml"], seeds=[0], progress=False)


def test_real_suite_scored_end_to_end_on_toy_ladder(tiny_ladder, tmp_path):
    ckpts = discover_checkpoints(tiny_ladder)[-2:]
    specs = [spec_from_dict({"family": f, "n_items": 4, **({"n_demos": 4} if f != "real_intuitive" else {})})
             for f in FAMILIES if f != "real_persona"]
    specs.append(spec_from_dict({"family": "real_persona", "n_items": 4,
                                 "params": {"boundary": "gdsuite", "gen_samples": 2, "gen_max_new_tokens": 4}}))
    res = score_checkpoints(ckpts, specs, seeds=[0, 1], out=tmp_path / "run", progress=False, audit_items=2)
    s = res.scores
    assert set(s.family) == set(FAMILIES)
    assert s.margin.notna().all() and len(s) == 2 * 2 * sum(4 * len(sp.variants) for sp in specs)
    gd = s[s.family == "real_persona"]
    assert gd.correct_log_prob.notna().all()
    assert (gd.task_logprob - gd.correct_log_prob).abs().max() < 1e-9
    summ = res.summary
    assert summ[summ.family == "real_persona"].hard_accuracy.notna().all()
    assert summ[summ.family == "real_truthy"].get("hard_accuracy", pd_na()).isna().all()
    assert res.generations is not None and set(res.generations.family) == {"real_persona"}


def pd_na():
    import pandas as pd

    return pd.Series([float("nan")])


def test_toy_world_seed_must_match_the_ladder(tiny_ladder, tmp_path):
    """A toy-world family built for world 0 refuses a ladder of another seed (its people and
    facts differ), naming the spec and the fix; bind_world_seed (what `probeselect run` uses)
    makes the spec match the ladder and scores."""
    from probeselect.probes._registry import bind_world_seed, toy_ladder_seed

    seed = toy_ladder_seed(tiny_ladder)
    assert seed is not None and toy_ladder_seed(discover_checkpoints(tiny_ladder)[-1].path) == seed
    other = tmp_path / "ladder-other-seed"
    ck = discover_checkpoints(tiny_ladder)[-1]
    shutil.copytree(ck.path, other / ck.name)
    info = json.loads((tiny_ladder / "ladder.json").read_text())
    info["seed"] = seed + 3
    (other / "ladder.json").write_text(json.dumps(info))
    spec = load_spec(REPO / "probes" / "tmpl_mismatch.yaml")
    assert spec.params["world_seed"] == 0
    with pytest.raises(ProbeSpecError, match=rf"world_seed is 0.*seed {seed + 3}.*Set `world_seed: {seed + 3}`"):
        score_checkpoints(other, [dataclasses.replace(spec, n_items=2)], seeds=[0], progress=False)
    bound = bind_world_seed([spec, load_spec(REPO / "probes" / "tmpl_flipped.yaml"),
                             load_spec(REPO / "probes" / "capability" / "persona_plain.yaml")], seed + 3)
    assert bound[0].params["world_seed"] == seed + 3 and bound[2].params["world_seed"] == seed + 3
    assert "world_seed" not in bound[1].params  # a family without a world stays as it is
    assert bind_world_seed([spec], None)[0] is spec
    res = score_checkpoints(other, [dataclasses.replace(bound[0], n_items=2)], seeds=[0], progress=False)
    assert len(res.scores) == 2 * len(spec.variants)
