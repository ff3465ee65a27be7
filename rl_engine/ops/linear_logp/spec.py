"""Spec of ``linear_logp``: row-wise over T; hidden [T, E] and targets [T] are the row inputs, the
LM-head weight [V, E] is a shared parameter."""

from __future__ import annotations

import torch

from rl_engine.ops.linear_logp.op import linear_logp_cuda, linear_logp_triton
from rl_engine.ops.linear_logp.reference import linear_logp_reference
from rl_engine.ops.linear_logp.torch_bf16 import linear_logp_torch_bf16
from rl_engine.ops.logp.spec import token_counts
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, standard_normal
from rl_engine.ops.transforms import rowwise_transforms

LOGIT_STD = 3.0
"""Standard deviation of a typical row's logits."""
HIDDEN_STD = 0.4
"""Standard deviation of a typical hidden row. Kept small so that dweight = sum_t dlogits[t] h[t]
stays below 16 in magnitude: above 16 the BF16 rounding of the gradient output alone (half an ulp =
0.0625) exceeds the contract's absolute gradient cap (0.05). Measured FP32 max|dweight| of the
qwen3-8b gradient cases (T = 1027) at HIDDEN_STD = 0.5: 12.0 (temperature 1) and 14.6 (0.7), so
0.4 gives ~9.6 and ~11.7."""


def draw_weight(w: Workload, seed: int) -> torch.Tensor:
    """Seeded LM-head weight [V, E] bfloat16 (on the CPU), shared by all cases of one build:
    N(0, 1) * LOGIT_STD / (HIDDEN_STD * sqrt(E)), so that a typical row's logits have std LOGIT_STD."""
    g = make_generator(seed)
    scale = LOGIT_STD / (HIDDEN_STD * w.hidden ** 0.5)
    x = standard_normal((w.vocab, w.hidden), g) * scale
    return x.to(torch.bfloat16)


def draw_hidden_targets(t: int, weight: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded hidden [T, E] bfloat16 and targets [T] int64.

    Row r: N(0, 1) * HIDDEN_STD; every 4th row (r % 4 == 3) times 2 (logit std ~6, ~8.6 at
    temperature 0.7); every 3rd row (r % 3 == 1) is pushed towards its target's weight row so that
    its target logit rises by ~15 (a likely token, as sampled tokens usually are). Cost O(T * E):
    no [T, V] product is formed.
    """
    v, e = weight.shape
    h = standard_normal((t, e), g) * HIDDEN_STD
    h[torch.arange(t) % 4 == 3] *= 2.0
    targets = torch.randint(0, v, (t,), generator=g, dtype=torch.int64)
    likely = torch.nonzero(torch.arange(t) % 3 == 1).flatten()
    if likely.numel():
        wt = weight[targets[likely]].float()
        h[likely] += 15.0 * wt / (wt * wt).sum(-1, keepdim=True)
    return h.to(torch.bfloat16), targets


def _case(t: int, weight_cpu: torch.Tensor, weight: torch.Tensor, w: Workload, seed: int, device: torch.device,
          temperature: float) -> Case:
    g = make_generator(seed)
    hidden, targets = draw_hidden_targets(t, weight_cpu, g)
    suffix = "" if temperature == 1.0 else f"-temp{temperature:g}"
    return Case(
        id=f"T{t}-E{w.hidden}-V{w.vocab}{suffix}",
        inputs={"hidden": hidden.to(device), "weight": weight, "targets": targets.to(device),
                "temperature": temperature},
        seed=seed,
    )


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    weight_cpu = draw_weight(w, seed + 1000)
    weight = weight_cpu.to(device)
    counts = token_counts(w)  # smoke (1, 7, 33); qwen3-8b (1, 257, 1027), as logp
    cases = [_case(t, weight_cpu, weight, w, seed + i, device, 1.0) for i, t in enumerate(counts)]
    cases.append(_case(counts[1], weight_cpu, weight, w, seed + len(counts), device, 0.7))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    weight_cpu = draw_weight(w, seed + 1000)
    weight = weight_cpu.to(device)
    return [_case(w.grad_token_count, weight_cpu, weight, w, seed, device, 1.0),
            _case(w.grad_token_count, weight_cpu, weight, w, seed + 1, device, 0.7)]


SPEC = OpSpec(
    name="linear_logp",
    summary="fused log_softmax((hidden @ weight.T) / temperature)[target], [T, E] bf16 -> [T] fp32, "
            "no [T, V] buffer",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("logprobs",),
    grad_inputs=("hidden", "weight"),
    impls={
        "reference_fp32": linear_logp_reference,
        "torch_bf16": linear_logp_torch_bf16,
        "triton_cuda_bf16": linear_logp_triton,
        "cuda_bf16": linear_logp_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("hidden", "targets"), grad_inputs=("hidden", "weight")),
        "tp": "the fused op takes the whole [V, E] LM-head weight; a vocab-parallel split would need a "
              "cross-rank max / sum-exp merge and a target-logit exchange that the contract does not "
              "declare (the row-parallel BF16 merge of det_gemm does not apply to a log-softmax)",
    },
    float_outputs_fp32=("logprobs",),
)
