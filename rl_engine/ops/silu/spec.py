"""Spec of SiLU: elementwise; one row of [T, F] in, one row out."""

from __future__ import annotations

import torch

from rl_engine.ops.silu.op import silu_cuda, silu_triton
from rl_engine.ops.silu.reference import silu_reference
from rl_engine.ops.silu.torch_bf16 import silu_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, randn
from rl_engine.ops.transforms import rowwise_transforms


def _cases(w: Workload, seed: int, device: torch.device, counts=None) -> list[Case]:
    cases = []
    for i, t in enumerate(counts or w.token_counts):
        g = make_generator(seed + i)
        x = randn((t, w.ffn), g, scale=3.0, device=device)
        cases.append(Case(id=f"T{t}-F{w.ffn}", inputs={"x": x}, seed=seed + i))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return _cases(w, seed, device, counts=(w.grad_token_count,))


SPEC = OpSpec(
    name="silu",
    summary="SiLU x*sigmoid(x), [T, F] bf16 -> [T, F] bf16",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("x",),
    impls={
        "reference_fp32": silu_reference,
        "torch_bf16": silu_torch_bf16,
        "triton_cuda_bf16": silu_triton,
        "cuda_bf16": silu_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("x",), grad_inputs=("x",)),
        "tp": "elementwise op: no reduction axis to split across tensor-parallel ranks",
    },
)
