"""Checkpoint ladders published as revisions (branches) of one Hugging Face Hub repo.

Pythia publishes ``step0`` ... ``step143000`` as branches of one repo, OLMo publishes
``stage1-step<N>-tokens<M>B`` (and ``stage2-ingredient<K>-step<N>-tokens<M>B``) branches.
:func:`resolve_hub_ladder` turns ``ORG/NAME`` plus a revision selection into the same
ordered :class:`~probeselect.checkpoints.Checkpoint` list a folder of checkpoints gives:

* revisions: an explicit list, ``"all"`` (every branch and tag whose name carries a step;
  others such as ``main`` are skipped) or a glob ``pattern`` (``"stage1-step*"``);
* step and tokens come from the revision name (:func:`~probeselect.checkpoints.parse_checkpoint_name`:
  Pythia ``step<N>``, OLMo ``[stage<K>-]step<N>-tokens<M>B``, ``global_step<N>``, ``iter_<N>``);
  order is numeric;
* files resolve through ``huggingface_hub.snapshot_download`` into the usual HF cache
  (``HF_HUB_CACHE``, else ``HF_HOME/hub``): with ``HF_HUB_OFFLINE=1`` only from the cache, and a
  revision missing there is an error naming it; online, as usual (config, tokenizer and
  weight files only: safetensors when the revision has them, else ``pytorch_model*.bin``,
  which transformers loads with ``weights_only=True``);
* the fingerprint is the commit sha plus the file fingerprint of the snapshot folder, so the
  cache and resume logic of ``score`` works exactly as for folders.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Sequence

from ._io import canonical_json_hash
from .checkpoints import Checkpoint, fingerprint_checkpoint, order_ladder, parse_checkpoint_name, tokenizer_hash
from .errors import CheckpointError

__all__ = ["resolve_hub_ladder", "hub_cache_dir", "is_offline", "checkpoint_from_snapshot"]

_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken"]


def hub_cache_dir() -> Path:
    """The HF hub cache folder, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    v = os.environ.get("HF_HUB_OFFLINE", "")
    return v.strip().lower() in ("1", "true", "yes", "on")


def _repo_folder(repo: str, cache: Path) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _list_revisions(repo: str, cache: Path, offline: bool) -> list[str]:
    if offline:
        refs = _repo_folder(repo, cache) / "refs"
        if not refs.is_dir():
            raise CheckpointError(f"{repo}: not in the local HF cache ({cache}) and HF_HUB_OFFLINE is set; download "
                                  "it where the Hub is reachable or point HF_HUB_CACHE at the cache that holds it.")
        return sorted(p.name for p in refs.iterdir() if p.is_file())
    from huggingface_hub import HfApi

    try:
        refs = HfApi().list_repo_refs(repo)
    except Exception as exc:  # noqa: BLE001 - network/auth/not-found; one clear line
        raise CheckpointError(f"{repo}: cannot list the repo's revisions ({type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}).") from None
    return sorted({r.name for r in list(refs.branches) + list(refs.tags)})


def _weight_patterns(repo: str, revision: str) -> list[str]:
    from huggingface_hub import HfApi

    files = HfApi().list_repo_files(repo, revision=revision)
    if any(f.endswith(".safetensors") for f in files):
        return ["*.safetensors"]
    return ["pytorch_model*.bin"]


