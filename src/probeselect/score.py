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
from .capability import heldout_nll, load_heldout_texts
from .generation import (
    generative_audit,
    persona_generation_table,
    select_audit_items,
    summarize_audit,
    summarize_generation,
)
from .probes import FamilySpec, ProbeItem, generate_items, get_family, load_spec
from ._dist import dist_context, split_contiguous
from .spans import EncodedGroup, encode_pair, group_pairs, score_groups
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
    failed: dict[str, str] = field(default_factory=dict)  # checkpoint -> load error (keep_going)
    generations: pd.DataFrame | None = None  # sampled-generation counts per item (gen families)
    audit: pd.DataFrame | None = None  # greedy generative audit, one row per audited item
    audit_summary: pd.DataFrame | None = None


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

    transformers.utils.logging.disable_progress_bar()  # one line per checkpoint is enough
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
    return model.to(device).eval()


def _item_rows(items: Sequence[ProbeItem]) -> list[dict]:
    return [it.to_dict() for it in items]


def _encode_items(tokenizer, items: Sequence[ProbeItem]) -> list[EncodedGroup]:
    """Tokenize every (prompt, candidate) pair once; one group per item."""
    return [
        group_pairs(
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


def _nll_unit(ckpt: Checkpoint, model, tokenizer, texts, *, max_length, stride, device, source: str) -> pd.DataFrame:
    res = heldout_nll(model, tokenizer, texts, max_length=max_length, stride=stride, device=device)
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


def _score_unit(ckpt: Checkpoint, model, items, encoded, *, max_batch_tokens, max_length, device, progress) -> pd.DataFrame:
    bar = tqdm(total=len(items), desc=f"  {ckpt.name}", unit="item", leave=False, disable=not progress)
    try:
        spans = score_groups(model, encoded, max_batch_tokens=max_batch_tokens, max_length=max_length,
                             device=device, progress=bar)
    finally:
        bar.close()
    rows = []
    for it, sc in zip(items, spans):
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
    order = {"conflict": 0, "capability": 1, "nll": 2}
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
    tokenizer: str | Path | None = None,
    allow_tokenizer_mismatch: bool = False,
    keep_going: bool = False,
    chunk_items: int = 1024,
    heldout: str | Path | None = None,
    heldout_stride: int | None = None,
    audit_items: int = 50,
    audit_max_new_tokens: int = 16,
    progress: bool = True,
) -> ScoreResult:
    """Score every checkpoint with every probe spec under every evaluation seed.

    ``checkpoints`` is a directory (see :func:`discover_checkpoints`) or a list of
    :class:`Checkpoint`; ``probes`` are spec files or :class:`FamilySpec` objects.
    Margins are in nats. Work is split into (checkpoint, family, item-chunk) units; with
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
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ProbeSpecError(f"seeds must be a non-empty list of distinct integers, got {seeds}.")
    if max_batch_tokens < 1 or chunk_items < 1:
        raise ProbeSpecError("max_batch_tokens and chunk_items must be positive.")
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
    # Items grouped by family (contiguous), then seed, variant, index.
    items = [it for s in specs for it in generate_items(s, seeds)]
    item_dicts = _item_rows(items)
    items_hash = canonical_json_hash(item_dicts)
    heldout_texts = load_heldout_texts(heldout) if heldout is not None else None
    heldout_hash = canonical_json_hash({"texts": heldout_texts, "stride": heldout_stride}) if heldout_texts else None

    gen = {s.family: g for s in specs if (g := _gen_settings(s)) is not None}
    if audit_items < 0:
        raise ProbeSpecError("audit_items must be >= 0.")
    audit_set = select_audit_items(items, n_per_family=audit_items, seed=0, eval_seed=seeds[0]) if audit_items else []
    audit_pos = {(it.item_id, it.seed): k for k, it in enumerate(items)}
    audit_idx = sorted(audit_pos[(it.item_id, it.seed)] for it in audit_set)

    dist = dist_context()
    if device == "auto" and dist.world_size > 1 and torch.cuda.is_available():
        device = f"cuda:{dist.local_rank}"
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    progress = progress and dist.is_main
    scoring_config = {"dtype": dtype, "device_type": dev.type, "max_length": max_length, "scorer": "spans-v1"}
    config = {
        "checkpoints": str(checkpoints) if isinstance(checkpoints, (str, Path)) else [c.name for c in ckpts],
        "probes": [s.to_dict() for s in specs],
        "seeds": seeds,
        "dtype": dtype,
        "device": str(dev),
        "world_size": dist.world_size,
        "max_batch_tokens": max_batch_tokens,
        "max_length": max_length,
        "chunk_items": chunk_items,
        "tokenizer": str(tokenizer) if tokenizer else None,
        "allow_tokenizer_mismatch": allow_tokenizer_mismatch,
        "keep_going": keep_going,
        "heldout": str(heldout) if heldout is not None else None,
        "heldout_stride": heldout_stride,
        "generation": gen,
        "audit_items": audit_items,
        "audit_max_new_tokens": audit_max_new_tokens,
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
        failed=[],
    )
    run_dir = Path(out) if out is not None else None
    if run_dir is not None and dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Mark the folder as in progress before touching outputs: stale tables from an
        # earlier run must never sit next to a manifest that calls them complete.
        atomic_write_json(run_dir / "manifest.json", manifest)
        for name in ("scores.parquet", "summary.csv", "generations.parquet", "audit.parquet", "audit_summary.csv"):
            (run_dir / name).unlink(missing_ok=True)
        atomic_write_jsonl(run_dir / "items.jsonl", item_dicts)
        # A SIGKILL between mkstemp and os.replace leaves a hidden ".<name>.<random>.tmp";
        # the final file is never torn, but the orphan is removed here (no other writer runs).
        for orphan in (run_dir / "cache").glob("*/.*.tmp"):
            orphan.unlink(missing_ok=True)
    dist.barrier()

    units = _plan_units(ckpts, items, fams, chunk_items, scoring_config, heldout_hash, gen, audit_idx,
                        audit_max_new_tokens)
    mine = [units[i] for i in split_contiguous(len(units), dist.world_size, dist.rank)]
    encoded_by_tok: dict[Any, list[EncodedGroup]] = {}
    tokenizers: dict[Any, Any] = {}
    tok_override = Path(tokenizer) if tokenizer else None
    done: dict[int, pd.DataFrame] = {}  # unit index -> rows
    scored_now: set[str] = set()
    failed: dict[str, str] = {}
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
            if cache is not None and cache.is_file():
                done[unit_index[u]] = pd.read_parquet(cache)
            else:
                todo.append((u, cache))
        if not todo:
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
            failed[ckpt.name] = str(exc)
            continue
        try:
            for u, cache in todo:
                s, e = u.item_slice
                if u.task == "nll":
                    part = _nll_unit(ckpt, model, tokenizers[tok_key], heldout_texts, max_length=max_length,
                                     stride=heldout_stride, device=dev, source=str(heldout))
                elif u.task == "gen":
                    g = gen[u.family]
                    part = _with_checkpoint(persona_generation_table(
                        model, tokenizers[tok_key], items[s:e], n=g["n"], temperature=g["temperature"],
                        max_new_tokens=g["max_new_tokens"], seed=0), ckpt)
                elif u.task == "audit":
                    part = _with_checkpoint(generative_audit(
                        model, tokenizers[tok_key], [items[k] for k in audit_idx],
                        max_new_tokens=audit_max_new_tokens), ckpt)
                else:
                    part = _score_unit(ckpt, model, items[s:e], encoded_by_tok[tok_key][s:e],
                                       max_batch_tokens=max_batch_tokens, max_length=max_length, device=dev,
                                       progress=progress)
                if cache is not None:
                    atomic_write_parquet(cache, part)
                done[unit_index[u]] = part
                scored_now.add(ckpt.name)
        finally:
            del model
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    outer.close()

    # Gather every rank's units (and failures) so all ranks hold the same tables.
    gathered = dist.all_gather((done, failed, sorted(scored_now)))
    done, failed, scored_list = {}, {}, []
    for d, f, sc in gathered:
        done.update(d)
        failed.update(f)
        scored_list.extend(sc)
    missing = [u for i, u in enumerate(units) if i not in done and ckpts[u.ckpt_index].name not in failed]
    if missing:  # cannot happen unless a rank died silently; never present partial results
        raise RuntimeError(f"{len(missing)} work units produced no result")
    parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "spans"]
    nll_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "nll"]
    scores = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    summary = summarize_scores(scores) if len(scores) else pd.DataFrame()
    gen_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "gen"]
    audit_parts = [done[i] for i, u in enumerate(units) if i in done and u.task == "audit"]
    generations = pd.concat(gen_parts, ignore_index=True) if gen_parts else None
    audit = pd.concat(audit_parts, ignore_index=True) if audit_parts else None
    audit_summary = summarize_audit(audit, scores) if audit is not None and len(scores) else None
    if generations is not None and len(summary):
        gsum = summarize_generation(generations, by=["checkpoint", "family", "variant"])
        summary = summary.merge(gsum, on=["checkpoint", "family", "variant"], how="left")
    if nll_parts:
        nll = pd.concat(nll_parts, ignore_index=True)
        summary = pd.concat([summary, nll], ignore_index=True)
    if len(summary):
        summary = _sort_summary(summary)
        for col in ("n_items", "n_seeds", "gen_items", "gen_n", "n_tokens", "n_bytes", "n_docs"):
            if col in summary.columns:
                summary[col] = summary[col].astype("Int64")
    items_df = pd.DataFrame(item_dicts)
    manifest["complete"] = [{"checkpoint": c.name, "family": f} for c in ckpts if c.name not in failed for f in fams]
    manifest["failed"] = [{"checkpoint": n, "error": e} for n, e in failed.items()]
    manifest["status"] = "complete" if not failed else "incomplete"
    manifest["scored_now"] = [c.name for c in ckpts if c.name in set(scored_list)]
    manifest["peak_rss_mib"] = _peak_rss_mib()
    if run_dir is not None and dist.is_main:
        outputs = ["items.jsonl", "scores.parquet", "summary.csv"]
        atomic_write_parquet(run_dir / "scores.parquet", scores)
        atomic_write_csv(run_dir / "summary.csv", summary)
        for name, df in (("generations.parquet", generations), ("audit.parquet", audit)):
            if df is not None:
                atomic_write_parquet(run_dir / name, df)
                outputs.append(name)
        if audit_summary is not None:
            atomic_write_csv(run_dir / "audit_summary.csv", audit_summary)
            outputs.append("audit_summary.csv")
        manifest["outputs"] = {name: sha256_file(run_dir / name) for name in outputs}
        atomic_write_json(run_dir / "manifest.json", manifest)
    dist.barrier()
    return ScoreResult(items=items_df, scores=scores, summary=summary, manifest=manifest, run_dir=run_dir,
                       scored=manifest["scored_now"], failed=dict(failed), generations=generations, audit=audit,
                       audit_summary=audit_summary)
