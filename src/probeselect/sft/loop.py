"""The SFT training loop (accelerate), in the seed document's order.

Per optimizer step ``t`` with manifest examples ``E_t`` and ``N_t`` supervised tokens:

1. every micro-batch's loss is ``sum of token NLL / N_t`` (``N_t`` is precomputed in the
   manifest), so the accumulated gradient is the token-weighted mean over the whole
   effective batch - never a mean of micro-batch means. With ``W`` processes each rank runs
   micro-batches ``rank, rank+W, ...`` and scales its loss by ``W`` because DDP averages
   gradients across ranks; the synchronised gradient is then the same as one process's;
2. gradients synchronise on the last micro-batch only (``no_sync`` before);
3. fp16 gradients are unscaled once; the global L2 norm is computed once per logical
   gradient (replicated DDP gradients are not summed over ranks). In fp16 a finite loss
   whose gradients overflow is a loss-scale problem: the scale is lowered and the *same*
   manifest step is redone from the same RNG state (at most ``MAX_SCALER_RETRIES`` times,
   logged as ``scaler_retries``), so every base applies one update per manifest step;
4. a nonfinite loss or norm (in fp16: after the retries) fails fast - saving the batch ids
   and the pre-step state to ``state/nonfinite-step-<N>/`` without touching ``latest.json``
   - or, with ``diagnostics.nonfinite: skip``, skips the update (counted, scheduler not
   advanced);
5. clip by global norm (tau = ``optimizer.clip.max_norm``), step AdamW and the schedule.

Supported accelerate setups: one process or plain DDP (see :func:`_check_accelerate_setup`).

Logged per optimizer step to ``train_log.jsonl``: loss (nats per supervised token),
grad_norm_preclip, clip_coef, clipped, nonfinite, skipped, scaler_retries, sup_tokens, lr, update_norm
(L2 of the actual change of the trainable parameters), layer_grad_norms
(min/median/max/argmax over layers), spike and spike_margin (see diagnostics.SpikeDetector). Full-state checkpoints go to ``state/``
and every (re)start is a segment in ``lineage.json``; these per-run files are kept by
:class:`probeselect.sft._runbook.RunBook`, shared with the batched-seeds loop.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import RecipeError
from ._nll import supervised_nll
from ._runbook import RunBook
from .data import EncodedExample, collate
from .diagnostics import UpdateNorms, grad_norms, summarize_layer_norms
from .recipe import Recipe
from .state import rng_state, set_rng_state

__all__ = ["TrainResult", "train", "microbatch_nll", "heldout_loss", "lr_factor", "init_seed"]

INIT_STREAM = 0x1E17
TRAIN_STREAM = 0x7A1B
MAX_SCALER_RETRIES = 16  # fp16: loss-scale halvings tried on one manifest step before it counts as nonfinite
PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}  # recipe precision -> accelerate mixed_precision


def init_seed(seed: int) -> int:
    """Seed for the LoRA initialisation: derived from ``seed`` on a stream separate from the data order."""
    return int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1)[0])


def _train_seed(seed: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, TRAIN_STREAM, rank]).generate_state(1)[0])


def seed_process(seed: int, rank: int) -> None:
    """Start every RNG stream of the process from the run's seed (as transformers.set_seed does):
    torch drives dropout; Python's and NumPy's global generators are seeded too, so nothing that
    draws from them depends on the process's history, and the saved training states (which hold
    all three, restored on resume) are byte-identical between fresh runs."""
    train_seed = _train_seed(seed, rank)
    random.seed(train_seed)
    np.random.seed(train_seed % 2**32)
    torch.manual_seed(train_seed)


def make_optimizer(params: list, opt_cfg, n_steps: int):
    """AdamW with weight decay on matrices only (no decay on biases and norms) and the recipe's LR schedule
    over ``n_steps`` optimizer steps; shared by the single-run and the batched-seeds loops."""
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": opt_cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=opt_cfg.lr, betas=opt_cfg.betas,
                                  eps=opt_cfg.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, n_steps, opt_cfg.warmup_steps, opt_cfg.schedule, opt_cfg.min_lr_ratio))
    return optimizer, scheduler


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak lr for 0-based optimizer step ``step``: linear warmup over
    ``warmup`` steps (step 0 gets 1/warmup), then cosine/linear decay to ``min_ratio`` or constant."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_ratio + (1 - min_ratio) * decay


def microbatch_nll(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Sum (not mean) of next-token NLL in nats over the supervised targets of a micro-batch
    (:func:`probeselect.sft._nll.supervised_nll`: the output head runs on those positions only)."""
    return supervised_nll(model, batch)[0].sum()


