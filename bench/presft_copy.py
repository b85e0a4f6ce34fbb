"""How strongly a toy ladder's pretrained bases (before any SFT) prefer a transfer kind's shortcut (issue 23 notes).

For every row of ``LADDER/data/transfer.jsonl`` of ``--kind`` (default ``persona_tell_copy``: the copy of another
persona's answer to the same request), the answer-span log-probability margin log p(answer) - log p(shortcut) of
each checkpoint of ``--steps``, in the row's own prompt format (the toy SFT format ``"Q: ... A:"``, no chat
template), scored with probeselect's span scorer. Prints, per checkpoint, the mean margin (nats) and the share of
rows whose shortcut is preferred (margin < 0). Read next to the truth (bench/late_harm_truth.py), it separates a
copy the base never learned from one the matched SFT removes.

    python bench/presft_copy.py LADDER --steps 2400 2800 3200 [--kind persona_tell_copy] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_rows(ladder: Path, kind: str) -> list[dict]:
    path = ladder / "data" / "transfer.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no transfer set; pass a toy ladder folder (probeselect toy-ladder DIR ...)")
    every = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                every.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON line ({e.msg}); rebuild the ladder's data "
                                 "(probeselect toy-ladder DIR ...)") from None
    rows = [r for r in every if r.get("kind") == kind]
    if not rows:
        raise SystemExit(f"{path}: no row of kind {kind!r}; kinds there: {sorted({str(r.get('kind')) for r in every})}")
    if any("shortcut" not in r for r in rows):
        raise SystemExit(f"{path}: rows of kind {kind!r} carry no 'shortcut'; pick a conflict kind")
    return rows


def margins(checkpoint: Path, rows: list[dict]) -> list[float]:
    """log p(answer) - log p(shortcut) per row, for the pretrained model at ``checkpoint`` (float32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probeselect.spans import encode_pair, score_pairs

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()
    pairs = [encode_pair(tok, r["prompt"], cont) for r in rows for cont in (r["response"], " " + r["shortcut"])]
    scores = score_pairs(model, pairs)
    return [scores[2 * i].logprob - scores[2 * i + 1].logprob for i in range(len(rows))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("--steps", type=int, nargs="+", required=True, help="checkpoint steps")
    ap.add_argument("--kind", default="persona_tell_copy", help="transfer kind with a 'shortcut' (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="also write the table as CSV")
    a = ap.parse_args(argv)
    import pandas as pd
    import torch

    torch.set_num_threads(1)
    rows = read_rows(a.ladder, a.kind)
    table = []
    for step in a.steps:
        ck = a.ladder / f"checkpoint-{step}"
        if not ck.is_dir():
            raise SystemExit(f"{ck}: no such checkpoint; the ladder has "
                             f"{sorted(p.name for p in a.ladder.glob('checkpoint-*'))}")
        m = margins(ck, rows)
        table.append({"checkpoint": step, "kind": a.kind, "n": len(m), "mean_margin": sum(m) / len(m),
                      "shortcut_preferred": sum(x < 0 for x in m) / len(m)})
    df = pd.DataFrame(table)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if a.out:
        tmp = a.out.with_name(a.out.name + ".tmp")
        df.to_csv(tmp, index=False)
        tmp.replace(a.out)  # atomic: an interrupted run leaves no partial table
    return 0


if __name__ == "__main__":
    sys.exit(main())
