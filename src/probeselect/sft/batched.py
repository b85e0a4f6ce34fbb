"""Batched seeds: the S LoRA runs of one base trained together in one process.

The frozen base is loaded once; every adapted linear layer is replaced by a
:class:`BatchedLoRALinear` that applies the base weight once to the concatenated micro-batches
of all runs and each run's own LoRA factors (``A_k``, ``B_k``, stacked per forward into one
batched matmul) to that run's rows only. Nothing in a transformer block mixes rows of a batch,
so run ``k``'s loss depends only on its own rows and factors, and one backward pass of
``sum_k nll_k / N_{k,t}`` gives every run exactly its own token-weighted gradient.

Everything else is per run, as in :func:`probeselect.sft.loop.train` (the reference path,
``batch_seeds: false``): data manifest, LoRA initialisation (the factors are taken from
``get_peft_model`` under the run's own init seed, so they equal the single-run path's), AdamW
state, LR schedule, global-norm clipping over the run's own parameters, nonfinite handling (a
nonfinite run fails or skips alone; the others continue), ``train_log.jsonl``, ``lineage.json``,
``state/step-<N>/`` (same tensor names, optimizer layout and RNG file as a single run) and
resume. A run resumed from a state trains with whichever runs are at the same step.

Batching needs: LoRA with ``method.dropout: 0``, no active dropout in the base (config
``*dropout*``/``*pdrop*`` all 0), precision fp32 or bf16 (fp16's loss-scale retries are per
step, not per run) and one process. Otherwise :class:`NotBatchable` is raised before anything
is written and the caller runs the seeds one at a time.

Micro-batches are packed (:data:`PACKED`): each run's examples are concatenated into one row
with position ids restarting at every example and no attention mask, so transformers attends
block-diagonally (an example sees only itself; verified on the loaded base before training by
:func:`packing_isolates`, else the rows are padded). Loss weighting is unchanged (every
example's first label is IGNORE; the sum of token NLL over the window / its supervised tokens).

Differences from the single-run path are floating-point only: the attention runs over packed
rows (or rows padded to the longest of all runs' micro-batches) and the LoRA matmuls are
batched, so losses, norms and weights agree to float32 rounding, not bitwise
(tests/test_sft_batched.py states the tolerance).
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._io import atomic_write_json, atomic_write_jsonl
from ..errors import ManifestMismatchError, NonfiniteGradientError, RecipeError
from .data import IGNORE, EncodedExample, collate
from .diagnostics import SpikeDetector, UpdateNorms, grad_norms_many, summarize_layer_norms
from ._runbook import _append_row, _now, _read_rows, _summary
from .loop import TrainResult, _base_forward_nonfinite, _make_accelerator, _train_seed, init_seed, make_optimizer
from .manifest import compare_manifests, manifest_hash
from .recipe import Recipe
from .state import latest_state, load_state, rng_state, save_state, set_rng_state

__all__ = ["NotBatchable", "BatchedLoRALinear", "train_seeds", "not_batchable_reason"]

_PEFT_PREFIX = "base_model.model."
#: Pack each run's micro-batch into one row (no padding between examples, block-diagonal causal
#: attention from restarting position ids) instead of right-padding every example to the longest
#: of all runs' micro-batches. Checked per base (:func:`packing_isolates`); padded otherwise.
PACKED = True


class NotBatchable(Exception):
    """The recipe/base/setup cannot be trained with batched seeds; run the seeds one at a time."""


def not_batchable_reason(recipe: Recipe, world_size: int = 1) -> str | None:
    """Why ``recipe`` cannot batch seeds (before loading the base), or None."""
    if recipe.method.type != "lora":
        return "full fine-tuning trains one seed at a time"
    if recipe.batch_seeds is False:
        return "batch_seeds: false"
    if recipe.method.dropout:
        return f"method.dropout={recipe.method.dropout} (per-run dropout masks are not batched)"
    if recipe.precision == "fp16":
        return "precision fp16 (loss-scale retries are per step, not per run)"
    if world_size > 1:
        return f"{world_size} processes (batched seeds run in one process)"
    return None


def _base_dropout(model) -> str | None:
    """A dropout the base applies in training mode (config value or module), or None."""
    cfg = getattr(model, "config", None)
    for k, v in (cfg.to_dict().items() if cfg is not None else ()):
        if ("dropout" in k or "pdrop" in k) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return f"the base's config has {k}={v}"
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return f"the base has an active dropout module {n} (p={m.p})"
    return None


class _Rows:
    """Which rows of the current batch belong to which run: ``groups = [(run, n_rows), ...]`` in row
    order, or ``single = run`` (every row is that run's: held-out loss of one run)."""

    def __init__(self):
        self.groups: list[tuple[int, int]] = []
        self.single: int | None = None


class BatchedLoRALinear(torch.nn.Module):
    """``base_layer(x) + (x A_k^T B_k^T) * scaling`` on the rows of run ``k`` (peft's LoRA forward,
    dropout 0). The factors live outside the module (one list per run); the base is frozen."""

    def __init__(self, base_layer, A: list[torch.Tensor], B: list[torch.Tensor], scaling: float, rows: _Rows):
        super().__init__()
        self.base_layer = base_layer
        self.A, self.B, self.scaling, self.rows = A, B, scaling, rows

    def forward(self, x, *args, **kwargs):
        out = self.base_layer(x, *args, **kwargs)
        rows = self.rows
        if rows.single is not None:
            k = rows.single
            return out + F.linear(F.linear(x, self.A[k]), self.B[k]) * self.scaling
        groups = rows.groups
        if len(groups) == 1:
            k = groups[0][0]
            return out + F.linear(F.linear(x, self.A[k]), self.B[k]) * self.scaling
        n = groups[0][1]
        if all(r == n for _, r in groups):  # the usual case: one micro-batch of every run
            xs = x.reshape(len(groups), -1, x.shape[-1])
            a = torch.stack([self.A[k] for k, _ in groups]).transpose(1, 2)  # [S, in, r]
            b = torch.stack([self.B[k] for k, _ in groups]).transpose(1, 2)  # [S, r, out]
            return out + (torch.bmm(torch.bmm(xs, a), b) * self.scaling).reshape(out.shape)
        parts, i = [], 0
        for k, r in groups:
            parts.append(F.linear(F.linear(x[i: i + r], self.A[k]), self.B[k]))
            i += r
        return out + torch.cat(parts) * self.scaling


def _set_module(model, path: str, new) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _peft_init(base: Path, recipe: Recipe, seed: int, device, loaded):
    """The single-run path's LoRA for ``seed`` (on a copy of the loaded base ``loaded``):
    ``[(peft param name, tensor)]`` (trainable, in named_parameters order) and ``{module path: scaling}``."""
    import copy

    from .loop import _build_model

    pm = _build_model(base, recipe, seed, device, loaded=copy.deepcopy(loaded))
    named = [(n, p.detach().clone()) for n, p in pm.named_parameters() if p.requires_grad]
    scaling = {}
    for name, mod in pm.named_modules():
        if hasattr(mod, "lora_A") and hasattr(mod, "scaling") and "default" in getattr(mod, "lora_A", {}):
            scaling[name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name] = float(mod.scaling["default"])
    del pm
    return named, scaling


class _View:
    """A run's trainable parameters under the single-run path's (peft) names, for save/load_state."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        self.named = named

    def named_parameters(self):
        return iter(self.named)


@dataclass
class _Run:
    k: int
    seed: int
    run_dir: Path
    manifest: dict[str, Any]
    named: list[tuple[str, torch.nn.Parameter]]
    optimizer: Any
    scheduler: Any
    hashes: dict[str, Any]
    n_steps: int
    cursor: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    segment: dict[str, Any] | None = None
    spikes: Any = None
    rng: dict[str, Any] | None = None
    meta_base: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    seg_tokens: int = 0
    status: str = "active"  # active | finished | failed
    error: BaseException | None = None
    steps_trained: int = 0

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named]

    @property
    def log_path(self) -> Path:
        return self.run_dir / "train_log.jsonl"

    @property
    def state_dir(self) -> Path:
        return self.run_dir / "state"

    def write_lineage(self) -> None:
        atomic_write_json(self.run_dir / "lineage.json", {"segments": self.lineage})

    def save(self, step: int, recipe: Recipe, **kw) -> Path:
        set_rng_state(self.rng)  # the run's own RNG streams (nothing draws from them with dropout 0)
        return save_state(self.state_dir, step=step, model=_View(self.named), optimizer=self.optimizer,
                          scheduler=self.scheduler, scaler=None, meta={**self.meta_base, **kw.pop("meta", {})},
                          keep=recipe.checkpoint_keep, **kw)

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.named}


def _rows_nll(model, batch: Mapping[str, torch.Tensor], groups: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Per-group sums of next-token NLL (nats) over supervised targets: a tensor ``[len(groups)]``."""
    if "position_ids" in batch:  # packed rows: no attention mask; transformers masks per example
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    logits = out.logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                          reduction="none").view(targets.shape)
    per_row = tok.sum(1)
    return torch.stack([s.sum() for s in per_row.split([r for _, r in groups])])


