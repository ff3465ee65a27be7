"""Comparators. Each returns a structured report (never a bare boolean).

* :func:`compare_accuracy` — WS1 §4.1: ``abs(c - r) <= atol + rtol * abs(r)``, both sides upcast to
  FP32, the reference on the right. Non-finite values follow docs/pitfalls.md P7: NaN never passes (NaN vs
  NaN fails), equal infinities pass, an infinity against anything else fails.
* :func:`compare_relative` — the relative criterion (docs/decisions.md 11): candidate max error <= k x
  the ``torch_bf16`` max error against the same FP32 reference.
* :func:`gradient_norm_metrics` — rel-peak and RMS ratio (docs/decisions.md 12).
* :func:`compare_bitwise` — WS1 §4.2: dtype, shape, device (and strides on request) first, then
  raw bits on an integer view; +0 and -0 differ; NaN handled by the contract's ``nan_policy``.
* :func:`chain_metrics` — WS1 §8: ``dlogp = lhs - rhs`` (lhs = training-style teacher forcing,
  rhs = inference-style rollout decode).

Reports are dataclasses on one base, :class:`Report` (``passed``, ``summary()``, ``as_dict()`` for
evidence); each names its path, e.g. ``rms_norm.bwd.dx`` or ``rope.fwd.batch:row 0 alone: output 0``. Thresholds always come from the contract,
handed in as values (:class:`~rl_engine.contract.Tolerance`, ``GradNormThresholds``,
``ChainThresholds``, the NaN policy): a comparator never sees the whole contract.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rl_engine.contract import ChainThresholds, GradNormThresholds, Tolerance

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}
_HIST_EDGES = [10.0**e for e in range(-12, 3)]  # decades 1e-12 .. 1e2
REL_DENOMINATOR_FLOOR = 1e-12
"""Denominator floor of the reported relative error (WS1 §4.1: an observation, not a verdict)."""


class Report:
    """The one base of every comparator's report: ``passed`` (the verdict), ``summary()`` (one line
    for people, naming the path such as ``rms_norm.bwd.dx`` and the first problem) and ``as_dict()``
    (the evidence record, every field). Subclasses are dataclasses."""

    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        raise NotImplementedError


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size if size else 0)
        flat_index //= size if size else 1
    return list(reversed(idx))


def _fmt_index(path: str, idx: list[int]) -> str:
    return f"{path}[{', '.join(str(i) for i in idx)}]"


def _quantiles(x: torch.Tensor, qs: tuple[float, ...]) -> list[float]:
    """Exact order statistics (nearest-rank) of a flat float tensor, one per ``q``, from one sort.

    A full sort, not ``torch.kthvalue``: on CUDA ``kthvalue`` selects within one thread block per
    slice, which takes seconds on the ~6e8 elements of a ``[V, E]`` gradient; the sort uses the
    whole GPU. NaN sorts last, as the largest value.
    """
    n = x.numel()
    if n == 0:
        return [0.0 for _ in qs]
    flat = x.reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64):  # keep FP64 statistics (chain dlogp) exact
        flat = flat.float()
    ordered = torch.sort(flat).values
    return [float(ordered[min(n, max(1, math.ceil(q * n))) - 1]) for q in qs]


def _quantile(x: torch.Tensor, q: float) -> float:
    """Exact order statistic (nearest-rank) of a flat float tensor; works for any size."""
    return _quantiles(x, (q,))[0]


def error_histogram(abs_err: torch.Tensor) -> dict[str, Any]:
    """Counts of absolute errors per decade (for the report's histogram and CDF): bin 0 holds the
    exact zeros, bin ``i`` the errors in ``(edges[i-2], edges[i-1]]``, the last one those above the
    last edge. One :func:`torch.bucketize` pass."""
    flat = abs_err.reshape(-1).float()
    edges = torch.tensor([0.0, *_HIST_EDGES], dtype=flat.dtype, device=flat.device)
    # right=False: bucket i means edges[i-1] < x <= edges[i]; 0 -> bucket 0
    counts = torch.bincount(torch.bucketize(flat, edges), minlength=len(_HIST_EDGES) + 2)
    return {"edges": _HIST_EDGES, "counts": [int(c) for c in counts.tolist()],
            "bins": ["==0"] + [f"<={e:g}" for e in _HIST_EDGES] + [f">{_HIST_EDGES[-1]:g}"]}


_ULP_EDGES = [2.0**e for e in range(-4, 25)]  # 1/16 ulp .. 2^24 ulp


def ulp_of(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each value of ``reference`` (FP32 in, FP32 out): for ``|r|`` in
    ``[2^(e-1), 2^e)`` it is ``eps * 2^(e-1)``, and the subnormal spacing ``tiny * eps`` below the
    smallest normal (and at 0). Non-finite references get NaN."""
    fi = torch.finfo(dtype)
    r = reference.float()
    _, e = torch.frexp(r.abs())
    ulp = torch.ldexp(torch.full_like(r, fi.eps), (e - 1).to(torch.int32))
    ulp = torch.where(r.abs() < fi.tiny, torch.full_like(r, fi.tiny * fi.eps), ulp)
    return torch.where(torch.isfinite(r), ulp, torch.full_like(r, math.nan))


def ulp_histogram(abs_err: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> dict[str, Any]:
    """Counts of ``|candidate - reference|`` in units of ``dtype``'s ulp at the reference value, in
    power-of-two bins (bin 0: exact; bin ``i``: ``(edges[i-2], edges[i-1]]``; last: above the last
    edge, non-finite errors included). One :func:`torch.bucketize` pass."""
    units = abs_err.reshape(-1).float() / ulp_of(reference.reshape(-1), dtype)
    units = torch.where(torch.isfinite(units), units, torch.full_like(units, math.inf))
    edges = torch.tensor([0.0, *_ULP_EDGES], dtype=units.dtype, device=units.device)
    counts = torch.bincount(torch.bucketize(units, edges), minlength=len(_ULP_EDGES) + 2)
    return {"unit": f"ulp of {str(dtype).replace('torch.', '')} at the reference value", "edges": _ULP_EDGES,
            "counts": [int(c) for c in counts.tolist()]}


@dataclass
class AccuracyReport(Report):
    path: str
    passed: bool
    atol: float
    rtol: float
    threshold_source: str
    shape: list[int]
    candidate_dtype: str
    reference_dtype: str
    numel: int
    mismatches: int
    nonfinite_mismatches: int
    max_abs_error: float
    mean_abs_error: float
    p99_abs_error: float
    p999_abs_error: float
    max_rel_error: float
    mean_rel_error: float
    p99_rel_error: float
    p999_rel_error: float
    max_abs_reference: float
    worst_index: str | None
    worst_candidate: float | None
    worst_reference: float | None
    histogram: dict[str, Any] = field(default_factory=dict)
    ulp_histogram: dict[str, Any] = field(default_factory=dict)
    """The errors in ulps of the candidate's dtype (see :func:`ulp_histogram`)."""
    problem: str | None = None

    def summary(self) -> str:
        if self.problem:
            return f"{self.path}: {self.problem}"
        verdict = "ok" if self.passed else "FAIL"
        s = (f"{self.path}: {verdict} max_abs={self.max_abs_error:.3e} (atol {self.atol:g}, rtol {self.rtol:g}), "
             f"{self.mismatches}/{self.numel} outside")
        if self.nonfinite_mismatches:
            s += f" ({self.nonfinite_mismatches} of them non-finite: NaN, or an infinity against another value)"
        if self.worst_index is not None and not self.passed:
            s += f"; worst {self.worst_index}: candidate {self.worst_candidate!r} vs reference {self.worst_reference!r}"
        return s


def _attribute_problem(path, candidate, reference) -> str | None:
    if tuple(candidate.shape) != tuple(reference.shape):
        return f"shape mismatch: candidate {list(candidate.shape)} vs reference {list(reference.shape)}"
    if not candidate.is_floating_point() or not reference.is_floating_point():
        return f"non-floating tensors: candidate {candidate.dtype}, reference {reference.dtype}"
    return None


def compare_accuracy(path: str, candidate: torch.Tensor, reference: torch.Tensor, tol: Tolerance) -> AccuracyReport:
    """Element-wise accuracy check of WS1 §4.1 with a full error report.

    ``candidate`` (any float dtype) and ``reference`` (FP32) are upcast to FP32. The verdict is the
    ``atol/rtol`` rule; the error statistics are observations.
    """
    problem = _attribute_problem(path, candidate, reference)
    base = dict(path=path, atol=tol.atol, rtol=tol.rtol, threshold_source=tol.source,
                shape=list(candidate.shape), candidate_dtype=str(candidate.dtype).replace("torch.", ""),
                reference_dtype=str(reference.dtype).replace("torch.", ""))
    if problem is not None:
        return AccuracyReport(passed=False, numel=candidate.numel(), mismatches=candidate.numel(),
                              nonfinite_mismatches=0, max_abs_error=math.inf, mean_abs_error=math.inf,
                              p99_abs_error=math.inf, p999_abs_error=math.inf, max_rel_error=math.inf,
                              mean_rel_error=math.inf, p99_rel_error=math.inf, p999_rel_error=math.inf,
                              max_abs_reference=math.nan, worst_index=None, worst_candidate=None,
                              worst_reference=None, problem=problem, **base)
    c = candidate.detach().to(torch.float32)
    r = reference.detach().to(torch.float32).to(c.device)
    finite = torch.isfinite(c) & torch.isfinite(r)
    same_inf = torch.isinf(c) & torch.isinf(r) & (c == r)
    diff = torch.where(finite, (c - r).abs(), torch.zeros_like(c))
    ok_finite = finite & (diff <= tol.atol + tol.rtol * r.abs())
    ok = ok_finite | same_inf
    bad = ~ok
    nonfinite_bad = bad & ~finite
    # error used for statistics: finite pairs as is; a non-finite mismatch counts as NaN when either
    # side is NaN (so a NaN output is reported as NaN, not as a large error) and as +inf otherwise
    either_nan = torch.isnan(c) | torch.isnan(r)
    abs_err = torch.where(nonfinite_bad, torch.where(either_nan, torch.full_like(diff, math.nan),
                                                     torch.full_like(diff, math.inf)), diff)
    rel_err = abs_err / r.abs().clamp_min(REL_DENOMINATOR_FLOOR)
    rel_err = torch.where(same_inf, torch.zeros_like(rel_err), rel_err)
    n = c.numel()
    mismatches = int(bad.sum())
    if n:
        # the worst element: a failing one with the largest excess over its bound, else the largest error
        if mismatches:
            excess = torch.where(bad, abs_err - (tol.atol + tol.rtol * r.abs().nan_to_num(posinf=0.0)), torch.full_like(c, -math.inf))
            excess = torch.where(bad & torch.isnan(excess), torch.full_like(c, math.inf), excess)
            worst = int(torch.argmax(excess.nan_to_num(nan=math.inf)))
        else:
            worst = int(torch.argmax(abs_err))
        wi = _fmt_index(path, _index(worst, tuple(c.shape)))
        wc, wr = float(c.reshape(-1)[worst]), float(r.reshape(-1)[worst])
        finite_err = abs_err[torch.isfinite(abs_err)]
        finite_rel = rel_err[torch.isfinite(rel_err)]
        p_abs, p_rel = _quantiles(abs_err, (0.99, 0.999)), _quantiles(rel_err, (0.99, 0.999))
        stats = dict(
            max_abs_error=float(abs_err.max()), mean_abs_error=float(finite_err.mean()) if finite_err.numel() else math.inf,
            p99_abs_error=p_abs[0], p999_abs_error=p_abs[1],
            max_rel_error=float(rel_err.max()), mean_rel_error=float(finite_rel.mean()) if finite_rel.numel() else math.inf,
            p99_rel_error=p_rel[0], p999_rel_error=p_rel[1],
            max_abs_reference=float(r[torch.isfinite(r)].abs().max()) if bool(torch.isfinite(r).any()) else math.nan,
        )
    else:
        wi, wc, wr = None, None, None
        stats = dict(max_abs_error=0.0, mean_abs_error=0.0, p99_abs_error=0.0, p999_abs_error=0.0,
                     max_rel_error=0.0, mean_rel_error=0.0, p99_rel_error=0.0, p999_rel_error=0.0,
                     max_abs_reference=0.0)
    return AccuracyReport(passed=mismatches == 0, numel=n, mismatches=mismatches,
                          nonfinite_mismatches=int(nonfinite_bad.sum()), worst_index=wi, worst_candidate=wc,
                          worst_reference=wr, histogram=error_histogram(torch.where(torch.isfinite(abs_err), abs_err, torch.full_like(abs_err, 1e30))),
                          ulp_histogram=ulp_histogram(abs_err, r, candidate.dtype), **stats, **base)


@dataclass
class RelativeReport(Report):
    path: str
    passed: bool
    factor: float
    candidate_max_abs_error: float
    baseline_max_abs_error: float
    bound: float
    baseline: str

    def summary(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        return (f"{self.path}: relative {verdict}: candidate {self.candidate_max_abs_error:.3e} vs "
                f"{self.factor:g} x {self.baseline} {self.baseline_max_abs_error:.3e}")


def compare_relative(path: str, candidate_err: float, baseline_err: float, factor: float,
                     baseline: str = "torch_bf16") -> RelativeReport:
    """Relative criterion: ``candidate_err <= factor * baseline_err`` (both max abs errors vs FP32)."""
    bound = factor * baseline_err
    passed = bool(candidate_err <= bound) and math.isfinite(candidate_err)
    return RelativeReport(path, passed, factor, candidate_err, baseline_err, bound, baseline)


@dataclass
class GradNormReport(Report):
    path: str
    passed: bool
    rel_peak: float
    rel_peak_threshold: float
    rms_ratio: float
    rms_ratio_threshold: float

    def summary(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        return (f"{self.path}: grad-norm {verdict}: rel_peak {self.rel_peak:.3e} (<= {self.rel_peak_threshold:g}), "
                f"rms_ratio {self.rms_ratio:.3e} (<= {self.rms_ratio_threshold:g})")


def gradient_norm_metrics(path: str, candidate: torch.Tensor, reference: torch.Tensor,
                          thresholds: GradNormThresholds) -> GradNormReport:
    """rel-peak = max|c - r| / max|r|; RMS ratio = rms(c - r) / rms(r). A zero reference with a
    zero error gives 0; a zero reference with any error gives inf. Each RMS is taken of the tensor
    divided by its peak, so the squares of tiny gradients (below ~1e-19) do not underflow to 0."""
    c = candidate.detach().float()
    r = reference.detach().float().to(c.device)
    err = (c - r).abs()

    def _rms(x: torch.Tensor, peak: float) -> float:
        return 0.0 if peak == 0 else peak * float((x / peak).pow(2).mean().sqrt())

    if c.numel() == 0:
        rel_peak = rms_ratio = 0.0
    else:
        peak_err, peak_ref = float(err.max()), float(r.abs().max())
        rms_err, rms_ref = _rms(err, peak_err), _rms(r, peak_ref)
        rel_peak = 0.0 if peak_err == 0 else (peak_err / peak_ref if peak_ref > 0 else math.inf)
        rms_ratio = 0.0 if rms_err == 0 else (rms_err / rms_ref if rms_ref > 0 else math.inf)
    tp, tr = thresholds.rel_peak, thresholds.rms_ratio
    passed = (rel_peak <= tp) and (rms_ratio <= tr) and math.isfinite(rel_peak) and math.isfinite(rms_ratio)
    return GradNormReport(path, bool(passed), rel_peak, tp, rms_ratio, tr)


@dataclass
class BitwiseReport(Report):
    path: str
    passed: bool
    nan_policy: str
    shape_canonical: list[int]
    shape_transformed: list[int]
    dtype_canonical: str
    dtype_transformed: str
    numel: int
    differing: int
    first_index: str | None = None
    first_bits: tuple[str, str] | None = None
    worst_index: str | None = None
    worst_bits: tuple[str, str] | None = None
    worst_values: tuple[float, float] | None = None
    problem: str | None = None

    def summary(self) -> str:
        if self.problem:
            return f"{self.path}: {self.problem}"
        if self.passed:
            return f"{self.path}: bitwise equal ({self.numel} elements, nan_policy {self.nan_policy})"
        return (f"{self.path}: {self.differing}/{self.numel} differ; first {self.first_index} "
                f"{self.first_bits[0]} vs {self.first_bits[1]}; worst {self.worst_index} "
                f"{self.worst_bits[0]} vs {self.worst_bits[1]}")


def _hex(v: int, width: int) -> str:
    return f"0x{v & ((1 << width) - 1):0{width // 4}X}"


def compare_bitwise(path: str, canonical: torch.Tensor, transformed: torch.Tensor, nan_policy: str, *,
                    check_device: bool = True, check_stride: bool = False) -> BitwiseReport:
    """Raw-bit comparison (WS1 §4.2). ``nan_policy``:

    * ``canonical_equal`` — NaN equals NaN of the same sign whatever the payload;
    * ``bitwise_equal`` — NaNs compare by their bits like everything else;
    * ``always_differ`` — a NaN never equals anything.

    Checked first, each a failing report with its ``problem`` (as ``torch.testing.assert_close``
    checks them): dtype, shape, device (``check_device``; off where one side legitimately comes
    from elsewhere, e.g. a fresh process's outputs read back on the host) and strides
    (``check_stride``, off by default: a transform may lay out its output differently).
    """
    base = dict(path=path, nan_policy=nan_policy, shape_canonical=list(canonical.shape),
                shape_transformed=list(transformed.shape),
                dtype_canonical=str(canonical.dtype).replace("torch.", ""),
                dtype_transformed=str(transformed.dtype).replace("torch.", ""))
    if canonical.dtype != transformed.dtype:
        return BitwiseReport(passed=False, numel=canonical.numel(), differing=canonical.numel(),
                             problem=f"dtype differs: {base['dtype_canonical']} vs {base['dtype_transformed']}", **base)
    if tuple(canonical.shape) != tuple(transformed.shape):
        return BitwiseReport(passed=False, numel=canonical.numel(), differing=canonical.numel(),
                             problem=f"shape differs: {list(canonical.shape)} vs {list(transformed.shape)}", **base)
    if check_device and canonical.device != transformed.device:
        return BitwiseReport(passed=False, numel=canonical.numel(), differing=canonical.numel(),
                             problem=f"device differs: {canonical.device} vs {transformed.device}", **base)
    if check_stride and canonical.stride() != transformed.stride():
        return BitwiseReport(passed=False, numel=canonical.numel(), differing=canonical.numel(),
                             problem=f"strides differ: {list(canonical.stride())} vs {list(transformed.stride())}",
                             **base)
    if nan_policy not in ("canonical_equal", "bitwise_equal", "always_differ"):
        raise ValueError(f"unknown nan_policy {nan_policy!r}")
    a = canonical.detach().contiguous()
    b = transformed.detach().to(a.device).contiguous()
    if a.is_floating_point():
        iv = _INT_VIEW[a.dtype]
        ai, bi = a.view(iv).reshape(-1), b.view(iv).reshape(-1)
        width = torch.finfo(a.dtype).bits
        diff = ai != bi
        an, bn = torch.isnan(a).reshape(-1), torch.isnan(b).reshape(-1)
        if nan_policy == "canonical_equal":
            same_sign = (ai < 0) == (bi < 0)
            diff = torch.where(an & bn, ~same_sign, diff)
        elif nan_policy == "always_differ":
            diff = diff | an | bn
    else:
        ai, bi = a.reshape(-1), b.reshape(-1)
        width = a.element_size() * 8
        diff = ai != bi
    n = int(diff.numel())
    count = int(diff.sum())
    if count == 0:
        return BitwiseReport(passed=True, numel=n, differing=0, **base)
    first = int(torch.nonzero(diff)[0, 0])
    if a.is_floating_point():
        delta = (a.reshape(-1).double() - b.reshape(-1).double()).abs()
        delta = torch.where(diff, delta.nan_to_num(nan=math.inf), torch.full_like(delta, -1.0))
        worst = int(torch.argmax(delta))
        wv = (float(a.reshape(-1)[worst]), float(b.reshape(-1)[worst]))
    else:
        worst, wv = first, (float(ai[first]), float(bi[first]))
    shape = tuple(a.shape)
    return BitwiseReport(
        passed=False, numel=n, differing=count,
        first_index=_fmt_index(path, _index(first, shape)),
        first_bits=(_hex(int(ai[first]), width), _hex(int(bi[first]), width)),
        worst_index=_fmt_index(path, _index(worst, shape)),
        worst_bits=(_hex(int(ai[worst]), width), _hex(int(bi[worst]), width)),
        worst_values=wv, **base)


@dataclass
class ChainReport(Report):
    profile: str
    passed: bool
    active_tokens: int
    metrics: dict[str, dict[str, Any]]
    p99_abs_dlogp: float
    p999_abs_dlogp: float
    bitwise_equal_tokens: int
    first_nonzero_token: int | None
    clip_interval: tuple[float, float]
    roles: dict[str, str]

    def summary(self) -> str:
        parts = [f"{k}={v['value']:.3e}" for k, v in self.metrics.items()]
        verdict = "ok" if self.passed else "FAIL"
        return (f"chain[{self.profile}] {verdict}: {', '.join(parts)}; "
                f"{self.bitwise_equal_tokens}/{self.active_tokens} tokens bitwise equal")


def chain_metrics(lhs_logp: torch.Tensor, rhs_logp: torch.Tensor, thresholds: ChainThresholds) -> ChainReport:
    """WS1 §8 metrics of ``dlogp = lhs - rhs`` over the active tokens.

    lhs = training-style teacher forcing, rhs = inference-style rollout decode (the roles the
    contract fixes). Both are FP32 logprobs of the same tokens, flat ``[N]``.
    ``thresholds`` (``contract.chain_thresholds(profile)``) holds the profile's thresholds; the
    ``strict`` profile additionally requires dlogp == 0 (bitwise equal logprobs) for every token.
    """
    if tuple(lhs_logp.shape) != tuple(rhs_logp.shape):
        raise ValueError(f"lhs and rhs cover different tokens: shapes {list(lhs_logp.shape)} vs {list(rhs_logp.shape)}")
    lo, hi = thresholds.clip_interval
    lhs = lhs_logp.detach().reshape(-1).to(torch.float64).cpu()
    rhs = rhs_logp.detach().reshape(-1).to(torch.float64).cpu()
    d = lhs - rhs
    n = d.numel()
    absd = d.abs()
    ratio = torch.exp(d)
    values = {
        "max_abs_dlogp": float(absd.max()) if n else 0.0,
        "mean_abs_dlogp": float(absd.mean()) if n else 0.0,
        "approx_kl0": float((ratio - 1 - d).mean()) if n else 0.0,
        "clipfrac0": float(((ratio < lo) | (ratio > hi)).double().mean()) if n else 0.0,
    }
    metrics = {}
    for name, value in values.items():
        spec = thresholds.metric(name)
        ok = value <= float(spec["threshold"]) and math.isfinite(value)
        metrics[name] = {"value": value, "threshold": float(spec["threshold"]), "passed": bool(ok),
                         "decision": spec["decision"], "status": spec["status"]}
    lhs32 = lhs_logp.detach().reshape(-1).to(torch.float32).cpu().view(torch.int32)
    rhs32 = rhs_logp.detach().reshape(-1).to(torch.float32).cpu().view(torch.int32)
    equal = lhs32 == rhs32
    nz = torch.nonzero(~equal)
    passed = all(m["passed"] for m in metrics.values() if m["decision"] == "gate")
    if thresholds.dlogp_exactly_zero:
        metrics["strict_dlogp_zero"] = {"value": float(n - int(equal.sum())), "threshold": 0.0,
                                        "passed": bool(equal.all()), "decision": "gate", "status": "in_force"}
        passed = passed and bool(equal.all())
    roles = thresholds.roles
    return ChainReport(profile=thresholds.profile, passed=bool(passed), active_tokens=n, metrics=metrics,
                       **dict(zip(("p99_abs_dlogp", "p999_abs_dlogp"), _quantiles(absd, (0.99, 0.999)))),
                       bitwise_equal_tokens=int(equal.sum()),
                       first_nonzero_token=int(nz[0, 0]) if nz.numel() else None,
                       clip_interval=(lo, hi), roles=dict(roles))
