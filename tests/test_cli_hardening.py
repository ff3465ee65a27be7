"""Bad usage and bad files exit 2 with a message, never a traceback (found by a fresh-user review)."""

from __future__ import annotations

import json

import torch

from rl_engine.cli.main import main


def _run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses a bad value with exit 2
        rc = exc.code
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out
    return rc, cap.out, cap.err


def test_non_utf8_files_are_refused(tmp_path, capsys):
    bad = tmp_path / "evidence.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert _run(["report", str(tmp_path)], capsys)[0] == 2
    assert _run(["contract", "--path", str(bad)], capsys)[0] == 2


def test_contract_rejects_nan_and_absurd_thresholds(tmp_path, capsys, contract):
    data = json.loads(contract.path.read_text())
    data["forward_accuracy"]["reduction"]["bfloat16"]["atol"] = float("nan")
    p = tmp_path / "nan.json"
    p.write_text(json.dumps(data))
    rc, _, err = _run(["contract", "--path", str(p)], capsys)
    assert rc == 2 and "NaN" in err
    data["forward_accuracy"]["reduction"]["bfloat16"]["atol"] = 1e6
    p.write_text(json.dumps(data))
    rc, _, err = _run(["contract", "--path", str(p)], capsys)
    assert rc == 2 and "forward_accuracy/reduction/bfloat16/atol" in err


def test_gate_refuses_bad_selections_before_running(tmp_path, capsys):
    out = str(tmp_path / "g")
    for argv, needle in (
        (["gate", "--backend", "", "--out", out], "names no backend"),
        (["gate", "--backend", "reference_fp32", "--out", out], "gold reference"),
        (["gate", "--cell-timeout", "-1", "--out", out], "positive"),
        (["gate", "--cell-timeout", "nan", "--out", out], "positive"),
        (["gate", "--workload", "qwen3-8b", "--ops", "silu", "--out", out], "needs a CUDA GPU"),
        (["gate", "--resume", out, "--ops", "silu"], "drop --ops"),
    ):
        if torch.cuda.is_available() and "qwen3-8b" in argv:
            continue
        rc, _, err = _run(argv, capsys)
        assert rc == 2, (argv, err)
        assert needle in err, (argv, err)


def test_gate_checks_the_names_it_will_write(tmp_path, capsys):
    (tmp_path / "plots").write_text("a file where the gate needs a folder")
    rc, _, err = _run(["gate", "--ops", "silu", "--judgments", "forward_accuracy", "--out", str(tmp_path)], capsys)
    assert rc == 2 and "plots" in err


def test_compare_dtype_mismatch_and_empty_tensors_exit_2(tmp_path, capsys):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(torch.ones(3, dtype=torch.bfloat16), a)
    torch.save(torch.ones(3, dtype=torch.float16), b)
    rc, _, err = _run(["compare", str(a), str(b), "--mode", "bitwise"], capsys)
    assert rc == 2 and "dtypes differ" in err
    torch.save(torch.ones(0, dtype=torch.bfloat16), a)
    torch.save(torch.ones(0, dtype=torch.bfloat16), b)
    rc, _, err = _run(["compare", str(a), str(b), "--mode", "accuracy"], capsys)
    assert rc == 2 and "nothing to compare" in err


def test_compare_prints_a_then_b(tmp_path, capsys):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(torch.tensor([1.0], dtype=torch.bfloat16), a)  # 0x3F80
    torch.save(torch.tensor([2.0], dtype=torch.bfloat16), b)  # 0x4000
    rc, out, _ = _run(["compare", str(a), str(b), "--mode", "bitwise"], capsys)
    assert rc == 1 and "0x3F80 vs 0x4000" in out


def test_report_recounts_a_hand_edited_summary(tmp_path, capsys):
    assert _run(["gate", "--ops", "silu", "--judgments", "forward_accuracy", "--out", str(tmp_path)], capsys)[0] == 0
    ev = json.loads((tmp_path / "evidence.json").read_text())
    ev["cells"][0]["status"] = "red"
    ev["cells"][0]["reason"] = "edited by hand"
    (tmp_path / "evidence.json").write_text(json.dumps(ev))
    rc, _, _ = _run(["report", str(tmp_path)], capsys)
    assert rc == 1
    md = (tmp_path / "report.md").read_text()
    assert "Verdict: FAIL" in md and "red 1" in md


def test_diff_refuses_unlike_runs(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        # smoke on every machine (the default is qwen3-8b with a GPU), so the edit below makes the runs unlike
        assert _run(["gate", "--ops", "silu", "--judgments", "forward_accuracy", "--workload", "smoke",
                     "--out", str(d)], capsys)[0] == 0
    ev = json.loads((b / "evidence.json").read_text())
    ev["workload"]["name"] = "qwen3-8b"
    (b / "evidence.json").write_text(json.dumps(ev))
    rc, _, err = _run(["diff", str(a), str(b)], capsys)
    assert rc == 2 and "workload" in err
    assert _run(["diff", str(a), str(b), "--allow-different"], capsys)[0] == 0
