import numpy as np
import pandas as pd
import pytest

from probeselect.tables import bootstrap_mean_ci, summarize_scores


def _rows():
    # 2 seeds x 3 items, margins chosen by hand
    margins = {0: [1.0, -1.0, 3.0], 1: [2.0, 0.5, -0.5]}
    rows = []
    for seed, ms in margins.items():
        for i, m in enumerate(ms):
            rows.append(dict(checkpoint="c", step=1, tokens=10, family="f", variant="v", seed=seed,
                             item_id=f"i{i}", margin=m, margin_per_token=m / 2, correct=m > 0,
                             candidate_correct=m > 1))
    return pd.DataFrame(rows)


def test_summary_values():
    s = summarize_scores(_rows()).iloc[0]
    assert s.mean_margin == pytest.approx(5.0 / 6, abs=1e-12)
    # per-seed means 1.0 and 2/3 -> sd (ddof=1) = |1 - 2/3| / sqrt(2)
    assert s.seed_sd == pytest.approx((1 - 2 / 3) / np.sqrt(2), abs=1e-12)
    assert s.accuracy == pytest.approx(4 / 6) and s.candidate_accuracy == pytest.approx(2 / 6)
    assert s.mean_margin_per_token == pytest.approx(5.0 / 12)
    assert s.n_items == 3 and s.n_seeds == 2
    assert s.ci_low <= s.mean_margin <= s.ci_high


def test_bootstrap_ci_covers_and_shrinks():
    rng = np.random.default_rng(1)
    x = rng.normal(2.0, 1.0, size=400)
    lo, hi = bootstrap_mean_ci(x)
    assert lo < 2.0 < hi
    # standard error ~ 0.05 -> 95% width ~ 0.2 (tolerance for bootstrap noise)
    assert hi - lo == pytest.approx(2 * 1.96 / np.sqrt(400), rel=0.2)
    assert np.isnan(bootstrap_mean_ci(np.array([1.0]))[0])
