"""``rl-engine env [--json]``: the environment as the evidence records it."""

from __future__ import annotations

import json


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "env", "print the software/hardware environment and backend availability",
                ["rl-engine env", "rl-engine env --json > env.json"])
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from rl_engine import provenance
    from rl_engine.backends.registry import BACKENDS, availability
    from rl_engine.contract import load_contract

    info = provenance.collect(load_contract())
    info["backends"] = {b: {"available": availability(b)[0], "reason": availability(b)[1]} for b in BACKENDS}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"device:   {info['device']['name']} ({info['device']['kind']})")
    sw = info["software"]
    print(f"software: python {sw['python']}, torch {sw['torch']} (CUDA {sw['torch_cuda']}), triton {sw['triton']}")
    ha = sw["host_arithmetic"]
    libs = ", ".join(f"{b.get('name')} {b.get('version')} core type {b.get('core_type')} ({b.get('threads')} threads)"
                     for b in ha["blas"] if b.get("api") == "blas") or "none loaded"
    print(f"host:     numpy {sw['numpy']} BLAS {libs}; numpy SIMD {'/'.join(ha['numpy_simd_dispatch_in_use']) or 'baseline'}; "
          f"torch CPU {ha['torch_cpu_capability']}")
    if ha["variables"]:
        print("          " + " ".join(f"{k}={v}" for k, v in ha["variables"].items()))
    print(f"commit:   {info['git_commit']} dirty={info['git_dirty']}")
    print(f"contract: {info['contract']['contract_version']} ({info['contract']['path']})")
    for b, v in info["backends"].items():
        print(f"backend {b:18s} {'available' if v['available'] else 'unavailable'}: {v['reason']}")
    from rl_engine.backends.registry import backend_names

    print(f"plugin backends (adapters load on request): {', '.join(n for n in backend_names() if n not in BACKENDS)}")
    return 0
