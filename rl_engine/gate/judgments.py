"""The judgments of WS1 for one op and one backend (and, for ``cross_backend``, one backend pair).

Each function returns ``(status, reason, details)`` with ``status`` in ``green``/``red`` and
``details`` holding every comparator report (as dicts) for the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rl_engine.contract import Contract
from rl_engine.gate.compare import (
    compare_accuracy,
    compare_bitwise,
    compare_relative,
    gradient_norm_metrics,
)
from rl_engine.gate.digest import BitsDigest
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.spec import Case, OpSpec

GREEN, RED, NA = "green", "red", "n/a"
NOT_PROVIDED = "not provided"


class CaseNotProvided(Exception):
    """A plugin backend does not implement this case's parameters (e.g. an RMSNorm order)."""


@dataclass
class CaseResults:
    """Reference and baseline results of one case, computed once and shared by every backend."""

    case: Case
    reference: tuple[torch.Tensor, ...]
    baseline: tuple[torch.Tensor, ...]
    upstream: tuple[torch.Tensor, ...] | None = None
    ref_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    base_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    baseline_reports: dict[str, Any] = field(default_factory=dict)
    """The baseline's accuracy report per output path, computed once and shared by every backend."""

    def baseline_accuracy(self, path: str, baseline: torch.Tensor, reference: torch.Tensor, tol) -> Any:
        if path not in self.baseline_reports:
            self.baseline_reports[path] = compare_accuracy(path, baseline, reference, tol)
        return self.baseline_reports[path]


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def prepare_forward(spec: OpSpec, case: Case) -> CaseResults:
    ref = run_forward(spec.impls["reference_fp32"], upcast_inputs(case.inputs))
    for i, r in enumerate(ref):
        if r.is_floating_point() and r.dtype != torch.float32:
            raise AssertionError(
                f"{spec.name}: reference output {i} is {_dtype_name(r)}, the gold must be float32 (WS1 §3.1 condition 4)")
    base = run_forward(spec.impls["torch_bf16"], case.inputs)
    return CaseResults(case, ref, base)


def prepare_gradient(spec: OpSpec, case: Case) -> CaseResults:
    probe = run_forward(spec.impls["torch_bf16"], case.inputs)
    upstream = make_upstream(probe, case.seed + 1000)
    ref_outs, ref_grads, _ = run_gradient(spec.impls["reference_fp32"], upcast_inputs(case.inputs), spec.grad_inputs,
                                          upstream=tuple(u.float() for u in upstream))
    for name, g in ref_grads.items():
        if g.dtype != torch.float32:
            raise AssertionError(f"{spec.name}: reference gradient d{name} is {_dtype_name(g)}, must be float32")
    base_outs, base_grads, _ = run_gradient(spec.impls["torch_bf16"], case.inputs, spec.grad_inputs, upstream=upstream)
    return CaseResults(case, ref_outs, base_outs, upstream, ref_grads, base_grads)


def _expected_dtype(spec: OpSpec, index: int) -> torch.dtype:
    name = spec.outputs[index] if index < len(spec.outputs) else f"out{index}"
    return torch.float32 if name in spec.float_outputs_fp32 else torch.bfloat16


