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

Options of :func:`score_checkpoints` beyond the answer spans:

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

from __future__ import annotations

import contextlib
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


def use_device(device: str = "auto") -> torch.device:
    """:func:`resolve_device`, and ``cuda:N`` made this process's current CUDA device (a single process:
    under ``accelerate launch`` each rank keeps its own GPU). The trainer (accelerate) trains on the
    current device, so without this a ``cuda:1`` run would score on GPU 1 and fine-tune on GPU 0."""
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        torch.cuda.set_device(dev.index)
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
    order = {"conflict": 0, "capability": 1, "generative": 2, "nll": 3, "calibration": 4}
    key = summary["kind"].map(order).fillna(3)
    return (summary.assign(_k=key).sort_values(["step", "checkpoint", "_k", "family", "variant"], kind="stable",
                                               na_position="first").drop(columns="_k").reset_index(drop=True))


# ---------------------------------------------------------------------------
# The pipeline: check arguments -> read probes (stage 1) -> discover and check
# checkpoints (2) -> plan work units (3) -> run units on an engine (4) -> write
# tables and manifest (5). Each stage hands the next a small dataclass.
# ---------------------------------------------------------------------------


@dataclass
class _Inputs:
    """Stage 1: the probe specs and everything derived from them without a model."""

    specs: list[FamilySpec]
    fams: list[str]
    items: list[ProbeItem]  # grouped by family (contiguous), then seed, variant, index
    item_dicts: list[dict]
    items_hash: str
    heldout_texts: list[str] | None
    heldout_hash: str | None
    gen: dict[str, dict]  # family -> sampled-generation settings
    audit_idx: list[int]  # positions in ``items`` of the audited items
    persona_specs: dict[str, FamilySpec]  # GDsuite persona folders (generative)


@dataclass
class _Ladder:
    """Stage 2: the checkpoints to score, those skipped (``keep_going``) and how many were found."""

    ckpts: list[Checkpoint]
    failed: dict[str, str]
    n_found: int


