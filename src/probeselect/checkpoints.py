"""Discover, order, fingerprint and validate a directory of saved checkpoints.

``discover_checkpoints(path)`` turns a directory into an ordered list of
:class:`Checkpoint` records. It understands

* HF Trainer folders ``checkpoint-<N>``;
* OLMo folders (and Hub revisions) ``step<N>-tokens<M>B``, ``stage1-step<N>-tokens<M>B``
  and ``stage2-ingredient<K>-step<N>-tokens<M>B``;
* ``step<N>``, ``global_step<N>`` and Megatron ``iter_<N>`` (e.g. ``iter_0001000``);
* a single HF model folder (the directory itself holds the weights);
* any HF model folder whose step (and tokens) are recorded in ``trainer_state.json``
  (``global_step``, ``num_input_tokens_seen``) or ``probeselect_checkpoint.json``
  (``step``, ``tokens``).

Checkpoints are ordered numerically by step (``checkpoint-9`` before ``checkpoint-10``).
Weights may be one file (``model.safetensors``), sharded safetensors
(``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``) or legacy
``pytorch_model*.bin``; a ladder may mix single-file and sharded checkpoints. A corrupt
index, a shard the index names but the folder lacks, a tensor the index places in a shard
that does not hold it, shards without their index, and truncated or corrupt safetensors
files are clear :class:`CheckpointError` s, detected from the headers without reading
the tensors.

Each checkpoint gets a content fingerprint (see :func:`fingerprint_checkpoint`): file
names and sizes, the safetensors headers (every tensor's name, dtype, shape and byte
range), the shard index, a hash of ``config.json``, the tokenizer's content hash and the
weight bytes: ``fingerprint="sampled"`` (default) reads samples of *every* tensor (see
:func:`_file_digest`), ``fingerprint="full"`` hashes every weight file completely.
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
    "order_ladder",
    "FINGERPRINT_MODES",
]

# (regex, has_tokens). Tokens in OLMo names are in billions.
_NAME_PATTERNS: list[tuple[re.Pattern[str], bool]] = [
    (re.compile(r"^checkpoint-(\d+)$"), False),
    (re.compile(r"^(?:stage\d+-(?:ingredient\d+-)?)?step(\d+)-tokens(\d+(?:\.\d+)?)B$"), True),
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
    repo: str | None = None  # Hub checkpoints (probeselect._hub): repo id, revision name, commit sha
    revision: str | None = None
    commit: str | None = None

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "path": str(self.path),
            "step": self.step,
            "tokens": self.tokens,
            "fingerprint": self.fingerprint,
            "tokenizer_hash": self.tokenizer_hash,
            "weight_files": list(self.weight_files),
        }
        if self.repo is not None:
            d.update(repo=self.repo, revision=self.revision, commit=self.commit)
        return d


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


FINGERPRINT_MODES = ("sampled", "full")

_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<k>\d+)-of-(?P<n>\d+)\.(?P<ext>safetensors|bin)$")
_INDEXES = (("model.safetensors.index.json", "model.safetensors"), ("pytorch_model.bin.index.json", "pytorch_model.bin"))


def _read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of a shard index, validated."""
    fix = "Re-copy the checkpoint or re-save it with `save_pretrained`."
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise CheckpointError(f"{index}: corrupt shard index (not valid JSON: {reason}). {fix}") from None
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in wmap.items()):
        raise CheckpointError(f"{index}: corrupt shard index (no `weight_map` of tensor name -> shard file). {fix}")
    bad = sorted({v for v in wmap.values() if Path(v).name != v or v in (".", "..")})
    if bad:
        raise CheckpointError(f"{index}: shard index names a file outside the checkpoint folder ({bad[0]!r}). {fix}")
    return wmap