def forward_accuracy(spec: OpSpec, impl, prepared: list[CaseResults], contract: Contract,
                     record: dict[str, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
    """``record``: where each case's outputs are kept by case id (the cross_backend cell reuses them)."""
    op_class = contract.op_class(spec.name)
    tol = contract.tolerance("forward", op_class)
    factor = contract.relative_factor("forward", spec.name)
    reports, failures = [], []
    skipped = []
    digest = BitsDigest()
    for pr in prepared:
        try:
            outs = run_forward(impl, pr.case.inputs)
        except CaseNotProvided as exc:
            skipped.append(f"{pr.case.id}: {exc}")
            continue
        if record is not None:
            record[pr.case.id] = outs
        if len(outs) != len(pr.reference):
            failures.append(f"{pr.case.id}: {len(outs)} outputs, reference has {len(pr.reference)}")
            continue
        for i, (o, r, b) in enumerate(zip(outs, pr.reference, pr.baseline)):
            name = spec.outputs[i] if i < len(spec.outputs) else f"out{i}"
            path = f"{spec.name}.fwd.{name}"
            digest.add(f"{pr.case.id}:{path}", o)
            if not o.is_floating_point():
                eq = compare_bitwise(path, r, o, contract.nan_policy, check_device=False)  # the reference's device
                reports.append({"case": pr.case.id, "integer_output": eq.as_dict()})
                if not eq.passed:
                    failures.append(f"{pr.case.id}: {eq.summary()}")
                continue
            want = _expected_dtype(spec, i)
            if o.dtype != want:
                failures.append(f"{pr.case.id}: {path} is {_dtype_name(o)}, the contract requires {_dtype_name(torch.empty(0, dtype=want))}")
            acc = compare_accuracy(path, o, r, tol)
            base_acc = pr.baseline_accuracy(path, b, r, tol)
            rel = compare_relative(path, acc.max_abs_error, base_acc.max_abs_error, factor)
            reports.append({"case": pr.case.id, "accuracy": acc.as_dict(), "relative": rel.as_dict(),
                            "baseline_accuracy": {k: base_acc.as_dict()[k] for k in ("max_abs_error", "mean_abs_error", "p99_abs_error", "passed", "histogram", "ulp_histogram")}})
            if not acc.passed:
                failures.append(f"{pr.case.id}: {acc.summary()}")
            if not rel.passed:
                failures.append(f"{pr.case.id}: {rel.summary()}")
    if skipped and len(skipped) == len(prepared):
        return NOT_PROVIDED, "no case provided: " + "; ".join(skipped[:3]), {"skipped_cases": skipped}
    status = GREEN if not failures else RED
    return status, "; ".join(failures[:5]), {"tolerance": tol.as_dict(), "relative_factor": factor, "reports": reports,
                                              "skipped_cases": skipped, "bits_digest": digest.hexdigest()}


def gradient_accuracy(spec: OpSpec, impl, prepared: list[CaseResults], contract: Contract,
                      record: dict[str, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
    """``record``: where each case's input gradients are kept by case id (for the cross_backend cell)."""
    op_class = contract.op_class(spec.name)
    tol = contract.tolerance("gradient", op_class)
    factor = contract.relative_factor("gradient", spec.name)
    reports, failures = [], []
    skipped = []
    digest = BitsDigest()
    for pr in prepared:
        try:
            _, grads, _ = run_gradient(impl, pr.case.inputs, spec.grad_inputs, upstream=pr.upstream)
        except CaseNotProvided as exc:
            skipped.append(f"{pr.case.id}: {exc}")
            continue
        if record is not None:
            record[pr.case.id] = grads
        for name in spec.grad_inputs:
            path = f"{spec.name}.bwd.d{name}"
            g, r, b = grads[name], pr.ref_grads[name], pr.base_grads[name]
            digest.add(f"{pr.case.id}:{path}", g)
            want = pr.case.inputs[name].dtype
            if g.dtype != want:
                failures.append(f"{pr.case.id}: {path} is {_dtype_name(g)}, expected {_dtype_name(pr.case.inputs[name])}")
            acc = compare_accuracy(path, g, r, tol)
            base_acc = pr.baseline_accuracy(path, b, r, tol)
            rel = compare_relative(path, acc.max_abs_error, base_acc.max_abs_error, factor)
            norm = gradient_norm_metrics(path, g, r, contract.grad_norm_thresholds(op_class))
            reports.append({"case": pr.case.id, "accuracy": acc.as_dict(), "relative": rel.as_dict(),
                            "grad_norm": norm.as_dict(),
                            "baseline_accuracy": {k: base_acc.as_dict()[k] for k in ("max_abs_error", "mean_abs_error", "p99_abs_error", "passed", "histogram", "ulp_histogram")}})
            for rep in (acc, rel, norm):
                if not rep.passed:
                    failures.append(f"{pr.case.id}: {rep.summary()}")
    if skipped and len(skipped) == len(prepared):
        return NOT_PROVIDED, "no case provided: " + "; ".join(skipped[:3]), {"skipped_cases": skipped}
    status = GREEN if not failures else RED
    return status, "; ".join(failures[:5]), {"tolerance": tol.as_dict(), "relative_factor": factor, "reports": reports,
                                              "skipped_cases": skipped, "bits_digest": digest.hexdigest()}


def invariance(spec: OpSpec, impl, transform: str, case: Case, direction: str,
               contract: Contract) -> tuple[str, str, dict[str, Any]]:
    """Bitwise invariance under one transform, with its negative controls.

    The cell is green only if every pair is bitwise equal AND every negative control is caught:
    the planted one-ulp control always, and the op's known-breaking variant where it declares one.
    """
    fn = spec.transform(transform)
    assert callable(fn)
    pairs = fn(impl, case, direction, False)
    reps = [compare_bitwise(f"{spec.name}.{'fwd' if direction == 'forward' else 'bwd'}.{transform}:{p.label}",
                            p.canonical, p.transformed, contract.nan_policy) for p in pairs]
    failures = [r.summary() for r in reps if not r.passed]
    digest = BitsDigest()
    for p in pairs:
        digest.add(f"{p.label}:canonical", p.canonical)
        digest.add(f"{p.label}:transformed", p.transformed)
    if not pairs:
        failures.append("the transform produced no comparisons")
    controls = []
    planted = fn(impl, case, direction, True)
    caught = any(not compare_bitwise("control", p.canonical, p.transformed, contract.nan_policy).passed for p in planted)
    controls.append({"control": "planted one-ulp change on the transformed side", "caught": caught})
    if not caught:
        failures.append("negative control (planted one-ulp change) was not caught: the check cannot fail")
    variant = spec.controls.get(transform)
    if variant is not None and direction == "forward":
        vpairs = fn(variant, case, direction, False)
        vcaught = any(not compare_bitwise("control", p.canonical, p.transformed, contract.nan_policy).passed for p in vpairs)
        controls.append({"control": f"known-breaking variant {getattr(variant, '__name__', 'variant')}", "caught": vcaught})
        if not vcaught:
            failures.append(f"negative control variant {getattr(variant, '__name__', '?')} was not caught")
    status = GREEN if not failures else RED
    return status, "; ".join(failures[:5]), {
        "case": case.id, "nan_policy": contract.nan_policy,
        "pairs": [r.as_dict() for r in reps], "controls": controls, "bits_digest": digest.hexdigest(),
    }


def repeat(spec: OpSpec, backend: str, fresh: dict[str, torch.Tensor] | None, fresh_error: str | None, workload,
           seed: int, device: torch.device, contract: Contract,
           prebuilt: tuple[Any, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
    """The same cell twice in this process and once in a fresh process: identical bits.

    ``fresh=None`` skips the fresh-process comparison (a backend registered from Python in this
    process only cannot be rebuilt elsewhere); the details say so. Negative control: a planted
    one-ulp change on the second run must be caught.
    """
    from rl_engine.gate.fresh import outputs_for
    from rl_engine.ops.transforms import plant_ulp

    first = outputs_for(spec.name, backend, workload.name, seed, device, prebuilt, to_cpu=False)
    second = outputs_for(spec.name, backend, workload.name, seed, device, prebuilt, to_cpu=False)
    reps, failures = [], []
    digest = BitsDigest()
    for name, a in first.items():
        digest.add(name, a)
        r = compare_bitwise(f"{name} (run 1 vs run 2)", a, second[name], contract.nan_policy)
        reps.append(r.as_dict())
        if not r.passed:
            failures.append(r.summary())
        if fresh_error or fresh is None:
            continue
        if name not in fresh:
            failures.append(f"{name}: missing from the fresh-process run")
            continue
        rf = compare_bitwise(f"{name} (this process vs fresh process)", a, fresh[name], contract.nan_policy,
                             check_device=False)  # read back from the fresh process's file
        reps.append(rf.as_dict())
        if not rf.passed:
            failures.append(rf.summary())
    if fresh_error:
        failures.append(f"fresh-process run failed: {fresh_error}")
    name0 = next(iter(first))
    caught = not compare_bitwise("control", first[name0], plant_ulp(second[name0]), contract.nan_policy).passed
    if not caught:
        failures.append("negative control (planted one-ulp change) was not caught")
    status = GREEN if not failures else RED
    return status, "; ".join(failures[:5]), {"nan_policy": contract.nan_policy, "pairs": reps,
                                              "bits_digest": digest.hexdigest(),
                                              "fresh_process": "skipped: backend registered in this process only" if fresh is None else "compared",
                                              "controls": [{"control": "planted one-ulp change on run 2", "caught": caught}]}



def cross_backend(spec: OpSpec, impls: dict[str, Any], anchor: str, other: str, forward: list[CaseResults],
                  gradient: list[CaseResults], contract: Contract, not_declared: str | None,
                  recorded: dict[tuple[str, str], dict[str, Any]] | None = None) -> tuple[str, str, dict[str, Any]]:
    """Bitwise equality of two backends on every case of one op (contract section ``cross_backend``).

    Compared: each forward output of every forward case, and each input gradient of every gradient
    case under the case's upstream gradient, ``other`` against ``anchor``, as invariance compares
    (raw bits, the contract's NaN policy). ``recorded``: outputs the accuracy cells of this run
    already computed, keyed ``(backend, "fwd"|"bwd")`` then case id; the rest are computed here.

    Status: green when every pair is bitwise equal and the negative control (a one-ulp change planted
    on a copy of ``other``'s first floating output, compared with the anchor's) is caught; red
    otherwise; ``n/a`` when the contract does not declare the op bit-exact across backends
    (``not_declared`` is its reason); the comparison is then still made and recorded.
    """
    from rl_engine.ops.transforms import plant_ulp

    recorded = recorded if recorded is not None else {}
    skipped: list[str] = []

    def outputs(backend: str, direction: str, pr: CaseResults):
        """The case's outputs on ``backend`` (recorded or run now); None when the backend does not
        provide the case (a plugin's CaseNotProvided), which is then listed as skipped."""
        store = recorded.setdefault((backend, direction), {})
        if pr.case.id not in store:
            try:
                if direction == "fwd":
                    store[pr.case.id] = run_forward(impls[backend], pr.case.inputs)
                else:
                    store[pr.case.id] = run_gradient(impls[backend], pr.case.inputs, spec.grad_inputs,
                                                     upstream=pr.upstream)[1]
            except CaseNotProvided as exc:
                skipped.append(f"{pr.case.id} ({direction}, {backend}): {exc}")
                return None
        return store[pr.case.id]

    rows, reps, failures = [], [], []
    digest = BitsDigest()
    first_float = None  # (anchor's, other's) first floating output, for the negative control

    def compare(case_id: str, path: str, a: torch.Tensor, b: torch.Tensor) -> None:
        nonlocal first_float
        rep = compare_bitwise(f"{spec.name}.{path}", a, b, contract.nan_policy)
        same_layout = a.shape == b.shape and a.dtype == b.dtype
        if rep.passed:  # equal bits: no FP32 copies of both sides to find a zero (or a NaN from NaN - NaN)
            diff = 0.0
        elif same_layout and a.numel() and a.is_floating_point():
            diff = float((a.float() - b.float()).abs().max())
        else:
            diff = None
        rows.append({"case": case_id, "output": path, "bitwise_equal": rep.passed, "differing": rep.differing,
                     "numel": rep.numel, "max_abs_difference": diff})
        reps.append(rep)
        digest.add(f"{case_id}:{path}:{other}", b)
        if not rep.passed:
            failures.append(f"{case_id}: {rep.summary()}")
        if first_float is None and a.is_floating_point() and a.numel() and a.shape == b.shape:
            first_float = (a, b)

    for pr in forward:
        a, b = outputs(anchor, "fwd", pr), outputs(other, "fwd", pr)
        if a is None or b is None:
            continue
        if len(a) != len(b):
            failures.append(f"{pr.case.id}: {len(a)} outputs on {anchor}, {len(b)} on {other}")
            continue
        for i, (x, y) in enumerate(zip(a, b)):
            compare(pr.case.id, f"fwd.{spec.outputs[i] if i < len(spec.outputs) else f'out{i}'}", x, y)
    for pr in gradient if spec.grad_inputs else []:
        a, b = outputs(anchor, "bwd", pr), outputs(other, "bwd", pr)
        if a is None or b is None:
            continue
        for name in spec.grad_inputs:
            compare(pr.case.id, f"bwd.d{name}", a[name], b[name])
    if not rows and skipped:
        return NOT_PROVIDED, "no case provided: " + "; ".join(skipped[:3]), {"skipped_cases": skipped}
    if not rows:
        failures.append("nothing was compared")
    caught = first_float is not None and not compare_bitwise(
        "control", first_float[0], plant_ulp(first_float[1]), contract.nan_policy).passed
    if not caught:
        failures.append("negative control (planted one-ulp change) was not caught: the check cannot fail")
    equal = sum(r["bitwise_equal"] for r in rows)
    largest = max((r["max_abs_difference"] for r in rows if r["max_abs_difference"] is not None), default=0.0)
    details = {"backends": [anchor, other], "anchor": anchor, "nan_policy": contract.nan_policy,
               "declared_bit_exact": not_declared is None, "rows": rows,
               "outputs_compared": len(rows), "outputs_bitwise_equal": equal, "max_abs_difference": largest,
               "skipped_cases": skipped,
               "controls": [{"control": f"planted one-ulp change on a copy of {other}'s first output, compared with "
                                       f"{anchor}'s as the pairs are", "caught": caught}],
               "bits_digest": digest.hexdigest()}
    measured = f"{equal} of {len(rows)} outputs bitwise equal ({other} vs {anchor}), max difference {largest:.3g}"
    if not_declared is not None:
        return NA, (f"not declared bit-exact across backends by contract {contract.version} "
                    f"(cross_backend.not_declared: {not_declared}); measured: {measured}"), details
    if failures:
        return RED, "; ".join(failures[:5]), details
    return GREEN, measured, details
