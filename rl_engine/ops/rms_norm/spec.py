"""Spec of RMSNorm: reduction class; row t of x (plus weight, eps, order) gives row t of y.

Cases: the row-wise token counts in the declared ``hf`` order, plus one case in the ``fused``
order. Weights near 1 (like trained RMSNorm weights), eps from the workload (``docs/pitfalls.md`` P12).

Invariance: row-wise in x for ``batch``, ``chunk``, ``padding`` and ``layout`` (the generic
transforms; dweight sums over rows, so it is compared under ``layout`` only). ``controls`` holds
a deliberately size-dependent variant (the row reduction split with BF16 partials when T < 4)
that the ``batch`` transform must catch.
"""

from __future__ import annotations

import torch

from rl_engine.ops.rms_norm.op import rms_norm_cuda, rms_norm_size_dependent_control, rms_norm_triton
from rl_engine.ops.rms_norm.reference import rms_norm_reference
from rl_engine.ops.rms_norm.torch_bf16 import rms_norm_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, randn, standard_normal
from rl_engine.ops.transforms import rowwise_transforms


def norm_weight(n: int, g: torch.Generator, device) -> torch.Tensor:
    """A BF16 norm weight near 1: ``1 + 0.25 * N(0, 1)``, drawn in FP32 on the CPU."""
    return (1.0 + 0.25 * standard_normal((n,), g)).to(torch.bfloat16).to(device)


def _case(w: Workload, t: int, order: str, seed: int, device) -> Case:
    g = make_generator(seed)
    x = randn((t, w.hidden), g, scale=2.0, device=device)
    weight = norm_weight(w.hidden, g, device)
    return Case(id=f"T{t}-E{w.hidden}-{order}",
                inputs={"x": x, "weight": weight, "eps": w.rms_norm_eps, "order": order}, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    cases = [_case(w, t, "hf", seed + i, device) for i, t in enumerate(w.token_counts)]
    odd = next((t for t in w.token_counts if t % 2 and t > 1), w.token_counts[-1])
    cases.append(_case(w, odd, "fused", seed + len(w.token_counts), device))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [_case(w, w.grad_token_count, "hf", seed + 100, device)]


SPEC = OpSpec(
    name="rms_norm",
    summary="RMSNorm x [T, E] bf16, weight [E] bf16, eps, order -> [T, E] bf16 (FP32 statistics)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("x", "weight"),
    impls={
        "reference_fp32": rms_norm_reference,
        "torch_bf16": rms_norm_torch_bf16,
        "triton_cuda_bf16": rms_norm_triton,
        "cuda_bf16": rms_norm_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("x",), grad_inputs=("x", "weight")),
        "tp": "RMSNorm runs replicated over the full hidden E on every tensor-parallel rank; "
              "a sequence-parallel split of T is what the batch and chunk transforms check",
    },
    controls={"batch": rms_norm_size_dependent_control},
)