@dataclass(frozen=True)
class _Settings:
    """How stage 4 runs units and where stage 5 writes (resolved arguments)."""

    run_dir: Path | None
    dev: torch.device
    torch_dtype: torch.dtype
    max_batch_tokens: int
    max_length: int | None
    on_overflow: str
    prefix_reuse: bool
    max_prefix_cache_tokens: int
    tokenizer: Path | None  # override for every checkpoint
    keep_going: bool
    progress: bool
    heldout: str | Path | None
    heldout_stride: int | None
    audit_max_new_tokens: int


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
    calibrate: bool = False,
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

    Held-out NLL, sampled generation, the generative audit, fingerprints and job arrays:
    see the module docstring. ``calibrate`` adds the content-free reference family
    ``<family>_cf`` of every calibrated family scored (:mod:`probeselect.probes._calibration`),
    kind ``calibration``: its margins are the chance reference of the family's margins.
    """
    call_args = dict(locals())  # for the merge that the last shard runs
    seeds, shard, run_dir = _check_arguments(call_args)
    inputs = _read_inputs(probes, seeds, heldout=heldout, heldout_stride=heldout_stride, audit_items=audit_items,
                          calibrate=calibrate)
    dist = dist_context()
    if device == "auto" and dist.world_size > 1 and torch.cuda.is_available():
        device = f"cuda:{dist.local_rank}"
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    ladder = _discover(checkpoints, inputs.specs, keep_going=keep_going, fingerprint=fingerprint,
                       allow_tokenizer_mismatch=allow_tokenizer_mismatch)
    scoring_config, manifest = _new_manifest(call_args, seeds=seeds, shard=shard, dev=dev, world_size=dist.world_size,
                                             inputs=inputs, ladder=ladder)
    # Work units planned up front: a merge checks them before touching the folder.
    units = _plan_work(ladder, inputs, seeds=seeds, chunk_items=chunk_items, scoring_config=scoring_config,
                       audit_max_new_tokens=audit_max_new_tokens)
    own = _shards.owned_units(len(units), shard) if shard else None
    if merge:  # refuses, naming the missing shards, unless every unit is cached
        ladder.failed.update(_shards.check_merge(run_dir, units, ladder.ckpts, _cache_path, keep_going=keep_going))
    settings = _Settings(
        run_dir=run_dir, dev=dev, torch_dtype=torch_dtype, max_batch_tokens=max_batch_tokens, max_length=max_length,
        on_overflow=on_overflow, prefix_reuse=prefix_reuse, max_prefix_cache_tokens=max_prefix_cache_tokens,
        tokenizer=Path(tokenizer) if tokenizer else None, keep_going=keep_going, progress=progress and dist.is_main,
        heldout=heldout, heldout_stride=heldout_stride, audit_max_new_tokens=audit_max_new_tokens)
    res = _run_in_folder(units, own, shard, ladder, inputs, manifest, settings, dist)
    if shard and res.manifest.get("merge_claimed"):
        merged = score_checkpoints(**{**call_args, "shard": None, "merge": True})
        merged.scored = res.scored  # this shard's model work
        return merged
    return res


def _check_arguments(args: dict[str, Any]) -> tuple[list[int], tuple[int, int] | None, Path | None]:
    """Refuse bad arguments before any file is read; return the seeds, the parsed shard and the run folder."""
    shard = args["shard"]
    if shard is not None:
        if args["merge"]:
            raise UsageError("--shard and --merge exclude each other: run the shards, then one --merge.")
        shard = _shards.parse_shard(shard)
    seeds = [int(s) for s in args["seeds"]]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds: evaluation seeds must be distinct non-negative integers, got {seeds}.")
    if args["max_batch_tokens"] < 1 or args["chunk_items"] < 1:
        raise UsageError("--max-batch-tokens and --chunk-items must be positive.")
    max_length = args["max_length"]
    if max_length is not None and max_length < 2:
        raise UsageError(f"--max-length must be at least 2 tokens, got {max_length}.")
    on_overflow = args["on_overflow"]
    if on_overflow not in ("error", "truncate"):
        raise UsageError(f"--on-overflow must be 'error' or 'truncate', got {on_overflow!r}.")
    if args["max_prefix_cache_tokens"] < 1:
        raise UsageError("--max-prefix-cache-tokens must be a positive number of tokens.")
    if not args["probes"]:
        raise ProbeSpecError("no probe specs given; pass at least one, e.g. --probes probes/arith_pattern.yaml.")
    run_dir = Path(args["out"]) if args["out"] is not None else None
    if run_dir is not None:
        _check_out_dir(run_dir)
    tokenizer = args["tokenizer"]
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise UsageError(f"--tokenizer {tokenizer}: not a folder; pass a folder saved with "
                         "tokenizer.save_pretrained(...).")
    return seeds, shard, run_dir


def _read_inputs(probes, seeds: list[int], *, heldout, heldout_stride, audit_items: int,
                 calibrate: bool = False) -> _Inputs:
    """Stage 1: load the specs, generate every item, read the held-out text and pick the audited items."""
    from .probes._shipped import resolve_probe_args  # files, folders, shipped names (real, real_successive ...)

    specs = [p if isinstance(p, FamilySpec) else load_spec(p) for p in resolve_probe_args(probes)]  # cheap checks first
    if calibrate:
        from .probes._calibration import calibration_specs

        specs = specs + calibration_specs(specs)
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
    # content-free references are scored, never audited (their answers are not meant to be right)
    audit_pool = [it for it in items if get_family(it.family).kind != "calibration"]
    audit_set = select_audit_items(audit_pool, n_per_family=audit_items, seed=0, eval_seed=seeds[0]) if audit_items else []
    audit_pos = {(it.item_id, it.seed): k for k, it in enumerate(items)}
    audit_idx = sorted(audit_pos[(it.item_id, it.seed)] for it in audit_set)
    return _Inputs(specs=specs, fams=fams, items=items, item_dicts=item_dicts, items_hash=items_hash,
                   heldout_texts=heldout_texts, heldout_hash=heldout_hash, gen=gen, audit_idx=audit_idx,
                   persona_specs={s.family: s for s in specs if is_persona_spec(s)})


def _discover(checkpoints, specs: list[FamilySpec], *, keep_going: bool, fingerprint: str,
              allow_tokenizer_mismatch: bool) -> _Ladder:
    """Stage 2: the checkpoints to score. A folder is discovered (with keep_going, a checkpoint
    rejected here, e.g. a corrupt config or truncated weights, is recorded as failed and skipped)."""
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
    return _Ladder(ckpts=ckpts, failed=failed, n_found=n_found)


def _new_manifest(args: dict[str, Any], *, seeds: list[int], shard, dev: torch.device, world_size: int,
                  inputs: _Inputs, ladder: _Ladder) -> tuple[dict, dict]:
    """The scoring config that enters every cache key, and the run's manifest (status ``running``)."""
    checkpoints, heldout, specs = args["checkpoints"], args["heldout"], inputs.specs
    scoring_config = {"dtype": args["dtype"], "device_type": dev.type, "max_length": args["max_length"],
                      "scorer": "spans-v1"}
    config = {
        "checkpoints": str(checkpoints) if isinstance(checkpoints, (str, Path)) else [c.name for c in ladder.ckpts],
        "probes": [s.to_dict() for s in specs],
        "seeds": seeds,
        "dtype": args["dtype"],
        "device": str(dev),
        "world_size": world_size,
        "max_batch_tokens": args["max_batch_tokens"],
        "prefix_reuse": args["prefix_reuse"],
        "max_prefix_cache_tokens": args["max_prefix_cache_tokens"],
        "max_length": args["max_length"],
        "on_overflow": args["on_overflow"],
        "chunk_items": args["chunk_items"],
        "tokenizer": str(args["tokenizer"]) if args["tokenizer"] else None,
        "allow_tokenizer_mismatch": args["allow_tokenizer_mismatch"],
        "keep_going": args["keep_going"],
        "heldout": str(heldout) if heldout is not None else None,
        "heldout_stride": args["heldout_stride"],
        "generation": inputs.gen,
        "audit_items": args["audit_items"],
        "audit_max_new_tokens": args["audit_max_new_tokens"],
        "fingerprint": args["fingerprint"],
        "shard": list(shard) if shard else None,
        "merge": args["merge"],
        **({"calibrate": True} if args.get("calibrate") else {}),
    }
    manifest = base_manifest("score", config)
    manifest.update(
        status="running",
        checkpoints=[c.to_dict() for c in ladder.ckpts],
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
        items_hash=inputs.items_hash,
        heldout={"path": str(heldout), "sha256": sha256_file(Path(heldout)) if Path(heldout).is_file() else None,
                 "content_hash": inputs.heldout_hash, "n_docs": len(inputs.heldout_texts)}
        if inputs.heldout_texts else None,
        scoring_config=scoring_config,
        complete=[],
        failed=[{"checkpoint": n, "error": e} for n, e in ladder.failed.items()],
    )
    return scoring_config, manifest


