import os

import pytest

from probeselect._io import atomic_write_text, canonical_json_hash
from probeselect._yaml import load_yaml
from probeselect.errors import ProbeSpecError


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    f = tmp_path / "x.txt"
    atomic_write_text(f, "old")

    def boom(src, dst):
        raise KeyboardInterrupt  # as if killed between write and rename

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(f, "new")
    assert f.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]  # no temp file left behind


def test_canonical_hash_ignores_key_order():
    assert canonical_json_hash({"a": 1, "b": [1, 2]}) == canonical_json_hash({"b": [1, 2], "a": 1})
    assert canonical_json_hash({"a": 1}) != canonical_json_hash({"a": 2})


def test_yaml_errors_name_file_and_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(ProbeSpecError, match=r"s\.yaml: invalid YAML: line \d+"):
        load_yaml(f)
    with pytest.raises(ProbeSpecError, match="file not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_atomic_files_get_normal_permissions(tmp_path):
    f = tmp_path / "y.txt"
    atomic_write_text(f, "x")
    mask = os.umask(0)
    os.umask(mask)
    assert f.stat().st_mode & 0o777 == 0o666 & ~mask
