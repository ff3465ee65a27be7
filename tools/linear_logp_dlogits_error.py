"""How much accuracy the linear_logp backward would lose with dlogits rounded to BF16 once (issue #33).

The Triton and CUDA linear_logp backward keep ``dlogits`` as a BF16 pair ``hi + lo`` (about 16
significant bits), which costs two extra GEMM-equivalents; the unfused PyTorch path rounds it to
BF16 once. Before a contract version declares the cheaper form, this measures, on the gate's own
qwen3-8b gradient cases (``rl_engine.ops.linear_logp.spec``, seeds as the gate draws them), the
``max_abs_error`` of dhidden and dweight against the FP32 reference for

- ``fp32``: FP32 dlogits, products summed in FP32, the gradient rounded to BF16 once (what any
  form can at best reach: the output rounding alone);
- ``hi_lo``: dlogits as ``bf16(d) + bf16(d - bf16(d))`` (the shipped kernels' operands);
- ``bf16``: dlogits rounded to BF16 once (the candidate);

next to the contract's gradient tolerance for the op. The GEMMs run in FP32 on the host (TF32 off),
so this isolates the operand rounding, not any kernel's summation order. CPU is enough (about
3 minutes and 12 GiB at the qwen3-8b shapes). Usage::

    python tools/linear_logp_dlogits_error.py [--workload qwen3-8b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    from rl_engine.contract import load_contract
    from rl_engine.ops.execute import make_upstream
    from rl_engine.ops.registry import get_spec
    from rl_engine.ops.spec import get_workload

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="qwen3-8b")
    p.add_argument("--seed", type=int, default=0, help="the gate's seed (its gradient cases use seed + 500)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    contract = load_contract()
    tol = contract.tolerance("gradient", contract.op_class("linear_logp"))
    spec = get_spec("linear_logp")
    rows = []
    for case in spec.build_grad_cases(get_workload(args.workload), args.seed + 500, torch.device("cpu")):
        h = case.inputs["hidden"].float()
        w = case.inputs["weight"].float()
        tgt = case.inputs["targets"]
        temp = float(case.inputs["temperature"])
        g = make_upstream((torch.empty(h.shape[0]),), case.seed + 1000)[0].float()
        with torch.no_grad():
            logits = (h @ w.T) / temp
            p_ = torch.softmax(logits, dim=-1)
            del logits
            p_.neg_()
            p_[torch.arange(h.shape[0]), tgt] += 1.0
            d = p_.mul_(g[:, None] / temp)  # dlogits = g * (onehot - p) / T, FP32
            ref_dh, ref_dw = d @ w, d.T @ h
            hi = d.to(torch.bfloat16).float()
            forms = {"fp32": d, "hi_lo": hi + (d - hi).to(torch.bfloat16).float(), "bf16": hi}
            row = {"case": case.id, "atol": tol.atol, "rtol": tol.rtol}
            for name, dl in forms.items():
                dh = (dl @ w).to(torch.bfloat16).float()
                dw = (dl.T @ h).to(torch.bfloat16).float()
                row[name] = {"dhidden": float((dh - ref_dh).abs().max()), "dweight": float((dw - ref_dw).abs().max())}
                print(f"{case.id} {name:6s} max_abs_error dhidden {row[name]['dhidden']:.6f} "
                      f"dweight {row[name]['dweight']:.6f} (atol {tol.atol})", flush=True)
            row["max_abs_reference"] = {"dhidden": float(ref_dh.abs().max()), "dweight": float(ref_dw.abs().max())}
            rows.append(row)
            del d, hi, forms, ref_dh, ref_dw
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