def _plan_work(ladder: _Ladder, inputs: _Inputs, *, seeds: list[int], chunk_items: int, scoring_config: dict,
               audit_max_new_tokens: int) -> list[WorkUnit]:
    """Stage 3: every work unit of the run, in a fixed order (the cache keys and the shards' shares)."""
    ckpts, persona_specs = ladder.ckpts, inputs.persona_specs
    units: list[WorkUnit] = _plan_units(ckpts, inputs.items, [f for f in inputs.fams if f not in persona_specs],
                                        chunk_items, scoring_config, inputs.heldout_hash, inputs.gen, inputs.audit_idx,
                                        audit_max_new_tokens)
    units.extend(WorkUnit(ci, f, 0, (0, 0), canonical_json_hash({"fp": ck.fingerprint, "persona": sp.spec_hash,
                                                                  "seeds": seeds, "cfg": scoring_config}),
                          task="persona")
                 for ci, ck in enumerate(ckpts) for f, sp in persona_specs.items())
    return units


def _run_in_folder(units, own, shard, ladder: _Ladder, inputs: _Inputs, manifest: dict, settings: _Settings,
                   dist) -> ScoreResult:
    """Stages 4-5 under the run folder's lock; an interrupted or failed run says so in its manifest
    and leaves the previous tables in place."""
    run_dir = settings.run_dir
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
            _shards.begin_shard(run_dir, shard, manifest, units, own, ladder.ckpts, _cache_path)
        if writer:
            old_manifest = _open_run_folder(run_dir, manifest)
        dist.barrier()
        return _score_run(units, own, shard, ladder, inputs, manifest, settings, dist, old_manifest)
    except KeyboardInterrupt:
        saved = _units_saved(run_dir, ladder.ckpts, units)
        if writer:
            manifest.update(status="interrupted", units_saved=saved,
                            error="interrupted (Ctrl-C or SIGTERM); re-run the same command to resume")
            atomic_write_json(run_dir / "manifest.json", manifest)
        raise RunInterrupted(saved, run_dir) from None
    except BaseException as exc:
        if writer:
            manifest.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                            units_saved=_units_saved(run_dir, ladder.ckpts, units))
            atomic_write_json(run_dir / "manifest.json", manifest)
        raise
    finally:
        if lock is not None:
            lock.release()


