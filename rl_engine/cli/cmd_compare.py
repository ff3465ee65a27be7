"""``rl-engine compare A B --mode bitwise|accuracy``: judge your own tensor dumps.

B is the reference side in accuracy mode (WS1 §4.1 puts the reference on the right).
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "compare", "compare two saved tensors (.pt, .npy, .safetensors)", [
        "rl-engine compare mine.pt ref_fp32.pt --mode accuracy --op-class reduction",
        "rl-engine compare out_batched.safetensors out_alone.safetensors --mode bitwise --key y",
        "rl-engine compare dump.pt ref.npy --mode accuracy --key-a logits      # a key for A only",
        "rl-engine compare bits.npy ref.npy --mode accuracy --npy-bf16         # .npy of uint16 BF16 bits",
    ], description="Compare a candidate tensor A with B: the FP32 reference (accuracy mode, the reference on the "
                   "right as in WS1 section 4.1) or the canonical output (bitwise mode).")
    p.add_argument("a", help="candidate tensor file (A)")
    p.add_argument("b", help="reference (accuracy) or canonical (bitwise) tensor file (B)")
    p.add_argument("--mode", choices=("bitwise", "accuracy"), required=True,
                   help="bitwise: raw bits equal (nan_policy from the contract); accuracy: |A - B| <= atol + rtol*|B|")
    p.add_argument("--op-class", default="elementwise", choices=("elementwise", "reduction", "attention", "logprob"),
                   help="contract row for accuracy mode: elementwise, reduction, attention or logprob (default: elementwise)")
    p.add_argument("--direction", default="forward", choices=("forward", "gradient"),
                   help="contract row for accuracy mode: forward or gradient (default: forward)")
    p.add_argument("--dtype-row", default=None, choices=("bfloat16", "float16", "float32"),
                   help="contract dtype row: bfloat16, float16 or float32 (default: the candidate's dtype)")
    p.add_argument("--key", default=None, help="tensor name inside both multi-tensor files")
    p.add_argument("--key-a", default=None, help="tensor name inside A only (overrides --key for A)")
    p.add_argument("--key-b", default=None, help="tensor name inside B only (overrides --key for B)")
    p.add_argument("--npy-bf16", action="store_true",
                   help="a .npy input holds raw BF16 bits as uint16/int16 (NumPy has no bfloat16); reinterpret them")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from rl_engine.cli.io import load_tensor
    from rl_engine.contract import load_contract
    from rl_engine.errors import InputError
    from rl_engine.gate.compare import compare_accuracy, compare_bitwise

    contract = load_contract()
    key_a = args.key_a if args.key_a is not None else args.key
    key_b = args.key_b if args.key_b is not None else args.key
    a, b = load_tensor(args.a, key_a, args.npy_bf16), load_tensor(args.b, key_b, args.npy_bf16)
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
            hint = (" (a .npy of uint16 BF16 bits? pass --npy-bf16)"
                    if any(str(f).lower().endswith(".npy") for f in (args.a, args.b)) and not args.npy_bf16 else "")
            raise InputError(f"accuracy mode needs floating-point tensors: {args.a} is {a.dtype}, {args.b} is {b.dtype}{hint}")
        if torch_bits(a) > torch_bits(b):
            print(f"rl-engine compare: warning: the candidate A ({args.a}, {str(a.dtype).replace('torch.', '')}) is wider "
                  f"than the reference B ({args.b}, {str(b.dtype).replace('torch.', '')}); the reference goes second "
                  "(rl-engine compare CANDIDATE REFERENCE): were the files swapped?", file=sys.stderr)
        row = args.dtype_row or {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}.get(str(a.dtype), "float32")
        rep = compare_accuracy("A", a, b, contract.tolerance(args.direction, args.op_class, row))
    if args.json:
        print(json.dumps(rep.as_dict(), indent=1, default=str))
    else:
        print(rep.summary())
        if args.mode == "bitwise":
            print(f"nan_policy: {contract.nan_policy} (contract {contract.version})", file=sys.stderr)
    return 0 if rep.passed else 1


def torch_bits(t) -> int:
    """Bits of a floating dtype (its width in memory)."""
    import torch

    return torch.finfo(t.dtype).bits
