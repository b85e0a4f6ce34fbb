"""Sampling benchmark: probeselect's sample_generations vs HF generate(do_sample=True).

Run: python bench/sampling.py [--model toy|58m|both] [--ladder DIR] [--prompts 16] [--n 200] [--max-new-tokens 16]
                              [--engine shared|expand] [--no-hf] [--no-check] [--persona-items K]
                              [--spec probes/persona_qa.yaml] [--no-share-prefix] [--share-check] [--repeat 3]

Same prompts (the items of ``--spec``, evaluation seed 0: by default the shipped persona_qa
items, which share almost no prompt prefix; ``--spec probes/real/persona.yaml`` gives 15
personas x 4 questions behind each persona's whole fact pool), same number of samples per
prompt and the same limit on new tokens, same stop rule (a newline or EOS ends a sample:
HF gets ``stop_strings=["\\n"]``), temperature 1, full softmax (HF: top_k=0, top_p=1).
HF runs ``generate(do_sample=True, num_return_sequences=N)`` on the left-padded batch of
all prompts; probeselect runs :func:`probeselect.generation.sample_generations` with its
defaults and ``engine=--engine`` (default ``shared``); with ``--no-share-prefix`` it
prefills every prompt in full (``min_shared_prefix=0``) instead of prefilling a token prefix
shared by several prompts once (the default). The script prints the prompt tokens and the
tokens actually prefilled (``stats=``). Unless ``--no-check``, the other engine runs too,
timed, and the script counts the samples that are identical between the two engines (same
text, stop and length); ``--share-check`` likewise times ``--engine`` with prefix sharing
toggled and counts the identical samples. ``--persona-items K`` also times
:func:`probeselect.generation.persona_generation_table` on the first K persona_qa items
(all three variants, evaluation seed 0) with ``--n`` samples each (toy model only).
Models: ``toy`` is the last checkpoint of a toy ladder (``--ladder``; ``probeselect
toy-ladder DIR`` builds one), ``58m`` the randomly initialised 58M-parameter Llama of
bench/scoring.py with that script's tokenizer trained on the prompts. After a small
warm-up, probeselect runs ``--repeat`` times (default 3; with ``--share-check`` sharing on
and off alternate, the order flipping each round) and its median time is reported; the
other engine and HF generate run once each; prints samples/s, the ratio, mean new tokens
per sample, peak RSS and the load average. Torch uses its default thread count unless
``--threads`` is given.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scoring import build_model, make_tokenizer  # noqa: E402

from probeselect.generation import MIN_SHARED_PREFIX, persona_generation_table, sample_generations  # noqa: E402
from probeselect.probes import generate_items, load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def hf_generate(model, tok, prompts, n, max_new_tokens):
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, num_return_sequences=n, max_new_tokens=max_new_tokens,
                         temperature=1.0, top_k=0, top_p=1.0, stop_strings=["\n"], tokenizer=tok,
                         pad_token_id=tok.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    # new tokens per sample: up to and including the stop token (padding after it is not generated)
    lengths = []
    for row in new.tolist():
        k = len(row)
        while k and row[k - 1] == tok.pad_token_id:
            k -= 1
        lengths.append(k)
    return sum(lengths) / len(lengths)


def _timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def run(name, model, tok, prompts, args):
    share = 0 if args.no_share_prefix else MIN_SHARED_PREFIX
    kw = dict(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    share_txt = "off" if args.no_share_prefix else f"on, >= {MIN_SHARED_PREFIX} tokens"
    other = "expand" if args.engine == "shared" else "shared"
    torch.manual_seed(0)
    for eng in (args.engine, other):  # warm-up
        sample_generations(model, tok, prompts[:2], n=4, max_new_tokens=4, engine=eng)
    if not args.no_hf:
        hf_generate(model, tok, prompts[:2], 4, 4)
    total = len(prompts) * args.n
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{name}] params={n_params/1e6:.2f}M prompts={len(prompts)} n={args.n} max_new_tokens={args.max_new_tokens} "
          f"mean prompt {sum(len(tok.encode(p)) for p in prompts)/len(prompts):.0f} tokens "
          f"threads={torch.get_num_threads()}", flush=True)
    # sharing on and off (with --share-check) alternate over --repeat rounds, the order flipping
    # each round, so neither side pays the first full-size run's allocations; medians are reported
    flip = (MIN_SHARED_PREFIX if args.no_share_prefix else 0) if args.share_check else None
    runs: dict = {share: [], flip: []}
    outs: dict = {}
    for r in range(max(1, args.repeat)):
        order = [share] if flip is None else ([share, flip] if r % 2 == 0 else [flip, share])
        for m in order:
            st: dict = {}
            g, t = _timed(lambda: sample_generations(model, tok, prompts, engine=args.engine, stats=st,
                                                     min_shared_prefix=m, **kw))
            runs[m].append(t)
            outs[m] = (g, st)
    t_ours = statistics.median(runs[share])
    gens, st = outs[share]
    ours_new = sum(g.n_new_tokens for gs in gens for g in gs) / total
    reps = f"median of {len(runs[share])}" if len(runs[share]) > 1 else "one run"
    print(f"  probeselect ({args.engine}, prefix sharing {share_txt}) : {total/t_ours:8.1f} samples/s "
          f"({t_ours:.2f} s, {reps}; {ours_new:.2f} new tokens/sample)", flush=True)
    print(f"  prefill tokens: {st['prefill_tokens']} of {st['prompt_tokens']} prompt tokens "
          f"({st['prefill_tokens']/st['prompt_tokens']:.1%}; {st['shared_groups']} prefix groups holding "
          f"{st['shared_prompts']} of {st['prompts']} prompts)", flush=True)
    if flip is not None:
        ref, st2 = outs[flip]
        t_flip = statistics.median(runs[flip])
        same = sum(a == b and a.stop == b.stop for xs, ys in zip(gens, ref) for a, b in zip(xs, ys))
        print(f"  probeselect ({args.engine}, prefix sharing {'on' if flip else 'off'}) : {total/t_flip:8.1f} "
              f"samples/s ({t_flip:.2f} s, {reps}; {st2['prefill_tokens']} prefill tokens); "
              f"sharing off/on time = {(t_flip / t_ours) if flip == 0 else (t_ours / t_flip):.2f}x "
              f"(rounds: on {' '.join(f'{x:.2f}' for x in runs[flip if flip else share])} s, "
              f"off {' '.join(f'{x:.2f}' for x in runs[share if flip else flip])} s); "
              f"identical samples {same}/{total}", flush=True)
    if not args.no_check:
        ref, t_other = _timed(lambda: sample_generations(model, tok, prompts, engine=other,
                                                         min_shared_prefix=share, **kw))
        same = sum(a == b and a.stop == b.stop for xs, ys in zip(gens, ref) for a, b in zip(xs, ys))
        print(f"  probeselect ({other}) : {total/t_other:8.1f} samples/s ({t_other:.2f} s); "
              f"{args.engine}/{other} = {t_other/t_ours:.2f}x; identical samples {same}/{total}", flush=True)
    if not args.no_hf:
        hf_new, t_hf = _timed(lambda: hf_generate(model, tok, prompts, args.n, args.max_new_tokens))
        print(f"  HF generate : {total/t_hf:8.1f} samples/s ({t_hf:.2f} s; {hf_new:.2f} new tokens/sample, "
              f"padding after a row's stop excluded)")
        print(f"  ratio       : {t_hf/t_ours:.2f}x", flush=True)


def run_persona(model, tok, args):
    items = generate_items(load_spec(ROOT / "probes" / "persona_qa.yaml"), [0])
    share = 0 if args.no_share_prefix else MIN_SHARED_PREFIX
    by_variant: dict[str, list] = {}
    for it in items:
        by_variant.setdefault(it.variant, []).append(it)
    chosen = [it for its in by_variant.values() for it in its[: args.persona_items]]
    df, dt = _timed(lambda: persona_generation_table(model, tok, chosen, n=args.n,
                                                     max_new_tokens=args.max_new_tokens, seed=0,
                                                     min_shared_prefix=share))
    total = int(df["n_samples"].sum())
    print(f"  persona_generation_table ({len(chosen)} items = {args.persona_items} x {len(by_variant)} variants, "
          f"n={args.n}, default engine, prefix sharing {'off' if share == 0 else 'on'}): {total/dt:8.1f} samples/s ({dt:.2f} s); "
          f"task rate {df['n_task'].sum()/total:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="both", choices=["toy", "58m", "both"])
    ap.add_argument("--ladder", default="/tmp/ladder15")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--prompts-58m", type=int, default=4)
    ap.add_argument("--n-58m", type=int, default=32)
    ap.add_argument("--engine", default="shared", choices=["shared", "expand"],
                    help="probeselect's decode engine to time against HF (default shared)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the other engine (its timing and the identical-sample count)")
    ap.add_argument("--persona-items", type=int, default=0, metavar="K",
                    help="also time persona_generation_table on K items per variant (toy model)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    ap.add_argument("--spec", default=str(ROOT / "probes" / "persona_qa.yaml"),
                    help="probe spec whose items (evaluation seed 0) are the prompts (default probes/persona_qa.yaml; "
                         "probes/real/persona.yaml: questions sharing a fact-pool prefix)")
    ap.add_argument("--no-share-prefix", action="store_true",
                    help="prefill every prompt in full (min_shared_prefix=0); by default prompts sharing a token "
                         f"prefix of >= {MIN_SHARED_PREFIX} tokens prefill it once")
    ap.add_argument("--repeat", type=int, default=3, metavar="R",
                    help="time probeselect R times (with --share-check: R rounds of sharing on and off, "
                         "alternating) and report the median (default 3); the other engine and HF run once")
    ap.add_argument("--share-check", action="store_true",
                    help="also time --engine with prefix sharing toggled and count identical samples")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    items = generate_items(load_spec(args.spec), [0])
    prompts = [it.prompt for it in items]
    print(f"prompts: {args.spec} (evaluation seed 0, {len(prompts)} items)")
    if args.model in ("toy", "both"):
        from probeselect.checkpoints import discover_checkpoints
        from probeselect.score import load_model, load_tokenizer

        ck = discover_checkpoints(args.ladder)[-1]
        model, tok = load_model(ck.path, torch.float32, torch.device("cpu")), load_tokenizer(ck.path)
        run(f"toy {ck.name}", model, tok, prompts[: args.prompts], args)
        if args.persona_items:
            run_persona(model, tok, args)
    if args.model in ("58m", "both"):
        tok = make_tokenizer([p + " I live in Oslo." for p in prompts])

        class A:
            hidden, layers, heads, intermediate, max_positions = 512, 8, 8, 1376, 1024
        _, model = build_model(A, torch.device("cpu"), torch.float32, tok)
        sub = argparse.Namespace(**{**vars(args), "n": args.n_58m})
        run("58m random init", model, tok, prompts[: args.prompts_58m], sub)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB; load average at end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
