"""``rl-engine compare A B --mode bitwise|accuracy``: judge your own tensor dumps.

B is the reference side in accuracy mode (WS1 §4.1 puts the reference on the right).
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare two saved tensors (.pt, .npy, .safetensors)")
    p.add_argument("a", help="candidate tensor file (A)")
    p.add_argument("b", help="reference (accuracy) or canonical (bitwise) tensor file (B)")
    p.add_argument("--mode", choices=("bitwise", "accuracy"), required=True)
    p.add_argument("--op-class", default="elementwise", choices=("elementwise", "reduction", "attention", "logprob"),
                   help="contract row for accuracy mode (default: elementwise)")
    p.add_argument("--direction", default="forward", choices=("forward", "gradient"))
    p.add_argument("--dtype-row", default=None, help="contract dtype row (default: the candidate's dtype)")
    p.add_argument("--key", default=None, help="tensor name inside a multi-tensor file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from rl_engine.cli.io import load_tensor
    from rl_engine.contract import load_contract
    from rl_engine.errors import InputError
    from rl_engine.gate.compare import compare_accuracy, compare_bitwise

    contract = load_contract()
    a, b = load_tensor(args.a, args.key), load_tensor(args.b, args.key)
    if tuple(a.shape) != tuple(b.shape):
        raise InputError(f"shapes differ: {args.a} is {list(a.shape)}, {args.b} is {list(b.shape)}")
    if args.mode == "bitwise" and a.dtype != b.dtype:
        raise InputError(f"dtypes differ: {args.a} is {a.dtype}, {args.b} is {b.dtype}; a bitwise comparison needs one dtype")
    if a.numel() == 0:
        raise InputError(f"nothing to compare: {args.a} and {args.b} hold 0 elements")
    if args.mode == "bitwise":
        rep = compare_bitwise("A", a, b, contract.nan_policy)  # bits shown as A then B
    else:
        if not a.is_floating_point() or not b.is_floating_point():
            raise InputError("accuracy mode needs floating-point tensors")
        row = args.dtype_row or {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}.get(str(a.dtype), "float32")
        rep = compare_accuracy("A", a, b, contract.tolerance(args.direction, args.op_class, row))
    if args.json:
        print(json.dumps(rep.as_dict(), indent=1, default=str))
    else:
        print(rep.summary())
        if args.mode == "bitwise":
            print(f"nan_policy: {contract.nan_policy} (contract {contract.version})", file=sys.stderr)
    return 0 if rep.passed else 1