def _open_run_folder(run_dir: Path, manifest: dict) -> dict | None:
    """Mark the folder as running (before any work) and return its previous manifest."""
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
    return old_manifest


# Final tables of a score run: written to a staging folder and swapped in together.
_TABLES = ("items.jsonl", "scores.parquet", "summary.csv", "generations.parquet", "audit.parquet", "audit_summary.csv",
           "persona.parquet")
# Files later stages derive from the tables; moved aside when the tables change.
_DOWNSTREAM = ("dynamics", "shortlist.csv", "shortlist.json", "report.md", "report.html", "report_figures",
               "plan.lock.json", "pilot", "selection.json", "selection.csv", "confirm", "averaged")


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


@contextlib.contextmanager
def _generation_overflow(what: str, items, skip: str = "--audit-items 0 to skip the audit"):
    """Turn a generation prompt that does not fit the context (``on_overflow="error"``) into
    a ScoringError that names the items and the fixes."""
    from .generation import ContextOverflowError

    try:
        yield
    except ContextOverflowError as exc:
        it = items[exc.prompts[0]]
        raise ScoringError(
            f"{what}: {len(exc.prompts)} of {len(items)} prompts do not fit the {exc.limit}-token context with the "
            f"tokens to generate (first: item {it.item_id}, seed {it.seed}: {exc}). Pass --on-overflow truncate (in a "
            "run config: score.on_overflow: truncate) to cut them from the left as lm-eval does (counted in the "
            f"manifest and report), or {skip}.") from None


# ---------------------------------------------------------------------------
# Stage 4: run this process's units, one checkpoint resident at a time
# ---------------------------------------------------------------------------


@dataclass
class _Work:
    """What one process did in stage 4 (unit results keyed by the unit's index in the plan)."""

    assigned: list[int]  # unit indices given to this process
    done: dict[int, pd.DataFrame] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # checkpoint -> load error (keep_going)
    scored: set[str] = field(default_factory=set)  # checkpoints with model work now
    computed: set[int] = field(default_factory=set)  # units computed now (not read from the cache)
    n_cached: int = 0


@dataclass
class _UnitContext:
    """An engine's hand-off: one loaded checkpoint and what its units need."""

    ckpt: Checkpoint
    model: Any
    tokenizer: Any
    encoded: list[EncodedGroup]  # every item, encoded with this checkpoint's tokenizer
    inputs: _Inputs
    settings: _Settings
    seeds: list[int]

    @property
    def gen_share(self) -> int:
        """Shared-prefix length from which generation prefills a prompt prefix once (0 = never)."""
        return MIN_SHARED_PREFIX if self.settings.prefix_reuse else 0


def _score_run(units, own, shard, ladder: _Ladder, inputs: _Inputs, manifest: dict, settings: _Settings, dist,
               old_manifest: dict | None) -> ScoreResult:
    """Stages 4-5: run this process's share of the units, gather every process's, build and write the tables."""
    pool = own if own is not None else range(len(units))
    mine = [units[pool[i]] for i in split_contiguous(len(pool), dist.world_size, dist.rank)]
    work = _run_units(units, mine, ladder, inputs, settings, manifest["seeds"])
    gathered = _gather(work, ladder.failed, dist)
    if shard:
        return _shard_result(gathered, units, own, shard, ladder, inputs, manifest, settings.run_dir, dist)
    missing = [u for i, u in enumerate(units) if i not in gathered.done and ladder.ckpts[u.ckpt_index].name not in ladder.failed]
    if missing:  # cannot happen unless a rank died silently; never present partial results
        raise RuntimeError(f"{len(missing)} work units produced no result")
    tables = _build_tables(gathered.done, units, inputs.item_dicts)
    _complete_manifest(manifest, ladder, inputs.fams, units, gathered, tables)
    superseded: list[str] = []
    if settings.run_dir is not None and dist.is_main:
        superseded = _write_tables(settings.run_dir, tables, manifest, old_manifest)
    dist.barrier()
    return ScoreResult(items=pd.DataFrame(tables.item_dicts), scores=tables.scores, summary=tables.summary,
                       manifest=manifest, run_dir=settings.run_dir, scored=manifest["scored_now"],
                       failed=dict(ladder.failed), generations=tables.generations, audit=tables.audit,
                       audit_summary=tables.audit_summary, n_checkpoints=ladder.n_found, units_total=len(units),
                       units_cached=gathered.n_cached, superseded=superseded, n_truncated=tables.n_truncated,
                       persona=tables.persona)


