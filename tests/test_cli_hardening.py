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
    assert "Verdict: FAIL" in md and "1 red" in md


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


# ------------------------------------------------------------------------------------------------
# compare: per-file keys, BF16 from .npy, refused pickles, swapped arguments, NaN


def test_compare_keys_per_file(tmp_path, capsys):
    import numpy as np

    ref = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"y": ref.to(torch.bfloat16), "other": torch.zeros(1)}, tmp_path / "dump.pt")
    np.save(tmp_path / "ref.npy", ref.numpy())
    rc, out, err = _run(["compare", str(tmp_path / "dump.pt"), str(tmp_path / "ref.npy"), "--mode", "accuracy",
                         "--key-a", "y"], capsys)
    assert rc == 0 and "ok" in out, err
    # --key alone applies to both files: a single-array .npy cannot take it
    rc, _, err = _run(["compare", str(tmp_path / "dump.pt"), str(tmp_path / "ref.npy"), "--mode", "accuracy",
                       "--key", "y"], capsys)
    assert rc == 2 and "ref.npy" in err and "drop it" in err


def test_compare_bf16_from_npy_bits(tmp_path, capsys):
    import numpy as np

    x = torch.tensor([1.0, -2.5, 3.0], dtype=torch.bfloat16)
    np.save(tmp_path / "bits.npy", x.view(torch.int16).numpy().astype(np.uint16))
    torch.save(x, tmp_path / "x.pt")
    rc, out, err = _run(["compare", str(tmp_path / "bits.npy"), str(tmp_path / "x.pt"), "--mode", "bitwise",
                         "--npy-bf16"], capsys)
    assert rc == 0 and "bitwise equal" in out, err
    rc, _, err = _run(["compare", str(tmp_path / "bits.npy"), str(tmp_path / "x.pt"), "--mode", "accuracy"], capsys)
    assert rc == 2 and "--npy-bf16" in err
    np.save(tmp_path / "f.npy", np.zeros(3, dtype=np.float32))
    rc, _, err = _run(["compare", str(tmp_path / "f.npy"), str(tmp_path / "x.pt"), "--mode", "accuracy",
                       "--npy-bf16"], capsys)
    assert rc == 2 and "uint16 or int16" in err and "float32" in err


class _NotATensor:
    pass


def test_compare_refused_pickle_is_one_plain_line(tmp_path, capsys):
    torch.save({"x": torch.zeros(2), "obj": _NotATensor()}, tmp_path / "obj.pt")
    torch.save(torch.zeros(2), tmp_path / "ok.pt")
    rc, _, err = _run(["compare", str(tmp_path / "obj.pt"), str(tmp_path / "ok.pt"), "--mode", "bitwise"], capsys)
    assert rc == 2 and "obj.pt" in err and "refused" in err
    assert "\x1b[" not in err and "weights_only=False" not in err and "weights_only` set to `False" not in err
    assert len(err.strip().splitlines()) == 1
    assert "_NotATensor" in err


def test_compare_names_a_file_that_is_not_what_its_extension_says(tmp_path, capsys):
    """Issue #36: a text file named x.pt was called "pickled". The message names the path, what the
    file is and what was expected; the same names holding real files load (the control)."""
    import numpy as np

    ref = tmp_path / "ref.pt"
    torch.save(torch.zeros(2), ref)
    x = tmp_path / "x.pt"
    x.write_text("tensor([0., 0.])\n")
    rc, _, err = _run(["compare", str(x), str(ref), "--mode", "bitwise"], capsys)
    assert rc == 2 and f"{x}: not a torch.save file: it starts with text 'tensor([0., 0.])'" in err
    assert "pickle" not in err
    n = tmp_path / "x.npy"
    n.write_text("0 0\n")
    rc, _, err = _run(["compare", str(n), str(ref), "--mode", "bitwise"], capsys)
    assert rc == 2 and f"{n}: not a .npy file: it starts with text '0 0'" in err and "pickle" not in err
    np.save(tmp_path / "arr.npy", np.zeros(2, dtype=np.float32))
    (tmp_path / "arr.npy").rename(x)  # a .npy file under a .pt name is named as such
    rc, _, err = _run(["compare", str(x), str(ref), "--mode", "bitwise"], capsys)
    assert rc == 2 and "it is a NumPy .npy file" in err
    t = tmp_path / "x.txt"
    t.write_text("0 0\n")
    rc, _, err = _run(["compare", str(t), str(ref), "--mode", "bitwise"], capsys)
    assert rc == 2 and f"{t}: unknown extension '.txt'; expected .pt or .pth (torch.save), .npy" in err
    # control: the same paths holding what their extensions say compare cleanly
    torch.save(torch.zeros(2), x)
    np.save(n, np.zeros(2, dtype=np.float32))
    for a in (x, n):
        rc, out, err = _run(["compare", str(a), str(ref), "--mode", "bitwise"], capsys)
        assert rc == 0 and "bitwise equal" in out, err


