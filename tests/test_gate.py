"""The gate runner, evidence and reports, with silu as the real op.

Includes the planted-fault test: a silu "kernel" that is one ulp off in row 0 only when it runs in
a batch of more than one row must turn the batch/chunk/padding invariance cells red and be named
as the root cause.
"""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest
import torch

from rl_engine import OPS
from rl_engine.cli.main import main
from rl_engine.contract import load_contract
from rl_engine.errors import RLEngineError
from rl_engine.gate import evidence as evidence_io
from rl_engine.gate.report import render_html, render_markdown
from rl_engine.gate.runner import JUDGMENTS, GateConfig, plan, root_cause, run_gate
from rl_engine.ops.registry import get_spec
from rl_engine.ops.spec import TRANSFORMS, get_workload

SCHEMA = Path(evidence_io.__file__).resolve().parent / "evidence.schema.json"
OP_JUDGMENTS = [j for j in JUDGMENTS if j not in ("chain_parity", "cross_backend")]  # one backend: no cross cells
BACKEND = "triton_cuda_bf16"
ROW_TRANSFORMS = ("batch", "chunk", "padding")  # those that change how many rows run together


def _config(out: Path, judgments=None) -> GateConfig:
    return GateConfig(ops=["silu"], backends=[BACKEND], judgments=list(judgments or OP_JUDGMENTS),
                      workload=get_workload("smoke"), out_dir=out, requested_backends=[BACKEND])


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """One gate run of silu; records what evidence.json held after every cell."""
    out = tmp_path_factory.mktemp("clean")
    snapshots = []

    def on_cell(cell, i, n):
        snapshots.append((i, n, json.loads((out / "evidence.json").read_text()),
                          sorted(p.name for p in out.iterdir())))

    ev = run_gate(_config(out), load_contract(), on_cell=on_cell)
    return out, ev, snapshots


# ------------------------------------------------------------------------------------------------
# evidence


