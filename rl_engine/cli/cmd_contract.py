"""``rl-engine contract [--json] [--path FILE]``: validate and print the contract."""

from __future__ import annotations

import json


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "contract", "validate and print the tolerance contract",
                ["rl-engine contract", "rl-engine contract --path my-contract.json --json"])
    p.add_argument("--json", action="store_true", help="print the whole contract as JSON")
    p.add_argument("--path", default=None, help="a contract file to validate (default: the shipped ws1-c1-v8)")
    p.set_defaults(func=run)


def run(args) -> int:
    from rl_engine.contract import load_contract

    c = load_contract(args.path)
    if args.json:
        print(json.dumps({**c.data, "_sha256": c.sha256, "_path": str(c.path)}, indent=1))
        return 0
    print(f"{c.version} (supersedes {c.data['supersedes']}) — {c.path}")
    print(f"sha256 {c.sha256}")
    for direction in ("forward", "gradient"):
        print(f"\n{direction} accuracy (BF16 atol / rtol; FP32 atol / rtol):")
        for cls in ("elementwise", "reduction", "logprob", "attention"):
            b, f = c.tolerance(direction, cls, "bfloat16"), c.tolerance(direction, cls, "float32")
            print(f"  {cls:12s} {b.atol:g} / {b.rtol:g}    {f.atol:g} / {f.rtol:g}")
    rc = c.data["relative_criterion"]
    print(f"\nrelative criterion: {rc['forward_factor']}x forward, {rc['backward_factor']}x backward vs {rc['baseline_backend']}")
    print(f"invariance: {c.data['invariance']['mode']}, nan_policy {c.nan_policy}")
    print("chain metrics:")
    for name in c.chain_metric_names():
        m = c.chain_metric(name)
        print(f"  {name:15s} <= {m['threshold']:g} ({m['status']}, {m['decision']})")
    print(f"  clip_interval {list(c.clip_interval)} (policy interval, not a tolerance)")
    d = c.det_gemm
    print(f"det_gemm: Option {d['option']}, FP32 leaves, {d['merge_dtype']} merges, tree depth {d['tree_depth']}, splits {d['supported_splits']}")
    print(f"RMSNorm order: {c.rms_norm_order}; logits for scoring: {c.logits_dtype}")
    print(f"required backends: {', '.join(c.required_backends())}")
    cb = c.cross_backend
    print(f"cross_backend ({cb.other} vs {cb.anchor}, bitwise): declared bit-exact {', '.join(cb.declared)}; "
          f"n/a until declared: {', '.join(cb.not_declared)}; chain {'declared' if cb.chain_declared else 'n/a until declared'}")
    return 0