def test_compare_warns_when_the_candidate_is_wider_than_the_reference(tmp_path, capsys):
    ref = torch.tensor([1.0, 2.0, 3.0])
    torch.save(ref, tmp_path / "fp32.pt")
    torch.save(ref.to(torch.bfloat16), tmp_path / "bf16.pt")
    rc, _, err = _run(["compare", str(tmp_path / "fp32.pt"), str(tmp_path / "bf16.pt"), "--mode", "accuracy"], capsys)
    assert "warning" in err and "swapped" in err
    rc, _, err = _run(["compare", str(tmp_path / "bf16.pt"), str(tmp_path / "fp32.pt"), "--mode", "accuracy"], capsys)
    assert rc == 0 and "warning" not in err


def test_compare_reports_a_nan_candidate_as_nan(tmp_path, capsys):
    torch.save(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16), tmp_path / "a.pt")
    torch.save(torch.tensor([1.0, 1.0]), tmp_path / "b.pt")
    rc, out, _ = _run(["compare", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--mode", "accuracy"], capsys)
    assert rc == 1 and "max_abs=nan" in out and "max_abs=inf" not in out


# ------------------------------------------------------------------------------------------------
# one CLI convention


def test_lists_take_commas_and_repeats_alike():
    from rl_engine.cli.main import build_parser

    p = build_parser()
    a = p.parse_args(["gate", "--out", "x", "--ops", "silu,rms_norm", "--judgments", "repeat"])
    b = p.parse_args(["gate", "--out", "x", "--ops", "silu", "--ops", "rms_norm", "--judgments", "repeat"])
    c = p.parse_args(["gate", "--out", "x", "--ops", "silu", "rms_norm", "--judgments", "repeat"])
    assert a.ops == b.ops == c.ops == ["silu", "rms_norm"]
    assert p.parse_args(["gate", "--out", "x", "--backend", "a,b"]).backend == \
        p.parse_args(["gate", "--out", "x", "--backend", "a", "--backend", "b"]).backend == ["a", "b"]


def test_version_and_help_say_what_a_user_needs(capsys):
    import pytest

    import rl_engine
    from rl_engine import OPS
    from rl_engine.cli import cmd_gate
    from rl_engine.cli.main import build_parser
    from rl_engine.gate.runner import JUDGMENTS

    assert cmd_gate.JUDGMENT_NAMES == JUDGMENTS
    from rl_engine.gate.plan import CROSS_BACKEND_SCOPES

    assert cmd_gate.CROSS_BACKEND_SCOPES == CROSS_BACKEND_SCOPES
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and rl_engine.__version__ in capsys.readouterr().out
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert "examples:" in text and "exit codes:" in text and "143" in text, name
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help text"
    gate = sub.choices["gate"].format_help()
    assert all(op in gate for op in OPS) and all(j in gate for j in JUDGMENTS)
    # the two parity commands state their different default profiles, each naming the other
    assert "parity-report defaults to ws1" in " ".join(sub.choices["parity"].format_help().split())
    assert "rl-engine parity defaults to strict" in " ".join(sub.choices["parity-report"].format_help().split())


def test_a_command_that_fails_to_import_is_an_error_not_a_missing_command(monkeypatch):
    import builtins
    import sys

    import pytest

    from rl_engine.cli.main import build_parser

    real = builtins.__import__

    def broken(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "rl_engine.cli.cmd_bench" or (name == "rl_engine.cli" and fromlist and "cmd_bench" in fromlist):
            raise ImportError("planted: cmd_bench is broken")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.delitem(sys.modules, "rl_engine.cli.cmd_bench")
    monkeypatch.delattr("rl_engine.cli.cmd_bench", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ImportError, match="planted"):
        build_parser()
