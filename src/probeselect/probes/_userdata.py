"""Data-defined probe families: a small YAML spec plus a data file, no code.

Two forms (full description with worked examples in ``probes/README.md``):

**Row form** -- every row is one finished item::

    family: capitals_user          # a new name (not a built-in family)
    data: capitals.jsonl           # relative to this YAML file
    description: ...               # optional
    kind: conflict                 # optional: conflict (default) | capability
    variants: [default]            # optional: subset of the data's variants
    n_items: 10                    # optional: at most this many rows per variant (first rows)
    split: train                   # only for a `datasets` DatasetDict folder

The data is JSONL (``.jsonl``/``.ndjson``, one object per line), JSON (``.json``, a list
of objects), CSV (``.csv``, header row), parquet (``.parquet``/``.pq``) or a local
``datasets`` folder (``datasets.Dataset.save_to_disk``). Columns: ``prompt``,
``task_answer``, ``shortcut_answer`` (required); ``candidates`` (a list, or a
``|``-separated string in CSV), ``variant`` (default ``"default"``), ``item_id``
(optional) and any other columns (kept in item metadata). Rows are the same under every
evaluation seed; the seed is only recorded on the item.

**Template form** -- items are assembled per seed from pools::

    family: capitals_tmpl
    templates:                     # variant -> template (or `template:` for one variant "default")
      sentence: {demo: "{name} lives in {city}.", query: "{name} lives in", joiner: "\\n", prefix: ""}
    demo_pool: demos.jsonl         # a data file, or an inline list of mappings
    query_pool: queries.jsonl      # rows need task_answer, shortcut_answer (+ template fields)
    n_demos: 3                     # default min(4, demo pool size)
    n_items: 8                     # default: the query pool size (item i uses query row i)

The query of item ``i`` is query-pool row ``i``; its demonstrations are drawn without
replacement from the demo pool with ``item_rng(family, variant, seed, i)``. A demo row
whose fields named in the query template all equal the query row's is never used for
that query (so a demonstration cannot give the answer away). A demo template may also
refer to the query row as ``{query[field]}``.

Answers are used exactly as written: the word-boundary space belongs to the answer
(``" Oslo"``). An answer without it is the user's choice (as in lm-eval) and is not
changed; an empty or whitespace-only answer, ``task_answer == shortcut_answer``, a
missing column and duplicate candidates are errors that name the file, the 1-based data
row and the column. So is a prompt that ends in whitespace followed by an answer that
starts with whitespace (the model would see two spaces).
"""

from __future__ import annotations

import csv
import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .._io import canonical_json_hash, check_data_symlink
from ..errors import ProbeSpecError, did_you_mean
from ..items import ProbeItem, item_rng
from ._registry import Family, is_builtin_family, register_user_family
from ._spec import FamilySpec

ROW_KEYS = ("family", "description", "kind", "data", "split", "n_items", "variants")
TEMPLATE_KEYS = ("family", "description", "kind", "template", "templates", "demo_pool", "query_pool",
                 "n_items", "n_demos", "variants")
ALL_USER_KEYS = tuple(sorted(set(ROW_KEYS) | set(TEMPLATE_KEYS)))
TEMPLATE_FIELDS = ("demo", "query", "joiner", "prefix")
ROW_COLUMNS = ("prompt", "task_answer", "shortcut_answer", "candidates", "variant", "item_id")
DEFAULT_VARIANT = "default"
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".pq")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_SRC = "\0src"  # key of the original row inside a pool entry while loading
_PLACEHOLDER = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([A-Za-z_][A-Za-z0-9_]*)\])?$")


