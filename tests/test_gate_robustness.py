"""Runs that survive faults: per-cell timeout, interruption + --resume, the repeat judgment."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from rl_engine.cli.main import main
from rl_engine.contract import load_contract
from rl_engine.gate import evidence as evidence_io
from rl_engine.gate.runner import GateConfig, run_gate
from rl_engine.ops.registry import get_spec
from rl_engine.ops.spec import WORKLOADS

JUDGMENTS = ["forward_accuracy", "forward_invariance"]


def _config(out: Path, **kw) -> GateConfig:
    base = dict(ops=["silu"], backends=["triton_cuda_bf16"], judgments=JUDGMENTS, workload=WORKLOADS["smoke"], out_dir=out)
    base.update(kw)
    return GateConfig(**base)


def _comparable(cells):
    """Cells without timing fields, which differ between any two runs."""
    out = []
    for c in cells:
        c = {k: v for k, v in c.items() if k != "duration_s"}
        out.append(json.dumps(c, sort_keys=True))
    return out


class _Stop(BaseException):
    """Raised from on_cell to interrupt a run the way Ctrl-C would (not an Exception)."""


def _interrupted_run(config: GateConfig, after: int = 2) -> None:
    """Run the gate and interrupt it after ``after`` cells; its partial evidence stays on disk."""
    def stop(cell, i, n):
        if i == after:
            raise _Stop()

    with pytest.raises(_Stop):
        run_gate(config, load_contract(), on_cell=stop)


def test_cell_timeout_marks_the_cell_red_and_the_run_goes_on(tmp_path, monkeypatch):
    spec = get_spec("silu")
    real = spec.impls["triton_cuda_bf16"]

    def slow(x):
        if x.shape[0] == 1:  # the first accuracy case only
            time.sleep(30)
        return real(x)

    monkeypatch.setitem(spec.impls, "triton_cuda_bf16", slow)
    ev = run_gate(_config(tmp_path, cell_timeout=1.0), load_contract())
    first = ev["cells"][0]
    assert first["judgment"] == "forward_accuracy" and first["status"] == "red"
    assert first["reason"].startswith("timeout")
    assert first["duration_s"] < 10
    assert len(ev["cells"]) == 6 and ev["complete"]
    assert ev["cell_timeout_s"] == 1.0  # the limit the cells ran under is on record
    assert any(c["status"] == "green" for c in ev["cells"][1:])


def test_interrupted_run_resumes_to_the_same_evidence(tmp_path, monkeypatch):
    full = run_gate(_config(tmp_path / "full"), load_contract())

    part_dir = tmp_path / "part"
    _interrupted_run(_config(part_dir))
    partial = evidence_io.load(part_dir / "evidence.json")
    assert partial["complete"] is False and len(partial["cells"]) == 2
    assert not list(part_dir.glob(".evidence-*")), "a temporary file was left behind"

    assert main(["gate", "--resume", str(part_dir)]) == 0
    resumed = evidence_io.load(part_dir / "evidence.json")
    assert resumed["complete"] is True
    assert resumed["resumed_from"]["cells_kept"] == 2
    assert _comparable(resumed["cells"]) == _comparable(full["cells"])


def test_resume_refuses_when_the_contract_changed(tmp_path, capsys):
    ev = run_gate(_config(tmp_path), load_contract())
    ev["complete"] = False
    ev["contract"]["sha256"] = "0" * 64
    evidence_io.write_atomic(tmp_path / "evidence.json", ev)
    assert main(["gate", "--resume", str(tmp_path)]) == 2
    assert "contract_sha256" in capsys.readouterr().err


def test_resume_of_a_complete_run_is_refused(tmp_path, capsys):
    run_gate(_config(tmp_path), load_contract())
    assert main(["gate", "--resume", str(tmp_path)]) == 2
    assert "already complete" in capsys.readouterr().err


def test_repeat_is_green_for_a_deterministic_kernel_and_red_for_a_nondeterministic_one(tmp_path, monkeypatch):
    ev = run_gate(_config(tmp_path / "ok", judgments=["repeat"]), load_contract())
    (cell,) = ev["cells"]
    assert cell["status"] == "green", cell.get("reason")
    assert cell["details"]["controls"][0]["caught"] is True
    assert any("fresh process" in p["path"] for p in cell["details"]["pairs"])

    spec = get_spec("silu")
    real = spec.impls["triton_cuda_bf16"]
    calls = {"n": 0}

    def flaky(x):
        calls["n"] += 1
        y = real(x)
        if calls["n"] == 3:  # run 2's forward (each run calls forward, then backward) is one ulp off
            y = y.clone()
            y.view(torch.int16).view(-1)[0] += 1
        return y

    monkeypatch.setitem(spec.impls, "triton_cuda_bf16", flaky)
    ev = run_gate(_config(tmp_path / "bad", judgments=["repeat"]), load_contract())
    (cell,) = ev["cells"]
    assert cell["status"] == "red"
    assert "run 1 vs run 2" in cell["reason"]


def test_a_path_traversal_name_in_evidence_is_refused(tmp_path, capsys):
    """Names taken from an input file never become paths outside the output folder."""
    from rl_engine.cli.io import safe_output_path
    from rl_engine.errors import InputError

    ev = run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())
    crafted = json.loads((tmp_path / "evidence.json").read_text())
    crafted["cells"][0]["op"] = "../../escaped"
    (tmp_path / "evidence.json").write_text(json.dumps(crafted))
    assert main(["report", str(tmp_path)]) == 2
    assert "cells/0/op" in capsys.readouterr().err
    assert not (tmp_path.parent.parent / "escaped-triton_cuda_bf16.png").exists()
    # the writer's own guard, independent of the schema
    for bad in ("../x.png", "/etc/x.png", "a/b.png", "..", ".hidden", ""):
        with pytest.raises(InputError):
            safe_output_path(tmp_path, bad)
    assert safe_output_path(tmp_path, "silu-triton_cuda_bf16.png").parent == tmp_path.resolve()
    assert ev["complete"]


def test_report_writes_plots_inside_the_folder(tmp_path):
    run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "plots" / "silu-triton_cuda_bf16.png").is_file()
    assert "plots/silu-triton_cuda_bf16.png" in (tmp_path / "report.md").read_text()


def test_plots_drawn_in_worker_processes_have_the_bytes_of_one_process(tmp_path, monkeypatch):
    """The report's per-op figures drawn in spawned worker processes (what a full gate does) are
    byte for byte the figures drawn in this process, in the same order. Control: the same rows under
    another title give other bytes (the comparison can fail)."""
    import os

    import rl_engine.gate.report as report_mod

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the plots are always drawn in this process")
    ev = run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())
    jobs = [(rs, report_mod._plot_title(op, be)) for (op, be), rs in report_mod._plots_by_op(ev).items()]
    assert len(jobs) >= 1
    jobs = jobs * 2  # at least two, so the pool has work for two workers
    monkeypatch.setattr(report_mod, "PLOT_PROCESS_MIN", 2)
    pooled = report_mod._render_all(jobs)
    serial = [report_mod._plot_op(*j) for j in jobs]
    assert pooled == serial and all(pooled)
    other = report_mod._plot_op(jobs[0][0], "another title")
    assert other != serial[0]


def test_ctrl_c_while_reports_are_written_says_to_run_report_not_resume(tmp_path, monkeypatch, capsys):
    """Every cell done, then Ctrl-C in the report writer: --resume would refuse (nothing missing),
    so the message must point at `rl-engine report`; mid-run it must point at --resume."""
    import rl_engine.gate.report as report_mod
    import rl_engine.gate.runner as runner_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod, "write_reports", interrupted)
    out = tmp_path / "g"
    assert main(["gate", "--workload", "smoke", "--ops", "silu", "--judgments", "forward_accuracy",
                 "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"rl-engine report {out}" in err and "--resume" not in err
    monkeypatch.undo()
    assert main(["report", str(out)]) == 0
    monkeypatch.setattr(runner_mod, "run_gate", interrupted)

    ev = evidence_io.load(out / "evidence.json")
    ev["complete"] = False
    (out / "evidence.json").write_text(__import__("json").dumps(ev))
    assert main(["gate", "--workload", "smoke", "--ops", "silu", "--out", str(out)]) == 130
    assert f"rl-engine gate --resume {out}" in capsys.readouterr().err


def test_fresh_process_starts_with_the_run_and_is_cleaned_up(tmp_path):
    """The repeat judgment's fresh process runs beside the first cells (not after them), and an
    interrupted run kills it and leaves no temporary folder behind."""
    seen = {}

    def at_first_cell(cell, i, n):
        if i == 1:
            seen["dirs"] = [p.name for p in tmp_path.joinpath("ok").glob(".repeat-*")]

    ev = run_gate(_config(tmp_path / "ok", judgments=["forward_accuracy", "repeat"]), load_contract(),
                  on_cell=at_first_cell)
    assert ev["cells"][0]["judgment"] == "forward_accuracy"
    assert len(seen["dirs"]) == 1, "the fresh process was not launched before the first cell ran"
    assert ev["cells"][-1]["status"] == "green", ev["cells"][-1].get("reason")
    assert not list((tmp_path / "ok").glob(".repeat-*"))

    _interrupted_run(_config(tmp_path / "stopped", judgments=["forward_accuracy", "repeat"]), after=1)
    assert not list((tmp_path / "stopped").glob(".repeat-*")), "an interrupted run left its fresh process's files"


def test_sigterm_keeps_finished_cells_and_stops_the_fresh_process(tmp_path):
    """`timeout` sends SIGTERM: the gate must behave as on Ctrl-C (exit 143, finished cells on disk,
    the repeat judgment's fresh process stopped, no temporary folder left)."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rl_engine.cli.main", "gate", "--ops", "silu", "rms_norm", "--workload", "smoke",
           "--judgments", "forward_accuracy", "forward_invariance", "repeat", "--out", str(out)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "evidence.json").exists():
        time.sleep(0.2)
    while time.time() < deadline and not list(out.glob(".repeat-*")):
        time.sleep(0.1)
    assert list(out.glob(".repeat-*")), "the fresh process never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM" in err and "--resume" in err
    assert not list(out.glob(".repeat-*")) and not list(out.glob(".evidence-*"))
    ev = evidence_io.load(out / "evidence.json")
    assert ev["complete"] is False


