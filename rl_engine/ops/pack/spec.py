"""Spec of pack (padded [B, S, E] -> packed [T, E]): elementwise class, exact row copies.

Cases: the workload's varlen batch (zero-length sequences included, S = longest + 3, junk values
in the padding) and one single-sequence batch per row-wise token count.

Invariance (custom, sequence-wise: packed rows of sequence b depend only on ``x[b, :L_b]``):

* ``batch``   - one sequence packed alone, and a subset of the sequences in reversed order, equal
                 the same sequences' rows of the whole batch (forward) and their dx (gradient).
* ``chunk``   - the sequences packed in consecutive groups of 1, 3, 5, ... sequences and the
                 results concatenated equal the whole (a chunked micro-batch split).
* ``padding`` - more padding: S grown by 5 junk rows and empty sequences (repeated cu_seqlens
                 entries) inserted first and last; packed rows and the real sequences' dx are equal,
                 and the dx of every added row is exactly 0.
* ``layout``  - x with a padded row stride, and x as a transposed [S, B, E] buffer; forward output
                 equal; gradient with a row-strided upstream.
* ``tp``      - N/A (no reduction; tensor parallelism does not split the token layout).
"""

from __future__ import annotations

from typing import Any

import torch

from rl_engine.ops.pack.op import pack_cuda, pack_triton
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.pack.reference import pack_reference
from rl_engine.ops.pack.torch_bf16 import pack_torch_bf16
from rl_engine.ops.spec import Case, OpSpec, Pair, Workload, make_generator, randn
from rl_engine.ops.transforms import plant_ulp

EXTRA_PAD = 3
"""Padding rows beyond the longest sequence in the cases (so S > max L_b)."""


