"""``score_checkpoints``: score a ladder of checkpoints with conflict probes.

For every checkpoint x item x evaluation seed it computes the answer-span
log-probability of every candidate and the margin ``log p(task) - log p(shortcut)`` in
nats. One checkpoint is resident at a time. When ``out`` is given it writes a run folder:

* ``items.jsonl`` - every item (prompt, candidates exactly as scored), for audit;
* ``scores.parquet`` - one row per checkpoint x item x seed;
* ``summary.csv`` - per checkpoint x family x variant (see :func:`tables.summarize_scores`);
* ``manifest.json`` - versions, git commit, resolved config, checkpoint fingerprints,
  probe spec hashes, seeds, which (checkpoint, family) pairs are complete and which
  checkpoints failed; ``status`` is ``running`` until the tables are written;
* ``cache/<checkpoint>/`` - one parquet part per (checkpoint, family, item chunk) unit,
  keyed by (checkpoint fingerprint, chunk items hash, scoring config); a re-run, or a
  run resumed after a kill, scores only the missing units.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ._io import (
    RunLock,
    atomic_write_csv,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_parquet,
    canonical_json_hash,
    sha256_file,
)
from .checkpoints import Checkpoint, discover_checkpoints
from .errors import CheckpointError, ProbeSpecError, RunInterrupted, ScoringError, UsageError
from .manifest import base_manifest
from .capability import heldout_nll, load_heldout_texts
from .generation import (
    MIN_SHARED_PREFIX,
    generative_audit,
    persona_generation_table,
    select_audit_items,
    summarize_audit,
    summarize_generation,
)
from .probes import FamilySpec, ProbeItem, generate_items, get_family, load_spec
from .probes._registry import check_requirements
from .probes._gdsuite import (GDsuiteGroup, encode_item_gdsuite, gdsuite_persona_table, gdsuite_unpack,
                              is_persona_spec, summarize_persona, wants_gdsuite_boundary)
from ._dist import dist_context, split_contiguous
from . import _shards
from .spans import DEFAULT_MAX_PREFIX_CACHE_TOKENS, EncodedGroup, _model_max_length, encode_pair, group_pairs, score_groups
from .tables import summarize_scores

__all__ = ["ScoreResult", "score_checkpoints", "resolve_device", "resolve_dtype", "load_model", "load_tokenizer",
           "check_no_remote_code"]

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
    failed: dict[str, str] = field(default_factory=dict)  # checkpoint -> load error (keep_going)
    generations: pd.DataFrame | None = None  # sampled-generation counts per item (gen families)
    audit: pd.DataFrame | None = None  # greedy generative audit, one row per audited item
    audit_summary: pd.DataFrame | None = None
    persona: pd.DataFrame | None = None  # GDsuite persona generations, one row per seed x persona x question
    n_checkpoints: int = 0  # found in the folder, including those rejected at discovery (keep_going)
    units_total: int = 0  # (checkpoint, family, chunk) work units of the loaded checkpoints
    units_cached: int = 0  # of those, reused from the run folder's cache
    superseded: list[str] = field(default_factory=list)  # downstream files moved aside (inputs changed)
    n_truncated: int = 0  # (checkpoint, item, seed) rows whose prompt was cut to fit the context


DEVICE_HELP = "auto, cpu, cuda or cuda:N"


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU. A device this build or machine does
    not have (``cuda`` without CUDA, ``cuda:3`` on a 2-GPU machine) is a :class:`UsageError`."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"--device {device!r}: not a device; use {DEVICE_HELP}.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: this machine or PyTorch build has no CUDA "
                             "(torch.cuda.is_available() is False); use --device cpu or auto.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible; "
                             "use cuda:0 .. cuda:N-1 or auto.")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UsageError(f"--device {device}: MPS is not available here; use --device cpu or auto.")
    elif dev.type != "cpu":
        raise UsageError(f"--device {device}: unsupported device type {dev.type!r}; use {DEVICE_HELP}.")
    return dev


def _known_model_types() -> set[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return set(CONFIG_MAPPING_NAMES)


def _read_json_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read ({type(exc).__name__}: {exc}). Re-save the checkpoint.") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}. Re-save the checkpoint.")
    return data


_WARNED_AUTO_MAP: set[str] = set()


def check_no_remote_code(path: Path) -> None:
    """Refuse a checkpoint that can only be loaded by running its own Python code.

    probeselect never runs code shipped with a checkpoint (``trust_remote_code`` is always
    False). A ``config.json`` whose ``model_type`` transformers does not know, or that has
    an ``auto_map`` without a known ``model_type``, is refused with :class:`CheckpointError`;
    so is a ``tokenizer_config.json`` whose ``auto_map`` names a tokenizer class that
    transformers does not ship. An ``auto_map`` next to a known ``model_type`` is ignored
    (transformers' own class is used) with a one-line warning.
    """
    path = Path(path)
    fix = ("probeselect never runs code from a checkpoint; convert it to a standard transformers architecture "
           "and re-save it (or upgrade transformers if the architecture is new).")
    cfg_file = path / "config.json"
    if cfg_file.is_file():
        cfg = _read_json_file(cfg_file)
        model_type = cfg.get("model_type")
        known = isinstance(model_type, str) and model_type in _known_model_types()
        if not known and (cfg.get("auto_map") or model_type is not None):
            what = (f"its auto_map {sorted(cfg['auto_map'])} points to Python files in the checkpoint"
                    if cfg.get("auto_map") else "transformers has no such architecture")
            raise CheckpointError(f"{cfg_file}: model_type {model_type!r} is unknown to transformers and {what}; {fix}")
        if cfg.get("auto_map") and str(path) not in _WARNED_AUTO_MAP:
            _WARNED_AUTO_MAP.add(str(path))
            log.warning("%s: ignoring auto_map (custom code) in config.json; loading transformers' own %r "
                        "implementation instead.", cfg_file, model_type)
    tok_file = path / "tokenizer_config.json"
    if tok_file.is_file():
        tcfg = _read_json_file(tok_file)
        if tcfg.get("auto_map"):
            from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

            cls = tcfg.get("tokenizer_class")
            if not isinstance(cls, str) or tokenizer_class_from_name(cls) is None:
                raise CheckpointError(f"{tok_file}: tokenizer_class {cls!r} is not a transformers tokenizer and its "
                                      f"auto_map points to Python files in the checkpoint; {fix}")
            if str(tok_file) not in _WARNED_AUTO_MAP:
                _WARNED_AUTO_MAP.add(str(tok_file))
                log.warning("%s: ignoring auto_map (custom code) in tokenizer_config.json; using transformers' "
                            "%s.", tok_file, cls)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype flag to torch; float32 is the default; float16 is CUDA-only."""
    if dtype not in _DTYPES:
        raise ProbeSpecError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}.")
    if dtype == "float16" and device.type == "cpu":
        raise ProbeSpecError("float16 is not supported on CPU; use float32 (default) or bfloat16.")
    return _DTYPES[dtype]


