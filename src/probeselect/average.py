"""Uniform weight averaging of consecutive checkpoints, and its effect on probe dynamics.

``average_checkpoints(ckpt_dir, window=K, out_dir)`` writes, for each window of K
consecutive checkpoints of the discovered ladder, an HF model folder holding the uniform
mean of their weights:

* **sliding** windows (default): checkpoints ``i-K+1 .. i`` for every ``i >= K-1``, so a
  ladder of n checkpoints gives n-K+1 averages, one per source step from the K-th on. This
  resembles the averaging analysis in Wen et al. (averages of nearby checkpoints compared
  with the raw checkpoint at the same step).
* **disjoint** windows: non-overlapping blocks of K that end at the last checkpoint
  (``n-K+1..n``, ``n-2K+1..n-K``, ...); leftover earliest checkpoints are not used.

Each output folder ``avg<K>-<name of the last source>`` (e.g. ``avg3-checkpoint-24``) holds

* the weights in the layout of the window's last checkpoint (same safetensors file names,
  tensor-to-file map and index; ``.bin`` sources become one ``model.safetensors``), each
  tensor in its source dtype;
* that checkpoint's ``config.json``, generation config and tokenizer files (copied);
* ``trainer_state.json`` with ``global_step`` = the last source step (and
  ``num_input_tokens_seen`` when known), so discovery orders averaged folders like raw ones;
* ``probeselect_checkpoint.json``: ``step``, ``tokens`` and ``averaged`` = the method, the
  window, the mode and the sources (name, step, tokens, fingerprint, path).

The mean is accumulated in float32 one weight file at a time: only the accumulator and one
source file's tensors are in memory (a 7B model needs about 28 GB for the accumulator).
Floating-point tensors are averaged; integer/bool buffers are taken from the last source.
Safetensors are read with ``safetensors.torch.load_file``; pickled ``.bin`` weights only with
``torch.load(..., weights_only=True)``. Before anything is written, every checkpoint in use
is checked against the first: same tokenizer hash, same ``config.json`` (ignoring
:data:`IGNORED_CONFIG_KEYS`), same tensor names, shapes and dtypes.

Put ``out_dir`` outside ``ckpt_dir``: averaged folders claim the same steps as their last
source, so discovering both together would report duplicate steps.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd

from ._io import _atomic_write, atomic_write_json
from .checkpoints import Checkpoint, discover_checkpoints
from .errors import CheckpointError, ProbeselectError, TokenizerMismatchError

__all__ = ["average_checkpoints", "average_windows", "compare_averaging", "IGNORED_CONFIG_KEYS"]

#: ``config.json`` keys that may differ between checkpoints of one architecture.
IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "dtype", "torch_dtype", "use_cache"})
_SKIP_COPY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".tmp")
_SKIP_COPY_NAMES = {"trainer_state.json", "probeselect_checkpoint.json", "model.safetensors.index.json",
                    "pytorch_model.bin.index.json"}


def average_windows(ckpts: Sequence[Checkpoint], window: int, mode: str = "sliding") -> list[list[Checkpoint]]:
    """The windows of consecutive checkpoints that :func:`average_checkpoints` averages."""
    n, k = len(ckpts), int(window)
    if mode == "sliding":
        return [list(ckpts[i - k + 1 : i + 1]) for i in range(k - 1, n)]
    if mode == "disjoint":
        return [list(ckpts[end - k : end]) for end in range(n, k - 1, -k)][::-1]
    raise ProbeselectError(f"unknown averaging mode {mode!r}; choose 'sliding' or 'disjoint'.")


def average_checkpoints(
    ckpt_dir: str | Path,
    window: int = 5,
    out_dir: str | Path | None = None,
    *,
    mode: Literal["sliding", "disjoint"] = "sliding",
    overwrite: bool = False,
    progress: bool = False,
) -> list[Path]:
    """Average every window of ``window`` consecutive checkpoints of ``ckpt_dir``.

    ``out_dir`` defaults to ``<ckpt_dir>-avg<window>`` next to ``ckpt_dir``. An existing
    output folder made from the same sources (names, steps, fingerprints), window and mode
    is kept unless ``overwrite``. Returns the averaged folders in step order; each loads
    with ``AutoModelForCausalLM.from_pretrained`` and can be scored like a raw checkpoint.
    Raises :class:`CheckpointError` (or :class:`TokenizerMismatchError`) naming both
    checkpoints when they cannot be averaged.
    """
    root = Path(ckpt_dir)
    ckpts = discover_checkpoints(root, allow_tokenizer_mismatch=True)
    try:
        k = int(window)
    except (TypeError, ValueError):
        raise CheckpointError(f"--window must be an integer >= 2, got {window!r}.") from None
    if k < 2:
        raise CheckpointError(f"--window must be >= 2 (averaging {k} checkpoint is a copy), got {k}.")
    if k > len(ckpts):
        raise CheckpointError(f"{root}: --window {k} exceeds the {len(ckpts)} checkpoints found; "
                              f"use --window <= {len(ckpts)}.")
    if mode not in ("sliding", "disjoint"):
        raise CheckpointError(f"unknown averaging mode {mode!r}; choose 'sliding' or 'disjoint'.")
    out = Path(out_dir) if out_dir is not None else root.parent / f"{root.name}-avg{k}"
    if out.resolve() == root.resolve():
        raise CheckpointError(f"{out}: the output folder is the checkpoint folder; averaged checkpoints would claim "
                              "the same steps as raw ones. Pass a separate --out DIR.")
    for c in ckpts:
        if c.step is None:
            raise CheckpointError(f"{c.path}: cannot tell this checkpoint's step, so averaged folders could not be "
                                  "ordered. Name it checkpoint-<step> or record global_step in trainer_state.json.")
    windows = average_windows(ckpts, k, mode)
    used = list({c.name: c for w in windows for c in w}.values())
    specs = _check_compatible(used)

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    from tqdm.auto import tqdm

    for win in tqdm(windows, desc="averaging", unit="window", disable=not progress):
        last = win[-1]
        dest = out / f"avg{k}-{last.name}"
        meta = _metadata(win, k, mode)
        if dest.is_dir() and not overwrite and _same_sources(dest, meta):
            written.append(dest)
            continue
        _write_average(win, specs[last.name], dest, meta)
        written.append(dest)
    for p in written:  # each folder must be discoverable (step from its metadata)
        discover_checkpoints(p)
    return written


# ---------------------------------------------------------------------------
# Compatibility checks (headers only; nothing is loaded)
# ---------------------------------------------------------------------------


def _config(c: Checkpoint) -> dict[str, Any]:
    try:
        cfg = json.loads((c.path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{c.path / 'config.json'}: cannot read ({exc}). Re-save the checkpoint.") from None
    return {key: v for key, v in cfg.items() if key not in IGNORED_CONFIG_KEYS}


def _weight_paths(c: Checkpoint) -> list[Path]:
    return [c.path / f for f in c.weight_files]


def _load_bin(f: Path) -> dict:
    import torch

    try:
        return torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # legacy (non-zip) format cannot be memory-mapped
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused or corrupt file
        raise CheckpointError(f"{f}: cannot load weights safely ({type(exc).__name__}: {exc}). "
                              "Convert the checkpoint to safetensors.") from None


def _tensor_specs(c: Checkpoint) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{tensor name: (dtype, shape, file name)}`` from safetensors headers (or a mmap'd .bin)."""
    from safetensors import safe_open

    specs: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for f in _weight_paths(c):
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    sl = fh.get_slice(key)
                    specs[key] = (str(sl.get_dtype()), tuple(sl.get_shape()), f.name)
        else:
            sd = _load_bin(f)
            for key, t in sd.items():
                specs[key] = (str(t.dtype).replace("torch.", ""), tuple(t.shape), f.name)
            del sd
    return specs


