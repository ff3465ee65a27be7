"""GEMM benchmarks: ``det_gemm`` at the Qwen3-8B projection shapes and ``lm_head``.

det_gemm ``a [M, K] @ b [K, N]`` with M = the token count, at four projection shapes:
``q_proj/o_proj`` (K = E, N = H * D), ``kv_proj`` (K = E, N = Hkv * D), ``gate/up_proj``
(K = E, N = F) and ``down_proj`` (K = F, N = E), with the operands laid out as the model passes
them: the forward product ``x [M, K] @ W^T`` takes ``b = W.t()`` of a row-major weight ``W [N, K]``.
Prefill (M > 16) also times the two backward products of a training step on the same views
(variants ``<proj>:dx``, ``dx [M, K] = dy [M, N] @ W``, and ``<proj>:dw``,
``dW [N, K] = dy.t() @ x``, the weight gradient as the op's backward computes it; both ``2 M N K`` FLOPs): TFLOP/s against ``torch.matmul`` (cuBLAS) on
the same views, target ``det_gemm.prefill`` for M >= 1024. Decode (M <= 16, forward only): GB/s of
the operands and result against the copy bandwidth (target >= 0.7x), plus cuBLAS's GB/s.

lm_head ``hidden [T, E] @ weight[V, E]^T`` -> FP32 logits: against ``torch.matmul`` (cuBLAS, BF16
out) followed by ``.float()``, the Hugging Face path to FP32 logits; no target in :mod:`rl_engine.bench.targets`.
"""

from __future__ import annotations

from rl_engine.bench import counts
from rl_engine.bench.common import Baseline, Case, Dims, kernel_impl, no_grad

PROJECTIONS = {
    "q_proj/o_proj": lambda d: (d.hidden, d.heads * d.head_dim),
    "kv_proj": lambda d: (d.hidden, d.kv_heads * d.head_dim),
    "gate/up_proj": lambda d: (d.hidden, d.ffn),
    "down_proj": lambda d: (d.ffn, d.hidden),
}
QUICK_PROJECTIONS = ("q_proj/o_proj", "gate/up_proj", "down_proj")
DECODE_MAX_TOKENS = 16
"""Token counts up to this are decode shapes (bandwidth-bound; the decode target's "M <= 16")."""


PRODUCTS = ("forward", "dx", "dw")
"""The products of a training step timed at prefill sizes (module docstring)."""


def _det_gemm_case(proj: str, tokens: int, product: str = "forward") -> Case:
    decode = tokens <= DECODE_MAX_TOKENS

    def sizes(d: Dims, t: int) -> dict[str, int]:
        k, n = PROJECTIONS[proj](d)
        return {"M": t, "K": k, "N": n}

    def build(s, d, pool):
        x = pool.randn(f"det_gemm.a.{proj}", (s["M"], s["K"]))
        w = pool.randn(f"det_gemm.w.{proj}", (s["N"], s["K"]), scale=s["K"] ** -0.5)
        if product == "forward":
            return {"a": x, "b": w.t()}
        dy = pool.randn(f"det_gemm.dy.{proj}", (s["M"], s["N"]))
        return {"a": dy, "b": w} if product == "dx" else {"a": dy.t(), "b": x}

    def ours(backend, st):
        impl = kernel_impl("det_gemm", backend)
        a, b = st["a"], st["b"]
        return no_grad(lambda: impl(a=a, b=b))

    def cublas(st):
        a, b = st["a"], st["b"]
        return no_grad(lambda: a @ b)

    if decode:
        baselines = [Baseline("copy bandwidth", peak="copy", target="det_gemm.decode", primary=True),
                     Baseline("torch.matmul (cuBLAS)", make=cublas)]
    else:
        baselines = [Baseline("torch.matmul (cuBLAS)", make=cublas, target="det_gemm.prefill", primary=True)]
    return Case(
        op="det_gemm", family="gemm", kernel_op="det_gemm",
        variant=proj if product == "forward" else f"{proj}:{product}", tokens=tokens,
        metric="GB/s" if decode else "TFLOP/s", sizes=sizes,
        label=lambda s: f"M{s['M']}-K{s['K']}-N{s['N']}",
        count=lambda s: (counts.gemm_flops(s["M"], s["N"], s["K"]), counts.gemm_bytes(s["M"], s["N"], s["K"])),
        build=build, ours=ours, baselines=baselines)


def _lm_head_case(tokens: int) -> Case:
    decode = tokens <= DECODE_MAX_TOKENS

    def build(s, d, pool):
        return {"hidden": pool.randn("hidden", (s["T"], s["E"])),
                "weight": pool.randn("lm_head.weight", (s["V"], s["E"]), scale=s["E"] ** -0.5)}

    def ours(backend, st):
        impl = kernel_impl("lm_head", backend)
        h, w = st["hidden"], st["weight"]
        return no_grad(lambda: impl(hidden=h, weight=w))

    def hf(st):
        h, w = st["hidden"], st["weight"]
        return no_grad(lambda: (h @ w.t()).float())

    return Case(
        op="lm_head", family="gemm", kernel_op="lm_head", variant="fwd", tokens=tokens,
        metric="GB/s" if decode else "TFLOP/s",
        sizes=lambda d, t: {"T": t, "E": d.hidden, "V": d.vocab},
        label=lambda s: f"T{s['T']}-E{s['E']}-V{s['V']}",
        count=lambda s: (counts.lm_head_flops(s["T"], s["E"], s["V"]), counts.lm_head_bytes(s["T"], s["E"], s["V"])),
        build=build, ours=ours,
        baselines=[Baseline("torch.matmul (cuBLAS) + .float()", make=hf, primary=True)])


def cases(op: str, tokens: list[int], quick: bool) -> list[Case]:
    if op == "det_gemm":
        projs = QUICK_PROJECTIONS if quick else tuple(PROJECTIONS)
        return [_det_gemm_case(p, t, prod) for p in projs for t in tokens
                for prod in (PRODUCTS if t > DECODE_MAX_TOKENS else ("forward",))]
    if op == "lm_head":
        return [_lm_head_case(t) for t in tokens]
    raise KeyError(op)


OPS = ("det_gemm", "lm_head")
