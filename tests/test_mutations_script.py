"""bench/mutations.py's bookkeeping: a pattern that is not found is reported as missing (never as a
kill), one found twice is not applied, code moved to another module is found there, and every
listed mutation names test files and a pattern that occurs exactly once in today's code."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("mutations", REPO / "bench" / "mutations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutations"] = mod  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_locate_reports_missing_ambiguous_and_moved(tmp_path):
    mod = _module()
    pkg = tmp_path / "src" / "probeselect"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\ny = 2\ny = 2\n")
    (pkg / "b.py").write_text("z = compute(3)\n")
    M = lambda old: mod.Mutation("m", "src/probeselect/a.py", old, "new", ("tests/t.py",), "why")  # noqa: E731
    assert mod.locate(tmp_path, M("x = 1")) == (pkg / "a.py", "ok")
    assert mod.locate(tmp_path, M("y = 2"))[1] == "ambiguous"
    assert mod.locate(tmp_path, M("z = compute(3)")) == (pkg / "b.py", "moved")
    assert mod.locate(tmp_path, M("not there")) == (None, "missing")


def test_every_listed_mutation_applies_once_to_the_current_code():
    mod = _module()
    names = [m.name for m in mod.MUTATIONS]
    assert len(names) == len(set(names))
    for m in mod.MUTATIONS:
        target, where = mod.locate(REPO, m)
        assert where in ("ok", "moved"), (m.name, where, "update the pattern in bench/mutations.py")
        assert m.old != m.new and m.tests and all((REPO / t).is_file() for t in m.tests), m.name