def test_a_second_gate_into_the_same_folder_is_refused(tmp_path):
    from rl_engine.errors import RLEngineError
    from rl_engine.gate.runner import _OutputLock

    with _OutputLock(tmp_path):
        with pytest.raises(RLEngineError, match="another rl-engine gate"):
            run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())
    ev = run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())  # free again
    assert ev["complete"] and not (tmp_path / ".gate.lock").exists()


def test_stale_fresh_folders_of_dead_gates_are_swept(tmp_path):
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / ".repeat-dead").mkdir()
    (tmp_path / ".repeat-dead" / "owner.pid").write_text(f"{dead.pid}\n")
    (tmp_path / ".repeat-live").mkdir()
    (tmp_path / ".repeat-live" / "owner.pid").write_text(f"{os.getppid()}\n")
    run_gate(_config(tmp_path, judgments=["forward_accuracy"]), load_contract())
    assert not (tmp_path / ".repeat-dead").exists()
    assert (tmp_path / ".repeat-live").exists(), "a live gate's folder was removed"


def test_the_fresh_process_runs_the_gates_own_package_whatever_the_working_directory(tmp_path, monkeypatch):
    """`python -m` puts the working directory first on sys.path: a different rl_engine there must not
    be what the fresh process imports."""
    shadow = tmp_path / "cwd" / "rl_engine"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the shadow copy was imported')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    ev = run_gate(_config(tmp_path / "out", judgments=["repeat"]), load_contract())
    (cell,) = ev["cells"]
    assert cell["status"] == "green", cell.get("reason")