@dataclass(frozen=True, eq=False)
class UserData:
    """The parsed data of a data-defined family (held by ``FamilySpec.user_data``).

    ``form`` is ``"rows"`` or ``"template"``. Row form: ``rows`` are normalized rows
    (``row`` = 1-based data row number). Template form: ``templates`` maps variant ->
    template mapping, ``demo_pool``/``query_pool`` are the pool rows and ``eligible[k]``
    the demo-pool indices usable with query row ``k``. ``content_hash`` hashes everything
    that shapes the items; two UserData are equal iff form and content hash are.
    """

    form: str
    kind: str
    files: tuple[str, ...]
    content_hash: str
    rows: tuple[dict, ...] = ()
    templates: dict = field(default_factory=dict)
    demo_pool: tuple[dict, ...] = ()
    query_pool: tuple[dict, ...] = ()
    eligible: tuple[tuple[int, ...], ...] = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserData) and (self.form, self.content_hash) == (other.form, other.content_hash)

    def __hash__(self) -> int:
        return hash((self.form, self.content_hash))

    def counts(self) -> dict[str, int]:
        """Available items per variant (before any ``n_items`` cap)."""
        if self.form == "rows":
            out: dict[str, int] = {}
            for r in self.rows:
                out[r["variant"]] = out.get(r["variant"], 0) + 1
            return out
        return {v: len(self.query_pool) for v in self.templates}

    def summary(self) -> dict[str, Any]:
        d: dict[str, Any] = {"form": self.form, "kind": self.kind, "files": list(self.files),
                             "content_sha256": self.content_hash}
        if self.form == "rows":
            d["n_rows"] = len(self.rows)
        else:
            d["n_queries"] = len(self.query_pool)
            d["n_demo_pool"] = len(self.demo_pool)
        return d

    def register(self, spec: FamilySpec) -> None:
        """Register ``spec``'s family (called by ``FamilySpec`` when it is built)."""
        register_user_spec(spec)


# ---------------------------------------------------------------------------
# Reading tables
# ---------------------------------------------------------------------------


