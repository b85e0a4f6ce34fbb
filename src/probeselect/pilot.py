"""``run_pilot``: matched pilot SFT of every shortlisted base under every seed.

Every base trained under one seed sees exactly the same examples in the same order (the
seed's data manifest, built once before any training and written to
``OUT/data_manifest-seed<S>.json``), so bases differ only in their weights. After training
each (base, seed) is evaluated on the recipe's held-out transfer suite
(:func:`probeselect.transfer.evaluate_transfer`).

Output layout (``OUT``)::

    manifest.json                       versions, git, resolved recipe + sha256, bases, seeds, manifest hashes
    data_manifest-seed<S>.json          example ids and supervised tokens per optimizer step
    <base>/seed<S>/train_log.jsonl      one row per optimizer step (see probeselect.sft.loop)
    <base>/seed<S>/lineage.json         training segments; a resume names its parent state
    <base>/seed<S>/state/               full-state checkpoints
    <base>/seed<S>/adapter/             peft adapter (model/ for full fine-tuning; merged/ on request)
    <base>/seed<S>/transfer_items.parquet
    <base>/seed<S>/done.json            run summary and hashes; its presence marks the pair finished
    transfer.csv                        base, seed, metric, value, n
    <base>/base/transfer_items.parquet  the base's transfer BEFORE SFT (same harness and prompts), with done.json
    transfer_base.csv                   base, seed ("base"), metric, value, n: the pre-SFT transfer (SFT lift =
                                        transfer.csv - transfer_base.csv)
    transfer_items.parquet              base, seed, metric, item_id, kind, value, weight
    diagnostics.csv                     one row per base x seed (pre-clip norm quantiles, clip fraction, ...)

Leakage guard, before any training or output: the transfer suite must not repeat a
shortlisting probe item (``transfer.probe_items``; when it is not declared and ``bases`` is
a shortlist.csv or score run folder, that score run's ``items.jsonl``) and its tasks must
be of kinds absent from the SFT data (:func:`probeselect.transfer.check_disjoint_from_sft`).

Resumable: a pair whose ``done.json`` carries this recipe's training hash
(``Recipe.train_sha256``), the manifest's and the base's hashes and the transfer suite's
hash is not redone. If only the transfer suite or eval settings changed, the trained model
is reloaded from its final state and re-evaluated (adapter kept, transfer outputs
rewritten); an unfinished pair resumes from its last full state.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
from tqdm.auto import tqdm

from ._guards import check_vocab
from ._io import RunLock, atomic_write_csv, atomic_write_json, atomic_write_parquet, canonical_json_hash, sha256_file
from .checkpoints import Checkpoint, discover_checkpoints
from ._hub import checkpoint_from_snapshot
from .errors import (CheckpointError, ManifestMismatchError, ResumeError, SelectionError, TokenizerMismatchError,
                     UsageError)
from .manifest import base_manifest
from .sft.check_data import check_recipe_data
from .sft.data import data_hash, encode_rows, load_rows, prompt_formatter
from .sft.batched import NotBatchable, not_batchable_reason, train_seeds
from .sft.loop import train
from .sft.manifest import build_data_manifest, compare_manifests, manifest_hash, require_same_manifest
from .sft.recipe import Recipe, load_recipe

__all__ = ["PilotResult", "run_pilot", "resolve_bases", "default_probe_items", "transfer_hash",
           "DIAGNOSTIC_COLUMNS"]

DIAGNOSTIC_COLUMNS = ["base", "seed", "steps", "sup_tokens", "clip_fraction", "grad_norm_p50", "grad_norm_p90",
                      "grad_norm_max", "nonfinite", "skipped", "spikes", "resumes", "seconds", "tokens_per_s",
                      "final_loss"]


@dataclass
class PilotResult:
    """Tables of a pilot: ``transfer`` (base, seed, metric, value, n), ``transfer_items``
    (base, seed, metric, item_id, kind, value, weight), ``diagnostics`` (one row per base x seed),
    ``transfer_base`` (base, seed = "base", metric, value, n: the same suite before SFT)."""

    transfer: pd.DataFrame
    transfer_items: pd.DataFrame
    diagnostics: pd.DataFrame
    out_dir: Path
    manifest: dict[str, Any]
    trained: list[tuple[str, int]] = field(default_factory=list)  # pairs trained (or resumed) in this call
    reused: list[tuple[str, int]] = field(default_factory=list)  # pairs already finished
    reevaluated: list[tuple[str, int]] = field(default_factory=list)  # trained earlier, transfer re-evaluated now
    transfer_base: pd.DataFrame | None = None  # the bases' transfer before SFT (transfer_base.csv)


def _selected_names(csv: Path) -> list[str]:
    df = pd.read_csv(csv)
    for col in ("checkpoint", "selected"):
        if col not in df.columns:
            raise SelectionError(f"{csv}: no {col!r} column; pass a shortlist.csv written by `probeselect shortlist`.")
    sel = df[df["selected"].astype(str).str.lower().isin(["true", "1"])]
    if "shortlist_position" in sel.columns:
        sel = sel.sort_values("shortlist_position", kind="stable")
    if sel.empty:
        raise SelectionError(f"{csv}: the shortlist selects no checkpoint (no row with selected == True). Revisit "
                             "the plan's constraints, or pass checkpoint folders to --bases.")
    return [str(c) for c in sel["checkpoint"]]


def _paths_from_shortlist(csv: Path, ladder: str | Path | None) -> list[Path]:
    names = _selected_names(csv)
    if ladder is not None:
        return [Path(ladder) / n for n in names]
    man = csv.parent / "manifest.json"
    if not man.is_file():
        raise SelectionError(f"{csv}: cannot locate the checkpoint folders (no score manifest.json next to it); "
                             "pass --ladder DIR (the folder holding the checkpoints).")
    by_name = {c["name"]: c["path"] for c in json.loads(man.read_text(encoding="utf-8")).get("checkpoints", [])}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SelectionError(f"{csv}: checkpoints {missing} are not in {man}; pass --ladder DIR.")
    return [Path(by_name[n]) for n in names]


def resolve_bases(bases: str | Path | Sequence[str | Path], *, ladder: str | Path | None = None) -> list[Checkpoint]:
    """Checkpoints to train: explicit model folders, a ``shortlist.csv`` (selected rows; folders found
    under ``ladder`` or via the score manifest beside it) or a score run folder holding one."""
    items = [bases] if isinstance(bases, (str, Path)) else list(bases)
    if not items:
        raise SelectionError("no bases given; pass checkpoint folders, a shortlist.csv or a score run folder.")
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_file() and p.suffix == ".csv":
            paths += _paths_from_shortlist(p, ladder)
        elif p.is_dir() and (p / "shortlist.csv").is_file() and not (p / "config.json").is_file():
            paths += _paths_from_shortlist(p / "shortlist.csv", ladder)
        elif p.is_dir() and not (p / "config.json").is_file():
            raise CheckpointError(f"{p}: not a model folder and holds no shortlist.csv. Pass checkpoint folders "
                                  "(e.g. LADDER/checkpoint-200), a shortlist.csv or a score run folder.")
        else:
            paths.append(p)
    ckpts = []
    for p in paths:
        hub = checkpoint_from_snapshot(p)  # a Hub revision in the HF cache: named by its revision
        ckpts.append(hub or discover_checkpoints(p)[0])
    names = [c.name for c in ckpts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SelectionError(f"bases {dupes} are given more than once (output folders are named by checkpoint folder).")
    ref = ckpts[0]
    for c in ckpts[1:]:
        if c.tokenizer_hash != ref.tokenizer_hash:
            raise TokenizerMismatchError(f"bases {ref.path} and {c.path} have different tokenizers; a matched pilot "
                                         "needs one tokenizer so that every base sees the same tokens.")
    return ckpts


def _read_done(done_path: Path) -> dict[str, Any] | None:
    if not done_path.is_file():
        return None
    try:
        return json.loads(done_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None


def default_probe_items(bases) -> list[Path]:
    """``items.jsonl`` of the score run behind ``bases`` (a shortlist.csv or a score run folder), if any."""
    items = [bases] if isinstance(bases, (str, Path)) else list(bases)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        run = p.parent if (p.is_file() and p.suffix == ".csv") else (
            p if (p.is_dir() and (p / "shortlist.csv").is_file() and not (p / "config.json").is_file()) else None)
        if run is not None and (run / "items.jsonl").is_file() and run / "items.jsonl" not in out:
            out.append(run / "items.jsonl")
    return out


def _preflight(recipe: Recipe, bases, sft_rows: list[dict]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Validate the transfer suite and run the leakage guards; nothing is written. Returns the
    leakage record for manifest.json and the validated transfer config (None: no suite)."""
    from .transfer import (check_disjoint_from_probes, check_disjoint_from_sft, load_transfer_items,
                           probe_template_matches, validate_transfer_config)

    record: dict[str, Any] = {"probe_items": [], "probe_items_source": None, "sft_kinds_checked": False}
    if not recipe.transfer:
        return record, None
    cfg = validate_transfer_config(recipe.transfer, source=recipe.source)
    items = load_transfer_items(cfg, source=recipe.source)
    probes = [Path(p) for p in cfg["probe_items"]]
    source = "recipe" if probes else None
    if not probes:
        probes = default_probe_items(bases)
        source = "shortlist score run" if probes else None
    if probes:
        check_disjoint_from_probes(items, probes)
    check_disjoint_from_sft(items, sft_rows, sft_source=str(recipe.train_path))
    # How close the transfer tasks are to the probes' own surface form: recorded and reported, not refused
    # (a user's own arithmetic transfer may legitimately look like a toy probe line).
    hits = probe_template_matches(items.tasks)
    record.update(probe_items=[str(p) for p in probes], probe_items_source=source,
                  sft_kinds_checked=bool(items.tasks), transfer_tasks=len(items.tasks),
                  probe_template_tasks=len(hits), probe_template_examples=[list(h) for h in hits[:3]])
    return record, cfg


