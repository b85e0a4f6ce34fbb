"""Cost of checkpoint fingerprints: sampled (default) vs full (``--fingerprint full``).

Writes a synthetic model folder (a config.json and one safetensors file whose tensors
have the shapes of a Llama-style model of the chosen size), then times
``fingerprint_checkpoint`` in both modes. The page cache is warm after writing the file,
so the ``full`` figure is the hashing cost; on a cold cache add one sequential read of
the weights at your disk's speed (the sampled mode reads about 1 MiB plus ~700 bytes per
tensor, so it is seek-bound instead).

    python bench/fingerprint.py --gib 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from probeselect.checkpoints import fingerprint_checkpoint


def write_model(folder: Path, gib: float, hidden: int) -> tuple[int, int]:
    layer_bytes = 4 * (4 * hidden * hidden + 3 * hidden * 4 * hidden + 2 * hidden)
    n_layers = max(1, int(gib * 2**30 // layer_bytes))
    tensors = {}
    for i in range(n_layers):
        for name, shape in (("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)),
                            ("o", (hidden, hidden)), ("gate", (4 * hidden, hidden)), ("up", (4 * hidden, hidden)),
                            ("down", (hidden, 4 * hidden)), ("ln1", (hidden,)), ("ln2", (hidden,))):
            tensors[f"model.layers.{i}.{name}.weight"] = torch.randn(shape)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file(tensors, folder / "model.safetensors")
    return (folder / "model.safetensors").stat().st_size, len(tensors)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="weight file size in GiB (default 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size (sets the tensor count; default 1024)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        size, n = write_model(Path(tmp) / "m", args.gib, args.hidden)
        print(f"weights: {size / 1e9:.2f} GB, {n} tensors")
        for mode in ("sampled", "full"):
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fingerprint_checkpoint(Path(tmp) / "m", mode)
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            print(f"{mode:8s} median {med:.3f} s  ({med / (size / 1e9):.3f} s per GB)")


if __name__ == "__main__":
    main()
