"""Sweep the launch settings of the Triton linear_logp kernels on a GPU (issue #33).

Qwen3-8B head shapes (E = 4096, V = 151936), T tokens. ``--fwd-configs`` are ``ROWSxWARPSxSTAGES`` of
the forward partial kernel (the rows of a logits tile; BLOCK_V, BLOCK_E and CHUNK_V are declared and
never vary); ``--bwd-configs`` are ``ROWSxCOLSxWARPSxSTAGES`` of the two backward GEMMs' output tiles
(``GRAD_TILE``; the reduction step GRAD_BLOCK never varies). A trailing ``t`` loads the logits tiles
(forward partials, backward dlogits recompute) through TMA descriptors, ``p`` through pointer loads,
neither as the op chooses (``use_tma``). Each configuration's logprobs (forward)
or dhidden and dweight (backward) must equal the module defaults' bits; times with
``triton.testing.do_bench`` beside the unfused PyTorch path on the same values (BF16 ``hidden @
weight.T`` upcast to FP32, ``log_softmax``, gather; its backward through autograd). Usage::

    python tools/linear_logp_sweep.py --tokens 4096,8192 --out linear_logp_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.rstrip("tp").split("x"))


def _tma(text: str) -> bool | None:
    """The logits loads a configuration asks for: True (``...t``), False (``...p``), None (default)."""
    return True if text.endswith("t") else False if text.endswith("p") else None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two tensors of one dtype (FP32 or BF16), NaN payloads included."""
    bits = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="4096,8192")
    p.add_argument("--fwd-configs", default="64x4x3,128x8x3,128x8x2,64x8x3")
    p.add_argument("--bwd-configs", default="128x128x8x3,64x64x4x3,128x128x8x4,128x64x4x3")
    p.add_argument("--out", default="linear_logp_sweep.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.linear_logp import triton as ll

    e, v = 4096, 151936
    rows = []
    g = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn((v, e), generator=g, device="cuda") * e ** -0.5).to(torch.bfloat16)
    for t in (int(x) for x in args.tokens.split(",")):
        h = torch.randn((t, e), generator=g, device="cuda").to(torch.bfloat16)
        tg = torch.randint(0, v, (t,), generator=g, device="cuda")
        up = torch.randn((t,), generator=g, device="cuda")
        hl, wl = h.detach().requires_grad_(True), w.detach().requires_grad_(True)

        def unfused():
            return torch.log_softmax((hl @ wl.t()).float(), -1).gather(-1, tg[:, None])[:, 0]

        base_fwd = float(do_bench(lambda: unfused().detach()))
        lp = unfused()
        base_bwd = float(do_bench(lambda: torch.autograd.grad(lp, (hl, wl), up, retain_graph=True)))
        del lp
        out, rmax, rlog = ll.linear_logp_fwd(h, w, tg, 1.0)
        ref_bwd = ll.linear_logp_bwd(h, w, tg, up, rmax, rlog, 1.0, True, True)
        passes = (
            ("forward", args.fwd_configs, base_fwd, (out, rmax, rlog),
             lambda cfg: ll.linear_logp_fwd(h, w, tg, 1.0, fwd_launch=_ints(cfg), tma=_tma(cfg))),
            ("backward", args.bwd_configs, base_bwd, ref_bwd,
             lambda cfg: ll.linear_logp_bwd(h, w, tg, up, rmax, rlog, 1.0, True, True, grad_tile=_ints(cfg),
                                            tma=_tma(cfg))),
        )
        for name, configs, base_ms, ref, run in passes:
            line = [f"T{t} {name} (unfused {base_ms:.2f} ms):"]
            for cfg in configs.split(","):
                row = {"T": t, "pass": name, "config": cfg}
                try:
                    same = all(_same_bits(a, b) for a, b in zip(run(cfg), ref))
                    ms = float(do_bench(lambda cfg=cfg: run(cfg)))
                    row.update(ms=ms, unfused_ms=base_ms, ratio=ms / base_ms, bits_equal=bool(same))
                    line.append(f"{cfg}={ms:.2f}ms{'' if same else '!BITS'}")
                except Exception as exc:  # a configuration that does not compile (shared memory)
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    line.append(f"{cfg}=err")
                rows.append(row)
            print(" ".join(line), flush=True)
        del hl, wl
        torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump({"tool": "tools/linear_logp_sweep.py", "argv": sys.argv[1:],
                       "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 1 if any(r.get("bits_equal") is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