def _run_units(units, mine, ladder: _Ladder, inputs: _Inputs, settings: _Settings, seeds: list[int]) -> _Work:
    """Stage 4: for each checkpoint, reuse its cached units, then load it once and run the rest."""
    unit_index = {u: i for i, u in enumerate(units)}
    work = _Work(assigned=sorted(unit_index[u] for u in mine))
    tokenizers: dict[Any, tuple[Any, list[EncodedGroup]]] = {}  # tokenizer key -> (tokenizer, encoded items)
    by_ckpt: dict[int, list[WorkUnit]] = {}
    for u in mine:
        by_ckpt.setdefault(u.ckpt_index, []).append(u)
    outer = tqdm(by_ckpt.items(), desc="checkpoints", unit="ckpt", disable=not settings.progress)
    for ci, ck_units in outer:
        ckpt = ladder.ckpts[ci]
        outer.set_postfix_str(ckpt.name)
        todo = _reuse_cached(ckpt, ck_units, settings, work, unit_index)
        if not todo or ckpt.name in ladder.failed:  # (failed: recorded by a shard, merged with --keep-going)
            continue
        ctx = _open_checkpoint(ckpt, inputs, settings, seeds, tokenizers, work)
        if ctx is None:
            continue
        try:
            for u, cache in todo:
                part = _ENGINES[u.task](ctx, u)
                if cache is not None:
                    atomic_write_parquet(cache, part)
                work.done[unit_index[u]] = part
                work.computed.add(unit_index[u])
                work.scored.add(ckpt.name)
        finally:
            del ctx  # the model: one checkpoint resident at a time
            gc.collect()
            if settings.dev.type == "cuda":
                torch.cuda.empty_cache()
    outer.close()
    return work


def _reuse_cached(ckpt: Checkpoint, ck_units: list[WorkUnit], settings: _Settings, work: _Work,
                  unit_index: dict) -> list[tuple[WorkUnit, Path | None]]:
    """Take the checkpoint's units that the run folder's cache holds; return the others with their cache path."""
    run_dir, todo = settings.run_dir, []
    for u in ck_units:
        cache = _cache_path(run_dir, ckpt, u) if run_dir else None
        part = pd.read_parquet(cache) if cache is not None and cache.is_file() else None
        if part is not None and u.task == "spans" and "truncated_tokens" not in part.columns:
            part = None  # cached before truncation was recorded: score it again
        if (part is not None and u.task in ("spans", "gen", "audit") and settings.on_overflow == "error"
                and "truncated_tokens" in part.columns and (part["truncated_tokens"] > 0).any()):
            raise ScoringError(
                f"{cache}: cached scores of family {u.family} were computed with truncated prompts "
                "(--on-overflow truncate); pass --on-overflow truncate again or use a fresh --out.")
        if part is not None:
            work.done[unit_index[u]] = part
            work.n_cached += 1
        else:
            todo.append((u, cache))
    return todo


def _open_checkpoint(ckpt: Checkpoint, inputs: _Inputs, settings: _Settings, seeds: list[int], tokenizers: dict,
                     work: _Work) -> _UnitContext | None:
    """Load the checkpoint's tokenizer (items are encoded once per distinct tokenizer) and its
    model; with ``keep_going`` a checkpoint that fails to load is recorded and skipped (None)."""
    try:
        tok_key = "override" if settings.tokenizer else ckpt.tokenizer_hash or ckpt.name
        if tok_key not in tokenizers:
            tok = load_tokenizer(settings.tokenizer or ckpt.path)
            tokenizers[tok_key] = (tok, _encode_items(tok, inputs.items))
        model = load_model(ckpt.path, settings.torch_dtype, settings.dev)
    except CheckpointError as exc:
        if not settings.keep_going:
            raise
        log.warning("skipping %s: %s", ckpt.name, exc)
        work.failed[ckpt.name] = str(exc)
        return None
    tok, encoded = tokenizers[tok_key]
    return _UnitContext(ckpt=ckpt, model=model, tokenizer=tok, encoded=encoded, inputs=inputs, settings=settings,
                        seeds=seeds)


