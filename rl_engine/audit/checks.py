"""The audit checks. Each returns an :class:`AuditRow` whose ``basis`` points at ``file:line``.

The checks that compare the code with the contract receive the contract from :func:`run_audit`
(which the gate and ``rl-engine audit`` call with the contract they loaded); none loads it.

A row is ``conformant`` only when its check ran and found nothing; the table can therefore never
claim more than the code does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_engine.constants import OPS
from rl_engine.audit import scan
from rl_engine.contract import Contract

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
CONFORMANT, NONCONFORMANT = "conformant", "non-conformant"


@dataclass
class AuditRow:
    component: str
    status: str
    basis: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _where(obj: Any, root: Path) -> str:
    try:
        src = Path(inspect.getsourcefile(obj))
        line = inspect.getsourcelines(obj)[1]
        return f"{_rel(src, root)}:{line}"
    except (TypeError, OSError):
        return repr(obj)


def check_tf32_dots(root: Path) -> AuditRow:
    findings, basis, total = [], [], 0
    for path in scan.python_files(root):
        src = path.read_text()
        lines = scan.dot_lines(src, _rel(path, root))
        total += len(lines)
        basis += [f"{_rel(path, root)}:{line}" for line in lines]
        findings += [f"{f}:{line}: {msg}" for f, line, msg in scan.unsafe_dots(src, _rel(path, root))]
    status = CONFORMANT if not findings else NONCONFORMANT
    return AuditRow(f"every tl.dot has input_precision='ieee' ({total} found)", status, basis, findings)


def check_fp_contraction(root: Path, contract: Contract) -> AuditRow:
    """The contract's FP contraction policy, checked from the code: every Triton launch passes
    ``enable_fp_fusion=FP_FUSION``, ``FP_FUSION`` equals the contract, and the CUDA flags carry
    ``-fmad=false`` exactly when the contract says ``nvcc_fmad = false``."""
    from rl_engine.backends.cuda_build import NVCC_FLAGS
    from rl_engine.ops._triton_common import FP_FUSION

    c = contract
    findings, basis, total = [], [], 0
    sources = {path: path.read_text() for path in scan.python_files(root)}
    kernels = set().union(*(scan.jit_kernel_names(src, _rel(p, root)) for p, src in sources.items()))
    for path, src in sources.items():
        n, found = scan.launches_without_fp_fusion(src, _rel(path, root), kernels)
        if n:
            basis.append(f"{_rel(path, root)}: {n} launches")
        total += n
        findings += [f"{f}:{line}: {msg}" for f, line, msg in found]
    if FP_FUSION != c.triton_fp_fusion:
        findings.append(f"rl_engine/ops/_triton_common.py FP_FUSION={FP_FUSION} != contract triton_enable_fp_fusion={c.triton_fp_fusion}")
    want = "-fmad=true" if c.nvcc_fmad else "-fmad=false"
    basis.append(f"rl_engine/backends/cuda_build.py NVCC_FLAGS has {[f for f in NVCC_FLAGS if f.startswith('-fmad')]}")
    if want not in NVCC_FLAGS or any(f.startswith("-fmad") and f != want for f in NVCC_FLAGS):
        findings.append(f"CUDA flags {[f for f in NVCC_FLAGS if f.startswith('-fmad')]} do not match the contract's {want}")
    if any("use_fast_math" in f for f in NVCC_FLAGS):
        findings.append("CUDA flags use --use_fast_math (contracts FMAs and approximates division)")
    status = CONFORMANT if not findings else NONCONFORMANT
    return AuditRow(f"FP contraction as the contract declares: every Triton launch states enable_fp_fusion "
                    f"({total} launches), nvcc {want}", status, basis, findings)


def check_reference_guard(root: Path) -> AuditRow:
    """Run every reference (forward and backward, smoke shapes) with TF32 switched ON globally and
    every PyTorch matmul entry point wrapped: a matmul that runs while TF32 is allowed is a finding,
    named by the file and line that called it."""
    import traceback

    import torch.nn.functional as F

    from rl_engine.ops.execute import run_forward, run_gradient, upcast_inputs

    hits: list[str] = []
    calls = [0]
    targets = [(torch, "matmul"), (torch, "mm"), (torch, "bmm"), (torch, "einsum"), (F, "linear"),
               (torch.Tensor, "__matmul__"), (torch.Tensor, "matmul"), (torch.Tensor, "mm"), (torch.Tensor, "bmm")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets]

    def wrap(original, label):
        def wrapper(*a, **k):
            calls[0] += 1
            if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
                frame = traceback.extract_stack(limit=2)[0]  # the direct caller
                hits.append(f"{_rel(Path(frame.filename), root)}:{frame.lineno}: {label} ran with TF32 allowed")
            return original(*a, **k)
        return wrapper

    prev = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())

    def fn(spec, w):
        case = spec.build_cases(w, 0, torch.device("cpu"))[0]
        run_forward(spec.impls["reference_fp32"], upcast_inputs(case.inputs))
        if spec.grad_inputs and spec.build_grad_cases is not None:
            gcase = spec.build_grad_cases(w, 0, torch.device("cpu"))[0]
            run_gradient(spec.impls["reference_fp32"], upcast_inputs(gcase.inputs), spec.grad_inputs)
        return []

    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
        for obj, name, original in saved:
            setattr(obj, name, wrap(original, name))
        findings, basis = _run_specs(fn, root)
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)
        torch.backends.cuda.matmul.allow_tf32 = prev[0]
        torch.set_float32_matmul_precision(prev[1])
    findings += sorted(set(hits))
    basis = [f"{calls[0]} matmul calls traced while TF32 was enabled globally ({len(set(hits))} ran with TF32 allowed)"] + basis
    return AuditRow("no reference matmul can run in TF32 (references executed with TF32 enabled globally)",
                    CONFORMANT if not findings else NONCONFORMANT, basis, findings)


def check_tolerance_literals(root: Path) -> AuditRow:
    findings = []
    files = list(scan.python_files(root, ("rl_engine", "tests")))
    for path in files:
        findings += [f"{f}:{line}: {msg}" for f, line, msg in scan.tolerance_literals(path.read_text(), _rel(path, root))]
    status = CONFORMANT if not findings else NONCONFORMANT
    return AuditRow("no tolerance literal outside the contract", status, [f"{len(files)} files scanned"], findings)


def _run_specs(fn: Callable[[Any, Any], list[str]], root: Path) -> tuple[list[str], list[str]]:
    from rl_engine.ops.registry import get_spec
    from rl_engine.ops.spec import WORKLOADS

    findings, basis = [], []
    w = WORKLOADS["smoke"]
    for op in OPS:
        try:
            spec = get_spec(op)
        except Exception as exc:
            findings.append(f"{op}: spec not importable: {type(exc).__name__}: {exc}")
            continue
        try:
            findings += fn(spec, w)
        except Exception as exc:
            findings.append(f"{op}: check raised {type(exc).__name__}: {exc}")
        basis.append(_where(spec.impls.get("reference_fp32"), root) if spec.impls.get("reference_fp32") else op)
    return findings, basis


def check_reference_dtypes(root: Path) -> AuditRow:
    from rl_engine.ops.execute import run_forward, run_gradient, upcast_inputs

    def fn(spec, w):
        out = []
        case = spec.build_cases(w, 0, torch.device("cpu"))[0]
        for i, r in enumerate(run_forward(spec.impls["reference_fp32"], upcast_inputs(case.inputs))):
            if r.is_floating_point() and r.dtype != torch.float32:
                out.append(f"{spec.name}: reference output {i} is {r.dtype}")
        if spec.grad_inputs and spec.build_grad_cases is not None:
            gcase = spec.build_grad_cases(w, 0, torch.device("cpu"))[0]
            _, grads, _ = run_gradient(spec.impls["reference_fp32"], upcast_inputs(gcase.inputs), spec.grad_inputs)
            out += [f"{spec.name}: reference gradient d{n} is {g.dtype}" for n, g in grads.items() if g.dtype != torch.float32]
        return out

    findings, basis = _run_specs(fn, root)
    return AuditRow("every FP32 reference returns FP32 outputs and gradients (executed at smoke shapes)",
                    CONFORMANT if not findings else NONCONFORMANT, basis, findings)


def check_logprob_dtypes(root: Path, backends: list[str], contract: Contract) -> AuditRow:
    from rl_engine.ops.execute import run_forward
    from rl_engine.ops.registry import get_spec
    from rl_engine.ops.spec import WORKLOADS

    ops = list(contract.data["op_classes"]["logprob"]) + ["lm_head"]
    findings, basis = [], []
    for op in ops:
        spec = get_spec(op)
        case = spec.build_cases(WORKLOADS["smoke"], 0, torch.device("cuda" if torch.cuda.is_available() else "cpu"))[0]
        for b in backends + ["torch_bf16"]:
            impl = spec.impls.get(b)
            if impl is None:
                continue
            basis.append(_where(impl, root))
            outs = run_forward(impl, case.inputs)
            if outs[0].dtype != torch.float32:
                findings.append(f"{op}/{b}: output is {outs[0].dtype}, the contract requires float32")
    return AuditRow(f"logprob ops and lm_head logits are FP32 on every backend ({', '.join(backends + ['torch_bf16'])})",
                    CONFORMANT if not findings else NONCONFORMANT, basis, findings)


def check_declared_exceptions(root: Path, contract: Contract) -> AuditRow:
    c = contract
    findings, basis = [], []
    import importlib

    for backend_module in ("triton", "cuda"):
        dg = importlib.import_module(f"rl_engine.ops.det_gemm.{backend_module}")
        basis.append(f"{_rel(Path(dg.__file__), root)} TREE_DEPTH={dg.TREE_DEPTH}")
        if dg.TREE_DEPTH != c.det_gemm["tree_depth"]:
            findings.append(f"det_gemm.{backend_module} TREE_DEPTH {dg.TREE_DEPTH} != contract tree_depth {c.det_gemm['tree_depth']}")
        for op in ("rms_norm", "qk_norm"):
            mod = importlib.import_module(f"rl_engine.ops.{op}.api")
            fn = getattr(mod, f"{op}_{backend_module}")
            default = inspect.signature(fn).parameters["order"].default
            basis.append(f"{_where(fn, root)} order default {default!r}")
            if default != c.rms_norm_order:
                findings.append(f"{op}_{backend_module} default order {default!r} != contract {c.rms_norm_order!r}")
    from rl_engine.ops.lm_head import triton as lm

    basis.append(_rel(Path(lm.__file__), root))
    if c.logits_dtype != "float32":
        findings.append(f"contract logits dtype {c.logits_dtype} is not float32")
    return AuditRow("declared exceptions equal the constants the kernels use (det_gemm tree, RMSNorm order, FP32 logits)",
                    CONFORMANT if not findings else NONCONFORMANT, basis, findings)


def check_bitwise_comparator(root: Path, contract: Contract) -> AuditRow:
    from rl_engine.gate.compare import compare_bitwise

    pos = torch.tensor([0x0000], dtype=torch.int16).view(torch.bfloat16)
    neg = torch.tensor([-0x8000], dtype=torch.int16).view(torch.bfloat16)
    rep = compare_bitwise("probe", pos, neg, contract.nan_policy)
    same = compare_bitwise("probe", pos, pos.clone(), contract.nan_policy)
    findings = []
    if rep.passed:
        findings.append("+0 and -0 judged equal")
    if not same.passed:
        findings.append("+0 vs +0 judged different")
    return AuditRow("invariance comparator works on raw bits (+0 / -0 probe)", CONFORMANT if not findings else NONCONFORMANT,
                    [_where(compare_bitwise, root)], findings)


def check_gate_coverage(root: Path, backends: list[str], contract: Contract | None = None) -> AuditRow:
    from rl_engine.gate.plan import JUDGMENTS, GateConfig, plan
    from rl_engine.ops.registry import get_spec
    from rl_engine.ops.spec import TRANSFORMS, WORKLOADS

    findings = []
    cfg = GateConfig(ops=list(OPS), backends=backends, judgments=[j for j in JUDGMENTS if j != "chain_parity"],
                     workload=WORKLOADS["smoke"], out_dir=Path("."))
    pair = (contract.cross_backend.anchor, contract.cross_backend.other) if contract is not None else cfg.cross_pair
    cfg.cross_pair = pair
    if not set(pair) <= set(backends):
        findings.append(f"the contract's cross_backend pair {list(pair)} is not among the required backends {backends}")
    keys = {(k.op, k.backend, k.judgment, k.transform) for k in plan(cfg)}
    for op in OPS:
        spec = get_spec(op)
        for b in backends:
            if b not in spec.impls:
                findings.append(f"{op}: no {b} implementation")
            for j in ("forward_accuracy", "gradient_accuracy"):
                if (op, b, j, None) not in keys:
                    findings.append(f"{op}/{b}/{j} not planned")
            for j in ("forward_invariance", "gradient_invariance"):
                for t in TRANSFORMS:
                    if (op, b, j, t) not in keys:
                        findings.append(f"{op}/{b}/{j}/{t} not planned")
        if set(pair) <= set(backends) and (op, pair[1], "cross_backend", None) not in keys:
            findings.append(f"{op}/{pair[1]}/cross_backend not planned")
        for t in TRANSFORMS:
            d = spec.transform(t)
            if isinstance(d, str) and not d.strip():
                findings.append(f"{op}: transform {t} is N/A without a reason")
    return AuditRow(f"every required op has all its cells registered in the gate ({', '.join(backends)})",
                    CONFORMANT if not findings else NONCONFORMANT, [_where(plan, root)], findings)


def run_audit(root: Path | None = None, execute: bool = True, contract: Contract | None = None) -> list[AuditRow]:
    """Run every check. ``execute=False`` skips the checks that run code (static scans only).
    ``contract``: the contract the checks compare the code with (default: the shipped one, read
    here — the audit is an entry point of its own)."""
    if contract is None:
        from rl_engine.contract import load_contract

        contract = load_contract()
    root = root or PACKAGE_ROOT
    rows = [check_tf32_dots(root), check_tolerance_literals(root), check_fp_contraction(root, contract)]
    if execute:
        rows.append(check_reference_guard(root))
        from rl_engine.backends.registry import availability

        required = contract.required_backends()
        runnable = [b for b in required if availability(b)[0]]
        rows.append(check_reference_dtypes(root))
        logprob = check_logprob_dtypes(root, runnable, contract)
        skipped = [f"{b} not run here: {availability(b)[1]}" for b in required if b not in runnable]
        if skipped:
            logprob.component += " — " + "; ".join(skipped)
        rows.append(logprob)
        rows.append(check_declared_exceptions(root, contract))
        rows.append(check_bitwise_comparator(root, contract))
        rows.append(check_gate_coverage(root, required, contract))
    return rows
