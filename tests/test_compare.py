"""Comparators of rl_engine.gate.compare against torch.testing.assert_close and the WS1 standard.

Thresholds come from the contract; perturbations are built as bit patterns (docs/pitfalls.md P7), never
as decimal offsets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rl_engine.contract import load_contract
from rl_engine.gate.compare import (
    chain_metrics,
    compare_accuracy,
    compare_bitwise,
    compare_relative,
    gradient_norm_metrics,
)

CONTRACT = load_contract()
ROWS = [CONTRACT.tolerance(d, cls, dt)
        for d in ("forward", "gradient")
        for cls in ("elementwise", "reduction", "logprob", "attention")
        for dt in ("float32", "bfloat16", "float16")]
FP32_MAX = float(torch.finfo(torch.float32).max)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------------
# bit-pattern helpers


def _s16(u: int) -> int:
    return u - 0x10000 if u >= 0x8000 else u


def bf16(*bits: int) -> torch.Tensor:
    """BF16 tensor from raw 16-bit patterns."""
    return torch.tensor([_s16(b) for b in bits], dtype=torch.int16).view(torch.bfloat16)


def fp32_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def next_up(t: torch.Tensor, index) -> torch.Tensor:
    """Copy of ``t`` (positive finite values at ``index``) with that element moved one ulp up."""
    out = t.clone()
    iv = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    out.view(iv)[index] += 1
    return out


def _assert_close_passes(candidate, reference, tol) -> bool:
    try:
        torch.testing.assert_close(candidate, reference, atol=tol.atol, rtol=tol.rtol, equal_nan=False,
                                   check_dtype=False)
    except AssertionError:
        return False
    return True


# ------------------------------------------------------------------------------------------------
# accuracy comparator == assert_close(equal_nan=False) on finite tensors

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def finite_pairs(draw):
    tol = draw(st.sampled_from(ROWS))
    n = draw(st.integers(1, 40))
    ref = draw(st.lists(finite32, min_size=n, max_size=n))
    cand = []
    for r in ref:
        kind = draw(st.sampled_from(["equal", "signed_zero", "near_bound", "ulps", "random"]))
        if kind == "equal":
            cand.append(r)
        elif kind == "signed_zero":
            cand.append(-0.0 if math.copysign(1.0, r) > 0 else 0.0)
        elif kind == "near_bound":
            # an error of k times the allowed bound: crosses the boundary for k around 1
            k = draw(st.floats(0.0, 3.0))
            sign = draw(st.sampled_from([-1.0, 1.0]))
            bound = tol.atol + tol.rtol * abs(r)
            v = r + sign * k * bound
            cand.append(v if math.isfinite(v) and abs(v) < FP32_MAX else r)
        elif kind == "ulps":
            steps = draw(st.integers(-4, 4))
            v = np.float32(r)
            with np.errstate(over="ignore"):
                for _ in range(abs(steps)):
                    v = np.nextafter(v, np.float32(np.inf if steps > 0 else -np.inf), dtype=np.float32)
            cand.append(float(v) if np.isfinite(v) else r)
        else:
            cand.append(draw(finite32))
    cdtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    c = torch.tensor(cand, dtype=torch.float32)
    c = c.to(cdtype)
    if not torch.isfinite(c).all():  # bfloat16 rounding of a huge float32 may overflow
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    return tol, c, torch.tensor(ref, dtype=torch.float32)


@SETTINGS
@given(finite_pairs())
def test_accuracy_agrees_with_assert_close_on_finite(data):
    tol, cand, ref = data
    rep = compare_accuracy("x", cand, ref, tol)
    event(f"passed={rep.passed}")
    assert rep.passed == _assert_close_passes(cand, ref, tol), rep.summary()
    close = torch.isclose(cand.float(), ref, atol=tol.atol, rtol=tol.rtol, equal_nan=False)
    assert rep.mismatches == int((~close).sum())
    assert rep.nonfinite_mismatches == 0
    assert rep.numel == ref.numel()
    assert rep.atol == tol.atol and rep.rtol == tol.rtol and rep.threshold_source == tol.source


@SETTINGS
@given(st.sampled_from(ROWS), st.integers(1, 16))
def test_signed_zeros_pass_accuracy_fail_bitwise(tol, n):
    pos = torch.zeros(n, dtype=torch.bfloat16)
    neg = bf16(*([0x8000] * n))
    assert _assert_close_passes(neg, pos.float(), tol)
    acc = compare_accuracy("x", neg, pos.float(), tol)
    assert acc.passed
    bit = compare_bitwise("x", pos, neg, CONTRACT.nan_policy)
    assert not bit.passed and bit.differing == n
    assert bit.first_bits == ("0x0000", "0x8000")


# ------------------------------------------------------------------------------------------------
# docs/pitfalls.md P7, exactly


def test_p7_bitwise():
    pol = CONTRACT.nan_policy
    assert pol == "canonical_equal"
    # +0 vs -0 -> different
    r = compare_bitwise("x", bf16(0x0000), bf16(0x8000), pol)
    assert not r.passed and r.first_bits == ("0x0000", "0x8000")
    # NaN vs the same NaN -> equal
    assert compare_bitwise("x", bf16(0x7FC0), bf16(0x7FC0), pol).passed
    # positive NaN vs negative NaN -> per policy (canonical_equal: a NaN of the other sign differs)
    r = compare_bitwise("x", bf16(0x7FC0), bf16(0xFFC0), pol)
    assert not r.passed and r.first_bits == ("0x7FC0", "0xFFC0")
    assert r.nan_policy == pol and r.as_dict()["nan_policy"] == pol
    # same sign, other payload -> equal under canonical_equal (the contract's nan_policy_meaning)
    assert compare_bitwise("x", bf16(0x7FC0), bf16(0x7FC1), pol).passed
    assert compare_bitwise("x", bf16(0xFFC0), bf16(0xFF81), pol).passed
    # NaN never equals a number
    assert not compare_bitwise("x", bf16(0x7FC0), bf16(0x7F80), pol).passed
    assert not compare_bitwise("x", bf16(0x7FC0), bf16(0x0000), pol).passed


def test_nan_policies_other_than_the_contract():
    assert not compare_bitwise("x", bf16(0x7FC0), bf16(0x7FC1), "bitwise_equal").passed
    assert compare_bitwise("x", bf16(0x7FC0), bf16(0x7FC0), "bitwise_equal").passed
    assert not compare_bitwise("x", bf16(0x7FC0), bf16(0x7FC0), "always_differ").passed
    assert compare_bitwise("x", bf16(0x3F80), bf16(0x3F80), "always_differ").passed
    with pytest.raises(ValueError, match="nan_policy"):
        compare_bitwise("x", bf16(0x3F80), bf16(0x3F80), "sometimes")


def test_p7_accuracy():
    tol = CONTRACT.tolerance("forward", "elementwise")
    pos_inf, neg_inf, max_finite = bf16(0x7F80), bf16(0xFF80), bf16(0x7F7F)  # 0x7F7F = 3.39e38
    cases = [
        (bf16(0x8000), bf16(0x0000), True),     # -0 vs +0
        (bf16(0x7FC0), bf16(0x7FC0), False),    # NaN vs NaN
        (bf16(0x7FC0), bf16(0x3F80), False),    # NaN vs 1
        (pos_inf, pos_inf, True),               # +inf vs +inf
        (neg_inf, neg_inf, True),
        (pos_inf, neg_inf, False),              # +inf vs -inf
        (pos_inf, max_finite, False),           # +inf vs 3.4e38
        (max_finite, pos_inf, False),
    ]
    for cand, ref, expected in cases:
        rep = compare_accuracy("x", cand, ref.float(), tol)
        assert rep.passed is expected, (cand.view(torch.int16), ref.view(torch.int16), rep.summary())
        # the standard's accuracy semantics are assert_close's with equal_nan=False
        assert _assert_close_passes(cand, ref.float(), tol) is expected
        if not expected:
            assert rep.mismatches == 1 and rep.nonfinite_mismatches == 1
            assert rep.worst_index == "x[0]"


def test_perturbation_must_be_a_bit_pattern():
    # the pitfall's reason: a decimal offset below half an ulp vanishes
    three = torch.tensor([3.0], dtype=torch.float32)
    up = next_up(three, 0)
    assert int(fp32_bits(up)[0]) - int(fp32_bits(three)[0]) == 1
    assert not compare_bitwise("x", three, up, CONTRACT.nan_policy).passed


# ------------------------------------------------------------------------------------------------
# report fields


def test_accuracy_report_fields():
    tol = CONTRACT.tolerance("forward", "reduction")
    ref = torch.ones(3, 4)
    cand = ref.clone()
    small = tol.atol + tol.rtol  # the allowed error where |ref| = 1
    cand[0, 1] = ref[0, 1] + small * 2
    cand[1, 2] = ref[1, 2] + small * 8       # the worst one
    cand[2, 3] = ref[2, 3] - small / 4       # inside the bound
    rep = compare_accuracy("x", cand, ref, tol)
    assert not rep.passed
    assert rep.mismatches == 2
    assert rep.worst_index == "x[1, 2]"
    assert rep.worst_candidate == float(cand[1, 2]) and rep.worst_reference == float(ref[1, 2])
    assert rep.max_abs_error == float((cand - ref).abs().max())
    assert rep.shape == [3, 4] and rep.candidate_dtype == "float32" and rep.reference_dtype == "float32"
    s = rep.summary()
    assert "FAIL" in s and "x[1, 2]" in s and "2/12" in s
    d = rep.as_dict()
    for k in ("p99_abs_error", "p999_abs_error", "p99_rel_error", "p999_rel_error", "histogram", "worst_index"):
        assert k in d
    assert sum(rep.histogram["counts"]) == 12


def _nearest_rank(values: np.ndarray, num: int, den: int) -> float:
    """The ceil(q n)-th smallest value, q = num/den computed exactly."""
    n = values.size
    k = max(1, -(-num * n // den))
    return float(np.sort(values.reshape(-1))[k - 1])


@pytest.mark.parametrize("n", [1, 7, 1000, 1234])
def test_percentiles_are_nearest_rank(n):
    tol = CONTRACT.tolerance("forward", "elementwise")
    g = torch.Generator().manual_seed(n)
    ref = torch.randn(n, generator=g)
    cand = ref + torch.randn(n, generator=g) * tol.atol
    rep = compare_accuracy("x", cand, ref, tol)
    err = (cand - ref).abs().numpy()
    assert rep.p99_abs_error == _nearest_rank(err, 99, 100)
    assert rep.p999_abs_error == _nearest_rank(err, 999, 1000)
    assert rep.p99_abs_error <= rep.p999_abs_error <= rep.max_abs_error


def test_accuracy_shape_and_type_problems():
    tol = CONTRACT.tolerance("forward", "elementwise")
    rep = compare_accuracy("x", torch.zeros(2, 3), torch.zeros(3, 2), tol)
    assert not rep.passed and "shape mismatch" in rep.problem and "[2, 3]" in rep.problem
    rep = compare_accuracy("x", torch.zeros(3, dtype=torch.int64), torch.zeros(3), tol)
    assert not rep.passed and "non-floating" in rep.problem


def test_accuracy_empty_tensor_passes():
    tol = CONTRACT.tolerance("forward", "elementwise")
    rep = compare_accuracy("x", torch.zeros(0, 5), torch.zeros(0, 5), tol)
    assert rep.passed and rep.numel == 0 and rep.worst_index is None


def test_bitwise_report_fields():
    a = torch.linspace(1, 2, 12).to(torch.bfloat16).reshape(3, 4)
    b = next_up(a, (0, 1))                       # first difference: one ulp
    b.view(torch.int16)[2, 3] += 64              # worst difference: 64 ulps
    rep = compare_bitwise("y", a, b, CONTRACT.nan_policy)
    assert not rep.passed and rep.differing == 2 and rep.numel == 12
    assert rep.first_index == "y[0, 1]"
    assert rep.worst_index == "y[2, 3]"
    ai, bi = a.view(torch.int16), b.view(torch.int16)
    assert rep.first_bits == (f"0x{int(ai[0, 1]) & 0xFFFF:04X}", f"0x{int(bi[0, 1]) & 0xFFFF:04X}")
    assert rep.worst_bits == (f"0x{int(ai[2, 3]) & 0xFFFF:04X}", f"0x{int(bi[2, 3]) & 0xFFFF:04X}")
    assert rep.worst_values == (float(a[2, 3]), float(b[2, 3]))
    s = rep.summary()
    assert "y[0, 1]" in s and "y[2, 3]" in s and rep.first_bits[0] in s and "2/12" in s


def test_bitwise_fp32_hex_width():
    a = torch.tensor([1.0, 2.0])
    b = next_up(a, 1)
    rep = compare_bitwise("z", a, b, CONTRACT.nan_policy)
    assert rep.first_index == "z[1]"
    assert rep.first_bits == ("0x40000000", "0x40000001")


def test_bitwise_shape_dtype_and_integers():
    a = torch.zeros(2, 3, dtype=torch.bfloat16)
    rep = compare_bitwise("x", a, torch.zeros(3, 2, dtype=torch.bfloat16), CONTRACT.nan_policy)
    assert not rep.passed and "shape differs" in rep.problem
    rep = compare_bitwise("x", a, a.float(), CONTRACT.nan_policy)
    assert not rep.passed and "dtype differs" in rep.problem
    ids = torch.arange(6).reshape(2, 3)
    other = ids.clone()
    other[1, 0] += 1
    rep = compare_bitwise("ids", ids, other, CONTRACT.nan_policy)
    assert not rep.passed and rep.first_index == "ids[1, 0]"
    assert compare_bitwise("ids", ids, ids.clone(), CONTRACT.nan_policy).passed


@SETTINGS
@given(st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=32))
def test_bitwise_equal_iff_same_bits_modulo_nan_policy(bits):
    a = bf16(*bits)
    assert compare_bitwise("x", a, a.clone(), CONTRACT.nan_policy).passed
    flipped = a.clone()
    flipped.view(torch.int16)[0] ^= 1  # lowest mantissa bit
    r = compare_bitwise("x", a, flipped, CONTRACT.nan_policy)
    both_nan = bool(torch.isnan(a[0])) and bool(torch.isnan(flipped[0]))
    assert r.passed is both_nan  # only a same-sign NaN payload change is equal under canonical_equal


# ------------------------------------------------------------------------------------------------
# relative criterion and gradient normalisation


def test_relative_criterion():
    k = CONTRACT.relative_factor("forward")
    base = 2.0 ** -6
    assert compare_relative("x", k * base, base, k).passed
    assert not compare_relative("x", math.nextafter(k * base, math.inf), base, k).passed
    assert not compare_relative("x", math.inf, base, k).passed
    assert not compare_relative("x", math.nan, base, k).passed
    assert compare_relative("x", 0.0, 0.0, k).passed
    assert not compare_relative("x", math.nextafter(0.0, 1.0), 0.0, k).passed
    assert CONTRACT.relative_factor("gradient") != k
    rep = compare_relative("x", base, base, k)
    assert rep.bound == k * base and rep.baseline == "torch_bf16"


def test_gradient_norm_metrics():
    cls = "elementwise"
    tp = CONTRACT.grad_norm_threshold("rel_peak", cls)
    tr = CONTRACT.grad_norm_threshold("rms_ratio", cls)
    thr = CONTRACT.grad_norm_thresholds(cls)  # the comparator gets the thresholds, not the contract
    assert (thr.rel_peak, thr.rms_ratio) == (tp, tr)
    zero = torch.zeros(4, 5)
    rep = gradient_norm_metrics("g", zero, zero, thr)
    assert rep.passed and rep.rel_peak == 0.0 and rep.rms_ratio == 0.0
    for bits in (1, 0x3A800000):  # the smallest subnormal, and 2^-10
        err = zero.clone()
        err.view(torch.int32)[1, 1] = bits
        rep = gradient_norm_metrics("g", err, zero, thr)
        assert not rep.passed and math.isinf(rep.rel_peak) and math.isinf(rep.rms_ratio)
    # uniform relative error e gives rel_peak == rms_ratio == e (up to FP32 rounding)
    ref = torch.ones(64)
    lo = min(tp, tr) / 2
    rep_lo = gradient_norm_metrics("g", ref * (1 + lo), ref, thr)
    assert rep_lo.passed
    assert rep_lo.rel_peak == pytest.approx(lo, rel=2.0 ** -16) and rep_lo.rms_ratio == pytest.approx(lo, rel=2.0 ** -16)
    hi = max(tp, tr) * 2
    rep = gradient_norm_metrics("g", ref * (1 + hi), ref, thr)
    assert not rep.passed
    assert rep.rel_peak_threshold == tp and rep.rms_ratio_threshold == tr
    # scale invariance: tiny and huge gradients (squares under/overflow FP32) give the same metrics
    for exp in (-100, -80, 60):
        scale = 2.0 ** exp
        tiny = gradient_norm_metrics("g", ref * (1 + lo) * scale, ref * scale, thr)
        assert (tiny.passed, tiny.rel_peak, tiny.rms_ratio) == (rep_lo.passed, rep_lo.rel_peak, rep_lo.rms_ratio)
        wrong = gradient_norm_metrics("g", torch.zeros_like(ref), ref * scale, thr)
        assert not wrong.passed and wrong.rel_peak == 1.0 and wrong.rms_ratio == 1.0
    # only the RMS ratio fails: error between the two thresholds
    mid = (tr + tp) / 2 if tr < tp else None
    if mid is not None:
        rep = gradient_norm_metrics("g", ref * (1 + mid), ref, thr)
        assert not rep.passed and rep.rel_peak <= tp and rep.rms_ratio > tr


# ------------------------------------------------------------------------------------------------
# chain metrics


def test_dlogp_is_lhs_minus_rhs():
    rhs = torch.zeros(4, dtype=torch.float64)
    d = 2.0 ** -4
    lhs = rhs + d
    rep = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds())
    want = math.exp(d) - 1 - d
    flipped = math.exp(-d) - 1 + d
    assert want != flipped
    assert rep.metrics["approx_kl0"]["value"] == pytest.approx(want, rel=2.0 ** -40)
    rep2 = chain_metrics(rhs, lhs, CONTRACT.chain_thresholds())
    assert rep2.metrics["approx_kl0"]["value"] == pytest.approx(flipped, rel=2.0 ** -40)
    assert rep.metrics["max_abs_dlogp"]["value"] == d and rep.metrics["mean_abs_dlogp"]["value"] == d
    assert rep.roles == CONTRACT.data["chain"]["roles"]["train_infer_logprob_parity"]


def test_approx_kl0_formula():
    g = torch.Generator().manual_seed(1)
    lhs = -torch.rand(50, generator=g, dtype=torch.float64) * 5
    rhs = lhs + torch.randn(50, generator=g, dtype=torch.float64) * 2.0 ** -7
    d = (lhs - rhs).numpy()
    rep = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds())
    assert rep.metrics["approx_kl0"]["value"] == pytest.approx(float(np.mean(np.exp(d) - 1 - d)), rel=2.0 ** -30)
    assert rep.metrics["max_abs_dlogp"]["value"] == float(np.abs(d).max())
    assert rep.metrics["mean_abs_dlogp"]["value"] == pytest.approx(float(np.abs(d).mean()), rel=2.0 ** -40)
    absd = np.abs(d)
    assert rep.p99_abs_dlogp == _nearest_rank(absd, 99, 100)
    assert rep.p999_abs_dlogp == _nearest_rank(absd, 999, 1000)
    for name, m in rep.metrics.items():
        assert m["threshold"] == CONTRACT.chain_metric(name)["threshold"]
        assert m["passed"] == (m["value"] <= m["threshold"])


def _step(x: float, toward: float, n: int) -> float:
    for _ in range(n):
        x = math.nextafter(x, toward)
    return x


@pytest.mark.parametrize("edge", ["lo", "hi"])
def test_clipfrac0_uses_the_contract_interval(edge):
    lo, hi = CONTRACT.clip_interval
    bound = lo if edge == "lo" else hi
    ln = math.log(bound)
    # a few float64 ulps inside / outside ln(bound) (exp is accurate to about one ulp)
    inside = _step(ln, 0.0, 8)
    outside = _step(ln, -math.inf if edge == "lo" else math.inf, 8)
    ratio_in = float(torch.exp(torch.tensor(inside, dtype=torch.float64)))
    ratio_out = float(torch.exp(torch.tensor(outside, dtype=torch.float64)))
    assert lo <= ratio_in <= hi and not (lo <= ratio_out <= hi)
    n = 8
    rhs = torch.zeros(n, dtype=torch.float64)
    lhs = rhs.clone()
    lhs[3] = rhs[3] + inside
    assert float(lhs[3] - rhs[3]) == inside
    rep = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds())
    assert rep.metrics["clipfrac0"]["value"] == 0.0 and rep.metrics["clipfrac0"]["passed"]
    assert rep.clip_interval == (lo, hi)
    lhs[3] = rhs[3] + outside
    assert float(lhs[3] - rhs[3]) == outside
    rep = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds())
    assert rep.metrics["clipfrac0"]["value"] == 1 / n
    assert not rep.metrics["clipfrac0"]["passed"] and not rep.passed


def test_strict_profile_fails_on_one_ulp_and_names_the_first_token():
    g = torch.Generator().manual_seed(2)
    lhs = -torch.rand(16, generator=g)  # FP32 logprobs
    rhs = next_up(lhs.abs(), 5).neg()   # one ulp of magnitude at token 5
    rhs = next_up(rhs.abs(), 11).neg()  # and at token 11
    assert int((fp32_bits(lhs) != fp32_bits(rhs)).sum()) == 2
    ws1 = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds("ws1"))
    assert ws1.passed and ws1.first_nonzero_token == 5 and ws1.bitwise_equal_tokens == 14
    strict = chain_metrics(lhs, rhs, CONTRACT.chain_thresholds("strict"))
    assert not strict.passed
    assert strict.first_nonzero_token == 5
    assert strict.metrics["strict_dlogp_zero"]["value"] == 2 and not strict.metrics["strict_dlogp_zero"]["passed"]
    assert chain_metrics(lhs, lhs.clone(), CONTRACT.chain_thresholds("strict")).passed


def test_chain_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shapes"):
        chain_metrics(torch.zeros(4), torch.zeros(5), CONTRACT.chain_thresholds())


def test_chain_unknown_profile_raises():  # the thresholds of a profile the contract lacks
    from rl_engine.errors import ContractError

    with pytest.raises(ContractError, match="lenient"):
        CONTRACT.chain_thresholds("lenient")


def test_histograms_put_each_error_in_its_bin():
    from rl_engine.gate.compare import _HIST_EDGES, _ULP_EDGES, error_histogram, ulp_histogram, ulp_of

    # the decade histogram: bin 0 exact, bin i (i >= 1) holds (edges[i-2], edges[i-1]]
    err = torch.tensor([0.0, _HIST_EDGES[3], _HIST_EDGES[3] * 1.5, 1e30])
    counts = error_histogram(err)["counts"]
    assert counts[0] == 1 and counts[4] == 1 and counts[5] == 1 and counts[-1] == 1 and sum(counts) == 4
    # one BF16 step above 1.0, 1.5 steps above 3.0 (spacing 2^-6 there), and an exact value
    ref = torch.tensor([1.0, 3.0, 0.5])
    step1, step3 = float(ulp_of(ref, torch.bfloat16)[0]), float(ulp_of(ref, torch.bfloat16)[1])
    assert step1 == 2.0 ** -7 and step3 == 2.0 ** -6
    h = ulp_histogram(torch.tensor([step1, 1.5 * step3, 0.0]), ref, torch.bfloat16)
    one, two = _ULP_EDGES.index(1.0) + 1, _ULP_EDGES.index(2.0) + 1
    assert h["counts"][0] == 1 and h["counts"][one] == 1 and h["counts"][two] == 1 and sum(h["counts"]) == 3


def test_accuracy_report_records_ulp_histogram():
    ref = torch.tensor([1.0, 2.0, 4.0])
    cand = ref.to(torch.bfloat16)
    cand.view(torch.int16)[0] ^= 1  # one ulp off
    rep = compare_accuracy("t", cand, ref, CONTRACT.tolerance("forward", "elementwise", "bfloat16"))
    assert rep.ulp_histogram["counts"][0] == 2 and sum(rep.ulp_histogram["counts"]) == 3
    assert "bfloat16" in rep.ulp_histogram["unit"]


def test_every_report_shares_one_base():
    from rl_engine.gate import compare as cmp

    for cls in (cmp.AccuracyReport, cmp.RelativeReport, cmp.GradNormReport, cmp.BitwiseReport, cmp.ChainReport):
        assert issubclass(cls, cmp.Report) and cls.as_dict is cmp.Report.as_dict


def test_bitwise_checks_device_and_optionally_strides():
    """Same values on another device, or with other strides when asked, is a problem the report
    names (the ``meta`` device stands in for a second device: no GPU needed); unasked, the same bits
    in another layout pass."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    moved = compare_bitwise("x", a, torch.empty_like(a, device="meta"), "canonical_equal")
    assert not moved.passed and "device differs: cpu vs meta" in moved.summary()
    t = a.t().contiguous().t()  # same values, column-major
    assert compare_bitwise("x", a, t, "canonical_equal").passed
    strided = compare_bitwise("x", a, t, "canonical_equal", check_stride=True)
    assert not strided.passed and "strides differ: [3, 1] vs [1, 2]" in strided.summary()