def _spans_engine(ctx: _UnitContext, u: WorkUnit) -> pd.DataFrame:
    """Answer-span log-probabilities of a chunk of items (:func:`spans.score_groups`)."""
    s, e = u.item_slice
    st, items = ctx.settings, ctx.inputs.items
    limit = st.max_length or _model_max_length(ctx.model)
    enc = ctx.encoded[s:e]
    trunc = _overflow(enc, limit)
    over = [k for k, t in enumerate(trunc) if t]
    if over and st.on_overflow == "error":
        k = over[0]
        it = items[s + k]
        need = len(enc[k].context_ids) + max(len(c) for c in enc[k].continuations) - 1
        raise _overflow_error(u.family, len(over), e - s, f"item {it.item_id} (seed {it.seed})", need, limit)
    return _score_unit(ctx.ckpt, ctx.model, items[s:e], enc, trunc, max_batch_tokens=st.max_batch_tokens,
                       max_length=st.max_length, device=st.dev, progress=st.progress,
                       prefix_reuse=st.prefix_reuse, max_prefix_cache_tokens=st.max_prefix_cache_tokens)


def _nll_engine(ctx: _UnitContext, u: WorkUnit) -> pd.DataFrame:
    """Held-out bits per byte (:func:`capability.heldout_nll`)."""
    st = ctx.settings
    with tqdm(total=None, desc=f"  {ctx.ckpt.name} held-out NLL", unit="window", leave=False,
              disable=not st.progress) as bar:
        return _nll_unit(ctx.ckpt, ctx.model, ctx.tokenizer, ctx.inputs.heldout_texts, max_length=st.max_length,
                         stride=st.heldout_stride, device=st.dev, source=str(st.heldout), progress=bar)


def _gen_engine(ctx: _UnitContext, u: WorkUnit) -> pd.DataFrame:
    """Sampled generations of a family (:func:`generation.persona_generation_table`)."""
    s, e = u.item_slice
    g, st = ctx.inputs.gen[u.family], ctx.settings
    with tqdm(total=e - s, desc=f"  {ctx.ckpt.name} {u.family} sampling", unit="prompt", leave=False,
              disable=not st.progress) as bar, _generation_overflow(
                  f"{u.family} sampling", ctx.inputs.items[s:e], "a smaller gen_max_new_tokens in the spec's params"):
        return _with_checkpoint(persona_generation_table(
            ctx.model, ctx.tokenizer, ctx.inputs.items[s:e], n=g["n"], temperature=g["temperature"],
            max_new_tokens=g["max_new_tokens"], seed=0, min_shared_prefix=ctx.gen_share, progress=bar,
            max_length=st.max_length, on_overflow=st.on_overflow), ctx.ckpt)


def _persona_engine(ctx: _UnitContext, u: WorkUnit) -> pd.DataFrame:
    """GDsuite persona generations (:func:`probes._gdsuite.gdsuite_persona_table`)."""
    st = ctx.settings
    return _with_checkpoint(gdsuite_persona_table(ctx.model, ctx.tokenizer, ctx.inputs.persona_specs[u.family],
                                                  ctx.seeds, min_shared_prefix=ctx.gen_share,
                                                  max_length=st.max_length, on_overflow=st.on_overflow), ctx.ckpt)


def _audit_engine(ctx: _UnitContext, u: WorkUnit) -> pd.DataFrame:
    """Greedy generative audit of the audited items (:func:`generation.generative_audit`)."""
    audit_idx, st = ctx.inputs.audit_idx, ctx.settings
    audited = [ctx.inputs.items[k] for k in audit_idx]
    with tqdm(total=len(audit_idx), desc=f"  {ctx.ckpt.name} generative audit", unit="item", leave=False,
              disable=not st.progress) as bar, _generation_overflow("generative audit", audited):
        return _with_checkpoint(generative_audit(
            ctx.model, ctx.tokenizer, audited, max_new_tokens=st.audit_max_new_tokens,
            min_shared_prefix=ctx.gen_share, progress=bar, max_length=st.max_length,
            on_overflow=st.on_overflow), ctx.ckpt)


# WorkUnit.task -> the engine that runs it.
_ENGINES = {"spans": _spans_engine, "nll": _nll_engine, "gen": _gen_engine, "persona": _persona_engine,
            "audit": _audit_engine}


@dataclass
class _Gathered:
    """Every process's stage-4 results, identical on all ranks."""

    done: dict[int, pd.DataFrame]
    scored: list[str]
    n_cached: int
    units_by_rank: list[dict]


