"""Spec of attention: causal varlen GQA attention plus its KV-cache decode form.

Attention is not row-wise (a query row reads every earlier key of its sequence), so the invariance
transforms are written here instead of using ``rowwise_transforms``. Each one rebuilds the call in
another shape and compares, bit for bit, the rows that must not change:

* ``batch``   - each sequence alone, and all sequences in reversed order (other neighbours), vs
                 the same sequences inside the canonical varlen batch (gradient: dq, dk, dv);
* ``chunk``   - the last sequence's queries in chunks of odd sizes against the growing key prefix
                 (chunked prefill, ``Lq < Lk``), then its last queries as decode steps through
                 ``attention_decode`` (one at a time, and batched), vs the full call (``docs/pitfalls.md`` P8;
                 gradient: dq of the chunks);
* ``padding`` - zero-length sequences inserted around and between the sequences; q/k/v as slices
                 of larger NaN-filled buffers; decode against a KV cache with NaN junk past
                 ``cache_seqlens`` plus an entry with ``cache_seqlens = 0`` (exact zeros, P10)
                 (gradient: zero-length sequences, dq, dk, dv);
* ``layout``  - q, k, v as strided views of one fused ``[T, H + 2 Hkv, D]`` buffer (decode: a
                 fused ``[B, S_max, 2 Hkv, D]`` cache) vs contiguous tensors (gradient: the fused
                 buffer's gradient slices);
* ``tp``      - N/A (see the reason string).

``plant=True`` plants one ulp (:func:`plant_ulp`) on the transformed side of the first pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_engine.ops.attention.op import (
    attention_cuda,
    attention_decode_cuda,
    attention_decode_triton,
    attention_triton,
    attention_triton_size_dependent_kv_block,
)
from rl_engine.ops.attention.reference import attention_decode_reference, attention_reference
from rl_engine.ops.attention.torch_bf16 import attention_decode_torch_bf16, attention_torch_bf16
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.spec import Case, OpSpec, Pair, Workload, make_generator, randn
from rl_engine.ops.transforms import plant_ulp

GRAD_INPUTS = ("q", "k", "v")

DECODE_IMPLS: dict[str, Callable[..., torch.Tensor]] = {
    "reference_fp32": attention_decode_reference,
    "torch_bf16": attention_decode_torch_bf16,
    "triton_cuda_bf16": attention_decode_triton,
    "cuda_bf16": attention_decode_cuda,
}
"""Backend name -> ``attention_decode(q, k_cache, v_cache, cache_seqlens, scale)``."""

_DECODE_OF: dict[Callable[..., Any], Callable[..., torch.Tensor]] = {
    attention_reference: attention_decode_reference,
    attention_torch_bf16: attention_decode_torch_bf16,
    attention_triton: attention_decode_triton,
    attention_cuda: attention_decode_cuda,
}

_GRAD_SEQ_LENS = {"qwen3-8b": (1, 255, 771)}
"""Sequence lengths of the gradient case per workload (default: the workload's ``seq_lens``)."""


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
def _cu(lens: Sequence[int], device: torch.device | str) -> torch.Tensor:
    vals = [0]
    for n in lens:
        vals.append(vals[-1] + int(n))
    return torch.tensor(vals, dtype=torch.int32, device=device)


def _lens(cu: torch.Tensor) -> list[int]:
    vals = [int(x) for x in cu.tolist()]
    return [vals[i + 1] - vals[i] for i in range(len(vals) - 1)]


def make_case(w: Workload, seed: int, device: torch.device | str, lens_k: Sequence[int],
              lens_q: Sequence[int] | None = None) -> Case:
    """One varlen case: seeded BF16 q [Tq, H, D], k/v [Tk, Hkv, D]; Qwen3 scale ``D ** -0.5``."""
    lens_q = tuple(lens_k if lens_q is None else lens_q)
    lens_k = tuple(lens_k)
    g = make_generator(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = randn((tq, w.heads, w.head_dim), g, device=device)
    k = randn((tk, w.kv_heads, w.head_dim), g, device=device)
    v = randn((tk, w.kv_heads, w.head_dim), g, device=device)
    shape = f"T{tq}" if lens_q == lens_k else f"Tq{tq}-Tk{tk}"
    cid = f"{shape}-B{len(lens_k)}-H{w.heads}-Hkv{w.kv_heads}-D{w.head_dim}"
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": _cu(lens_q, device), "cu_seqlens_k": _cu(lens_k, device),
              "scale": float(w.head_dim) ** -0.5}
    return Case(id=cid, inputs=inputs, seed=seed)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    lens = w.seq_lens
    chunked = tuple((n + 2) // 3 for n in lens)  # a chunk of queries at the end of each sequence
    decode_step = tuple(min(n, 1) for n in lens)  # Lq = 1 per non-empty sequence
    return [
        make_case(w, seed, device, lens),
        make_case(w, seed + 1, device, lens, chunked),
        make_case(w, seed + 2, device, lens, decode_step),
    ]


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [make_case(w, seed, device, _GRAD_SEQ_LENS.get(w.name, w.seq_lens))]


# ---------------------------------------------------------------------------------------------
# Helpers for the transforms
# ---------------------------------------------------------------------------------------------
def decode_for(impl: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    """The decode entry matching a varlen implementation.

    Known backends map to their own decode function; any other varlen callable (a negative
    control) is driven as a decode step through itself: one ``Lq = 1`` sequence per cache entry.
    """
    if impl in _DECODE_OF:
        return _DECODE_OF[impl]

    def emulated(q, k_cache, v_cache, cache_seqlens, scale):
        lens = [int(n) for n in cache_seqlens.tolist()]
        live = [b for b, n in enumerate(lens) if n > 0]
        out = torch.zeros(tuple(q.shape), dtype=q.dtype, device=q.device)
        if not live:
            return out
        ks = torch.cat([k_cache[b, : lens[b]] for b in live], 0)
        vs = torch.cat([v_cache[b, : lens[b]] for b in live], 0)
        idx = torch.tensor(live, device=q.device)
        res = impl(q=q.index_select(0, idx).contiguous(), k=ks, v=vs, cu_seqlens_q=_cu([1] * len(live), q.device),
                   cu_seqlens_k=_cu([lens[b] for b in live], q.device), scale=scale)
        out[idx] = res
        return out

    return emulated


def _canonical(impl, case: Case, direction: str):
    """(out, grads or None, upstream or None) of the canonical call."""
    if direction == "forward":
        return run_forward(impl, case.inputs)[0], None, None
    probe = run_forward(impl, case.inputs)
    up = make_upstream(probe, case.seed + 7)
    outs, grads, used = run_gradient(impl, case.inputs, GRAD_INPUTS, upstream=up)
    return outs[0], grads, used[0]


def _regroup(case: Case, order: Sequence[int | None]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """A new varlen batch made of the canonical sequences listed in ``order`` (``None``: a
    zero-length sequence). Returns (inputs, q_rows, k_rows): the canonical rows of each new row."""
    inp = case.inputs
    dev = inp["q"].device
    cq = [int(x) for x in inp["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in inp["cu_seqlens_k"].tolist()]
    q_rows: list[int] = []
    k_rows: list[int] = []
    lq, lk = [], []
    for b in order:
        if b is None:
            lq.append(0)
            lk.append(0)
            continue
        q_rows += range(cq[b], cq[b + 1])
        k_rows += range(ck[b], ck[b + 1])
        lq.append(cq[b + 1] - cq[b])
        lk.append(ck[b + 1] - ck[b])
    qi = torch.tensor(q_rows, dtype=torch.long, device=dev)
    ki = torch.tensor(k_rows, dtype=torch.long, device=dev)
    new = dict(inp)
    new["q"] = inp["q"].index_select(0, qi).contiguous()
    new["k"] = inp["k"].index_select(0, ki).contiguous()
    new["v"] = inp["v"].index_select(0, ki).contiguous()
    new["cu_seqlens_q"] = _cu(lq, dev)
    new["cu_seqlens_k"] = _cu(lk, dev)
    return new, qi, ki


def _compare_regrouped(impl, case, direction, label, order, out_c, grads_c, up) -> list[Pair]:
    new, qi, ki = _regroup(case, order)
    if direction == "forward":
        out_t = run_forward(impl, new)[0]
        return [Pair(f"{label}: output", out_c.index_select(0, qi), out_t)]
    outs, grads, _ = run_gradient(impl, new, GRAD_INPUTS, upstream=(up.index_select(0, qi),))
    pairs = [Pair(f"{label}: output", out_c.index_select(0, qi), outs[0])]
    pairs.append(Pair(f"{label}: dq", grads_c["q"].index_select(0, qi), grads["q"]))
    pairs.append(Pair(f"{label}: dk", grads_c["k"].index_select(0, ki), grads["k"]))
    pairs.append(Pair(f"{label}: dv", grads_c["v"].index_select(0, ki), grads["v"]))
    return pairs


def _plant_first(pairs: list[Pair], plant: bool) -> list[Pair]:
    if not plant:
        return pairs
    for i, p in enumerate(pairs):
        if p.transformed.numel():
            pairs[i] = Pair(p.label + " (planted ulp)", p.canonical, plant_ulp(p.transformed))
            break
    return pairs


def _nonempty(case: Case) -> list[int]:
    return [b for b, n in enumerate(_lens(case.inputs["cu_seqlens_q"])) if n > 0]


def _odd_chunks(n: int) -> list[tuple[int, int]]:
    """Split ``[0, n)`` into chunks of odd, roughly doubling sizes 1, 3, 5, 11, 21, 43, ..."""
    bounds, start, size = [], 0, 1
    sizes = [1, 3, 5]
    while start < n:
        size = sizes[len(bounds)] if len(bounds) < len(sizes) else (2 * size) | 1
        bounds.append((start, min(n, start + size)))
        start += size
    return bounds


def _last_queries_cache(case: Case, seqs: Sequence[int], extra_slots: int, junk: float):
    """Decode inputs for the last query of each sequence in ``seqs``: q [B, H, D], a KV cache
    [B, S_max, Hkv, D] holding the sequence's keys with ``junk`` past them, cache_seqlens = Lk."""
    inp = case.inputs
    cq = [int(x) for x in inp["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in inp["cu_seqlens_k"].tolist()]
    lk = [ck[b + 1] - ck[b] for b in seqs]
    s_max = max(lk, default=0) + extra_slots
    _, h, d = inp["q"].shape
    hkv = inp["k"].shape[1]
    dev, dt = inp["q"].device, inp["q"].dtype
    kc = torch.full((len(seqs), s_max, hkv, d), junk, dtype=dt, device=dev)
    vc = torch.full((len(seqs), s_max, hkv, d), junk, dtype=dt, device=dev)
    rows = []
    for i, b in enumerate(seqs):
        kc[i, : lk[i]] = inp["k"][ck[b] : ck[b + 1]]
        vc[i, : lk[i]] = inp["v"][ck[b] : ck[b + 1]]
        rows.append(cq[b + 1] - 1)
    qi = torch.tensor(rows, dtype=torch.long, device=dev)
    q = inp["q"].index_select(0, qi).contiguous()
    return q, kc, vc, torch.tensor(lk, dtype=torch.int32, device=dev), qi


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------
def _batch(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, grads_c, up = _canonical(impl, case, direction)
    nb = len(_lens(case.inputs["cu_seqlens_q"]))
    pairs: list[Pair] = []
    for b in _nonempty(case):
        pairs += _compare_regrouped(impl, case, direction, f"sequence {b} alone", [b], out_c, grads_c, up)
    pairs += _compare_regrouped(impl, case, direction, "sequences in reversed order",
                                list(range(nb - 1, -1, -1)), out_c, grads_c, up)
    return _plant_first(pairs, plant)


def _chunk(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, grads_c, up = _canonical(impl, case, direction)
    seqs = _nonempty(case)
    if not seqs:
        return []
    b = seqs[-1]
    inp = case.inputs
    cq = [int(x) for x in inp["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in inp["cu_seqlens_k"].tolist()]
    lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
    off = lk - lq
    dev = inp["q"].device
    n_dec = min(8, lq // 2) if direction == "forward" else 0
    pairs: list[Pair] = []
    label = f"sequence {b} (Lq={lq}, Lk={lk})"
    # Chunked prefill: queries [a, e) of the sequence against keys [0, off + e).
    for a, e in _odd_chunks(lq - n_dec):
        chunk = dict(inp)
        chunk["q"] = inp["q"][cq[b] + a : cq[b] + e].contiguous()
        chunk["k"] = inp["k"][ck[b] : ck[b] + off + e].contiguous()
        chunk["v"] = inp["v"][ck[b] : ck[b] + off + e].contiguous()
        chunk["cu_seqlens_q"] = _cu([e - a], dev)
        chunk["cu_seqlens_k"] = _cu([off + e], dev)
        rows = slice(cq[b] + a, cq[b] + e)
        tag = f"{label}: chunk queries [{a}, {e}) vs keys [0, {off + e})"
        if direction == "forward":
            pairs.append(Pair(f"{tag}: output", out_c[rows], run_forward(impl, chunk)[0]))
        else:
            outs, grads, _ = run_gradient(impl, chunk, ("q",), upstream=(up[rows],))
            pairs.append(Pair(f"{tag}: output", out_c[rows], outs[0]))
            pairs.append(Pair(f"{tag}: dq", grads_c["q"][rows], grads["q"]))
    if n_dec:
        # Decode steps: the cache holds all Lk keys of the sequence; cache_seqlens hides the future ones.
        decode = decode_for(impl)
        kc = inp["k"][ck[b] : ck[b + 1]].unsqueeze(0).contiguous()
        vc = inp["v"][ck[b] : ck[b + 1]].unsqueeze(0).contiguous()
        steps = list(range(lq - n_dec, lq))
        singles = []
        with torch.no_grad():
            for i in steps:
                q1 = inp["q"][cq[b] + i : cq[b] + i + 1].contiguous()
                o = decode(q1, kc, vc, torch.tensor([off + i + 1], dtype=torch.int32, device=dev), inp["scale"])
                singles.append(o)
                pairs.append(Pair(f"{label}: decode step, query {i} (cache_seqlens {off + i + 1})",
                                  out_c[cq[b] + i : cq[b] + i + 1], o))
            qs = inp["q"][cq[b] + steps[0] : cq[b] + lq].contiguous()
            lens = torch.tensor([off + i + 1 for i in steps], dtype=torch.int32, device=dev)
            batched = decode(qs, kc.expand(len(steps), -1, -1, -1), vc.expand(len(steps), -1, -1, -1), lens,
                             inp["scale"])
        pairs.append(Pair(f"{label}: {n_dec} decode steps batched in one attention_decode call",
                          out_c[cq[b] + steps[0] : cq[b] + lq], batched))
    return _plant_first(pairs, plant)


def _padding(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, grads_c, up = _canonical(impl, case, direction)
    nb = len(_lens(case.inputs["cu_seqlens_q"]))
    order: list[int | None] = [None]
    for b in range(nb):
        order += [b, None] if b % 2 == 0 else [b, None, None]
    pairs = _compare_regrouped(impl, case, direction, f"{order.count(None)} zero-length sequences inserted",
                               order, out_c, grads_c, up)
    if direction == "forward":
        inp = case.inputs
        # q/k/v as row slices of larger NaN-filled buffers (rows outside are never read).
        emb = dict(inp)
        for n, (left, right) in (("q", (3, 5)), ("k", (2, 7)), ("v", (4, 1))):
            x = inp[n]
            big = torch.full((left + x.shape[0] + right,) + tuple(x.shape[1:]), float("nan"), dtype=x.dtype,
                             device=x.device)
            big[left : left + x.shape[0]] = x
            emb[n] = big[left : left + x.shape[0]]
        pairs.append(Pair("q/k/v embedded in larger NaN-filled buffers: output", out_c, run_forward(impl, emb)[0]))
        # Decode against a KV cache with NaN junk past cache_seqlens, plus an empty cache entry.
        seqs = _nonempty(case)
        if seqs:
            q, kc, vc, lens, qi = _last_queries_cache(case, seqs, extra_slots=13, junk=float("nan"))
            q = torch.cat([q, q[:1]], 0)
            kc = torch.cat([kc, kc[:1]], 0)
            vc = torch.cat([vc, vc[:1]], 0)
            lens = torch.cat([lens, torch.zeros(1, dtype=torch.int32, device=lens.device)])
            with torch.no_grad():
                o = decode_for(impl)(q, kc, vc, lens, inp["scale"])
            pairs.append(Pair("decode of each sequence's last query, cache with NaN junk past cache_seqlens",
                              out_c.index_select(0, qi), o[:-1]))
            pairs.append(Pair("decode with cache_seqlens = 0 is exactly 0 (P10)", torch.zeros_like(o[-1:]), o[-1:]))
    return _plant_first(pairs, plant)


def _fused(case: Case) -> tuple[dict[str, Any], list[torch.Tensor], str]:
    """q, k, v as strided views of fused buffers. Returns (inputs, leaf buffers, description)."""
    inp = case.inputs
    q, k, v = inp["q"], inp["k"], inp["v"]
    h, hkv = q.shape[1], k.shape[1]
    new = dict(inp)
    if q.shape[0] == k.shape[0]:
        buf = torch.cat([q, k, v], dim=1).contiguous()  # [T, H + 2 Hkv, D]
        new["q"], new["k"], new["v"] = buf[:, :h], buf[:, h : h + hkv], buf[:, h + hkv :]
        return new, [buf], f"q, k, v as views of one fused [T, {h + 2 * hkv}, D] buffer"
    qbuf = torch.cat([q, q[:, :1]], dim=1).contiguous()  # [Tq, H + 1, D]
    kvbuf = torch.cat([k, v], dim=1).contiguous()  # [Tk, 2 Hkv, D]
    new["q"], new["k"], new["v"] = qbuf[:, :h], kvbuf[:, :hkv], kvbuf[:, hkv:]
    return new, [qbuf, kvbuf], "q a view of [Tq, H + 1, D]; k, v views of one fused [Tk, 2 Hkv, D] buffer"


def _layout(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    out_c, grads_c, up = _canonical(impl, case, direction)
    new, bufs, desc = _fused(case)
    h, hkv = case.inputs["q"].shape[1], case.inputs["k"].shape[1]
    pairs: list[Pair] = []
    if direction == "forward":
        pairs.append(Pair(f"{desc}: output", out_c, run_forward(impl, new)[0]))
        seqs = _nonempty(case)
        if seqs:
            q, kc, vc, lens, _ = _last_queries_cache(case, seqs, extra_slots=5, junk=0.0)
            decode = decode_for(impl)
            with torch.no_grad():
                o_c = decode(q, kc, vc, lens, case.inputs["scale"])
                cache = torch.cat([kc, vc], dim=2).contiguous()  # [B, S_max, 2 Hkv, D]
                qbuf = torch.cat([q, kc[:, 0], vc[:, 0]], dim=1).contiguous()  # [B, H + 2 Hkv, D]
                o_t = decode(qbuf[:, :h], cache[:, :, :hkv], cache[:, :, hkv:], lens, case.inputs["scale"])
            pairs.append(Pair("decode: q a view of [B, H + 2 Hkv, D], k/v cache views of one fused "
                              "[B, S_max, 2 Hkv, D] cache vs contiguous: output", o_c, o_t))
        return _plant_first(pairs, plant)
    leaves = [b.detach().clone().requires_grad_(True) for b in bufs]
    call = dict(new)
    if len(leaves) == 1:
        call["q"], call["k"], call["v"] = leaves[0][:, :h], leaves[0][:, h : h + hkv], leaves[0][:, h + hkv :]
    else:
        call["q"], call["k"], call["v"] = leaves[0][:, :h], leaves[1][:, :hkv], leaves[1][:, hkv:]
    with torch.enable_grad():
        out_t = impl(**call)
        torch.autograd.backward([out_t], [up])
    if len(leaves) == 1:
        g = leaves[0].grad
        dq, dk, dv = g[:, :h], g[:, h : h + hkv], g[:, h + hkv :]
    else:
        dq, dk, dv = leaves[0].grad[:, :h], leaves[1].grad[:, :hkv], leaves[1].grad[:, hkv:]
    pairs += [
        Pair(f"{desc}: output", out_c, out_t.detach()),
        Pair(f"{desc}: dq", grads_c["q"], dq.contiguous()),
        Pair(f"{desc}: dk", grads_c["k"], dk.contiguous()),
        Pair(f"{desc}: dv", grads_c["v"], dv.contiguous()),
    ]
    return _plant_first(pairs, plant)


SPEC = OpSpec(
    name="attention",
    summary="causal varlen GQA attention, q [Tq, H, D], k/v [Tk, Hkv, D] bf16 -> [Tq, H, D] bf16 "
    "(+ KV-cache decode entry attention_decode)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("out",),
    grad_inputs=GRAD_INPUTS,
    impls={
        "reference_fp32": attention_reference,
        "torch_bf16": attention_torch_bf16,
        "triton_cuda_bf16": attention_triton,
        "cuda_bf16": attention_cuda,
    },
    transforms={
        "batch": _batch,
        "chunk": _chunk,
        "padding": _padding,
        "layout": _layout,
        "tp": "N/A: attention is head-parallel under tensor parallelism; each rank computes whole heads "
        "(q heads and their KV group) with the same kernel, so no reduction is split across ranks "
        "(the o_proj split that follows is det_gemm's tp check)",
    },
    controls={"chunk": attention_triton_size_dependent_kv_block},
)