@torch.no_grad()
def heldout_loss(model, examples: Sequence[EncodedExample], *, pad_id: int, device, batch_size: int = 16) -> float:
    """Token-weighted mean NLL (nats per supervised token) over ``examples``."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        batch = {k: v.to(device) for k, v in collate(chunk, pad_id).items()}
        total += float(microbatch_nll(model, batch))
        n += sum(e.n_sup for e in chunk)
    model.train(was_training)
    return total / max(1, n)


@dataclass
class TrainResult:
    """A finished (or already finished) training run. ``model`` is unwrapped, in eval mode."""

    run_dir: Path
    model: Any
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    lineage: list[dict[str, Any]] = field(default_factory=list)
    is_main: bool = True
    device: Any = None
    steps_trained: int = 0  # optimizer steps run by this call (0: a finished run reloaded from its state)
    model_loader: Callable[[], Any] | None = None  # batched seeds: builds the run's peft model (``model`` is None)

    def get_model(self):
        """The trained model: ``model``, or (batched seeds) the run's peft model built now."""
        if self.model is None and self.model_loader is not None:
            self.model = self.model_loader()
        return self.model


def _build_model(base: Path, recipe: Recipe, seed: int, device, loaded=None):
    """The run's model: the base (``loaded``, a model already read from ``base``, is used in place)
    with LoRA initialised under the run's init seed, or all weights trainable for full fine-tuning."""
    from ..score import load_model

    model = loaded if loaded is not None else load_model(Path(base), torch.float32, device)
    model.config.use_cache = False
    if recipe.method.type == "lora":
        from peft import get_peft_model

        from .lora import lora_config

        m = recipe.method
        cfg = lora_config(model, m, source=recipe.source, base=base)  # all-linear default; names checked
        torch.manual_seed(init_seed(seed))  # LoRA A matrices: seeded separately from the data order
        try:
            with warnings.catch_warnings():  # peft 0.21 calls a transformers 5 deprecated alias
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model = get_peft_model(model, cfg)
        except ValueError as exc:
            raise RecipeError(f"{recipe.source}: method.target_modules {list(m.target_modules)} do not match the "
                              f"model at {base} ({exc}).") from None
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    model.train()
    return model


def _make_accelerator(device: str, precision: str):
    """The Accelerator for a run (tests replace this to inject a CPU grad scaler)."""
    from accelerate import Accelerator

    return Accelerator(cpu=(device == "cpu"), mixed_precision=precision)


def _check_accelerate_setup(acc, recipe: Recipe) -> None:
    """Refuse accelerate setups under which the loop's invariants break: sharded gradients
    (FSDP, DeepSpeed, Megatron, XLA) make the clip norm per-shard, and accelerate's own
    gradient accumulation divides every loss passed to ``backward``."""
    from accelerate.utils import DistributedType

    ok = {DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU,
          DistributedType.MULTI_NPU}
    if acc.distributed_type not in ok:
        raise RecipeError(
            f"{recipe.source}: accelerate is configured for {acc.distributed_type.value}; the SFT loop supports one "
            "process or plain DDP (NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, MULTI_NPU). Under FSDP/DeepSpeed the "
            "gradients are sharded, so the logged pre-clip norm and the clipping would be per shard. Launch with "
            "`accelerate launch --multi_gpu ...` (or plain `probeselect pilot`) and no FSDP/DeepSpeed config.")
    if acc.gradient_accumulation_steps != 1:
        raise RecipeError(
            f"{recipe.source}: accelerate is configured with gradient_accumulation_steps="
            f"{acc.gradient_accumulation_steps} (ACCELERATE_GRADIENT_ACCUMULATION_STEPS or the accelerate config); "
            "accelerator.backward would divide every loss by it. Accumulation belongs in the recipe "
            "(optimizer.grad_accum); unset the variable / set gradient_accumulation_steps: 1.")


def check_grad_accum_split(recipe: Recipe, world: int) -> None:
    """RecipeError unless ``optimizer.grad_accum`` splits evenly over ``world`` processes (each
    rank runs micro-batches ``rank, rank+W, ...`` of every step; shared with the batched-seeds loop)."""
    if recipe.optimizer.grad_accum % world:
        raise RecipeError(f"{recipe.source}: optimizer.grad_accum={recipe.optimizer.grad_accum} must be a multiple of "
                          f"the process count ({world}); micro-batches are split across processes so the effective "
                          "batch and the data manifest stay the same.")