def _gather(work: _Work, failed: dict[str, str], dist) -> _Gathered:
    """Gather every rank's units (and failures, into ``failed``) so all ranks hold the same tables.
    Each rank also reports which units it was assigned and which it computed now (manifest
    ``units_by_rank``), so a test can see that the work was really sharded."""
    gathered = dist.all_gather((work.done, work.failed, sorted(work.scored), work.n_cached, work.assigned,
                                sorted(work.computed)))
    out = _Gathered(done={}, scored=[], n_cached=0, units_by_rank=[])
    for r, (d, f, sc, nc, assigned, comp) in enumerate(gathered):
        out.units_by_rank.append({"rank": r, "assigned": assigned, "computed": comp})
        out.done.update(d)
        failed.update(f)
        out.scored.extend(sc)
        out.n_cached += nc
    return out


def _shard_result(gathered: _Gathered, units, own, shard, ladder: _Ladder, inputs: _Inputs, manifest: dict,
                  run_dir: Path | None, dist) -> ScoreResult:
    """A shard writes its record instead of the tables; it returns its own span scores."""
    failed, scored_list = ladder.failed, gathered.scored
    rec, merge_now = _shards.finish_shard(run_dir, shard, manifest, units, own, ladder.ckpts, _cache_path,
                                          failed=failed, scored=scored_list, dist=dist)
    rec["merge_claimed"] = merge_now
    scores = pd.concat([gathered.done[i] for i in sorted(gathered.done) if units[i].task == "spans"] or [pd.DataFrame()],
                       ignore_index=True)
    return ScoreResult(items=pd.DataFrame(inputs.item_dicts), scores=scores, summary=pd.DataFrame(), manifest=rec,
                       run_dir=run_dir, scored=[c.name for c in ladder.ckpts if c.name in set(scored_list)],
                       failed=dict(failed), n_checkpoints=ladder.n_found, units_total=len(own),
                       units_cached=gathered.n_cached)


# ---------------------------------------------------------------------------
# Stage 5: tables and manifest
# ---------------------------------------------------------------------------


@dataclass
class _Tables:
    """The run's final tables (None: not written)."""

    item_dicts: list[dict]
    scores: pd.DataFrame
    summary: pd.DataFrame
    n_truncated: int
    generations: pd.DataFrame | None
    audit: pd.DataFrame | None
    audit_summary: pd.DataFrame | None
    persona: pd.DataFrame | None


def _parts(done: dict[int, pd.DataFrame], units, task: str) -> list[pd.DataFrame]:
    return [done[i] for i, u in enumerate(units) if i in done and u.task == task]


def _build_tables(done: dict[int, pd.DataFrame], units, item_dicts: list[dict]) -> _Tables:
    """Concatenate the unit results in plan order and summarize them."""
    parts = _parts(done, units, "spans")
    scores = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    summary, n_truncated = _span_summary(scores)
    gen_parts, audit_parts, persona_parts = (_parts(done, units, t) for t in ("gen", "audit", "persona"))
    generations = pd.concat(gen_parts, ignore_index=True) if gen_parts else None
    persona = pd.concat(persona_parts, ignore_index=True) if persona_parts else None
    audit = pd.concat(audit_parts, ignore_index=True) if audit_parts else None
    audit_summary = summarize_audit(audit, scores) if audit is not None and len(scores) else None
    if generations is not None and len(summary):
        gsum = summarize_generation(generations, by=["checkpoint", "family", "variant"])
        summary = summary.merge(gsum, on=["checkpoint", "family", "variant"], how="left")
    if persona is not None:
        summary = pd.concat([summary, summarize_persona(persona)], ignore_index=True)
    nll_parts = _parts(done, units, "nll")
    if nll_parts:
        nll = pd.concat(nll_parts, ignore_index=True)
        summary = pd.concat([summary, nll], ignore_index=True)
    if len(summary):
        summary = _with_calibration(summary)
        summary = _sort_summary(summary)
        for col in ("n_items", "n_seeds", "n_samples", "gen_items", "gen_n", "n_tokens", "n_bytes", "n_docs", "truncated_items"):
            if col in summary.columns:
                summary[col] = summary[col].astype("Int64")
    if len(scores):  # items.jsonl: the most tokens any checkpoint's tokenizer cut from the item's prompt
        cut = scores.groupby(["family", "item_id", "seed"])["truncated_tokens"].max().to_dict()
        item_dicts = [{**d, "truncated_tokens": int(cut.get((d["family"], d["item_id"], d["seed"]), 0))}
                      for d in item_dicts]
    return _Tables(item_dicts=item_dicts, scores=scores, summary=summary, n_truncated=n_truncated,
                   generations=generations, audit=audit, audit_summary=audit_summary, persona=persona)


