"""Metric directions and orientation: one place, used by dynamics, shortlist and proxy validation."""

import numpy as np
import pandas as pd
import pytest

from probeselect.dynamics import spearman_matrix
from probeselect.errors import ProbeselectError, ProbeSpecError
from probeselect.metrics import direction, direction_word, is_rate, oriented


@pytest.mark.parametrize("name,want", [
    ("bits_per_byte", -1), ("sft_heldout_bpb", -1), ("heldout_bpb", -1), ("heldout_loss", -1), ("nats_per_token", -1),
    ("val_nll", -1), ("seed_sd", -1),
    ("mean_margin", 1), ("mean_margin_per_token", 1), ("accuracy", 1), ("candidate_accuracy", 1),
    ("task_accuracy", 1), ("task_logprob", 1), ("robust_recovery", 1), ("termination", 1),
    ("persona_qa/block:gen_consistency", 1), ("heldout_nll/bpb:bits_per_byte", -1),
])
def test_direction_of_every_built_in_metric(name, want):
    assert direction(name) == want
    assert direction_word(name) == ("higher" if want > 0 else "lower")


def test_unknown_direction_is_an_error_not_a_guess():
    with pytest.raises(ProbeselectError, match="unknown direction"):
        direction("n_items")
    with pytest.raises(ProbeselectError):
        direction("margin_loss")  # both a higher and a lower part: ambiguous


def test_oriented_keeps_types_and_flips_lower_is_better():
    assert oriented(2.0, "bits_per_byte") == -2.0
    assert list(oriented([1.0, 2.0], "mean_margin")) == [1.0, 2.0]
    s = oriented(pd.Series([1.0, 3.0]), "heldout_loss")
    assert isinstance(s, pd.Series) and s.tolist() == [-1.0, -3.0]
    assert oriented(np.array([1.0]), sign=-1).tolist() == [-1.0]
    assert is_rate("termination") and is_rate("task_accuracy") and not is_rate("task_logprob")


def test_falling_bpb_and_rising_margin_agree_after_orientation():
    """The bug: correlating raw bits per byte against a margin gave -1 for perfect agreement."""
    bpb = np.array([1.0, 0.9, 0.7, 0.65, 0.6])  # improves (falls)
    margin = np.array([-1.0, 0.0, 0.5, 2.0, 3.0])  # improves (rises)
    raw = pd.DataFrame({"bpb": bpb, "margin": margin})
    assert spearman_matrix(raw)[0].loc["bpb", "margin"] == pytest.approx(-1.0)
    wide = pd.DataFrame({"bpb": oriented(bpb, "bits_per_byte"), "margin": oriented(margin, "mean_margin")})
    assert spearman_matrix(wide)[0].loc["bpb", "margin"] == pytest.approx(1.0)


def test_plan_direction_defaults_from_the_metric_and_contradictions_are_refused():
    from probeselect.shortlist import plan_from_dict

    base = {"family": "heldout_nll", "variant": "bpb"}
    plan = plan_from_dict({"proxies": [dict(base, metric="bits_per_byte"), {"family": "c", "metric": "mean_margin"}]})
    assert [p.direction for p in plan.proxies] == ["lower", "higher"]
    with pytest.raises(ProbeSpecError, match="contradicts 'bits_per_byte'"):
        plan_from_dict({"proxies": [dict(base, metric="bits_per_byte", direction="higher"),
                                    {"family": "c", "metric": "mean_margin"}]})
    with pytest.raises(ProbeSpecError, match="no known direction"):
        plan_from_dict({"proxies": [{"family": "c", "metric": "gen_other_rate"}, {"family": "c", "metric": "mean_margin"}]})
    ok = plan_from_dict({"proxies": [{"family": "c", "metric": "gen_other_rate", "direction": "lower"},
                                     {"family": "c", "metric": "mean_margin"}]})
    assert ok.proxies[0].direction == "lower"