def pack(runs_examples: Sequence[Sequence[EncodedExample]], pad_id: int) -> dict[str, torch.Tensor]:
    """One row per run: its micro-batch's examples concatenated without padding between them.
    ``position_ids`` restart at 0 at every example, and the model is called without an
    attention mask, so transformers builds a block-diagonal causal mask from them (an example
    attends to itself only; ``masking_utils.find_packed_sequence_indices``). Every example's
    first label is IGNORE, so no position predicts the next example's first token. Rows are
    right-padded to the longest (pad positions: label IGNORE, their own position run)."""
    rows = []
    for exs in runs_examples:
        ids = [t for e in exs for t in e.input_ids]
        labels = [t for e in exs for t in e.labels]
        pos = [i for e in exs for i in range(len(e.input_ids))]
        rows.append((ids, labels, pos))
    n = max(len(r[0]) for r in rows)
    out = {"input_ids": torch.full((len(rows), n), pad_id, dtype=torch.long),
           "labels": torch.full((len(rows), n), IGNORE, dtype=torch.long),
           "position_ids": torch.zeros((len(rows), n), dtype=torch.long)}
    for i, (ids, labels, pos) in enumerate(rows):
        k = len(ids)
        out["input_ids"][i, :k] = torch.tensor(ids)
        out["labels"][i, :k] = torch.tensor(labels)
        out["position_ids"][i] = torch.tensor(pos + list(range(n - k)))
    return out