def _jsonable(v: Any) -> Any:
    """Plain Python/JSON values (numpy scalars and arrays from parquet become Python)."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist"):
        return _jsonable(v.tolist())
    if hasattr(v, "item"):
        return _jsonable(v.item())
    return str(v)


def read_table(path: Path, *, label: str, split: str | None = None) -> tuple[list[tuple[int, dict]], bool]:
    """Rows of a data file as ``[(row_number, mapping)]`` and whether it was a CSV.

    ``row_number`` is the 1-based data row (the CSV header is not a row; blank JSONL
    lines are skipped but the message also gives the line number).
    """
    if not path.exists():
        raise ProbeSpecError(f"{label}: data file not found (resolved to {path.resolve()}); data paths are relative to the YAML file.")
    try:
        return _read_table(path, label=label, split=split)
    except UnicodeDecodeError as exc:
        raise ProbeSpecError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-save the file as "
                             "UTF-8.") from None
    except OSError as exc:
        raise ProbeSpecError(f"{label}: cannot read the data file ({exc.strerror or exc}).") from None


def _read_table(path: Path, *, label: str, split: str | None) -> tuple[list[tuple[int, dict]], bool]:
    if path.is_dir():
        return _read_datasets_dir(path, label=label, split=split), False
    if split is not None:
        raise ProbeSpecError(f"{label}: `split:` only applies to a `datasets` folder; remove it.")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(path, label), False
    if suffix == ".json":
        return _read_json(path, label), False
    if suffix == ".csv":
        return _read_csv(path, label), True
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise ProbeSpecError(f"{label}: cannot read parquet file ({exc}).") from None
        return [(k + 1, _jsonable(r)) for k, r in enumerate(table.to_pylist())], False
    raise ProbeSpecError(
        f"{label}: unsupported data format {suffix or '(no suffix)'!r}; use one of {list(DATA_SUFFIXES)} "
        "or a folder written by datasets' save_to_disk."
    )


def _read_jsonl(path: Path, label: str) -> list[tuple[int, dict]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            n = len(rows) + 1
            where = f"row {n}" + (f" (line {line_no})" if line_no != n else "")
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbeSpecError(f"{label}: {where}: invalid JSON ({exc.msg}); each line must be one JSON object.") from None
            if not isinstance(obj, dict):
                raise ProbeSpecError(f"{label}: {where}: expected a JSON object, got {type(obj).__name__}.")
            obj["\0where"] = where
            rows.append((n, obj))
    return rows


def _read_json(path: Path, label: str) -> list[tuple[int, dict]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProbeSpecError(f"{label}: invalid JSON at line {exc.lineno} ({exc.msg}).") from None
    if not isinstance(data, list):
        raise ProbeSpecError(f"{label}: a .json data file must hold a list of objects (or use JSONL).")
    for k, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise ProbeSpecError(f"{label}: row {k}: expected a JSON object, got {type(obj).__name__}.")
    return list(enumerate(data, 1))


def _read_csv(path: Path, label: str) -> list[tuple[int, dict]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ProbeSpecError(f"{label}: empty CSV file; the first line must be a header row.") from None
        dup = sorted({h for h in header if header.count(h) > 1})
        if dup:
            raise ProbeSpecError(f"{label}: duplicate CSV column {dup[0]!r} in the header.")
        rows = []
        for n, values in enumerate(reader, 1):
            if not values:
                raise ProbeSpecError(f"{label}: row {n}: empty CSV line; remove it.")
            if len(values) != len(header):
                raise ProbeSpecError(
                    f"{label}: row {n}: has {len(values)} fields but the header has {len(header)}; "
                    "quote fields that contain commas."
                )
            rows.append((n, dict(zip(header, values))))
    return rows


def _read_datasets_dir(path: Path, *, label: str, split: str | None) -> list[tuple[int, dict]]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise ProbeSpecError(f"{label}: reading a dataset folder needs the `datasets` package.") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # not a save_to_disk folder
        raise ProbeSpecError(
            f"{label}: is a folder but not a `datasets` save_to_disk folder ({type(exc).__name__}: {exc}); "
            f"point `data:` at a file ({', '.join(DATA_SUFFIXES)}) or such a folder."
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if split is None:
            if len(splits) != 1:
                raise ProbeSpecError(f"{label}: the dataset has splits {splits}; choose one with `split:`.")
            split = splits[0]
        if split not in ds:
            raise ProbeSpecError(f"{label}: no split {split!r}.{did_you_mean(split, splits)} Splits: {splits}.")
        ds = ds[split]
    elif split is not None:
        raise ProbeSpecError(f"{label}: `split: {split}` given but the dataset has no splits; remove it.")
    return [(k + 1, _jsonable(r)) for k, r in enumerate(ds.to_list())]


# ---------------------------------------------------------------------------
# Row checks
# ---------------------------------------------------------------------------


def _where(label: str, n: int, row: dict) -> str:
    return f"{label}: {row.get(chr(0) + 'where', f'row {n}')}"


def _missing_column(label: str, n: int, row: dict, col: str, what: str = "") -> ProbeSpecError:
    cols = [c for c in row if not c.startswith("\0")]
    return ProbeSpecError(
        f"{_where(label, n, row)}, column {col!r}: missing{what}.{did_you_mean(col, cols)} Columns present: {cols}."
    )


def _answer(label: str, n: int, row: dict, col: str) -> str:
    if col not in row or row[col] is None:
        raise _missing_column(label, n, row, col)
    v = row[col]
    if not isinstance(v, str):
        raise ProbeSpecError(
            f"{_where(label, n, row)}, column {col!r}: must be a string, got {v!r}; write it as the exact "
            f"continuation, e.g. {' ' + str(v)!r}."
        )
    if not v.strip():
        raise ProbeSpecError(f"{_where(label, n, row)}, column {col!r}: empty answer {v!r}; give the continuation text, e.g. ' Oslo'.")
    return v


def _candidates(label: str, n: int, row: dict, is_csv: bool, task: str, shortcut: str) -> tuple[str, ...]:
    raw = row.get("candidates")
    if raw is None or raw == "":
        given: list = []
    elif isinstance(raw, str):
        if not is_csv:
            raise ProbeSpecError(
                f"{_where(label, n, row)}, column 'candidates': must be a list of strings "
                "(a '|'-separated string is accepted only in CSV files)."
            )
        given = raw.split("|")
    elif isinstance(raw, list):
        given = raw
    else:
        raise ProbeSpecError(f"{_where(label, n, row)}, column 'candidates': must be a list of strings, got {raw!r}.")
    for c in given:
        if not isinstance(c, str) or not c.strip():
            raise ProbeSpecError(
                f"{_where(label, n, row)}, column 'candidates': every candidate must be a non-empty string, got {c!r}."
            )
    dup = sorted({c for c in given if given.count(c) > 1})
    if dup:
        raise ProbeSpecError(f"{_where(label, n, row)}, column 'candidates': duplicate candidate {dup[0]!r}.")
    return (task, shortcut) + tuple(c for c in given if c not in (task, shortcut))


def _answers(label: str, n: int, row: dict, is_csv: bool) -> tuple[str, str, tuple[str, ...]]:
    task = _answer(label, n, row, "task_answer")
    shortcut = _answer(label, n, row, "shortcut_answer")
    if task == shortcut:
        raise ProbeSpecError(
            f"{_where(label, n, row)}, column 'shortcut_answer': equals task_answer ({task!r}); a conflict item "
            "needs a different shortcut."
        )
    return task, shortcut, _candidates(label, n, row, is_csv, task, shortcut)


def _check_join(label: str, n: int, row: dict, prompt: str, candidates: tuple[str, ...], col: str) -> None:
    if prompt[-1:].isspace() and any(c[:1].isspace() for c in candidates):
        raise ProbeSpecError(
            f"{_where(label, n, row)}, column {col!r}: the prompt ends with whitespace and an answer starts with "
            "whitespace, so the model would see both; drop the trailing space from the prompt."
        )


def _opt_name(label: str, n: int, row: dict, col: str, default: str | None) -> str | None:
    v = row.get(col)
    if v is None or v == "":
        return default
    if col == "variant":
        if not isinstance(v, str) or not _NAME.match(v):
            raise ProbeSpecError(
                f"{_where(label, n, row)}, column 'variant': {v!r} is not a valid variant name "
                "(letters, digits, '_', '.', '-', starting with a letter)."
            )
        return v
    if not isinstance(v, (str, int)) or isinstance(v, bool):
        raise ProbeSpecError(f"{_where(label, n, row)}, column {col!r}: must be a string or an integer, got {v!r}.")
    return str(v)


def _extras(row: dict, skip) -> dict:
    return {k: _jsonable(v) for k, v in row.items() if k not in skip and not k.startswith("\0")}


# ---------------------------------------------------------------------------
# Spec loading
# ---------------------------------------------------------------------------


def _strict_keys(raw: dict, allowed, source: str, form: str) -> None:
    unknown = sorted(set(raw) - set(allowed), key=str)
    if unknown:
        k = str(unknown[0])
        other = set(ALL_USER_KEYS) - set(allowed)
        if k in other or k == "params":
            raise ProbeSpecError(f"{source}: key {k!r} does not apply to a {form}-form data family; remove it. Allowed keys: {sorted(allowed)}.")
        raise ProbeSpecError(f"{source}: unknown key {k!r}.{did_you_mean(k, allowed)} Allowed keys: {sorted(allowed)}.")


def _family_name(raw: dict, source: str) -> str:
    if "family" not in raw:
        raise ProbeSpecError(f"{source}: missing required key `family` (the name of your data-defined family).")
    name = raw["family"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProbeSpecError(
            f"{source}: `family: {name!r}` is not a valid family name; use letters, digits, '_', '.', '-' "
            "(starting with a letter, no '/')."
        )
    if is_builtin_family(name):
        raise ProbeSpecError(
            f"{source}: family name {name!r} is already a built-in probe family; give your data-defined family "
            f"another name (e.g. {name + '_custom'!r}), or drop the data keys to configure the built-in one."
        )
    return name


def _kind(raw: dict, source: str) -> str:
    from ._registry import KINDS

    kind = raw.get("kind", "conflict")
    if kind not in KINDS:
        raise ProbeSpecError(f"{source}: `kind` must be one of {list(KINDS)}, got {kind!r}.")
    return kind


def _int_key(raw: dict, key: str, source: str, default: int, lo: int, hi: int | None = None, why: str = "") -> int:
    v = raw.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ProbeSpecError(f"{source}: `{key}` must be an integer {rng}{why}, got {v!r}.")
    return v


def _variants_key(raw: dict, available: list[str], source: str, what: str) -> tuple[str, ...]:
    vs = raw.get("variants", available)
    if isinstance(vs, str):
        vs = [vs]
    if not isinstance(vs, list) or not vs:
        raise ProbeSpecError(f"{source}: `variants` must be a non-empty list of {what} {available}.")
    for v in vs:
        if v not in available:
            raise ProbeSpecError(
                f"{source}: no variant {v!r} in {what}.{did_you_mean(str(v), available)} Available: {available}."
            )
    if len(set(vs)) != len(vs):
        raise ProbeSpecError(f"{source}: `variants` lists a variant twice.")
    return tuple(vs)


def _resolve(raw_path: Any, key: str, source: str, path: Path | None) -> tuple[Path, str]:
    if not isinstance(raw_path, str) or not raw_path.strip():
        raise ProbeSpecError(f"{source}: `{key}` must be a path to a data file (relative to the YAML file).")
    p = Path(raw_path).expanduser()
    base = path.parent if path is not None else Path.cwd()
    full = p if p.is_absolute() else base / p
    check_data_symlink(full, base, label=f"{source}: `{key}`", error_cls=ProbeSpecError)
    return full, str(full)


def user_spec_from_dict(raw: dict, *, source: str = "<dict>", path: Path | None = None) -> FamilySpec:
    """Validate a data-defined (user) spec and load its data into a FamilySpec.

    Called by ``spec_from_dict`` when the mapping has ``data:`` (row form) or
    ``template:``/``templates:``/``demo_pool:``/``query_pool:`` (template form).
    """
    if "data" in raw:
        tmpl_keys = [k for k in ("template", "templates", "demo_pool", "query_pool") if k in raw]
        if tmpl_keys:
            raise ProbeSpecError(
                f"{source}: `data:` (row form) cannot be combined with `{tmpl_keys[0]}:` (template form); use one form."
            )
        return _row_spec(raw, source, path)
    return _template_spec(raw, source, path)


def _row_spec(raw: dict, source: str, path: Path | None) -> FamilySpec:
    _strict_keys(raw, ROW_KEYS, source, "row")
    name = _family_name(raw, source)
    kind = _kind(raw, source)
    split = raw.get("split")
    if split is not None and not isinstance(split, str):
        raise ProbeSpecError(f"{source}: `split` must be a split name, got {split!r}.")
    full, label = _resolve(raw["data"], "data", source, path)
    table, is_csv = read_table(full, label=label, split=split)
    if not table:
        raise ProbeSpecError(f"{label}: the data file has no rows.")
    rows: list[dict] = []
    ids: dict[tuple[str, str], int] = {}
    per_variant: dict[str, int] = {}
    for n, row in table:
        prompt = row.get("prompt")
        if prompt is None:
            raise _missing_column(label, n, row, "prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ProbeSpecError(f"{_where(label, n, row)}, column 'prompt': must be a non-empty string, got {prompt!r}.")
        task, shortcut, cands = _answers(label, n, row, is_csv)
        _check_join(label, n, row, prompt, cands, "prompt")
        variant = _opt_name(label, n, row, "variant", DEFAULT_VARIANT)
        uid = _opt_name(label, n, row, "item_id", None)
        k = per_variant.get(variant, 0)
        per_variant[variant] = k + 1
        local_id = uid if uid is not None else f"{k:04d}"
        if (variant, local_id) in ids:
            raise ProbeSpecError(
                f"{_where(label, n, row)}, column 'item_id': item id {local_id!r} of variant {variant!r} repeats "
                f"row {ids[(variant, local_id)]}; item ids must be unique."
            )
        ids[(variant, local_id)] = n
        rows.append({
            "row": n, "variant": variant, "local_id": local_id, "prompt": prompt, "task_answer": task,
            "shortcut_answer": shortcut, "candidates": list(cands), "fields": _extras(row, ROW_COLUMNS),
        })
    available = list(per_variant)
    variants = _variants_key(raw, available, source, "the data's variants")
    n_items = _int_key(raw, "n_items", source, max(per_variant[v] for v in variants), 1,
                       why=" (at most this many rows per variant)")
    content = canonical_json_hash({"form": "rows", "rows": rows})
    ud = UserData(form="rows", kind=kind, files=(str(raw["data"]),), content_hash=content, rows=tuple(rows))
    return FamilySpec(
        family=name, n_items=n_items, n_demos=0, variants=variants, params={},
        description=str(raw.get("description", "")), path=path, user_data=ud,
    )


def _placeholders(tpl: str, where: str) -> list[tuple[str, str | None]]:
    try:
        parsed = list(string.Formatter().parse(tpl))
    except ValueError as exc:
        raise ProbeSpecError(f"{where}: bad template {tpl!r} ({exc}); write literal braces as '{{{{' and '}}}}'.") from None
    out = []
    for _, fname, _, _ in parsed:
        if fname is None:
            continue
        m = _PLACEHOLDER.match(fname)
        if not m:
            raise ProbeSpecError(
                f"{where}: unsupported placeholder {{{fname}}} in {tpl!r}; use {{field}} (or {{query[field]}} in a demo "
                "template), and '{{{{'/'}}}}' for literal braces."
            )
        out.append((m.group(1), m.group(2)))
    return out


def _templates(raw: dict, source: str) -> dict[str, dict]:
    if "template" in raw and "templates" in raw:
        raise ProbeSpecError(f"{source}: give either `template:` (one variant) or `templates:` (variant -> template), not both.")
    if "template" in raw:
        named = {DEFAULT_VARIANT: raw["template"]}
    elif "templates" in raw:
        named = raw["templates"]
        if not isinstance(named, dict) or not named:
            raise ProbeSpecError(f"{source}: `templates` must map variant names to templates ({{demo: ..., query: ...}}).")
    else:
        raise ProbeSpecError(
            f"{source}: a template-form family needs `template: {{demo: ..., query: ...}}` (or `templates:`); "
            "a row-form family needs `data:`."
        )
    out = {}
    for vname, t in named.items():
        where = f"{source}: template {vname!r}"
        if not isinstance(vname, str) or not _NAME.match(vname):
            raise ProbeSpecError(f"{source}: {vname!r} is not a valid variant name (letters, digits, '_', '.', '-').")
        if not isinstance(t, dict):
            raise ProbeSpecError(f"{where} must be a mapping with `demo` and `query` strings.")
        unknown = sorted(set(t) - set(TEMPLATE_FIELDS), key=str)
        if unknown:
            raise ProbeSpecError(f"{where}: unknown key {unknown[0]!r}.{did_you_mean(str(unknown[0]), TEMPLATE_FIELDS)} Allowed: {list(TEMPLATE_FIELDS)}.")
        for k in ("demo", "query"):
            if not isinstance(t.get(k), str) or not t[k].strip():
                raise ProbeSpecError(f"{where}: `{k}` must be a non-empty string.")
        tt = {"demo": t["demo"], "query": t["query"], "joiner": t.get("joiner", "\n"), "prefix": t.get("prefix", "")}
        for k in ("joiner", "prefix"):
            if not isinstance(tt[k], str):
                raise ProbeSpecError(f"{where}: `{k}` must be a string.")
        out[vname] = tt
    return out


def _pool(raw: dict, key: str, source: str, path: Path | None) -> tuple[list[tuple[int, dict]], str, bool, str]:
    if key not in raw:
        raise ProbeSpecError(f"{source}: missing `{key}:` (a data file or an inline list of mappings).")
    v = raw[key]
    if isinstance(v, list):
        label = f"{source} ({key})"
        for k, r in enumerate(v, 1):
            if not isinstance(r, dict):
                raise ProbeSpecError(f"{label}: row {k}: expected a mapping, got {r!r}.")
            bad = [c for c in r if not isinstance(c, str)]
            if bad:
                raise ProbeSpecError(f"{label}: row {k}: column names must be strings, got {bad[0]!r}; quote it.")
        table, is_csv, file = list(enumerate(v, 1)), False, f"<inline {key}>"
    else:
        full, label = _resolve(v, key, source, path)
        table, is_csv = read_table(full, label=label)
        file = str(v)
    if not table:
        raise ProbeSpecError(f"{label}: `{key}` has no rows.")
    return table, label, is_csv, file


def _field_str(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(_jsonable(v)) if isinstance(v, (list, dict)) else str(_jsonable(v))


def _template_spec(raw: dict, source: str, path: Path | None) -> FamilySpec:
    _strict_keys(raw, TEMPLATE_KEYS, source, "template")
    name = _family_name(raw, source)
    kind = _kind(raw, source)
    templates = _templates(raw, source)
    dtable, dlabel, _, dfile = _pool(raw, "demo_pool", source, path)
    qtable, qlabel, q_csv, qfile = _pool(raw, "query_pool", source, path)

    queries: list[dict] = []
    for n, row in qtable:
        task, shortcut, cands = _answers(qlabel, n, row, q_csv)
        uid = _opt_name(qlabel, n, row, "item_id", None)
        fields = {k: _field_str(v) for k, v in row.items()
                  if k not in ("candidates", "item_id") and not k.startswith("\0") and v is not None}
        queries.append({"row": n, "task_answer": task, "shortcut_answer": shortcut, "candidates": list(cands),
                        "item_id": uid, "fields": fields, _SRC: row})
    demos = [{"row": n, "fields": {k: _field_str(v) for k, v in row.items() if not k.startswith("\0") and v is not None},
              _SRC: row} for n, row in dtable]

    query_names: set[str] = set()
    for vname, t in templates.items():
        where = f"{source}: template {vname!r}"
        qph = _placeholders(t["query"], where + " query")
        dph = _placeholders(t["demo"], where + " demo")
        for root, key in qph:
            if key is not None:
                raise ProbeSpecError(f"{where}: the query template can use only plain fields, not {{{root}[{key}]}}.")
            query_names.add(root)
            for q in queries:
                if root not in q["fields"]:
                    raise _missing_column(qlabel, q["row"], q[_SRC], root, f" (used by template {vname!r} as {{{root}}})")
        for root, key in dph:
            if root == "query":
                if key is None:
                    raise ProbeSpecError(f"{where}: in a demo template `query` is reserved; use {{query[field]}} for a query-row field.")
                for q in queries:
                    if key not in q["fields"]:
                        raise _missing_column(qlabel, q["row"], q[_SRC], key, f" (used by template {vname!r} as {{query[{key}]}})")
                continue
            if key is not None:
                raise ProbeSpecError(f"{where}: {{{root}[{key}]}} is not supported; only {{query[field]}} may index.")
            for d in demos:
                if root not in d["fields"]:
                    raise _missing_column(dlabel, d["row"], d[_SRC], root, f" (used by template {vname!r} as {{{root}}})")

    # A demo row is not used for a query when all fields the query template names agree.
    eligible = []
    for q in queries:
        keys = [k for k in sorted(query_names) if k in q["fields"]]
        ok = []
        for j, d in enumerate(demos):
            shared = [k for k in keys if k in d["fields"]]
            if shared and all(d["fields"][k] == q["fields"][k] for k in shared):
                continue
            ok.append(j)
        eligible.append(tuple(ok))

    n_items = _int_key(raw, "n_items", source, len(queries), 1, len(queries),
                       why=f" (item i uses query-pool row i; the pool has {len(queries)} rows)")
    n_demos = _int_key(raw, "n_demos", source, min(4, min(len(e) for e in eligible[:n_items])), 0, len(demos),
                       why=f" (demonstrations are drawn without replacement from {len(demos)} demo rows)")
    for k in range(n_items):
        if len(eligible[k]) < n_demos:
            q = queries[k]
            raise ProbeSpecError(
                f"{_where(qlabel, q['row'], q[_SRC])}: only {len(eligible[k])} demo rows can go with this query "
                f"(the others repeat its fields {sorted(query_names)}), fewer than n_demos: {n_demos}; lower n_demos "
                "or add demo rows."
            )
    variants = _variants_key(raw, list(templates), source, "the templates")

    # Item-level checks on the query alone (demonstrations are rendered at generation).
    for vname in variants:
        t = templates[vname]
        for q in queries[:n_items]:
            prompt = t["query"].format(**q["fields"])
            _check_join(qlabel, q["row"], q[_SRC], prompt, tuple(q["candidates"]), f"template {vname!r} query")
    ids: dict[str, int] = {}
    for q in queries:
        if q["item_id"] is not None:
            if q["item_id"] in ids:
                raise ProbeSpecError(
                    f"{_where(qlabel, q['row'], q[_SRC])}, column 'item_id': {q['item_id']!r} repeats row {ids[q['item_id']]}."
                )
            ids[q["item_id"]] = q["row"]
    for q in queries:
        q.pop(_SRC)
    for d in demos:
        d.pop(_SRC)
    content = canonical_json_hash({"form": "template", "templates": templates, "demo_pool": demos, "query_pool": queries})
    ud = UserData(
        form="template", kind=kind, files=(dfile, qfile), content_hash=content, templates=templates,
        demo_pool=tuple(demos), query_pool=tuple(queries), eligible=tuple(eligible),
    )
    return FamilySpec(
        family=name, n_items=n_items, n_demos=n_demos, variants=variants, params={},
        description=str(raw.get("description", "")), path=path, user_data=ud,
    )


# ---------------------------------------------------------------------------
# Registration and generation
# ---------------------------------------------------------------------------


def register_user_spec(spec: FamilySpec) -> None:
    """Register ``spec``'s data-defined family so that ``get_family(spec.family)`` finds it."""
    ud: UserData = spec.user_data
    desc = spec.description.strip().splitlines()[0] if spec.description.strip() else (
        f"data-defined ({ud.form} form): {', '.join(ud.files)}"
    )
    register_user_family(
        Family(
            name=spec.family,
            generate=generate_user_items,
            variants=tuple(ud.counts()),
            default_n_items=spec.n_items,
            default_n_demos=spec.n_demos,
            description=desc,
            kind=ud.kind,
        ),
        source=str(spec.path) if spec.path else "",
    )


