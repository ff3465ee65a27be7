"""The mismatch metrics (rl_engine.rl.metrics) against values written out by hand, and the zero case."""

from __future__ import annotations

import math

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.rl.metrics import (CHI2_LOG_RATIO_BOUND, DEBUG_NAMES, METRIC_NAMES, ROLLOUT_CORR_NAMES,
                                  mismatch_metrics, pad_rows, ratio_exactly_one)

NAN = float("nan")
# Two sequences: 2 active tokens (one padded position holding NaN, which must be ignored) and 3.
OLD = [[-1.0, -2.0, NAN], [-0.5, -1.5, -1.0]]
ROLL = [[-1.0, -2.5, NAN], [-0.5, -1.25, -1.0]]
MASK = [[True, True, False], [True, True, True]]
# float64 summation in another order than the module's: equal up to a few float64 ulps
SAME_F64 = dict(rel=2.0 ** -40)


def _case():
    return (torch.tensor(OLD, dtype=torch.float32), torch.tensor(ROLL, dtype=torch.float32),
            torch.tensor(MASK))


def _expected() -> dict[str, float]:
    """Every metric from its definition, in plain Python over the active tokens."""
    e = math.exp
    old = [[-1.0, -2.0], [-0.5, -1.5, -1.0]]
    roll = [[-1.0, -2.5], [-0.5, -1.25, -1.0]]
    # r = old - rollout: [[0, 0.5], [0, -0.25, 0]]
    mo = [sum(s) / len(s) for s in old]  # [-1.5, -1.0]
    mr = [sum(s) / len(s) for s in roll]  # [-1.75, -11/12]
    d = [b - a for a, b in zip(mo, mr)]  # [-0.25, 1/12]
    po = [e(x) for s in old for x in s]
    pr = [e(x) for s in roll for x in s]
    diff = [abs(a - b) for a, b in zip(pr, po)]
    mean_diff = sum(diff) / 5
    std_diff = math.sqrt(sum((x - mean_diff) ** 2 for x in diff) / 4)
    mx, my = sum(pr) / 5, sum(po) / 5
    cov = sum((a - mx) * (b - my) for a, b in zip(pr, po))
    pearson = cov / math.sqrt(sum((a - mx) ** 2 for a in pr) * sum((b - my) ** 2 for b in po))
    return {
        "rollout_corr/training_ppl": (e(1.5) + e(1.0)) / 2,
        "rollout_corr/training_log_ppl": 1.25,
        "rollout_corr/kl": -(0.5 - 0.25) / 5,
        "rollout_corr/k3_kl": ((e(0.5) - 0.5 - 1) + (e(-0.25) + 0.25 - 1)) / 5,
        "rollout_corr/rollout_ppl": (e(1.75) + e(11 / 12)) / 2,
        "rollout_corr/rollout_log_ppl": (1.75 + 11 / 12) / 2,
        "rollout_corr/log_ppl_diff": (-0.25 + 1 / 12) / 2,
        "rollout_corr/log_ppl_abs_diff": (0.25 + 1 / 12) / 2,
        "rollout_corr/log_ppl_diff_max": 1 / 12,
        "rollout_corr/log_ppl_diff_min": -0.25,
        "rollout_corr/ppl_ratio": (e(-0.25) + e(1 / 12)) / 2,
        "rollout_corr/chi2_token": (3 + e(1.0) + e(-0.5)) / 5 - 1,
        "rollout_corr/chi2_seq": (e(2 * 0.5) + e(2 * -0.25)) / 2 - 1,
        "training/rollout_probs_diff_max": max(diff),
        "training/rollout_probs_diff_mean": mean_diff,
        "training/rollout_probs_diff_std": std_diff,
        "training/rollout_actor_probs_pearson_corr": pearson,
        "max_abs_dlogp": 0.5,
        "ratio_min": e(-0.25),
        "ratio_max": e(0.5),
        "active_tokens": 5,
        "sequences": 2,
        "bitwise_equal_tokens": 3,
    }


def test_hand_computed_values():
    got = mismatch_metrics(*_case())
    want = _expected()
    assert list(got) == list(METRIC_NAMES)
    assert set(ROLLOUT_CORR_NAMES) | set(DEBUG_NAMES) <= set(got)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, **SAME_F64), name
    for name in ("active_tokens", "sequences", "bitwise_equal_tokens"):
        assert isinstance(got[name], int) and got[name] == want[name]
    assert got["rollout_corr/kl"] == pytest.approx(-0.05, **SAME_F64)
    assert not ratio_exactly_one(got)


