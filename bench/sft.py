"""SFT benchmark: probeselect's pilot training loop vs TRL's SFTTrainer, on CPU (or one GPU: ``--device cuda``).

Run: OMP_NUM_THREADS=1 python bench/sft.py [--steps 24] [--warmup 4] [--method lora|full]
     [--size toy|58m] [--hidden 256] [--layers 4] [--micro-batch 8] [--grad-accum 2]
     [--seeds 1] [--trl-layout padded|padding-free] [--max-length 96] [--device cpu|cuda]

Setup (identical for both): the toy world's tokenizer (byte-level BPE, trained with a 1,024 budget;
849 tokens for world seed 0) and
SFT rows (`sft.jsonl` format, completion-only loss, EOS appended), a randomly initialised
Llama-architecture model saved once and loaded by both, the same micro-batch and gradient
accumulation, AdamW, cosine schedule, clipping at 1.0, float32, no gradient checkpointing
(TRL's default is on; ``--trl-grad-ckpt`` keeps it), no evaluation, no saving during training.

Model sizes: ``--size toy`` (default): hidden ``--hidden`` (256), ``--layers`` (4), 4 heads,
intermediate 2.6875 x hidden (688), vocabulary = the tokenizer's 849 tokens, untied head.
``--size 58m``: bench/scoring.py's and bench/real_suite.py's shape: hidden 512, 8 layers,
8 heads, intermediate 1376, untied head and a 32,000-row vocabulary (embedding and LM head);
the toy tokenizer only uses its first 849 ids, so the other rows are never looked up but
the LM head still computes 32,000 logits per position. The model has ~58M parameters only
because of the 32k vocabulary (~25M without embedding and head).

Seeds: run k (k = 0 .. S-1, ``--seeds S``) trains on probeselect's data manifest for seed k
(as ``probeselect pilot`` does; with S = 1 this is the manifest of seed 0), which fixes the
examples of every optimizer step in order; TRL gets the same rows in that order through a
sequential sampler, and ``transformers.set_seed(k)`` before its LoRA is attached (probeselect
seeds its LoRA init with k). With S = 1, probeselect runs its single-run loop
(``probeselect.sft.loop.train``); with S > 1 it trains the S runs together with its batched
path (``probeselect.sft.batched.train_seeds``, packed micro-batches: the default for LoRA
pilots), in one subprocess, against S sequential TRL runs, each in its own subprocess (so
peak RSS is its own), all with one torch thread.

TRL layout (``--trl-layout``): ``padding-free`` (default) is TRL's ``padding_free=True``:
each micro-batch flattened into one row with position ids restarting per example and no
attention mask, so transformers' packed-sequence detection builds a block-diagonal causal
mask (the mechanism probeselect's packed micro-batches use; the script checks that both
give the same per-step supervised-token counts). TRL 1.16's ``packing=True`` is not used:
its best-fit-decreasing packing bins the whole dataset into ``max_length`` rows before
batching, so a step would no longer hold the manifest's examples (it turns padding-free on
for those bins with the same masking). ``padded`` is right-padded rows with an attention mask.

Throughput = supervised target tokens (response + EOS, counted by each side's own masking)
of the timed steps / wall time of the timed window. A run's timed window runs from the end
of its last warm-up step to the end of its second-to-last step (probeselect saves its final
state after the last step; that is excluded). For S sequential TRL runs: the S runs' timed
tokens summed / their timed windows summed (model loading and start-up between runs are not
counted). For the batched run: the S runs' timed tokens summed / the one shared window (the
end of a step = after the last run's step of that step is logged). Peak RSS is the
subprocess's ru_maxrss (the largest over TRL's S subprocesses). Figures are recorded in
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _sync(args) -> None:
    """Wait for the GPU's queued kernels before a step's end time is read (no-op on CPU)."""
    if args.device == "cuda":
        torch.cuda.synchronize()


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(work: Path, args) -> None:
    """Write the tokenizer + random model (work/base) and the SFT rows (work/sft.jsonl)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from probeselect.toy.data import make_sft_rows
    from probeselect.toy.ladder import train_tokenizer
    from probeselect.toy.world import ToyWorld

    world = ToyWorld.generate(0)
    tok = train_tokenizer(world.corpus(2000))
    torch.manual_seed(0)
    vocab = args.vocab or len(tok)
    if vocab < len(tok):
        sys.exit(f"--vocab {vocab} is smaller than the tokenizer ({len(tok)} tokens)")
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    args.n_params = sum(p.numel() for p in model.parameters())
    args.vocab_used, args.tok_size = vocab, len(tok)
    model.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    rows = make_sft_rows(world)
    (work / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def recipe_dict(work: Path, args) -> dict:
    method = ({"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]} if args.method == "lora" else {"type": "full"})
    return {
        "name": "bench", "data": {"train": str(work / "sft.jsonl"), "max_length": args.max_length},
        "budget": {"optimizer_steps": args.steps},
        "optimizer": {"lr": 1e-3, "warmup_steps": 2, "schedule": "cosine", "clip": {"rule": "global_norm", "max_norm": 1.0},
                      "micro_batch_size": args.micro_batch, "grad_accum": args.grad_accum},
        "method": method, "seeds": [0], "eval": {"every": 0}, "checkpointing": {"every": 0, "keep": 1},
    }


def manifest_and_examples(work: Path, args, seed: int = 0):
    from probeselect.score import load_tokenizer
    from probeselect.sft.data import data_hash, encode_rows, load_rows
    from probeselect.sft.manifest import build_data_manifest
    from probeselect.sft.recipe import recipe_from_dict

    recipe = recipe_from_dict(recipe_dict(work, args), source="bench")
    tok = load_tokenizer(work / "base")
    rows = load_rows(recipe.train_path)
    examples = encode_rows(rows, tok, max_length=recipe.max_length, loss_on="response", source="bench")
    man = build_data_manifest(examples, recipe, seed=seed, tokenizer_hash=None,
                              data_sha256=data_hash(recipe.train_path))
    return recipe, tok, rows, examples, man


def timed_rate(times: list[float], tokens: list[int], warmup: int) -> tuple[float, int, float]:
    """(tokens/s, tokens, seconds) over steps warmup+1 .. len-1 (1-based)."""
    n = len(times)
    secs = times[n - 2] - times[warmup - 1]
    toks = sum(tokens[warmup: n - 1])
    return toks / secs, toks, secs


def run_probeselect_batched(work: Path, args) -> dict:
    """The S seeds in one batched run (``train_seeds``, packed micro-batches)."""
    from probeselect.score import load_tokenizer
    from probeselect.sft.batched import train_seeds
    from probeselect.sft.data import data_hash, encode_rows, load_rows
    from probeselect.sft.manifest import build_data_manifest
    from probeselect.sft.recipe import recipe_from_dict

    seeds = list(range(args.seeds))
    recipe = recipe_from_dict(recipe_dict(work, args), source="bench")
    tok = load_tokenizer(work / "base")
    examples = encode_rows(load_rows(recipe.train_path), tok, max_length=recipe.max_length, loss_on="response",
                           source="bench")
    d_hash = data_hash(recipe.train_path)
    mans = [build_data_manifest(examples, recipe, seed=k, tokenizer_hash=None, data_sha256=d_hash) for k in seeds]
    rss_setup = _rss_mib()
    end_of_step: dict[int, float] = {}
    tokens = {k: [] for k in seeds}

    def on_step(seed, step, row):  # per run, after its row is logged; the last run's call ends the step
        _sync(args)
        end_of_step[step] = time.perf_counter()
        tokens[seed].append(row["sup_tokens"])

    res = train_seeds(work / "base", recipe, seeds, [work / "run-probeselect" / f"seed{k}" for k in seeds],
                      manifests=mans, examples={e.id: e for e in examples}, pad_id=tok.pad_token_id, device=args.device,
                      progress=False, on_step=on_step)
    failed = {k: str(r) for k, r in res.items() if isinstance(r, BaseException)}
    if failed:
        sys.exit(f"batched run failed: {failed}")
    times = [end_of_step[s] for s in sorted(end_of_step)]
    per_step = [sum(tokens[k][i] for k in seeds) for i in range(len(times))]
    rate, toks, secs = timed_rate(times, per_step, args.warmup)
    packed = res[seeds[0]].lineage[-1].get("packed")  # False where the base cannot keep packed examples apart
    return {"side": "probeselect", "tokens_per_s": rate, "timed_tokens": toks, "timed_seconds": secs,
            "steps": len(times), "final_loss": [res[k].rows[-1]["loss"] for k in seeds],
            "rss_after_setup_mib": rss_setup, "peak_rss_mib": _rss_mib(),
            "sup_tokens_per_step": [tokens[k] for k in seeds], "packed": packed}


def run_probeselect(work: Path, args) -> dict:
    from probeselect.sft.loop import train

    recipe, tok, _, examples, man = manifest_and_examples(work, args)
    rss_setup = _rss_mib()
    times: list[float] = []
    tokens: list[int] = []

    def on_step(step, row):
        _sync(args)
        times.append(time.perf_counter())
        tokens.append(row["sup_tokens"])

    res = train(work / "base", recipe, 0, work / "run-probeselect", manifest=man,
                examples={e.id: e for e in examples}, pad_id=tok.pad_token_id, device=args.device, progress=False,
                on_step=on_step)
    rate, toks, secs = timed_rate(times, tokens, args.warmup)
    return {"side": "probeselect", "tokens_per_s": rate, "timed_tokens": toks, "timed_seconds": secs,
            "steps": len(times), "final_loss": [res.rows[-1]["loss"]], "rss_after_setup_mib": rss_setup,
            "peak_rss_mib": _rss_mib(), "sup_tokens_per_step": [tokens]}


def run_trl(work: Path, args) -> dict:
    """One TRL run: seed ``args.run_seed`` (its manifest, its LoRA init)."""
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, TrainerCallback, set_seed
    from trl import SFTConfig, SFTTrainer

    seed = args.run_seed
    recipe, tok, rows, _, man = manifest_and_examples(work, args, seed)
    by_id = {r["id"]: r for r in rows}
    ordered = [by_id[i] for s in man["steps"] for i in s["ids"]]  # the manifest's order, step by step
    ds = Dataset.from_list([{"prompt": r["prompt"], "completion": r["response"]} for r in ordered])
    model = AutoModelForCausalLM.from_pretrained(str(work / "base"), dtype=torch.float32)
    peft_config = None
    if args.method == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    padding_free = args.trl_layout == "padding-free"
    cfg = SFTConfig(output_dir=str(work / f"run-trl-seed{seed}"), per_device_train_batch_size=args.micro_batch,
                    gradient_accumulation_steps=args.grad_accum, max_steps=args.steps, learning_rate=1e-3,
                    lr_scheduler_type="cosine", warmup_steps=2, max_grad_norm=1.0, weight_decay=0.0,
                    adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, logging_steps=1, save_strategy="no",
                    eval_strategy="no", report_to=[], use_cpu=args.device == "cpu", completion_only_loss=True,
                    # padding-free without packing needs max_length=None (TRL does not truncate then;
                    # probeselect refuses examples over max_length, so none is longer)
                    max_length=None if padding_free else args.max_length, packing=False, padding_free=padding_free,
                    dataloader_num_workers=0, seed=seed, disable_tqdm=True,
                    # matched to probeselect's recipe: float32, no activation recomputation (TRL's
                    # defaults are gradient_checkpointing=True and bf16 where supported)
                    bf16=False, fp16=False, gradient_checkpointing=args.trl_grad_ckpt)
    times: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            _sync(args)
            times.append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    class SequentialSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, *a, **k):  # keep the manifest's order (no shuffling)
            return SequentialSampler(self.train_dataset)

    set_seed(seed)  # the LoRA init (SFTTrainer attaches the adapter before Trainer seeds itself)
    trainer = SequentialSFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                                   peft_config=peft_config, callbacks=[Clock()])
    # supervised targets per step from TRL's own masking (completion tokens, EOS included)
    n_sup = [sum(1 for x in lab[1:] if x != -100) for lab in trainer.train_dataset["labels"]]
    eb = args.micro_batch * args.grad_accum
    tokens = [sum(n_sup[k * eb:(k + 1) * eb]) for k in range(args.steps)]
    rss_setup = _rss_mib()
    trainer.train()
    rate, toks, secs = timed_rate(times, tokens, args.warmup)
    return {"side": f"trl seed {seed}", "tokens_per_s": rate, "timed_tokens": toks, "timed_seconds": secs,
            "steps": len(times), "final_loss": [losses[-1] if losses else None], "rss_after_setup_mib": rss_setup,
            "peak_rss_mib": _rss_mib(), "sup_tokens_per_step": [tokens]}


SIZES = {"58m": {"hidden": 512, "layers": 8, "heads": 8, "intermediate": 1376, "vocab": 32000}}


def _sub(work: Path, side: str, env, extra=()) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--work", str(work), *extra, *sys.argv[1:]]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        sys.exit(f"{side} {' '.join(extra)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--method", choices=["lora", "full"], default="lora")
    ap.add_argument("--size", choices=["toy", "58m"], default="toy",
                    help="58m: hidden 512, 8 layers, 8 heads, intermediate 1376, vocabulary 32,000 (overrides "
                         "--hidden/--layers)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=96,
                    help="data.max_length (recipes/pilot.yaml's 96; the toy SFT rows are up to 90 tokens with EOS)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1,
                    help="S > 1: probeselect's batched run of S seeds vs S sequential TRL runs")
    ap.add_argument("--trl-layout", choices=["padding-free", "padded"], default="padding-free",
                    help="TRL's micro-batch layout (padding-free: padding_free=True, no packing across steps)")
    ap.add_argument("--trl-grad-ckpt", action="store_true",
                    help="keep TRL's default gradient checkpointing (off by default: probeselect recomputes nothing)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where both sides train (cuda: one GPU, float32 on both sides, TF32 off as torch's "
                         "default; step ends are timed after torch.cuda.synchronize())")
    ap.add_argument("--side", choices=["probeselect", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--run-seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < args.warmup + 3:
        ap.error("--steps must be at least --warmup + 3")
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    if args.seeds > 1 and args.method != "lora":
        ap.error("--seeds > 1 needs --method lora (batched seeds apply to LoRA only)")
    args.heads, args.intermediate, args.vocab = 4, int(args.hidden * 2.6875), 0  # toy: the tokenizer's vocabulary
    if args.size != "toy":
        vars(args).update(SIZES[args.size])
    torch.set_num_threads(1)
    if args.side:
        import warnings

        warnings.filterwarnings("ignore")
        if args.side == "trl":
            out = run_trl(Path(args.work), args)
        else:
            out = (run_probeselect_batched if args.seeds > 1 else run_probeselect)(Path(args.work), args)
        print("RESULT " + json.dumps(out))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    load_start = _load()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setup(work, args)
        a = _sub(work, "probeselect", env)
        trl_runs = [_sub(work, "trl", env, ("--run-seed", str(k))) for k in range(args.seeds)]
    b = {"side": f"trl x{args.seeds}" if args.seeds > 1 else "trl",
         "timed_tokens": sum(r["timed_tokens"] for r in trl_runs),
         "timed_seconds": sum(r["timed_seconds"] for r in trl_runs),
         "final_loss": [r["final_loss"][0] for r in trl_runs],
         "rss_after_setup_mib": max(r["rss_after_setup_mib"] for r in trl_runs),
         "peak_rss_mib": max(r["peak_rss_mib"] for r in trl_runs),
         "sup_tokens_per_step": [r["sup_tokens_per_step"][0] for r in trl_runs]}
    b["tokens_per_s"] = b["timed_tokens"] / b["timed_seconds"]
    if args.seeds > 1:
        a["side"] = f"probeselect batched x{args.seeds}" + (" packed" if a["packed"] else " PADDED")
    print(f"model: Llama hidden {args.hidden}, {args.layers} layers, {args.heads} heads, intermediate "
          f"{args.intermediate}, vocabulary {args.vocab_used} (tokenizer {args.tok_size}), "
          f"{args.n_params / 1e6:.1f}M parameters;"
          f" method {args.method}, micro-batch {args.micro_batch} x grad-accum {args.grad_accum}, {args.steps} steps "
          f"({args.warmup} warm-up), seeds {args.seeds}, TRL layout {args.trl_layout}, 1 thread, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    same = a["sup_tokens_per_step"] == b["sup_tokens_per_step"]
    print(f"supervised tokens per step identical (every seed): {same}")
    print(f"{'side':<24} {'tokens/s':>10} {'timed tok':>10} {'seconds':>8} {'final loss':>22} {'RSS setup':>10} "
          f"{'peak RSS':>9}")
    for r in (a, b, *(trl_runs if args.seeds > 1 else ())):
        fl = " ".join(f"{x:.4f}" if x is not None else "-" for x in r["final_loss"])
        print(f"{r['side']:<24} {r['tokens_per_s']:>10.0f} {r['timed_tokens']:>10} {r['timed_seconds']:>8.2f} "
              f"{fl:>22} {r['rss_after_setup_mib']:>8.0f}Mi {r['peak_rss_mib']:>7.0f}Mi")
    print(f"throughput ratio probeselect/TRL: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x; "
          f"peak RSS ratio: {a['peak_rss_mib'] / b['peak_rss_mib']:.2f}x")
    print(f"load average at start: {load_start}; at end: {_load()}; "
          f"whole command {time.perf_counter() - t_start:.0f} s")
    if not same:
        sys.exit("the two sides did not train on the same supervised tokens per step: the comparison is invalid")


if __name__ == "__main__":
    main()
