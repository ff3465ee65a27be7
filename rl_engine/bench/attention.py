"""Attention benchmarks: causal prefill forward, prefill forward + backward, KV-cache decode.

Prefill: one causal sequence of T tokens (T > 16), q ``[T, H, D]``, k / v ``[T, Hkv, D]``
(Qwen3-8B: H = 32, Hkv = 8, D = 128), against ``F.scaled_dot_product_attention`` forced to the
flash backend (``is_causal=True``, ``enable_gqa=True``, inputs pre-laid-out as ``[1, H, T, D]``).
TFLOP/s from the exact causal pair count (:func:`rl_engine.bench.counts.causal_pairs`). Targets
(``rl_engine/bench/targets.py``): forward >= 0.8x SDPA flash and forward + backward >= 0.7x, for 2k-8k
tokens.

Decode: B sequences (B = the token count, B <= 128), each one query against a full cache of
``Dims.decode_context`` keys (4096), k / v cache ``[B, L, Hkv, D]``. GB/s of the bytes that must
be read (q, the K/V cache, cache_seqlens) and written, against the copy bandwidth (target >= 0.6x),
plus SDPA (flash) decode on ``[B, Hkv, L, D]`` caches for comparison.

Prefill is timed through the op's entry point with the varlen plan (``check_varlen``: cu_seqlens read
to the host and checked) built once outside the timed call and passed back with ``plan=``, as the
model's teacher forcing does for its layers; a plain call reads cu_seqlens_q and cu_seqlens_k on every
call (two device-to-host synchronisations, 0.09 ms of a 0.25 ms call at 2048 tokens on an H100,
``evidence/2026-12-08-h100-chain-7958a76/``). Decode is timed through the validating entry point (it
reads ``cache_seqlens``, a device-to-host sync per call); that cost is part of its rows.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from rl_engine.bench import counts
from rl_engine.bench.common import Baseline, Case, Dims, grads_of, kernel_impl, leaf, no_grad
from rl_engine.ops.attention._checks import check_varlen

PREFILL_MIN_TOKENS = 17
DECODE_MAX_BATCH = 128


def _flash_context(device: torch.device):
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _sdpa_fn(device: torch.device, call, expanded=None):
    """``call`` (SDPA with ``enable_gqa=True``) under the flash backend. If flash refuses GQA,
    ``expanded()`` gives a callable on K/V pre-expanded to H heads (built here, outside the
    timing) under flash; if flash refuses that too, SDPA's default dispatch. Each fallback is
    named in the row's note, so a row never silently compares with a different kernel."""
    if device.type != "cuda":
        return call, "no GPU: SDPA's default CPU dispatch (dry run)"

    def under_flash(fn):
        def run():
            with _flash_context(device):
                return fn()

        return run

    first = None
    for fn, note in ((call, None), (expanded, "flash refused enable_gqa: K/V expanded to H heads outside the timing")):
        if fn is None:
            continue
        fn = fn() if note else fn
        try:
            under_flash(fn)()
            return under_flash(fn), note
        except RuntimeError as exc:
            first = first or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return call, f"flash backend refused these inputs ({first}); SDPA default dispatch"


def _expand_kv(k4: torch.Tensor, v4: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, Hkv, L, D]`` -> ``[B, H, L, D]`` (query head h uses KV head h // (H / Hkv)), contiguous."""
    group = heads // k4.shape[1]
    return k4.repeat_interleave(group, dim=1).contiguous(), v4.repeat_interleave(group, dim=1).contiguous()


def _prefill_sizes(d: Dims, t: int) -> dict[str, int]:
    return {"T": t, "H": d.heads, "Hkv": d.kv_heads, "D": d.head_dim}


def _prefill_label(s) -> str:
    return f"T{s['T']}-H{s['H']}-Hkv{s['Hkv']}-D{s['D']}-causal"


def _prefill_build(s, d, pool):
    t, h, hkv, dd = s["T"], s["H"], s["Hkv"], s["D"]
    q = pool.randn("attn.q", (t, h, dd))
    k = pool.randn("attn.k", (t, hkv, dd))
    v = pool.randn("attn.v", (t, hkv, dd))
    do = pool.randn("attn.do", (t, h, dd))
    cu = torch.tensor([0, t], dtype=torch.int32, device=pool.device)
    return {"q": q, "k": k, "v": v, "do": do, "cu": cu, "scale": dd ** -0.5,
            "q4": q.transpose(0, 1).unsqueeze(0).contiguous(), "k4": k.transpose(0, 1).unsqueeze(0).contiguous(),
            "v4": v.transpose(0, 1).unsqueeze(0).contiguous(), "do4": do.transpose(0, 1).unsqueeze(0).contiguous()}


def _prefill_case(tokens: int, backward: bool) -> Case:
    def ours(backend, st):
        # the varlen plan once, outside the timed call (the module docstring says why)
        impl = kernel_impl("attention", backend)
        cu, scale = st["cu"], st["scale"]
        plan = check_varlen(st["q"], st["k"], st["v"], cu, cu, scale, dtype=torch.bfloat16, kernel=True)
        if not backward:
            q, k, v = st["q"], st["k"], st["v"]
            return no_grad(lambda: impl(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scale, plan=plan))
        q, k, v = leaf(st["q"]), leaf(st["k"]), leaf(st["v"])
        return grads_of(lambda: impl(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scale, plan=plan),
                        (q, k, v), st["do"])

    def sdpa_call(q4, k4, v4, do4, scale, gqa):
        if not backward:
            return no_grad(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale,
                                                                  enable_gqa=gqa))
        q4, k4, v4 = leaf(q4), leaf(k4), leaf(v4)
        return grads_of(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale,
                                                               enable_gqa=gqa), (q4, k4, v4), do4)

    def sdpa(st):
        args = (st["q4"], st["k4"], st["v4"], st["do4"], st["scale"])
        expanded = lambda: sdpa_call(st["q4"], *_expand_kv(st["k4"], st["v4"], st["q4"].shape[1]),  # noqa: E731
                                     st["do4"], st["scale"], False)
        return _sdpa_fn(st["q"].device, sdpa_call(*args, True), expanded)

    def count(s):
        pairs = counts.causal_pairs(s["T"], s["T"])
        return (counts.attention_flops(pairs, s["H"], s["D"], backward=backward),
                counts.attention_prefill_bytes(s["T"], s["H"], s["Hkv"], s["D"], backward=backward))

    return Case(
        op="attention_fwd_bwd" if backward else "attention_fwd", family="attention", kernel_op="attention",
        variant="prefill fwd+bwd" if backward else "prefill fwd", tokens=tokens, metric="TFLOP/s",
        sizes=_prefill_sizes, label=_prefill_label, count=count, build=_prefill_build, ours=ours,
        baselines=[Baseline("F.scaled_dot_product_attention (flash)", make=sdpa,
                            target="attention.fwd_bwd" if backward else "attention.fwd", primary=True)])


