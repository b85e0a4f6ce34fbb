"""Pretrain a tiny Llama-architecture LM on the toy world and save a checkpoint ladder.

Entry point: :func:`build_toy_ladder`.  Everything runs on CPU in under three minutes
on two cores with the defaults (see :data:`DEFAULT_STEPS` and the README); the final
checkpoint answers held-out arithmetic correctly >= 90% of the time (greedy, seeds 0, 1).

Output layout (``out_dir``)::

    checkpoint-<step>/   config.json, generation_config.json, model.safetensors,
                         tokenizer files, trainer_state.json (HF Trainer format)
    data/                sft.jsonl, sft_heldout.jsonl, transfer.jsonl, robustness.jsonl,
                         heldout.txt, README.md (formats: :mod:`probeselect.toy.data`)
    ladder.json          build summary (written atomically, last)
"""

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .world import (
    ARITH_TEMPLATES,
    DEFAULT_CORPUS_DOCS,
    ToyWorld,
    format_arith,
    format_arith_prompt,
    rng_for,
)

#: Special tokens of the toy tokenizer (ids 0, 1, 2 in this order).
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
#: Target BPE vocabulary size (the toy corpus may saturate below it).
DEFAULT_VOCAB_SIZE = 1024

#: Default number of optimizer steps and checkpoint interval (in steps): 10 checkpoints.
DEFAULT_STEPS = 2000
DEFAULT_SAVE_EVERY = 200

