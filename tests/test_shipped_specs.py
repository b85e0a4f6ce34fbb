"""Built-in spec files ship with the package and are found by name from any directory."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from probeselect.cli import main
from probeselect.errors import ProbeSpecError
from probeselect.probes import load_spec
from probeselect.probes._shipped import COLLECTIONS, SPEC_ROOT, resolve_probe_args, shipped_names

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "probeselect" / "probes"


def _repo_specs() -> dict[str, bytes]:
    root = REPO / "probes"
    files = sorted(root.glob("*.yaml")) + [p for c in COLLECTIONS for p in sorted((root / c).glob("*.yaml"))]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_package_copies_are_identical_to_probes_folder():
    repo = _repo_specs()
    shipped = {str(p.relative_to(SPEC_ROOT)): p.read_bytes() for p in SPEC_ROOT.rglob("*") if p.is_file()}
    assert repo, "probes/ has no spec files"
    missing = sorted(set(repo) - set(shipped))
    extra = sorted(set(shipped) - set(repo))
    differ = sorted(k for k in set(repo) & set(shipped) if repo[k] != shipped[k])
    fix = f"copy probes/<file> to {SPEC_ROOT.relative_to(REPO)}/<file> (the package's copy of the built-in specs)"
    assert not missing, f"not shipped: {missing}; {fix}"
    assert not extra, f"shipped but not in probes/: {extra}; delete them or add them to probes/"
    assert not differ, f"shipped copies differ from probes/: {differ}; {fix}"


def test_pyproject_package_data_covers_every_data_file():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    globs = cfg["tool"]["setuptools"]["package-data"]["probeselect.probes"]
    files = [str(p.relative_to(PKG)) for p in (PKG / "data").rglob("*") if p.is_file()]
    uncovered = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert files and not uncovered, f"not in pyproject package-data (an installed wheel would lack them): {uncovered}"


def test_probes_list_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["probes", "list"]) == 0
    out = capsys.readouterr().out
    assert "not found" not in out and "could not be loaded" not in out
    shipped = out.split("Specs shipped with the package")[1]
    for name in ("real", "real_successive", "real_truthy", "capability", "arith_plain"):
        assert f"\n{name} " in shipped


def test_probe_names_resolve_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = [load_spec(p) for p in resolve_probe_args(["real"])]
    assert sorted(s.family for s in real) == sorted(n for n in shipped_names() if n.startswith("real_"))
    assert len(real) == len(list((REPO / "probes" / "real").glob("*.yaml")))
    (succ,) = resolve_probe_args(["real_successive"])
    spec = load_spec(succ)
    # the shipped spec file (its variants and item count), not the family's bare defaults
    repo = load_spec(REPO / "probes" / "real" / "successive.yaml")
    assert (spec.family, spec.variants, spec.n_items, spec.params) == (repo.family, repo.variants, repo.n_items,
                                                                        repo.params)
    assert spec.spec_hash == repo.spec_hash
    # a string (run configs: `probes: real`) is one name, not a list of characters
    assert resolve_probe_args("real") == resolve_probe_args(["real"])


def test_existing_file_or_folder_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "mine.yaml").write_text("family: arith_pattern\nn_items: 3\n")
    assert resolve_probe_args(["real"]) == [Path("real") / "mine.yaml"]


def test_unknown_probe_name_lists_the_shipped_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProbeSpecError, match=r"real_sucessive.*Did you mean \"real_successive\".*real_truthy"):
        resolve_probe_args(["real_sucessive"])
    with pytest.raises(ProbeSpecError, match=r"probes/real/successive.yaml: no such spec file.*\"real_successive\""):
        resolve_probe_args(["probes/real/successive.yaml"])


def test_score_cli_accepts_a_family_name_from_another_directory(tmp_path, monkeypatch, capsys, ladder_checkpoints):
    monkeypatch.chdir(tmp_path)
    rc = main(["score", str(ladder_checkpoints[-1]), "--probes", "real_successive", "--seeds", "0",
               "--audit-items", "0", "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    import pandas as pd

    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    assert set(summary["family"]) == {"real_successive"}
    assert set(summary["variant"]) == set(load_spec(REPO / "probes" / "real" / "successive.yaml").variants)


def test_run_config_accepts_shipped_names(tmp_path, monkeypatch):
    from probeselect.run import _load_specs

    monkeypatch.chdir(tmp_path)
    specs = _load_specs({"probes": ["real_successive", "arith_plain"], "n_items": 2})
    assert [s.family for s in specs] == ["real_successive", "arith_plain"]
    assert all(s.n_items == 2 for s in specs)
