"""Fresh-process outputs for the ``repeat`` judgment.

``python -m rl_engine.gate.fresh --backend B --workload W --seed S --ops OP... --out FILE`` builds
each op's first case (the same seeded inputs the gate builds), runs forward and backward once in
this new process, and saves the results with ``torch.save`` (read back with
``weights_only=True``). The gate compares them bit for bit with its own two in-process runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch


def outputs_for(op: str, backend: str, workload_name: str, seed: int, device: torch.device,
                prebuilt: tuple[Any, Any] | None = None, *, to_cpu: bool = True) -> dict[str, torch.Tensor]:
    """Forward outputs of the op's first case and gradients of its first gradient case.

    ``prebuilt`` = (first case, first gradient case or None) already built from the same workload
    and seeds (the gate's own), to skip rebuilding every case of the op; a fresh process builds its
    own. ``to_cpu`` copies the results to the CPU (what a fresh process saves); the gate's own
    runs keep them on ``device`` and compare them there (an embedding or lm_head weight gradient
    at Qwen3-8B size is 1.2 GB: compared on the CPU, one repeat cell took 30-110 s on the H200).
    """
    from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
    from rl_engine.ops.registry import get_spec
    from rl_engine.ops.spec import get_workload

    from rl_engine.backends.registry import resolve_impl

    spec = get_spec(op)
    impl = spec.impls.get(backend) or resolve_impl(op, backend)
    case = prebuilt[0] if prebuilt is not None else spec.build_cases(get_workload(workload_name), seed, device)[0]
    result: dict[str, torch.Tensor] = {}
    for i, o in enumerate(run_forward(impl, case.inputs)):
        result[f"{op}.fwd.{i}"] = o.detach().cpu() if to_cpu else o.detach()
    if spec.grad_inputs and spec.build_grad_cases is not None and _has_backward(op, backend):
        gcase = prebuilt[1] if prebuilt is not None and prebuilt[1] is not None else \
            spec.build_grad_cases(get_workload(workload_name), seed + 500, device)[0]
        probe = run_forward(spec.impls["torch_bf16"], gcase.inputs)
        up = make_upstream(probe, gcase.seed + 1000)
        _, grads, _ = run_gradient(impl, gcase.inputs, spec.grad_inputs, upstream=up)
        for name, g in grads.items():
            result[f"{op}.bwd.d{name}"] = g.detach().cpu() if to_cpu else g.detach()
    return result


def _has_backward(op: str, backend: str) -> bool:
    from rl_engine.backends.registry import external_backend

    plugin = external_backend(backend)
    return plugin is None or op in plugin.backward


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rl_engine.gate.fresh")
    p.add_argument("--backend", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--ops", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--parent-pid", type=int, default=None,
                   help="the gate's pid: stop (exit 3) when it is gone, since nobody would read the result")
    args = p.parse_args(argv)
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    from rl_engine import env

    if not torch.cuda.is_available() and not env.triton_interpret():
        env.enable_triton_interpreter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    saved: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for op in args.ops:
        if os.getppid() != parent:  # the gate that launched us is gone: nobody will read the result
            return 3
        try:
            saved.update(outputs_for(op, args.backend, args.workload, args.seed, device))
        except Exception as exc:  # recorded per op; the gate turns it into a red cell
            errors[op] = f"{type(exc).__name__}: {exc}"
    torch.save({"tensors": saved, "errors": errors}, args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
