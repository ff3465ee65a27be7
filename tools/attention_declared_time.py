"""The declared attention forms on the GPU at Qwen3-8B head shapes: bits across backends, and time.

``attention.cuda.FWD_FORMS["declared"]`` / ``BWD_FORMS["declared"]`` (``attention_tc.cu``) are the Triton
backend's attention with ``ROW_SUM_PINNED`` written out in CUDA (docs/declared-arithmetic.md,
"Attention"). For packed causal prefill (``--shapes`` B x L, 32 query heads, 8 KV heads, D = 128) this
prints, in one process:

* bits: the CUDA declared forms against the pinned Triton attention (output, ``lse``; dq, dk, dv under
  one upstream gradient), the number of differing elements per tensor (0 everywhere is the claim),
  and as the control the CUDA backend's own forms' output against the same (it must differ);
* time (``rl_engine.bench.timing``, L2 flushed per call): forward and forward + backward of the Triton
  attention (pin off and on), the CUDA attention in its own forms (``fma`` forward, ``tensor_cores``
  backward) and in the declared forms, and PyTorch's SDPA (flash, causal, the same tokens as B
  sequences of L) as the baseline;
* decode (``--decode`` B x context): the CUDA declared decode step against the pinned Triton decode
  (bits), against the CUDA declared prefill row of the same query (bits) and in the split decode form
  (``attention.cuda.DECLARED_DECODE_FORMS``, bits), and the decode step's time in both CUDA forms
  (the declared one as the walk and split) and on Triton, called through the op and (CUDA) its
  launcher replayed from a CUDA graph, which leaves out the host's time.

    python tools/attention_declared_time.py [--shapes 4x1024,2x8192] [--decode 1x1024,16x8192] [--rep-ms 50] [--out F.json]

``--out`` also writes every printed record as JSON (``tools/h200_issue33.sh`` passes it: ``DECLARED_ATTN_ARGS``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from rl_engine.bench.timing import time_fn
from rl_engine.ops.attention import cuda as attn_cuda
from rl_engine.ops.attention import triton as attn_triton
from rl_engine.ops.attention._checks import LaunchPlan
from rl_engine.ops.attention.api import attention_cuda, attention_decode_cuda, attention_decode_triton, attention_triton

H, HKV, D = 32, 8, 128
RECORDS: list[dict] = []
"""What was printed, as records for ``--out``."""


def _differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN compared by position)."""
    iv = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    nan = torch.isnan(a) & torch.isnan(b)
    return int(((a.view(iv) != b.view(iv)) & ~nan).sum())


def _forms(fwd: str, bwd: str) -> None:
    attn_cuda.set_fwd_form(fwd)
    attn_cuda.set_bwd_form(bwd)


