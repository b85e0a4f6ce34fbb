"""Atomic file writes and content hashing.

Every file probeselect writes goes through these helpers: the content is written to a
temporary file in the destination folder, flushed and fsynced, then moved into place
with ``os.replace``. A killed process therefore leaves either the old file or the new
one, never a truncated file that looks complete.
"""

from __future__ import annotations

import contextlib
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


def atomic_write_csv(path: Path, df, **to_csv) -> None:
    """Write a pandas DataFrame to CSV atomically (``to_csv``: extra DataFrame.to_csv arguments)."""
    _atomic_write(Path(path), lambda tmp: df.to_csv(tmp, index=False, **to_csv))


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


def check_data_symlink(path: Path, base: Path, *, label: str, error_cls: type[Exception]) -> None:
    """Refuse a data file reached through a symbolic link that leaves ``base``.

    ``path`` is a data file named inside a spec, recipe or config whose folder is
    ``base``. A shared probe or recipe folder must not be able to make probeselect read
    an arbitrary file (``data.csv -> /etc/passwd`` or a private key) and copy it into
    ``items.jsonl``. So a link in the path (below ``base``; or the file itself when the
    path is absolute) is followed only when its target is a regular file or folder
    inside ``base``; otherwise ``error_cls`` is raised naming the target. Naming the
    target path directly in the file is always accepted (it is then visible there).
    """
    path, base = Path(path), Path(base)
    try:
        rel = path.relative_to(base)
        links = [base.joinpath(*rel.parts[: k + 1]) for k in range(len(rel.parts))]
    except ValueError:  # an absolute path outside base: only its last component is checked
        links = [path]
        base = path.parent
    if not any(p.is_symlink() for p in links):
        return
    target = path.resolve()
    base_real = base.resolve()
    inside = target == base_real or base_real in target.parents
    if not inside or not (target.is_file() or target.is_dir()):
        raise error_cls(
            f"{label}: {path} is a symbolic link to {target}, outside {base_real}; probeselect does not follow "
            "data links out of the folder of the file that names them. Copy the file there or name its real "
            "path directly."
        )


class RunLock:
    """An exclusive lock on a run folder (``fcntl.flock`` on ``<folder>/.probeselect.lock``).

    Two probeselect processes writing one folder would overwrite each other's tables; the
    second one fails at once with a message naming the first one's pid. The lock is
    released when the process exits, however it exits (the kernel drops it).
    """

    NAME = ".probeselect.lock"

    def __init__(self, folder: Path, *, error_cls: type[Exception]):
        self.path = Path(folder) / self.NAME
        self.error_cls = error_cls
        self._fh = None

    def acquire(self) -> "RunLock":
        import fcntl

        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            pid = fh.read().strip() or "?"
            fh.close()
            raise self.error_cls(
                f"another probeselect process is writing {self.path.parent} (pid {pid}); wait for it to finish "
                "or use another --out."
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            import fcntl

            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def reading(path, error_cls: type[Exception], *, also: tuple[type[BaseException], ...] = ()):
    """Turn the ways a user's file cannot be read into one ``error_cls`` line naming it.

    Non-UTF-8 bytes (``UnicodeDecodeError``) and OS errors (permission denied, a folder
    where a file is expected) always; ``also`` adds reader-specific exception types (e.g.
    pyarrow's for a corrupt parquet file). Errors probeselect raises itself pass through.
    """
    try:
        yield
    except UnicodeDecodeError as exc:
        raise error_cls(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-save it as UTF-8.") from None
    except OSError as exc:
        raise error_cls(f"{path}: cannot read ({exc.strerror or exc}).") from None
    except also as exc:  # noqa: B030 - a tuple of exception types
        raise error_cls(f"{path}: cannot read ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}).") from None


def replace_dir(staging: Path, final: Path) -> None:
    """Move the completely written folder ``staging`` to ``final``, replacing the old one.

    A stage that writes several files (e.g. ``dynamics/``) writes them all into a staging
    folder first, so a failure or interrupt half way never leaves new files mixed with old
    ones: the old folder stays whole until the new one is complete.
    """
    import shutil

    staging, final = Path(staging), Path(final)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
