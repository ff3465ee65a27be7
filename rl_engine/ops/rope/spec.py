"""Spec of RoPE: elementwise; token t's output rows depend only on x[t], cos[t] and sin[t].

Cases: arbitrary positions in [0, 40960) for the row-wise token counts, and one packed varlen
batch whose positions restart at 0 for every sequence (the key heads, Hkv). cos/sin always come
from :func:`rl_engine.ops.rope.cos_sin` with the workload's theta and head dim.

Invariance: row-wise in (x, cos, sin) for ``batch``, ``chunk``, ``padding`` and ``layout``
(row-strided x and tables); ``tp`` splits the heads into 2 and 4 contiguous groups (each tensor-
parallel rank rotates its own heads) and compares outputs and dx.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_engine.ops.rope.op import cos_sin, rope_cuda, rope_triton
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.rope.reference import rope_reference
from rl_engine.ops.rope.torch_bf16 import rope_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Pair, TransformFn, Workload, make_generator, randn
from rl_engine.ops.transforms import plant_ulp, rowwise_transforms

MAX_POSITION = 40960
"""Qwen3-8B ``max_position_embeddings``: arbitrary positions are drawn from [0, MAX_POSITION)."""


def _case(x: torch.Tensor, positions: torch.Tensor, w: Workload, tag: str, seed: int) -> Case:
    t, h, d = x.shape
    cos, sin = cos_sin(positions.to(x.device), w.rope_theta, w.head_dim)
    return Case(id=f"T{t}-H{h}-D{d}-{tag}", inputs={"x": x, "cos": cos, "sin": sin}, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device, counts=None) -> list[Case]:
    cases = []
    for i, t in enumerate(counts or w.token_counts):
        g = make_generator(seed + i)
        x = randn((t, w.heads, w.head_dim), g, scale=2.0, device=device)
        positions = torch.randint(0, MAX_POSITION, (t,), generator=g, dtype=torch.int64)
        cases.append(_case(x, positions, w, "pos_arbitrary", seed + i))
    if counts is None:
        s = seed + len(w.token_counts)
        g = make_generator(s)
        positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in w.seq_lens])
        x = randn((positions.shape[0], w.kv_heads, w.head_dim), g, scale=2.0, device=device)
        cases.append(_case(x, positions, w, "pos_restart_per_seq", s))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return _cases(w, seed, device, counts=(w.grad_token_count,))


def split_axis1_transform(split_inputs: Sequence[str], grad_inputs: Sequence[str],
                          parts: Sequence[int] = (2, 4)) -> TransformFn:
    """A tensor-parallel transform: axis 1 of ``split_inputs`` (heads, or F) cut into ``parts``
    contiguous groups, each run on its own (as one rank would), outputs concatenated on axis 1.
    With ``plant=True`` the first compared output carries a one-ulp change (negative control).

    Compares the outputs and the gradients of ``split_inputs`` (local along axis 1); gradients of
    shared parameters sum over the split axis and are not compared. Splits that do not divide
    axis 1 are skipped; with no valid split the op is run once on the whole (one group).
    """
    local_grads = [n for n in grad_inputs if n in split_inputs]

    def transform(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
        width = case.inputs[split_inputs[0]].shape[1]
        splits = [p for p in parts if width % p == 0 and p <= width] or [1]
        if direction == "forward":
            outs_c, grads_c, up = run_forward(impl, case.inputs), {}, None
        else:
            up = make_upstream(run_forward(impl, case.inputs), case.seed + 7)
            outs_c, grads_c, _ = run_gradient(impl, case.inputs, grad_inputs, upstream=up)
        pairs: list[Pair] = []
        for p in splits:
            step = width // p
            outs_parts, grad_parts = [], {n: [] for n in local_grads}
            for k in range(p):
                sl = slice(k * step, (k + 1) * step)
                sub = dict(case.inputs)
                for n in split_inputs:
                    sub[n] = case.inputs[n][:, sl].contiguous()
                if direction == "forward":
                    outs_parts.append(run_forward(impl, sub))
                else:
                    ups = tuple(u[:, sl].contiguous() for u in up)
                    o, g, _ = run_gradient(impl, sub, grad_inputs, upstream=ups)
                    outs_parts.append(o)
                    for n in local_grads:
                        grad_parts[n].append(g[n])
            label = f"axis 1 split into {p} groups"
            for i, c in enumerate(outs_c):
                pairs.append(Pair(f"{label}: output {i}", c, torch.cat([o[i] for o in outs_parts], 1)))
            for n in local_grads if direction == "gradient" else ():
                pairs.append(Pair(f"{label}: d{n}", grads_c[n], torch.cat(grad_parts[n], 1)))
        if plant:  # plant in a gradient for the gradient direction, else in the first output
            k = len(outs_c) if direction == "gradient" and local_grads else 0
            pairs[k] = Pair(pairs[k].label, pairs[k].canonical, plant_ulp(pairs[k].transformed))
        return pairs

    return transform


SPEC = OpSpec(
    name="rope",
    summary="rotate-half RoPE, x [T, H, D] bf16, cos/sin [T, D/2] fp32 -> [T, H, D] bf16",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("x",),
    impls={
        "reference_fp32": rope_reference,
        "torch_bf16": rope_torch_bf16,
        "triton_cuda_bf16": rope_triton,
        "cuda_bf16": rope_cuda,
    },
    transforms={
        **rowwise_transforms(row_inputs=("x", "cos", "sin"), grad_inputs=("x",)),
        "tp": split_axis1_transform(split_inputs=("x",), grad_inputs=("x",)),
    },
)