def _with_calibration(summary: pd.DataFrame) -> pd.DataFrame:
    """With content-free reference rows (``<family>_cf``, ``score --calibrate``): the columns
    ``cf_mean_margin`` and ``calibrated_mean_margin`` (= mean_margin - cf_mean_margin) on the rows of
    the families they calibrate (NaN elsewhere). Without them the summary is returned unchanged."""
    from .probes._calibration import calibrated_margins

    cal = calibrated_margins(summary)
    if cal.empty:
        return summary
    cols = cal[["checkpoint", "family", "variant", "cf_mean_margin", "calibrated_mean_margin"]]
    return summary.merge(cols, on=["checkpoint", "family", "variant"], how="left")


def _span_summary(scores: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """summary.csv's span rows with ``truncated_items``, and the number of truncated score rows."""
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
    return summary, n_truncated


def _complete_manifest(manifest: dict, ladder: _Ladder, fams: list[str], units, gathered: _Gathered,
                       tables: _Tables) -> None:
    """Record in the manifest what was complete, failed, scored now and read from the cache."""
    ckpts, failed, scored = ladder.ckpts, ladder.failed, set(gathered.scored)
    manifest["complete"] = [{"checkpoint": c.name, "family": f} for c in ckpts if c.name not in failed for f in fams]
    manifest["failed"] = [{"checkpoint": n, "error": e} for n, e in failed.items()]
    manifest["status"] = "complete" if not failed else "incomplete"
    from ._guards import nonfinite_checkpoints

    manifest["nonfinite"] = nonfinite_checkpoints(tables.scores, ckpts)  # NaN/inf weights or scores: warned, report flags
    manifest["scored_now"] = [c.name for c in ckpts if c.name in scored]
    manifest["n_checkpoints_found"] = ladder.n_found
    manifest["units"] = {"total": len(units), "from_cache": gathered.n_cached,
                         "scored_now": len(gathered.done) - gathered.n_cached}
    manifest["truncated_rows"] = tables.n_truncated
    manifest["n_scored_rows"] = len(tables.scores)
    _record_generation_cuts(manifest, tables)
    manifest["units_by_rank"] = gathered.units_by_rank
    manifest["peak_rss_mib"] = _peak_rss_mib()


def _record_generation_cuts(manifest: dict, tables: _Tables) -> None:
    """Count generation prompts cut to fit the context (audit: one row per checkpoint x item;
    sampling: one row per checkpoint x item, all its samples share the cut prompt; persona:
    checkpoint x seed x persona x question) and warn when any was cut."""
    frames = (("audit", tables.audit), ("sampling", tables.generations), ("persona", tables.persona))
    manifest["truncated_generation_rows"] = {
        name: int((df["truncated_tokens"] > 0).sum()) if df is not None and "truncated_tokens" in df.columns else 0
        for name, df in frames}
    manifest["generation_rows"] = {name: 0 if df is None else len(df) for name, df in frames}
    if any(manifest["truncated_generation_rows"].values()):
        log.warning("generation prompts cut from the left to fit the context (--on-overflow truncate): %s; see "
                    "truncated_tokens in audit.parquet / generations.parquet.",
                    ", ".join(f"{k} {v} of {manifest['generation_rows'][k]}"
                              for k, v in manifest["truncated_generation_rows"].items() if v))


def _write_tables(run_dir: Path, tables: _Tables, manifest: dict, old_manifest: dict | None) -> list[str]:
    """Stage every table, then swap them in together: until this point the previous run's
    complete tables stay in place (a failed or interrupted re-run keeps them). Returns the
    downstream files moved aside because the tables changed."""
    staging = run_dir / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    atomic_write_jsonl(staging / "items.jsonl", tables.item_dicts)
    atomic_write_parquet(staging / "scores.parquet", tables.scores)
    atomic_write_csv(staging / "summary.csv", tables.summary)
    for name, df in (("generations.parquet", tables.generations), ("audit.parquet", tables.audit),
                     ("persona.parquet", tables.persona)):
        if df is not None:
            atomic_write_parquet(staging / name, df)
    if tables.audit_summary is not None:
        atomic_write_csv(staging / "audit_summary.csv", tables.audit_summary)
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
    return superseded
