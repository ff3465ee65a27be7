"""Checks shared by the op tests (``tests/ops/test_<op>.py``).

Import them as ``from _helpers import ...``: pytest (default ``prepend`` import mode, no
``__init__.py`` in ``tests/``) puts this folder on ``sys.path`` when it collects a test file here.

Every threshold comes from the contract (``contract.tolerance`` / ``contract.relative_factor``);
there is no tolerance literal in this module. The helpers assert; the ones that run an op also
return what they computed, so a test can add its own checks on the same tensors.

Bitwise comparisons go through the gate's comparator, :func:`rl_engine.gate.compare.compare_bitwise`:

* :func:`bits_equal` and :func:`differing` (equality that a test requires) use raw bits with the
  ``bitwise_equal`` NaN rule: shape, dtype, then every bit (+0 != -0, two NaNs are equal only when
  their bits are). That is the strictest of the rules, stricter than the contract's
  ``canonical_equal`` (which lets two NaNs of one sign with different payloads pass).
* :func:`control_caught` (a negative control must be seen) uses the contract's ``nan_policy``,
  exactly as the gate judges a control: a difference the gate would not see does not count. Every
  difference under ``canonical_equal`` is one under raw bits too, so this is never weaker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pytest
import torch

from rl_engine.contract import Contract, Tolerance, load_contract
from rl_engine.gate.compare import compare_bitwise
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.spec import WORKLOADS, Case, OpSpec
from rl_engine.ops.transforms import Pair

SMOKE = WORKLOADS["smoke"]
KERNEL = "triton_cuda_bf16"
"""The implementation under test."""
RAW_BITS = "bitwise_equal"
"""NaN rule of :func:`bits_equal`: NaNs compare by their bits like every other value."""


# -- bits ----------------------------------------------------------------------------------------


def int_bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a BF16 (as int16) or FP32 (as int32) tensor."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype and the same raw bits everywhere (``bitwise_equal`` NaN rule)."""
    return compare_bitwise("bits", a, b, RAW_BITS).passed


