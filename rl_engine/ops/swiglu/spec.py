"""Spec of SwiGLU: elementwise; row t of gate and up gives row t of the output.

Invariance: row-wise in (gate, up) for ``batch``, ``chunk``, ``padding`` and ``layout``; ``tp``
splits F into 2 and 4 contiguous groups (each tensor-parallel rank of the column-parallel
gate/up projections holds one F slice) and compares outputs, dgate and dup.
"""

from __future__ import annotations

import torch

from rl_engine.ops.swiglu.op import swiglu_cuda, swiglu_triton
from rl_engine.ops.rope.spec import split_axis1_transform
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, randn
from rl_engine.ops.swiglu.reference import swiglu_reference
from rl_engine.ops.swiglu.torch_bf16 import swiglu_torch_bf16
from rl_engine.ops.transforms import rowwise_transforms


def _cases(w: Workload, seed: int, device: torch.device, counts=None) -> list[Case]:
    cases = []
    for i, t in enumerate(counts or w.token_counts):
        g = make_generator(seed + i)
        gate = randn((t, w.ffn), g, scale=3.0, device=device)
        up = randn((t, w.ffn), g, scale=2.0, device=device)
        cases.append(Case(id=f"T{t}-F{w.ffn}", inputs={"gate": gate, "up": up}, seed=seed + i))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return _cases(w, seed, device, counts=(w.grad_token_count,))


SPEC = OpSpec(
    name="swiglu",
    summary="SwiGLU silu(gate)*up, gate/up [T, F] bf16 -> [T, F] bf16",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("gate", "up"),
    impls={
        "reference_fp32": swiglu_reference,
        "torch_bf16": swiglu_torch_bf16,
        "triton_cuda_bf16": swiglu_triton,
        "cuda_bf16": swiglu_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("gate", "up"), grad_inputs=("gate", "up")),
        "tp": split_axis1_transform(split_inputs=("gate", "up"), grad_inputs=("gate", "up")),
    },
)
