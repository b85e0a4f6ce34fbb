"""``score_checkpoints``: score a ladder of checkpoints with conflict probes.

For every checkpoint x item x evaluation seed it computes the answer-span
log-probability of every candidate and the margin ``log p(task) - log p(shortcut)`` in
nats. One checkpoint is resident at a time. When ``out`` is given it writes a run folder:

* ``items.jsonl`` - every item (prompt, candidates exactly as scored), for audit;
* ``scores.parquet`` - one row per checkpoint x item x seed;
* ``summary.csv`` - per checkpoint x family x variant (see :func:`tables.summarize_scores`);
* ``manifest.json`` - versions, git commit, resolved config, checkpoint fingerprints,
  probe spec hashes, seeds, and which (checkpoint, family) pairs are complete;
* ``cache/`` - per-checkpoint score parts keyed by (checkpoint fingerprint, items hash,
  scoring config); a re-run scores only checkpoints whose part is missing.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ._io import (
    atomic_write_csv,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_parquet,
    canonical_json_hash,
    sha256_file,
)
from .checkpoints import Checkpoint, discover_checkpoints
from .errors import CheckpointError, ProbeSpecError
from .manifest import base_manifest
from .probes import FamilySpec, ProbeItem, generate_items, load_spec
from .spans import EncodedPair, encode_pair, score_pairs
from .tables import summarize_scores

__all__ = ["ScoreResult", "score_checkpoints", "resolve_device", "resolve_dtype", "load_model", "load_tokenizer"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ScoreResult:
    """What ``score_checkpoints`` returns: the three tables, the manifest and the run folder."""

    items: pd.DataFrame
    scores: pd.DataFrame
    summary: pd.DataFrame
    manifest: dict[str, Any]
    run_dir: Path | None = None
    scored: list[str] = field(default_factory=list)  # checkpoints scored now (not from cache)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype flag to torch; float32 is the default; float16 is CUDA-only."""
    if dtype not in _DTYPES:
        raise ProbeSpecError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}.")
    if dtype == "float16" and device.type == "cpu":
        raise ProbeSpecError("float16 is not supported on CPU; use float32 (default) or bfloat16.")
    return _DTYPES[dtype]


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises many types; give one clear message
        raise CheckpointError(f"{path}: cannot load a tokenizer ({type(exc).__name__}: {exc}). "
                              "Save one with the checkpoint or pass --tokenizer PATH.") from None


def load_model(path: Path, dtype: torch.dtype, device: torch.device):
    """Load a causal LM from a local folder; never runs remote code; prefers safetensors."""
    import transformers
    from transformers import AutoModelForCausalLM

    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=False, **kw)
    except Exception as exc:
        raise CheckpointError(f"{path}: failed to load the model ({type(exc).__name__}: {exc}).") from None
    return model.to(device).eval()


def _item_rows(items: Sequence[ProbeItem]) -> list[dict]:
    return [it.to_dict() for it in items]


def _encode_items(tokenizer, items: Sequence[ProbeItem]) -> list[list[EncodedPair]]:
    return [
        [
            encode_pair(tokenizer, it.prompt, cand, what=f"item {it.item_id} (seed {it.seed}) candidate {cand!r}")
            for cand in it.candidates
        ]
        for it in items
    ]


def _score_one(ckpt: Checkpoint, model, items, encoded, *, batch_size, max_length, device, progress) -> pd.DataFrame:
    flat = [p for enc in encoded for p in enc]
    bar = tqdm(total=len(flat), desc=f"  {ckpt.name}", unit="req", leave=False, disable=not progress)
    try:
        spans = score_pairs(model, flat, batch_size=batch_size, max_length=max_length, device=device, progress=bar)
    finally:
        bar.close()
    rows, k = [], 0
    for it, enc in zip(items, encoded):
        sc = spans[k : k + len(enc)]
        k += len(enc)
        lps = [s.logprob for s in sc]
        task, short = sc[0], sc[1]
        margin = task.logprob - short.logprob
        rows.append(
            {
                "checkpoint": ckpt.name,
                "step": ckpt.step,
                "tokens": ckpt.tokens,
                "family": it.family,
                "variant": it.variant,
                "seed": it.seed,
                "item_id": it.item_id,
                "task_logprob": task.logprob,
                "shortcut_logprob": short.logprob,
                "margin": margin,
                "task_tokens": task.n_tokens,
                "shortcut_tokens": short.n_tokens,
                "margin_per_token": task.logprob / task.n_tokens - short.logprob / short.n_tokens,
                "correct": bool(margin > 0),
                "candidate_correct": bool(all(task.logprob > lp for lp in lps[1:])),
                "best_candidate": it.candidates[max(range(len(lps)), key=lps.__getitem__)],
                "task_is_greedy": task.is_greedy,
                "candidate_logprobs": lps,
            }
        )
    return pd.DataFrame(rows)


