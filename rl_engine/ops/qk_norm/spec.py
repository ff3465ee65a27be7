"""Spec of QK-norm: reduction class; token t's rows x[t, :, :] give output rows [t, :, :].

Cases: query heads (H) for the row-wise token counts in the declared ``hf`` order, key heads
(Hkv) in the ``fused`` order at the odd count. Weights near 1, eps from the workload.

Invariance: row-wise over T for ``batch``, ``chunk``, ``padding`` and ``layout`` (dweight sums
over T*H rows, compared under ``layout`` only); ``tp`` splits the heads into 2 and 4 contiguous
groups (a tensor-parallel rank normalises its own heads) and compares outputs and dx.
"""

from __future__ import annotations

import torch

from rl_engine.ops.qk_norm.op import qk_norm_cuda, qk_norm_triton
from rl_engine.ops.qk_norm.reference import qk_norm_reference
from rl_engine.ops.qk_norm.torch_bf16 import qk_norm_torch_bf16
from rl_engine.ops.rms_norm.spec import norm_weight
from rl_engine.ops.rope.spec import split_axis1_transform
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, randn
from rl_engine.ops.transforms import rowwise_transforms


def _case(w: Workload, t: int, heads: int, order: str, seed: int, device) -> Case:
    g = make_generator(seed)
    x = randn((t, heads, w.head_dim), g, scale=2.0, device=device)
    weight = norm_weight(w.head_dim, g, device)
    return Case(id=f"T{t}-H{heads}-D{w.head_dim}-{order}",
                inputs={"x": x, "weight": weight, "eps": w.rms_norm_eps, "order": order}, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    cases = [_case(w, t, w.heads, "hf", seed + i, device) for i, t in enumerate(w.token_counts)]
    odd = next((t for t in w.token_counts if t % 2 and t > 1), w.token_counts[-1])
    cases.append(_case(w, odd, w.kv_heads, "fused", seed + len(w.token_counts), device))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [_case(w, w.grad_token_count, w.heads, "hf", seed + 100, device)]


SPEC = OpSpec(
    name="qk_norm",
    summary="QK-norm (RMSNorm over D per head) x [T, H, D] bf16, weight [D] bf16, eps, order -> [T, H, D] bf16",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("x", "weight"),
    impls={
        "reference_fp32": qk_norm_reference,
        "torch_bf16": qk_norm_torch_bf16,
        "triton_cuda_bf16": qk_norm_triton,
        "cuda_bf16": qk_norm_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("x",), grad_inputs=("x", "weight")),
        "tp": split_axis1_transform(split_inputs=("x",), grad_inputs=("x", "weight")),
    },
)