#: Default model shape (a ``transformers.LlamaConfig``, ~0.2M parameters); override
#: with ``model_overrides``.
DEFAULT_MODEL_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.02,
}


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters.

    Attributes:
        seq_len: packed row length in tokens (the longest context trained on).
        batch_size: packed rows per optimizer step; tokens/step = ``batch_size * seq_len``.
        short_len: most steps reshape each row into ``seq_len // short_len`` rows of
            ``short_len`` tokens (cheaper attention); every ``long_every``-th step trains
            on full ``seq_len`` rows so positions up to ``seq_len`` are learned.
            ``short_len = seq_len`` disables this.
        long_every: period (in steps) of the full-length steps.
        lr: peak learning rate of AdamW.
        schedule: ``"cosine"`` (warmup, cosine decay) or ``"wsd"`` (warmup, constant,
            linear decay over the last ``decay_fraction`` of the steps).
        decay_fraction: length of the final decay phase of ``"wsd"`` (fraction of steps).
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        warmup_steps: linear warmup length in steps.
        weight_decay: AdamW weight decay (not applied to norms/embeddings).
        betas: AdamW betas.
        grad_clip: max global gradient norm.
        corpus_docs: number of documents in the pretraining corpus.
        eval_shots: demonstration lines in the held-out arithmetic eval prompt.
        ema_decay: checkpoints (and the final eval) use an exponential moving average
            of the weights with this decay per step (warmed up as
            ``min(ema_decay, (1 + t) / (10 + t))``); 0 saves the raw weights.
    """

    seq_len: int = 256
    batch_size: int = 8
    short_len: int = 128
    long_every: int = 4
    lr: float = 1e-2
    schedule: str = "cosine"
    decay_fraction: float = 0.25
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    corpus_docs: int = DEFAULT_CORPUS_DOCS
    eval_shots: int = 4
    ema_decay: float = 0.99


@dataclass(frozen=True)
class CheckpointInfo:
    """One saved checkpoint: ``step`` (optimizer steps), ``tokens_seen`` (tokens in all
    trained sequences so far), ``train_loss`` (mean loss over the last save interval,
    nats/token)."""

    step: int
    path: str
    tokens_seen: int
    train_loss: float


@dataclass(frozen=True)
class LadderInfo:
    """Result of :func:`build_toy_ladder` (mirrors ``ladder.json``).

    ``build_seconds`` is wall-clock seconds for the whole build;
    ``final_heldout_arith_accuracy`` is a fraction in [0, 1].
    """

    out_dir: str
    seed: int
    steps: int
    save_every: int
    checkpoints: tuple[CheckpointInfo, ...]
    tokens_seen: int
    build_seconds: float
    final_heldout_arith_accuracy: float
    ladder_json: str
    data_dir: str
    model_config: dict = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        """Alias of ``final_heldout_arith_accuracy``."""
        return self.final_heldout_arith_accuracy


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

def train_tokenizer(texts, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE (digits split individually) and wrap it as a
    ``PreTrainedTokenizerFast`` that prepends BOS when ``add_special_tokens=True``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=DEFAULT_MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------

def arith_prompts(world: ToyWorld, triples, fmt: str = "eq", shots: int = 4, stream: str = "arith-eval") -> list[str]:
    """Few-shot prompts: ``shots`` correct training-triple lines in format ``fmt`` followed
    by the query line without its answer (e.g. ``"...\\n68 - 60 ="``)."""
    rng = rng_for(world.seed, f"{stream}:{fmt}:{shots}")
    out = []
    for a, op, b in triples:
        demos = [format_arith(*rng.choice(world.arith_train), fmt) for _ in range(shots)]
        out.append("\n".join(demos + [format_arith_prompt(a, op, b, fmt)]))
    return out


@torch.no_grad()
def greedy_complete(model, tokenizer, prompts: list[str], max_new_tokens: int = 6, batch_size: int = 64) -> list[str]:
    """Greedy continuations of ``prompts`` (BOS prepended), cut at the first newline."""
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    outs = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=True)
            gen = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1]:]
            for row in tokenizer.batch_decode(new, skip_special_tokens=True):
                outs.append(row.split("\n")[0])
    finally:
        tokenizer.padding_side = old_side
    return outs


def arith_accuracy(model, tokenizer, world: ToyWorld, n: int | None = None, fmt: str = "eq",
                   shots: int = 4, batch_size: int = 64, triples=None) -> float:
    """Greedy exact-match accuracy (fraction in [0, 1]) on held-out arithmetic triples.

    Prompt = ``shots`` in-distribution demonstration lines in format ``fmt`` plus the
    query line ending just before the answer; the generation (until newline) must
    parse to the correct integer.  ``n`` limits the number of triples (the first
    ``n`` of ``world.arith_heldout``); ``triples`` overrides the triple list.
    """
    if triples is None:
        triples = list(world.arith_heldout)
    triples = list(triples)[: n if n is not None else None]
    if not triples:
        return float("nan")
    prompts = arith_prompts(world, triples, fmt, shots)
    outs = greedy_complete(model, tokenizer, prompts, batch_size=batch_size)
    correct = 0
    for (a, op, b), o in zip(triples, outs):
        try:
            correct += int(o.strip()) == (a + b if op == "+" else a - b)
        except ValueError:
            pass
    return correct / len(triples)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------

def pack_documents(tokenizer, docs: list[str], seq_len: int) -> torch.Tensor:
    """Tokenize ``docs`` as ``[BOS] doc [EOS]``, concatenate, and cut into rows of
    ``seq_len`` tokens (the ragged tail is dropped).  Returns a LongTensor [n, seq_len]."""
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    flat: list[int] = []
    for x in ids:
        flat.append(bos)
        flat.extend(x)
        flat.append(eos)
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len], dtype=torch.long).view(n, seq_len)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then either a
    cosine decay to ``min_lr_ratio * lr`` (``schedule="cosine"``) or a constant phase
    followed by a linear decay over the last ``decay_fraction`` of the steps
    (``schedule="wsd"``)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "wsd":
        decay_start = total - max(1, int(round(cfg.decay_fraction * total)))
        if step < decay_start:
            return cfg.lr
        t = (step - decay_start + 1) / max(1, total - decay_start)
        return cfg.lr * (1 - (1 - cfg.min_lr_ratio) * min(1.0, t))
    if cfg.schedule != "cosine":
        raise ValueError(f"unknown schedule {cfg.schedule!r}")
    t = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def _swapped_in(params: list, replacement: list | None):
    """Temporarily copy ``replacement`` tensors into ``params`` (no-op if None)."""
    if replacement is None:
        yield
        return
    with torch.no_grad():
        backup = [p.detach().clone() for p in params]
        torch._foreach_copy_(params, replacement)
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(params, backup)


def _calibrate_threads(model, batch: torch.Tensor, max_threads: int) -> dict:
    """Time one forward+backward pass with ``max_threads`` and with 1 thread (after a
    warm-up pass) and keep the faster setting.  Gradients are discarded, parameters are
    untouched.  Returns ``{"threads": n, "seconds": {n: s, ...}}``."""
    times = {}
    for n in (max_threads, 1, max_threads):  # the first pass is a warm-up
        torch.set_num_threads(n)
        t = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        times[n] = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    best = min(times, key=times.get)
    torch.set_num_threads(best)
    return {"threads": best, "seconds": {str(k): round(v, 4) for k, v in times.items()}}


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _trainer_state(step, max_steps, save_every, tokens, epoch, log_history, batch_size, seq_len, n_params):
    """A ``trainer_state.json`` dict in the format written by ``transformers.Trainer``."""
    return {
        "best_global_step": None,
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": epoch,
        "eval_steps": None,
        "global_step": step,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": log_history,
        "logging_steps": save_every,
        "max_steps": max_steps,
        "num_input_tokens_seen": tokens,
        "num_train_epochs": math.ceil(epoch) if epoch else 1,
        "save_steps": save_every,
        "stateful_callbacks": {},
        "total_flos": float(6 * n_params * tokens),
        "train_batch_size": batch_size,
        "trial_name": None,
        "trial_params": None,
        "seq_len": seq_len,
    }


def build_toy_ladder(
    out_dir,
    *,
    seed: int = 0,
    steps: int | None = None,
    save_every: int | None = None,
    progress: bool = True,
    model_overrides: dict | None = None,
    train_overrides: dict | None = None,
    num_threads: int | None = None,
) -> LadderInfo:
    """Build the toy checkpoint ladder in ``out_dir``.

    Generates the world and corpus for ``seed``, writes ``data/``, trains the BPE
    tokenizer, pretrains a randomly initialised ``LlamaForCausalLM`` and saves
    ``checkpoint-<step>`` folders, then evaluates greedy held-out arithmetic accuracy
    of the final checkpoint and writes ``ladder.json`` (atomically, last).

    Args:
        out_dir: output directory (created; existing ``checkpoint-<step>`` folders with
            the same names are replaced).
        seed: world / data / init / data-order seed.
        steps: optimizer steps (default :data:`DEFAULT_STEPS`).
        save_every: checkpoint interval in steps (default :data:`DEFAULT_SAVE_EVERY`);
            a checkpoint is saved at every multiple and at the final step.
        progress: show a tqdm progress bar.
        model_overrides: keys overriding :data:`DEFAULT_MODEL_CONFIG`.
        train_overrides: keys overriding :class:`TrainConfig` fields.
        num_threads: torch intra-op threads for training.  ``None`` (default) uses the
            available cores (or ``$PROBESELECT_TOY_THREADS``), but falls back to 1 thread
            when a timed pass shows that the cores are contended (an OpenMP pool on a busy
            2-core machine can be >10x slower than one thread); re-checked when training
            slows down.  An int fixes the count (bitwise-reproducible weights).
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from .data import write_toy_data

    t0 = time.time()
    steps = DEFAULT_STEPS if steps is None else int(steps)
    save_every = DEFAULT_SAVE_EVERY if save_every is None else int(save_every)
    if steps < 1 or save_every < 1:
        raise ValueError("steps and save_every must be >= 1")
    cfg = TrainConfig(**(train_overrides or {}))
    if cfg.seq_len % cfg.short_len:
        raise ValueError("seq_len must be a multiple of short_len")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    old_threads = torch.get_num_threads()
    auto_threads = num_threads is None
    if auto_threads:
        max_threads = int(os.environ.get("PROBESELECT_TOY_THREADS", 0) or _available_cores())
    else:
        max_threads = int(num_threads)
    torch.set_num_threads(max(1, max_threads))
    try:
        world = ToyWorld.generate(seed)
        docs = world.corpus(cfg.corpus_docs)
        corpus_sha = hashlib.sha256("\x1e".join(docs).encode()).hexdigest()
        data_paths = write_toy_data(world, out / "data", corpus_docs=docs)

        tokenizer = train_tokenizer(docs)
        data = pack_documents(tokenizer, docs, cfg.seq_len)
        n_rows = data.shape[0]
        if n_rows < cfg.batch_size:
            raise RuntimeError(f"corpus too small: {n_rows} packed rows < batch_size {cfg.batch_size}")

        torch.manual_seed(seed)
        mcfg = dict(DEFAULT_MODEL_CONFIG)
        mcfg.update(model_overrides or {})
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **mcfg,
        )
        model = LlamaForCausalLM(config)
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, do_sample=False,
        )
        n_params = sum(p.numel() for p in model.parameters())

        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (decay if p.ndim >= 2 and "embed" not in name else no_decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8,
        )
        params = list(model.parameters())
        ema = [p.detach().clone() for p in params] if cfg.ema_decay else None

        gen = torch.Generator().manual_seed(seed)
        order: list[int] = []
        cursor = 0
        tokens_per_step = cfg.batch_size * cfg.seq_len
        save_steps = sorted(set(range(save_every, steps + 1, save_every)) | {steps})
        checkpoints: list[CheckpointInfo] = []
        log_history: list[dict] = []
        interval_losses: list[float] = []
        rows_used = 0

        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, desc=f"toy ladder seed={seed}", unit="step")

        model.train()
        calib: dict = {}
        if auto_threads and max_threads > 1:
            calib = _calibrate_threads(model, _short_view(data[: cfg.batch_size], cfg.short_len), max_threads)
        step_times: list[float] = []
        ref_time = None
        last_calib = 0
        for step in range(steps):
            t_step = time.perf_counter()
            idx: list[int] = []
            while len(idx) < cfg.batch_size:
                if cursor >= len(order):
                    order = torch.randperm(n_rows, generator=gen).tolist()
                    cursor = 0
                take = order[cursor: cursor + cfg.batch_size - len(idx)]
                cursor += len(take)
                idx += take
            batch = data[idx]
            if cfg.long_every <= 0 or (step + 1) % cfg.long_every:
                batch = _short_view(batch, cfg.short_len)
            lr = lr_at(step, steps, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if ema is not None:
                with torch.no_grad():
                    torch._foreach_lerp_(ema, params, 1.0 - min(cfg.ema_decay, (1.0 + step) / (10.0 + step)))
            rows_used += cfg.batch_size
            interval_losses.append(loss.item())
            gstep = step + 1

            if auto_threads and max_threads > 1:
                step_times.append(time.perf_counter() - t_step)
                if ref_time is None and len(step_times) >= 10:
                    ref_time = sorted(step_times[-10:])[5]
                elif ref_time is not None and step - last_calib >= 50:
                    recent = sorted(step_times[-10:])[5]
                    retry = torch.get_num_threads() == 1 and step - last_calib >= 300
                    if recent > 2.0 * ref_time or retry:  # contention appeared (or may have gone)
                        calib = _calibrate_threads(model, _short_view(batch, cfg.short_len), max_threads)
                        step_times, ref_time, last_calib = [], None, step

            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{interval_losses[-1]:.3f}", lr=f"{lr:.2e}")
            if gstep in save_steps:
                tokens = gstep * tokens_per_step
                mean_loss = sum(interval_losses) / len(interval_losses)
                interval_losses = []
                epoch = round(rows_used / n_rows, 4)
                log_history.append({
                    "epoch": epoch, "learning_rate": lr, "loss": round(mean_loss, 6),
                    "step": gstep, "num_input_tokens_seen": tokens,
                })
                path = out / f"checkpoint-{gstep}"
                state = _trainer_state(gstep, steps, save_every, tokens, epoch, list(log_history),
                                       cfg.batch_size, cfg.seq_len, n_params)
                with _swapped_in(params, ema):
                    _save_checkpoint(model, tokenizer, path, state)
                checkpoints.append(CheckpointInfo(gstep, str(path), tokens, mean_loss))
        if bar is not None:
            bar.close()
        train_seconds = time.time() - t0

        with _swapped_in(params, ema):  # exactly the weights saved in the final checkpoint
            acc = arith_accuracy(model, tokenizer, world, fmt="eq", shots=cfg.eval_shots)
        build_seconds = time.time() - t0
        summary = {
            "seed": seed,
            "steps": steps,
            "save_every": save_every,
            "tokens_seen": steps * tokens_per_step,
            "tokens_per_step": tokens_per_step,
            "build_seconds": round(build_seconds, 2),
            "train_seconds": round(train_seconds, 2),
            "final_heldout_arith_accuracy": acc,
            "heldout_arith_eval": {"fmt": "eq", "shots": cfg.eval_shots, "n": len(world.arith_heldout),
                                   "checkpoint": f"checkpoint-{steps}", "decoding": "greedy"},
            "arith_max_operand": world.arith_max_operand,
            "model": {"architecture": "LlamaForCausalLM", "n_params": n_params, "vocab_size": len(tokenizer), **mcfg},
            "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
            "corpus": {"docs": len(docs), "sha256": corpus_sha, "packed_rows": n_rows,
                       "tokens": n_rows * cfg.seq_len, "epochs": round(rows_used / n_rows, 3)},
            "torch_threads": torch.get_num_threads(),
            "thread_calibration": calib,
            "data": {k: os.path.relpath(v, out) for k, v in data_paths.items()},
            "checkpoints": [
                {"step": c.step, "path": os.path.relpath(c.path, out), "tokens_seen": c.tokens_seen,
                 "train_loss": round(c.train_loss, 6)}
                for c in checkpoints
            ],
        }
        ladder_json = out / "ladder.json"
        _write_json_atomic(ladder_json, summary)
        return LadderInfo(
            out_dir=str(out), seed=seed, steps=steps, save_every=save_every, checkpoints=tuple(checkpoints),
            tokens_seen=steps * tokens_per_step, build_seconds=build_seconds,
            final_heldout_arith_accuracy=acc, ladder_json=str(ladder_json), data_dir=str(out / "data"),
            model_config=summary["model"],
        )
    finally:
        torch.set_num_threads(old_threads)


def _short_view(batch: torch.Tensor, short_len: int) -> torch.Tensor:
    """Reshape ``[b, seq_len]`` packed rows into ``[b * seq_len / short_len, short_len]``."""
    if batch.shape[1] == short_len:
        return batch
    return batch.reshape(-1, short_len)


def _save_checkpoint(model, tokenizer, path: Path, state: dict) -> None:
    """Save an HF checkpoint folder atomically (write ``path.tmp`` then rename)."""
    from transformers.utils import logging as hf_logging

    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per checkpoint
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _write_json_atomic(tmp / "trainer_state.json", state)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
