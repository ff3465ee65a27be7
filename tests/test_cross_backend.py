"""The ``cross_backend`` judgment (contract ``ws1-c1-v8``, section ``cross_backend``; issue #34):
the contract section and its checks, the judgment on one op, the gate's cells and report, and the
cross-backend chain cell. On a CPU the pair is the Triton interpreter and a plugin (``cuda_bf16``
needs a GPU), declared in a copy of the shipped contract; each green has a control that must fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rl_engine
from rl_engine.backends.registry import unregister_backend
from rl_engine.constants import OPS
from rl_engine.contract import load_contract
from rl_engine.contract.loader import default_contract_path
from rl_engine.errors import ContractError
from rl_engine.gate import judgments as J
from rl_engine.gate.evidence import validate as validate_evidence
from rl_engine.gate.plan import CellKey, GateConfig, plan
from rl_engine.gate.report import render_html, render_markdown
from rl_engine.gate.runner import run_gate
from rl_engine.ops.registry import get_spec
from rl_engine.ops.spec import get_workload
from rl_engine.ops.transforms import plant_ulp

TRITON = "triton_cuda_bf16"
TWIN = "twin_kernels"


def _shipped() -> dict:
    return json.loads(default_contract_path().read_text())


def _contract(tmp_path: Path, edit) -> object:
    data = _shipped()
    edit(data)
    p = tmp_path / f"contract-{len(list(tmp_path.glob('contract-*.json')))}.json"
    p.write_text(json.dumps(data))
    return load_contract(p)


def _with_twin(data: dict, declared=("embedding", "rope", "silu", "swiglu", "pack", "rms_norm", "qk_norm")) -> None:
    """The cross-backend pair becomes (Triton, the plugin ``twin_kernels``)."""
    data["backend_profiles"][TWIN] = {"required": False, "execution_dtype": "bfloat16", "language": "Python plugin"}
    cb = data["cross_backend"]
    cb["backends"], cb["anchor_backend"] = [TRITON, TWIN], TRITON
    rest = {**cb["not_declared"], **{op: "not declared in this test" for op in cb["declared_bit_exact"]}}
    cb["declared_bit_exact"] = list(declared)
    cb["not_declared"] = {op: why for op, why in rest.items() if op not in declared}
    if cb["not_declared"]:  # the chain is bit-exact only when every op is
        cb["chain"]["declared_bit_exact"] = False
        cb["chain"]["reason"] = "not every op is declared in this test"


@pytest.fixture
def twin():
    names = []

    def register(ops):
        names.append(TWIN)
        return rl_engine.register_backend(TWIN, ops, backward=True, batch_invariant=True)

    yield register
    for n in names:
        unregister_backend(n)


# ------------------------------------------------------------------------------------------------
# the contract section


def test_shipped_section_lists_every_op_once():
    """Since ws1-c1-v8 every op and the chain are declared bit-exact across the backends."""
    cb = load_contract().cross_backend
    assert cb.backends == (TRITON, "cuda_bf16") and cb.anchor == TRITON and cb.other == "cuda_bf16"
    assert sorted(cb.declared + tuple(cb.not_declared)) == sorted(OPS)
    assert sorted(cb.declared) == sorted(OPS) and not cb.not_declared
    assert cb.chain_declared is True and cb.reason_not_declared("chain") is None
    assert cb.reason_not_declared("rms_norm") is None and cb.reason_not_declared("attention") is None


@pytest.mark.parametrize("edit, field", [
    (lambda cb: cb["declared_bit_exact"].append("softmax"), "unknown op 'softmax'"),
    (lambda cb: cb["not_declared"].__setitem__("attention", "x"), "also in declared_bit_exact"),
    (lambda cb: cb["declared_bit_exact"].remove("silu"), "in neither"),
    (lambda cb: cb.__setitem__("anchor_backend", "fp16"), "anchor_backend"),
    (lambda cb: cb.__setitem__("backends", [TRITON, "tpu_bf16"]), "no backend profile"),
    (lambda cb: (cb["declared_bit_exact"].remove("attention"), cb["not_declared"].__setitem__("attention", "x")),
     "chain/declared_bit_exact"),
    (lambda cb: cb.pop("not_declared"), "not_declared"),
])
def test_malformed_section_names_the_field(tmp_path, edit, field):
    with pytest.raises(ContractError, match=field):
        _contract(tmp_path, lambda d: edit(d["cross_backend"]))


# ------------------------------------------------------------------------------------------------
# the judgment on one op


def _prepared(op: str, device: torch.device):
    """Cases on the test machine's device (the GPU where there is one: Triton kernels refuse CPU
    tensors outside the interpreter)."""
    spec = get_spec(op)
    wl = get_workload("smoke")
    fwd = [J.prepare_forward(spec, c) for c in spec.build_cases(wl, 0, device)[:2]]
    grad = [J.prepare_gradient(spec, c) for c in spec.build_grad_cases(wl, 500, device)[:1]]
    return spec, fwd, grad


def _off_by_one_ulp(impl):
    """NEGATIVE CONTROL: ``impl`` with its first output's first element moved by one ulp."""
    def call(**kw):
        out = impl(**kw)
        return (plant_ulp(out[0]), *out[1:]) if isinstance(out, tuple) else plant_ulp(out)

    return call


