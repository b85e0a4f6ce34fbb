"""Discover, order, fingerprint and validate a directory of saved checkpoints.

``discover_checkpoints(path)`` turns a directory into an ordered list of
:class:`Checkpoint` records. It understands

* HF Trainer folders ``checkpoint-<N>``;
* OLMo folders ``step<N>-tokens<M>B`` and ``stage1-step<N>-tokens<M>B``;
* ``step<N>``, ``global_step<N>`` and Megatron ``iter_<N>`` (e.g. ``iter_0001000``);
* a single HF model folder (the directory itself holds the weights);
* any HF model folder whose step (and tokens) are recorded in ``trainer_state.json``
  (``global_step``, ``num_input_tokens_seen``) or ``probeselect_checkpoint.json``
  (``step``, ``tokens``).

Checkpoints are ordered numerically by step (``checkpoint-9`` before ``checkpoint-10``).
Each gets a content fingerprint that is cheap even for multi-GB weights: file names and
sizes, the safetensors headers (which hold every tensor's name, dtype, shape and byte
range), 16 sampled 64 KiB blocks of every weight file (whole files up to 2 MiB), a hash
of ``config.json`` and the tokenizer's content hash. Truncated or corrupt
safetensors files are detected from their header without reading the tensors.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ._io import canonical_json_hash, sha256_file
from .errors import CheckpointError, TokenizerMismatchError

__all__ = [
    "Checkpoint",
    "discover_checkpoints",
    "fingerprint_checkpoint",
    "tokenizer_hash",
    "parse_checkpoint_name",
]

# (regex, has_tokens). Tokens in OLMo names are in billions.
_NAME_PATTERNS: list[tuple[re.Pattern[str], bool]] = [
    (re.compile(r"^checkpoint-(\d+)$"), False),
    (re.compile(r"^(?:stage\d+-)?step(\d+)-tokens(\d+(?:\.\d+)?)B$"), True),
    (re.compile(r"^global_step(\d+)$"), False),
    (re.compile(r"^step(\d+)$"), False),
    (re.compile(r"^iter_(\d+)$"), False),
]

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "spiece.model",
)
_TOKENIZER_CONFIG_KEYS = (
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "add_bos_token",
    "add_eos_token",
    "added_tokens_decoder",
    "tokenizer_class",
)


@dataclass(frozen=True)
class Checkpoint:
    """One saved checkpoint.

    ``step`` is the optimizer step; ``tokens`` is the number of training tokens seen
    (None when neither the folder name nor its metadata records it).
    """

    name: str
    path: Path
    step: int | None
    tokens: int | None
    fingerprint: str
    tokenizer_hash: str | None
    weight_files: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "step": self.step,
            "tokens": self.tokens,
            "fingerprint": self.fingerprint,
            "tokenizer_hash": self.tokenizer_hash,
            "weight_files": list(self.weight_files),
        }


def parse_checkpoint_name(name: str) -> tuple[int, int | None] | None:
    """Return ``(step, tokens)`` parsed from a folder name, or None if it matches no pattern."""
    for pattern, has_tokens in _NAME_PATTERNS:
        m = pattern.match(name)
        if m:
            step = int(m.group(1))
            tokens = int(round(float(m.group(2)) * 1e9)) if has_tokens else None
            return step, tokens
    return None


def _read_metadata(path: Path) -> tuple[int | None, int | None]:
    """Step and tokens recorded in a checkpoint's metadata files, if any."""
    step = tokens = None
    for fname, step_key, tok_key in (
        ("probeselect_checkpoint.json", "step", "tokens"),
        ("trainer_state.json", "global_step", "num_input_tokens_seen"),
    ):
        f = path / fname
        if not f.is_file():
            continue
        try:
            meta = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{f}: cannot read checkpoint metadata ({exc}). Fix or delete the file.") from None
        if step is None and isinstance(meta.get(step_key), int):
            step = meta[step_key]
        if tokens is None and isinstance(meta.get(tok_key), (int, float)) and meta.get(tok_key):
            tokens = int(meta[tok_key])
    return step, tokens


def _weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        files = sorted(p for p in path.glob("*.bin") if p.name.startswith("pytorch_model"))
    return files


