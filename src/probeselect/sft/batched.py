"""Batched seeds: the S LoRA runs of one base trained together (one process or data parallel).

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
resume; the files are kept by the single-run path's :class:`probeselect.sft._runbook.RunBook`. A run resumed from a state trains with whichever runs are at the same step.

Batching needs: LoRA with ``method.dropout: 0``, no active dropout in the base (config
``*dropout*``/``*pdrop*`` all 0) and precision fp32 or bf16 (fp16's loss-scale retries are per
step, not per run). Otherwise :class:`NotBatchable` is raised before anything is written and the
caller runs the seeds one at a time.

Several processes (``torchrun`` / ``accelerate launch``; plain DDP, gloo on CPU, nccl on CUDA) split
every run's micro-batches as the single-run loop does (rank ``r`` of ``W`` takes micro-batches
``r, r+W, ...``; ``grad_accum`` must be a multiple of ``W``). Each rank runs the base once on the
concatenated rows of all runs' micro-batches it holds; the stacked LoRA gradients and the runs' loss
sums are then summed over the ranks in one flattened all-reduce per step (the losses are already
token-weighted over the whole effective batch, so the sum is the 1-process gradient). The norms,
clip coefficients and nonfinite decisions are rank 0's, broadcast, so every rank clips, skips or
fails the same runs; only rank 0 writes logs, lineage, manifests and state files (every rank its own
RNG file, as in the single-run loop) and computes held-out losses.

Micro-batches are packed (:data:`PACKED`): each run's examples are concatenated into rows no
longer than the longest example of the step's micro-batches (:func:`pack_rows`, first-fit by
decreasing length), with position ids restarting at every example and no attention mask, so
transformers attends block-diagonally (an example sees only itself; verified on the loaded base
before training by :func:`packing_isolates`, else the rows are padded). Bounding the rows keeps
attention, quadratic in the row length, from being spent across a whole micro-batch. Loss
weighting is unchanged (every example's first label is IGNORE; the sum of token NLL over the
window / its supervised tokens), and the output head runs on the supervised positions only
(:func:`probeselect.sft._nll.supervised_nll`, as in the single-run path).

Differences from the single-run path are floating-point only: the attention runs over packed
rows (or rows padded to the longest of all runs' micro-batches) and the LoRA matmuls are
batched, so losses, norms and weights agree to float32 rounding, not bitwise
(tests/test_sft_batched.py states the tolerance).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..errors import RecipeError
from ._nll import supervised_nll
from ._runbook import RunBook
from .data import IGNORE, EncodedExample, collate
from .diagnostics import UpdateNorms, grad_norms_many, summarize_layer_norms
from .loop import (PRECISION, TrainResult, _base_forward_nonfinite, _check_accelerate_setup, _make_accelerator,
                   check_grad_accum_split, clip_and_step, make_optimizer, seed_process)
from .recipe import Recipe
from .state import rng_state

__all__ = ["NotBatchable", "BatchedLoRALinear", "train_seeds", "not_batchable_reason"]

_PEFT_PREFIX = "base_model.model."
#: Pack each run's micro-batch into rows no longer than its longest example (no padding between
#: examples, block-diagonal causal attention from restarting position ids) instead of right-padding
#: every example to the longest of all runs' micro-batches. Checked per base
#: (:func:`packing_isolates`); padded otherwise.
PACKED = True


class NotBatchable(Exception):
    """The recipe/base/setup cannot be trained with batched seeds; run the seeds one at a time."""


def not_batchable_reason(recipe: Recipe) -> str | None:
    """Why ``recipe`` cannot batch seeds (before loading the base), or None."""
    if recipe.method.type != "lora":
        return "full fine-tuning trains one seed at a time"
    if recipe.batch_seeds is False:
        return "batch_seeds: false"
    if recipe.method.dropout:
        return f"method.dropout={recipe.method.dropout} (per-run dropout masks are not batched)"
    if recipe.precision == "fp16":
        return "precision fp16 (loss-scale retries are per step, not per run)"
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
    """One seed's run in the batch: its LoRA factors (under the peft names), optimizer, schedule and
    :class:`RunBook` (files, lineage, log rows)."""

    k: int
    seed: int
    named: list[tuple[str, torch.nn.Parameter]]
    optimizer: Any
    scheduler: Any
    book: RunBook
    update: UpdateNorms
    status: str = "active"  # active | finished | failed
    error: BaseException | None = None
    steps_trained: int = 0
    row: dict[str, Any] | None = None  # the current step's log row, until it is logged

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named]

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.named}


def _rows_nll(model, batch: Mapping[str, torch.Tensor], groups: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Per-group sums of next-token NLL (nats) over supervised targets: a tensor ``[len(groups)]``."""
    tok, rows = supervised_nll(model, batch)
    per_row = torch.zeros(batch["input_ids"].shape[0], dtype=tok.dtype, device=tok.device).index_add(0, rows, tok)
    return torch.stack([s.sum() for s in per_row.split([r for _, r in groups])])