def load_tokenizer(path: Path):
    """Load a tokenizer from a local folder; never runs code shipped with it."""
    from transformers import AutoTokenizer

    check_no_remote_code(Path(path))
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # transformers raises many types; give one clear message
        raise CheckpointError(f"{path}: cannot load a tokenizer ({type(exc).__name__}: {exc}). "
                              "Save one with the checkpoint or pass --tokenizer PATH.") from None


def load_model(path: Path, dtype: torch.dtype, device: torch.device):
    """Load a causal LM from a local folder; never runs remote code; prefers safetensors."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()  # one line per checkpoint is enough
    check_no_remote_code(Path(path))
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), trust_remote_code=False, output_loading_info=True, **kw
        )
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{path}: failed to load the model ({type(exc).__name__}: {msg}).") from None
    # transformers initialises missing weights randomly and only warns; a checkpoint with
    # missing tensors would then score as noise. Refuse it.
    bad = {k: list(info.get(k) or []) for k in ("missing_keys", "mismatched_keys")}
    if bad["missing_keys"] or bad["mismatched_keys"]:
        what = "missing" if bad["missing_keys"] else "shape-mismatched"
        keys = bad["missing_keys"] or [str(k) for k in bad["mismatched_keys"]]
        raise CheckpointError(
            f"{path}: failed to load the model: {len(keys)} {what} weight tensor(s) (e.g. {keys[0]}); "
            "the weights do not match config.json. Re-save or re-copy the checkpoint."
        )
    from ._guards import note_nonfinite_weights

    model = model.to(device).eval()
    note_nonfinite_weights(model, path)  # NaN/inf weights (checked on the device): warned, recorded for the manifest
    return model


def _item_rows(items: Sequence[ProbeItem]) -> list[dict]:
    return [it.to_dict() for it in items]


def _encode_items(tokenizer, items: Sequence[ProbeItem]) -> list[EncodedGroup]:
    """Tokenize every (prompt, candidate) pair once; one group per item (GDsuite-format
    items with ``boundary: gdsuite`` use GDsuite's answer boundary, see ``probes._gdsuite``)."""
    return [
        encode_item_gdsuite(tokenizer, it) if wants_gdsuite_boundary(it) else group_pairs(
            [
                encode_pair(tokenizer, it.prompt, cand, what=f"item {it.item_id} (seed {it.seed}) candidate {cand!r}")
                for cand in it.candidates
            ]
        )
        for it in items
    ]


@dataclass(frozen=True)
class WorkUnit:
    """One (checkpoint, family, item chunk) unit of scoring work: the grain of caching,
    resumption and distribution."""

    ckpt_index: int
    family: str
    chunk: int
    item_slice: tuple[int, int]  # [start, stop) into the run's item list
    key: str  # cache key: checkpoint fingerprint + chunk inputs hash + scoring config
    task: str = "spans"  # spans | nll | gen | audit


def _gen_settings(spec: FamilySpec) -> dict | None:
    """Sampled-generation settings of a spec (families with ``gen_samples`` > 0), else None."""
    n = int(spec.params.get("gen_samples", 0) or 0)
    if n <= 0:
        return None
    return {"n": n, "temperature": float(spec.params.get("gen_temperature", 1.0)),
            "max_new_tokens": int(spec.params.get("gen_max_new_tokens", 16))}


def _plan_units(ckpts, items, fams, chunk_items: int, scoring_config, heldout_hash: str | None = None,
                gen: dict[str, dict] | None = None, audit_idx: list[int] | None = None,
                audit_max_new_tokens: int = 16) -> list[WorkUnit]:
    spans: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        spans.setdefault(it.family, []).append(i)
    units = []
    for ci, ck in enumerate(ckpts):
        for fam in fams:
            idx = spans.get(fam, [])
            lo, hi = idx[0], idx[-1] + 1  # a family's items are contiguous
            for c, s in enumerate(range(lo, hi, chunk_items)):
                e = min(s + chunk_items, hi)
                h = canonical_json_hash([items[k].to_dict() for k in range(s, e)])
                key = canonical_json_hash({"fp": ck.fingerprint, "items": h, "cfg": scoring_config})
                units.append(WorkUnit(ci, fam, c, (s, e), key))
        if heldout_hash is not None:
            key = canonical_json_hash({"fp": ck.fingerprint, "heldout": heldout_hash, "cfg": scoring_config})
            units.append(WorkUnit(ci, HELDOUT_FAMILY, 0, (0, 0), key, task="nll"))
        for fam, settings in (gen or {}).items():
            idx = spans[fam]
            h = canonical_json_hash([items[k].to_dict() for k in idx])
            key = canonical_json_hash({"fp": ck.fingerprint, "items": h, "gen": settings, "cfg": scoring_config})
            units.append(WorkUnit(ci, fam, 0, (idx[0], idx[-1] + 1), key, task="gen"))
        if audit_idx:
            h = canonical_json_hash([items[k].to_dict() for k in audit_idx])
            key = canonical_json_hash({"fp": ck.fingerprint, "audit": h, "max_new": audit_max_new_tokens,
                                       "cfg": scoring_config})
            units.append(WorkUnit(ci, "audit", 0, (0, 0), key, task="audit"))
    return units


HELDOUT_FAMILY = "heldout_nll"


def _nll_unit(ckpt: Checkpoint, model, tokenizer, texts, *, max_length, stride, device, source: str,
              progress=None) -> pd.DataFrame:
    res = heldout_nll(model, tokenizer, texts, max_length=max_length, stride=stride, device=device, progress=progress)
    return pd.DataFrame([{
        "checkpoint": ckpt.name, "step": ckpt.step, "tokens": ckpt.tokens, "family": HELDOUT_FAMILY,
        "variant": "bpb", "kind": "nll", **res.to_dict(), "heldout_file": source,
    }])


def _with_checkpoint(df: pd.DataFrame, ckpt: Checkpoint) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "tokens", ckpt.tokens)
    df.insert(0, "step", ckpt.step)
    df.insert(0, "checkpoint", ckpt.name)
    return df