def _check_safetensors(f: Path) -> bytes:
    """Validate a safetensors file from its header; return the raw header bytes.

    A valid file is ``8-byte little-endian header length N`` + ``N bytes of JSON`` +
    tensor data whose last byte range ends exactly at the end of the file.
    """
    size = f.stat().st_size
    fix = "Re-copy or re-save this checkpoint."
    if size < 8:
        raise CheckpointError(f"{f}: truncated or corrupt safetensors file ({size} bytes). {fix}")
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8 or n > 100_000_000:
            raise CheckpointError(f"{f}: truncated or corrupt safetensors file (header length {n} exceeds file size {size}). {fix}")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{f}: corrupt safetensors header (not JSON). {fix}") from None
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError):
            raise CheckpointError(f"{f}: corrupt safetensors header (tensor {key!r} has no data_offsets). {fix}") from None
    expected = 8 + n + end
    if size != expected:
        raise CheckpointError(
            f"{f}: truncated or corrupt safetensors file (expected {expected} bytes from its header, found {size}). {fix}"
        )
    return raw


_SAMPLE_BLOCKS = 16
_BLOCK = 1 << 16


def _file_digest(f: Path) -> str:
    """Cheap content digest of a weight file.

    Files up to 2 MiB are hashed whole. Larger files contribute their size, their
    safetensors header (every tensor's name, dtype, shape and byte range) and 16 blocks
    of 64 KiB spread evenly over the file, first and last included: about 1 MiB read per
    file whatever its size, yet any two checkpoints of a training run differ in every
    block because every weight moves at every step.
    """
    size = f.stat().st_size
    header = _check_safetensors(f) if f.suffix == ".safetensors" else b""
    h = hashlib.sha256(header)
    h.update(str(size).encode())
    with open(f, "rb") as fh:
        if size <= 2 * 1024 * 1024:
            h.update(fh.read())
        else:
            for k in range(_SAMPLE_BLOCKS):
                fh.seek((size - _BLOCK) * k // (_SAMPLE_BLOCKS - 1))
                h.update(fh.read(_BLOCK))
    return h.hexdigest()


def tokenizer_hash(path: Path) -> str | None:
    """Content hash of the tokenizer saved in ``path`` (None if it has none).

    Compares by content, not by file bytes: ``tokenizer.json`` is canonicalised (sorted
    keys), and only the special-token settings of ``tokenizer_config.json`` count.
    """
    path = Path(path)
    parts: dict[str, str] = {}
    for fname in _TOKENIZER_FILES:
        f = path / fname
        if f.is_file():
            if fname == "tokenizer.json":
                try:
                    parts[fname] = canonical_json_hash(json.loads(f.read_text(encoding="utf-8")))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise CheckpointError(f"{f}: corrupt tokenizer.json. Re-save the tokenizer.") from None
            else:
                parts[fname] = sha256_file(f)
    if not parts:
        return None
    cfg = path / "tokenizer_config.json"
    if cfg.is_file():
        try:
            conf = json.loads(cfg.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{cfg}: corrupt tokenizer_config.json. Re-save the tokenizer.") from None
        parts["config"] = canonical_json_hash({k: conf.get(k) for k in _TOKENIZER_CONFIG_KEYS})
    return canonical_json_hash(parts)


def fingerprint_checkpoint(path: Path) -> tuple[str, tuple[str, ...]]:
    """Return ``(fingerprint, weight_file_names)`` for an HF model folder.

    Raises :class:`CheckpointError` for a folder without config or weights, or with a
    truncated/corrupt safetensors file.
    """
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"{path}: not an HF model folder (no config.json). Save it with `model.save_pretrained(...)`.")
    files = _weight_files(path)
    if not files:
        raise CheckpointError(
            f"{path}: folder has no weights (no *.safetensors or pytorch_model*.bin). "
            "Point at a complete checkpoint or remove the folder."
        )
    try:
        config_hash = canonical_json_hash(json.loads(config.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{config}: corrupt config.json. Re-save the checkpoint.") from None
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise CheckpointError(f"{path}: safetensors shards missing: {', '.join(missing)}. Re-copy the checkpoint.")
    parts = {
        "config": config_hash,
        "tokenizer": tokenizer_hash(path),
        "weights": [(f.name, f.stat().st_size, _file_digest(f)) for f in files],
    }
    return canonical_json_hash(parts), tuple(f.name for f in files)


def _make_checkpoint(path: Path, name: str, step: int | None, tokens: int | None) -> Checkpoint:
    meta_step, meta_tokens = _read_metadata(path)
    if step is None:
        step = meta_step
    if tokens is None:
        tokens = meta_tokens
    fp, files = fingerprint_checkpoint(path)
    return Checkpoint(
        name=name,
        path=path,
        step=step,
        tokens=tokens,
        fingerprint=fp,
        tokenizer_hash=tokenizer_hash(path),
        weight_files=files,
    )


def _has_weights(path: Path) -> bool:
    return bool(_weight_files(path))


def _discover_one(sub: Path, found: list[Checkpoint]) -> None:
    """Append the checkpoint in ladder subfolder ``sub`` to ``found`` (other folders are ignored)."""
    parsed = parse_checkpoint_name(sub.name)
    if parsed is not None:
        found.append(_make_checkpoint(sub, sub.name, *parsed))
    elif (sub / "config.json").is_file() and _has_weights(sub):
        meta_step, _ = _read_metadata(sub)
        if meta_step is None:
            raise CheckpointError(
                f"{sub}: cannot tell this checkpoint's step. Name the folder checkpoint-<step> "
                "or record it in trainer_state.json (global_step)."
            )
        found.append(_make_checkpoint(sub, sub.name, None, None))
    # Other folders (data/, logs/, ...) are not checkpoints and are ignored.


def discover_checkpoints(path: str | Path, *, allow_tokenizer_mismatch: bool = False,
                         errors: dict[str, str] | None = None) -> list[Checkpoint]:
    """Turn a directory into an ordered list of checkpoints (see the module docstring).

    Raises :class:`CheckpointError` for a missing path, an empty directory, a checkpoint
    folder without weights, a corrupt safetensors file, or a checkpoint whose step cannot
    be determined; :class:`TokenizerMismatchError` when two checkpoints have different
    tokenizers (unless ``allow_tokenizer_mismatch``). With ``errors`` (a dict), a checkpoint
    folder of a ladder that is rejected (corrupt config, truncated weights, ...) is recorded
    there (folder name -> message) and skipped instead (``--keep-going``).
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: path does not exist.")
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory. Pass a checkpoint folder or a folder of checkpoints.")

    found: list[Checkpoint] = []
    if (root / "config.json").is_file() or _has_weights(root):
        # A single model folder.
        parsed = parse_checkpoint_name(root.name)
        step, tokens = parsed if parsed else (None, None)
        found.append(_make_checkpoint(root, root.name, step, tokens))
    else:
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                _discover_one(sub, found)
            except CheckpointError as exc:
                if errors is None:
                    raise
                errors[sub.name] = str(exc)
        if not found and errors:
            first = next(iter(errors.values()))
            raise CheckpointError(f"{root}: all {len(errors)} checkpoint folder(s) were rejected (first: {first})")
        if not found:
            raise CheckpointError(
                f"{root}: no checkpoints found. Expected HF model folders named like checkpoint-<N>, "
                "step<N>-tokens<M>B, global_step<N> or iter_<N>, or a single model folder."
            )

    steps = [c.step for c in found]
    if len(found) > 1:
        dupes = sorted({s for s in steps if steps.count(s) > 1})
        if dupes:
            names = [c.name for c in found if c.step in dupes]
            raise CheckpointError(f"{root}: several checkpoints claim the same step {dupes}: {names}. Remove the duplicates.")
    found.sort(key=lambda c: (c.step if c.step is not None else -1, c.name))

    if not allow_tokenizer_mismatch:
        ref = next((c for c in found if c.tokenizer_hash is not None), None)
        for c in found:
            if ref is not None and c.tokenizer_hash is not None and c.tokenizer_hash != ref.tokenizer_hash:
                raise TokenizerMismatchError(
                    f"checkpoints {ref.path} and {c.path} have different tokenizers; scores would not be "
                    "comparable. Pass --allow-tokenizer-mismatch to score them anyway."
                )
    return found