def pack(runs_examples: Sequence[Sequence[EncodedExample]], pad_id: int) -> dict[str, torch.Tensor]:
    """One row per run: its micro-batch's examples concatenated (:func:`pack_rows` without a bound)."""
    return pack_rows(runs_examples, pad_id)[0]


def pack_rows(runs_examples: Sequence[Sequence[EncodedExample]], pad_id: int,
              row_len: int | None = None) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Each run's micro-batch packed into rows without padding between examples, and the number of
    rows of each run (its rows are consecutive, runs in order). ``row_len=None``: one row per run;
    else rows of at most ``row_len`` tokens, filled first-fit in order of decreasing example length
    (ties in micro-batch order; an example longer than ``row_len`` gets a row of its own), so that
    attention, quadratic in the row length, is not spent across a whole micro-batch.
    ``position_ids`` restart at 0 at every example, and the model is called without an
    attention mask, so transformers builds a block-diagonal causal mask from them (an example
    attends to itself only; ``masking_utils.find_packed_sequence_indices``). Every example's
    first label is IGNORE, so no position predicts the next example's first token. Rows are
    right-padded to the longest (pad positions: label IGNORE, their own position run)."""
    rows, counts = [], []
    for exs in runs_examples:
        bins: list[list[EncodedExample]] = []
        if row_len is None:
            bins = [list(exs)]
        else:
            fill: list[int] = []
            for e in sorted(exs, key=lambda e: -len(e.input_ids)):
                n = len(e.input_ids)
                j = next((j for j, f in enumerate(fill) if f + n <= row_len), None)
                if j is None:
                    bins.append([e])
                    fill.append(n)
                else:
                    bins[j].append(e)
                    fill[j] += n
        for b in bins:
            rows.append(([t for e in b for t in e.input_ids], [t for e in b for t in e.labels],
                         [i for e in b for i in range(len(e.input_ids))]))
        counts.append(len(bins))
    n = max(len(r[0]) for r in rows)
    out = {"input_ids": torch.full((len(rows), n), pad_id, dtype=torch.long),
           "labels": torch.full((len(rows), n), IGNORE, dtype=torch.long),
           "position_ids": torch.zeros((len(rows), n), dtype=torch.long)}
    for i, (ids, labels, pos) in enumerate(rows):
        k = len(ids)
        out["input_ids"][i, :k] = torch.tensor(ids)
        out["labels"][i, :k] = torch.tensor(labels)
        out["position_ids"][i] = torch.tensor(pos + list(range(n - k)))
    return out, counts


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
    packed = PACKED if packed is None else packed
    acc = _make_accelerator(device, PRECISION[recipe.precision])
    why = not_batchable_reason(recipe)
    if why is None and acc.scaler is not None:
        why = "a grad scaler is configured"
    if why:
        raise NotBatchable(why)
    _check_accelerate_setup(acc, recipe)
    check_grad_accum_split(recipe, acc.num_processes)
    dev = acc.device
    base = Path(base)
    model, packed = _load_base(base, recipe, manifests, examples, pad_id, dev, packed)
    packed = bool(_from_rank0(acc, [packed])[0])  # every rank lays out its rows alike
    opt_cfg = recipe.optimizer
    rows_ctx = _Rows()
    runs = _attach_runs(model, base, recipe, seeds, run_dirs, manifests, base_fingerprint, dev, rows_ctx, acc)

    _start(runs, seeds, packed, acc)
    active = [r for r in runs if r.status == "active"]
    start = min((r.book.cursor for r in active), default=0)
    end = max((r.book.n_steps for r in active), default=0)
    bar = tqdm(total=end, initial=start, desc=desc or str(base.name), unit="step", leave=False,
               disable=not progress)
    for s in range(start, end):
        now = [r for r in runs if r.status == "active" and r.book.cursor <= s < r.book.n_steps]
        if not now:
            continue
        t0 = time.perf_counter()
        infos = [r.book.manifest["steps"][s] for r in now]
        for r in now:
            r.update.before()  # into buffers allocated once: no per-step clone
        lrs = [r.optimizer.param_groups[0]["lr"] for r in now]
        losses = _forward_backward(acc, model, rows_ctx, now, infos, examples, pad_id, opt_cfg.micro_batch_size,
                                   packed)
        stepped = _update(acc, model, base, recipe, s, now, infos, losses, lrs)
        eval_runs = [r for r in now if r.status == "active" and recipe.eval_every and heldout
                     and ((s + 1) % recipe.eval_every == 0 or s + 1 == r.book.n_steps)]
        if stepped:  # the actual update norms of all stepped runs, one host sync
            for r, u in zip(stepped, torch.stack([r.update.after() for r in stepped]).tolist()):
                r.row["update_norm"] = u
        # the step's wall time, shared evenly by its runs; like the single-run loop's, without the held-out loss
        dt = (time.perf_counter() - t0) / len(now)
        if eval_runs:  # rank 0 only (its rows are the ones written), as in the single-run loop
            if acc.is_main_process:
                for r, h in zip(eval_runs, _heldout_losses(model, rows_ctx, eval_runs, heldout, pad_id=pad_id,
                                                           device=dev)):
                    r.row["heldout_loss"] = h
            acc.wait_for_everyone()
        for r in now:
            if r.status != "active":
                continue
            row, r.row = r.row, None
            r.book.seconds += dt
            r.book.log(row)
            r.steps_trained += 1
            if s + 1 == r.book.n_steps:
                r.error = r.book.close(base)
                r.status = "failed" if r.error is not None else "finished"
            if on_step is not None:
                on_step(r.seed, s + 1, row)
        bar.update(1)
    bar.close()
    return {r.seed: r.error if r.status == "failed" else
            TrainResult(r.book.run_dir, None, r.book.rows, r.book.summary(), r.book.lineage, acc.is_main_process, dev,
                        r.steps_trained, model_loader=_loader(base, recipe, r.seed, dev, r.weights()))
            for r in runs}


def _start(runs: Sequence[_Run], seeds: Sequence[int], packed: bool, acc) -> None:
    """Per-run bookkeeping, exactly as the single-run loop: resume point, log, lineage, manifest
    (this rank's RNG streams: seeded per rank, or the state's ``rng-rank<r>.pt``). A run already at
    its last step is ``finished``; every other run opens a segment (after every rank has read the
    lineage, so that all ranks number it alike)."""
    if acc.is_main_process:
        for run in runs:
            run.book.run_dir.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()
    for run in runs:
        seed_process(run.seed, acc.process_index)
        finished = run.book.resume()
        run.book.own_rng = rng_state()  # the state's RNG streams, or the run's seeded ones
        if finished:
            run.status = "finished"
    acc.wait_for_everyone()
    for run in runs:
        if run.status == "active":
            run.book.open_segment(batched_seeds=[int(s) for s in seeds], packed=bool(packed))


def _update(acc, model, base: Path, recipe: Recipe, s: int, now: Sequence[_Run], infos: Sequence[dict[str, Any]],
            losses: Sequence[float], lrs: Sequence[float]) -> list[_Run]:
    """Step ``s`` of every run in ``now`` after its backward: per run, its own global-norm clipping
    and AdamW step, or its nonfinite handling (a run that fails, fails alone: ``failed``, with
    its error); each other run's log row goes to ``run.row`` (update norm still 0.0). Returns the
    runs that applied an update. Under several processes the (all-reduced) gradients' norms are
    rank 0's, so every rank clips, skips and fails the same runs by the same numbers."""
    norms = grad_norms_many([r.named for r in now])  # every run's norms: one fused kernel, one host sync
    norms = _from_rank0(acc, norms)
    stepped = []
    for r, info, loss, (norm, layer_norms), lr in zip(now, infos, losses, norms, lrs):
        layer = summarize_layer_norms(layer_norms)
        nonfinite = not (math.isfinite(norm) and math.isfinite(loss))
        base_broken = (_base_forward_nonfinite(model, base, recipe)
                       if nonfinite and not math.isfinite(loss) and r.book.untrained else None)
        if nonfinite and (recipe.nonfinite == "fail" or (base_broken and base_broken[0])):
            r.optimizer.zero_grad(set_to_none=True)
            r.status, r.error = "failed", r.book.fail_nonfinite(
                s, ids=info["ids"], loss=loss, norm=norm, layer=layer, retries=0, base_broken=base_broken,
                note=" The other seeds of this base were trained on (batch_seeds).")
            continue
        skipped, clip_coef, clipped = clip_and_step(r.optimizer, r.scheduler, r.params, recipe.optimizer.max_norm,
                                                    norm, nonfinite)
        if not skipped:
            stepped.append(r)
        r.row = r.book.step_row(s, loss=loss, norm=norm, clip_coef=clip_coef, clipped=clipped, nonfinite=nonfinite,
                                skipped=skipped, retries=0, n_sup=info["sup_tokens"], lr=lr, update_norm=0.0,
                                layer=layer)
    return stepped