def test_resume_refuses_cells_of_a_changed_kernel_source(tmp_path, capsys):
    _interrupted_run(_config(tmp_path))
    ev = json.loads((tmp_path / "evidence.json").read_text())
    ev["cells"][0]["kernel_id"] = ev["cells"][0]["kernel_id"].rsplit("@", 1)[0] + "@000000000000"
    evidence_io.write_atomic(tmp_path / "evidence.json", ev)
    assert main(["gate", "--resume", str(tmp_path)]) == 2
    assert "kernel source changed" in capsys.readouterr().err


def test_resume_keeps_the_backends_the_first_run_left_out(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine no backend is left out")

    from rl_engine.gate.runner import resolve_backends

    backends, left_out = resolve_backends("all")
    assert left_out, "expected cuda_bf16 to be left out without a GPU"
    _interrupted_run(_config(tmp_path, backends=backends, requested_backends=["all"], left_out=left_out))
    assert main(["gate", "--resume", str(tmp_path)]) == 0
    ev = evidence_io.load(tmp_path / "evidence.json")
    assert ev["backends"]["left_out"] == left_out and ev["backends"]["requested"] == ["all"]


def test_out_of_range_seed_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["gate", "--ops", "silu", "--workload", "smoke", "--seed", "99999999999999999999", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--seed" in capsys.readouterr().err


def test_report_of_an_incomplete_run_is_not_a_pass(tmp_path, capsys):
    _interrupted_run(_config(tmp_path))
    assert main(["report", str(tmp_path)]) == 1
    assert "INCOMPLETE" in capsys.readouterr().err