def train(base: str | Path, recipe: Recipe, seed: int, run_dir: str | Path, *, manifest: dict[str, Any],
          examples: Mapping[str, EncodedExample], pad_id: int, base_fingerprint: str | None = None,
          heldout: Sequence[EncodedExample] | None = None, device: str = "auto", progress: bool = True,
          desc: str | None = None, on_step: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Train ``base`` under ``recipe`` on the examples of ``manifest`` (one data seed), resuming
    from ``run_dir/state`` if a state exists. A run whose latest state is already at the last
    step is reloaded (no training, no new lineage segment; ``steps_trained == 0``).
    ``on_step(step, row)`` runs after each step is logged and checkpointed (tests use it to
    simulate a kill)."""
    run_dir = Path(run_dir)
    acc = _make_accelerator(device, PRECISION[recipe.precision])
    _check_accelerate_setup(acc, recipe)
    rank, world = acc.process_index, acc.num_processes
    is_main = acc.is_main_process
    opt_cfg = recipe.optimizer
    check_grad_accum_split(recipe, world)
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()

    model = _build_model(Path(base), recipe, seed, acc.device)
    seed_process(seed, rank)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    n_steps = manifest["n_steps"]
    optimizer, scheduler = make_optimizer(params, opt_cfg, n_steps)
    model, optimizer = acc.prepare(model, optimizer)
    raw_model = acc.unwrap_model(model)
    scaler = acc.scaler  # fp16 on an accelerator only; bf16 and fp32 need none
    updates = UpdateNorms(params)  # buffers for the update norm, allocated once (no per-step clone)
    book = RunBook(run_dir, recipe, manifest, base_fingerprint, model=raw_model, optimizer=optimizer,
                   scheduler=scheduler, scaler=scaler, world=world, rank=rank, is_main=is_main,
                   barrier=acc.wait_for_everyone)
    if book.resume():  # finished earlier: reload only
        raw_model.eval()
        return TrainResult(run_dir, raw_model, book.rows, book.summary(), book.lineage, is_main, acc.device, 0)
    book.open_segment()
    cursor, dev = book.cursor, acc.device
    bar = tqdm(total=n_steps, initial=cursor, desc=desc or run_dir.name, unit="step", leave=False,
               disable=not (progress and is_main))
    for s in range(cursor, n_steps):
        t0 = time.perf_counter()
        step_info = manifest["steps"][s]
        ids, n_sup = step_info["ids"], step_info["sup_tokens"]
        pre_rng = rng_state()  # the pre-step state: restored for a loss-scale retry and a fail-fast state
        updates.before()
        lr = optimizer.param_groups[0]["lr"]
        loss, norm, layer_norms, retries, pre_scaler = _gradients(
            acc, model, optimizer, named, pre_rng, lambda: _forward_backward(acc, model, examples, pad_id, ids, n_sup,
                                                                            opt_cfg.micro_batch_size))
        layer = summarize_layer_norms(layer_norms)
        nonfinite = not (math.isfinite(norm) and math.isfinite(loss))
        # Before any update the model is the base itself: a nonfinite loss there is the base's fault.
        base_broken = (_base_forward_nonfinite(raw_model, base, recipe)
                       if nonfinite and not math.isfinite(loss) and book.untrained else None)
        if nonfinite and (recipe.nonfinite == "fail" or (base_broken and base_broken[0])):
            optimizer.zero_grad(set_to_none=True)
            set_rng_state(pre_rng)
            if pre_scaler is not None:
                scaler.load_state_dict(pre_scaler)
            err = book.fail_nonfinite(s, ids=ids, loss=loss, norm=norm, layer=layer, retries=retries,
                                      base_broken=base_broken)
            bar.close()
            raise err
        skipped, clip_coef, clipped = clip_and_step(optimizer, scheduler, params, opt_cfg.max_norm, norm, nonfinite,
                                                    scaler)
        update_norm = 0.0 if skipped else float(updates.after())
        book.seconds += time.perf_counter() - t0
        row = book.step_row(s, loss=loss, norm=norm, clip_coef=clip_coef, clipped=clipped, nonfinite=nonfinite,
                            skipped=skipped, retries=retries, n_sup=n_sup, lr=lr, update_norm=update_norm,
                            layer=layer)
        if recipe.eval_every and heldout and ((s + 1) % recipe.eval_every == 0 or s + 1 == n_steps):
            if is_main:
                row["heldout_loss"] = heldout_loss(raw_model, heldout, pad_id=pad_id, device=dev)
            acc.wait_for_everyone()
        book.log(row)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{book.seg_tokens / max(book.seconds, 1e-9):.0f}")
        if on_step is not None:
            on_step(s + 1, row)
    bar.close()
    err = book.close(base)
    if err is not None:
        raise err
    raw_model.eval()
    return TrainResult(run_dir, raw_model, book.rows, book.summary(), book.lineage, is_main, dev, n_steps - cursor)


def _forward_backward(acc, model, examples: Mapping[str, EncodedExample], pad_id: int, ids: list[str], n_sup: int,
                      mbs: int) -> float:
    """Accumulate one optimizer step's token-weighted gradient on this rank's micro-batches (``rank,
    rank+W, ...``); return the step's loss (nats per supervised token, over all ranks)."""
    rank, world, dev = acc.process_index, acc.num_processes, acc.device
    micro = [ids[i: i + mbs] for i in range(0, len(ids), mbs)]
    mine = micro[rank::world]
    local_nll = torch.zeros((), device=dev)
    for j, mb in enumerate(mine):
        batch = {k: v.to(dev) for k, v in collate([examples[i] for i in mb], pad_id).items()}
        sync = j == len(mine) - 1
        with (contextlib.nullcontext() if sync else acc.no_sync(model)):
            with acc.autocast():
                nll = microbatch_nll(model, batch)
            # DDP averages over ranks; x world makes the synced gradient the window's token-weighted mean.
            acc.backward(nll * (world / n_sup))
        local_nll += nll.detach().float()
    return float(acc.reduce(local_nll, reduction="sum")) / n_sup if world > 1 else float(local_nll) / n_sup


def _gradients(acc, model, optimizer, named, pre_rng, forward_backward: Callable[[], float]):
    """The step's gradients, unscaled: ``(loss, pre-clip norm, layer norms, scaler retries, the
    scaler's state before the first retry or None)``. fp16: a finite loss with overflowing gradients
    is the loss scale's fault, not the data's; the scale is lowered and the same manifest step redone
    from ``pre_rng`` (same dropout draws), so every base applies exactly one update per manifest step."""
    scaler = acc.scaler
    inner_opt = getattr(optimizer, "optimizer", optimizer)
    pre_scaler, retries = None, 0
    while True:
        loss = forward_backward()
        if scaler is not None:
            scaler.unscale_(inner_opt)
        norm, layer_norms = grad_norms(named)
        if scaler is not None and math.isfinite(loss) and not math.isfinite(norm) and retries < MAX_SCALER_RETRIES:
            if pre_scaler is None:
                pre_scaler = scaler.state_dict()
            scaler.update()  # found inf: scale *= backoff_factor
            optimizer.zero_grad(set_to_none=True)
            set_rng_state(pre_rng)
            retries += 1
            continue
        return loss, norm, layer_norms, retries, pre_scaler


def clip_and_step(optimizer, scheduler, params: list, max_norm: float | None, norm: float, nonfinite: bool,
                  scaler=None) -> tuple[bool, float, bool]:
    """Apply one optimizer step's update (shared by the single-run and the batched-seeds loops):
    ``(skipped, clip_coef, clipped)``. A nonfinite step is skipped (no update, scheduler not
    advanced; a scaler lowers its scale if the gradients overflowed); otherwise the gradients are
    clipped to ``max_norm`` by their global norm ``norm`` and AdamW and the schedule step."""
    skipped, clip_coef, clipped = False, 1.0, False
    if nonfinite:
        skipped = True
        if scaler is not None:
            scaler.update()  # no optimizer step; lowers the scale if the gradients overflowed
        optimizer.zero_grad(set_to_none=True)
        return skipped, clip_coef, clipped
    if max_norm is not None:
        coef = max_norm / (norm + 1e-6)
        clip_coef, clipped = min(1.0, coef), coef < 1.0
        if clipped:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(norm))
    optimizer.step()  # with a scaler: scaler.step (gradients already unscaled) + scaler.update
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return skipped, clip_coef, clipped


def _base_forward_nonfinite(model, base, recipe: Recipe) -> tuple[bool, str]:
    """Why a nonfinite loss before any update is the base's own: ``(weights broken, message)``."""
    from .._guards import nonfinite_params

    bad = nonfinite_params(model)
    if bad:
        return True, (f"the base's own forward pass is nonfinite before any update: {len(bad)} weight tensor(s) of "
                      f"the base {base} hold NaN/inf (e.g. {bad[0]}). The checkpoint is broken; re-copy or re-save "
                      "it, or drop it from the bases")
    return False, (f"the base's own forward pass is nonfinite before any update (the weights of {base} are finite: "
                   f"check its config/dtype, e.g. precision={recipe.precision} overflow, and this batch)")