def _load_base(base: Path, recipe: Recipe, manifests: Sequence[dict[str, Any]],
               examples: Mapping[str, EncodedExample], pad_id: int, dev, packed: bool):
    """The frozen base, shared by all runs, and whether micro-batches are packed (``packed`` unless
    this architecture does not keep packed examples apart). :class:`NotBatchable` for a base with
    an active dropout; RecipeError for LoRA target names it does not have."""
    from ..score import load_model
    from .lora import lora_config

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
    return model, packed


def _attach_runs(model, base: Path, recipe: Recipe, seeds: Sequence[int], run_dirs: Sequence[str | Path],
                 manifests: Sequence[dict[str, Any]], base_fingerprint: str | None, dev, rows_ctx: _Rows,
                 acc) -> list[_Run]:
    """One :class:`_Run` per seed, with the single-run path's LoRA initialisation, its optimizer and
    schedule and its book; every adapted layer of ``model`` is replaced by a :class:`BatchedLoRALinear`
    over all runs' factors (then ``model`` is in training mode)."""
    runs: list[_Run] = []
    layers: dict[str, tuple[list, list, float]] = {}
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
        optimizer, scheduler = make_optimizer(params, recipe.optimizer, man["n_steps"])
        book = RunBook(rd, recipe, man, base_fingerprint, model=_View(named), optimizer=optimizer, scheduler=scheduler,
                       world=acc.num_processes, rank=acc.process_index, is_main=acc.is_main_process,
                       barrier=acc.wait_for_everyone)
        runs.append(_Run(k, seed, named, optimizer, scheduler, book, UpdateNorms(params)))
    for path, (A, B, sc) in layers.items():
        _set_module(model, path, BatchedLoRALinear(model.get_submodule(path), A, B, sc, rows_ctx))
    model.train()
    return runs