def generate_user_items(spec: FamilySpec, seed: int) -> Iterator[ProbeItem]:
    """Items of a data-defined family for one evaluation seed (variant, then index order)."""
    ud: UserData | None = spec.user_data
    if ud is None:
        raise ProbeSpecError(
            f"family {spec.family!r} is data-defined; load it from its spec file with load_spec(...) "
            "instead of building a FamilySpec by name."
        )
    fam = spec.family
    if ud.form == "rows":
        for variant in spec.variants:
            rows = [r for r in ud.rows if r["variant"] == variant][: spec.n_items]
            for r in rows:
                yield ProbeItem(
                    item_id=f"{fam}/{variant}/{r['local_id']}",
                    family=fam,
                    variant=variant,
                    seed=seed,
                    prompt=r["prompt"],
                    task_answer=r["task_answer"],
                    shortcut_answer=r["shortcut_answer"],
                    candidates=tuple(r["candidates"]),
                    metadata={"source": ud.files[0], "row": r["row"], "fields": r["fields"]},
                )
        return
    for variant in spec.variants:
        t = ud.templates[variant]
        for i in range(spec.n_items):
            q = ud.query_pool[i]
            rd = item_rng(fam, variant, seed, i)
            chosen = rd.sample(list(ud.eligible[i]), spec.n_demos)
            lines = [t["demo"].format(**{**ud.demo_pool[j]["fields"], "query": q["fields"]}) for j in chosen]
            lines.append(t["query"].format(**q["fields"]))
            local_id = q["item_id"] if q["item_id"] is not None else f"{i:04d}"
            yield ProbeItem(
                item_id=f"{fam}/{variant}/{local_id}",
                family=fam,
                variant=variant,
                seed=seed,
                prompt=t["prefix"] + t["joiner"].join(lines),
                task_answer=q["task_answer"],
                shortcut_answer=q["shortcut_answer"],
                candidates=tuple(q["candidates"]),
                metadata={
                    "query_row": q["row"],
                    "demo_rows": [ud.demo_pool[j]["row"] for j in chosen],
                    "sources": list(ud.files),
                },
            )


__all__ = ["UserData", "generate_user_items", "read_table", "register_user_spec", "user_spec_from_dict"]