def transfer_hash(cfg: dict[str, Any] | None) -> str | None:
    """Hash of what the transfer evaluation depends on: the validated suite settings (without
    probe_items, which only guard) and the bytes of the suite files."""
    if cfg is None:
        return None
    files = {k: sha256_file(Path(cfg[k])) for k in ("tasks", "robustness", "heldout") if cfg.get(k)}
    return canonical_json_hash({**{k: v for k, v in cfg.items() if k != "probe_items"}, "files": files})


def _saved_outputs(run_dir: Path, *, method: str, merged: bool) -> dict[str, str] | None:
    """The saved model folders of a finished pair, or None if one is missing."""
    names = (["adapter"] + (["merged"] if merged else [])) if method == "lora" else ["model"]
    if all((run_dir / n).is_dir() for n in names):
        return {n: str(run_dir / n) for n in names}
    return None


def _save_model(model, tokenizer, run_dir: Path, *, method: str, merged: bool) -> dict[str, str]:
    """Save the adapter (or full model); with ``merged`` also a merged copy. Folders are written beside and renamed."""
    out = {}

    def put(name: str, save) -> None:
        tmp, final = run_dir / f".tmp-{name}", run_dir / name
        shutil.rmtree(tmp, ignore_errors=True)
        save(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        out[name] = str(final)

    if method == "lora":
        put("adapter", lambda d: model.save_pretrained(str(d)))
        if merged:
            def save_merged(d):
                m = model.merge_and_unload()
                m.save_pretrained(str(d))
                tokenizer.save_pretrained(str(d))
            put("merged", save_merged)
    else:
        put("model", lambda d: (model.save_pretrained(str(d)), tokenizer.save_pretrained(str(d))))
    return out


#: CPU threads of a pilot (environment ``PROBESELECT_THREADS`` overrides): a fixed count so that
#: two runs on one machine reduce in the same order and give identical numbers. One thread: the toy
#: models are too small to gain from more, and on a shared machine extra threads that wait for each
#: other at every small kernel made training steps tens of times slower.
DEFAULT_THREADS = 1
#: cuBLAS's deterministic workspace setting (PyTorch's reproducibility notes); a user's own value is kept.
CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic_torch(threads: int | None = None):
    """Fixed CPU thread count (``threads``, else ``PROBESELECT_THREADS``, else :data:`DEFAULT_THREADS`)
    and deterministic algorithms (``warn_only``: an op without a deterministic kernel warns instead of
    failing) for the duration; the previous settings are restored."""
    import torch

    n = threads if threads is not None else int(os.environ.get("PROBESELECT_THREADS", DEFAULT_THREADS))
    # cuBLAS is deterministic only with a fixed workspace (CUDA >= 10.2); it reads this variable when
    # its first handle is made, so the CLI sets it at start as well (cli.main). Needed for, not
    # sufficient for, bitwise GPU reruns. No effect on CPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(max(1, n))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield n
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)