def _forward_backward(acc, model, rows_ctx: _Rows, now: Sequence[_Run], infos: Sequence[dict[str, Any]],
                      examples: Mapping[str, EncodedExample], pad_id: int, mbs: int, packed: bool) -> list[float]:
    """One optimizer step of every run in ``now`` (manifest steps ``infos``): the runs' ``j``-th
    micro-batches go through the model together; one backward of ``sum_k nll_k / N_k`` accumulates
    each run's own token-weighted gradient. With ``W`` processes this rank takes micro-batches
    ``rank, rank+W, ...`` of every run and the gradients and loss sums are summed over the ranks
    (:func:`_all_reduce_sum`). Returns the runs' losses (nats per supervised token)."""
    dev, rank, world = acc.device, acc.process_index, acc.num_processes
    micro = [[info["ids"][i: i + mbs] for i in range(0, len(info["ids"]), mbs)][rank::world] for info in infos]
    local = torch.zeros(len(now), dtype=torch.float32, device=dev)
    for j in range(max(len(m) for m in micro)):
        part = [(r, m[j]) for r, m in zip(now, micro) if j < len(m)]
        if packed:
            exs = [[examples[i] for i in ids] for _, ids in part]
            # rows no longer than the longest example: attention is not spent across a whole micro-batch
            batch, counts = pack_rows(exs, pad_id, max(len(e.input_ids) for ex in exs for e in ex))
            groups = [(r.k, c) for (r, _), c in zip(part, counts)]
            batch = {k: v.to(dev) for k, v in batch.items()}
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
    if world > 1:
        local = _all_reduce_sum([p for r in now for p in r.params], local)
    return [float(x) / info["sup_tokens"] for x, info in zip(local.tolist(), infos)]


def _all_reduce_sum(params: Sequence[torch.nn.Parameter], extra: torch.Tensor) -> torch.Tensor:
    """Sum the gradients of ``params`` (a missing one counts as zeros) and ``extra`` over all
    processes in one flattened all-reduce; the summed gradients are written back. Returns the
    summed ``extra``."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [extra.reshape(-1).float()])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    i = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[i: i + n].view_as(g).to(g.dtype)
        i += n
    return flat[i:].view_as(extra).to(extra.dtype)


def _from_rank0(acc, values: list) -> list:
    """``values`` as rank 0 has them (a picklable list; itself with one process)."""
    if acc.num_processes == 1:
        return values
    import torch.distributed as dist

    box = [values if acc.is_main_process else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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