def score_checkpoints(
    checkpoints: str | Path | Sequence[Checkpoint],
    probes: Sequence[str | Path | FamilySpec],
    *,
    seeds: Sequence[int] = (0, 1, 2, 3),
    out: str | Path | None = None,
    dtype: str = "float32",
    device: str = "auto",
    batch_size: int = 16,
    max_length: int | None = None,
    tokenizer: str | Path | None = None,
    allow_tokenizer_mismatch: bool = False,
    progress: bool = True,
) -> ScoreResult:
    """Score every checkpoint with every probe spec under every evaluation seed.

    ``checkpoints`` is a directory (see :func:`discover_checkpoints`) or a list of
    :class:`Checkpoint`; ``probes`` are spec files or :class:`FamilySpec` objects.
    Margins are in nats. Returns a :class:`ScoreResult`; writes a run folder when ``out``
    is given (re-runs reuse cached per-checkpoint parts).
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ProbeSpecError(f"seeds must be a non-empty list of distinct integers, got {seeds}.")
    if not probes:
        raise ProbeSpecError("no probe specs given; pass at least one, e.g. --probes probes/arith_pattern.yaml.")
    specs = [p if isinstance(p, FamilySpec) else load_spec(p) for p in probes]  # cheap checks first
    if isinstance(checkpoints, (str, Path)):
        ckpts = discover_checkpoints(checkpoints, allow_tokenizer_mismatch=allow_tokenizer_mismatch)
    else:
        ckpts = list(checkpoints)
    fams = [s.family for s in specs]
    dup = sorted({f for f in fams if fams.count(f) > 1})
    if dup:
        raise ProbeSpecError(f"probe family {dup[0]!r} is given twice; merge the specs or drop one.")
    items = [it for s in specs for it in generate_items(s, seeds)]
    item_dicts = _item_rows(items)
    items_hash = canonical_json_hash(item_dicts)

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    scoring_config = {"dtype": dtype, "device_type": dev.type, "max_length": max_length, "scorer": "spans-v1"}
    config = {
        "checkpoints": str(checkpoints) if isinstance(checkpoints, (str, Path)) else [c.name for c in ckpts],
        "probes": [s.to_dict() for s in specs],
        "seeds": seeds,
        "dtype": dtype,
        "device": str(dev),
        "batch_size": batch_size,
        "max_length": max_length,
        "tokenizer": str(tokenizer) if tokenizer else None,
        "allow_tokenizer_mismatch": allow_tokenizer_mismatch,
    }
    manifest = base_manifest("score", config)
    manifest.update(
        status="running",
        checkpoints=[c.to_dict() for c in ckpts],
        probes=[
            {
                "family": s.family,
                "path": str(s.path) if s.path else None,
                "file_sha256": sha256_file(s.path) if s.path else None,
                "spec_hash": s.spec_hash,
                "n_items_per_seed": s.n_items * len(s.variants),
            }
            for s in specs
        ],
        seeds=seeds,
        items_hash=items_hash,
        scoring_config=scoring_config,
        complete=[],
        failed=[],
    )
    run_dir = Path(out) if out is not None else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / "manifest.json", manifest)
        atomic_write_jsonl(run_dir / "items.jsonl", item_dicts)

    encoded_by_tok: dict[Any, list[list[EncodedPair]]] = {}
    tok_override = Path(tokenizer) if tokenizer else None
    parts: list[pd.DataFrame] = []
    scored_now: list[str] = []
    outer = tqdm(ckpts, desc="checkpoints", unit="ckpt", disable=not progress)
    for ckpt in outer:
        outer.set_postfix_str(ckpt.name)
        key = canonical_json_hash({"fp": ckpt.fingerprint, "items": items_hash, "cfg": scoring_config})
        cache = run_dir / "cache" / f"{ckpt.name}-{key[:16]}.parquet" if run_dir else None
        if cache is not None and cache.is_file():
            part = pd.read_parquet(cache)
        else:
            tok_key = "override" if tok_override else ckpt.tokenizer_hash or ckpt.name
            if tok_key not in encoded_by_tok:
                tok = load_tokenizer(tok_override or ckpt.path)
                encoded_by_tok[tok_key] = _encode_items(tok, items)
            model = load_model(ckpt.path, torch_dtype, dev)
            try:
                part = _score_one(ckpt, model, items, encoded_by_tok[tok_key], batch_size=batch_size,
                                  max_length=max_length, device=dev, progress=progress)
            finally:
                del model
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            scored_now.append(ckpt.name)
            if cache is not None:
                atomic_write_parquet(cache, part)
        parts.append(part)
        manifest["complete"].extend({"checkpoint": ckpt.name, "family": f} for f in fams)
    outer.close()

    scores = pd.concat(parts, ignore_index=True)
    summary = summarize_scores(scores)
    items_df = pd.DataFrame(item_dicts)
    manifest["status"] = "complete"
    manifest["scored_now"] = scored_now
    if run_dir is not None:
        atomic_write_parquet(run_dir / "scores.parquet", scores)
        atomic_write_csv(run_dir / "summary.csv", summary)
        manifest["outputs"] = {
            name: sha256_file(run_dir / name) for name in ("items.jsonl", "scores.parquet", "summary.csv")
        }
        atomic_write_json(run_dir / "manifest.json", manifest)
    return ScoreResult(items=items_df, scores=scores, summary=summary, manifest=manifest, run_dir=run_dir, scored=scored_now)