def prefill(b: int, length: int, rep_ms: float) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(b * 100003 + length)
    t = b * length
    q, k, v, up = (torch.randn(t, hh, D, device=dev, generator=g).to(torch.bfloat16) for hh in (H, HKV, HKV, H))
    cu = torch.arange(0, t + 1, length, dtype=torch.int32, device=dev)
    scale = D ** -0.5
    plan = LaunchPlan(b, length, length)
    tag = f"{b}x{length}"

    def grads(fn):
        qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
        fn(qq, kk, vv, cu, cu, scale).backward(up)
        return qq.grad, kk.grad, vv.grad

    attn_triton.ROW_SUM_PINNED = True
    _forms("declared", "declared")
    with torch.no_grad():
        tr = attn_triton.attention_fwd(q, k, v, cu, cu, scale, plan)
        cu_ = attn_cuda.attention_fwd(q, k, v, cu, cu, scale, plan)
    diffs = [_differ(tr[0], cu_[0]), _differ(tr[1], cu_[1])]
    diffs += [_differ(x, y) for x, y in zip(grads(attention_triton), grads(attention_cuda))]
    _forms("fma", "tensor_cores")  # control: the CUDA backend's own forms must differ from Triton's
    with torch.no_grad():
        control = _differ(tr[0], attn_cuda.attention_fwd(q, k, v, cu, cu, scale, plan)[0])
    print(f"bits {tag}: differing elements out, lse, dq, dk, dv = {diffs}; control (own forms, out) {control}",
          flush=True)
    RECORDS.append({"kind": "bits", "shape": tag, "differing": dict(zip(("out", "lse", "dq", "dk", "dv"), diffs)),
                    "control_own_forms_out_differing": control})

    qs, ks, vs = (x.view(b, length, -1, D).transpose(1, 2) for x in (q, k, v))
    ks, vs = (x.repeat_interleave(H // HKV, dim=1) for x in (ks, vs))
    ups = up.view(b, length, H, D).transpose(1, 2)
    rows = []

    def timed(label, fwd_fn, setup=None):
        qq, kk, vv = (x.clone().requires_grad_(True) for x in ((qs, ks, vs) if label == "sdpa" else (q, k, v)))
        upstream = ups if label == "sdpa" else up

        def fwd():
            if setup:
                setup()
            with torch.no_grad():
                fwd_fn(qq, kk, vv)

        def fwd_bwd():
            if setup:
                setup()
            qq.grad = kk.grad = vv.grad = None
            fwd_fn(qq, kk, vv).backward(upstream)

        f, fb = (time_fn(fn, warmup_ms=25.0, rep_ms=rep_ms).median_ms for fn in (fwd, fwd_bwd))
        rows.append((label, f, fb))
        RECORDS.append({"kind": "time", "shape": tag, "impl": label, "forward_ms": f, "forward_backward_ms": fb})
        print(f"time {tag} {label}: forward {f:.3f} ms, forward+backward {fb:.3f} ms", flush=True)

    timed("sdpa", lambda a, bb, c: F.scaled_dot_product_attention(a, bb, c, is_causal=True, scale=scale))
    for pinned in (False, True):
        timed(f"triton{' pinned' if pinned else ''}", lambda a, bb, c: attention_triton(a, bb, c, cu, cu, scale),
              setup=lambda p=pinned: setattr(attn_triton, "ROW_SUM_PINNED", p))
    for fwd_form, bwd_form in (("fma", "tensor_cores"), ("declared", "declared")):
        timed(f"cuda {fwd_form}/{bwd_form}", lambda a, bb, c: attention_cuda(a, bb, c, cu, cu, scale),
              setup=lambda f=fwd_form, w=bwd_form: _forms(f, w))
    base = rows[0]
    for label, f, fb in rows[1:]:
        print(f"ratio {tag} {label} vs sdpa: forward {base[1] / f:.2f}x, forward+backward {base[2] / fb:.2f}x")


def decode(b: int, context: int, rep_ms: float) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(b * 7919 + context)
    kc, vc = (torch.randn(b, context, HKV, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(b, H, D, device=dev, generator=g).to(torch.bfloat16)
    seqlens = torch.full((b,), context, dtype=torch.int32, device=dev)
    scale = D ** -0.5
    tag = f"{b}x{context}"
    attn_triton.ROW_SUM_PINNED = True
    _forms("declared", "declared")
    with torch.no_grad():
        tr = attention_decode_triton(q, kc, vc, seqlens, scale)
        cd = attention_decode_cuda(q, kc, vc, seqlens, scale)
        # the last query as a prefill row of sequence 0 (its keys are the cache's)
        cu_q = torch.tensor([0, 1], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, context], dtype=torch.int32, device=dev)
        row = attention_cuda(q[:1], kc[0], vc[0], cu_q, cu_k, scale)
    vs_triton, vs_prefill = _differ(tr, cd), _differ(row[0], cd[0])
    print(f"bits decode {tag}: differing vs triton {vs_triton}, vs the cuda prefill row {vs_prefill}", flush=True)
    RECORDS.append({"kind": "decode_bits", "shape": tag, "vs_triton": vs_triton, "vs_cuda_prefill_row": vs_prefill})
    attn_cuda.set_declared_decode_form("split")
    with torch.no_grad():
        n = _differ(attention_decode_cuda(q, kc, vc, seqlens, scale), cd)
    attn_cuda.set_declared_decode_form("auto")
    print(f"bits decode {tag}: split step differing vs the walk {n}", flush=True)
    RECORDS.append({"kind": "decode_split_bits", "shape": tag, "differing": n})

    def declared(form):
        return lambda: (_forms("declared", "declared"), attn_cuda.set_declared_decode_form(form))

    for label, fn, setup in (("triton pinned", attention_decode_triton, None),
                             ("cuda fma", attention_decode_cuda, lambda: _forms("fma", "tensor_cores")),
                             ("cuda declared split", attention_decode_cuda, declared("split")),
                             ("cuda declared", attention_decode_cuda, declared("auto"))):
        if setup:
            setup()

        def step(fn=fn):
            with torch.no_grad():
                fn(q, kc, vc, seqlens, scale)

        ms = time_fn(step, warmup_ms=25.0, rep_ms=rep_ms).median_ms
        gms = float("nan")
        if fn is attention_decode_cuda:  # the launcher itself (no host reads) replayed from a CUDA graph

            def launch():
                with torch.no_grad():
                    attn_cuda.attention_decode_fwd(q, kc, vc, seqlens, scale)

            launch()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launch()
            gms = time_fn(graph.replay, warmup_ms=25.0, rep_ms=rep_ms).median_ms
        print(f"time decode {tag} {label}: {ms * 1000:.1f} us, graph replay {gms * 1000:.1f} us", flush=True)
        RECORDS.append({"kind": "decode_time", "shape": tag, "impl": label, "us": ms * 1000, "graph_us": gms * 1000})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x1024,2x8192")
    ap.add_argument("--decode", default="1x1024,16x8192")
    ap.add_argument("--rep-ms", type=float, default=50.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    old = attn_cuda.set_fwd_form("fma"), attn_cuda.set_bwd_form("tensor_cores"), attn_triton.ROW_SUM_PINNED
    try:
        for s in filter(None, args.shapes.split(",")):
            b, length = (int(x) for x in s.split("x"))
            prefill(b, length, args.rep_ms)
        for s in filter(None, args.decode.split(",")):
            b, context = (int(x) for x in s.split("x"))
            decode(b, context, args.rep_ms)
    finally:
        attn_cuda.set_fwd_form(old[0])
        attn_cuda.set_bwd_form(old[1])
        attn_triton.ROW_SUM_PINNED = old[2]
        attn_cuda.set_declared_decode_form("auto")
        if args.out is not None:
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": RECORDS}, indent=1))


if __name__ == "__main__":
    main()