def _cache_path(run_dir: Path, ckpt: Checkpoint, unit: WorkUnit) -> Path:
    return run_dir / "cache" / ckpt.name / f"{unit.task}-{unit.family}-{unit.chunk:04d}-{unit.key[:16]}.parquet"


def _score_unit(ckpt: Checkpoint, model, items, encoded, truncated, *, max_batch_tokens, max_length, device,
                progress, prefix_reuse: bool = True,
                max_prefix_cache_tokens: int = DEFAULT_MAX_PREFIX_CACHE_TOKENS) -> pd.DataFrame:
    bar = tqdm(total=len(items), desc=f"  {ckpt.name} {items[0].family if items else ''}", unit="item", leave=False,
               disable=not progress)
    try:
        spans = score_groups(model, encoded, max_batch_tokens=max_batch_tokens, max_length=max_length,
                             device=device, progress=bar, prefix_reuse=prefix_reuse,
                             max_prefix_cache_tokens=max_prefix_cache_tokens)
    finally:
        bar.close()
    rows = []
    for it, grp, sc, cut in zip(items, encoded, spans, truncated):
        extra = {}
        if isinstance(grp, GDsuiteGroup):  # GDsuite's spans and per-item columns
            sc, extra = gdsuite_unpack(it, grp, sc)
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
                "kind": get_family(it.family).kind,
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
                "truncated_tokens": int(cut),
                **extra,
            }
        )
    return pd.DataFrame(rows)


def _peak_rss_mib() -> float | None:
    """Peak resident memory of this process in MiB (None where unsupported)."""
    try:
        import resource
        import sys as _sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(rss / (1024 * 1024 if _sys.platform == "darwin" else 1024), 1)
    except (ImportError, OSError):
        return None


def _sort_summary(summary: pd.DataFrame) -> pd.DataFrame:
    order = {"conflict": 0, "capability": 1, "generative": 2, "nll": 3}
    key = summary["kind"].map(order).fillna(3)
    return (summary.assign(_k=key).sort_values(["step", "checkpoint", "_k", "family", "variant"], kind="stable",
                                               na_position="first").drop(columns="_k").reset_index(drop=True))