@torch.no_grad()
def packing_isolates(model, exs: Sequence[EncodedExample], pad_id: int, atol: float = 1e-4) -> bool:
    """Whether ``model`` keeps packed examples apart: the logits of ``exs`` packed into one row
    equal those of each example run alone. Checked on the loaded base before packed training, since
    the block-diagonal mask comes from transformers' packed-sequence detection, which an architecture
    may not implement (then examples would attend to each other and training falls back to padding)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    batch = {k: v.to(dev) for k, v in pack([exs], pad_id).items()}
    packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
    start, ok = 0, True
    for e in exs:
        alone = model(input_ids=torch.tensor([e.input_ids], device=dev), use_cache=False).logits[0]
        k = len(e.input_ids)
        ok = ok and bool((packed[start: start + k] - alone).abs().max() <= atol)
        start += k
    model.train(was)
    return ok


@torch.no_grad()
def _heldout_losses(model, rows: _Rows, runs: Sequence[_Run], examples: Sequence[EncodedExample], *, pad_id: int,
                    device, batch_size: int = 16) -> list[float]:
    """Held-out loss of every run in ``runs`` (each run's rows are the same held-out batch)."""
    model.eval()
    total = torch.zeros(len(runs), dtype=torch.float64)
    n = 0
    for i in range(0, len(examples), batch_size):
        chunk = list(examples[i: i + batch_size])
        batch = {k: v.to(device) for k, v in collate(chunk * len(runs), pad_id).items()}
        groups = [(r.k, len(chunk)) for r in runs]
        rows.groups, rows.single = groups, None
        total += rows_nll(model, batch, groups).double().cpu()
        n += sum(e.n_sup for e in chunk)
    model.train()
    return [float(t) / max(1, n) for t in total]


rows_nll = _rows_nll  # tests replace this to make one run's loss nonfinite


def train_seeds(base: str | Path, recipe: Recipe, seeds: Sequence[int], run_dirs: Sequence[str | Path], *,
                manifests: Sequence[dict[str, Any]], examples: Mapping[str, EncodedExample], pad_id: int,
                base_fingerprint: str | None = None, heldout: Sequence[EncodedExample] | None = None,
                device: str = "auto", progress: bool = True, desc: str | None = None,
                on_step: Callable[[int, int, dict], None] | None = None,
                packed: bool | None = None) -> dict[int, TrainResult | BaseException]:
    """Train ``base`` under every seed of ``seeds`` at once (run ``k`` into ``run_dirs[k]`` on
    ``manifests[k]``), resuming each from its own state. Returns ``{seed: TrainResult}`` (the
    result's ``model`` is None; ``model_loader()`` builds the run's peft model) or, for a run
    that failed (nonfinite), ``{seed: NonfiniteGradientError}`` - the other runs are unaffected.
    ``on_step(seed, step, row)`` runs after a run's step is logged and checkpointed.
    Raises :class:`NotBatchable` (nothing written) when the setup cannot be batched."""
    from ..score import load_model
    from .lora import lora_config

    packed = PACKED if packed is None else packed
    acc = _make_accelerator(device, {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[recipe.precision])
    why = not_batchable_reason(recipe, acc.num_processes)
    if why is None and acc.scaler is not None:
        why = "a grad scaler is configured"
    if why:
        raise NotBatchable(why)
    dev = acc.device
    base = Path(base)
    model = load_model(base, torch.float32, dev)
    model.config.use_cache = False
    why = _base_dropout(model)
    if why:
        raise NotBatchable(why)
    lora_config(model, recipe.method, source=recipe.source, base=base)  # target names checked (RecipeError)
    if packed:  # before LoRA is attached: the base alone decides whether packing isolates examples
        first = manifests[0]["steps"][0]["ids"][:3] if manifests and manifests[0]["steps"] else []
        if len(first) > 1 and not packing_isolates(model, [examples[i] for i in first], pad_id):
            warnings.warn(f"{base}: this architecture does not keep packed examples apart (transformers builds no "
                          "block-diagonal mask from position ids for it); training with padded micro-batches.")
            packed = False
    for p in model.parameters():
        p.requires_grad_(False)
    opt_cfg = recipe.optimizer
    rows_ctx = _Rows()

    runs: list[_Run] = []
    layers: dict[str, tuple[list, list]] = {}
    for k, (seed, rd, man) in enumerate(zip(seeds, run_dirs, manifests)):
        init, scaling = _peft_init(base, recipe, seed, dev, model)
        named = [(n, torch.nn.Parameter(t)) for n, t in init]
        by_name = dict(named)
        for path, sc in scaling.items():
            a = by_name[f"{_PEFT_PREFIX}{path}.lora_A.default.weight"]
            b = by_name[f"{_PEFT_PREFIX}{path}.lora_B.default.weight"]
            if path not in layers:
                layers[path] = ([], [], sc)
            layers[path][0].append(a)
            layers[path][1].append(b)
        params = [p for _, p in named]
        n_steps = man["n_steps"]
        optimizer, scheduler = make_optimizer(params, opt_cfg, n_steps)
        hashes = {"train_sha256": recipe.train_sha256, "manifest_sha256": manifest_hash(man),
                  "base_fingerprint": base_fingerprint}
        runs.append(_Run(k, seed, Path(rd), man, named, optimizer, scheduler, hashes, n_steps))
        runs[-1].update = UpdateNorms(params)
    for path, (A, B, sc) in layers.items():
        _set_module(model, path, BatchedLoRALinear(model.get_submodule(path), A, B, sc, rows_ctx))
    model.train()

    # Per-run bookkeeping, exactly as the single-run loop: resume point, log, lineage, manifest.
    for run in runs:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        ts = _train_seed(run.seed, 0)
        random.seed(ts)
        np.random.seed(ts % 2**32)
        torch.manual_seed(ts)
        lineage_path = run.run_dir / "lineage.json"
        run.lineage = json.loads(lineage_path.read_text(encoding="utf-8"))["segments"] if lineage_path.is_file() else []
        prev = latest_state(run.state_dir)
        parent = None
        if prev is not None:
            meta = load_state(prev, model=_View(run.named), optimizer=run.optimizer, scheduler=run.scheduler,
                              scaler=None, expect={**run.hashes, "world_size": 1}, rank=0)
            run.cursor, parent = meta["cursor"], str(prev)
        run.rng = rng_state()
        dm_path = run.run_dir / "data_manifest.json"
        if prev is not None and dm_path.is_file():
            diff = compare_manifests(json.loads(dm_path.read_text(encoding="utf-8")), run.manifest)
            if diff is not None:
                raise ManifestMismatchError(
                    f"{dm_path}: differs from the data manifest of this run and of its saved state {prev} ({diff}); "
                    f"the file was modified. Restore it, or delete {run.run_dir} to retrain this (base, seed).")
        all_rows = _read_rows(run.log_path)
        run.rows = [r for r in all_rows if r["step"] <= run.cursor]
        discarded = len(all_rows) - len(run.rows)
        for seg in run.lineage:
            if seg["status"] == "running":
                seg["status"] = "complete" if seg.get("end_step", 0) >= run.n_steps else "interrupted"
        atomic_write_jsonl(run.log_path, run.rows)
        if prev is None or not dm_path.is_file():
            atomic_write_json(dm_path, run.manifest)
        if run.cursor >= run.n_steps:
            run.write_lineage()
            run.status = "finished"
            continue
        seg_id = len(run.lineage)
        run.segment = {"segment": seg_id, "start_step": run.cursor, "end_step": run.cursor, "parent_state": parent,
                       "discarded_log_rows": discarded, "status": "running", "world_size": 1, "started_utc": _now(),
                       "ended_utc": None, "recipe_sha256": recipe.sha256, **run.hashes,
                       "batched_seeds": [int(s) for s in seeds], "packed": bool(packed)}
        run.lineage.append(run.segment)
        run.write_lineage()
        run.spikes = SpikeDetector(recipe.spike_window, recipe.spike_threshold, recipe.spike_min_history,
                                   [r["loss"] for r in run.rows], z=recipe.spike_z)
        run.meta_base = {**run.hashes, "recipe_sha256": recipe.sha256, "world_size": 1, "parent_state": parent,
                         "segment": seg_id}

    mbs = opt_cfg.micro_batch_size
    active = [r for r in runs if r.status == "active"]
    start = min((r.cursor for r in active), default=0)
    end = max((r.n_steps for r in active), default=0)
    bar = tqdm(total=end, initial=start, desc=desc or str(base.name), unit="step", leave=False,
               disable=not progress)

    for s in range(start, end):
        now = [r for r in runs if r.status == "active" and r.cursor <= s < r.n_steps]
        if not now:
            continue
        t0 = time.perf_counter()
        infos = [r.manifest["steps"][s] for r in now]
        for r in now:
            r.update.before()  # into buffers allocated once: no per-step clone
        lrs = [r.optimizer.param_groups[0]["lr"] for r in now]
        micro = [[info["ids"][i: i + mbs] for i in range(0, len(info["ids"]), mbs)] for info in infos]
        local = torch.zeros(len(now), dtype=torch.float32, device=dev)
        for j in range(max(len(m) for m in micro)):
            part = [(r, m[j]) for r, m in zip(now, micro) if j < len(m)]
            if packed:
                groups = [(r.k, 1) for r, _ in part]
                batch = {k: v.to(dev) for k, v in pack([[examples[i] for i in ids] for _, ids in part], pad_id).items()}
            else:
                groups = [(r.k, len(ids)) for r, ids in part]
                batch = {k: v.to(dev) for k, v in collate([examples[i] for _, ids in part for i in ids],
                                                          pad_id).items()}
            rows_ctx.groups, rows_ctx.single = groups, None
            with acc.autocast():
                nll = rows_nll(model, batch, groups)
            scale = torch.tensor([1.0 / infos[now.index(r)]["sup_tokens"] for r, _ in part], device=dev)
            (nll * scale).sum().backward()
            idx = torch.tensor([now.index(r) for r, _ in part], device=dev)
            local.index_add_(0, idx, nll.detach().float())
        losses = [float(x) / info["sup_tokens"] for x, info in zip(local.tolist(), infos)]
        eval_runs = []
        norms = grad_norms_many([r.named for r in now])  # every run's norms: one fused kernel, one host sync
        stepped = []
        for r, info, loss, (norm, layer_norms), lr in zip(now, infos, losses, norms, lrs):
            n_sup = info["sup_tokens"]
            layer = summarize_layer_norms(layer_norms)
            nonfinite = not (math.isfinite(norm) and math.isfinite(loss))
            skipped, clip_coef, clipped = False, 1.0, False
            base_broken = (_base_forward_nonfinite(model, base, recipe)
                           if nonfinite and not math.isfinite(loss) and not any(not x.get("skipped") for x in r.rows)
                           else None)
            if nonfinite and (recipe.nonfinite == "fail" or (base_broken and base_broken[0])):
                _fail(r, s, info["ids"], loss, norm, layer, base_broken, recipe, base)
                continue
            if nonfinite:
                skipped = True
                r.optimizer.zero_grad(set_to_none=True)
            else:
                if opt_cfg.max_norm is not None:
                    coef = opt_cfg.max_norm / (norm + 1e-6)
                    clip_coef, clipped = min(1.0, coef), coef < 1.0
                    if clipped:
                        torch.nn.utils.clip_grads_with_norm_(r.params, opt_cfg.max_norm, torch.tensor(norm))
                r.optimizer.step()
                r.scheduler.step()
                r.optimizer.zero_grad(set_to_none=True)
                stepped.append(r)
            spike, median = r.spikes.update(loss)
            r.seg_tokens += n_sup
            r._row = {"step": s + 1, "segment": r.segment["segment"], "loss": loss, "grad_norm_preclip": norm,
                      "clip_coef": clip_coef, "clipped": clipped, "nonfinite": nonfinite, "skipped": skipped,
                      "scaler_retries": 0, "sup_tokens": n_sup, "lr": lr, "update_norm": 0.0,
                      "layer_grad_norms": layer, "spike": spike, "loss_median_prev": median,
                      "spike_margin": r.spikes.last_margin}
            if recipe.eval_every and heldout and ((s + 1) % recipe.eval_every == 0 or s + 1 == r.n_steps):
                eval_runs.append(r)
        if stepped:  # the actual update norms of all stepped runs, one host sync
            for r, u in zip(stepped, torch.stack([r.update.after() for r in stepped]).tolist()):
                r._row["update_norm"] = u
        if eval_runs:
            for r, h in zip(eval_runs, _heldout_losses(model, rows_ctx, eval_runs, heldout, pad_id=pad_id,
                                                       device=dev)):
                r._row["heldout_loss"] = h
        dt = (time.perf_counter() - t0) / len(now)  # the step's wall time, shared evenly by its runs
        for r in now:
            if r.status != "active":
                continue
            row = r.__dict__.pop("_row")
            r.seconds += dt
            r.rows.append(row)
            _append_row(r.log_path, row)
            r.steps_trained += 1
            r.segment.update(end_step=s + 1, seconds=r.seconds, sup_tokens=r.seg_tokens)
            if (recipe.checkpoint_every and (s + 1) % recipe.checkpoint_every == 0) or s + 1 == r.n_steps:
                r.save(s + 1, recipe)
                r.write_lineage()
            if s + 1 == r.n_steps:
                _close(r, base)
            if on_step is not None:
                on_step(r.seed, s + 1, row)
        bar.update(1)
    bar.close()

    out: dict[int, TrainResult | BaseException] = {}
    for r in runs:
        if r.status == "failed":
            out[r.seed] = r.error
            continue
        weights = r.weights()
        out[r.seed] = TrainResult(r.run_dir, None, r.rows, _summary(r.rows, r.lineage), r.lineage, True, dev,
                                  r.steps_trained, model_loader=_loader(base, recipe, r.seed, dev, weights))
    return out


def _close(r: _Run, base) -> None:
    """Mark a run that reached its last step complete (or failed: every step skipped)."""
    if r.rows and all(x.get("skipped") for x in r.rows):
        r.segment.update(status="failed", ended_utc=_now(), seconds=r.seconds, sup_tokens=r.seg_tokens)
        r.write_lineage()
        r.status, r.error = "failed", NonfiniteGradientError(
            f"{r.run_dir}: all {len(r.rows)} optimizer steps were nonfinite and skipped (diagnostics.nonfinite=skip); "
            f"no update was applied, so this run is failed, not a result. Check the base {base} (`probeselect "
            "score` on it) and the steps in train_log.jsonl.")
        return
    r.segment.update(status="complete", ended_utc=_now(), seconds=r.seconds, sup_tokens=r.seg_tokens)
    r.write_lineage()
    r.status = "finished"


def _fail(r: _Run, s: int, ids, loss, norm, layer, base_broken, recipe: Recipe, base) -> None:
    """Fail-fast for one run: its state before step s+1, the batch ids, a failed segment; others go on."""
    r.optimizer.zero_grad(set_to_none=True)
    where = r.save(s, recipe, meta={"reason": "nonfinite", "failed_step": s + 1, "scaler_retries": 0},
                   name=f"nonfinite-step-{s + 1:06d}", set_latest=False)
    what = "loss" if not math.isfinite(loss) else "gradient"
    atomic_write_json(r.run_dir / "nonfinite_batch.json",
                      {"step": s + 1, "ids": ids, "loss": loss, "grad_norm_preclip": norm, "layer_grad_norms": layer,
                       "scaler_retries": 0, "state": str(where)})
    r.segment.update(status="failed", end_step=s, ended_utc=_now())
    r.write_lineage()
    r.status = "failed"
    if base_broken:
        r.error = NonfiniteGradientError(
            f"{r.run_dir}: optimizer step {s + 1}: {base_broken[1]} (loss {loss}, before any update). The "
            f"batch is not the cause; nothing was trained (state before the step: {where}).")
    else:
        r.error = NonfiniteGradientError(
            f"{r.run_dir}: optimizer step {s + 1}: nonfinite {what} (loss {loss}, pre-clip norm {norm}). Batch ids "
            f"saved to {r.run_dir / 'nonfinite_batch.json'}, the state before the step to {where} (latest.json "
            "still names the last regular checkpoint). Inspect those examples; diagnostics.nonfinite=skip skips "
            "such steps (counted) instead. The other seeds of this base were trained on (batch_seeds).")


def _loader(base: Path, recipe: Recipe, seed: int, dev, weights: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """Build the run's peft model exactly as the single-run path does and load its trained weights."""

    def load():
        from .loop import _build_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _build_model(base, recipe, seed, dev)
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if set(params) != set(weights):
            raise RecipeError(f"{base}: the batched run's trainable tensors do not match the peft model "
                              f"(e.g. {sorted(set(params) ^ set(weights))[:3]}).")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(weights[n])
        model.eval()
        return model

    return load