def _weight_files(path: Path) -> list[Path]:
    """The weight files a checkpoint folder loads from (validated: see the module docstring)."""
    for index_name, single in _INDEXES:
        index = path / index_name
        if not index.is_file():
            continue
        if (path / single).is_file():
            raise CheckpointError(
                f"{path}: holds both {single} and {index_name}; transformers would load only {single}. "
                "Remove the one that does not belong to this checkpoint."
            )
        shards = sorted(set(_read_index(index).values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(
                f"{path}: shard(s) named in {index_name} missing: {', '.join(missing)}. Re-copy the checkpoint."
            )
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        files = sorted(p for p in path.glob("*.bin") if p.name.startswith("pytorch_model"))
    sharded = [f for f in files if _SHARD_RE.match(f.name)]
    if sharded:
        m = _SHARD_RE.match(sharded[0].name)
        index_name = "model.safetensors.index.json" if m["ext"] == "safetensors" else "pytorch_model.bin.index.json"
        raise CheckpointError(
            f"{path}: sharded weights ({sharded[0].name}, ...) without {index_name}; transformers cannot load "
            "them. Re-copy the index file with the shards."
        )
    return files


def _check_safetensors(f: Path) -> tuple[bytes, dict]:
    """Validate a safetensors file from its header; return the raw header bytes and the parsed header.

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
    if not isinstance(header, dict):
        raise CheckpointError(f"{f}: corrupt safetensors header (not a JSON object). {fix}")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            lo, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, IndexError, ValueError):
            raise CheckpointError(f"{f}: corrupt safetensors header (tensor {key!r} has no data_offsets). {fix}") from None
        if not 0 <= lo <= hi:
            raise CheckpointError(f"{f}: corrupt safetensors header (tensor {key!r} has data_offsets {lo}..{hi}). {fix}")
        end = max(end, hi)
    expected = 8 + n + end
    if size != expected:
        raise CheckpointError(
            f"{f}: truncated or corrupt safetensors file (expected {expected} bytes from its header, found {size}). {fix}"
        )
    return raw, header


_SMALL_FILE = 2 * 1024 * 1024  # files up to this size are hashed whole
_SAMPLE_BLOCKS = 16  # blocks of _BLOCK bytes spread over each larger file
_BLOCK = 1 << 16
_SMALL_TENSOR = 4096  # tensors up to this many bytes are hashed whole
_PROBE = 64  # bytes per sampled position of a larger tensor
_RANDOM_PROBES = 8  # seeded positions per larger tensor, besides its first, middle and last bytes


def _tensor_ranges(header: dict, header_hash: bytes, data_start: int) -> list[tuple[int, int]]:
    """File byte ranges ``(offset, length)`` sampled from every tensor of a safetensors file."""
    ranges: list[tuple[int, int]] = []
    for name in sorted(k for k in header if k != "__metadata__"):
        lo, hi = (int(x) for x in header[name]["data_offsets"])
        n = hi - lo
        if n <= _SMALL_TENSOR:
            ranges.append((data_start + lo, n))
            continue
        starts = {0, (n - _PROBE) // 2, n - _PROBE}
        seed = hashlib.sha256(header_hash + name.encode()).digest()
        for j in range(_RANDOM_PROBES):
            r = int.from_bytes(hashlib.sha256(seed + bytes([j])).digest()[:8], "little")
            starts.add(r % (n - _PROBE + 1))
        ranges.extend((data_start + lo + s, _PROBE) for s in sorted(starts))
    return sorted(ranges)


def _file_digest(f: Path, mode: str = "sampled") -> str:
    """Content digest of one weight file.

    ``mode="full"`` is the SHA-256 of every byte (plus the validated header). In the
    default ``mode="sampled"``, files up to 2 MiB, and ``.bin`` files (which carry no tensor
    index to sample from), are hashed whole; a larger safetensors file contributes its size,
    its header (every tensor's name, dtype, shape and byte range), 16 blocks of 64 KiB
    spread evenly over the file, and from **every** tensor: the whole tensor when it is at
    most 4 KiB, else its first, middle and last 64 bytes plus 64 bytes at each of 8 positions
    drawn from a hash of the header and the tensor's name. So every tensor is read, and a
    change anywhere in a tensor's extremes or at any sampled position changes the digest;
    training moves every weight of every trained tensor, so checkpoints of a run always
    differ. What sampling cannot see: a change confined to bytes of a large tensor that
    lie between the sampled positions (e.g. editing a handful of rows of an embedding by
    hand). Use ``mode="full"`` (``--fingerprint full``) when that matters.
    """
    if mode not in FINGERPRINT_MODES:
        raise CheckpointError(f"unknown fingerprint mode {mode!r}; choose one of {', '.join(FINGERPRINT_MODES)}.")
    size = f.stat().st_size
    raw, header = _check_safetensors(f) if f.suffix == ".safetensors" else (b"", None)
    h = hashlib.sha256(raw)
    h.update(str(size).encode())
    if mode == "full" or size <= _SMALL_FILE or header is None:
        h.update(b"full")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()
    with open(f, "rb") as fh:
        for k in range(_SAMPLE_BLOCKS):
            fh.seek((size - _BLOCK) * k // (_SAMPLE_BLOCKS - 1))
            h.update(fh.read(_BLOCK))
        for off, n in _tensor_ranges(header, hashlib.sha256(raw).digest(), 8 + len(raw)):
            fh.seek(off)
            h.update(fh.read(n))
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


def fingerprint_checkpoint(path: Path, mode: str = "sampled") -> tuple[str, tuple[str, ...]]:
    """Return ``(fingerprint, weight_file_names)`` for an HF model folder.

    ``mode`` is ``"sampled"`` (default: samples of every tensor, see :func:`_file_digest`)
    or ``"full"`` (SHA-256 of every weight byte; costs one full read of the weights, see
    bench/README.md). The two modes give different fingerprints, so switching mode
    re-scores a ladder once. Raises :class:`CheckpointError` for a folder without config
    or weights, a truncated/corrupt safetensors file, or a corrupt or incomplete shard index.
    """
    path = Path(path)
    if mode not in FINGERPRINT_MODES:
        raise CheckpointError(f"unknown fingerprint mode {mode!r}; choose one of {', '.join(FINGERPRINT_MODES)}.")
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
    wmap = _read_index(index) if index.is_file() else None
    if wmap is not None:
        # Every tensor the index places in a shard must be in that shard's header.
        held = {f.name: set(_check_safetensors(f)[1]) for f in files}
        wrong = sorted(k for k, s in wmap.items() if k not in held.get(s, ()))
        if wrong:
            raise CheckpointError(
                f"{index}: tensor {wrong[0]!r} is mapped to {wmap[wrong[0]]} but that shard does not hold it "
                f"({len(wrong)} such tensor(s)); the index and the shards come from different saves. Re-copy the checkpoint."
            )
    parts = {
        "config": config_hash,
        "tokenizer": tokenizer_hash(path),
        "weights": [(f.name, f.stat().st_size, _file_digest(f, mode)) for f in files],
    }
    if wmap is not None:
        parts["index"] = canonical_json_hash(wmap)
    if mode != "sampled":
        parts["mode"] = mode
    return canonical_json_hash(parts), tuple(f.name for f in files)


def _make_checkpoint(path: Path, name: str, step: int | None, tokens: int | None,
                     fingerprint: str = "sampled") -> Checkpoint:
    meta_step, meta_tokens = _read_metadata(path)
    if step is None:
        step = meta_step
    if tokens is None:
        tokens = meta_tokens
    fp, files = fingerprint_checkpoint(path, fingerprint)
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


def _discover_one(sub: Path, found: list[Checkpoint], fingerprint: str = "sampled") -> None:
    """Append the checkpoint in ladder subfolder ``sub`` to ``found`` (other folders are ignored)."""
    parsed = parse_checkpoint_name(sub.name)
    if parsed is not None:
        found.append(_make_checkpoint(sub, sub.name, *parsed, fingerprint))
    elif (sub / "config.json").is_file() and _has_weights(sub):
        meta_step, _ = _read_metadata(sub)
        if meta_step is None:
            raise CheckpointError(
                f"{sub}: cannot tell this checkpoint's step. Name the folder checkpoint-<step> "
                "or record it in trainer_state.json (global_step)."
            )
        found.append(_make_checkpoint(sub, sub.name, None, None, fingerprint))
    # Other folders (data/, logs/, ...) are not checkpoints and are ignored.


def discover_checkpoints(path: str | Path, *, allow_tokenizer_mismatch: bool = False,
                         errors: dict[str, str] | None = None, fingerprint: str = "sampled") -> list[Checkpoint]:
    """Turn a directory into an ordered list of checkpoints (see the module docstring).

    ``fingerprint`` is the fingerprint mode (``sampled`` or ``full``, see
    :func:`fingerprint_checkpoint`).

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
        found.append(_make_checkpoint(root, root.name, step, tokens, fingerprint))
    else:
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                _discover_one(sub, found, fingerprint)
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

    return order_ladder(found, root, allow_tokenizer_mismatch=allow_tokenizer_mismatch)


def order_ladder(found: list[Checkpoint], where, *, allow_tokenizer_mismatch: bool = False) -> list[Checkpoint]:
    """Order checkpoints numerically by step and check the ladder: no two claim one step,
    and all share one tokenizer (unless ``allow_tokenizer_mismatch``). ``where`` names the
    ladder (folder or Hub repo) in errors."""
    steps = [c.step for c in found]
    if len(found) > 1:
        dupes = sorted({s for s in steps if steps.count(s) > 1}, key=lambda s: (s is None, s or 0))
        if dupes:
            names = [c.name for c in found if c.step in dupes]
            raise CheckpointError(f"{where}: several checkpoints claim the same step {dupes}: {names}. Remove the duplicates.")
    found = sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.name))

    if not allow_tokenizer_mismatch:
        ref = next((c for c in found if c.tokenizer_hash is not None), None)
        for c in found:
            if ref is not None and c.tokenizer_hash is not None and c.tokenizer_hash != ref.tokenizer_hash:
                raise TokenizerMismatchError(
                    f"checkpoints {ref.path} and {c.path} have different tokenizers; scores would not be "
                    "comparable. Pass --allow-tokenizer-mismatch to score them anyway."
                )
    return found