def test_zero_mismatch_is_exactly_zero():
    """The same logprobs on both sides: every divergence 0 and the ratio exactly 1, not nearly."""
    old, _, mask = _case()
    got = mismatch_metrics(old, old.clone(), mask)
    for name in ("rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
                 "rollout_corr/log_ppl_diff", "rollout_corr/log_ppl_abs_diff", "rollout_corr/log_ppl_diff_max",
                 "rollout_corr/log_ppl_diff_min", "training/rollout_probs_diff_max",
                 "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std", "max_abs_dlogp"):
        assert got[name] == 0.0, name
    assert got["ratio_min"] == got["ratio_max"] == 1.0 and ratio_exactly_one(got)
    assert got["rollout_corr/ppl_ratio"] == 1.0
    assert got["rollout_corr/training_ppl"] == got["rollout_corr/rollout_ppl"]
    assert got["training/rollout_actor_probs_pearson_corr"] == 1.0
    assert got["bitwise_equal_tokens"] == got["active_tokens"] == 5


def test_one_ulp_is_not_a_ratio_of_one():
    """Negative control: one FP32 ulp on one token moves ratio_max off 1 and kl off 0."""
    old, _, mask = _case()
    roll = old.clone()
    roll[1, 1] = torch.nextafter(roll[1, 1], torch.tensor(0.0))
    got = mismatch_metrics(old, roll, mask)
    assert not ratio_exactly_one(got) and got["rollout_corr/kl"] != 0.0
    assert got["bitwise_equal_tokens"] == 4


def test_chi2_clamps_the_log_ratio():
    """A token with r = old - rollout = 100 enters chi2 as exp(2 * 20), as verl bounds it; k3 is not clamped."""
    old = torch.tensor([[0.0]])
    roll = torch.tensor([[-100.0]])
    got = mismatch_metrics(old, roll, torch.tensor([[True]]))
    b = CHI2_LOG_RATIO_BOUND
    assert got["rollout_corr/chi2_token"] == pytest.approx(math.exp(2 * b) - 1, **SAME_F64)
    assert got["rollout_corr/chi2_seq"] == pytest.approx(math.exp(2 * b) - 1, **SAME_F64)
    assert got["rollout_corr/k3_kl"] == pytest.approx(math.exp(100.0) - 101.0, **SAME_F64)
    # one token: no spread, no correlation
    assert math.isnan(got["training/rollout_probs_diff_std"])
    assert math.isnan(got["training/rollout_actor_probs_pearson_corr"])


def test_a_sequence_without_active_tokens_is_left_out():
    old, roll, mask = _case()
    old3 = torch.cat([old, torch.full((1, 3), -7.0)])
    roll3 = torch.cat([roll, torch.full((1, 3), -9.0)])
    mask3 = torch.cat([mask, torch.zeros((1, 3), dtype=torch.bool)])
    assert mismatch_metrics(old3, roll3, mask3) == mismatch_metrics(old, roll, mask)
    assert mismatch_metrics(old, roll, mask.to(torch.int64)) == mismatch_metrics(old, roll, mask)


@pytest.mark.parametrize("args,word", [
    ((torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool)), "shapes differ"),
    ((torch.zeros(6), torch.zeros(6), torch.ones(6, dtype=torch.bool)), "[B, C]"),
    ((torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)), "floating"),
    ((torch.zeros(2, 3), torch.zeros(2, 3), torch.full((2, 3), 2)), "0/1"),
    ((torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)), "no active token"),
])
def test_bad_input_is_refused(args, word):
    with pytest.raises(InputError) as exc:
        mismatch_metrics(*args)
    assert word in str(exc.value)


def test_pad_rows():
    vals, mask = pad_rows([torch.tensor([1.0, 2.0]), torch.tensor([3.0])])
    assert vals.tolist() == [[1.0, 2.0], [3.0, 0.0]] and mask.tolist() == [[True, True], [True, False]]
    assert vals.dtype == torch.float32
    with pytest.raises(InputError):
        pad_rows([])