def test_same_kernels_are_green_and_a_one_ulp_change_is_red(device):
    spec, fwd, grad = _prepared("silu", device)
    real = spec.impls[TRITON]
    c = load_contract()
    status, reason, det = J.cross_backend(spec, {TRITON: real, TWIN: real}, TRITON, TWIN, fwd, grad, c, None)
    assert status == J.GREEN, reason
    assert det["outputs_compared"] == det["outputs_bitwise_equal"] == len(fwd) + len(grad) * len(spec.grad_inputs)
    assert det["controls"][0]["caught"] and det["max_abs_difference"] == 0.0
    status, reason, det = J.cross_backend(spec, {TRITON: real, TWIN: _off_by_one_ulp(real)}, TRITON, TWIN, fwd, grad,
                                          c, None)
    assert status == J.RED and "differ" in reason
    assert det["outputs_bitwise_equal"] < det["outputs_compared"] and det["max_abs_difference"] > 0


def test_an_undeclared_op_is_na_and_still_measured(device):
    spec, fwd, grad = _prepared("silu", device)
    real = spec.impls[TRITON]
    status, reason, det = J.cross_backend(spec, {TRITON: real, TWIN: _off_by_one_ulp(real)}, TRITON, TWIN, fwd, grad,
                                          load_contract(), "a reason from the contract")
    assert status == J.NA and "a reason from the contract" in reason and "measured:" in reason
    assert det["declared_bit_exact"] is False and det["outputs_bitwise_equal"] < det["outputs_compared"]


def test_recorded_outputs_are_used_instead_of_a_second_run(device):
    spec, fwd, grad = _prepared("silu", device)
    real = spec.impls[TRITON]
    calls = []

    def counting(**kw):
        calls.append(1)
        return real(**kw)

    recorded = {}
    J.forward_accuracy(spec, real, fwd, load_contract(), recorded.setdefault((TRITON, "fwd"), {}))
    J.forward_accuracy(spec, counting, fwd, load_contract(), recorded.setdefault((TWIN, "fwd"), {}))
    n = len(calls)
    status, _, _ = J.cross_backend(spec, {TRITON: real, TWIN: counting}, TRITON, TWIN, fwd, [], load_contract(),
                                   None, recorded)
    assert status == J.GREEN and len(calls) == n  # the forward outputs came from the accuracy cell


# ------------------------------------------------------------------------------------------------
# the gate: plan, cells, evidence, report


def test_plan_puts_the_cell_after_both_backends_and_only_with_both():
    cfg = GateConfig(ops=["silu", "rope"], backends=[TRITON, "cuda_bf16"],
                     judgments=["forward_accuracy", "chain_parity", "cross_backend"], workload=get_workload("smoke"),
                     out_dir=Path("."))
    keys = plan(cfg)
    i = keys.index(CellKey("silu", "cuda_bf16", "cross_backend"))
    assert keys[i - 1] == CellKey("silu", "cuda_bf16", "forward_accuracy")
    assert keys[i - 2] == CellKey("silu", TRITON, "forward_accuracy")
    assert keys.index(CellKey("chain", "cuda_bf16", "cross_backend")) == 2  # after both chain_parity cells
    one = GateConfig(ops=["silu"], backends=[TRITON], judgments=["forward_accuracy", "cross_backend"],
                     workload=get_workload("smoke"), out_dir=Path("."))
    assert not any(k.judgment == "cross_backend" for k in plan(one))


