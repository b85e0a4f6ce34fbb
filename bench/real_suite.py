"""Time scoring the whole real-LM suite (probes/real/*.yaml) on one 58M-parameter checkpoint.

Run: python bench/real_suite.py [--seeds 0 1 2 3] [--vocab 8000] [--out DIR]

Builds bench/scoring.py's randomly initialised Llama model (vocabulary 32,000, hidden 512,
8 layers, untied LM head: 58M parameters) with a byte-level BPE trained on the suite's own
text (``--vocab`` merges; English words then take 1-2 tokens, close to a real tokenizer's
rate on this text), saves it as a checkpoint folder, and times ``score_checkpoints`` with
every spec in probes/real/ under the given evaluation seeds (the generative audit off).
Prints items, tokens, wall time, torch threads and the load average. Figures are recorded
in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from probeselect.probes import generate_items, load_spec
from probeselect.score import score_checkpoints

REPO = Path(__file__).resolve().parents[1]


def make_tokenizer(texts, vocab: int):
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--flops-only", action="store_true",
                    help="only count the forward FLOPs the scorer needs (bench/scoring.py's necessary_flops)")
    args = ap.parse_args()
    torch.manual_seed(0)
    specs = [load_spec(p) for p in sorted((REPO / "probes" / "real").glob("*.yaml"))]
    items = [it for s in specs for it in generate_items(s, args.seeds)]
    tok = make_tokenizer([it.prompt + c for it in items[:: max(1, len(items) // 4000)] for c in it.candidates],
                         args.vocab)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if args.flops_only:
        sys.path.insert(0, str(REPO / "bench"))
        from scoring import necessary_flops

        from probeselect.score import _encode_items

        groups = _encode_items(tok, items)
        n_tok = sum(len(g.context_ids) + sum(len(c) for c in g.continuations) for g in groups)
        print(f"items: {len(items)}, tokens (prompts + candidates): {n_tok}, "
              f"necessary forward FLOPs: {necessary_flops(cfg, groups):.3e}")
        return
    model = LlamaForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in model.parameters())
    work = Path(args.out or tempfile.mkdtemp(prefix="real_suite_"))
    ck = work / "ckpt" / "checkpoint-1"
    model.save_pretrained(ck)
    tok.save_pretrained(ck)
    n_tok = sum(len(tok.encode(it.prompt)) for it in items)
    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    t = time.perf_counter()
    res = score_checkpoints(work / "ckpt", [s.path for s in specs], seeds=args.seeds, out=work / "run",
                            progress=False, audit_items=0)
    wall = time.perf_counter() - t
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime - cpu0
    print(f"model: {n_params / 1e6:.1f}M parameters, vocab {cfg.vocab_size} (tokenizer {len(tok)} merges used)")
    print(f"items: {len(items)} ({len(items) // len(args.seeds)} per seed x {len(args.seeds)} seeds), "
          f"prompt tokens: {n_tok} (mean {n_tok / len(items):.0f})")
    print(f"scores rows: {len(res.scores)}; families: {sorted(set(res.scores.family))}")
    print(f"CPU time of the scoring: {cpu:.1f} s (on a quiet machine the wall time is about CPU time / threads)")
    print(f"wall: {wall:.1f} s; torch threads: {torch.get_num_threads()}; "
          f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
