"""``rl-engine audit [--json] [--root DIR]``: the WS1 §9.1-style conformance table, from checks."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "audit", "run the conformance checks and print the §9.1-style table",
                ["rl-engine audit", "rl-engine audit --static-only --json"])
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--root", default=None, help="checkout to scan (default: the one holding this package)")
    p.add_argument("--static-only", action="store_true", help="only the source scans (no code executed)")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from rl_engine import env

    if not torch.cuda.is_available() and not env.triton_interpret():
        env.enable_triton_interpreter()
    from rl_engine.audit import run_audit
    from rl_engine.contract import load_contract

    rows = run_audit(Path(args.root) if args.root else None, execute=not args.static_only, contract=load_contract())
    ok = all(r.status == "conformant" for r in rows)
    if args.json:
        print(json.dumps({"conformant": ok, "rows": [r.as_dict() for r in rows]}, indent=1))
    else:
        print("| component | status | basis |")
        print("|---|---|---|")
        for r in rows:
            basis = "; ".join(r.basis[:4]) + (f"; +{len(r.basis) - 4} more" if len(r.basis) > 4 else "")
            print(f"| {r.component} | {r.status} | {basis} |")
        for r in rows:
            for f in r.findings:
                print(f"FINDING [{r.component}]: {f}")
    return 0 if ok else 1