def test_gate_cells_evidence_and_report(tmp_path, twin):
    """silu: the twin is Triton's own kernel (green); rms_norm: one ulp off (red: the control of the
    green); logp: not declared (n/a, measured)."""
    reals = {op: get_spec(op).impls[TRITON] for op in ("silu", "rms_norm", "logp")}
    twin({"silu": reals["silu"], "rms_norm": _off_by_one_ulp(reals["rms_norm"]), "logp": reals["logp"]})
    contract = _contract(tmp_path, _with_twin)
    cfg = GateConfig(ops=["silu", "rms_norm", "logp"], backends=[TRITON, TWIN],
                     judgments=["forward_accuracy", "gradient_accuracy", "cross_backend"],
                     workload=get_workload("smoke"), out_dir=tmp_path / "g")
    ev = run_gate(cfg, contract)
    validate_evidence(ev)
    cross = {c["op"]: c for c in ev["cells"] if c["judgment"] == "cross_backend"}
    assert set(cross) == {"silu", "rms_norm", "logp"} and all(c["backend"] == TWIN for c in cross.values())
    assert cross["silu"]["status"] == "green", cross["silu"].get("reason")
    assert cross["rms_norm"]["status"] == "red" and "differ" in cross["rms_norm"]["reason"]
    assert cross["logp"]["status"] == "n/a" and "not_declared" in cross["logp"]["reason"]
    assert "cross_backend" not in ev  # the cells replace the informational table
    md = render_markdown(ev)
    assert "## Cross-backend bits (judgment `cross_backend`)" in md
    assert f"| rms_norm | {TWIN} vs {TRITON} | red |" in md
    html = render_html(ev, plots=[])
    assert "Cross-backend bits" in html and ">cross<" in html


def test_without_the_judgment_the_informational_table_stays(tmp_path, twin):
    twin({"silu": get_spec("silu").impls[TRITON]})
    cfg = GateConfig(ops=["silu"], backends=[TRITON, TWIN], judgments=["forward_accuracy"],
                     workload=get_workload("smoke"), out_dir=tmp_path / "g")
    ev = run_gate(cfg, _contract(tmp_path, _with_twin))
    assert not any(c["judgment"] == "cross_backend" for c in ev["cells"])
    assert ev["cross_backend"] and all(r["bitwise_equal"] for r in ev["cross_backend"])


# ------------------------------------------------------------------------------------------------
# the chain cell


def _all_declared(data: dict) -> None:
    cb = data["cross_backend"]
    cb["declared_bit_exact"] = list(OPS)
    cb["not_declared"] = {}
    cb["chain"]["declared_bit_exact"] = True


def test_chain_cell_strict_on_one_backend_both_ways_and_red_across_a_different_one(tmp_path):
    """The cell's mechanics on a CPU, with the pair the chain can run here: Triton against itself
    is strict both ways (green), Triton against the torch_bf16 chain (other arithmetic) is red, under
    the shipped contract (which declares the chain, ws1-c1-v8) as under an all-declared copy; a copy
    that does not declare the chain makes the cell n/a, measured."""
    from rl_engine.chain.gate import chain_cross_backend_cell

    wl = get_workload("smoke")
    all_declared = _contract(tmp_path, _all_declared)
    status, reason, det, kid = chain_cross_backend_cell(TRITON, TRITON, wl, all_declared, 0)
    assert status == "green", reason
    assert all(r["passed"] and r["differing_tokens"] == 0 for r in det["directions"].values())
    assert det["controls"][0]["caught"] and det["active_tokens"] > 0 and kid
    status, reason, det, _ = chain_cross_backend_cell(TRITON, "torch_bf16", wl, all_declared, 0)
    assert status == "red" and "active tokens differ" in reason
    assert det["logprobs_source"][TRITON].startswith(("reused", "computed"))
    status, reason, det, _ = chain_cross_backend_cell(TRITON, "torch_bf16", wl, load_contract(), 0)
    assert status == "red" and "active tokens differ" in reason

    def chain_not_declared(data):
        cb = data["cross_backend"]
        cb["declared_bit_exact"].remove("attention")
        cb["not_declared"]["attention"] = "not declared in this test"
        cb["chain"]["declared_bit_exact"] = False
        cb["chain"]["reason"] = "attention is not declared in this test"

    status, reason, det, _ = chain_cross_backend_cell(TRITON, "torch_bf16", wl, _contract(tmp_path, chain_not_declared), 0)
    assert status == "n/a" and "cross_backend.chain" in reason and "measured:" in reason


