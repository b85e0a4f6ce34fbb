"""Atomic file writes and content hashing.

Every file probeselect writes goes through these helpers: the content is written to a
temporary file in the destination folder, flushed and fsynced, then moved into place
with ``os.replace``. A killed process therefore leaves either the old file or the new
one, never a truncated file that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    _atomic_write(Path(path), write)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_jsonl(path: Path, rows) -> None:
    """Write an iterable of dicts as JSON lines to ``path`` atomically."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def atomic_write_parquet(path: Path, df) -> None:
    """Write a pandas DataFrame to parquet atomically."""
    _atomic_write(Path(path), lambda tmp: df.to_parquet(tmp, index=False))


def atomic_write_csv(path: Path, df) -> None:
    """Write a pandas DataFrame to CSV atomically."""
    _atomic_write(Path(path), lambda tmp: df.to_csv(tmp, index=False))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's full content (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def canonical_json_hash(obj: Any) -> str:
    """SHA-256 of an object's canonical JSON form (sorted keys, no whitespace)."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode())
