"""Pretrain a tiny LM on the toy world and save a checkpoint ladder (Llama; GPT-NeoX, GPT-2, OLMo2 with ``arch``).

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
from fractions import Fraction
from pathlib import Path

import torch

from ..errors import UsageError
from ..manifest import cpu_info
from .curriculum import BUILTIN_CURRICULA, Curriculum, load_curriculum
from .world import (
    ARITH_TEMPLATES,
    CORPUS_DOC_WEIGHTS,
    DEFAULT_CORPUS_DOCS,
    DOC_KINDS,
    ToyWorld,
    format_arith,
    format_arith_prompt,
    line_subject,
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
#: Default torch intra-op thread count of a build (fixed, so that two builds of one
#: ladder on one machine give byte-identical checkpoints; the count changes the
#: floating-point reduction order, so builds with different counts differ).
#: ``$PROBESELECT_TOY_THREADS`` or ``num_threads=`` override it.
DEFAULT_NUM_THREADS = 1

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

#: Architectures a toy ladder can be trained in (``arch=``, ``toy-ladder --arch``): the same toy
#: corpus, tokenizer and curriculum on a same-size model (:data:`DEFAULT_MODEL_CONFIG`'s shape) of
#: another family found in real ladders. ``llama`` is the default.
TOY_ARCHS = ("llama", "gpt_neox", "gpt2", "olmo2")


def _arch_config_kwargs(arch: str, mcfg: dict) -> dict:
    """:data:`DEFAULT_MODEL_CONFIG`-style keys (Llama names) as ``arch``'s own config keys.

    GPT-2 and GPT-NeoX use LayerNorm (``rms_norm_eps`` becomes its epsilon) and have no
    grouped-query attention (``num_key_value_heads`` must equal the head count); GPT-2's
    dropouts are set to 0 as the other families have none by default. OLMo2 takes Llama's keys."""
    if arch in ("llama", "olmo2"):
        return dict(mcfg)
    m = dict(mcfg)
    kv = m.pop("num_key_value_heads", None)
    if kv is not None and kv != m.get("num_attention_heads"):
        raise UsageError(f"toy-ladder: {arch} has no grouped-query attention; num_key_value_heads ({kv}) must "
                         f"equal num_attention_heads ({m.get('num_attention_heads')}).")
    eps = m.pop("rms_norm_eps", None)
    if arch == "gpt_neox":
        return {**m, **({} if eps is None else {"layer_norm_eps": eps})}
    names = {"hidden_size": "n_embd", "intermediate_size": "n_inner", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"}
    out = {names.get(k, k): v for k, v in m.items()}
    if eps is not None:
        out["layer_norm_epsilon"] = eps
    return {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, **out}


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
        schedule: ``"cosine"`` (warmup, cosine decay), ``"wsd"`` (warmup, constant,
            linear decay over the last ``decay_fraction`` of the steps) or ``"piecewise"``
            (warmup, then linear between ``lr_points``).
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
        lr_points: the ``"piecewise"`` schedule: ``((fraction_of_steps, lr_ratio), ...)`` from
            fraction 0 to 1; the learning rate is ``lr`` times the ratio interpolated linearly
            at ``step / total`` (e.g. a first decay, a re-warm and a second decay, as in a
            mid-training stage).
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
    lr_points: tuple[tuple[float, float], ...] | None = None


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

#: Where the toy tokenizer learns its merges: ``"curriculum"`` (the ladder's own pretraining documents, every
#: window's; the default, which the committed examples use) or ``"reference"`` (a corpus that does not depend on
#: the curriculum: :func:`reference_tokenizer_corpus`).
TOKENIZER_CORPORA = ("curriculum", "reference")


def reference_tokenizer_corpus(world: ToyWorld, corpus_docs: int = DEFAULT_CORPUS_DOCS) -> list[str]:
    """The tokenizer corpus of ``tokenizer_corpus="reference"``: ``corpus_docs`` documents of the default
    mix (:data:`CORPUS_DOC_WEIGHTS`, no planted kinds) of ``world``, from their own stream
    (``tokenizer-reference``). It depends on the world seed only, so two curricula of one seed get the same
    tokenizer. Curricula with the same total steps and training settings that share their first window
    (name, mixture, length) then save byte-identical weights, config and tokenizer in that window, so
    differences at a later step are the curricula's, not the tokenizer's. ``trainer_state.json`` (its epoch
    counts every window's rows) and ``data/heldout.txt`` (it leaves out the whole corpus) still differ."""
    return [d for _, d in world.corpus_mixture(corpus_docs, CORPUS_DOC_WEIGHTS, stream="tokenizer-reference")]


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

def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then either a
    cosine decay to ``min_lr_ratio * lr`` (``schedule="cosine"``) or a constant phase
    followed by a linear decay over the last ``decay_fraction`` of the steps
    (``schedule="wsd"``), or linear between ``lr_points`` (``schedule="piecewise"``; the
    warmup ramps to the first point's rate)."""
    if cfg.schedule == "piecewise":
        if not cfg.lr_points:
            raise ValueError("schedule 'piecewise' needs lr_points")
        if step < cfg.warmup_steps:
            return cfg.lr * cfg.lr_points[0][1] * (step + 1) / cfg.warmup_steps
        t = step / max(1, total)
        pts = cfg.lr_points
        for (f0, r0), (f1, r1) in zip(pts, pts[1:]):
            if t <= f1:
                return cfg.lr * (r0 + (r1 - r0) * (t - f0) / (f1 - f0))
        return cfg.lr * pts[-1][1]
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


def pack_documents_with_kinds(tokenizer, docs: list[str], kinds: list[int], seq_len: int):
    """Tokenize ``docs`` as ``[BOS] doc [EOS]``, concatenate, and cut into rows of ``seq_len`` tokens (the
    ragged tail is dropped), as a LongTensor ``[n, seq_len]`` and a uint8 tensor of the same shape holding, for
    every token (BOS and EOS included), the index of its document's kind in ``kinds``."""
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    return _pack_ids(ids, kinds, tokenizer.bos_token_id, tokenizer.eos_token_id, seq_len)


def _pack_ids(ids: list[list[int]], kinds: list[int], bos: int, eos: int, seq_len: int):
    """Token-id documents, each framed by BOS and EOS, concatenated and cut into ``seq_len`` rows (the last
    remainder dropped), with the kind index of every token: the packing of :func:`pack_documents_with_kinds`."""
    flat: list[int] = []
    flat_kind: list[int] = []
    for x, k in zip(ids, kinds):
        flat.append(bos)
        flat.extend(x)
        flat.append(eos)
        flat_kind.extend([k] * (len(x) + 2))
    n = len(flat) // seq_len
    data = torch.tensor(flat[: n * seq_len], dtype=torch.long).view(n, seq_len)
    kind = torch.tensor(flat_kind[: n * seq_len], dtype=torch.uint8).view(n, seq_len)
    return data, kind


def curriculum_corpus(world: ToyWorld, curriculum: Curriculum, corpus_docs: int = DEFAULT_CORPUS_DOCS) -> list[list[tuple[str, str]]]:
    """The pretraining documents of every window of ``curriculum``, as lists of
    ``(kind, document)``: window ``w`` gets ``ceil(corpus_docs * w.steps / steps)``
    documents drawn with its mixture from the stream ``corpus:<window name>``, so the
    whole ladder has about ``corpus_docs`` documents and every window sees them for the
    same number of epochs."""
    return [world.corpus_mixture(max(1, math.ceil(corpus_docs * w.steps / curriculum.steps)), w.mixture,
                                 stream=f"corpus:{w.name}")
            for w in curriculum.windows]


@contextlib.contextmanager
def _deterministic_torch(threads: int):
    """Fixed intra-op thread count and deterministic algorithms, restored afterwards."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)
        torch.set_num_threads(old_threads)


def _sha256_docs(docs: list[str]) -> str:
    return hashlib.sha256("\x1e".join(docs).encode()).hexdigest()


@dataclass(frozen=True)
class _BuildSpec:
    """The arguments of :func:`build_toy_ladder`, checked and resolved."""

    seed: int
    arch: str
    mcfg: dict
    cur: Curriculum
    cfg: TrainConfig
    steps: int
    save_every: int
    num_threads: int
    out: Path
    tokenizer_corpus: str = "curriculum"


def _resolve_build(out_dir, *, seed, steps, save_every, model_overrides, train_overrides, num_threads, curriculum,
                   arch, tokenizer_corpus="curriculum") -> _BuildSpec:
    """Check :func:`build_toy_ladder`'s arguments, resolve its defaults and curriculum, create ``out_dir``."""
    if arch not in TOY_ARCHS:
        raise UsageError(f"toy-ladder: unknown --arch {arch!r}; choose one of {', '.join(TOY_ARCHS)}.")
    if tokenizer_corpus not in TOKENIZER_CORPORA:
        raise UsageError(f"toy-ladder: unknown --tokenizer-corpus {tokenizer_corpus!r}; choose one of "
                         f"{', '.join(TOKENIZER_CORPORA)}.")
    mcfg = _arch_config_kwargs(arch, {**DEFAULT_MODEL_CONFIG, **(model_overrides or {})})
    builtin = curriculum is None or (isinstance(curriculum, str) and curriculum in BUILTIN_CURRICULA)
    if steps is None and (builtin or isinstance(curriculum, Curriculum)):
        steps = DEFAULT_STEPS if builtin else curriculum.steps
    steps = None if steps is None else int(steps)
    save_every = DEFAULT_SAVE_EVERY if save_every is None else int(save_every)
    if steps is not None and steps < 1:
        raise UsageError(f"toy-ladder: --steps must be a positive number of optimizer steps, got {steps}.")
    if save_every < 1:
        raise UsageError(f"toy-ladder: --save-every must be a positive number of steps, got {save_every}.")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise UsageError(f"toy-ladder: OUT_DIR {out_dir} is a file; pass a folder (it is created if missing).")
    cur = load_curriculum(curriculum, steps)
    cfg = TrainConfig(**{**cur.train, **(train_overrides or {})})  # the build's overrides win over the curriculum's
    if cfg.seq_len % cfg.short_len:
        raise ValueError("seq_len must be a multiple of short_len")
    if num_threads is None:
        num_threads = int(os.environ.get("PROBESELECT_TOY_THREADS") or DEFAULT_NUM_THREADS)
    num_threads = max(1, int(num_threads))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _BuildSpec(seed=seed, arch=arch, mcfg=mcfg, cur=cur, cfg=cfg, steps=cur.steps, save_every=save_every,
                      num_threads=num_threads, out=out, tokenizer_corpus=tokenizer_corpus)


@dataclass(frozen=True)
class _Corpus:
    """The pretraining documents of every window (``win_docs``) with their kind indices
    (``win_kinds``, into :data:`DOC_KINDS`), all of them in order (``docs``, sha256 ``sha256``),
    and the files of ``data/`` (``data_paths``)."""

    win_docs: list[list[str]]
    win_kinds: list[list[int]]
    docs: list[str]
    sha256: str
    data_paths: dict


def _build_corpus(world: ToyWorld, cur: Curriculum, cfg: TrainConfig, out: Path) -> _Corpus:
    """Draw every window's documents and write ``data/``."""
    from .data import write_toy_data

    kind_index = {k: i for i, k in enumerate(DOC_KINDS)}
    win_pairs = curriculum_corpus(world, cur, cfg.corpus_docs)
    win_docs = [[d for _, d in pairs] for pairs in win_pairs]
    win_kinds = [[kind_index[k] for k, _ in pairs] for pairs in win_pairs]
    docs = [d for ds in win_docs for d in ds]
    corpus_sha = _sha256_docs(docs)
    stream = kind_index["news_stream"]
    stream_bytes = sum(len(d.encode("utf-8")) for ds, ks in zip(win_docs, win_kinds) for d, k in zip(ds, ks)
                       if k == stream)
    data_paths = write_toy_data(world, out / "data", corpus_docs=docs,
                                news=any(w.mixture.get("news", 0) > 0 for w in cur.windows),
                                news_share=stream_bytes / sum(len(d.encode("utf-8")) for d in docs),
                                sft_persona_context=cur.sft_option("persona_context"))
    return _Corpus(win_docs=win_docs, win_kinds=win_kinds, docs=docs, sha256=corpus_sha, data_paths=data_paths)


def news_arrivals(world: ToyWorld, steps: int, points=None) -> dict[str, int]:
    """The step from which each person of ``world.news_persons`` has ``news_stream`` rows drawn.

    Without ``points`` (the curve ``[[0, 0], [1, 1]]``) the ``i``-th (of ``N``, in ``news_persons`` order) arrives
    at step ``i * steps // N``, so the people arrive one by one, evenly over the run (the first at step 0). With
    ``points`` (a curriculum's ``news.arrival_points``, :data:`probeselect.toy.curriculum.NEWS_KEYS`:
    ``(fraction_of_steps, fraction_of_people)`` pairs), the ``i``-th arrives at ``floor(steps * x)``, where ``x``
    is the first fraction of steps at which the piecewise-linear curve reaches ``i / N``."""
    n = len(world.news_persons)
    # exact fractions, so that the default (identity) curve gives i * steps // N
    exact = [(Fraction(x), Fraction(y)) for x, y in (points or ((0, 0), (1, 1)))]
    return {p.name: math.floor(steps * _first_reach(exact, Fraction(i, n))) for i, p in enumerate(world.news_persons)}


def _first_reach(points, y):
    """The first ``x`` at which the piecewise-linear curve through ``points`` (from ``(0, 0)``, ``x``
    increasing, ``y`` non-decreasing) reaches ``y`` (0 <= y <= the last point's y)."""
    if y <= points[0][1]:
        return points[0][0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y <= y1 and y1 > y0:
            return x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    raise ValueError(f"the arrival curve {points!r} never reaches {y}")


def pack_stream(tokenizer, docs: list[str], arrivals: dict[str, int], seq_len: int):
    """``news_stream`` documents packed into ``seq_len`` rows, as ``(token ids, kind indices, gates)``.

    The documents are ordered by their person's step in ``arrivals`` (a stable sort: a person's documents
    keep their order) and packed as one stream, so every document but the last row's remainder is used and
    a person's documents fill consecutive rows; a row's gate is the latest arrival among the people whose
    tokens it holds (it may be drawn from that step on: no row shows a person before their step). A row
    that holds the end of one person's documents and the start of the next person's waits for the next."""
    stream = DOC_KINDS.index("news_stream")
    order = sorted(range(len(docs)), key=lambda i: arrivals[line_subject(docs[i])])
    docs = [docs[i] for i in order]
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    data, kind = _pack_ids(ids, [stream] * len(docs), tokenizer.bos_token_id, tokenizer.eos_token_id, seq_len)
    gates = [0] * data.shape[0]                  # arrivals are >= 0: the max over the documents a row holds
    end = 0
    for d, x in zip(docs, ids):
        start, end = end, end + len(x) + 2       # BOS and EOS too
        step = arrivals[line_subject(d)]
        for r in range(start // seq_len, min((end - 1) // seq_len, data.shape[0] - 1) + 1):
            gates[r] = max(gates[r], step)
    return data, kind, gates


def _pack_windows(tokenizer, cur: Curriculum, corpus: _Corpus, cfg: TrainConfig,
                  arrivals: dict[str, int] | None = None) -> tuple[list, list]:
    """Every window's documents packed into ``seq_len`` rows, as ``(token ids, kind indices)``, and
    per window the step from which each row may be drawn (None: every row from the window's start).

    A window without ``news_stream`` documents is packed as one stream of documents. In one with them,
    the other documents are packed so (the same rows as without), then the ``news_stream`` documents, in
    the order of their people's steps in ``arrivals``, into rows of their own (see :func:`pack_stream`)."""
    stream = DOC_KINDS.index("news_stream")
    win_data, win_gate = [], []
    for w, ds, ks in zip(cur.windows, corpus.win_docs, corpus.win_kinds):
        if stream not in ks:
            data, kind = pack_documents_with_kinds(tokenizer, ds, ks, cfg.seq_len)
            gate = None
        else:
            if arrivals is None:
                raise ValueError(f"window {w.name!r} has news_stream documents: pass arrivals (news_arrivals(world, steps))")
            rest = [(d, k) for d, k in zip(ds, ks) if k != stream]
            data, kind = pack_documents_with_kinds(tokenizer, [d for d, _ in rest], [k for _, k in rest], cfg.seq_len)
            sdata, skind, sgate = pack_stream(tokenizer, [d for d, k in zip(ds, ks) if k == stream], arrivals,
                                              cfg.seq_len)
            data, kind, gate = torch.cat([data, sdata]), torch.cat([kind, skind]), [0] * data.shape[0] + sgate
        if data.shape[0] < cfg.batch_size:
            raise RuntimeError(f"corpus of window {w.name!r} too small: {data.shape[0]} packed rows < batch_size "
                               f"{cfg.batch_size} (raise corpus_docs or lengthen the window)")
        win_data.append((data, kind))
        win_gate.append(gate)
    return win_data, win_gate


def _init_model(arch: str, tokenizer, mcfg: dict, seed: int):
    """A randomly initialised (seeded) causal LM of ``arch`` over ``tokenizer``'s vocabulary, greedy by default."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **mcfg,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=False,
    )
    return model



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
    curriculum=None,
    on_save=None,
    arch: str = "llama",
    tokenizer_corpus: str = "curriculum",
) -> LadderInfo:
    """Build the toy checkpoint ladder in ``out_dir``.

    Generates the world for ``seed`` and, for every window of the curriculum, a corpus
    with that window's document mixture; writes ``data/``, trains the BPE tokenizer on
    all windows' documents, pretrains a randomly initialised ``LlamaForCausalLM`` (each
    step draws its rows from the corpus of the window it belongs to) and saves
    ``checkpoint-<step>`` folders, then evaluates greedy held-out arithmetic accuracy of
    the final checkpoint and writes ``data_lineage.json`` (per window: steps, mixture,
    tokens trained on per document kind, sha256 of its documents, planted behaviour),
    ``ladder.json`` and ``build_timing.json`` (atomically, last).

    Two builds with the same arguments, thread count, library versions and CPU give
    byte-identical files, except ``build_timing.json`` (wall-clock times).

    Args:
        out_dir: output directory (created; existing ``checkpoint-<step>`` folders with
            the same names are replaced).
        seed: world / data / init / data-order seed.
        steps: optimizer steps (default: :data:`DEFAULT_STEPS` for a built-in
            curriculum, the last window's ``end_step`` for a curriculum file).
        save_every: checkpoint interval in steps (default :data:`DEFAULT_SAVE_EVERY`);
            a checkpoint is saved at every multiple and at the final step.
        progress: show a tqdm progress bar.
        model_overrides: keys overriding :data:`DEFAULT_MODEL_CONFIG`.
        train_overrides: keys overriding :class:`TrainConfig` fields.
        num_threads: torch intra-op threads (default :data:`DEFAULT_NUM_THREADS`, or
            ``$PROBESELECT_TOY_THREADS``); recorded in ``ladder.json``. The weights are
            bitwise reproducible for a fixed count; another count gives other weights.
        curriculum: ``None``/``"planted"`` (the built-in planted curriculum with a parrot
            window, :data:`probeselect.toy.curriculum.PLANTED_CURRICULUM`), ``"uniform"``
            (the default mix throughout), ``"late-harm"``, ``"negative-control"``, a YAML
            path or a mapping (see :mod:`probeselect.toy.curriculum`). Built-ins are scaled
            to ``steps``. A curriculum's ``train:`` settings (e.g. a WSD schedule) apply
            unless ``train_overrides`` sets the same field.
        on_save: called as ``on_save(path, step)`` right after ``checkpoint-<step>`` is in
            place (complete), before training goes on: e.g. score it with
            :func:`probeselect.integrations.score_checkpoint_now` while the ladder is still
            being built (docs/watching.md). Its return value is ignored; it must not change
            the model (the weights it sees on disk are those saved).
        arch: model family, one of :data:`TOY_ARCHS` (default ``"llama"``): the same
            corpus, tokenizer and curriculum on a same-size model of that family.
        tokenizer_corpus: ``"curriculum"`` (default: the BPE learns from this ladder's own
            documents, so another curriculum also changes the tokenizer and every checkpoint) or
            ``"reference"`` (it learns from :func:`reference_tokenizer_corpus`, which depends on
            the seed only: curricula that share a first window share its checkpoints).
    """
    from .._io import atomic_write_json

    t0 = time.time()
    b = _resolve_build(out_dir, seed=seed, steps=steps, save_every=save_every, model_overrides=model_overrides,
                       train_overrides=train_overrides, num_threads=num_threads, curriculum=curriculum, arch=arch,
                       tokenizer_corpus=tokenizer_corpus)
    with _deterministic_torch(b.num_threads):
        world = ToyWorld.generate(seed)
        corpus = _build_corpus(world, b.cur, b.cfg, b.out)
        tokenizer = train_tokenizer(corpus.docs if b.tokenizer_corpus == "curriculum"
                                    else reference_tokenizer_corpus(world, b.cfg.corpus_docs))
        arrivals = news_arrivals(world, b.steps, b.cur.news.get("arrival_points"))
        win_data, win_gate = _pack_windows(tokenizer, b.cur, corpus, b.cfg, arrivals)
        model = _init_model(arch, tokenizer, b.mcfg, seed)
        run = _train(model, tokenizer, win_data, b, progress=progress, on_save=on_save, win_gate=win_gate)
        train_seconds = time.time() - t0

        with _swapped_in(run.params, run.ema):  # exactly the weights saved in the final checkpoint
            acc = arith_accuracy(model, tokenizer, world, fmt="eq", shots=b.cfg.eval_shots)

        atomic_write_json(b.out / "data_lineage.json", _lineage(b.cur, corpus, win_data, run.sampler,
                                                                arrivals if any(g is not None for g in win_gate)
                                                                else None))
        build_seconds = time.time() - t0
        summary = _ladder_summary(b, world, model, tokenizer, corpus, run, acc)
        atomic_write_json(b.out / "build_timing.json", {
            "build_seconds": round(build_seconds, 2), "train_seconds": round(train_seconds, 2),
            "torch_threads": b.num_threads, "cpu_cores_available": _available_cores(),
        })
        ladder_json = b.out / "ladder.json"
        atomic_write_json(ladder_json, summary)
        return LadderInfo(
            out_dir=str(b.out), seed=seed, steps=b.steps, save_every=b.save_every, checkpoints=tuple(run.checkpoints),
            tokens_seen=summary["tokens_seen"], build_seconds=build_seconds,
            final_heldout_arith_accuracy=acc, ladder_json=str(ladder_json), data_dir=str(b.out / "data"),
            model_config=summary["model"],
        )


def _make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices only."""
    decay, no_decay = [], []
    # no weight decay on norms, biases and embeddings (token and learned position embeddings:
    # Llama's embed_tokens, GPT-NeoX's embed_in, GPT-2's wte/wpe)
    emb = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in name and id(p) not in emb else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, foreach=True,
    )


class _WindowSampler:
    """Draws each step's rows from the packed corpus of the window the step belongs to: a fresh
    shuffle (from ``gen``) per pass over the window's rows, restarted when a new window begins.
    Counts the tokens trained on per window and document kind (``win_tokens``) and the rows
    drawn per window (``win_rows``)."""

    def __init__(self, cur: Curriculum, win_data: list, batch_size: int, gen: torch.Generator,
                 win_gate: list | None = None):
        self.cur, self.win_data, self.batch_size, self.gen = cur, win_data, batch_size, gen
        self.win_gate = win_gate or [None] * len(cur.windows)
        self.win_tokens = [torch.zeros(len(DOC_KINDS), dtype=torch.long) for _ in cur.windows]
        self.win_rows = [0] * len(cur.windows)
        self.wi = -1
        self.order: list[int] = []
        self.cursor = 0

    def batch(self, gstep: int) -> torch.Tensor:
        """The ``[batch_size, seq_len]`` rows of optimizer step ``gstep`` (1-based)."""
        if self.wi < 0 or not self.cur.windows[self.wi].contains(gstep):
            self.wi = next(i for i, w in enumerate(self.cur.windows) if w.contains(gstep))
            self.order = []
            self.cursor = 0
        data, kind = self.win_data[self.wi]
        gate = self.win_gate[self.wi]
        idx: list[int] = []
        while len(idx) < self.batch_size:
            if self.cursor >= len(self.order):
                self.order = torch.randperm(data.shape[0], generator=self.gen).tolist()
                self.cursor = 0
            if gate is None:
                take = self.order[self.cursor: self.cursor + self.batch_size - len(idx)]
                self.cursor += len(take)
                idx += take
            else:  # a row whose person has not arrived yet is passed over in this pass
                r = self.order[self.cursor]
                self.cursor += 1
                if gate[r] < gstep:
                    idx.append(r)
        self.win_tokens[self.wi] += torch.bincount(kind[idx].flatten().long(), minlength=len(DOC_KINDS))
        self.win_rows[self.wi] += len(idx)
        return data[idx]


@dataclass
class _TrainRun:
    """The state of the training loop: the model's parameters and their EMA (None without),
    the sampler, the rows drawn so far, the losses since the last checkpoint, the
    ``log_history`` of ``trainer_state.json`` and the checkpoints saved."""

    params: list
    ema: list | None
    sampler: _WindowSampler
    n_params: int
    n_rows: int
    rows_used: int = 0
    interval_losses: list[float] = field(default_factory=list)
    log_history: list[dict] = field(default_factory=list)
    checkpoints: list[CheckpointInfo] = field(default_factory=list)


def _train(model, tokenizer, win_data: list, b: _BuildSpec, *, progress: bool, on_save,
           win_gate: list | None = None) -> _TrainRun:
    """Pretrain ``model`` for ``b.steps`` steps, saving ``checkpoint-<step>`` every ``b.save_every`` steps and last."""
    cfg, steps = b.cfg, b.steps
    n_params = sum(p.numel() for p in model.parameters())
    opt = _make_optimizer(model, cfg)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params] if cfg.ema_decay else None
    sampler = _WindowSampler(b.cur, win_data, cfg.batch_size, torch.Generator().manual_seed(b.seed), win_gate)
    run = _TrainRun(params=params, ema=ema, sampler=sampler, n_params=n_params,
                    n_rows=sum(d.shape[0] for d, _ in win_data))
    save_steps = sorted(set(range(b.save_every, steps + 1, b.save_every)) | {steps})

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"toy ladder seed={b.seed}", unit="step")

    model.train()
    for step in range(steps):
        gstep = step + 1
        batch = sampler.batch(gstep)
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
        run.rows_used += cfg.batch_size
        run.interval_losses.append(loss.item())

        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{run.interval_losses[-1]:.3f}", lr=f"{lr:.2e}")
        if gstep in save_steps:
            _save_step(model, tokenizer, run, b, gstep, lr, on_save)
    if bar is not None:
        bar.close()
    return run


def _save_step(model, tokenizer, run: _TrainRun, b: _BuildSpec, gstep: int, lr: float, on_save) -> None:
    """Save ``checkpoint-<gstep>`` (the EMA weights, if any) with its ``trainer_state.json``, then call ``on_save``."""
    tokens = gstep * b.cfg.batch_size * b.cfg.seq_len
    mean_loss = sum(run.interval_losses) / len(run.interval_losses)
    run.interval_losses = []
    epoch = round(run.rows_used / run.n_rows, 4)
    run.log_history.append({
        "epoch": epoch, "learning_rate": lr, "loss": round(mean_loss, 6),
        "step": gstep, "num_input_tokens_seen": tokens,
    })
    path = b.out / f"checkpoint-{gstep}"
    state = _trainer_state(gstep, b.steps, b.save_every, tokens, epoch, list(run.log_history),
                           b.cfg.batch_size, b.cfg.seq_len, run.n_params)
    with _swapped_in(run.params, run.ema):
        _save_checkpoint(model, tokenizer, path, state)
    run.checkpoints.append(CheckpointInfo(gstep, str(path), tokens, mean_loss))
    if on_save is not None:
        rng = torch.get_rng_state()  # whatever the hook draws, training goes on as without it
        on_save(path, gstep)
        torch.set_rng_state(rng)


def _lineage(cur: Curriculum, corpus: _Corpus, win_data: list, sampler: _WindowSampler,
             arrivals: dict[str, int] | None = None) -> dict:
    """The content of ``data_lineage.json`` (``news_stream_arrivals``: each news person's first step
    with ``news_stream`` rows, when the curriculum has them)."""
    win_docs, win_kinds, win_tokens = corpus.win_docs, corpus.win_kinds, sampler.win_tokens
    return {
        "curriculum": cur.source,
        **({"train": dict(cur.train)} if cur.train else {}),
        **({"sft": dict(cur.sft)} if cur.sft else {}),  # the toy SFT set's options (data/sft.jsonl); none: default
        **({"news": cur.to_dict()["news"]} if cur.news else {}),  # when the news people arrive; none: evenly
        **({"news_stream_arrivals": dict(arrivals)} if arrivals else {}),
        "steps": cur.steps,
        "doc_kinds": list(DOC_KINDS),
        "step_convention": "a window trains optimizer steps start_step < step <= end_step "
                           "(checkpoint-<step> has seen steps 1..step)",
        "windows": [
            {
                "name": w.name, "start_step": w.start_step, "end_step": w.end_step,
                "mixture": dict(w.mixture),
                "tokens_by_kind": {k: int(t) for k, t in zip(DOC_KINDS, win_tokens[i].tolist()) if t},
                "tokens": int(win_tokens[i].sum()),
                "documents": len(win_docs[i]),
                "documents_by_kind": {k: win_kinds[i].count(j) for j, k in enumerate(DOC_KINDS)
                                      if win_kinds[i].count(j)},
                "documents_sha256": _sha256_docs(win_docs[i]),
                "packed_rows": int(win_data[i][0].shape[0]),
                "corpus_tokens_by_kind": {
                    k: int(t) for k, t in zip(DOC_KINDS, torch.bincount(
                        win_data[i][1].flatten().long(), minlength=len(DOC_KINDS)).tolist()) if t},
                "epochs": round(sampler.win_rows[i] / win_data[i][0].shape[0], 3),
                "planted": w.planted,
            }
            for i, w in enumerate(cur.windows)
        ],
    }


def _ladder_summary(b: _BuildSpec, world: ToyWorld, model, tokenizer, corpus: _Corpus, run: _TrainRun,
                    acc: float) -> dict:
    """The content of ``ladder.json``."""
    cfg, cur, out, n_rows = b.cfg, b.cur, b.out, run.n_rows
    tokens_per_step = cfg.batch_size * cfg.seq_len
    return {
        "seed": b.seed,
        "steps": b.steps,
        "save_every": b.save_every,
        "tokens_seen": b.steps * tokens_per_step,
        "tokens_per_step": tokens_per_step,
        "final_heldout_arith_accuracy": acc,
        "heldout_arith_eval": {"fmt": "eq", "shots": cfg.eval_shots, "n": len(world.arith_heldout),
                               "checkpoint": f"checkpoint-{b.steps}", "decoding": "greedy"},
        "arith_max_operand": world.arith_max_operand,
        "model": {"architecture": type(model).__name__, "n_params": run.n_params, "vocab_size": len(tokenizer),
                  **b.mcfg},
        "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "corpus": {"docs": len(corpus.docs), "sha256": corpus.sha256, "packed_rows": n_rows,
                   "tokens": n_rows * cfg.seq_len, "epochs": round(run.rows_used / n_rows, 3)},
        "curriculum": {"source": cur.source, "data_lineage": "data_lineage.json",
                       "windows": [[w.name, w.start_step, w.end_step, w.planted] for w in cur.windows],
                       **({"sft": dict(cur.sft)} if cur.sft else {}),
                       **({"news": cur.to_dict()["news"]} if cur.news else {})},
        "torch_threads": b.num_threads,
        "deterministic_algorithms": True,
        "torch_version": torch.__version__,
        "tokenizer_corpus": b.tokenizer_corpus,
        # the float arithmetic's machine: two CPU types (e.g. AVX-512 vs AVX2 kernels) give different weights
        "cpu": cpu_info(),
        "timing": "build_timing.json",
        "data": {k: os.path.relpath(v, out) for k, v in corpus.data_paths.items()},
        "checkpoints": [
            {"step": c.step, "path": os.path.relpath(c.path, out), "tokens_seen": c.tokens_seen,
             "train_loss": round(c.train_loss, 6)}
            for c in run.checkpoints
        ],
    }


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
