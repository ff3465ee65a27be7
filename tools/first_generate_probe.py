"""Diagnostic (issue #36): the first graph ``generate`` of a fresh process, per backend, preset and
environment variant, each case in its own Python process.

Usage: ``python3 tools/first_generate_probe.py [--presets tiny,qwen3-8b] [--backends triton_cuda_bf16,cuda_bf16]
[--variants default,eager-loading,thread-local] [--repeat N]``. Prints one line per case (OK with the
first tokens, or the exception's last line) and writes every child's output under ``$OUT/probe/`` when
``OUT`` is set. Variants: ``default`` (the process as a user starts it), ``eager-loading``
(``CUDA_MODULE_LOADING=EAGER``: every kernel module loaded at start, none lazily during a capture),
``legacy-capture`` (the capture procedure of 18fc501: one warm-up call, then torch's own capture
stream), ``thread-local`` (``torch.cuda.graph`` patched to ``capture_error_mode="thread_local"``: a call from
another thread no longer invalidates the capture).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys, time, traceback, torch
variant, preset, backend = sys.argv[1:4]
if variant == "legacy-capture":  # the capture of 18fc501: one warm-up call, torch's own capture stream
    import rl_engine.graphs as _g
    def _legacy(step, *, after_warmup=None, device=None, warmup_calls=1):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.no_grad():
            with torch.cuda.stream(side):
                step()
            current.wait_stream(side)
            if after_warmup is not None:
                after_warmup()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    out = step()
            except RuntimeError as exc:
                raise _g.GraphCaptureError(str(exc).splitlines()[0]) from exc
        return graph, out
    _g.capture = _legacy
if variant == "thread-local":
    _graph = torch.cuda.graph
    class _TL(_graph):
        def __init__(self, *a, **k):
            k["capture_error_mode"] = "thread_local"
            super().__init__(*a, **k)
    torch.cuda.graph = _TL
from rl_engine.chain.config import get_config
from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.weights import synthetic_weights
from rl_engine.rollout import generate
t0 = time.perf_counter()
model = Qwen3Model(synthetic_weights(get_config(preset), 0, logit_scale=2.0, device="cuda"), backend)
print(f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
for call in range(2):
    t0 = time.perf_counter()
    try:
        res = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8)
        print(f"call {call}: OK {time.perf_counter() - t0:.1f} s graphs {res.cuda_graph} fallback {res.graph_fallback} "
              f"tokens {res.completions[0].tokens.tolist()[:4]}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        print(f"call {call}: FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,qwen3-8b")
    ap.add_argument("--backends", default="triton_cuda_bf16,cuda_bf16")
    ap.add_argument("--variants", default="default,legacy-capture,eager-loading,thread-local")
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per case")
    args = ap.parse_args()
    out = Path(os.environ["OUT"]) / "probe" if os.environ.get("OUT") else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for variant in args.variants.split(","):
        for preset in args.presets.split(","):
            for backend in args.backends.split(","):
                for r in range(args.repeat):
                    env = dict(os.environ)
                    if variant == "eager-loading":
                        env["CUDA_MODULE_LOADING"] = "EAGER"
                    t0 = time.perf_counter()
                    p = subprocess.run([sys.executable, "-c", CHILD, variant, preset, backend], env=env,
                                       capture_output=True, text=True, timeout=400)
                    text = p.stdout + p.stderr
                    calls = [ln for ln in text.splitlines() if ln.startswith("call ")]
                    print(f"{variant:13s} {preset:9s} {backend:17s} #{r} rc={p.returncode} "
                          f"{time.perf_counter() - t0:5.1f} s | " + " | ".join(calls or text.splitlines()[-1:]), flush=True)
                    if out:
                        (out / f"{variant}-{preset}-{backend}-{r}.log").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