def cu_from_lengths(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _case(lengths, e: int, seed: int, device) -> Case:
    s = max(lengths) + EXTRA_PAD
    x = randn((len(lengths), s, e), make_generator(seed), device=device)
    t = sum(lengths)
    return Case(id=f"B{len(lengths)}-S{s}-E{e}-T{t}", inputs={"x": x, "cu_seqlens": cu_from_lengths(lengths, device)},
                seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    cases = [_case((t,), w.hidden, seed + i, device) for i, t in enumerate(w.token_counts)]
    cases.append(_case(w.seq_lens, w.hidden, seed + len(w.token_counts), device))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [_case(w.seq_lens, w.hidden, seed + 50, device)]


# -- invariance transforms ------------------------------------------------------------------------


def _lengths(case: Case) -> list[int]:
    cu = case.inputs["cu_seqlens"].tolist()
    return [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]


def _run(impl, inputs: dict[str, Any], direction: str, up: torch.Tensor | None):
    if direction == "forward":
        return run_forward(impl, inputs)[0], None
    outs, grads, _ = run_gradient(impl, inputs, ("x",), upstream=(up,))
    return outs[0], grads["x"]


def _canonical(impl, case: Case, direction: str):
    if direction == "forward":
        return run_forward(impl, case.inputs)[0], None, None
    up = make_upstream(run_forward(impl, case.inputs), case.seed + 7)[0]
    out, dx = _run(impl, case.inputs, direction, up)
    return out, dx, up


def _rows_of(case: Case, seqs: list[int]) -> torch.Tensor:
    cu = case.inputs["cu_seqlens"].tolist()
    rows = [r for b in seqs for r in range(cu[b], cu[b + 1])]
    return torch.tensor(rows, dtype=torch.long, device=case.inputs["x"].device)


def _subset(case: Case, seqs: list[int], up: torch.Tensor | None):
    lengths = _lengths(case)
    idx = torch.tensor(seqs, dtype=torch.long, device=case.inputs["x"].device)
    inputs = {"x": case.inputs["x"].index_select(0, idx).contiguous(),
              "cu_seqlens": cu_from_lengths([lengths[b] for b in seqs], case.inputs["x"].device)}
    rows = _rows_of(case, seqs)
    return inputs, rows, (None if up is None else up.index_select(0, rows).contiguous())


def _plant(pairs: list[Pair], direction: str) -> list[Pair]:
    """Negative control: a one-ulp change in the first non-empty dx pair (gradient) or output pair."""
    want = ": dx" if direction == "gradient" else ": output"
    order = [i for i, p in enumerate(pairs) if p.label.endswith(want)] + list(range(len(pairs)))
    for k in order:
        if pairs[k].transformed.numel():
            pairs[k] = Pair(pairs[k].label, pairs[k].canonical, plant_ulp(pairs[k].transformed))
            break
    return pairs


def _compare(label, out_c, dx_c, out_t, dx_t, rows, seqs, direction) -> list[Pair]:
    pairs = [Pair(f"{label}: output", out_c.index_select(0, rows), out_t)]
    if direction == "gradient":
        idx = torch.tensor(seqs, dtype=torch.long, device=dx_c.device)
        pairs.append(Pair(f"{label}: dx", dx_c.index_select(0, idx), dx_t))
    return pairs


def _batch(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, dx_c, up = _canonical(impl, case, direction)
    n = len(_lengths(case))
    subsets = [(f"sequence {b} alone", [b]) for b in sorted({0, n // 2, n - 1})]
    if n > 1:
        subsets.append(("sequences reversed", list(range(n - 1, -1, -1))))
    pairs: list[Pair] = []
    for label, seqs in subsets:
        inputs, rows, up_s = _subset(case, seqs, up)
        out_t, dx_t = _run(impl, inputs, direction, up_s)
        pairs += _compare(label, out_c, dx_c, out_t, dx_t, rows, seqs, direction)
    return _plant(pairs, direction) if plant else pairs


def _chunk(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, dx_c, up = _canonical(impl, case, direction)
    n = len(_lengths(case))
    outs, dxs, start, k = [], [], 0, 0
    while start < n:
        seqs = list(range(start, min(n, start + (1, 3, 5)[k % 3])))
        inputs, _, up_s = _subset(case, seqs, up)
        out_t, dx_t = _run(impl, inputs, direction, up_s)
        outs.append(out_t)
        dxs.append(dx_t)
        start, k = seqs[-1] + 1, k + 1
    label = f"{k} groups of 1,3,5,... sequences"
    rows = torch.arange(out_c.shape[0], device=out_c.device)
    dx_t = torch.cat(dxs, 0) if direction == "gradient" else None
    pairs = _compare(label, out_c, dx_c, torch.cat(outs, 0), dx_t, rows, list(range(n)), direction)
    return _plant(pairs, direction) if plant else pairs


def _padding(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, dx_c, up = _canonical(impl, case, direction)
    x = case.inputs["x"]
    b, s, e = x.shape
    gen = make_generator(case.seed + 99)
    junk = randn((b + 2, s + 5, e), gen, device=x.device)
    junk[1:b + 1, :s] = x
    inputs = {"x": junk, "cu_seqlens": cu_from_lengths([0] + _lengths(case) + [0], x.device)}
    out_t, dx_t = _run(impl, inputs, direction, up)
    label = "S + 5 junk rows, empty sequences first and last"
    pairs = [Pair(f"{label}: output", out_c, out_t)]
    if direction == "gradient":
        pairs.append(Pair(f"{label}: dx", dx_c, dx_t[1:b + 1, :s]))
        extra = torch.cat([dx_t[0].reshape(-1), dx_t[b + 1].reshape(-1), dx_t[:, s:].reshape(-1)])
        pairs.append(Pair(f"{label}: dx of added rows is 0", torch.zeros_like(extra), extra))
    return _plant(pairs, direction) if plant else pairs


def _layout(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, dx_c, up = _canonical(impl, case, direction)
    x = case.inputs["x"]
    b, s, e = x.shape
    wide = torch.full((b, s, e + 8), float("nan"), dtype=x.dtype, device=x.device)
    wide[..., :e] = x
    variants = [("row stride padded by 8", wide[..., :e]), ("x as a transposed [S, B, E] buffer",
                                                            x.transpose(0, 1).contiguous().transpose(0, 1))]
    pairs: list[Pair] = []
    for label, xv in variants:
        inputs = {"x": xv, "cu_seqlens": case.inputs["cu_seqlens"]}
        up_t = None
        if direction == "gradient":
            up_w = torch.full((up.shape[0], e + 8), float("nan"), dtype=up.dtype, device=up.device)
            up_w[:, :e] = up
            up_t = up_w[:, :e]
            label += "; upstream row stride padded by 8"
        out_t, dx_t = _run(impl, inputs, direction, up_t)
        pairs.append(Pair(f"{label}: output", out_c, out_t))
        if direction == "gradient":
            pairs.append(Pair(f"{label}: dx", dx_c, dx_t))
    return _plant(pairs, direction) if plant else pairs


SPEC = OpSpec(
    name="pack",
    summary="padded -> packed, x [B, S, E] bf16, cu_seqlens [B+1] int32 -> [T, E] bf16 (exact copies)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("x",),
    impls={
        "reference_fp32": pack_reference,
        "torch_bf16": pack_torch_bf16,
        "triton_cuda_bf16": pack_triton,
        "cuda_bf16": pack_cuda,
    },
    transforms={
        "batch": _batch,
        "chunk": _chunk,
        "padding": _padding,
        "layout": _layout,
        "tp": "no reduction axis: tensor parallelism splits E-sized weights, never the token layout, "
              "and pack is an exact copy",
    },
)