def _check_compatible(ckpts: Sequence[Checkpoint]) -> dict[str, dict]:
    """Refuse checkpoints that differ from the first in tokenizer, config or tensors."""
    ref = ckpts[0]
    ref_cfg, ref_specs = _config(ref), _tensor_specs(ref)
    specs = {ref.name: ref_specs}
    fix = "Average only checkpoints of one training run (same architecture and tokenizer)."
    for c in ckpts[1:]:
        if c.tokenizer_hash != ref.tokenizer_hash:
            raise TokenizerMismatchError(
                f"cannot average {ref.path} and {c.path}: their tokenizers differ (tokenizer hash "
                f"{str(ref.tokenizer_hash)[:12]} vs {str(c.tokenizer_hash)[:12]}). {fix}")
        cfg = _config(c)
        diff = sorted(key for key in set(cfg) | set(ref_cfg) if cfg.get(key) != ref_cfg.get(key))
        if diff:
            key = diff[0]
            raise CheckpointError(
                f"cannot average {ref.path} and {c.path}: config.json differs in {diff[:5]} "
                f"({key}={ref_cfg.get(key)!r} vs {cfg.get(key)!r}). {fix}")
        sp = _tensor_specs(c)
        only_ref, only_c = sorted(set(ref_specs) - set(sp)), sorted(set(sp) - set(ref_specs))
        if only_ref or only_c:
            raise CheckpointError(
                f"cannot average {ref.path} and {c.path}: tensor names differ (only in the first: {only_ref[:3]}, "
                f"only in the second: {only_c[:3]}). {fix}")
        for key, (dt, shape, _) in ref_specs.items():
            if sp[key][:2] != (dt, shape):
                raise CheckpointError(
                    f"cannot average {ref.path} and {c.path}: tensor {key!r} is {dt}{list(shape)} in the first and "
                    f"{sp[key][0]}{list(sp[key][1])} in the second. {fix}")
        specs[c.name] = sp
    return specs


