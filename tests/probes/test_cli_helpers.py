import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from probeselect.errors import ProbeSpecError
from probeselect.probes import list_families
from probeselect.probes._cli import list_probes, show_items, validate_probe_files

REPO = Path(__file__).parents[2]


def test_list_probes_builtins_only():
    out = list_probes(None)
    families = re.sub(r"\n\nSpecs shipped with the package.*?(?=\n\nToy-world families|\Z)", "", out, flags=re.S)  # family tables only
    lines = families.splitlines()
    assert lines[0].split()[:5] == ["family", "kind", "variants", "items/variant", "source"]
    for fam in list_families():
        row = next(l for l in lines if l.startswith(fam.name + " "))
        assert fam.kind in row and ",".join(fam.variants) in row and str(fam.default_n_items) in row
    assert "user_cities" not in out


def test_list_probes_includes_user_families_with_counts(tmp_path):
    out = list_probes(REPO / "probes")
    row = next(l for l in out.splitlines() if l.startswith("user_cities "))
    assert "sentence=6,qa=6" in row and "cities.yaml" in row
    assert "default=3" in next(l for l in out.splitlines() if l.startswith("user_opposites_csv "))
    # a broken file is reported, not fatal
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.yaml").write_text("family: nope_family\n")
    out = list_probes(tmp_path)
    assert "1 spec file(s) could not be loaded" in out and "bad.yaml: unknown probe family 'nope_family'" in out


def test_validate_repo_probes_dir_is_clean():
    results = validate_probe_files([REPO / "probes"])
    names = {p.name for p, _ in results}
    assert {"arith_pattern.yaml", "tmpl_repeated.yaml", "cities.yaml", "opposites_identity.yaml"} <= names
    assert [(p, e) for p, e in results if e is not None] == []


def test_validate_reports_each_bad_file(tmp_path):
    (tmp_path / "good.yaml").write_text("family: tmpl_flipped\nn_items: 3\n")
    (tmp_path / "bad_param.yaml").write_text("family: tmpl_flipped\nparams: {relation: [category]}\n")
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"prompt": "a ->", "task_answer": " b", "shortcut_answer": " c"}) + "\n"
        + json.dumps({"prompt": "d ->", "task_answer": " e"}) + "\n"
    )
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "user.yaml").write_text("family: u1\ndata: ../rows.jsonl\n")
    results = dict(validate_probe_files([tmp_path, tmp_path / "missing.yaml"]))
    assert results[tmp_path / "good.yaml"] is None
    assert 'Did you mean "relations"' in results[tmp_path / "bad_param.yaml"]
    assert re.search(r"rows\.jsonl: row 2, column 'shortcut_answer': missing", results[tmp_path / "nested" / "user.yaml"])
    assert "not found" in results[tmp_path / "missing.yaml"]
    empty = tmp_path / "empty"
    empty.mkdir()
    ((p, err),) = validate_probe_files([empty])
    assert p == empty and "no *.yaml" in err


def test_validate_flags_two_files_defining_one_user_family(tmp_path):
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "a ->", "task_answer": " b", "shortcut_answer": " c"}) + "\n")
    (tmp_path / "a.yaml").write_text("family: same\ndata: rows.jsonl\n")
    (tmp_path / "b.yaml").write_text("family: same\ndata: rows.jsonl\n")
    results = dict(validate_probe_files([tmp_path]))
    assert results[tmp_path / "a.yaml"] is None and "also defined by" in results[tmp_path / "b.yaml"]


def test_validate_does_not_import_a_model_stack():
    # (torch itself is currently imported by probeselect.toy/__init__.py via toy.world.)
    code = (
        "import sys; from pathlib import Path; from probeselect.probes._cli import validate_probe_files, show_items; "
        f"r = validate_probe_files([Path({str(REPO / 'probes')!r})]); show_items('tmpl_repeated'); "
        "assert all(e is None for _, e in r), r; "
        "print(sorted(m for m in ('transformers', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_show_items_by_family_name():
    out = show_items("tmpl_repeated", n=2)
    blocks = out.split("\n\n")
    assert len(blocks) == 6  # n items per variant, 3 variants
    assert blocks[0].startswith("=== tmpl_repeated/sentence/0000  (family tmpl_repeated, variant sentence, seed 0) ===")
    b = blocks[0].splitlines()
    assert b[1] == "--- prompt ---"
    assert re.match(r"^  \[task\] +' an? \w+'$", b[-3]) and re.match(r"^  \[shortcut\] +' an? \w+'$", b[-2])
    assert re.match(r"^  \[distractor\] +' an? \w+'$", b[-1])


def test_show_items_prompt_is_verbatim_and_seed_matters():
    from probeselect.probes import generate_items, spec_from_dict

    (it,) = [i for i in generate_items(spec_from_dict({"family": "tmpl_flipped", "n_items": 1, "variants": ["qa"]}), [4])]
    out = show_items("tmpl_flipped", seed=4, n=1, variant="qa")
    assert "\n" + it.prompt + "\n" in out and f"[task]       {it.task_answer!r}" in out
    assert out != show_items("tmpl_flipped", seed=5, n=1, variant="qa")


def test_show_items_from_spec_paths():
    out = show_items(str(REPO / "probes" / "examples" / "opposites_identity.yaml"), n=1, variant="arrow")
    assert out.startswith("=== user_opposites_identity/arrow/0000") and "[shortcut]   ' fast'" in out
    out = show_items(str(REPO / "probes" / "examples" / "opposites_csv.yaml"), n=5)
    assert out.count("=== ") == 3  # only 3 rows
    assert "[distractor] ' big'" in out


@pytest.mark.parametrize(
    "args, msg",
    [
        (("tmpl_repeatd",), 'Did you mean "tmpl_repeated"'),
        (("no_such.yaml",), "no_such.yaml: file not found"),
    ],
)
def test_show_items_errors(args, msg):
    with pytest.raises(ProbeSpecError, match=re.escape(msg)):
        show_items(*args)
    with pytest.raises(ProbeSpecError, match='no variant \'arow\'. Did you mean "arrow"'):
        show_items("tmpl_mismatch", variant="arow")