def cancelling_rows(m: int, n: int, seed: int, step: int) -> torch.Tensor:
    """[m, n] FP32 rows on which summation orders differ: values in [0.5, 1.5), and in row ``i`` a
    +2^24 at column ``(i * step) % n`` and a -2^24 at ``(i * step + 1 + 2 i) % n`` (unless they
    coincide), so the terms added while the large one is in the sum are absorbed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    p = torch.rand((m, n), generator=g) + 0.5
    for i in range(m):
        a, b = (i * step) % n, (i * step + 1 + 2 * i) % n
        if a != b:
            p[i, a], p[i, b] = 2.0 ** 24, -(2.0 ** 24)
    return p


def declared_head_dim_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``x`` [M, D] FP32 as the attention backward's pinned delta sum declares them (Triton ``_head_dim_sum``, CUDA ``attn_delta_declared_kernel``): bits 0, 1, 2 of the head-dim
    index, then the rest from the highest bit down, one IEEE addition per pair (torch)."""
    m, d = x.shape
    y = x.reshape(m, d // 8, 8)
    for _ in range(3):
        y = y.reshape(m, d // 8, -1, 2)
        y = y[..., 0] + y[..., 1]
    y = y.reshape(m, d // 8)
    while y.shape[1] > 1:
        y = y.reshape(m, 2, y.shape[1] // 2)
        y = y[:, 0] + y[:, 1]
    return y.reshape(m)


def differing(pairs: Iterable[Pair], nan_policy: str = RAW_BITS) -> list[str]:
    """Labels of the pairs whose two sides are not bitwise equal under ``nan_policy``."""
    return [p.label for p in pairs if not compare_bitwise(p.label, p.canonical, p.transformed, nan_policy).passed]


def control_caught(pairs: Iterable[Pair]) -> bool:
    """True when at least one pair differs under the contract's ``nan_policy`` (the gate's rule for
    negative controls): what a planted ulp or a known-breaking control must show."""
    return bool(differing(pairs, load_contract().nan_policy))


# -- cases ---------------------------------------------------------------------------------------


def case_fixtures(spec: OpSpec, seed: int):
    """Module-scoped fixtures ``cases`` (the smoke accuracy cases of ``spec``) and ``grad_case``
    (its first smoke gradient case), both built with ``seed`` on the ``device`` fixture.

    Use at module level: ``cases, grad_case = case_fixtures(SPEC, SEED)``.
    """

    @pytest.fixture(scope="module", name="cases")
    def cases(device) -> list[Case]:
        return spec.build_cases(SMOKE, seed, device)

    @pytest.fixture(scope="module", name="grad_case")
    def grad_case(device) -> Case:
        return spec.build_grad_cases(SMOKE, seed, device)[0]

    return cases, grad_case


def assert_one_and_odd_token_counts(counts: Sequence[int]) -> None:
    """The smoke cases include T = 1 and an odd T > 1."""
    assert 1 in counts and any(t % 2 for t in counts if t > 1), f"token counts {list(counts)}"


# -- accuracy ------------------------------------------------------------------------------------


def assert_within(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, what: str = "") -> None:
    """``torch.testing.assert_close`` with a contract tolerance."""
    msg = (lambda m: f"{what}: {m}") if what else None
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol, msg=msg)


def max_abs_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest ``|x - ref|`` with ``x`` upcast to FP32 (``ref`` is an FP32 reference)."""
    return (x.float() - ref).abs().max().item()


@dataclass
class ForwardResult:
    out: torch.Tensor
    """The kernel's output."""
    ref: torch.Tensor
    """The FP32 reference on the upcast inputs."""
    base: torch.Tensor | None = None
    """``torch_bf16``'s output (only with the relative criterion)."""
    err: float | None = None
    err_base: float | None = None


def check_forward_accuracy(spec: OpSpec, case: Case, contract: Contract, *, out_dtype: torch.dtype = torch.bfloat16,
                           tier: str = "bfloat16", relative: bool = True) -> ForwardResult:
    """Forward accuracy of the kernel on one case.

    Asserts: the reference is FP32; the kernel's output has ``out_dtype`` and the reference's shape;
    it lies within the contract's forward tolerance of the op's class (row ``tier``) of the FP32
    reference; with ``relative``, its max error is at most ``relative_factor("forward")`` x the
    ``torch_bf16`` max error against the same reference.
    """
    tol = contract.tolerance("forward", contract.op_class(spec.name), tier)
    (out,) = run_forward(spec.impls[KERNEL], case.inputs)
    (ref,) = run_forward(spec.impls["reference_fp32"], upcast_inputs(case.inputs))
    assert ref.dtype == torch.float32, f"{case.id}: reference is {ref.dtype}"
    assert out.dtype == out_dtype and out.shape == ref.shape, f"{case.id}: {out.dtype} {list(out.shape)}"
    assert_within(out.float(), ref, tol, case.id)
    result = ForwardResult(out, ref)
    if relative:
        (result.base,) = run_forward(spec.impls["torch_bf16"], case.inputs)
        result.err, result.err_base = max_abs_error(out, ref), max_abs_error(result.base, ref)
        k = contract.relative_factor("forward")
        assert result.err <= k * result.err_base, f"{case.id}: {result.err} > {k} x {result.err_base}"
    return result


def gradients(impl: Any, inputs: dict[str, Any], names: Sequence[str], upstream) -> dict[str, torch.Tensor]:
    """``run_gradient``'s gradients of ``names``."""
    return run_gradient(impl, inputs, tuple(names), upstream=upstream)[1]


@dataclass
class BackwardResult:
    upstream: tuple[torch.Tensor, ...]
    """The seeded upstream gradients (in the kernel outputs' dtypes)."""
    grads: dict[str, torch.Tensor]
    """The kernel's gradients."""
    ref: dict[str, torch.Tensor]
    """The FP32 reference's gradients (upcast inputs and upstream)."""
    base: dict[str, torch.Tensor] | None = None
    """``torch_bf16``'s gradients (only with the relative criterion)."""


def check_backward_accuracy(spec: OpSpec, case: Case, contract: Contract, *, names: Sequence[str] | None = None,
                            grad_dtype: torch.dtype = torch.bfloat16, tier: str = "bfloat16",
                            relative: bool = False, upstream_offset: int = 7) -> BackwardResult:
    """Gradient accuracy of the kernel on one case.

    The upstream is ``make_upstream(kernel outputs, case.seed + upstream_offset)``; the reference
    gets it upcast to FP32. For every input in ``names`` (default: ``spec.grad_inputs``) asserts:
    the kernel's gradient has ``grad_dtype`` and the input's shape; it lies within the contract's
    gradient tolerance of the op's class (row ``tier``); with ``relative``, its max error is at most
    ``relative_factor("gradient")`` x the ``torch_bf16`` gradient's.
    """
    names = tuple(spec.grad_inputs if names is None else names)
    tol = contract.tolerance("gradient", contract.op_class(spec.name), tier)
    kernel = spec.impls[KERNEL]
    up = make_upstream(run_forward(kernel, case.inputs), case.seed + upstream_offset)
    g = gradients(kernel, case.inputs, names, up)
    g_ref = gradients(spec.impls["reference_fp32"], upcast_inputs(case.inputs), names, tuple(u.float() for u in up))
    result = BackwardResult(up, g, g_ref)
    if relative:
        result.base = gradients(spec.impls["torch_bf16"], case.inputs, names, up)
    k = contract.relative_factor("gradient")
    for n in names:
        assert g[n].dtype == grad_dtype and g[n].shape == case.inputs[n].shape, \
            f"{case.id} d{n}: {g[n].dtype} {list(g[n].shape)}"
        assert_within(g[n].float(), g_ref[n], tol, f"{case.id} d{n}")
        if relative:
            err, err_base = max_abs_error(g[n], g_ref[n]), max_abs_error(result.base[n], g_ref[n])
            assert err <= k * err_base, f"{case.id} d{n}: {err} > {k} x {err_base}"
    return result


# -- invariance ----------------------------------------------------------------------------------


@dataclass
class TransformCheck:
    pairs: list[Pair]
    """The pairs of the plain run (all bitwise equal)."""
    planted: list[Pair]
    """The pairs of the run with a planted ulp (at least one differs)."""


def check_transform(spec: OpSpec, name: str, case: Case, direction: str, *, impl: Any = None) -> TransformCheck:
    """One declared invariance transform and its negative control, as the gate runs them.

    Asserts: the transform is a function (not an N/A reason); ``fn(impl, case, direction, False)``
    gives pairs and every pair is bitwise equal (:func:`bits_equal`); ``fn(..., True)`` (a planted
    one-ulp change) is caught (:func:`control_caught`). ``impl`` defaults to the kernel.
    """
    fn = spec.transform(name)
    assert callable(fn), f"{spec.name}: transform {name!r} is not a function: {fn}"
    impl = spec.impls[KERNEL] if impl is None else impl
    where = f"{name}/{direction} on {case.id}"
    pairs = fn(impl, case, direction, False)
    assert pairs, f"{where}: no pairs"
    bad = differing(pairs)
    assert not bad, f"{where}: not bitwise equal: {bad}"
    planted = fn(impl, case, direction, True)
    assert control_caught(planted), f"{where}: the planted ulp was not caught"
    return TransformCheck(pairs, planted)