def test_evidence_validates_against_the_shipped_schema(clean_run):
    out, ev, _ = clean_run
    on_disk = json.loads((out / "evidence.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(on_disk)
    evidence_io.validate(on_disk)
    assert evidence_io.load(out / "evidence.json") == on_disk


def test_evidence_identity_and_provenance(clean_run):
    out, ev, _ = clean_run
    e = json.loads((out / "evidence.json").read_text())
    assert e["schema_version"] == evidence_io.SCHEMA_VERSION
    assert e["contract_version"] == "ws1-c1-v8"
    assert e["contract"]["sha256"] == load_contract().sha256
    prov = e["provenance"]
    assert isinstance(prov["git_commit"], str) and re.fullmatch(r"[0-9a-f]{40}", prov["git_commit"])
    assert isinstance(prov["git_dirty"], bool)
    assert prov["device"]["name"] and prov["device"]["kind"] in ("cpu", "cuda")
    assert prov["software"]["torch"] == torch.__version__
    assert "TRITON_INTERPRET" in prov["environment"]
    assert e["workload"]["name"] == "smoke" and e["workload"]["token_counts"]
    assert e["complete"] is True


def test_cells_cover_the_plan_and_explain_themselves(clean_run):
    _, ev, _ = clean_run
    keys = plan(_config(Path("unused")))
    per_op = sum(len(TRANSFORMS) if j.endswith("_invariance") else 1 for j in OP_JUDGMENTS)
    assert len(ev["cells"]) == len(keys) == per_op
    for cell, key in zip(ev["cells"], keys):
        assert (cell["op"], cell["backend"], cell["judgment"], cell["transform"]) == \
            (key.op, key.backend, key.judgment, key.transform)
        assert cell["status"] in ("green", "red", "n/a")
        if cell["status"] in ("red", "n/a"):
            assert cell["reason"].strip()
        assert re.fullmatch(r"silu/triton_cuda_bf16/silu_triton@[0-9a-f]{12}", cell["kernel_id"])
    statuses = {(c["judgment"], c["transform"]): c["status"] for c in ev["cells"]}
    assert statuses[("forward_invariance", "tp")] == "n/a"  # silu declares tp N/A with a reason
    assert ev["summary"] == {"green": len(keys) - 2, "red": 0, "n/a": 2, "not provided": 0}
    assert ev["root_cause"] is None


def test_invariance_cells_record_controls_that_were_caught(clean_run):
    _, ev, _ = clean_run
    inv = [c for c in ev["cells"] if c["judgment"].endswith("_invariance") and c["status"] != "n/a"]
    assert inv
    for c in inv:
        controls = c["details"]["controls"]
        assert controls, c
        assert all(ctrl["caught"] is True for ctrl in controls), controls
        assert c["details"]["pairs"] and all(p["passed"] for p in c["details"]["pairs"])
        assert c["details"]["nan_policy"] == load_contract().nan_policy


def test_accuracy_cells_hold_full_reports(clean_run):
    _, ev, _ = clean_run
    fwd = next(c for c in ev["cells"] if c["judgment"] == "forward_accuracy")
    tol = load_contract().tolerance("forward", "elementwise")
    assert fwd["details"]["tolerance"] == tol.as_dict()
    cases = [r["case"] for r in fwd["details"]["reports"]]
    assert cases == [f"T{t}-F{get_workload('smoke').ffn}" for t in get_workload("smoke").token_counts]
    for r in fwd["details"]["reports"]:
        for k in ("max_abs_error", "p99_abs_error", "p999_abs_error", "worst_index", "histogram"):
            assert k in r["accuracy"]
        assert "passed" in r["relative"]
    grad = next(c for c in ev["cells"] if c["judgment"] == "gradient_accuracy")
    assert all("grad_norm" in r for r in grad["details"]["reports"])


def test_evidence_written_atomically_and_progressively(clean_run):
    out, ev, snaps = clean_run
    assert len(snaps) == len(ev["cells"])
    counts = []
    for i, n, snap, files in snaps:
        assert snap["complete"] is False, "complete must stay false until the last cell"
        assert len(snap["cells"]) <= i  # written at most once a second (EVIDENCE_WRITE_INTERVAL_S)
        counts.append(len(snap["cells"]))
        evidence_io.validate(snap)
        assert not [f for f in files if f.startswith(".evidence-")], files
    assert counts == sorted(counts)
    final = json.loads((out / "evidence.json").read_text())
    assert final["complete"] is True and len(final["cells"]) == len(ev["cells"])
    assert not [p for p in out.iterdir() if p.name.startswith(".evidence-")]


def test_evidence_is_rewritten_after_a_cell_once_the_interval_has_passed(tmp_path, monkeypatch):
    from rl_engine.gate import runner

    monkeypatch.setattr(runner, "EVIDENCE_WRITE_INTERVAL_S", 0.0)
    seen = []
    run_gate(_config(tmp_path), load_contract(),
             on_cell=lambda c, i, n: seen.append((i, len(json.loads((tmp_path / "evidence.json").read_text())["cells"]))))
    assert all(i == k for i, k in seen)


def test_write_atomic_failure_keeps_old_file(tmp_path, clean_run):
    _, ev, _ = clean_run
    path = tmp_path / "evidence.json"
    evidence_io.write_atomic(path, ev)
    before = path.read_text()
    broken = json.loads(before)
    broken["cells"][0]["details"]["not_json"] = object()  # passes the schema, fails json.dump
    with pytest.raises(TypeError):
        evidence_io.write_atomic(path, broken)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence.json"]
    bad = json.loads(before)
    del bad["provenance"]
    with pytest.raises(RLEngineError, match="provenance"):
        evidence_io.write_atomic(path, bad)
    assert path.read_text() == before


def test_evidence_is_strict_json_with_non_finite_values(tmp_path, clean_run):
    _, ev, _ = clean_run
    e = json.loads(json.dumps(ev, default=str))
    e["cells"][0]["details"]["some_error"] = float("inf")
    evidence_io.write_atomic(tmp_path / "evidence.json", e)
    text = (tmp_path / "evidence.json").read_text()
    assert "Infinity" not in text and '"inf"' in text


# ------------------------------------------------------------------------------------------------
# reports


def test_report_markdown(clean_run):
    out, ev, _ = clean_run
    md = render_markdown(ev)
    assert "ws1-c1-v8" in md and "PASS" in md and "| silu |" in md
    assert "N/A cells and their reasons" in md and "tensor-parallel" in md
    assert ev["provenance"]["git_commit"] in md


def test_report_html_is_self_contained(clean_run):
    _, ev, _ = clean_run
    html = render_html(ev)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I), "external resource"
    assert "<script" not in html.lower() and "<link" not in html.lower()
    m = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert m, "no embedded PNG"
    assert base64.b64decode(m.group(1))[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------
# the planted fault


def _plant_row0_when_batched(real):
    """silu whose row 0 is one ulp off (lowest mantissa bit flipped) whenever T > 1.

    The gradient is untouched: the change is added as a constant."""

    def planted(x):
        y = real(x)
        if x.shape[0] > 1:
            bits = y.detach().clone()
            bits.view(torch.int16)[0] ^= 1
            y = y + (bits - y.detach())  # exact: adjacent BF16 values differ by one representable step
        return y

    planted.__name__ = "planted_silu_triton"
    return planted


def test_planted_wrapper_is_what_it_claims(device):
    spec = get_spec("silu")
    real = spec.impls[BACKEND]
    planted = _plant_row0_when_batched(real)
    # the Triton kernel takes CUDA tensors on a GPU, CPU tensors only under its interpreter
    x = spec.build_cases(get_workload("smoke"), 0, device)[1].inputs["x"]
    assert x.shape[0] > 1
    a, b = real(x).view(torch.int16), planted(x).view(torch.int16)
    assert torch.equal((a ^ b)[0], torch.ones_like(a[0])) and torch.equal(a[1:], b[1:])
    assert torch.equal(real(x[:1]).view(torch.int16), planted(x[:1]).view(torch.int16))
    xr = x.clone().requires_grad_(True)
    xp = x.clone().requires_grad_(True)
    up = torch.ones_like(x)
    real(xr).backward(up)
    planted(xp).backward(up)
    assert torch.equal(xr.grad.view(torch.int16), xp.grad.view(torch.int16))


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    spec = get_spec("silu")
    real = spec.impls[BACKEND]
    out = tmp_path_factory.mktemp("planted")
    mp = pytest.MonkeyPatch()
    mp.setitem(spec.impls, BACKEND, _plant_row0_when_batched(real))
    try:
        rc = main(["gate", "--ops", "silu", "--backend", BACKEND, "--workload", "smoke", "--judgments", *OP_JUDGMENTS,
                   "--out", str(out)])
    finally:
        mp.undo()
    assert get_spec("silu").impls[BACKEND] is real, "the real kernel was not restored"
    return rc, out, json.loads((out / "evidence.json").read_text())


def test_planted_fault_exit_code_1(planted_run):
    rc, _, ev = planted_run
    assert rc == 1
    assert ev["complete"] is True


def test_planted_fault_turns_batch_sensitive_invariance_red(planted_run):
    _, _, ev = planted_run
    st = {(c["judgment"], c["transform"]): c for c in ev["cells"]}
    for j in ("forward_invariance", "gradient_invariance"):
        for t in ROW_TRANSFORMS:
            c = st[(j, t)]
            assert c["status"] == "red", (j, t, c.get("reason"))
            assert "differ" in c["reason"] and "0x" in c["reason"]
            # the controls still work: the red comes from the pairs, not from a broken check
            assert all(ctrl["caught"] for ctrl in c["details"]["controls"])
        # the layout transform keeps T the same, so the planted fault is (correctly) invisible to it
        assert st[(j, "layout")]["status"] == "green"
        assert st[(j, "tp")]["status"] == "n/a"


def test_planted_fault_accuracy(planted_run):
    """What is true of accuracy under a one-ulp fault.

    * The element-wise atol/rtol check passes in every case: one BF16 ulp is within the contract's
      elementwise tolerance.
    * The gradient is untouched, so gradient accuracy stays green.
    * The relative criterion (candidate max error <= k x torch_bf16 max error) is tighter: a value
      one ulp off has an error of up to 1.5 ulp, while torch_bf16 stays within half an ulp. So the
      forward-accuracy cell turns red, by the relative criterion only, and only in the cases with
      T > 1 (where the fault is planted); the T = 1 case is unchanged.
    """
    _, _, ev = planted_run
    st = {(c["judgment"], c["transform"]): c for c in ev["cells"]}
    assert st[("gradient_accuracy", None)]["status"] == "green"
    fwd = st[("forward_accuracy", None)]
    reports = fwd["details"]["reports"]
    assert all(r["accuracy"]["passed"] for r in reports), "one ulp must be within the elementwise tolerance"
    by_t = {int(r["case"].split("-")[0][1:]): r for r in reports}
    assert by_t[1]["relative"]["passed"]
    assert by_t[1]["accuracy"]["max_abs_error"] == by_t[1]["relative"]["baseline_max_abs_error"]
    failed = [t for t, r in by_t.items() if not r["relative"]["passed"]]
    assert failed and all(t > 1 for t in failed)
    assert fwd["status"] == "red"
    assert "relative FAIL" in fwd["reason"] and " FAIL max_abs" not in fwd["reason"]


def test_planted_fault_root_cause(planted_run):
    _, out, ev = planted_run
    rc = ev["root_cause"]
    assert rc["op"] == "silu"
    assert rc["red_cells"] == sum(1 for c in ev["cells"] if c["status"] == "red")
    assert f"{BACKEND}/forward_invariance/batch" in rc["cells"]
    md = (out / "report.md").read_text()
    assert "**Root-cause hint:** `silu`" in md
    assert "FAIL" in md and "Red cells" in md
    html = (out / "report.html").read_text()
    assert "Root-cause hint" in html and "silu" in html


class _Page(HTMLParser):
    """The visible text of an HTML page (outside <head>, <style>, <script>), its elements with
    their attributes, and its tables."""

    def __init__(self):
        super().__init__()
        self.text, self.elements, self._skip = [], [], 0
        self._stack: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag in ("head", "style", "script", "title"):
            self._skip += 1
        if tag not in ("img", "meta", "br", "hr", "input", "link"):
            self._stack.append((tag, a))

    def handle_endtag(self, tag):
        if tag in ("head", "style", "script", "title"):
            self._skip -= 1
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if not self._skip:
            self.text.append((data, [t for t in self._stack]))

    def visible(self) -> str:
        return " ".join(d for d, _ in self.text)

    def text_inside(self, pred) -> str:
        return " ".join(d for d, stack in self.text if any(pred(t, a) for t, a in stack))


def test_failing_report_html_reads_at_a_glance(planted_run):
    """The HTML of a failing run: a verdict banner saying FAIL, each red cell's full reason as
    visible text (not only a tooltip), real tables, embedded plots, no markdown left unrendered."""
    _, out, ev = planted_run
    page = _Page()
    page.feed((out / "report.html").read_text())
    classes = lambda a: (a.get("class") or "").split()  # noqa: E731
    banner = page.text_inside(lambda t, a: "verdict" in classes(a))
    assert "FAIL" in banner and "red" in banner
    assert page.visible().index("FAIL") < page.visible().index("Matrix"), "the verdict comes first"
    visible = page.visible()
    reds = [c for c in ev["cells"] if c["status"] == "red"]
    assert reds
    reason_text = page.text_inside(lambda t, a: "red-cells" in classes(a))
    for c in reds:
        assert c["reason"] in reason_text, c["reason"]
        tag = f"{c['op']}/{c['backend']}/{c['judgment']}" + (f"/{c['transform']}" if c["transform"] else "")
        assert tag in reason_text
    assert "evidence.json" in reason_text and "cells[" in reason_text
    tables = [t for t, _ in page.elements if t == "table"]
    assert len(tables) >= 2  # the matrix and the detail tables
    assert sum(1 for t, a in page.elements if t == "td" and "red" in classes(a)) == len(reds)
    imgs = [a["src"] for t, a in page.elements if t == "img"]
    assert imgs and all(src.startswith("data:image/png;base64,") for src in imgs)
    assert base64.b64decode(imgs[0].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![" not in visible and "|---" not in visible and "| op |" not in visible
    assert not re.search(r"\*\*[^*]+\*\*", visible), "unrendered markdown emphasis"


def test_passing_report_html_says_pass(clean_run):
    _, ev, _ = clean_run
    page = _Page()
    page.feed(render_html(ev))
    banner = page.text_inside(lambda t, a: "verdict" in (a.get("class") or "").split())
    assert "PASS" in banner and "FAIL" not in banner
    assert not any(t == "ol" and "red-cells" in (a.get("class") or "") for t, a in page.elements)


def test_root_cause_is_the_earliest_op_in_model_order():
    cells = [{"op": "rms_norm", "backend": "b", "judgment": "forward_accuracy", "transform": None, "status": "red"},
             {"op": "swiglu", "backend": "b", "judgment": "forward_invariance", "transform": "batch", "status": "red"},
             {"op": "embedding", "backend": "b", "judgment": "forward_accuracy", "transform": None, "status": "green"}]
    assert OPS.index("swiglu") < OPS.index("rms_norm")
    rc = root_cause(cells)
    assert rc["op"] == "swiglu" and rc["cells"] == ["b/forward_invariance/batch"]
    assert root_cause([dict(cells[2])]) is None


# ------------------------------------------------------------------------------------------------
# a kernel that raises


class PlantedKernelError(RuntimeError):
    pass


def test_raising_cell_is_red_and_the_run_goes_on(tmp_path, monkeypatch):
    spec = get_spec("silu")
    real = spec.impls[BACKEND]
    biggest = max(get_workload("smoke").token_counts)

    def raising(x):
        if x.shape[0] == biggest:  # only the largest forward-accuracy case
            raise PlantedKernelError("planted failure")
        return real(x)

    monkeypatch.setitem(spec.impls, BACKEND, raising)
    ev = run_gate(_config(tmp_path), load_contract())
    cells = ev["cells"]
    assert len(cells) == len(plan(_config(tmp_path)))
    first = cells[0]
    assert first["judgment"] == "forward_accuracy" and first["status"] == "red"
    assert "PlantedKernelError" in first["reason"] and "planted failure" in first["reason"]
    assert "traceback" in first["details"]
    later = cells[1:]
    assert all(c["status"] in ("green", "n/a") for c in later), [(c["judgment"], c["transform"], c["status"]) for c in later]
    assert ev["complete"] is True and ev["root_cause"]["op"] == "silu"
    assert json.loads((tmp_path / "evidence.json").read_text())["summary"]["red"] == 1


def test_missing_impl_is_red(tmp_path, monkeypatch):
    spec = get_spec("silu")
    monkeypatch.delitem(spec.impls, BACKEND)
    ev = run_gate(_config(tmp_path, ["forward_accuracy"]), load_contract())
    (cell,) = ev["cells"]
    assert cell["status"] == "red" and "no triton_cuda_bf16 implementation" in cell["reason"]


def test_evidence_file_mode_like_the_reports(planted_run):
    _, out, _ = planted_run
    mode = (out / "evidence.json").stat().st_mode & 0o777
    assert mode == (out / "report.md").stat().st_mode & 0o777, oct(mode)


def test_report_command_prints_the_verdict_and_every_red_cell(planted_run, tmp_path, capsys):
    import shutil

    _, out, ev = planted_run
    shutil.copy(out / "evidence.json", tmp_path / "evidence.json")
    rc = main(["report", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 1
    assert printed.startswith("FAIL:")
    reds = [c for c in ev["cells"] if c["status"] == "red"]
    assert f"red cells ({len(reds)}):" in printed
    for c in reds:
        tag = f"{c['op']}/{c['backend']}/{c['judgment']}" + (f"/{c['transform']}" if c["transform"] else "")
        assert f"RED {tag}: " in printed
    assert "root-cause hint: silu" in printed


def test_plain_progress_counts_and_prints_reds_as_they_happen(monkeypatch, capsys, tmp_path):
    """CI=true: one line per cell with the running tally; a red line carries its reason."""
    from rl_engine.cli import cmd_gate
    from rl_engine.gate import runner

    cells = [{"op": "silu", "backend": BACKEND, "judgment": "forward_accuracy", "transform": None, "status": "green",
              "duration_s": 0.1},
             {"op": "silu", "backend": BACKEND, "judgment": "forward_invariance", "transform": "batch",
              "status": "red", "reason": "planted: 3/9 differ\nsecond line", "duration_s": 0.2},
             {"op": "silu", "backend": BACKEND, "judgment": "forward_invariance", "transform": "tp", "status": "n/a",
              "reason": "no split", "duration_s": 0.0}]

    def fake_run_gate(config, contract, on_cell=None):
        for i, c in enumerate(cells):
            on_cell(c, i + 1, len(cells))
        return {}

    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(runner, "plan", lambda config: cells)
    monkeypatch.setattr(runner, "run_gate", fake_run_gate)
    cmd_gate._run_with_progress(_config(tmp_path), load_contract())
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("[1 green, 0 red]")
    assert "RED" in lines[1] and "forward_invariance/batch" in lines[1] and "planted: 3/9 differ" in lines[1]
    assert "second line" not in lines[1] and lines[1].endswith("[1 green, 1 red]")
    assert lines[2].endswith("[1 green, 1 red, 1 n/a]")


def test_chain_plot_draws_what_the_evidence_records():
    """The chain plot uses only the recorded statistics of ours and the torch_bf16 chain (the
    evidence holds no per-token dlogp); a missing chain cell draws nothing."""
    from rl_engine.gate.report import _plot_chain

    contract = load_contract()
    metrics = {k: {"value": 0.0, "threshold": float(contract.chain_metric(k)["threshold"]), "decision": "gate"}
               for k in ("max_abs_dlogp", "mean_abs_dlogp")}
    cell = {"op": "chain", "backend": BACKEND, "judgment": "chain_parity", "transform": None, "status": "green",
            "details": {"active_tokens": 40, "max_abs_dlogp": 0.0, "mean_abs_dlogp": 0.0, "p99_abs_dlogp": 0.0,
                        "p999_abs_dlogp": 0.0, "metrics": metrics,
                        "baseline_torch_bf16": {"max_abs_dlogp": 1.0, "mean_abs_dlogp": 0.1, "p99_abs_dlogp": 0.75,
                                                "p999_abs_dlogp": 0.875}}}
    png = _plot_chain([cell])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert _plot_chain([{**cell, "details": {}}]) is None
