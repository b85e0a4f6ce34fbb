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
and every (re)start is a segment in ``lineage.json``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
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
from .diagnostics import SpikeDetector, UpdateNorms, grad_norms, summarize_layer_norms, summarize_train_log
from .manifest import compare_manifests, manifest_hash
from .recipe import Recipe
from .state import latest_state, load_state, rng_state, save_state, set_rng_state

__all__ = ["TrainResult", "train", "microbatch_nll", "heldout_loss", "lr_factor", "init_seed"]

INIT_STREAM = 0x1E17
TRAIN_STREAM = 0x7A1B
MAX_SCALER_RETRIES = 16  # fp16: loss-scale halvings tried on one manifest step before it counts as nonfinite


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def init_seed(seed: int) -> int:
    """Seed for the LoRA initialisation: derived from ``seed`` on a stream separate from the data order."""
    return int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1)[0])


def _train_seed(seed: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, TRAIN_STREAM, rank]).generate_state(1)[0])


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
    """Sum (not mean) of next-token NLL in nats over the supervised targets of a micro-batch."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    logits = out.logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


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


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill; everything after it is stale anyway
    return rows


def _append_row(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()


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
    precision = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[recipe.precision]
    acc = _make_accelerator(device, precision)
    _check_accelerate_setup(acc, recipe)
    rank, world = acc.process_index, acc.num_processes
    is_main = acc.is_main_process
    opt_cfg = recipe.optimizer
    if opt_cfg.grad_accum % world:
        raise RecipeError(f"{recipe.source}: optimizer.grad_accum={opt_cfg.grad_accum} must be a multiple of the "
                          f"process count ({world}); micro-batches are split across processes so the effective "
                          "batch and the data manifest stay the same.")
    m_hash = manifest_hash(manifest)
    # States and finished runs are keyed by the training hash; the full recipe hash is recorded.
    hashes = {"train_sha256": recipe.train_sha256, "manifest_sha256": m_hash, "base_fingerprint": base_fingerprint}
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()

    model = _build_model(Path(base), recipe, seed, acc.device)
    # Every RNG stream of the process starts from the run's seed (as transformers.set_seed does):
    # torch drives dropout; Python's and NumPy's global generators are seeded too, so nothing
    # that draws from them depends on the process's history, and the saved training states
    # (which hold all three, restored on resume) are byte-identical between fresh runs.
    train_seed = _train_seed(seed, rank)
    random.seed(train_seed)
    np.random.seed(train_seed % 2**32)
    torch.manual_seed(train_seed)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    n_steps = manifest["n_steps"]
    optimizer, scheduler = make_optimizer(params, opt_cfg, n_steps)
    model, optimizer = acc.prepare(model, optimizer)
    raw_model = acc.unwrap_model(model)
    scaler = acc.scaler  # fp16 on an accelerator only; bf16 and fp32 need none
    inner_opt = getattr(optimizer, "optimizer", optimizer)
    updates = UpdateNorms(params)  # buffers for the update norm, allocated once (no per-step clone)

    log_path, lineage_path, state_dir = run_dir / "train_log.jsonl", run_dir / "lineage.json", run_dir / "state"
    lineage = json.loads(lineage_path.read_text(encoding="utf-8"))["segments"] if lineage_path.is_file() else []
    cursor, parent = 0, None
    prev = latest_state(state_dir)
    if prev is not None:
        meta = load_state(prev, model=raw_model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                          expect={**hashes, "world_size": world}, rank=rank)
        cursor, parent = meta["cursor"], str(prev)
    dm_path = run_dir / "data_manifest.json"
    if prev is not None and dm_path.is_file():
        diff = compare_manifests(json.loads(dm_path.read_text(encoding="utf-8")), manifest)
        if diff is not None:
            raise ManifestMismatchError(
                f"{dm_path}: differs from the data manifest of this run and of its saved state {prev} ({diff}); the "
                f"file was modified. Restore it, or delete {run_dir} to retrain this (base, seed).")
    all_rows = _read_rows(log_path)
    rows = [r for r in all_rows if r["step"] <= cursor]
    discarded = len(all_rows) - len(rows)
    for seg in lineage:
        if seg["status"] == "running":  # killed: after its last step (complete) or before (interrupted)
            seg["status"] = "complete" if seg.get("end_step", 0) >= n_steps else "interrupted"

    def write_lineage() -> None:
        if is_main:
            atomic_write_json(lineage_path, {"segments": lineage})

    if is_main:
        atomic_write_jsonl(log_path, rows)
        if prev is None or not dm_path.is_file():  # no state: a manifest left from an earlier run is stale
            atomic_write_json(dm_path, manifest)
    if cursor >= n_steps:  # finished earlier: reload only (no empty lineage segment, not a resume)
        write_lineage()
        raw_model.eval()
        return TrainResult(run_dir, raw_model, rows, _summary(rows, lineage), lineage, is_main, acc.device, 0)

    seg_id = len(lineage)
    segment = {"segment": seg_id, "start_step": cursor, "end_step": cursor, "parent_state": parent,
               "discarded_log_rows": discarded, "status": "running", "world_size": world, "started_utc": _now(),
               "ended_utc": None, "recipe_sha256": recipe.sha256, **hashes}
    lineage.append(segment)
    write_lineage()

    spikes = SpikeDetector(recipe.spike_window, recipe.spike_threshold, recipe.spike_min_history,
                           [r["loss"] for r in rows], z=recipe.spike_z)
    mbs = opt_cfg.micro_batch_size
    dev = acc.device
    bar = tqdm(total=n_steps, initial=cursor, desc=desc or run_dir.name, unit="step", leave=False,
               disable=not (progress and is_main))
    seconds = 0.0
    seg_tokens = 0
    meta_base = {**hashes, "recipe_sha256": recipe.sha256, "world_size": world, "parent_state": parent,
                 "segment": seg_id}

    def checkpoint(step: int, **extra) -> Path:
        return save_state(state_dir, step=step, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                          scaler=scaler, meta={**meta_base, **extra}, rank=rank, is_main=is_main,
                          barrier=acc.wait_for_everyone, keep=recipe.checkpoint_keep)

    def forward_backward(ids: list[str], n_sup: int) -> float:
        """Accumulate the step's token-weighted gradient; return its loss (nats per supervised token)."""
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

    for s in range(cursor, n_steps):
        t0 = time.perf_counter()
        step_info = manifest["steps"][s]
        ids, n_sup = step_info["ids"], step_info["sup_tokens"]
        pre_rng = rng_state()  # the pre-step state: restored for a loss-scale retry and a fail-fast state
        pre_scaler = None  # the scaler's state before this step's first retry (if any)
        updates.before()
        lr = optimizer.param_groups[0]["lr"]
        retries = 0
        while True:
            loss = forward_backward(ids, n_sup)
            if scaler is not None:
                scaler.unscale_(inner_opt)
            norm, layer_norms = grad_norms(named)
            # fp16: a finite loss with overflowing gradients is the loss scale's fault, not the data's.
            # Lower the scale and redo the same manifest step (same dropout draws), so every base
            # applies exactly one update per manifest step.
            if scaler is not None and math.isfinite(loss) and not math.isfinite(norm) \
                    and retries < MAX_SCALER_RETRIES:
                if pre_scaler is None:
                    pre_scaler = scaler.state_dict()
                scaler.update()  # found inf: scale *= backoff_factor
                optimizer.zero_grad(set_to_none=True)
                set_rng_state(pre_rng)
                retries += 1
                continue
            break
        layer = summarize_layer_norms(layer_norms)
        nonfinite = not (math.isfinite(norm) and math.isfinite(loss))
        skipped, clip_coef, clipped, update_norm = False, 1.0, False, 0.0
        # Before any update the model is the base itself: a nonfinite loss there is the base's fault.
        base_broken = (_base_forward_nonfinite(raw_model, base, recipe)
                       if nonfinite and not math.isfinite(loss) and not any(not r.get("skipped") for r in rows)
                       else None)
        if nonfinite and (recipe.nonfinite == "fail" or (base_broken and base_broken[0])):
            optimizer.zero_grad(set_to_none=True)
            set_rng_state(pre_rng)
            if pre_scaler is not None:
                scaler.load_state_dict(pre_scaler)
            where = save_state(state_dir, step=s, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                               scaler=scaler, meta={**meta_base, "reason": "nonfinite", "failed_step": s + 1,
                                                    "scaler_retries": retries},
                               rank=rank, is_main=is_main, barrier=acc.wait_for_everyone,
                               name=f"nonfinite-step-{s + 1:06d}", set_latest=False)
            what = "loss" if not math.isfinite(loss) else (
                f"gradient after {retries} loss-scale reductions" if scaler is not None else "gradient")
            bad = {"step": s + 1, "ids": ids, "loss": loss, "grad_norm_preclip": norm, "layer_grad_norms": layer,
                   "scaler_retries": retries, "state": str(where)}
            if is_main:
                atomic_write_json(run_dir / "nonfinite_batch.json", bad)
            segment.update(status="failed", end_step=s, ended_utc=_now())
            write_lineage()
            bar.close()
            if base_broken:
                raise NonfiniteGradientError(
                    f"{run_dir}: optimizer step {s + 1}: {base_broken[1]} (loss {loss}, before any update). The "
                    f"batch is not the cause; nothing was trained (state before the step: {where}).")
            raise NonfiniteGradientError(
                f"{run_dir}: optimizer step {s + 1}: nonfinite {what} (loss {loss}, pre-clip norm {norm}). Batch ids "
                f"saved to {run_dir / 'nonfinite_batch.json'}, the state before the step to {where} (latest.json "
                "still names the last regular checkpoint). Inspect those examples; diagnostics.nonfinite=skip skips "
                "such steps (counted) instead.")
        if nonfinite:
            skipped = True
            if scaler is not None:
                scaler.update()  # no optimizer step; lowers the scale if the gradients overflowed
            optimizer.zero_grad(set_to_none=True)
        else:
            if opt_cfg.max_norm is not None:
                coef = opt_cfg.max_norm / (norm + 1e-6)
                clip_coef, clipped = min(1.0, coef), coef < 1.0
                if clipped:
                    torch.nn.utils.clip_grads_with_norm_(params, opt_cfg.max_norm, torch.tensor(norm))
            optimizer.step()  # with a scaler: scaler.step (gradients already unscaled) + scaler.update
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            update_norm = float(updates.after())
        spike, median = spikes.update(loss)
        seconds += time.perf_counter() - t0
        seg_tokens += n_sup
        row = {"step": s + 1, "segment": seg_id, "loss": loss, "grad_norm_preclip": norm, "clip_coef": clip_coef,
               "clipped": clipped, "nonfinite": nonfinite, "skipped": skipped, "scaler_retries": retries,
               "sup_tokens": n_sup, "lr": lr, "update_norm": update_norm, "layer_grad_norms": layer, "spike": spike,
               "loss_median_prev": median, "spike_margin": spikes.last_margin}
        if recipe.eval_every and heldout and ((s + 1) % recipe.eval_every == 0 or s + 1 == n_steps):
            if is_main:
                row["heldout_loss"] = heldout_loss(raw_model, heldout, pad_id=pad_id, device=dev)
            acc.wait_for_everyone()
        rows.append(row)
        if is_main:
            _append_row(log_path, row)
        segment.update(end_step=s + 1, seconds=seconds, sup_tokens=seg_tokens)
        if (recipe.checkpoint_every and (s + 1) % recipe.checkpoint_every == 0) or s + 1 == n_steps:
            checkpoint(s + 1)
            write_lineage()
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{seg_tokens / max(seconds, 1e-9):.0f}")
        if on_step is not None:
            on_step(s + 1, row)
    bar.close()
    if rows and all(r.get("skipped") for r in rows):  # not one update: the "trained" model is the base
        segment.update(status="failed", ended_utc=_now(), seconds=seconds, sup_tokens=seg_tokens)
        write_lineage()
        raise NonfiniteGradientError(
            f"{run_dir}: all {len(rows)} optimizer steps were nonfinite and skipped (diagnostics.nonfinite=skip); "
            f"no update was applied, so this run is failed, not a result. Check the base {base} (`probeselect "
            "score` on it) and the steps in train_log.jsonl.")
    segment.update(status="complete", ended_utc=_now(), seconds=seconds, sup_tokens=seg_tokens)
    write_lineage()
    raw_model.eval()
    return TrainResult(run_dir, raw_model, rows, _summary(rows, lineage), lineage, is_main, dev, n_steps - cursor)


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


def _summary(rows: list[dict[str, Any]], lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """Train-log summary plus wall seconds of training steps (all segments), resumes (segments
    that continued from a saved state and trained at least one step) and supervised tokens per
    second of step time."""
    summary = summarize_train_log(rows)
    secs = sum(seg.get("seconds") or 0.0 for seg in lineage)
    toks = sum(seg.get("sup_tokens") or 0 for seg in lineage)
    resumes = sum(1 for seg in lineage if seg["parent_state"] and seg.get("end_step", 0) > seg.get("start_step", 0))
    summary.update(seconds=secs, resumes=resumes, tokens_per_s=toks / secs if secs else None)
    return summary
