import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import generate_items, get_family, load_spec, spec_from_dict

REPO = Path(__file__).parents[2]
EXAMPLES = REPO / "probes" / "examples"

ROWS = [
    {"prompt": "The opposite of hot is", "task_answer": " cold", "shortcut_answer": " hot",
     "candidates": [" warm", " big"], "variant": "sentence", "note": "a"},
    {"prompt": "hot ->", "task_answer": " cold", "shortcut_answer": " hot", "candidates": [" hot", " dry"],
     "variant": "arrow", "note": "b"},
    {"prompt": "big ->", "task_answer": "small", "shortcut_answer": " big", "candidates": [],
     "variant": "arrow", "note": "c"},
]


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(tmp_path: Path, body: str, name: str = "spec.yaml") -> Path:
    f = tmp_path / name
    f.write_text(body)
    return f


def _row_spec(tmp_path, rows, family="my_family", extra=""):
    _write_jsonl(tmp_path / "rows.jsonl", rows)
    return _spec(tmp_path, f"family: {family}\ndata: rows.jsonl\n{extra}")


# -- examples -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["cities", "opposites_csv", "opposites_identity"])
def test_shipped_examples_load_and_generate(name):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    assert spec.user_data is not None and spec.family.startswith("user_")
    items = generate_items(spec, [0, 1])
    assert items and all(it.family == spec.family for it in items)
    for it in items:
        assert it.candidates[:2] == (it.task_answer, it.shortcut_answer)
        assert it.task_answer != it.shortcut_answer
        assert not (it.prompt[-1].isspace() and it.task_answer[0].isspace())


def test_example_cities_are_true_toy_world_facts():
    from probeselect.toy.world import ToyWorld

    city = {p.name: p.city for p in ToyWorld.generate(0).persons}
    spec = load_spec(EXAMPLES / "cities.yaml")
    items = generate_items(spec, [0])
    assert {it.variant for it in items} == {"sentence", "qa"}
    for it in items:
        names = re.findall(r"\b([A-Z][a-z]+) (?:lives|live)\b", it.prompt)
        *demo_names, query = names
        shown = {city[n] for n in demo_names}
        assert it.shortcut_answer == " " + shown.pop() and not shown  # one repeated, true city
        assert it.task_answer == " " + city[query]
        assert it.item_id == f"user_cities/{it.variant}/{query.lower()}"


# -- row form -------------------------------------------------------------------


def test_row_form_items_are_the_rows_under_every_seed(tmp_path):
    spec = load_spec(_row_spec(tmp_path, ROWS))
    assert spec.family == "my_family" and spec.variants == ("sentence", "arrow") and spec.n_demos == 0
    s0, s7 = generate_items(spec, [0]), generate_items(spec, [7])
    assert [dataclasses.replace(i, seed=7) for i in s0] == s7
    assert {i.seed for i in s7} == {7}
    by_id = {i.item_id: i for i in s0}
    assert set(by_id) == {"my_family/sentence/0000", "my_family/arrow/0000", "my_family/arrow/0001"}
    a = by_id["my_family/sentence/0000"]
    assert a.prompt == "The opposite of hot is" and a.candidates == (" cold", " hot", " warm", " big")
    # task/shortcut are prepended when missing and not repeated when given
    assert by_id["my_family/arrow/0000"].candidates == (" cold", " hot", " dry")
    # answers are used exactly as written: no leading space is added
    b = by_id["my_family/arrow/0001"]
    assert b.task_answer == "small" and b.candidates == ("small", " big")
    assert a.metadata["row"] == 1 and a.metadata["fields"] == {"note": "a"}


def test_row_form_caps_and_selects_variants(tmp_path):
    spec = load_spec(_row_spec(tmp_path, ROWS, extra="variants: [arrow]\nn_items: 1\n"))
    items = generate_items(spec, [0])
    assert [i.item_id for i in items] == ["my_family/arrow/0000"]


def test_item_id_column(tmp_path):
    rows = [dict(r, item_id=k) for k, r in zip(["x", "y", "z"], ROWS)]
    items = generate_items(load_spec(_row_spec(tmp_path, rows)), [0])
    assert [i.item_id for i in items] == ["my_family/sentence/x", "my_family/arrow/y", "my_family/arrow/z"]
    rows[2]["item_id"] = "y"
    with pytest.raises(ProbeSpecError, match=r"rows\.jsonl: row 3, column 'item_id'.*repeats row 2"):
        load_spec(_row_spec(tmp_path, rows))