def _decode_case(batch: int) -> Case:
    def sizes(d: Dims, b: int) -> dict[str, int]:
        return {"B": b, "L": d.decode_context, "H": d.heads, "Hkv": d.kv_heads, "D": d.head_dim}

    def build(s, d, pool):
        b, length, h, hkv, dd = s["B"], s["L"], s["H"], s["Hkv"], s["D"]
        q = pool.randn("dec.q", (b, h, dd))
        kc = pool.randn("dec.k", (b, length, hkv, dd))
        vc = pool.randn("dec.v", (b, length, hkv, dd))
        return {"q": q, "k": kc, "v": vc, "lens": torch.full((b,), length, dtype=torch.int32, device=pool.device),
                "scale": dd ** -0.5, "q4": q.unsqueeze(2).contiguous(),
                "k4": kc.transpose(1, 2).contiguous(), "v4": vc.transpose(1, 2).contiguous()}

    def ours(backend, st):
        from rl_engine.errors import BackendUnavailable
        from rl_engine.ops.attention.spec import DECODE_IMPLS

        if backend not in DECODE_IMPLS:
            raise BackendUnavailable(f"attention_decode has no {backend} implementation")
        impl = DECODE_IMPLS[backend]
        q, kc, vc, lens, scale = st["q"], st["k"], st["v"], st["lens"], st["scale"]
        return no_grad(lambda: impl(q=q, k_cache=kc, v_cache=vc, cache_seqlens=lens, scale=scale))

    def sdpa(st):
        q4, k4, v4, scale = st["q4"], st["k4"], st["v4"], st["scale"]
        call = no_grad(lambda: F.scaled_dot_product_attention(q4, k4, v4, scale=scale, enable_gqa=True))

        def expanded():
            ke, ve = _expand_kv(k4, v4, q4.shape[1])
            return no_grad(lambda: F.scaled_dot_product_attention(q4, ke, ve, scale=scale))

        return _sdpa_fn(st["q"].device, call, expanded)

    return Case(
        op="attention_decode", family="attention", kernel_op="attention", variant="decode", tokens=batch,
        metric="GB/s", sizes=sizes, label=lambda s: f"B{s['B']}-L{s['L']}-H{s['H']}-Hkv{s['Hkv']}-D{s['D']}",
        count=lambda s: (counts.attention_decode_flops(s["B"], s["L"], s["H"], s["D"]),
                         counts.attention_decode_bytes(s["B"], s["L"], s["H"], s["Hkv"], s["D"])),
        build=build, ours=ours,
        baselines=[Baseline("copy bandwidth", peak="copy", target="attention.decode", primary=True),
                   Baseline("F.scaled_dot_product_attention (flash)", make=sdpa)])


def cases(op: str, tokens: list[int], quick: bool) -> list[Case]:
    if op == "attention_fwd":
        return [_prefill_case(t, backward=False) for t in tokens if t >= PREFILL_MIN_TOKENS]
    if op == "attention_fwd_bwd":
        return [_prefill_case(t, backward=True) for t in tokens if t >= PREFILL_MIN_TOKENS]
    if op == "attention_decode":
        return [_decode_case(t) for t in tokens if t <= DECODE_MAX_BATCH]
    raise KeyError(op)


OPS = ("attention_fwd", "attention_fwd_bwd", "attention_decode")
