"""Held-out bits per byte of a toy ladder's checkpoints, split by the kind of held-out line.

The toy ladder's ``data/heldout.txt`` (``probeselect.toy.data.make_heldout_lines``) mixes arithmetic on
held-out triples, person lines (facts and persona descriptions), word-relation lines, number
sequences and, where the corpus has ``news`` documents, fact lines about the news people. Its bits per byte is byte-weighted over all lines, so a rise can come from any of them.
This splits it: per kind, the line count, the share of the bytes, the bits per byte and its
contribution (share x bpb); the contributions add up to the whole file's bpb (every line is scored
as its own document, as ``probeselect score`` does). Used in ``bench/late_harm_notes.md`` (issue 23)
to find which held-out lines a late harm makes worse.

    python bench/heldout_by_kind.py LADDER --checkpoints 2000 2800 [--out by_kind.csv]
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import pandas as pd

from probeselect.toy.world import NEWS_NAMES, line_subject

KINDS = ("arith", "person", "words", "sequence", "news")
_NEWS_NAMES = frozenset(NEWS_NAMES)
_SEQUENCE = re.compile(r"^\d+(, \d+)+$")
_ARITH = re.compile(r"\d+ [+-] \d+|\bplus\b|\bminus\b|What is \d")


def line_kind(line: str) -> str:
    """The kind of one held-out line: ``sequence`` (numbers only), ``arith`` (an arithmetic format
    of ``probeselect.toy.world.ARITH_TEMPLATES``), ``words`` (category and opposite sentences),
    ``news`` (fact lines about a person of the world's ``news_persons``, only in ladders whose corpus has
    ``news`` documents), else ``person`` (fact lines and persona descriptions: sentences about a named
    person)."""
    if _SEQUENCE.match(line):
        return "sequence"
    if line_subject(line) in _NEWS_NAMES:
        return "news"
    if _ARITH.search(line):
        return "arith"
    if line.startswith(("A ", "An ", "The opposite")):
        return "words"
    return "person"


def read_lines(ladder: Path) -> list[str]:
    path = ladder / "data" / "heldout.txt"
    if not path.is_file():
        raise SystemExit(f"{path}: no held-out text; pass a toy ladder folder (python -m probeselect toy-ladder DIR)")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise SystemExit(f"{path}: no non-empty line to score; rebuild the ladder (python -m probeselect toy-ladder DIR)")
    return lines


def load_checkpoint(ladder: Path, step):
    """``(model, tokenizer)`` of ``ladder/checkpoint-<step>`` (eval mode), or a clear exit naming the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ladder / f"checkpoint-{step}"
    if not path.is_dir():
        raise SystemExit(f"{path}: no such checkpoint in {ladder}; pass steps that have a checkpoint-<step> folder")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def by_kind(model, tokenizer, lines: list[str]) -> pd.DataFrame:
    """One row per kind present: lines, bytes, byte share, bpb, contribution; and a row ``all``
    (from the kinds' summed NLL: every line is its own document, so the nats add up)."""
    from probeselect.capability import heldout_nll

    groups = {k: [ln for ln in lines if line_kind(ln) == k] for k in KINDS}
    total = sum(len(ln.encode("utf-8")) for ln in lines)
    rows, nats = [], 0.0
    for k, g in groups.items():
        if not g:
            continue
        r = heldout_nll(model, tokenizer, g)
        nats += r.total_nats
        rows.append({"kind": k, "lines": len(g), "bytes": r.n_bytes, "byte_share": r.n_bytes / total,
                     "bpb": r.bits_per_byte, "contribution": r.n_bytes / total * r.bits_per_byte})
    bpb = nats / math.log(2) / total
    rows.append({"kind": "all", "lines": len(lines), "bytes": total, "byte_share": 1.0, "bpb": bpb, "contribution": bpb})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ladder", type=Path, help="toy ladder folder (with data/heldout.txt and checkpoint-<step>/)")
    ap.add_argument("--checkpoints", nargs="+", required=True, metavar="STEP", help="checkpoint steps to score")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    lines = read_lines(a.ladder)
    parts = []
    for step in a.checkpoints:
        model, tok = load_checkpoint(a.ladder, step)
        with torch.no_grad():
            parts.append(by_kind(model, tok, lines).assign(checkpoint=int(step)))
    table = pd.concat(parts, ignore_index=True)[["checkpoint", "kind", "lines", "bytes", "byte_share", "bpb", "contribution"]]
    if a.out:
        from probeselect._io import atomic_write_csv

        atomic_write_csv(a.out, table, float_format="%.6f")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