# ---------------------------------------------------------------------------
# Writing one average
# ---------------------------------------------------------------------------


def _metadata(win: Sequence[Checkpoint], k: int, mode: str) -> dict[str, Any]:
    last = win[-1]
    return {
        "step": last.step,
        "tokens": last.tokens,
        "averaged": {
            "method": "uniform mean of weights, accumulated in float32, saved in each tensor's source dtype",
            "window": k,
            "mode": mode,
            "sources": [{"name": c.name, "step": c.step, "tokens": c.tokens, "fingerprint": c.fingerprint,
                         "path": str(Path(c.path).resolve())} for c in win],
        },
    }


def _same_sources(dest: Path, meta: dict) -> bool:
    f = dest / "probeselect_checkpoint.json"
    try:
        old = json.loads(f.read_text(encoding="utf-8"))["averaged"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False
    key = lambda srcs: [(s.get("name"), s.get("step"), s.get("fingerprint")) for s in srcs]  # noqa: E731
    new = meta["averaged"]
    return (old.get("window"), old.get("mode"), key(old.get("sources", []))) == \
        (new["window"], new["mode"], key(new["sources"]))


def _load_weights(f: Path) -> dict:
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(f), device="cpu")
    return _load_bin(f)


def _write_average(win: Sequence[Checkpoint], last_specs: dict, dest: Path, meta: dict) -> None:
    import torch
    from safetensors.torch import save_file

    acc: dict[str, torch.Tensor] = {}
    keep: dict[str, torch.Tensor] = {}
    last = win[-1]
    for c in win:
        for f in _weight_paths(c):
            sd = _load_weights(f)
            for key, t in sd.items():
                if not t.is_floating_point():
                    if c is last:
                        keep[key] = t.clone()
                    continue
                if key in acc:
                    acc[key].add_(t)
                else:
                    acc[key] = t.to(torch.float32, copy=True)
            del sd
    for t in acc.values():
        t.div_(len(win))

    tmp = dest.with_name(f".{dest.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    safetensors_layout = all(f.endswith(".safetensors") for f in last.weight_files)
    files: dict[str, list[str]] = {}
    for key, (_, _, fname) in last_specs.items():
        files.setdefault(fname if safetensors_layout else "model.safetensors", []).append(key)
    for fname, keys in files.items():
        tensors = {}
        for key in keys:
            if key in acc:
                target = _torch_dtype(last_specs[key][0])
                tensors[key] = acc[key] if target == torch.float32 else acc[key].to(target)
            else:
                tensors[key] = keep[key]
        _atomic_write(tmp / fname, lambda p, t=tensors: save_file(t, p, metadata={"format": "pt"}))
        del tensors
    del acc, keep
    for src in sorted(last.path.iterdir()):
        if src.is_file() and src.name not in _SKIP_COPY_NAMES and not src.name.endswith(_SKIP_COPY_SUFFIXES) \
                and not src.name.startswith("."):
            _atomic_write(tmp / src.name, lambda p, s=src: shutil.copyfile(s, p))
    if safetensors_layout and (last.path / "model.safetensors.index.json").is_file():
        src = last.path / "model.safetensors.index.json"
        _atomic_write(tmp / src.name, lambda p, s=src: shutil.copyfile(s, p))
    state = {"global_step": last.step, "log_history": []}
    if last.tokens is not None:
        state["num_input_tokens_seen"] = last.tokens
    atomic_write_json(tmp / "trainer_state.json", state)
    atomic_write_json(tmp / "probeselect_checkpoint.json", meta)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _torch_dtype(name: str):
    """torch dtype from a safetensors dtype code (``BF16``) or a torch name (``bfloat16``)."""
    import torch

    return getattr(torch, _ST_DTYPES.get(name, name))


# ---------------------------------------------------------------------------
# Averaged vs raw dynamics
# ---------------------------------------------------------------------------


def compare_averaging(raw_run_dir: str | Path, avg_run_dir: str | Path) -> pd.DataFrame:
    """Per family x variant: mode-hopping statistics of the averaged ladder next to the raw one.

    Both arguments are run folders written by ``probeselect score`` with the same probes.
    The raw ladder is restricted to the checkpoints at the averaged ladder's steps (an
    average is labelled with its last source step), so both rest on the same number of
    consecutive pairs; if fewer than two steps match, all raw checkpoints are used
    (``aligned`` is False). Columns: ``family, variant, track, aligned, n_checkpoints_raw,
    n_checkpoints_avg``, then ``raw_``/``avg_`` ``total_variation``, ``excess_variation``
    (movement later undone; 0 for a monotone track), ``mean_abs_change``, ``sign_changes``,
    ``flip_rate``, ``largest_drop`` (definitions: :mod:`probeselect.dynamics`), and the
    ratios ``tv_ratio`` and ``flip_rate_ratio`` (averaged / raw; < 1 means averaging
    smoothed the track). Notes
    (e.g. different probe items) are in ``df.attrs["notes"]``.
    """
    from .dynamics import checkpoint_order, flip_rates, load_run, track_table, trajectory_stats

    raw, avg = load_run(raw_run_dir), load_run(avg_run_dir)
    notes: list[str] = []
    ih_raw = (raw.manifest or {}).get("items_hash")
    ih_avg = (avg.manifest or {}).get("items_hash")
    if ih_raw and ih_avg and ih_raw != ih_avg:
        notes.append("the two runs scored different probe items (items_hash differs); compare with care.")
    tr = track_table(raw.summary)
    ta = track_table(avg.summary)
    tr, ta = tr[tr["metric"] == "mean_margin"], ta[ta["metric"] == "mean_margin"]
    avg_steps = set(pd.to_numeric(ta["step"], errors="coerce").dropna())
    raw_steps = pd.to_numeric(tr["step"], errors="coerce")
    aligned = tr.loc[raw_steps.isin(avg_steps), "checkpoint"].nunique() >= 2
    if aligned:
        tr = tr[raw_steps.isin(avg_steps)]
    else:
        notes.append("fewer than two raw checkpoints share a step with the averaged ones; "
                     "raw statistics use all raw checkpoints.")
    raw_scores = raw.scores
    if raw_scores is not None and aligned:
        raw_scores = raw_scores[raw_scores["checkpoint"].isin(set(tr["checkpoint"]))]
    fr_raw = flip_rates(raw_scores, checkpoint_order(tr)) if raw_scores is not None else flip_rates(None)
    fr_avg = flip_rates(avg.scores, checkpoint_order(ta)) if avg.scores is not None else flip_rates(None)
    window = _window_of(avg.manifest)

    rows = []
    common = [t for t in dict.fromkeys(tr["track"]) if t in set(ta["track"])]
    if not common:
        raise ProbeselectError(f"{raw.run_dir} and {avg.run_dir} share no family/variant with a mean margin; "
                               "score the averaged checkpoints with the same probe specs.")
    for t in common:
        gr, ga = tr[tr["track"] == t], ta[ta["track"] == t]
        fam, var = gr["family"].iloc[0], gr["variant"].iloc[0]
        row: dict[str, Any] = {"family": fam, "variant": var, "track": t, "window": window, "aligned": bool(aligned),
                               "n_checkpoints_raw": len(gr), "n_checkpoints_avg": len(ga)}
        for prefix, g, fr in (("raw", gr, fr_raw), ("avg", ga, fr_avg)):
            st = trajectory_stats(g["value"].to_numpy(), steps=g["step"].to_numpy(dtype=float))
            f = fr[(fr["family"] == fam) & (fr["variant"] == var)]["flip_rate"].dropna()
            row.update({f"{prefix}_total_variation": st["total_variation"],
                        f"{prefix}_excess_variation": st["excess_variation"],
                        f"{prefix}_mean_abs_change": st["mean_abs_change"],
                        f"{prefix}_sign_changes": st["sign_changes"],
                        f"{prefix}_flip_rate": float(f.mean()) if len(f) else np.nan,
                        f"{prefix}_largest_drop": st["largest_drop"]})
        row["tv_ratio"] = _safe_div(row["avg_total_variation"], row["raw_total_variation"])
        row["flip_rate_ratio"] = _safe_div(row["avg_flip_rate"], row["raw_flip_rate"])
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["notes"] = notes
    return df


def _safe_div(a: float, b: float) -> float:
    if not (np.isfinite(a) and np.isfinite(b)) or b == 0:
        return float("nan")
    return float(a / b)


def _window_of(manifest: dict | None) -> int | None:
    """The averaging window recorded in the averaged checkpoints' metadata, if readable."""
    for c in (manifest or {}).get("checkpoints", []):
        try:
            meta = json.loads((Path(c["path"]) / "probeselect_checkpoint.json").read_text(encoding="utf-8"))
            return int(meta["averaged"]["window"])
        except (OSError, KeyError, TypeError, ValueError, json.JSONDecodeError):
            continue
    return None