def _snapshot(repo: str, revision: str, cache: Path, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    try:
        if offline:
            path = snapshot_download(repo, revision=revision, cache_dir=str(cache), local_files_only=True)
        else:
            path = snapshot_download(repo, revision=revision, cache_dir=str(cache),
                                     allow_patterns=_FILES + _weight_patterns(repo, revision))
    except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many types; give one line
        name = type(exc).__name__
        if offline:
            raise CheckpointError(
                f"{repo}: revision {revision!r} is not in the local HF cache ({cache}) and HF_HUB_OFFLINE is set. "
                f"Download it where the Hub is reachable (`hf download {repo} --revision {revision}`) or drop it."
            ) from None
        if name == "RevisionNotFoundError":
            raise CheckpointError(f"{repo}: revision {revision!r} does not exist on the Hub; list them with "
                                  "--revisions all or check the name.") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{repo}@{revision}: cannot download ({name}: {first}).") from None
    return Path(path)


def _step_of(repo: str, revision: str) -> tuple[int, int | None]:
    parsed = parse_checkpoint_name(revision)
    if parsed is None:
        raise CheckpointError(
            f"{repo}: cannot tell the step of revision {revision!r}; revision names must look like step<N>, "
            "[stage<K>-]step<N>-tokens<M>B, global_step<N> or iter_<N>."
        )
    return parsed


def _hub_checkpoint(repo: str, revision: str, path: Path, fingerprint: str) -> Checkpoint:
    parsed = _step_of(repo, revision)
    commit = path.name
    fp, files = fingerprint_checkpoint(path, fingerprint)
    return Checkpoint(name=revision, path=path, step=parsed[0], tokens=parsed[1],
                      fingerprint=canonical_json_hash({"commit": commit, "files": fp}),
                      tokenizer_hash=tokenizer_hash(path), weight_files=files,
                      repo=repo, revision=revision, commit=commit)


def resolve_hub_ladder(repo: str, revisions: Sequence[str] | str | None = None, pattern: str | None = None, *,
                       fingerprint: str = "sampled", allow_tokenizer_mismatch: bool = False) -> list[Checkpoint]:
    """Resolve revisions of Hub repo ``repo`` (``ORG/NAME``) into an ordered checkpoint list.

    ``revisions``: a list of revision names, or ``"all"`` / ``["all"]``; ``pattern``: a glob
    over the repo's revision names (combinable with an explicit list). See the module docstring.
    """
    if not isinstance(repo, str) or not _REPO_RE.match(repo) or ".." in repo:
        raise CheckpointError(f"{repo!r}: not a Hub repo id; expected ORG/NAME (e.g. EleutherAI/pythia-160m).")
    if isinstance(revisions, str):
        revisions = [revisions]
    revisions = list(revisions or [])
    if not revisions and pattern is None:
        raise CheckpointError(f"{repo}: give --revisions (names or `all`) or --revision-pattern.")
    cache, offline = hub_cache_dir(), is_offline()
    wanted: list[str] = []
    if revisions == ["all"] or pattern is not None:
        names = _list_revisions(repo, cache, offline)
        if revisions == ["all"]:
            wanted = [r for r in names if parse_checkpoint_name(r) is not None]
            revisions = []
            if not wanted:
                raise CheckpointError(f"{repo}: none of its revisions ({', '.join(names[:8]) or 'none'}) names a "
                                      "training step (step<N>, stage1-step<N>-tokens<M>B, ...).")
        if pattern is not None:
            hits = [r for r in names if fnmatch.fnmatchcase(r, pattern)]
            if not hits:
                where = "in the local HF cache" if offline else "on the Hub"
                raise CheckpointError(f"{repo}: no revision {where} matches --revision-pattern {pattern!r} "
                                      f"(revisions: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}).")
            wanted += hits
    if "all" in revisions:
        raise CheckpointError("--revisions all cannot be combined with revision names.")
    bad = [r for r in revisions if not r or "/" in r or r in (".", "..")]
    if bad:
        raise CheckpointError(f"{repo}: revision {bad[0]!r} cannot name a checkpoint (no '/' allowed).")
    wanted += revisions
    wanted = list(dict.fromkeys(wanted))
    for r in wanted:  # name check before any download
        _step_of(repo, r)
    found = [_hub_checkpoint(repo, r, _snapshot(repo, r, cache, offline), fingerprint) for r in wanted]
    return order_ladder(found, repo, allow_tokenizer_mismatch=allow_tokenizer_mismatch)


def checkpoint_from_snapshot(path: Path, fingerprint: str = "sampled") -> Checkpoint | None:
    """The Hub checkpoint that a cache snapshot folder (``models--ORG--NAME/snapshots/<sha>``)
    is, named by the one revision whose ref points at it; None for any other folder or an
    ambiguous snapshot (several step revisions on one commit)."""
    path = Path(path)
    repo_dir = path.parent.parent
    if path.parent.name != "snapshots" or not repo_dir.name.startswith("models--"):
        return None
    refs = repo_dir / "refs"
    names = [p.name for p in refs.iterdir() if p.is_file() and p.read_text().strip() == path.name
             and parse_checkpoint_name(p.name) is not None] if refs.is_dir() else []
    if len(names) != 1:
        return None
    repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
    return _hub_checkpoint(repo, names[0], path, fingerprint)
