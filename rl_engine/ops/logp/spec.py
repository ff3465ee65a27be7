"""Spec of ``logp``: row-wise; one row of logits [T, V] FP32 and its target in, one FP32 logprob out."""

from __future__ import annotations

import torch

from rl_engine.ops.logp.op import logp_cuda, logp_triton, logp_triton_size_dependent
from rl_engine.ops.logp.reference import logp_reference
from rl_engine.ops.logp.torch_bf16 import logp_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Workload, make_generator, standard_normal
from rl_engine.ops.transforms import rowwise_transforms

MAX_LOGIT_ELEMENTS = 1 << 28
"""Token counts whose FP32 [T, V] logits exceed this many elements (1 GiB) are replaced by the
workload's gradient token count: the invariance transforms hold several copies of the logits."""


def token_counts(w: Workload) -> tuple[int, ...]:
    """The row counts of the accuracy cases: the workload's, capped by :data:`MAX_LOGIT_ELEMENTS`.

    smoke: (1, 7, 33); qwen3-8b: (1, 257, 1027) (T = 4096 at V = 151936 would be 2.5 GB a copy).
    """
    return tuple(t if t * w.vocab <= MAX_LOGIT_ELEMENTS else w.grad_token_count for t in w.token_counts)


def draw_logits(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Seeded FP32 logits [rows, V] with a range of scales, drawn on the CPU.

    Row r: N(0, 1) * 3 (typical LM logits); every 4th row (r % 4 == 3) N(0, 1) * 20 (large logits,
    |z| up to ~100); every 4th row (r % 4 == 2) also gets +25 on one random column (a confident,
    peaked distribution).
    """
    x = standard_normal((rows, vocab), g) * 3.0
    big = torch.arange(rows) % 4 == 3
    x[big] *= 20.0 / 3.0
    peaked = torch.nonzero(torch.arange(rows) % 4 == 2).flatten()
    if peaked.numel():
        cols = torch.randint(0, vocab, (peaked.numel(),), generator=g)
        x[peaked, cols] += 25.0
    return x


def draw_targets(logits: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Seeded targets [rows] int64: uniform ids, except every 3rd row takes its argmax (a likely
    token, as sampled tokens usually are, so logprobs near 0 are covered too)."""
    rows, vocab = logits.shape
    t = torch.randint(0, vocab, (rows,), generator=g, dtype=torch.int64)
    likely = torch.arange(rows) % 3 == 1
    t[likely] = logits[likely].argmax(-1)
    return t


def _case(t: int, v: int, seed: int, device: torch.device, temperature: float) -> Case:
    g = make_generator(seed)
    logits = draw_logits(t, v, g)
    targets = draw_targets(logits, g)
    suffix = "" if temperature == 1.0 else f"-temp{temperature:g}"
    return Case(
        id=f"T{t}-V{v}{suffix}",
        inputs={"logits": logits.to(device), "targets": targets.to(device), "temperature": temperature},
        seed=seed,
    )


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    counts = token_counts(w)
    cases = [_case(t, w.vocab, seed + i, device, 1.0) for i, t in enumerate(counts)]
    # One temperature case (``docs/pitfalls.md`` P11): both sides of every comparison use the same value.
    cases.append(_case(counts[1], w.vocab, seed + len(counts), device, 0.7))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [_case(w.grad_token_count, w.vocab, seed, device, 1.0),
            _case(w.grad_token_count, w.vocab, seed + 1, device, 0.7)]


SPEC = OpSpec(
    name="logp",
    summary="log_softmax(logits / temperature)[target], logits [T, V] fp32 -> [T] fp32",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("logprobs",),
    grad_inputs=("logits",),
    impls={
        "reference_fp32": logp_reference,
        "torch_bf16": logp_torch_bf16,
        "triton_cuda_bf16": logp_triton,
        "cuda_bf16": logp_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("logits", "targets"), grad_inputs=("logits",)),
        "tp": "the op takes whole [T, V] logit rows; a vocab-parallel split would need a cross-rank "
              "max / sum-exp merge that the contract does not declare (vocab-parallel scoring is "
              "lm_head's or linear_logp's concern, and both take the whole vocabulary)",
    },
    controls={"batch": logp_triton_size_dependent},
    float_outputs_fp32=("logprobs",),
)