def run_pilot(bases, recipe: Recipe | str | Path, out_dir: str | Path, *, progress: bool = True, merged: bool = False,
              device: str = "auto", ladder: str | Path | None = None, overrides: Sequence[str] = (),
              on_step: Callable[[str, int, int, dict], None] | None = None, threads: int | None = None,
              jobs: int | None = None) -> PilotResult:
    """Train every base under every seed of ``recipe`` on matched data, evaluate transfer, write ``out_dir``.

    ``bases``: checkpoint folders, a shortlist.csv or a score run folder (see :func:`resolve_bases`).
    ``on_step(base_name, seed, step, row)`` is called after every optimizer step. Runs under
    :func:`deterministic_torch` (``threads`` CPU threads), so a rerun gives identical numbers.
    ``jobs`` (else ``PROBESELECT_JOBS``, else 1): bases trained at once in that many worker
    processes (on the CPU, or sharing one CUDA device), each with the same ``threads`` (see
    :func:`resolve_jobs`); it changes the wall time, not a number.
    """
    jobs = resolve_jobs(jobs, device=device, on_step=on_step)
    if jobs > 1 and not (isinstance(bases, (list, tuple)) and len(bases) < 2):
        worker_context(start=True)  # the worker server imports torch & co. while this process reads and encodes
    with deterministic_torch(threads) as n_threads:
        return _run_pilot(bases, recipe, out_dir, progress=progress, merged=merged, device=device, ladder=ladder,
                          overrides=overrides, on_step=on_step, jobs=jobs, threads=n_threads)


#: Device types on which ``jobs > 1`` worker processes may train bases at once (CUDA: all on the one device).
JOBS_DEVICES = ("cpu", "cuda")


def resolve_jobs(jobs: int | str | None, *, device: str = "auto", on_step=None) -> int:
    """The number of bases a pilot trains at once: ``jobs``, else ``PROBESELECT_JOBS``, else 1.

    ``jobs > 1`` starts that many worker processes (see :func:`worker_context`), each training whole bases (every
    seed of a base stays in one process, batched as usual) with the pilot's fixed thread count and
    deterministic kernels, so the numbers are the same as with ``jobs = 1``. On CPU a machine with C
    cores runs a pilot about min(C, jobs, bases) times faster than one process of one thread. On a
    CUDA device the workers share that one device: a small model's step is bound by the host (Python,
    kernel launches), not by the GPU, so several processes keep it busier (the demo's pilot stage ran
    3.1x faster than one seed and one base at a time on an H200; bench/README.md, tenth session); each
    worker holds its own CUDA context and base. Several GPUs are the job of one process per GPU
    (``accelerate launch``); other accelerators (mps, xpu) are refused. It cannot be combined with DDP or
    with an ``on_step`` callback (which lives in this process).
    """
    src = "jobs"
    if jobs is None:
        jobs, src = (os.environ.get("PROBESELECT_JOBS") or "").strip() or "1", "PROBESELECT_JOBS"
    n = None
    if isinstance(jobs, int) and not isinstance(jobs, bool):
        n = jobs
    elif isinstance(jobs, str) and jobs.strip().isascii() and jobs.strip().isdecimal():
        n = int(jobs.strip())
    if n is None or n < 1:
        raise UsageError(f"{src}={jobs!r}: the number of bases to train at once must be an integer >= 1 "
                         "(e.g. 2 on a 2-core machine).")
    if n == 1:
        return 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError(f"{src}={n} cannot be combined with DDP (WORLD_SIZE={os.environ['WORLD_SIZE']}): run the "
                         "pilot with jobs=1 under `accelerate launch`/`torchrun`, or without them with jobs > 1.")
    if on_step is not None:
        raise UsageError(f"{src}={n}: an on_step callback runs in this process and cannot follow bases trained in "
                         "worker processes; use jobs=1 with on_step.")
    from .score import resolve_device

    dev = resolve_device(device)
    if dev.type not in JOBS_DEVICES:
        raise UsageError(f"{src}={n} trains bases in parallel worker processes on the CPU or on one CUDA device, "
                         f"but the device is {dev}: use jobs=1, or --device cpu.")
    return n


_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def _clean_staging(out: Path) -> None:
    """Remove half-written model/state folders (``.tmp-*``) and orphaned atomic-write temp files."""
    for pat in ("*/seed*/.tmp-*", "*/seed*/state/.tmp-*", ".*.tmp", "*/seed*/.*.tmp", "*/base/.*.tmp"):
        for p in out.glob(pat):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def _pilot_writer(out: Path, is_main: bool, started: dict):
    """One writer per pilot folder (``.probeselect.lock``, taken before anything is written: a refused
    second writer changes nothing) and a truthful manifest: ``failed`` with the error, or
    ``interrupted``, once this run has written its own ``running`` manifest. A full disk is named."""
    lock = None
    if is_main:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot create the pilot folder ({exc.strerror}).") from None
        lock = RunLock(out, error_cls=UsageError).acquire()
    try:
        yield
    except BaseException as exc:
        err: BaseException = exc
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            err = UsageError(f"{exc.filename or out}: no space left on device while writing the "
                             f"pilot folder {out}. Free space there (or use another --out); re-running the same "
                             "command resumes from the last saved state.")
        if is_main:
            _clean_staging(out)
            man = started.get("manifest")
            if man is not None:
                interrupted = isinstance(exc, KeyboardInterrupt)
                man.update(status="interrupted" if interrupted else "failed", ended_utc=_now_utc(),
                           error=("interrupted (Ctrl-C or SIGTERM); re-run the same command to resume" if interrupted
                                  else f"{type(err).__name__}: {err}"))
                with contextlib.suppress(OSError):
                    atomic_write_json(out / "manifest.json", man)
        if err is not exc:
            raise err from None
        raise
    finally:
        if lock is not None:
            lock.release()


