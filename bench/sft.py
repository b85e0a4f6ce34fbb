"""SFT benchmark: probeselect's pilot training loop vs TRL's SFTTrainer, on CPU.

Run: OMP_NUM_THREADS=1 python bench/sft.py [--steps 24] [--warmup 4] [--method lora|full]
     [--hidden 256] [--layers 4] [--micro-batch 8] [--grad-accum 2]

Setup (identical for both): the toy world's tokenizer (byte-level BPE, 1,024 tokens) and
SFT rows (`sft.jsonl` format, completion-only loss, EOS appended), a randomly initialised
Llama-architecture model (hidden 256, 4 layers, 4 heads, intermediate 688 by default) saved
once and loaded by both, one data manifest (probeselect's, seed 0) that fixes the examples
of every optimizer step in order (TRL gets the same rows in that order through a
sequential sampler), the same micro-batch and gradient accumulation, AdamW, cosine
schedule, clipping at 1.0, float32, no gradient checkpointing (TRL's default is on;
``--trl-grad-ckpt`` keeps it), no evaluation, no saving during training.

Each side runs in its own subprocess (so peak RSS is its own) with one torch thread.
Throughput = supervised target tokens (response + EOS, counted by each side's own masking)
of the timed steps / wall time from the end of the last warm-up step to the end of the
second-to-last step (probeselect saves its final state after the last step; that is
excluded). Peak RSS is the subprocess's ru_maxrss. Figures are recorded in bench/README.md.
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
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.6875),
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    rows = make_sft_rows(world)
    (work / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def recipe_dict(work: Path, args) -> dict:
    method = ({"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]} if args.method == "lora" else {"type": "full"})
    return {
        "name": "bench", "data": {"train": str(work / "sft.jsonl"), "max_length": 64},
        "budget": {"optimizer_steps": args.steps},
        "optimizer": {"lr": 1e-3, "warmup_steps": 2, "schedule": "cosine", "clip": {"rule": "global_norm", "max_norm": 1.0},
                      "micro_batch_size": args.micro_batch, "grad_accum": args.grad_accum},
        "method": method, "seeds": [0], "eval": {"every": 0}, "checkpointing": {"every": 0, "keep": 1},
    }


def manifest_and_examples(work: Path, args):
    from probeselect.score import load_tokenizer
    from probeselect.sft.data import data_hash, encode_rows, load_rows
    from probeselect.sft.manifest import build_data_manifest
    from probeselect.sft.recipe import recipe_from_dict

    recipe = recipe_from_dict(recipe_dict(work, args), source="bench")
    tok = load_tokenizer(work / "base")
    rows = load_rows(recipe.train_path)
    examples = encode_rows(rows, tok, max_length=recipe.max_length, loss_on="response", source="bench")
    man = build_data_manifest(examples, recipe, seed=0, tokenizer_hash=None, data_sha256=data_hash(recipe.train_path))
    return recipe, tok, rows, examples, man


def timed_rate(times: list[float], tokens: list[int], warmup: int) -> tuple[float, int, float]:
    """(tokens/s, tokens, seconds) over steps warmup+1 .. len-1 (1-based)."""
    n = len(times)
    secs = times[n - 2] - times[warmup - 1]
    toks = sum(tokens[warmup: n - 1])
    return toks / secs, toks, secs


def run_probeselect(work: Path, args) -> dict:
    from probeselect.sft.loop import train

    recipe, tok, _, examples, man = manifest_and_examples(work, args)
    rss_setup = _rss_mib()
    times: list[float] = []
    tokens: list[int] = []

    def on_step(step, row):
        times.append(time.perf_counter())
        tokens.append(row["sup_tokens"])

    res = train(work / "base", recipe, 0, work / "run-probeselect", manifest=man,
                examples={e.id: e for e in examples}, pad_id=tok.pad_token_id, device="cpu", progress=False,
                on_step=on_step)
    rate, toks, secs = timed_rate(times, tokens, args.warmup)
    return {"side": "probeselect", "tokens_per_s": rate, "timed_tokens": toks, "timed_seconds": secs,
            "steps": len(times), "final_loss": res.rows[-1]["loss"], "rss_after_setup_mib": rss_setup,
            "peak_rss_mib": _rss_mib(), "sup_tokens_per_step": tokens}


def run_trl(work: Path, args) -> dict:
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    recipe, tok, rows, _, man = manifest_and_examples(work, args)
    by_id = {r["id"]: r for r in rows}
    ordered = [by_id[i] for s in man["steps"] for i in s["ids"]]  # the manifest's order, step by step
    ds = Dataset.from_list([{"prompt": r["prompt"], "completion": r["response"]} for r in ordered])
    model = AutoModelForCausalLM.from_pretrained(str(work / "base"), dtype=torch.float32)
    peft_config = None
    if args.method == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    cfg = SFTConfig(output_dir=str(work / "run-trl"), per_device_train_batch_size=args.micro_batch,
                    gradient_accumulation_steps=args.grad_accum, max_steps=args.steps, learning_rate=1e-3,
                    lr_scheduler_type="cosine", warmup_steps=2, max_grad_norm=1.0, weight_decay=0.0,
                    adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, logging_steps=1, save_strategy="no",
                    eval_strategy="no", report_to=[], use_cpu=True, completion_only_loss=True, max_length=64,
                    packing=False, dataloader_num_workers=0, seed=0, disable_tqdm=True,
                    # matched to probeselect's recipe: float32, no activation recomputation (TRL's
                    # defaults are gradient_checkpointing=True and bf16 where supported)
                    bf16=False, fp16=False, gradient_checkpointing=args.trl_grad_ckpt)
    times: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    class SequentialSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, *a, **k):  # keep the manifest's order (no shuffling)
            return SequentialSampler(self.train_dataset)

    trainer = SequentialSFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                                   peft_config=peft_config, callbacks=[Clock()])
    # supervised targets per step from TRL's own masking (completion tokens, EOS included)
    n_sup = [sum(1 for x in lab[1:] if x != -100) for lab in trainer.train_dataset["labels"]]
    eb = args.micro_batch * args.grad_accum
    tokens = [sum(n_sup[k * eb:(k + 1) * eb]) for k in range(args.steps)]
    rss_setup = _rss_mib()
    trainer.train()
    rate, toks, secs = timed_rate(times, tokens, args.warmup)
    return {"side": "trl", "tokens_per_s": rate, "timed_tokens": toks, "timed_seconds": secs, "steps": len(times),
            "final_loss": losses[-1] if losses else None, "rss_after_setup_mib": rss_setup,
            "peak_rss_mib": _rss_mib(), "sup_tokens_per_step": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--method", choices=["lora", "full"], default="lora")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--trl-grad-ckpt", action="store_true",
                    help="keep TRL's default gradient checkpointing (off by default: probeselect recomputes nothing)")
    ap.add_argument("--side", choices=["probeselect", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < args.warmup + 3:
        ap.error("--steps must be at least --warmup + 3")
    torch.set_num_threads(1)
    if args.side:
        import warnings

        warnings.filterwarnings("ignore")
        out = (run_probeselect if args.side == "probeselect" else run_trl)(Path(args.work), args)
        print("RESULT " + json.dumps(out))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setup(work, args)
        results = {}
        for side in ("probeselect", "trl"):
            cmd = [sys.executable, __file__, "--side", side, "--work", str(work), *sys.argv[1:]]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if p.returncode or not line:
                sys.exit(f"{side} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            results[side] = json.loads(line[-1][7:])
    a, b = results["probeselect"], results["trl"]
    print(f"model: Llama hidden {args.hidden}, {args.layers} layers, method {args.method}, micro-batch "
          f"{args.micro_batch} x grad-accum {args.grad_accum}, {args.steps} steps ({args.warmup} warm-up), 1 thread")
    print(f"supervised tokens per step identical: {a['sup_tokens_per_step'] == b['sup_tokens_per_step']}")
    print(f"{'side':<12} {'tokens/s':>10} {'timed tok':>10} {'seconds':>8} {'final loss':>10} {'RSS setup':>10} "
          f"{'peak RSS':>9}")
    for r in (a, b):
        fl = f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-"
        print(f"{r['side']:<12} {r['tokens_per_s']:>10.0f} {r['timed_tokens']:>10} {r['timed_seconds']:>8.2f} "
              f"{fl:>10} {r['rss_after_setup_mib']:>8.0f}Mi {r['peak_rss_mib']:>7.0f}Mi")
    print(f"throughput ratio probeselect/TRL: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x; "
          f"peak RSS ratio: {a['peak_rss_mib'] / b['peak_rss_mib']:.2f}x")


if __name__ == "__main__":
    main()