def score_checkpoints(
    checkpoints: str | Path | Sequence[Checkpoint],
    probes: Sequence[str | Path | FamilySpec],
    *,
    seeds: Sequence[int] = (0, 1, 2, 3),
    out: str | Path | None = None,
    dtype: str = "float32",
    device: str = "auto",
    max_batch_tokens: int = 8192,
    max_length: int | None = None,
    prefix_reuse: bool = True,
    max_prefix_cache_tokens: int = DEFAULT_MAX_PREFIX_CACHE_TOKENS,
    tokenizer: str | Path | None = None,
    allow_tokenizer_mismatch: bool = False,
    keep_going: bool = False,
    chunk_items: int = 1024,
    heldout: str | Path | None = None,
    heldout_stride: int | None = None,
    audit_items: int = 50,
    audit_max_new_tokens: int = 16,
    on_overflow: str = "error",
    progress: bool = True,
    fingerprint: str = "sampled",
    shard: str | tuple[int, int] | None = None,
    merge: bool = False,
) -> ScoreResult:
    """Score every checkpoint with every probe spec under every evaluation seed.

    ``checkpoints`` is a directory (see :func:`discover_checkpoints`) or a list of
    :class:`Checkpoint`; ``probes`` are spec files or :class:`FamilySpec` objects.
    Margins are in nats. Within a unit, prompts sharing a token prefix of >= 32 tokens
    (fixed demonstrations) run it once (``prefix_reuse``; see :func:`spans.score_groups`,
    bounded by ``max_prefix_cache_tokens``); with ``prefix_reuse`` sampled and greedy
    generations also prefill a prefix of >= 16 tokens shared by several prompts once
    (:func:`generation.sample_generations`, ``min_shared_prefix``). Work is split into (checkpoint, family, item-chunk) units; with
    ``out`` each finished unit is cached, so a re-run (or a run resumed after a kill)
    scores only what is missing. Launched under ``accelerate launch``/``torchrun`` the
    units are sharded across processes and every rank returns the same tables; rank 0
    writes the files. A checkpoint that fails to load stops the run with
    :class:`CheckpointError`, or with ``keep_going`` is recorded as failed and skipped.

    ``heldout`` (a .txt with one document per line, a .jsonl with ``text``, or a saved
    ``datasets`` folder) adds a capability track: held-out NLL in bits per byte per
    checkpoint (rolling windows of the model's context, ``heldout_stride`` tokens apart;
    default disjoint windows as in lm-eval), reported in ``summary.csv`` as family
    ``heldout_nll``, variant ``bpb``, kind ``nll``.

    Families whose spec sets ``params.gen_samples`` > 0 (persona QA) are also scored by
    sampled generation (``generations.parquet``; ``gen_*`` columns in ``summary.csv``:
    consistency rate with a Wilson 95% interval, shortcut and unterminated rates). The
    generative audit greedily generates an answer for ``audit_items`` items per family
    (evaluation seed ``seeds[0]``; 0 disables it) and writes ``audit.parquet`` and
    ``audit_summary.csv`` (agreement of ``correct``/``candidate_correct`` with what the
    model writes).

    ``fingerprint`` (``sampled`` or ``full``) is how checkpoint folders are fingerprinted
    for the cache keys (see :func:`probeselect.checkpoints.fingerprint_checkpoint`).

    Job arrays (see :mod:`probeselect._shards`): ``shard="I/N"`` scores only the I-th of N
    disjoint blocks of work units into the shared ``out`` folder and writes
    ``shards/shard-I-of-N.json`` instead of the final tables and manifest (no run lock; the
    shard that completes the plan merges); ``merge=True`` writes the final tables from the
    cache and refuses, naming the missing shards, unless every unit is cached.
    """
    call_args = dict(locals())  # for the merge that the last shard runs
    if shard is not None:
        if merge:
            raise UsageError("--shard and --merge exclude each other: run the shards, then one --merge.")
        shard = _shards.parse_shard(shard)
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds: evaluation seeds must be distinct non-negative integers, got {seeds}.")
    if max_batch_tokens < 1 or chunk_items < 1:
        raise UsageError("--max-batch-tokens and --chunk-items must be positive.")
    if max_length is not None and max_length < 2:
        raise UsageError(f"--max-length must be at least 2 tokens, got {max_length}.")
    if on_overflow not in ("error", "truncate"):
        raise UsageError(f"--on-overflow must be 'error' or 'truncate', got {on_overflow!r}.")
    if max_prefix_cache_tokens < 1:
        raise UsageError("--max-prefix-cache-tokens must be a positive number of tokens.")
    if not probes:
        raise ProbeSpecError("no probe specs given; pass at least one, e.g. --probes probes/arith_pattern.yaml.")
    run_dir = Path(out) if out is not None else None
    if run_dir is not None:
        _check_out_dir(run_dir)
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise UsageError(f"--tokenizer {tokenizer}: not a folder; pass a folder saved with "
                         "tokenizer.save_pretrained(...).")
    specs = [p if isinstance(p, FamilySpec) else load_spec(p) for p in probes]  # cheap checks first
    fams = [s.family for s in specs]
    dup = sorted({f for f in fams if fams.count(f) > 1})
    if dup:
        raise ProbeSpecError(f"probe family {dup[0]!r} is given twice; merge the specs or drop one.")
    if audit_items < 0:
        raise UsageError("--audit-items must be >= 0.")
    # Items grouped by family (contiguous), then seed, variant, index.
    items = [it for s in specs for it in generate_items(s, seeds)]
    item_dicts = _item_rows(items)
    items_hash = canonical_json_hash(item_dicts)
    heldout_texts = load_heldout_texts(heldout) if heldout is not None else None
    heldout_hash = canonical_json_hash({"texts": heldout_texts, "stride": heldout_stride}) if heldout_texts else None

    gen = {s.family: g for s in specs if (g := _gen_settings(s)) is not None}
    audit_set = select_audit_items(items, n_per_family=audit_items, seed=0, eval_seed=seeds[0]) if audit_items else []
    audit_pos = {(it.item_id, it.seed): k for k, it in enumerate(items)}
    audit_idx = sorted(audit_pos[(it.item_id, it.seed)] for it in audit_set)

    dist = dist_context()
    if device == "auto" and dist.world_size > 1 and torch.cuda.is_available():
        device = f"cuda:{dist.local_rank}"
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    progress = progress and dist.is_main

    # Checkpoints: a folder is discovered (with keep_going, a checkpoint rejected here,
    # e.g. a corrupt config or truncated weights, is recorded as failed and skipped).
    failed: dict[str, str] = {}
    if isinstance(checkpoints, (str, Path)):
        rejected: dict[str, str] = {}
        ckpts = discover_checkpoints(checkpoints, allow_tokenizer_mismatch=allow_tokenizer_mismatch,
                                     errors=rejected if keep_going else None, fingerprint=fingerprint)
        failed.update(rejected)
    else:
        ckpts = list(checkpoints)
    for ck in list(ckpts):  # before any work: never a checkpoint that needs its own code
        try:
            check_no_remote_code(ck.path)
        except CheckpointError as exc:
            if not keep_going:
                raise
            failed[ck.name] = str(exc)
            ckpts.remove(ck)
    for name, err in failed.items():
        log.warning("skipping %s: %s", name, err)
    n_found = len(ckpts) + len(failed)
    check_requirements(specs, ckpts)  # toy-world families only on toy-ladder checkpoints

    scoring_config = {"dtype": dtype, "device_type": dev.type, "max_length": max_length, "scorer": "spans-v1"}
    config = {
        "checkpoints": str(checkpoints) if isinstance(checkpoints, (str, Path)) else [c.name for c in ckpts],
        "probes": [s.to_dict() for s in specs],
        "seeds": seeds,
        "dtype": dtype,
        "device": str(dev),
        "world_size": dist.world_size,
        "max_batch_tokens": max_batch_tokens,
        "prefix_reuse": prefix_reuse,
        "max_prefix_cache_tokens": max_prefix_cache_tokens,
        "max_length": max_length,
        "on_overflow": on_overflow,
        "chunk_items": chunk_items,
        "tokenizer": str(tokenizer) if tokenizer else None,
        "allow_tokenizer_mismatch": allow_tokenizer_mismatch,
        "keep_going": keep_going,
        "heldout": str(heldout) if heldout is not None else None,
        "heldout_stride": heldout_stride,
        "generation": gen,
        "audit_items": audit_items,
        "audit_max_new_tokens": audit_max_new_tokens,
        "fingerprint": fingerprint,
        "shard": list(shard) if shard else None,
        "merge": merge,
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
        heldout={"path": str(heldout), "sha256": sha256_file(Path(heldout)) if Path(heldout).is_file() else None,
                 "content_hash": heldout_hash, "n_docs": len(heldout_texts)} if heldout_texts else None,
        scoring_config=scoring_config,
        complete=[],
        failed=[{"checkpoint": n, "error": e} for n, e in failed.items()],
    )
    # Work units planned up front: a merge checks them before touching the folder.
    persona_specs = {s.family: s for s in specs if is_persona_spec(s)}  # GDsuite persona folders (generative)
    units: list[WorkUnit] = _plan_units(ckpts, items, [f for f in fams if f not in persona_specs], chunk_items,
                                        scoring_config, heldout_hash, gen, audit_idx, audit_max_new_tokens)
    units.extend(WorkUnit(ci, f, 0, (0, 0), canonical_json_hash({"fp": ck.fingerprint, "persona": sp.spec_hash,
                                                                  "seeds": manifest["seeds"], "cfg": scoring_config}),
                          task="persona")
                 for ci, ck in enumerate(ckpts) for f, sp in persona_specs.items())
    own = _shards.owned_units(len(units), shard) if shard else None
    if merge:  # refuses, naming the missing shards, unless every unit is cached
        failed.update(_shards.check_merge(run_dir, units, ckpts, _cache_path, keep_going=keep_going))
    writer = run_dir is not None and dist.is_main and shard is None  # a shard writes only its own record
    lock = None
    old_manifest = None
    if writer:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {run_dir}: cannot create the run folder ({exc.strerror}).") from None
        lock = RunLock(run_dir, error_cls=UsageError).acquire()
    try:
        if shard and dist.is_main:
            _shards.begin_shard(run_dir, shard, manifest, units, own, ckpts, _cache_path)
        if writer:
            old_manifest = _read_old_manifest(run_dir)
            previous = _previous_outputs(old_manifest)
            if previous:
                # The tables on disk belong to that earlier run until this one completes.
                manifest["previous_outputs"] = previous
            # Written before any work: the folder says a run is in progress, and the old
            # complete tables stay in place (swapped only when this run completes).
            atomic_write_json(run_dir / "manifest.json", manifest)
            # A SIGKILL between mkstemp and os.replace leaves a hidden ".<name>.<random>.tmp";
            # the final file is never torn, but the orphan is removed here (no other writer runs).
            for orphan in (run_dir / "cache").glob("*/.*.tmp"):
                orphan.unlink(missing_ok=True)
        dist.barrier()
        res = _score_run(
            ckpts, items, item_dicts, fams, specs, manifest, units, failed, run_dir=run_dir, dist=dist, dev=dev,
            torch_dtype=torch_dtype, scoring_config=scoring_config, chunk_items=chunk_items,
            heldout=heldout, heldout_texts=heldout_texts, heldout_hash=heldout_hash, heldout_stride=heldout_stride,
            gen=gen, audit_idx=audit_idx, audit_max_new_tokens=audit_max_new_tokens, tokenizer=tokenizer,
            max_batch_tokens=max_batch_tokens, max_length=max_length, on_overflow=on_overflow,
            keep_going=keep_going, progress=progress, old_manifest=old_manifest, n_found=n_found,
            shard=shard, own=own,
            prefix_reuse=prefix_reuse, max_prefix_cache_tokens=max_prefix_cache_tokens,
        )
    except KeyboardInterrupt:
        saved = _units_saved(run_dir, ckpts, units)
        if writer:
            manifest.update(status="interrupted", units_saved=saved,
                            error="interrupted (Ctrl-C or SIGTERM); re-run the same command to resume")
            atomic_write_json(run_dir / "manifest.json", manifest)
        raise RunInterrupted(saved, run_dir) from None
    except BaseException as exc:
        if writer:
            manifest.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                            units_saved=_units_saved(run_dir, ckpts, units))
            atomic_write_json(run_dir / "manifest.json", manifest)
        raise
    finally:
        if lock is not None:
            lock.release()
    if shard and res.manifest.get("merge_claimed"):
        merged = score_checkpoints(**{**call_args, "shard": None, "merge": True})
        merged.scored = res.scored  # this shard's model work
        return merged
    return res


