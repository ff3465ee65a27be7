"""Spec of lm_head: row-wise over the rows of ``hidden`` (tokens); ``weight`` is the shared [V, E] matrix.

Cases: T from the workload's token counts (a count whose FP32 ``[T, V]`` logits would exceed 1 GiB
is replaced by the gradient token count: qwen3-8b runs T in {1, 257, 1027}), E = hidden,
V = vocab (smoke: V = 1000, a multiple of no block size, so the V tail is masked). ``hidden`` is
drawn with unit scale (post-norm activations), ``weight`` with scale ``E ** -0.5``.

Transforms: ``batch``, ``chunk``, ``padding`` over rows of ``hidden``; ``layout`` with ``hidden`` at
a padded row stride and ``weight`` column-major (the kernel accepts any weight strides; hidden needs
a unit stride on E). ``tp`` is N/A (reason below).
"""

from __future__ import annotations

import torch

from rl_engine.ops.lm_head.op import lm_head_cuda, lm_head_triton
from rl_engine.ops.lm_head.reference import lm_head_reference
from rl_engine.ops.lm_head.torch_bf16 import lm_head_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, randn
from rl_engine.ops.transforms import rowwise_transforms

MAX_LOGITS_BYTES = 1 << 30
"""Largest FP32 logits buffer a case may ask for; larger token counts use ``grad_token_count``."""


def _token_counts(w: Workload) -> list[int]:
    counts = []
    for t in w.token_counts:
        t = t if t * w.vocab * 4 <= MAX_LOGITS_BYTES else w.grad_token_count
        if t not in counts:
            counts.append(t)
    return counts


def _weight(w: Workload, seed: int, device: torch.device) -> torch.Tensor:
    return randn((w.vocab, w.hidden), make_generator(seed), scale=w.hidden ** -0.5, device=device)


def _case(t: int, w: Workload, weight: torch.Tensor, seed: int, device: torch.device) -> Case:
    hidden = randn((t, w.hidden), make_generator(seed), scale=1.0, device=device)
    return Case(id=f"T{t}-E{w.hidden}-V{w.vocab}", inputs={"hidden": hidden, "weight": weight}, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    # One weight (seed) shared by every case: at V = 151936 it is drawn once, not per case.
    weight = _weight(w, seed, device)
    return [_case(t, w, weight, seed + 1 + i, device) for i, t in enumerate(_token_counts(w))]


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [_case(w.grad_token_count, w, _weight(w, seed + 100, device), seed + 101, device)]


SPEC = OpSpec(
    name="lm_head",
    summary="LM head hidden [T, E] @ weight [V, E]^T, bf16 -> FP32 logits [T, V] (never rounded to BF16)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("logits",),
    grad_inputs=("hidden", "weight"),
    impls={
        "reference_fp32": lm_head_reference,
        "torch_bf16": lm_head_torch_bf16,
        "triton_cuda_bf16": lm_head_triton,
        "cuda_bf16": lm_head_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("hidden",), grad_inputs=("hidden", "weight"), layout_inputs=("weight",)),
        "tp": "no reduction is split across ranks: under tensor parallelism the Qwen3 LM head is "
              "vocab-parallel (each rank holds rows of weight and computes whole-E FP32 logits for its "
              "V slice), so every logit's reduction stays on one rank; the K-split tp check belongs to det_gemm",
    },
    float_outputs_fp32=("logits",),
)
