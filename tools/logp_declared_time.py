"""Time ``logp`` and ``linear_logp`` with the declared log-sum-exp on and off (GPU, one run).

``rl_engine/ops/logp/declared.py`` switches both backends between their own sequences and the
declared one (docs/declared-arithmetic.md, "Log-probabilities"). This prints, for each backend, the
forward and the forward + backward time of ``logp`` at Qwen3-8B's vocabulary (V = 151936) for a
training batch (T = 8192) and a decode step (T = 64), each with the switch off and on, measured in
the same process (``rl_engine.bench.timing``, L2 flushed per call), and whether the two switch
settings gave the same bits (they must not, except by chance, for a backend whose sequence changed);
then the same for ``linear_logp`` at E = 4096 (``batch_invariant_logp`` runs ``logp``'s kernels).

    python tools/logp_declared_time.py [--tokens 8192,64] [--vocab 151936] [--hidden 4096] [--rep-ms 100]
"""

from __future__ import annotations

import argparse

import torch

from rl_engine.bench.timing import time_fn
from rl_engine.ops.logp import declared
from rl_engine.ops.linear_logp.api import linear_logp
from rl_engine.ops.logp.api import logp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192,64")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    print("backend, T, switch, forward ms, forward+backward ms")
    for t in (int(x) for x in args.tokens.split(",")):
        x = torch.randn(t, args.vocab, device=dev, generator=g) * 4.0
        tg = torch.randint(0, args.vocab, (t,), device=dev, generator=g)
        up = torch.randn(t, device=dev, generator=g)
        for backend in ("triton_cuda_bf16", "cuda_bf16"):
            outs = {}
            for on in (False, True):
                declared.DECLARED_LSE = on
                xr = x.clone().requires_grad_(True)

                def fwd():
                    with torch.no_grad():
                        return logp(x, tg, 0.9, backend=backend)

                def fwd_bwd():
                    xr.grad = None
                    logp(xr, tg, 0.9, backend=backend).backward(up)

                outs[on] = fwd()
                f, fb = (time_fn(fn, warmup_ms=25.0, rep_ms=args.rep_ms).median_ms for fn in (fwd, fwd_bwd))
                print(f"{backend}, {t}, {'declared' if on else 'own'}, {f:.3f}, {fb:.3f}", flush=True)
            same = torch.equal(outs[False].view(torch.int32), outs[True].view(torch.int32))
            print(f"{backend}, {t}: own and declared sequences {'gave the same bits' if same else 'differ'}")
    w = (torch.randn(args.vocab, args.hidden, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    print("linear_logp: backend, T, switch, forward ms, forward+backward ms")
    for t in (int(x) for x in args.tokens.split(",")):
        h = torch.randn(t, args.hidden, device=dev, generator=g).to(torch.bfloat16)
        tg = torch.randint(0, args.vocab, (t,), device=dev, generator=g)
        up = torch.randn(t, device=dev, generator=g)
        for backend in ("triton_cuda_bf16", "cuda_bf16"):
            for on in (False, True):
                declared.DECLARED_LSE = on
                hr = h.clone().requires_grad_(True)

                def lin_fwd():
                    with torch.no_grad():
                        return linear_logp(h, w, tg, 0.9, backend=backend)

                def lin_fwd_bwd():
                    hr.grad = None
                    linear_logp(hr, w, tg, 0.9, backend=backend).backward(up)

                f, fb = (time_fn(fn, warmup_ms=25.0, rep_ms=args.rep_ms).median_ms for fn in (lin_fwd, lin_fwd_bwd))
                print(f"{backend}, {t}, {'declared' if on else 'own'}, {f:.3f}, {fb:.3f}", flush=True)
    declared.DECLARED_LSE = False


if __name__ == "__main__":
    main()