def _same_items_from(tmp_path, spec_path):
    ref = generate_items(load_spec(_row_spec(tmp_path, ROWS)), [0])
    got = generate_items(load_spec(spec_path), [0])
    key = lambda i: (i.item_id, i.prompt, i.task_answer, i.shortcut_answer, i.candidates)  # noqa: E731
    assert [key(i) for i in got] == [key(i) for i in ref]
    return got


def test_csv_parquet_and_datasets_folder_give_the_same_items(tmp_path):
    # CSV: candidates as one '|'-separated cell; spaces are kept exactly
    import csv

    with open(tmp_path / "rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "task_answer", "shortcut_answer", "candidates", "variant", "note"])
        for r in ROWS:
            w.writerow([r["prompt"], r["task_answer"], r["shortcut_answer"], "|".join(r["candidates"]), r["variant"], r["note"]])
    _same_items_from(tmp_path, _spec(tmp_path, "family: my_family\ndata: rows.csv\n", "c.yaml"))

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    _same_items_from(tmp_path, _spec(tmp_path, "family: my_family\ndata: rows.parquet\n", "p.yaml"))

    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    _same_items_from(tmp_path, _spec(tmp_path, "family: my_family\ndata: ds\n", "d.yaml"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(
        str(tmp_path / "dsd")
    )
    with pytest.raises(ProbeSpecError, match=r"dsd: the dataset has splits \['train', 'test'\]; choose one with `split:`"):
        load_spec(_spec(tmp_path, "family: my_family\ndata: dsd\n", "dd.yaml"))
    _same_items_from(tmp_path, _spec(tmp_path, "family: my_family\ndata: dsd\nsplit: train\n", "dd.yaml"))


def test_spec_hash_follows_the_data_content_not_its_location(tmp_path):
    f = _row_spec(tmp_path, ROWS)
    h1 = load_spec(f).spec_hash
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(tmp_path / "rows.jsonl", moved / "rows.jsonl")
    shutil.copy(f, moved / "spec.yaml")
    assert load_spec(moved / "spec.yaml").spec_hash == h1
    rows = [dict(r) for r in ROWS]
    rows[0]["candidates"] = [" warm"]
    assert load_spec(_row_spec(tmp_path, rows)).spec_hash != h1
    assert load_spec(_row_spec(tmp_path, ROWS, extra="description: other\n")).spec_hash != h1
    assert load_spec(f).to_dict()["data"]["files"] == ["rows.jsonl"]


def test_user_family_goes_through_the_registry(tmp_path):
    spec = load_spec(_row_spec(tmp_path, ROWS, extra="kind: capability\n"))
    fam = get_family("my_family")
    assert fam.kind == "capability" and set(fam.variants) == {"sentence", "arrow"}
    small = dataclasses.replace(spec, n_items=1)
    assert len(generate_items(small, [0])) == 2
    # a data-defined family cannot be configured by name alone
    with pytest.raises(ProbeSpecError, match="unknown probe family 'my_family'.*add `data:`"):
        spec_from_dict({"family": "my_family"}, source="x.yaml")


# -- strict loading -------------------------------------------------------------


def _drop(rows, k, col):
    rows = [dict(r) for r in rows]
    del rows[k][col]
    return rows


def _set(rows, k, col, value):
    rows = [dict(r) for r in rows]
    rows[k][col] = value
    return rows


@pytest.mark.parametrize(
    "rows, msg",
    [
        (_drop(ROWS, 1, "task_answer"), r"rows\.jsonl: row 2, column 'task_answer': missing"),
        (_drop(ROWS, 2, "prompt"), r"rows\.jsonl: row 3, column 'prompt': missing"),
        (_set(ROWS, 0, "shortcut_answer", ""), r"rows\.jsonl: row 1, column 'shortcut_answer': empty answer"),
        (_set(ROWS, 2, "task_answer", "  "), r"row 3, column 'task_answer': empty answer"),
        (_set(ROWS, 1, "shortcut_answer", " cold"), r"row 2, column 'shortcut_answer': equals task_answer"),
        (_set(ROWS, 1, "task_answer", 5), r"row 2, column 'task_answer': must be a string.*' 5'"),
        (_set(ROWS, 0, "candidates", [" a", " a"]), r"row 1, column 'candidates': duplicate candidate ' a'"),
        (_set(ROWS, 0, "candidates", [" a", ""]), r"row 1, column 'candidates': every candidate must be a non-empty"),
        (_set(ROWS, 0, "candidates", " a| b"), r"row 1, column 'candidates'.*only in CSV"),
        (_set(ROWS, 0, "prompt", "The opposite of hot is "), r"row 1, column 'prompt': the prompt ends with whitespace"),
        (_set(ROWS, 0, "variant", "two words"), r"row 1, column 'variant'"),
    ],
)
def test_bad_rows_name_file_row_and_column(tmp_path, rows, msg):
    with pytest.raises(ProbeSpecError, match=msg):
        load_spec(_row_spec(tmp_path, rows))


def test_missing_csv_column_suggests_the_name(tmp_path):
    (tmp_path / "d.csv").write_text("prompt,task_anwser,shortcut_answer\nhot ->, cold, hot\n")
    with pytest.raises(ProbeSpecError, match=r"d\.csv: row 1, column 'task_answer': missing\. Did you mean \"task_anwser\""):
        load_spec(_spec(tmp_path, "family: f\ndata: d.csv\n"))


def test_csv_row_numbers_skip_the_header_and_keep_spaces(tmp_path):
    (tmp_path / "d.csv").write_text('prompt,task_answer,shortcut_answer,candidates\nhot ->, cold, hot, dry| wet\nbig ->,, big,\n')
    with pytest.raises(ProbeSpecError, match=r"d\.csv: row 2, column 'task_answer': empty answer"):
        load_spec(_spec(tmp_path, "family: f\ndata: d.csv\n"))
    (tmp_path / "d.csv").write_text('prompt,task_answer,shortcut_answer,candidates\nhot ->, cold, hot, dry| wet\n')
    (it,) = generate_items(load_spec(tmp_path / "spec.yaml"), [0])
    assert it.candidates == (" cold", " hot", " dry", " wet")


def test_jsonl_errors_give_row_and_line(tmp_path):
    (tmp_path / "rows.jsonl").write_text(json.dumps(ROWS[0]) + "\n\n{not json}\n")
    with pytest.raises(ProbeSpecError, match=r"rows\.jsonl: row 2 \(line 3\): invalid JSON"):
        load_spec(_spec(tmp_path, "family: f\ndata: rows.jsonl\n"))


@pytest.mark.parametrize(
    "body, msg",
    [
        ("family: arith_pattern\ndata: rows.jsonl\n", "'arith_pattern' is already a built-in probe family.*another name"),
        ("family: arith_patern\nn_items: 3\n", "unknown probe family 'arith_patern'. Did you mean \"arith_pattern\""),
        ("family: f\ndta: rows.jsonl\n", "unknown key 'dta'. Did you mean \"data\""),
        ("family: f\ndata: nope.jsonl\n", r"nope\.jsonl: data file not found"),
        ("family: f\ndata: rows.txt\n", "unsupported data format '.txt'"),
        ("family: f\ndata: rows.jsonl\nparams: {a: 1}\n", "key 'params' does not apply to a row-form"),
        ("family: f\ndata: rows.jsonl\nn_demos: 2\n", "key 'n_demos' does not apply to a row-form"),
        ("family: f\ndata: rows.jsonl\nvariants: [arow]\n", 'no variant \'arow\'.*Did you mean "arrow"'),
        ("family: f\ndata: rows.jsonl\nkind: other\n", "`kind` must be one of"),
        ("family: my/fam\ndata: rows.jsonl\n", "not a valid family name"),
        ("data: rows.jsonl\n", "missing required key `family`"),
        ("family: f\ndata: rows.jsonl\ndata: rows.jsonl\n", "duplicate key 'data'"),
        ("family: f\ndata: rows.jsonl\nquery_pool: []\n", "cannot be combined"),
    ],
)
def test_bad_specs_are_one_line_errors(tmp_path, body, msg):
    _write_jsonl(tmp_path / "rows.jsonl", ROWS)
    (tmp_path / "rows.txt").write_text("x")
    f = _spec(tmp_path, body)
    with pytest.raises(ProbeSpecError, match=msg) as exc:
        load_spec(f)
    text = str(exc.value)
    assert "\n" not in text and re.search(r"spec\.yaml|nope\.jsonl|rows\.txt", text), text


# -- template form --------------------------------------------------------------

DEMOS = [{"word": w, "shown": w} for w in ["hot", "big", "up", "wet", "old", "full"]]
QUERIES = [
    {"word": "fast", "task_answer": " slow", "shortcut_answer": " fast", "candidates": [" hot"]},
    {"word": "wet", "task_answer": " dry", "shortcut_answer": " wet"},
    {"word": "early", "task_answer": " late", "shortcut_answer": " early", "item_id": "e"},
]
TEMPLATE = """family: tfam
n_demos: 3
templates:
  sentence: {demo: "The opposite of {word} is {shown}.", query: "The opposite of {word} is"}
  arrow: {demo: "{word} -> {shown}", query: "{word} ->", joiner: " | ", prefix: "Opposites: "}
demo_pool: demos.jsonl
query_pool: queries.jsonl
"""


@pytest.fixture
def tdir(tmp_path):
    _write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    _write_jsonl(tmp_path / "queries.jsonl", QUERIES)
    return tmp_path


def test_template_form_samples_demos_per_seed(tdir):
    spec = load_spec(_spec(tdir, TEMPLATE))
    assert spec.variants == ("sentence", "arrow") and spec.n_items == 3 and spec.n_demos == 3
    s0, s1 = generate_items(spec, [0]), generate_items(spec, [1])
    assert [i.item_id for i in s0] == ["tfam/sentence/0000", "tfam/sentence/0001", "tfam/sentence/e",
                                       "tfam/arrow/0000", "tfam/arrow/0001", "tfam/arrow/e"]
    assert [i.item_id for i in s0] == [i.item_id for i in s1]
    for a, b in zip(s0, s1):
        assert a.candidates == b.candidates and a.task_answer == b.task_answer
        assert a.prompt.rsplit("\n" if a.variant == "sentence" else " | ", 1)[-1] == b.prompt.rsplit(
            "\n" if b.variant == "sentence" else " | ", 1)[-1]
    assert sum(a.prompt != b.prompt for a, b in zip(s0, s1)) >= 4
    wet = s0[1]
    assert wet.prompt.endswith("The opposite of wet is") and wet.prompt.count("\n") == 3
    assert "The opposite of wet is wet." not in wet.prompt  # a demo repeating the query is never used
    arrow = s0[3]
    assert arrow.prompt.startswith("Opposites: ") and arrow.prompt.endswith(" | fast ->") and arrow.prompt.count(" | ") == 3
    # item i does not depend on n_items
    small = load_spec(_spec(tdir, TEMPLATE + "n_items: 1\nvariants: [arrow]\n", "small.yaml"))
    assert generate_items(small, [1]) == [s1[3]]


def test_template_demo_can_refer_to_the_query(tdir):
    body = """family: rep
n_demos: 2
template: {demo: "A {item} is {query[shortcut_answer]}.", query: "A {item} is"}
demo_pool: [{item: cat}, {item: dog}, {item: cow}]
query_pool: [{item: car, task_answer: " a vehicle", shortcut_answer: " an animal"}]
"""
    (it,) = generate_items(load_spec(_spec(tdir, body)), [0])
    lines = it.prompt.split("\n")
    assert len(lines) == 3 and all(l.endswith(" is  an animal.") for l in lines[:2]) and lines[2] == "A car is"
    assert it.variant == "default" and it.candidates == (" a vehicle", " an animal")


@pytest.mark.parametrize(
    "edit, msg",
    [
        (lambda b: b.replace("{shown}.", "{shwn}."), r"demos\.jsonl: row 1, column 'shwn': missing \(used by template 'sentence'"),
        (lambda b: b.replace('query: "{word} ->"', 'query: "{wrd} ->"'), r"queries\.jsonl: row 1, column 'wrd': missing"),
        (lambda b: b.replace("n_demos: 3", "n_demos: 6"), r"queries\.jsonl: row 2: only 5 demo rows can go with this query"),
        (lambda b: b.replace("n_demos: 3", "n_demos: 7"), r"`n_demos` must be an integer in \[0, 6\]"),
        (lambda b: b + "n_items: 4\n", r"`n_items` must be an integer in \[1, 3\]"),
        (lambda b: b.replace("demo_pool: demos.jsonl\n", ""), "missing `demo_pool:`"),
        (lambda b: b.replace("joiner:", "joinr:"), "unknown key 'joinr'. Did you mean \"joiner\""),
        (lambda b: b.replace("{shown}.", "{shown.x}."), "unsupported placeholder"),
        (lambda b: b.replace("{shown}.", "{shown."), "bad template"),
        (lambda b: b.replace('query: "The opposite of {word} is"', 'query: "The opposite of {word} is "'),
         r"queries\.jsonl: row 1, column \"template 'sentence' query\": the prompt ends with whitespace"),
        (lambda b: b.replace("templates:", "template: {demo: x, query: y}\ntemplates:"), "either `template:`"),
        (lambda b: b + "params: {}\n", "key 'params' does not apply to a template-form"),
    ],
)
def test_bad_template_specs(tdir, edit, msg):
    with pytest.raises(ProbeSpecError, match=msg):
        load_spec(_spec(tdir, edit(TEMPLATE)))


def test_bad_query_pool_rows(tdir):
    _write_jsonl(tdir / "queries.jsonl", QUERIES[:2] + [{"word": "x", "task_answer": " y", "shortcut_answer": " y"}])
    with pytest.raises(ProbeSpecError, match=r"queries\.jsonl: row 3, column 'shortcut_answer': equals task_answer"):
        load_spec(_spec(tdir, TEMPLATE))
