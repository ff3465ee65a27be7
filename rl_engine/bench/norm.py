"""Norm and elementwise benchmarks: rms_norm, rope, swiglu, silu (forward, Qwen3-8B sizes).

All are bandwidth-bound: the row value is GB/s of the counted bytes
(:mod:`rl_engine.bench.counts`), compared with the copy bandwidth measured in the same run
(targets rms_norm >= 0.85x, rope >= 0.8x, swiglu >= 0.95x; silu has none), with the eager
PyTorch BF16 code as Hugging Face runs it, and with Liger-Kernel where ``liger_kernel`` imports.

- rms_norm ``x [T, E]``, weight ``[E]``, ``order="hf"`` (the contract's declared order).
  Eager: ``Qwen3RMSNorm.forward``. Liger: ``LigerRMSNormFunction`` (offset 0, casting "llama").
- rope on q ``[T, H, D]`` and k ``[T, Hkv, D]`` (both, as in every attention layer) with FP32
  cos / sin ``[T, D/2]``. Ours: two calls. Eager: ``apply_rotary_pos_emb`` on ``[1, H, T, D]`` with
  the BF16 width-D tables Hugging Face builds once per forward (built outside the timing). Liger:
  ``liger_rotary_pos_emb`` on the same layout.
- swiglu ``gate, up [T, F]``. Eager: ``F.silu(gate) * up``. Liger: ``LigerSiLUMulFunction``.
- silu ``x [T, F]``. Eager: ``F.silu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rl_engine.bench import counts
from rl_engine.bench.common import Baseline, Case, kernel_impl, no_grad


def _liger(name: str):
    """A Liger-Kernel callable by short name (imported only when the baseline runs)."""
    if name == "rms_norm":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        return lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
    if name == "rope":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        return liger_rotary_pos_emb
    if name == "swiglu":
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerSiLUMulFunction.apply
    raise KeyError(name)


def _rms_norm_case(tokens: int) -> Case:
    def build(s, d, pool):
        return {"x": pool.randn("norm.x", (s["T"], s["E"]), scale=2.0),
                "w": pool.randn("norm.w", (s["E"],), scale=0.25, offset=1.0), "eps": d.rms_norm_eps}

    def ours(backend, st):
        impl = kernel_impl("rms_norm", backend)
        x, w, eps = st["x"], st["w"], st["eps"]
        return no_grad(lambda: impl(x=x, weight=w, eps=eps, order="hf"))

    def eager(st):
        x, w, eps = st["x"], st["w"], st["eps"]

        def hf():
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return w * h.to(x.dtype)

        return no_grad(hf)

    def liger(st):
        fn = _liger("rms_norm")
        x, w, eps = st["x"], st["w"], st["eps"]
        return no_grad(lambda: fn(x, w, eps))

    return Case(
        op="rms_norm", family="norm", kernel_op="rms_norm", variant="fwd hf", tokens=tokens, metric="GB/s",
        sizes=lambda d, t: {"T": t, "E": d.hidden}, label=lambda s: f"T{s['T']}-E{s['E']}",
        count=lambda s: (0, counts.rms_norm_bytes(s["T"], s["E"])), build=build, ours=ours,
        baselines=[Baseline("copy bandwidth", peak="copy", target="rms_norm", primary=True),
                   Baseline("eager PyTorch BF16 (HF Qwen3RMSNorm)", make=eager),
                   Baseline("Liger-Kernel RMSNorm", make=liger, requires="liger_kernel", needs_cuda=True)])


def _rope_case(tokens: int) -> Case:
    def build(s, d, pool):
        from rl_engine.ops.rope import cos_sin

        t, h, hkv, dd = s["T"], s["H"], s["Hkv"], s["D"]
        q = pool.randn("rope.q", (t, h, dd))
        k = pool.randn("rope.k", (t, hkv, dd))
        cos, sin = cos_sin(torch.arange(t, dtype=torch.int64, device=pool.device), d.rope_theta, dd)
        c = torch.cat((cos, cos), dim=-1).to(torch.bfloat16).unsqueeze(0)  # HF: [1, T, D] in the activation dtype
        sn = torch.cat((sin, sin), dim=-1).to(torch.bfloat16).unsqueeze(0)
        return {"q": q, "k": k, "cos": cos, "sin": sin, "c": c, "s": sn,
                "q4": q.transpose(0, 1).unsqueeze(0).contiguous(), "k4": k.transpose(0, 1).unsqueeze(0).contiguous()}

    def ours(backend, st):
        impl = kernel_impl("rope", backend)
        q, k, cos, sin = st["q"], st["k"], st["cos"], st["sin"]
        return no_grad(lambda: (impl(x=q, cos=cos, sin=sin), impl(x=k, cos=cos, sin=sin)))

    def eager(st):
        q4, k4 = st["q4"], st["k4"]
        c, sn = st["c"].unsqueeze(1), st["s"].unsqueeze(1)  # [1, 1, T, D], HF unsqueeze_dim=1

        def rotate_half(x):
            half = x.shape[-1] // 2
            return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

        return no_grad(lambda: ((q4 * c) + (rotate_half(q4) * sn), (k4 * c) + (rotate_half(k4) * sn)))

    def liger(st):
        fn = _liger("rope")
        q4, k4, c, sn = st["q4"], st["k4"], st["c"], st["s"]
        return no_grad(lambda: fn(q4, k4, c, sn))

    return Case(
        op="rope", family="norm", kernel_op="rope", variant="fwd q+k", tokens=tokens, metric="GB/s",
        sizes=lambda d, t: {"T": t, "H": d.heads, "Hkv": d.kv_heads, "D": d.head_dim},
        label=lambda s: f"T{s['T']}-H{s['H']}+{s['Hkv']}-D{s['D']}",
        count=lambda s: (0, counts.rope_bytes(s["T"], s["H"], s["Hkv"], s["D"])), build=build, ours=ours,
        baselines=[Baseline("copy bandwidth", peak="copy", target="rope", primary=True),
                   Baseline("eager PyTorch BF16 (HF apply_rotary_pos_emb)", make=eager),
                   Baseline("Liger-Kernel RoPE", make=liger, requires="liger_kernel", needs_cuda=True)])


def _swiglu_case(tokens: int) -> Case:
    def build(s, d, pool):
        return {"g": pool.randn("mlp.gate", (s["T"], s["F"]), scale=2.0), "u": pool.randn("mlp.up", (s["T"], s["F"]))}

    def ours(backend, st):
        impl = kernel_impl("swiglu", backend)
        g, u = st["g"], st["u"]
        return no_grad(lambda: impl(gate=g, up=u))

    def eager(st):
        g, u = st["g"], st["u"]
        return no_grad(lambda: F.silu(g) * u)

    def liger(st):
        fn = _liger("swiglu")
        g, u = st["g"], st["u"]
        return no_grad(lambda: fn(g, u))

    return Case(
        op="swiglu", family="norm", kernel_op="swiglu", variant="fwd", tokens=tokens, metric="GB/s",
        sizes=lambda d, t: {"T": t, "F": d.ffn}, label=lambda s: f"T{s['T']}-F{s['F']}",
        count=lambda s: (0, counts.swiglu_bytes(s["T"], s["F"])), build=build, ours=ours,
        baselines=[Baseline("copy bandwidth", peak="copy", target="swiglu", primary=True),
                   Baseline("eager PyTorch BF16 (F.silu(gate) * up)", make=eager),
                   Baseline("Liger-Kernel SwiGLU", make=liger, requires="liger_kernel", needs_cuda=True)])


def _silu_case(tokens: int) -> Case:
    def build(s, d, pool):
        return {"x": pool.randn("mlp.gate", (s["T"], s["F"]), scale=2.0)}

    def ours(backend, st):
        impl = kernel_impl("silu", backend)
        x = st["x"]
        return no_grad(lambda: impl(x=x))

    def eager(st):
        x = st["x"]
        return no_grad(lambda: F.silu(x))

    return Case(
        op="silu", family="norm", kernel_op="silu", variant="fwd", tokens=tokens, metric="GB/s",
        sizes=lambda d, t: {"T": t, "F": d.ffn}, label=lambda s: f"T{s['T']}-F{s['F']}",
        count=lambda s: (0, counts.silu_bytes(s["T"], s["F"])), build=build, ours=ours,
        baselines=[Baseline("copy bandwidth", peak="copy", primary=True),
                   Baseline("eager PyTorch BF16 (F.silu)", make=eager)])


_BUILDERS = {"rms_norm": _rms_norm_case, "rope": _rope_case, "swiglu": _swiglu_case, "silu": _silu_case}
OPS = tuple(_BUILDERS)


def cases(op: str, tokens: list[int], quick: bool) -> list[Case]:
    return [_BUILDERS[op](t) for t in tokens]
