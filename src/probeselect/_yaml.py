"""A strict YAML loader: duplicate keys are an error, not a silent overwrite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ProbeSpecError


class _StrictLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first defined on line {seen[key] + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: Path, error_cls: type[Exception] = ProbeSpecError) -> Any:
    """Load a YAML file safely, rejecting duplicate keys with a message naming the file."""
    path = Path(path)
    if not path.is_file():
        raise error_cls(f"{path}: file not found.")
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        where = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark else ""
        raise error_cls(f"{path}: invalid YAML: {where}{exc.problem}. Fix the file.") from None
    except yaml.YAMLError as exc:
        raise error_cls(f"{path}: invalid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise error_cls(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-save the file as UTF-8.") from None
    except OSError as exc:
        raise error_cls(f"{path}: cannot read ({exc.strerror or exc}).") from None


def literal_value(text: str) -> Any:
    """The value of a ``key=value`` override whose key expects a path (or other free text):
    the text itself (surrounding whitespace removed; empty or ``null`` = None), so ``/data/lad #1/x.jsonl``
    or ``/data/a: b/x.jsonl`` are kept whole instead of being cut by YAML's comment and
    mapping syntax. Only a YAML flow mapping or list (``{...}``/``[...]`` that parses as one) is
    read as YAML, so ``ladder={toy: {seed: 1}}`` still works."""
    t = text.strip()
    if not t or t in ("null", "Null", "NULL", "~"):  # unsetting a path (e.g. transfer.heldout=null)
        return None
    if t[0] in "{[":
        try:
            v = yaml.safe_load(t)
        except yaml.YAMLError:
            return t
        if isinstance(v, (dict, list)) and not (isinstance(v, dict) and list(v.values()) == [None]):
            return v
    return t


def apply_dotted_overrides(raw: dict, overrides, *, top_keys, error_cls: type[Exception], example: str,
                           unknown_key_message, path_keys=frozenset()) -> dict:
    """A deep copy of ``raw`` with ``a.b.c=value`` overrides applied (values parsed as YAML,
    an empty value is None; missing intermediate mappings are created). Keys in ``path_keys``
    (dotted, e.g. ``data.train``) expect a path: their value is taken literally
    (:func:`literal_value`), never parsed as YAML.

    ``top_keys``: the allowed first components; ``unknown_key_message(override, key)`` gives
    the error text for another one. ``example`` is shown for an override without ``=``.
    """
    import copy

    out = copy.deepcopy(raw)
    for ov in overrides:
        key, sep, text = ov.partition("=")
        key = key.strip()
        if not sep or not key:
            raise error_cls(f"override {ov!r}: expected key=value, e.g. {example}.")
        try:
            value = (literal_value(text) if key in path_keys else
                     yaml.safe_load(text) if text.strip() else None)
        except yaml.YAMLError as exc:
            raise error_cls(f"override {ov!r}: value is not valid YAML ({exc}).") from None
        parts = key.split(".")
        if parts[0] not in top_keys:
            raise error_cls(unknown_key_message(ov, parts[0]))
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out