def test_resume_checks_both_kernel_ids_of_a_cross_cell():
    """A cross_backend cell records ``<anchor id>|<other id>``: resuming compares each with its own
    backend's current source (it was once compared whole with the other's, and refused every
    resume). Control: a changed id of either side is reported."""
    from rl_engine.cli.cmd_gate import _stale_kernel_ids
    from rl_engine.provenance import kernel_id

    spec = get_spec("silu")
    ids = [kernel_id("silu", b, spec.impls[b]) for b in (TRITON, "cuda_bf16")]

    def cell(kid):
        return {"op": "silu", "backend": "cuda_bf16", "judgment": "cross_backend", "kernel_id": kid,
                "details": {"backends": [TRITON, "cuda_bf16"]}}

    assert _stale_kernel_ids({"cells": [cell("|".join(ids))]}) == []
    for side in (0, 1):
        changed = list(ids)
        changed[side] = changed[side].rsplit("@", 1)[0] + "@000000000000"
        stale = _stale_kernel_ids({"cells": [cell("|".join(changed))]})
        assert len(stale) == 1 and stale[0].startswith(f"silu/{(TRITON, 'cuda_bf16')[side]}:")


def test_audit_coverage_names_a_plan_without_cross_cells(monkeypatch):
    """The audit's gate-coverage row checks the cross_backend cells itself: with the plan's cross
    cells removed (control) it names them; with the shipped plan it has no cross finding."""
    from rl_engine.audit import checks
    from rl_engine.gate import plan as plan_mod

    contract = load_contract()
    backends = [TRITON, "cuda_bf16"]
    row = checks.check_gate_coverage(Path("."), backends, contract)
    assert not [f for f in row.findings if "cross_backend" in f]
    real = plan_mod.plan
    monkeypatch.setattr(plan_mod, "plan", lambda cfg: [k for k in real(cfg) if k.judgment != "cross_backend"])
    row = checks.check_gate_coverage(Path("."), backends, contract)
    assert "silu/cuda_bf16/cross_backend not planned" in row.findings


def test_a_plugin_without_backward_or_with_unsupported_cases_is_not_judged_on_them(tmp_path):
    """A twin that provides no backward has its forward compared and its gradients left out (said
    in the cell), and cases a twin does not provide (NotImplementedError) are skipped, not red."""
    real = get_spec("silu").impls[TRITON]

    def picky(**kw):
        if kw["x"].shape[0] == 1:
            raise NotImplementedError("one-row inputs are not supported")
        return real(**kw)

    contract = _contract(tmp_path, _with_twin)
    try:
        for name, impl, backward in (("fwd_only", real, False), ("picky", picky, True)):
            rl_engine.register_backend(TWIN, {"silu": impl}, backward=backward, batch_invariant=True)
            cfg = GateConfig(ops=["silu"], backends=[TRITON, TWIN], judgments=["forward_accuracy", "cross_backend"],
                             workload=get_workload("smoke"), out_dir=tmp_path / name)
            (cell,) = [c for c in run_gate(cfg, contract)["cells"] if c["judgment"] == "cross_backend"]
            assert cell["status"] == "green", (name, cell.get("reason"))
            d = cell["details"]
            if name == "fwd_only":
                assert "does not provide the backward" in d["gradients_not_compared"]
                assert not any(r["output"].startswith("bwd.") for r in d["rows"])
            else:
                assert d["skipped_cases"] and all("one-row" in x for x in d["skipped_cases"])
    finally:
        unregister_backend(TWIN)
