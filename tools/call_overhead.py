"""Wall time of one small op call: ``rms_norm`` at T = 1 and ``det_gemm`` at M = 1.

What a decode step pays per op is mostly the Python path around a tiny kernel (validation,
backend resolution, autograd plumbing, the launch itself). This script times single calls of
the public entry points on each kernel backend that can run here, next to ``torch_bf16`` (plain
PyTorch) measured in the same process, under ``torch.no_grad()`` (a decode step), and prints one
row per (op, backend): the
median and the 10th / 90th percentiles of ``repeats`` calls after ``warmup`` calls, each call
synchronised (``torch.cuda.synchronize`` on a GPU) so the row is the wall time of one call.

On a machine without a GPU the Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``
is set by this script when no GPU is present), whose kernel time dwarfs the Python overhead; the
numbers that matter are the H200's. Run it at two commits to compare: the script uses only the
public entry points (``rl_engine.ops.rms_norm.rms_norm``, ``rl_engine.ops.det_gemm.det_gemm``),
whose signatures did not change, and prints which ``rl_engine`` it imported.

``--stub-kernels`` replaces every Triton launch (``kernel[grid](...)``, through
``triton.runtime.jit.KernelInterface.__getitem__``) by a no-op, so the rows show the Python path
alone (validation, resolution, autograd and torch.library dispatch, output allocation) without
the kernel: that is what the CPU interpreter can measure honestly. The outputs are then
meaningless (uninitialised memory); only the time is.

Usage: ``python tools/call_overhead.py [--repeats N] [--warmup N] [--stub-kernels] [--json]`` (run from the tree to
measure; prepend ``PYTHONPATH=<tree>`` to measure another checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _time(fn, repeats: int, warmup: int, sync) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    q = lambda p: samples[min(len(samples) - 1, int(p * len(samples)))]  # noqa: E731
    return {"median_us": statistics.median(samples) * 1e6, "p10_us": q(0.1) * 1e6, "p90_us": q(0.9) * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hidden", type=int, default=None,
                   help="E of rms_norm and K = N of det_gemm (default 4096 = Qwen3-8B on a GPU, 256 on the CPU)")
    p.add_argument("--stub-kernels", action="store_true",
                   help="Triton launches do nothing: time the Python path alone (outputs are garbage)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import rl_engine

    if args.stub_kernels:
        from triton.runtime.jit import KernelInterface

        KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    from rl_engine.backends.registry import availability
    from rl_engine.ops.det_gemm import det_gemm
    from rl_engine.ops.rms_norm import rms_norm

    dev = torch.device("cuda" if gpu else "cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    e = args.hidden or (4096 if gpu else 256)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, e), generator=g).to(torch.bfloat16).to(dev)
    w = (1 + 0.25 * torch.randn((e,), generator=g)).to(torch.bfloat16).to(dev)
    a = torch.randn((1, e), generator=g).to(torch.bfloat16).to(dev)
    b = (torch.randn((e, e), generator=g) / e**0.5).to(torch.bfloat16).to(dev)

    calls = {
        "rms_norm T=1": lambda be: (lambda: rms_norm(x, w, 1e-6, backend=be)),
        "det_gemm M=1": lambda be: (lambda: det_gemm(a, b, backend=be)),
    }
    rows = []
    backends = ["torch_bf16"] + [be for be in ("triton_cuda_bf16", "cuda_bf16") if availability(be)[0]]
    for name, make in calls.items():
        for be in backends:
            fn = make(be)
            with torch.no_grad():
                stats = _time(fn, args.repeats, args.warmup, sync)
            rows.append({"call": name, "backend": be, "grad": False, **stats})
    base = {r["call"]: r["median_us"] for r in rows if r["backend"] == "torch_bf16"}
    for r in rows:
        r["x_torch_bf16"] = r["median_us"] / base[r["call"]]
    meta = {"rl_engine": rl_engine.__file__, "device": str(torch.cuda.get_device_name() if gpu else "cpu"),
            "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"), "hidden": e, "repeats": args.repeats,
            "stub_kernels": args.stub_kernels}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return
    print(f"# {meta}")
    print(f"{'call':<14} {'backend':<17} {'median us':>11} {'p10 us':>10} {'p90 us':>10} {'x torch_bf16':>13}")
    for r in rows:
        print(f"{r['call']:<14} {r['backend']:<17} {r['median_us']:>11.1f} {r['p10_us']:>10.1f} {r['p90_us']:>10.1f} "
              f"{r['x_torch_bf16']:>13.2f}")


if __name__ == "__main__":
    main()