def _now_utc() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _run_pilot(bases, recipe, out_dir, *, progress, merged, device, ladder, overrides, on_step, jobs=1,
               threads=1) -> PilotResult:
    from .score import load_tokenizer

    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)
    out = Path(out_dir)
    ckpts = resolve_bases(bases, ladder=ladder)
    rows = load_rows(recipe.train_path)
    # Pre-flight, before anything is trained or written: a bad suite or a leaking one fails here.
    leakage, transfer_cfg = _preflight(recipe, bases, rows)
    t_hash = transfer_hash(transfer_cfg)
    tokenizer = load_tokenizer(ckpts[0].path)
    tok_hash = ckpts[0].tokenizer_hash
    check_recipe_data(recipe, tokenizer)  # every data file encoded as training/evaluation will, before training

    examples = encode_rows(rows, tokenizer, max_length=recipe.max_length, loss_on=recipe.loss_on,
                           chat_template=recipe.chat_template, source=str(recipe.train_path))
    by_id = {e.id: e for e in examples}
    heldout = None
    if recipe.eval_every:
        held_path = Path(recipe.transfer["heldout"])
        heldout = encode_rows(load_rows(held_path)[: recipe.eval_max_items], tokenizer, max_length=recipe.max_length,
                              loss_on=recipe.loss_on, chat_template=recipe.chat_template, source=str(held_path))
    d_hash = data_hash(recipe.train_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    vocab_warning = None
    for c in ckpts:  # a tokenizer larger than the embedding matrix: an error if an extra id is used
        vocab_warning = check_vocab(tokenizer, c.path, {str(recipe.train_path): examples,
                                                        **({str(recipe.transfer["heldout"]): heldout} if heldout else {})},
                                    error_cls=TokenizerMismatchError) or vocab_warning

    is_main = int(os.environ.get("RANK", "0")) == 0
    started: dict[str, Any] = {}
    with _pilot_writer(out, is_main, started):
        return _pilot_body(out, bases, recipe, ckpts, examples, by_id, heldout, leakage, transfer_cfg, t_hash,
                           tokenizer, tok_hash, d_hash, pad_id, is_main, started, merged=merged, device=device,
                           progress=progress, on_step=on_step, vocab_warning=vocab_warning, jobs=jobs,
                           threads=threads)


def _trained_anything(out: Path) -> bool:
    """Whether any run in the pilot folder has trained (a log row, a saved state or a finished run)."""
    for run_dir in out.glob("*/seed*"):
        log = run_dir / "train_log.jsonl"
        if (run_dir / "done.json").is_file() or (run_dir / "state").is_dir() or (log.is_file() and log.stat().st_size):
            return True
    return False


def _pilot_body(out, bases, recipe, ckpts, examples, by_id, heldout, leakage, transfer_cfg, t_hash, tokenizer,
                tok_hash, d_hash, pad_id, is_main, started, *, merged, device, progress, on_step,
                vocab_warning, jobs=1, threads=1) -> PilotResult:
    from .transfer import summarize_transfer

    manifests = _data_manifests(out, recipe, examples, tok_hash, d_hash, is_main)
    m_hashes = {s: manifest_hash(m) for s, m in manifests.items()}
    manifest = _pilot_manifest(out, bases, recipe, ckpts, examples, manifests, m_hashes, leakage=leakage, t_hash=t_hash,
                               tok_hash=tok_hash, d_hash=d_hash, merged=merged, device=device,
                               vocab_warning=vocab_warning)
    if is_main:
        atomic_write_json(out / "manifest.json", manifest)
        started["manifest"] = manifest  # from here on a failure or interrupt is recorded in it

    fmt = prompt_formatter(tokenizer, recipe.chat_template)
    pairs = _Pairs(out, recipe, ckpts, manifests, m_hashes, t_hash, tokenizer, fmt, by_id=by_id, pad_id=pad_id,
                   heldout=heldout, merged=merged, device=device, progress=progress, on_step=on_step, is_main=is_main)
    if recipe.batch_seeds_effective:  # batch_seeds: false / full fine-tuning: manifest.json as before
        manifest["batch_seeds"] = pairs.batching
    if jobs > 1 and len(ckpts) > 1:
        manifest["jobs"] = min(jobs, len(ckpts))
        _run_bases_in_workers(pairs, ckpts, min(jobs, len(ckpts)), threads,
                              evaluate_base=is_main and transfer_cfg is not None)
    else:
        for ckpt in ckpts:
            pairs.run_base(ckpt)
    pairs.outer.close()

    if is_main and transfer_cfg is not None:
        _evaluate_bases(ckpts, tokenizer, recipe, out, t_hash, fmt, device)
    _barrier()
    result = _collect(out, ckpts, recipe.seeds, manifest, pairs.trained, pairs.reused, summarize_transfer, is_main)
    result.reevaluated = pairs.reevaluated
    result.transfer_base = _collect_base(out, ckpts, summarize_transfer, is_main and transfer_cfg is not None)
    invalid = _invalid_transfer(result.transfer)
    if invalid:
        manifest["invalid_transfer"] = invalid
    if is_main:
        manifest.update(status="complete", ended_utc=_now_utc())
        atomic_write_json(out / "manifest.json", manifest)
    return result


def _data_manifests(out: Path, recipe: Recipe, examples, tok_hash, d_hash, is_main: bool) -> dict[int, dict]:
    """Every seed's data manifest, written as ``data_manifest-seed<S>.json``; one already there must
    be the same (else ManifestMismatchError), unless no run of the folder has trained yet."""
    manifests: dict[int, dict] = {}
    for seed in recipe.seeds:
        m = build_data_manifest(examples, recipe, seed=seed, tokenizer_hash=tok_hash, data_sha256=d_hash)
        path = out / f"data_manifest-seed{seed}.json"
        if path.is_file():
            diff = compare_manifests(json.loads(path.read_text(encoding="utf-8")), m)
            if diff is not None and not _trained_anything(out):
                # left by a pilot that failed before any run trained (e.g. a bad LoRA target): nothing
                # depends on it, so the corrected recipe's manifest replaces it
                if is_main:
                    atomic_write_json(path, m)
                diff = None
            if diff is not None:
                raise ManifestMismatchError(f"{path}: this pilot folder was written with a different data manifest "
                                            f"({diff}). Use a new --out, or delete {out} to start over.")
        elif is_main:
            atomic_write_json(path, m)
        manifests[seed] = m
    return manifests


def _pilot_manifest(out: Path, bases, recipe: Recipe, ckpts, examples, manifests: dict[int, dict],
                    m_hashes: dict[int, str], *, leakage, t_hash, tok_hash, d_hash, merged, device,
                    vocab_warning) -> dict[str, Any]:
    """The pilot's ``manifest.json`` (status ``running``): recipe, bases, seeds, data and data manifests."""
    manifest = base_manifest("pilot", {"bases": [str(b) for b in ([bases] if isinstance(bases, (str, Path)) else bases)],
                                       "out": str(out), "merged": merged, "device": device})
    manifest.update(status="running", recipe=recipe.raw, recipe_sha256=recipe.sha256,
                    train_sha256=recipe.train_sha256, transfer_sha256=t_hash, leakage_check=leakage,
                    recipe_source=recipe.source,
                    bases=[c.to_dict() for c in ckpts], seeds=list(recipe.seeds),
                    data={"path": str(recipe.train_path), "sha256": d_hash, "n_examples": len(examples)},
                    tokenizer_hash=tok_hash,
                    data_manifests={str(s): {"file": f"data_manifest-seed{s}.json", "sha256": h,
                                             "n_steps": manifests[s]["n_steps"],
                                             "sup_tokens": manifests[s]["total_sup_tokens"]}
                                    for s, h in m_hashes.items()})
    if vocab_warning:
        manifest["warnings"] = [vocab_warning]
    return manifest


class _Pairs:
    """The (base, seed) pairs of a pilot: which are done already, training the others (the seeds of
    a base together when they can be batched, else one at a time) and finishing each trained or
    reloaded pair (transfer evaluation, saved model, ``done.json``). ``trained``, ``reused`` and
    ``reevaluated`` list the pairs by what happened to them; ``batching`` records, per base, which
    seeds were trained together (and why not)."""

    def __init__(self, out: Path, recipe: Recipe, ckpts, manifests, m_hashes, t_hash, tokenizer, fmt, *, by_id, pad_id,
                 heldout, merged, device, progress, on_step, is_main):
        self.out, self.recipe, self.manifests, self.m_hashes, self.t_hash = out, recipe, manifests, m_hashes, t_hash
        self.tokenizer, self.fmt, self.by_id, self.pad_id, self.heldout = tokenizer, fmt, by_id, pad_id, heldout
        self.merged, self.device, self.progress, self.on_step = merged, device, progress, on_step
        self.trained, self.reused, self.reevaluated = [], [], []
        self.batching: dict[str, Any] = {"bases": {}}
        pairs = [(c, s) for c in ckpts for s in recipe.seeds]
        self.outer = tqdm(pairs, desc="pilot", unit="run", disable=not (progress and is_main))

    def expect_of(self, ckpt, seed) -> dict[str, Any]:
        return {"train_sha256": self.recipe.train_sha256, "manifest_sha256": self.m_hashes[seed],
                "base_fingerprint": ckpt.fingerprint}

    def is_done(self, ckpt, seed) -> bool:
        run_dir = self.out / ckpt.name / f"seed{seed}"
        done = _read_done(run_dir / "done.json")
        return (done is not None and all(done.get(k) == v for k, v in self.expect_of(ckpt, seed).items())
                and done.get("transfer_sha256") == self.t_hash and (run_dir / "transfer_items.parquet").is_file()
                and (not self.merged or _saved_outputs(run_dir, method=self.recipe.method.type, merged=True))
                is not None)

    def run_base(self, ckpt) -> None:
        """Every unfinished seed of ``ckpt``: trained (batched when possible), then finished. A seed
        that failed in a batch is raised after the others of the base are finished and recorded."""
        out, recipe, outer = self.out, self.recipe, self.outer
        todo = []
        for seed in recipe.seeds:
            if self.is_done(ckpt, seed):
                self.reused.append((ckpt.name, seed))
                outer.update(1)
            else:
                _check_pair_consistent(out / ckpt.name / f"seed{seed}", self.expect_of(ckpt, seed))
                todo.append(seed)
        results, why = self._train_batched(ckpt, todo)
        if todo:
            self.batching["bases"][ckpt.name] = {"seeds": todo, "batched": why is None,
                                                 **({"why_not": why} if why else {})}
        first_error = None
        for seed in todo:
            outer.set_postfix_str(f"{ckpt.name} seed{seed}")
            if seed in results:
                res = results.pop(seed)
                if isinstance(res, BaseException):
                    first_error = first_error or res
                    outer.update(1)
                    continue
            else:
                # Trains, resumes, or (training already complete) reloads the final state without training.
                on_step = self.on_step
                cb = (lambda step, row, _n=ckpt.name, _s=seed: on_step(_n, _s, step, row)) if on_step else None
                res = train(ckpt.path, recipe, seed, out / ckpt.name / f"seed{seed}", manifest=self.manifests[seed],
                            examples=self.by_id, pad_id=self.pad_id, base_fingerprint=ckpt.fingerprint,
                            heldout=self.heldout, device=self.device, progress=self.progress,
                            desc=f"{ckpt.name} seed{seed}", on_step=cb)
            self.finish(ckpt, seed, res)
            outer.update(1)
            del res
            gc.collect()
            _barrier()
        if first_error is not None:  # the other seeds of this base are finished and recorded
            raise first_error

    def _train_batched(self, ckpt, todo: list[int]) -> tuple[dict[int, Any], str | None]:
        """Train the seeds ``todo`` of ``ckpt`` together: ``({seed: TrainResult or error}, None)``, or
        ``({}, why not)`` when they cannot be batched (then they are trained one at a time)."""
        recipe, out, on_step = self.recipe, self.out, self.on_step
        why = "one seed to train" if len(todo) < 2 else not_batchable_reason(recipe)
        if not (todo and why is None):
            return {}, why
        cb = (lambda seed, step, row, _n=ckpt.name: on_step(_n, seed, step, row)) if on_step else None
        self.outer.set_postfix_str(f"{ckpt.name} seeds {todo}")
        try:
            return train_seeds(ckpt.path, recipe, todo, [out / ckpt.name / f"seed{s}" for s in todo],
                               manifests=[self.manifests[s] for s in todo], examples=self.by_id, pad_id=self.pad_id,
                               base_fingerprint=ckpt.fingerprint, heldout=self.heldout, device=self.device,
                               progress=self.progress, desc=f"{ckpt.name} seeds {todo}", on_step=cb), None
        except NotBatchable as exc:
            return {}, str(exc)

    def finish(self, ckpt, seed, res) -> None:
        """Transfer evaluation, saved model and done.json of one trained (or reloaded) pair."""
        from .transfer import evaluate_transfer, summarize_transfer

        recipe, tokenizer, merged = self.recipe, self.tokenizer, self.merged
        run_dir = self.out / ckpt.name / f"seed{seed}"
        if res.is_main:
            model = res.get_model()
            items = pd.DataFrame(columns=["item_id", "kind", "metric", "value", "weight"])
            if recipe.transfer:
                # a chat template renders its own special tokens: encode like the SFT encoder (no BOS added)
                items = evaluate_transfer(model, tokenizer, recipe.transfer, device=res.device,
                                          progress=self.progress, format_prompt=self.fmt, source=recipe.source,
                                          add_special_tokens=self.fmt is None, desc=f"{ckpt.name} seed{seed}",
                                          chat_template=recipe.chat_template)
            atomic_write_parquet(run_dir / "transfer_items.parquet", items)
            saved = None if res.steps_trained else _saved_outputs(run_dir, method=recipe.method.type, merged=merged)
            if saved is None:  # newly trained, or the saved model is missing: (re)write it
                saved = _save_model(model, tokenizer, run_dir, method=recipe.method.type, merged=merged)
            summ = summarize_transfer(items) if len(items) else pd.DataFrame(columns=["metric", "value", "n"])
            trained_with = next((seg.get("recipe_sha256") for seg in reversed(res.lineage)
                                 if seg.get("end_step", 0) > seg.get("start_step", 0)), None)
            done = {**self.expect_of(ckpt, seed), **res.summary, "recipe_sha256": recipe.sha256,
                    "trained_recipe_sha256": trained_with, "transfer_sha256": self.t_hash, "base": ckpt.name,
                    "base_path": str(ckpt.path), "seed": seed, "saved": saved, "lineage_segments": len(res.lineage),
                    "transfer": {r.metric: r.value for r in summ.itertuples()}}
            atomic_write_json(run_dir / "done.json", done)
        (self.trained if res.steps_trained else self.reevaluated).append((ckpt.name, seed))


# ---------------------------------------------------------------------------
# jobs > 1: whole bases in worker processes
# ---------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


class WorkerTraceback(Exception):
    """The traceback of an error raised in a pilot worker process (set as the ``__cause__`` of the
    error the parent raises, as ``concurrent.futures`` does), so a bug keeps its real traceback."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.tb}\"\"\""


#: What a pilot worker imports before it can train (torch, transformers' modelling and generation
#: code, peft): the worker server (``forkserver``) imports them once, so a worker starts in a fraction
#: of a second instead of importing them itself (about 2.5 s of CPU per worker on the CI-sized machine).
#: First :mod:`probeselect._worker_server`, which makes the server die with the pilot (Linux).
WORKER_PRELOAD = ("probeselect._worker_server", "probeselect.pilot", "transformers.modeling_utils",
                  "transformers.generation", "peft")

#: Start methods a pilot's worker processes may use (``PROBESELECT_MP_START``).
START_METHODS = ("forkserver", "spawn")


def worker_context(*, start: bool = False):
    """The :mod:`multiprocessing` context of pilot workers (``jobs > 1``).

    ``PROBESELECT_MP_START`` (``forkserver`` or ``spawn``), else ``forkserver`` where the platform has it
    (Linux, macOS), else ``spawn``. With ``forkserver`` a server process, started once per Python process
    and kept until it exits, imports :data:`WORKER_PRELOAD` (and re-runs the main script as ``spawn``
    would, guarded by ``if __name__ == "__main__"``) before any torch thread exists, and forks each worker
    from that state: a pilot's later stages (the confirmation after the pilot in ``probeselect run``)
    start their workers without importing anything. Both methods give a fresh process that has run no
    torch kernel; the workers set the pilot's thread count and deterministic kernels themselves, so the
    numbers do not depend on the method (tests/test_pilot_jobs.py). Each worker gets the pilot's current
    working directory, ``sys.path`` and environment variables (``os.environ`` as the pilot has it when the
    workers start; a variable that a library reads only when it is imported keeps the server's value).
    ``start=True`` starts the server now
    (it then imports while this process goes on). A server started earlier by other code keeps its own
    preload list; workers then import what they need themselves.
    """
    import multiprocessing

    env = (os.environ.get("PROBESELECT_MP_START") or "").strip()
    if env and env not in START_METHODS:
        raise UsageError(f"PROBESELECT_MP_START={env!r}: the start method of pilot worker processes is one of "
                         f"{', '.join(START_METHODS)} (or unset: forkserver where available).")
    available = multiprocessing.get_all_start_methods()
    method = env or ("forkserver" if "forkserver" in available else "spawn")
    if method not in available:
        raise UsageError(f"PROBESELECT_MP_START={method}: this platform has no {method!r} start method "
                         f"(it has {', '.join(available)}); unset it or use spawn.")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload([WORKER_PRELOAD[0], "__main__", *WORKER_PRELOAD[1:]])
        if start:
            forkserver.ensure_running()
    return ctx


def _worker_init(blob: dict[str, Any]) -> None:
    """A pilot worker process: the parent's thread count and deterministic kernels, no progress
    bars; Ctrl-C is left to the parent (which stops the workers), and on Linux the worker gets
    SIGTERM when the process that started it dies (the pilot, or the worker server, which dies with the
    pilot: :mod:`probeselect._worker_server`), so that no orphan goes on writing. A failure here is kept and
    returned by every task of this worker (a pool would only say that the worker broke)."""
    import signal
    import sys

    try:
        if blob.get("environ") is not None:  # a forked worker has the server's; a spawned one the pilot's
            os.environ.clear()
            os.environ.update(blob["environ"])
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if sys.platform.startswith("linux"):
            with contextlib.suppress(Exception):
                import ctypes

                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        import torch

        from .score import use_device

        torch.set_num_threads(max(1, int(blob["threads"])))
        torch.use_deterministic_algorithms(True, warn_only=True)
        use_device(blob["pairs"]["device"])  # cuda:N: GPU N is this worker's current device too, as in the parent
        kw = dict(blob["pairs"])
        fmt = prompt_formatter(kw["tokenizer"], kw["recipe"].chat_template)
        _WORKER["pairs"] = _Pairs(fmt=fmt, progress=False, on_step=None, is_main=True, **kw)
        _WORKER["blob"] = blob
        gc.freeze()  # the modules and the blob live as long as the worker: keep them out of every gc.collect
    except BaseException as exc:  # noqa: BLE001 - returned by _worker_base
        _WORKER["init_error"] = _portable(exc)


def _portable(exc: BaseException) -> dict[str, Any]:
    """``exc`` as it can travel back to the parent: the exception itself if it survives pickling
    (else a RuntimeError carrying its text) and its formatted traceback."""
    import pickle
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickle.loads(pickle.dumps(exc))
        err: BaseException = exc
    except Exception:
        err = RuntimeError(f"{type(exc).__name__}: {exc} (in a pilot worker process)")
    return {"error": err, "traceback": tb}


def _worker_base(ckpt) -> dict[str, Any]:
    """Train and finish every unfinished seed of ``ckpt`` (as :meth:`_Pairs.run_base`), then its
    pre-SFT transfer; what happened comes back as lists, an error as ``error``."""
    if "init_error" in _WORKER:
        return {"trained": [], "reused": [], "reevaluated": [], "batching": {}, "error": _WORKER["init_error"]}
    pairs, blob = _WORKER["pairs"], _WORKER["blob"]
    pairs.trained, pairs.reused, pairs.reevaluated = [], [], []
    pairs.batching = {"bases": {}}
    error = None
    try:
        pairs.run_base(ckpt)
        if blob["evaluate_base"]:
            _evaluate_bases([ckpt], pairs.tokenizer, pairs.recipe, pairs.out, pairs.t_hash, pairs.fmt, pairs.device)
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        error = _portable(exc)
    finally:
        gc.collect()
    return {"trained": pairs.trained, "reused": pairs.reused, "reevaluated": pairs.reevaluated,
            "batching": pairs.batching["bases"], "error": error}


def _run_bases_in_workers(pairs: "_Pairs", ckpts, jobs: int, threads: int, *, evaluate_base: bool) -> None:
    """Every base of the pilot in ``jobs`` worker processes (:func:`worker_context`; one base at a time each). Each
    worker runs exactly what :meth:`_Pairs.run_base` runs in this process, with the same thread
    count, so the outputs do not depend on ``jobs``. Every base is attempted; the first error (in
    base order) is raised after all have finished, with the worker's traceback as its cause. An
    interrupt stops the workers (saved states are kept; re-running resumes)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    blob = {"threads": threads, "evaluate_base": evaluate_base, "environ": dict(os.environ),
            "pairs": {"out": pairs.out, "recipe": pairs.recipe, "ckpts": ckpts, "manifests": pairs.manifests,
                      "m_hashes": pairs.m_hashes, "t_hash": pairs.t_hash, "tokenizer": pairs.tokenizer,
                      "by_id": pairs.by_id, "pad_id": pairs.pad_id, "heldout": pairs.heldout,
                      "merged": pairs.merged, "device": pairs.device}}
    n_seeds = len(pairs.recipe.seeds)
    results: dict[str, dict[str, Any]] = {}
    ex = ProcessPoolExecutor(max_workers=jobs, mp_context=worker_context(),
                             initializer=_worker_init, initargs=(blob,))
    try:
        futures = {ex.submit(_worker_base, c): c for c in ckpts}
        for fut in as_completed(futures):
            c = futures[fut]
            try:
                results[c.name] = fut.result()
            except BrokenProcessPool as exc:
                raise UsageError(f"{pairs.out}: a pilot worker process stopped without a result (killed from "
                                 "outside, e.g. out of memory, or it could not start: see the lines it printed "
                                 "above). Saved states are kept: re-run the same command to resume, with fewer "
                                 "jobs (jobs=1 trains one base at a time in this process).") from exc
            pairs.outer.set_postfix_str(c.name)
            pairs.outer.update(n_seeds)
    except BaseException:
        for proc in list((getattr(ex, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)
    first_error = None
    for c in ckpts:  # in base order, as the one-process loop would have recorded them
        r = results[c.name]
        pairs.trained += [tuple(x) for x in r["trained"]]
        pairs.reused += [tuple(x) for x in r["reused"]]
        pairs.reevaluated += [tuple(x) for x in r["reevaluated"]]
        pairs.batching["bases"].update(r["batching"])
        if r["error"] is not None and first_error is None:
            first_error = r["error"]
    if first_error is not None:
        _raise_worker_error(first_error, pairs.out, jobs)


def _raise_worker_error(returned: dict[str, Any], out, jobs: int) -> None:
    """Raise the error a worker returned (:func:`_portable`), its traceback as the cause; a GPU out of
    memory (``jobs`` workers on one device hold ``jobs`` bases and CUDA contexts) with the fix."""
    import torch

    err = returned["error"]
    err.__cause__ = WorkerTraceback(returned["traceback"])
    if isinstance(err, torch.OutOfMemoryError):
        raise UsageError(f"{out}: a pilot worker ran out of GPU memory with {jobs} workers sharing the device ({err}). "
                         "Saved states are kept: re-run the same command with fewer jobs (jobs=1 trains one base at a "
                         "time in this process) to resume.") from err
    raise err


def _invalid_transfer(transfer: pd.DataFrame) -> list[dict[str, Any]]:
    """Transfer rows whose value is NaN/inf: warned, listed in the manifest, written as ``nan``/``inf``."""
    import math

    bad = [{"base": r.base, "seed": r.seed, "metric": r.metric, "value": str(r.value)}
           for r in transfer.itertuples() if not math.isfinite(float(r.value))]
    if bad:
        import logging

        logging.getLogger(__name__).warning(
            "%d pilot transfer value(s) are NaN/inf (invalid, e.g. %s seed %s %s); `select` refuses to rank them.",
            len(bad), bad[0]["base"], bad[0]["seed"], bad[0]["metric"])
    return bad


def _pair_records(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The hashes each file of a (base, seed) folder says it belongs to."""
    keys = ("train_sha256", "manifest_sha256", "base_fingerprint")
    recs: dict[str, dict[str, Any]] = {}

    def load(p: Path):
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    done = load(run_dir / "done.json")
    if isinstance(done, dict):
        recs["done.json"] = {k: done.get(k) for k in keys}
    for meta in sorted((run_dir / "state").glob("*/meta.json")):
        m = load(meta)
        if isinstance(m, dict):
            recs[str(meta.parent.relative_to(run_dir))] = {k: m.get(k) for k in keys}
    lin = load(run_dir / "lineage.json")
    if isinstance(lin, dict):
        for seg in lin.get("segments") or []:
            if isinstance(seg, dict) and seg.get("end_step", 0) > seg.get("start_step", 0):
                recs[f"lineage.json segment {seg.get('segment')}"] = {k: seg.get(k) for k in keys}
    dm = load(run_dir / "data_manifest.json")
    if isinstance(dm, dict) and "data" in dm:
        with contextlib.suppress(Exception):
            recs["data_manifest.json"] = {"manifest_sha256": manifest_hash(dm)}
    return recs


def _check_pair_consistent(run_dir: Path, expect: dict[str, Any]) -> None:
    """Refuse, naming the exact files to remove, a (base, seed) folder whose files belong to
    different runs (e.g. two pilots that wrote one folder at once before the pilot lock existed)
    when its saved state would stop this run. A folder that is merely older (same run, or done.json
    alone differing) is left to the usual resume/retrain logic."""
    recs = _pair_records(run_dir)
    if not recs:
        return
    distinct = {json.dumps(r, sort_keys=True) for r in recs.values() if len(r) > 1}
    dm = recs.get("data_manifest.json", {}).get("manifest_sha256")
    mixed = len(distinct) > 1 or (dm is not None and any(r.get("manifest_sha256") not in (None, dm)
                                                           for r in recs.values()))
    foreign_state = any(k.startswith("state/") and any(r.get(x) != expect[x] for x in expect)
                        for k, r in recs.items())
    if not (mixed and foreign_state):
        return
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir())
    detail = "; ".join(f"{k}: " + ", ".join(f"{x} {str(v)[:12]}" for x, v in r.items()
                                            if x != "base_fingerprint" and v is not None) for k, r in recs.items())
    raise ResumeError(
        f"{run_dir}: this pilot run folder holds files of different runs ({detail}; this run: train_sha256 "
        f"{str(expect['train_sha256'])[:12]}, manifest_sha256 {str(expect['manifest_sha256'])[:12]}), e.g. two "
        "pilots that wrote it at once with a probeselect older than the pilot lock. None of it can be resumed "
        f"safely. Remove these and re-run (this pair is retrained; other pairs are kept): "
        + " ".join(f"'{run_dir / e}'" for e in entries))


def _evaluate_bases(ckpts, tokenizer, recipe: Recipe, out: Path, t_hash: str | None, fmt, device: str) -> None:
    """Evaluate every base BEFORE SFT with the pilot's transfer harness (same prompts, formatter and
    decoding) into ``OUT/<base>/base/``; kept when its done.json has this suite and base fingerprint."""
    from .score import load_model, resolve_device
    from .transfer import evaluate_transfer, summarize_transfer

    dev = resolve_device(device)
    for ckpt in ckpts:
        d = out / ckpt.name / "base"
        expect = {"transfer_sha256": t_hash, "base_fingerprint": ckpt.fingerprint}
        done = _read_done(d / "done.json")
        if done is not None and all(done.get(k) == v for k, v in expect.items()) and \
                (d / "transfer_items.parquet").is_file():
            continue
        import torch

        model = load_model(Path(ckpt.path), torch.float32, dev)
        items = evaluate_transfer(model, tokenizer, recipe.transfer, device=dev, progress=False, format_prompt=fmt,
                                  source=recipe.source, add_special_tokens=fmt is None,
                                  chat_template=recipe.chat_template)
        atomic_write_parquet(d / "transfer_items.parquet", items)
        summ = summarize_transfer(items)
        atomic_write_json(d / "done.json", {**expect, "base": ckpt.name, "base_path": str(ckpt.path),
                                            "transfer": {r.metric: r.value for r in summ.itertuples()}})
        del model
        gc.collect()


def _collect_base(out: Path, ckpts, summarize_transfer, write: bool) -> pd.DataFrame:
    """``transfer_base.csv``: the bases' pre-SFT transfer, one row per base x metric (seed = "base")."""
    cols = ["base", "seed", "metric", "value", "n"]
    rows = []
    for c in ckpts:
        p = out / c.name / "base" / "transfer_items.parquet"
        if not p.is_file():
            continue
        it = pd.read_parquet(p)
        if len(it):
            rows += [{"base": c.name, "seed": "base", "metric": r.metric, "value": r.value, "n": r.n}
                     for r in summarize_transfer(it).itertuples()]
    df = pd.DataFrame(rows, columns=cols)
    if write and len(df):
        atomic_write_csv(out / "transfer_base.csv", df, na_rep="nan")
    return df


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _collect(out: Path, ckpts, seeds, manifest, trained, reused, summarize_transfer, is_main) -> PilotResult:
    """Check every seed's runs share one manifest, then write the pilot tables."""
    for seed in seeds:
        runs = {f"{c.name}/seed{seed}": json.loads((out / c.name / f"seed{seed}" / "data_manifest.json")
                                                   .read_text(encoding="utf-8")) for c in ckpts}
        require_same_manifest(runs)
    t_rows, items, diag = [], [], []
    for c in ckpts:
        for seed in seeds:
            run_dir = out / c.name / f"seed{seed}"
            done = json.loads((run_dir / "done.json").read_text(encoding="utf-8"))
            it = pd.read_parquet(run_dir / "transfer_items.parquet")
            if len(it):
                for r in summarize_transfer(it).itertuples():
                    t_rows.append({"base": c.name, "seed": seed, "metric": r.metric, "value": r.value, "n": r.n})
                items.append(it.assign(base=c.name, seed=seed))
            diag.append({k: done.get(k) for k in DIAGNOSTIC_COLUMNS} | {"base": c.name, "seed": seed})
    transfer = pd.DataFrame(t_rows, columns=["base", "seed", "metric", "value", "n"])
    item_cols = ["base", "seed", "metric", "item_id", "kind", "value", "weight"]
    transfer_items = pd.concat(items, ignore_index=True)[item_cols] if items else pd.DataFrame(columns=item_cols)
    diagnostics = pd.DataFrame(diag, columns=DIAGNOSTIC_COLUMNS)
    if is_main:
        atomic_write_csv(out / "transfer.csv", transfer, na_rep="nan")  # an invalid value stays visibly invalid
        atomic_write_parquet(out / "transfer_items.parquet", transfer_items)
        atomic_write_csv(out / "diagnostics.csv", diagnostics)
    return PilotResult(transfer, transfer_items, diagnostics, out, manifest, trained, reused)
