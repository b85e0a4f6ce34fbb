"""Half precision on CPU: bfloat16 works (compared with float32), float16 is refused clearly."""

import shutil

import numpy as np
import pytest

from probeselect import score_checkpoints
from probeselect.errors import ProbeSpecError

# Measured on the tiny ladder (checkpoints 3, 12, 24; arith_pattern 6 items x 3 variants x
# seeds 0, 1; 108 rows): max |delta| 0.018 nats on task log-probs, 0.030 nats on margins, every
# margin sign equal. The bound leaves headroom for other checkpoints of the same ladder.
TOL_NATS = 0.05


def test_bfloat16_on_cpu_close_to_float32(ladder_checkpoints, arith_spec, tmp_path):
    ladder = tmp_path / "ladder"
    for p in (ladder_checkpoints[0], ladder_checkpoints[-1]):
        shutil.copytree(p, ladder / p.name)
    kw = dict(seeds=[0, 1], audit_items=0, progress=False, device="cpu")
    f32 = score_checkpoints(ladder, [arith_spec], dtype="float32", **kw)
    bf16 = score_checkpoints(ladder, [arith_spec], dtype="bfloat16", **kw)
    assert bf16.manifest["config"]["dtype"] == "bfloat16"
    for col in ("task_logprob", "shortcut_logprob", "margin"):
        d = np.abs(f32.scores[col].to_numpy() - bf16.scores[col].to_numpy())
        print(f"bfloat16 vs float32 on CPU, {col}: max |delta| {d.max():.4f} nats over {len(d)} rows")
        assert d.max() < TOL_NATS, col
        assert d.max() > 0  # really computed in bfloat16
    # The scoring config is part of the cache key: a float32 run never reuses bfloat16 units.
    assert f32.manifest["scoring_config"] != bf16.manifest["scoring_config"]


def test_float16_on_cpu_is_refused(ladder_checkpoints, arith_spec):
    with pytest.raises(ProbeSpecError, match="float16 is not supported on CPU; use float32 .* or bfloat16"):
        score_checkpoints(ladder_checkpoints[0], [arith_spec], seeds=[0], dtype="float16", device="cpu",
                          progress=False)
