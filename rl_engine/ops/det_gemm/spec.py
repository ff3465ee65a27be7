"""Spec of det_gemm: row-wise over the rows of ``a`` (tokens); ``b`` is the shared weight.

Cases are the Qwen3 projection shapes of the workload: ``K = E -> N = E`` (q/o projection),
``K = E -> N = F`` (gate/up) and ``K = F -> N = E`` (down; the shape where cuBLAS is not
batch-invariant on H200). ``a`` is drawn with unit scale and ``b`` with scale ``K ** -0.5``
(so outputs are O(1), like a projection of normalised activations). Gradient cases scale ``a`` by
``M ** -0.5`` so ``db = a^T @ dc`` stays O(1) under the unit-scale upstream gradient.

Transforms: ``batch``, ``chunk``, ``padding`` over rows of ``a``; ``layout`` with ``a`` at a padded
row stride and ``b`` column-major (a transposed view of an ``[N, K]`` weight); ``tp`` splits K into
2 and 4 contiguous mid-split parts, each run with a shallower tree and merged in BF16, and compares
the output and both gradients with the unsplit product. Known-breaking controls: ``batch`` -> a tree
depth chosen from M; ``tp`` -> FP32 leaves and FP32 merges.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_engine.contract import load_contract
from rl_engine.ops.det_gemm.op import (
    det_gemm_cuda,
    det_gemm_triton,
    det_gemm_triton_depth_from_m,
    det_gemm_triton_fp32_merge,
    tp_split_det_gemm,
)
from rl_engine.ops.det_gemm.reference import det_gemm_reference
from rl_engine.ops.det_gemm.torch_bf16 import det_gemm_torch_bf16
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.spec import Case, OpSpec, Pair, Workload, make_generator, randn
from rl_engine.ops.transforms import plant_ulp, rowwise_transforms

GRAD_INPUTS = ("a", "b")


def _shapes(w: Workload) -> list[tuple[int, int]]:
    """(K, N) of the Qwen3 projections: q/o, gate/up, down."""
    return [(w.hidden, w.hidden), (w.hidden, w.ffn), (w.ffn, w.hidden)]


def _case(m: int, k: int, n: int, seed: int, device: torch.device, a_scale: float) -> Case:
    g = make_generator(seed)
    a = randn((m, k), g, scale=a_scale, device=device)
    b = randn((k, n), g, scale=k ** -0.5, device=device)
    return Case(id=f"M{m}-K{k}-N{n}", inputs={"a": a, "b": b}, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    cases = []
    for j, (k, n) in enumerate(_shapes(w)):
        for i, m in enumerate(w.token_counts):
            cases.append(_case(m, k, n, seed + 10 * j + i, device, 1.0))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    # The first gradient case is also the gate's invariance case: the down projection (K = F).
    m = w.grad_token_count
    return [_case(m, k, n, seed + 100 + j, device, m ** -0.5)
            for j, (k, n) in enumerate([(w.ffn, w.hidden), (w.hidden, w.ffn)])]


def _run_split(impl, parts: int):
    def split(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return tp_split_det_gemm(a, b, parts, impl)

    split.__name__ = f"tp{parts}_{getattr(impl, '__name__', 'impl')}"
    return split


def tp_transform(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    """K split into each supported split > 1 of the contract (2 and 4) vs. the unsplit product.

    Forward compares the output; gradient compares the output, da and db (under a row-parallel
    split every rank computes its own K columns of da and K rows of db over an unsplit reduction
    axis, so both gradients must also be bitwise equal to the unsplit ones).
    """
    splits = [s for s in load_contract().det_gemm["supported_splits"] if s > 1]
    pairs: list[Pair] = []
    if direction == "forward":
        (c,) = run_forward(impl, case.inputs)
        for parts in splits:
            (t,) = run_forward(_run_split(impl, parts), case.inputs)
            pairs.append(Pair(f"K split in {parts} (mid-split, BF16 merge): output 0", c, t))
    else:
        probe = run_forward(impl, case.inputs)
        up = make_upstream(probe, case.seed + 7)
        outs_c, grads_c, _ = run_gradient(impl, case.inputs, GRAD_INPUTS, upstream=up)
        for parts in splits:
            outs_t, grads_t, _ = run_gradient(_run_split(impl, parts), case.inputs, GRAD_INPUTS, upstream=up)
            label = f"K split in {parts} (mid-split, BF16 merge)"
            pairs.append(Pair(f"{label}: output 0", outs_c[0], outs_t[0]))
            for n in GRAD_INPUTS:
                pairs.append(Pair(f"{label}: d{n}", grads_c[n], grads_t[n]))
    if plant and pairs:
        p = pairs[0]
        pairs[0] = Pair(p.label, p.canonical, plant_ulp(p.transformed))
    return pairs


def _impls() -> dict[str, Any]:
    return {
        "reference_fp32": det_gemm_reference,
        "torch_bf16": det_gemm_torch_bf16,
        "triton_cuda_bf16": det_gemm_triton,
        "cuda_bf16": det_gemm_cuda,
    }


SPEC = OpSpec(
    name="det_gemm",
    summary="deterministic GEMM a [M, K] @ b [K, N], bf16 -> bf16, Option B K tree (FP32 leaves, BF16 merges)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("c",),
    grad_inputs=GRAD_INPUTS,
    impls=_impls(),
    transforms={
        **rowwise_transforms(row_inputs=("a",), grad_inputs=GRAD_INPUTS, layout_inputs=("b",)),
        "tp": tp_transform,
    },
    controls={
        "batch": det_gemm_triton_depth_from_m,
        "tp": det_gemm_triton_fp32_merge,
    },
)
