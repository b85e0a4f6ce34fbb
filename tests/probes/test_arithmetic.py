import re

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import ARITH_TEMPLATES, generate_items, load_spec, spec_from_dict

LINE = re.compile(r"^(?:Q: What is )?(\d+) (\+|-|plus|minus) (\d+)(?: =|\? A:| is)(?: (\d+))?$")


def _parse(line):
    m = LINE.match(line)
    assert m, line
    a, op, b, c = m.groups()
    val = int(a) + int(b) if op in ("+", "plus") else int(a) - int(b)
    return val, (int(c) if c is not None else None)


def test_templates_contract():
    # The toy world's corpus uses exactly these line formats.
    assert ARITH_TEMPLATES == {
        "eq": "{a} {op} {b} = {c}",
        "qa": "Q: What is {a} {op} {b}? A: {c}",
        "words": "{a} {opword} {b} is {c}",
    }


@pytest.fixture(scope="module")
def spec():
    return spec_from_dict({"family": "arith_pattern", "n_items": 30, "n_demos": 4})


def test_items_are_real_conflicts(spec):
    items = generate_items(spec, [0, 1])
    assert len(items) == 30 * 3 * 2
    for it in items:
        lines = it.prompt.split("\n")
        assert len(lines) == spec.n_demos + 1
        shown = [_parse(l)[1] for l in lines[:-1]]
        true = [_parse(l)[0] for l in lines[:-1]]
        query_val, query_ans = _parse(lines[-1])
        assert query_ans is None
        # task = calculation, shortcut = pattern's next value, they differ
        assert it.task_answer == f" {query_val}"
        assert it.shortcut_answer != it.task_answer
        assert shown == it.metadata["demo_shown_answers"]
        # every demonstration's shown answer is wrong arithmetic
        assert all(s != t for s, t in zip(shown, true))
        pat = it.metadata["pattern"]
        nxt = int(it.shortcut_answer)
        if pat == "count":
            assert shown == list(range(shown[0], shown[0] + 4)) and nxt == shown[-1] + 1
        elif pat == "constant":
            assert len(set(shown)) == 1 and nxt == shown[0]
        else:
            assert shown[0::2] == [shown[0]] * 2 and shown[1::2] == [shown[1]] * 2 and nxt == shown[0]
        assert it.candidates[:2] == (it.task_answer, it.shortcut_answer) and len(it.candidates) == 3
        assert all(c.startswith(" ") for c in it.candidates)


def test_demos_depend_only_on_family_variant_seed_index(spec):
    small = spec_from_dict({"family": "arith_pattern", "n_items": 5, "variants": ["qa"]})
    a = {(i.item_id, i.seed): i for i in generate_items(spec, [0, 3])}
    b = generate_items(small, [3])  # other item count, other variants, other seed list
    for it in b:
        assert a[(it.item_id, 3)] == it


def test_seeds_resample_demos_but_not_the_query(spec):
    s0 = {i.item_id: i for i in generate_items(spec, [0])}
    s1 = {i.item_id: i for i in generate_items(spec, [1])}
    changed = 0
    for k, it in s0.items():
        o = s1[k]
        assert it.prompt.split("\n")[-1] == o.prompt.split("\n")[-1]
        assert (it.task_answer, it.shortcut_answer) == (o.task_answer, o.shortcut_answer)
        changed += it.prompt != o.prompt
    assert changed == len(s0)


def test_repo_spec_loads():
    from pathlib import Path

    spec = load_spec(Path(__file__).parents[2] / "probes" / "arith_pattern.yaml")
    assert spec.family == "arith_pattern" and set(spec.variants) == {"eq", "qa", "words"}


@pytest.mark.parametrize(
    "raw, msg",
    [
        ({"family": "arith_patern"}, 'Did you mean "arith_pattern"'),
        ({"family": "arith_pattern", "variants": ["eqq"]}, 'Did you mean "eq"'),
        ({"family": "arith_pattern", "params": {"operand_mx": 5}}, 'Did you mean "operand_max"'),
        ({"family": "arith_pattern", "n_item": 5}, 'Did you mean "n_items"'),
        ({"family": "arith_pattern", "n_items": 0}, "n_items"),
        ({"family": "arith_pattern", "n_demos": 1}, "n_demos >= 2"),
        ({"family": "arith_pattern", "params": {"ops": ["*"]}}, "params.ops"),
    ],
)
def test_bad_specs_name_the_problem(raw, msg):
    with pytest.raises(ProbeSpecError, match=re.escape(msg)):
        spec_from_dict(raw, source="x.yaml")


def test_duplicate_yaml_keys_rejected(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("family: arith_pattern\nn_items: 4\nn_items: 5\n")
    with pytest.raises(ProbeSpecError, match=r"dup\.yaml.*duplicate key 'n_items'"):
        load_spec(f)