# Final tables of a score run: written to a staging folder and swapped in together.
_TABLES = ("items.jsonl", "scores.parquet", "summary.csv", "generations.parquet", "audit.parquet", "audit_summary.csv",
           "persona.parquet")
# Files later stages derive from the tables; moved aside when the tables change.
_DOWNSTREAM = ("dynamics", "shortlist.csv", "shortlist.json", "report.md", "report.html", "plan.lock.json",
               "pilot", "selection.json", "selection.csv", "confirm", "averaged")


def _check_out_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir}: is a file, not a folder; pass a run folder (it is created if missing).")
    for parent in run_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {run_dir}: {parent} is a file, not a folder.")
            if not run_dir.exists() and not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(f"--out {run_dir}: cannot create the run folder ({parent} is not writable).")
            break
    if run_dir.is_dir() and not os.access(run_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out {run_dir}: the run folder is not writable.")


def _read_old_manifest(run_dir: Path) -> dict | None:
    f = run_dir / "manifest.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _previous_outputs(old: dict | None) -> dict | None:
    """What the tables on disk are, according to the folder's previous manifest."""
    if not old:
        return None
    if old.get("status") in ("complete", "incomplete") and old.get("outputs"):
        return {"status": old["status"], "created_utc": old.get("created_utc"), "items_hash": old.get("items_hash"),
                "outputs": old["outputs"]}
    return old.get("previous_outputs")  # an earlier attempt failed too: the tables are still the older run's


def _units_saved(run_dir: Path | None, ckpts, units) -> int:
    if run_dir is None:
        return 0
    return sum(1 for u in units if _cache_path(run_dir, ckpts[u.ckpt_index], u).is_file())


def _supersede_downstream(run_dir: Path, previous: dict | None, new_outputs: dict) -> list[str]:
    """Move downstream files aside when this run's tables differ from the previous ones.

    A shortlist, lock, report or dynamics folder computed from other tables would look
    current next to the new tables (and ``plan lock`` would accept a stale shortlist).
    They move to ``superseded/<UTC time>/``, never deleted.
    """
    present = [n for n in _DOWNSTREAM if (run_dir / n).exists()]
    if not present:
        return []
    old = (previous or {}).get("outputs") or {}
    same = previous is not None and all(old.get(n) == new_outputs.get(n) for n in ("summary.csv", "scores.parquet"))
    if same:
        return []
    import datetime as _dt

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = run_dir / "superseded" / stamp
    dest.mkdir(parents=True, exist_ok=True)
    for n in present:
        os.replace(run_dir / n, dest / n)
    log.warning("the scores changed: moved %s from the previous run to %s (re-run dynamics/shortlist/report on "
                "the new scores).", ", ".join(present), dest)
    return [str(dest / n) for n in present]


def _overflow(encoded: Sequence[EncodedGroup], limit: int) -> list[int]:
    """Prompt tokens cut from the left of each item so that its longest candidate fits in
    ``limit`` tokens (the rule of :func:`spans.score_groups`, lm-eval's for that candidate)."""
    out = []
    for g in encoded:
        keep = max(1, limit + 1 - max(len(c) for c in g.continuations))
        out.append(max(0, len(g.context_ids) - keep))
    return out


def _overflow_error(family: str, n_over: int, n: int, example: str, need: int, limit: int) -> ScoringError:
    return ScoringError(
        f"family {family}: {n_over} of {n} prompts do not fit the model's {limit}-token context (e.g. {example} "
        f"needs {need} tokens). Shorten them (fewer demos), raise --max-length if the model allows, or pass "
        "--on-overflow truncate to cut prompts from the left as lm-eval does (recorded per item as truncated_tokens)."
    )


def _score_run(ckpts, items, item_dicts, fams, specs, manifest, units, failed, *, run_dir, dist, dev, torch_dtype,
               scoring_config, chunk_items, heldout, heldout_texts, heldout_hash, heldout_stride, gen, audit_idx,
               audit_max_new_tokens, tokenizer, max_batch_tokens, max_length, on_overflow, keep_going, progress,
               old_manifest, n_found, shard=None, own=None, prefix_reuse=True,
               max_prefix_cache_tokens=DEFAULT_MAX_PREFIX_CACHE_TOKENS) -> ScoreResult:
    persona_specs = {s.family: s for s in specs if is_persona_spec(s)}  # GDsuite persona folders (generative)
    gen_share = MIN_SHARED_PREFIX if prefix_reuse else 0  # generation: prompts' shared prefixes prefilled once
    pool = own if own is not None else range(len(units))
    mine = [units[pool[i]] for i in split_contiguous(len(pool), dist.world_size, dist.rank)]
    encoded_by_tok: dict[Any, list[EncodedGroup]] = {}
    tokenizers: dict[Any, Any] = {}
    tok_override = Path(tokenizer) if tokenizer else None
    done: dict[int, pd.DataFrame] = {}  # unit index -> rows
    scored_now: set[str] = set()
    my_failed: dict[str, str] = {}
    n_cached = 0
    computed_now: set[int] = set()  # unit indices this rank computed (not read from the cache)
    unit_index = {u: i for i, u in enumerate(units)}
    by_ckpt: dict[int, list[WorkUnit]] = {}
    for u in mine:
        by_ckpt.setdefault(u.ckpt_index, []).append(u)

    outer = tqdm(by_ckpt.items(), desc="checkpoints", unit="ckpt", disable=not progress)
    for ci, ck_units in outer:
        ckpt = ckpts[ci]
        outer.set_postfix_str(ckpt.name)
        todo = []
        for u in ck_units:
            cache = _cache_path(run_dir, ckpt, u) if run_dir else None
            part = pd.read_parquet(cache) if cache is not None and cache.is_file() else None
            if part is not None and u.task == "spans" and "truncated_tokens" not in part.columns:
                part = None  # cached before truncation was recorded: score it again
            if part is not None and u.task == "spans" and on_overflow == "error" and (part["truncated_tokens"] > 0).any():
                raise ScoringError(
                    f"{cache}: cached scores of family {u.family} were computed with truncated prompts "
                    "(--on-overflow truncate); pass --on-overflow truncate again or use a fresh --out.")
            if part is not None:
                done[unit_index[u]] = part
                n_cached += 1
            else:
                todo.append((u, cache))
        if not todo or ckpt.name in failed:  # (failed: recorded by a shard, merged with --keep-going)
            continue
        try:
            tok_key = "override" if tok_override else ckpt.tokenizer_hash or ckpt.name
            if tok_key not in encoded_by_tok:
                tok = load_tokenizer(tok_override or ckpt.path)
                encoded_by_tok[tok_key] = _encode_items(tok, items)
                tokenizers[tok_key] = tok
            model = load_model(ckpt.path, torch_dtype, dev)
        except CheckpointError as exc:
            if not keep_going:
                raise
            log.warning("skipping %s: %s", ckpt.name, exc)
            my_failed[ckpt.name] = str(exc)
            continue
        try:
            for u, cache in todo:
                s, e = u.item_slice
                if u.task == "nll":
                    bar = tqdm(total=None, desc=f"  {ckpt.name} held-out NLL", unit="window", leave=False,
                               disable=not progress)
                    try:
                        part = _nll_unit(ckpt, model, tokenizers[tok_key], heldout_texts, max_length=max_length,
                                         stride=heldout_stride, device=dev, source=str(heldout), progress=bar)
                    finally:
                        bar.close()
                elif u.task == "gen":
                    g = gen[u.family]
                    bar = tqdm(total=e - s, desc=f"  {ckpt.name} {u.family} sampling", unit="prompt", leave=False,
                               disable=not progress)
                    try:
                        part = _with_checkpoint(persona_generation_table(
                            model, tokenizers[tok_key], items[s:e], n=g["n"], temperature=g["temperature"],
                            max_new_tokens=g["max_new_tokens"], seed=0, min_shared_prefix=gen_share,
                            progress=bar), ckpt)
                    finally:
                        bar.close()
                elif u.task == "persona":
                    part = _with_checkpoint(gdsuite_persona_table(model, tokenizers[tok_key], persona_specs[u.family],
                                                                  manifest["seeds"], min_shared_prefix=gen_share),
                                            ckpt)
                elif u.task == "audit":
                    bar = tqdm(total=len(audit_idx), desc=f"  {ckpt.name} generative audit", unit="item",
                               leave=False, disable=not progress)
                    try:
                        part = _with_checkpoint(generative_audit(
                            model, tokenizers[tok_key], [items[k] for k in audit_idx],
                            max_new_tokens=audit_max_new_tokens, min_shared_prefix=gen_share, progress=bar), ckpt)
                    finally:
                        bar.close()
                else:
                    limit = max_length or _model_max_length(model)
                    enc = encoded_by_tok[tok_key][s:e]
                    trunc = _overflow(enc, limit)
                    over = [k for k, t in enumerate(trunc) if t]
                    if over and on_overflow == "error":
                        k = over[0]
                        it = items[s + k]
                        need = len(enc[k].context_ids) + max(len(c) for c in enc[k].continuations) - 1
                        raise _overflow_error(u.family, len(over), e - s, f"item {it.item_id} (seed {it.seed})",
                                              need, limit)
                    part = _score_unit(ckpt, model, items[s:e], enc, trunc, max_batch_tokens=max_batch_tokens,
                                       max_length=max_length, device=dev, progress=progress,
                                       prefix_reuse=prefix_reuse, max_prefix_cache_tokens=max_prefix_cache_tokens)
                if cache is not None:
                    atomic_write_parquet(cache, part)
                done[unit_index[u]] = part
                computed_now.add(unit_index[u])
                scored_now.add(ckpt.name)
        finally:
            del model
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    outer.close()

    # Gather every rank's units (and failures) so all ranks hold the same tables.
    # Each rank also reports which units it was assigned and which it computed now (manifest
    # `units_by_rank`), so a test can see that the work was really sharded.
    gathered = dist.all_gather((done, my_failed, sorted(scored_now), n_cached, sorted(unit_index[u] for u in mine),
                                sorted(computed_now)))
    done, scored_list, n_cached = {}, [], 0
    units_by_rank = []
    for r, (d, f, sc, nc, assigned, comp) in enumerate(gathered):
        units_by_rank.append({"rank": r, "assigned": assigned, "computed": comp})
        done.update(d)
        failed.update(f)
        scored_list.extend(sc)
        n_cached += nc
    if shard:
        rec, merge_now = _shards.finish_shard(run_dir, shard, manifest, units, own, ckpts, _cache_path,
                                              failed=failed, scored=scored_list, dist=dist)
        rec["merge_claimed"] = merge_now
        scores = pd.concat([done[i] for i in sorted(done) if units[i].task == "spans"] or [pd.DataFrame()],
                           ignore_index=True)
        return ScoreResult(items=pd.DataFrame(item_dicts), scores=scores, summary=pd.DataFrame(), manifest=rec,
                           run_dir=run_dir, scored=[c.name for c in ckpts if c.name in set(scored_list)],
                           failed=dict(failed), n_checkpoints=n_found, units_total=len(own), units_cached=n_cached)
    missing = [u for i, u in enumerate(units) if i not in done and ckpts[u.ckpt_index].name not in failed]
    if missing:  # cannot happen unless a rank died silently; never present partial results
        raise RuntimeError(f"{len(missing)} work units produced no result")
    parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "spans"]
    nll_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "nll"]
    scores = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    summary = summarize_scores(scores) if len(scores) else pd.DataFrame()
    n_truncated = int((scores["truncated_tokens"] > 0).sum()) if len(scores) else 0
    if len(summary):
        trunc = (scores.assign(_t=scores["truncated_tokens"] > 0)
                 .groupby(["checkpoint", "family", "variant"], sort=False)["_t"].sum()
                 .rename("truncated_items").reset_index())
        summary = summary.merge(trunc, on=["checkpoint", "family", "variant"], how="left")
    if n_truncated:
        log.warning("%d of %d scored prompts (checkpoint x item x seed) were cut from the left to fit the context "
                    "(--on-overflow truncate); see truncated_tokens in scores.parquet and items.jsonl, "
                    "truncated_items in summary.csv.", n_truncated, len(scores))
    gen_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "gen"]
    audit_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "audit"]
    generations = pd.concat(gen_parts, ignore_index=True) if gen_parts else None
    persona_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "persona"]
    persona = pd.concat(persona_parts, ignore_index=True) if persona_parts else None
    audit = pd.concat(audit_parts, ignore_index=True) if audit_parts else None
    audit_summary = summarize_audit(audit, scores) if audit is not None and len(scores) else None
    if generations is not None and len(summary):
        gsum = summarize_generation(generations, by=["checkpoint", "family", "variant"])
        summary = summary.merge(gsum, on=["checkpoint", "family", "variant"], how="left")
    if persona is not None:
        summary = pd.concat([summary, summarize_persona(persona)], ignore_index=True)
    if nll_parts:
        nll = pd.concat(nll_parts, ignore_index=True)
        summary = pd.concat([summary, nll], ignore_index=True)
    if len(summary):
        summary = _sort_summary(summary)
        for col in ("n_items", "n_seeds", "n_samples", "gen_items", "gen_n", "n_tokens", "n_bytes", "n_docs", "truncated_items"):
            if col in summary.columns:
                summary[col] = summary[col].astype("Int64")
    if len(scores):  # items.jsonl: the most tokens any checkpoint's tokenizer cut from the item's prompt
        cut = scores.groupby(["family", "item_id", "seed"])["truncated_tokens"].max().to_dict()
        item_dicts = [{**d, "truncated_tokens": int(cut.get((d["family"], d["item_id"], d["seed"]), 0))}
                      for d in item_dicts]
    items_df = pd.DataFrame(item_dicts)
    manifest["complete"] = [{"checkpoint": c.name, "family": f} for c in ckpts if c.name not in failed for f in fams]
    manifest["failed"] = [{"checkpoint": n, "error": e} for n, e in failed.items()]
    manifest["status"] = "complete" if not failed else "incomplete"
    from ._guards import nonfinite_checkpoints

    manifest["nonfinite"] = nonfinite_checkpoints(scores, ckpts)  # NaN/inf weights or scores: warned, report flags
    manifest["scored_now"] = [c.name for c in ckpts if c.name in set(scored_list)]
    manifest["n_checkpoints_found"] = n_found
    manifest["units"] = {"total": len(units), "from_cache": n_cached, "scored_now": len(done) - n_cached}
    manifest["truncated_rows"] = n_truncated
    manifest["units_by_rank"] = units_by_rank
    manifest["peak_rss_mib"] = _peak_rss_mib()
    superseded: list[str] = []
    if run_dir is not None and dist.is_main:
        # Stage every table, then swap them in together: until this point the previous
        # run's complete tables stay in place (a failed or interrupted re-run keeps them).
        staging = run_dir / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        atomic_write_jsonl(staging / "items.jsonl", item_dicts)
        atomic_write_parquet(staging / "scores.parquet", scores)
        atomic_write_csv(staging / "summary.csv", summary)
        for name, df in (("generations.parquet", generations), ("audit.parquet", audit), ("persona.parquet", persona)):
            if df is not None:
                atomic_write_parquet(staging / name, df)
        if audit_summary is not None:
            atomic_write_csv(staging / "audit_summary.csv", audit_summary)
        outputs = {name: sha256_file(staging / name) for name in _TABLES if (staging / name).is_file()}
        superseded = _supersede_downstream(run_dir, _previous_outputs(old_manifest), outputs)
        for name in _TABLES:
            if name in outputs:
                os.replace(staging / name, run_dir / name)
            else:
                (run_dir / name).unlink(missing_ok=True)
        staging.rmdir()
        manifest.pop("previous_outputs", None)
        manifest["outputs"] = outputs
        if superseded:
            manifest["superseded"] = superseded
        atomic_write_json(run_dir / "manifest.json", manifest)
    dist.barrier()
    return ScoreResult(items=items_df, scores=scores, summary=summary, manifest=manifest, run_dir=run_dir,
                       scored=manifest["scored_now"], failed=dict(failed), generations=generations, audit=audit,
                       audit_summary=audit_summary, n_checkpoints=n_found, units_total=len(units),
                       units_cached=n_cached, superseded=superseded, n_truncated=n_truncated, persona=persona)
