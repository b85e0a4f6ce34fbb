"""Bits per byte of each held-out news line of a toy ladder, per checkpoint, with its person's arrival step.

For ladders whose curriculum has ``news_stream`` documents (issue 23, attempts 17 on, bench/late_harm_notes.md):
a line about a person who has not arrived yet shows what the model knows without their documents; one about a
person who arrived long ago shows what it kept. Usage:

    python bench/news_lines_by_arrival.py LADDER --checkpoints 1000 2000 2800
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from heldout_by_kind import line_kind, load_checkpoint, read_lines

from probeselect.toy.world import line_subject


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ladder", type=Path, help="toy ladder folder built with news_stream documents")
    ap.add_argument("--checkpoints", nargs="+", required=True, metavar="STEP", help="checkpoint steps to score")
    a = ap.parse_args(argv)
    lineage = a.ladder / "data_lineage.json"
    try:
        arrivals = json.loads(lineage.read_text(encoding="utf-8")).get("news_stream_arrivals") if lineage.is_file() else None
    except (ValueError, AttributeError) as e:
        raise SystemExit(f"{lineage}: not a ladder's data lineage ({e}); rebuild the ladder "
                         "(python -m probeselect toy-ladder DIR --curriculum ...)") from None
    if not arrivals:
        raise SystemExit(f"{lineage}: no news_stream_arrivals; pass a ladder whose curriculum has news_stream documents")
    lines = sorted((ln for ln in read_lines(a.ladder) if line_kind(ln) == "news"),
                   key=lambda ln: arrivals[line_subject(ln)])
    import torch

    from probeselect.capability import heldout_nll

    torch.set_num_threads(1)
    print("arrival " + " ".join(f"{arrivals[line_subject(ln)]:>5d}" for ln in lines))
    for step in a.checkpoints:
        model, tok = load_checkpoint(a.ladder, step)
        with torch.no_grad():
            print(f"{step:>7} " + " ".join(f"{heldout_nll(model, tok, [ln]).bits_per_byte:5.2f}" for ln in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
