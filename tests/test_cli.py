"""The rl-engine command line, called in-process (``main([...])``) and once as the console script."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_engine.cli.main import main

RL_ENGINE = Path(sys.executable).parent / "rl-engine"


def _s16(u: int) -> int:
    return u - 0x10000 if u >= 0x8000 else u


def _signed_zero_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """Two BF16 [3, 4] tensors equal except element [1, 2]: +0 (0x0000) vs -0 (0x8000)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=g).to(torch.bfloat16)
    a.view(torch.int16)[1, 2] = 0x0000
    b = a.clone()
    b.view(torch.int16)[1, 2] = _s16(0x8000)
    assert float(a[1, 2]) == float(b[1, 2]) == 0
    return a, b


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------
# contract / env


def test_contract_json(capsys):
    rc, out, _ = run(capsys, "contract", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["contract_version"] == "ws1-c1-v8"
    for table in ("forward_accuracy", "gradient_accuracy"):
        assert set(data[table]) == {"elementwise", "reduction", "logprob", "attention"}
        for row in data[table].values():
            assert set(row) == {"float32", "bfloat16", "float16"}
    from rl_engine.contract import load_contract

    c = load_contract()
    assert data["forward_accuracy"] == c.data["forward_accuracy"]
    assert data["gradient_accuracy"] == c.data["gradient_accuracy"]
    newest = [e for e in data["changelog"] if e["version"] == "ws1-c1-v8"]
    assert newest and newest[0]["from"] == "ws1-c1-v7" and len(newest[0]["changes"]) == len(c.data["changelog"][0]["changes"])
    assert data["_sha256"] == c.sha256


def test_contract_text(capsys):
    rc, out, _ = run(capsys, "contract")
    assert rc == 0
    assert "ws1-c1-v8" in out and "forward accuracy" in out and "gradient accuracy" in out and "clip_interval" in out
    assert "cross_backend (cuda_bf16 vs triton_cuda_bf16, bitwise): declared bit-exact embedding" in out


def test_contract_bad_path(capsys, tmp_path):
    p = tmp_path / "missing.json"
    rc, _, err = run(capsys, "contract", "--path", p)
    assert rc == 2 and str(p) in err


def test_env_json(capsys):
    rc, out, _ = run(capsys, "env", "--json")
    assert rc == 0
    info = json.loads(out)
    assert info["device"]["name"]
    assert "torch" in info["software"] and "triton" in info["software"]
    assert set(info["backends"]) == {"reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16"}
    assert info["contract"]["contract_version"] == "ws1-c1-v8"


def test_console_script_works(tmp_path):
    exe = RL_ENGINE if RL_ENGINE.exists() else shutil.which("rl-engine")
    assert exe, "the rl-engine console script is not installed next to this Python"
    res = subprocess.run([str(exe), "contract", "--json"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["contract_version"] == "ws1-c1-v8"
    res = subprocess.run([str(exe), "compare", str(tmp_path / "nope.pt"), str(tmp_path / "nope.pt"),
                          "--mode", "bitwise"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "nope.pt" in res.stderr
    # the gate from a clean environment: without a GPU the CLI turns the Triton interpreter on itself
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["NO_COLOR"] = "1"
    res = subprocess.run([str(exe), "gate", "--ops", "silu", "--judgments", "forward_accuracy", "forward_invariance",
                          "--out", str(tmp_path / "g")], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    ev = json.loads((tmp_path / "g" / "evidence.json").read_text())
    assert ev["complete"] and ev["summary"]["red"] == 0 and ev["summary"]["green"] >= 1


def test_usage_error_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["compare", "a.pt"])
    assert ei.value.code == 2
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------
# compare


def test_compare_pt_signed_zero(capsys, tmp_path):
    a, b = _signed_zero_pair()
    pa, pb = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(a, pa)
    torch.save(b, pb)
    rc, out, err = run(capsys, "compare", pa, pb, "--mode", "bitwise")
    assert rc == 1
    assert "[1, 2]" in out and "0x8000" in out and "0x0000" in out
    assert "canonical_equal" in err
    rc, out, _ = run(capsys, "compare", pa, pb, "--mode", "accuracy")
    assert rc == 0, out
    rc, out, _ = run(capsys, "compare", pa, pb, "--mode", "bitwise", "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["first_index"].endswith("[1, 2]") and rep["differing"] == 1
    rc, _, _ = run(capsys, "compare", pa, pa, "--mode", "bitwise")
    assert rc == 0


def test_compare_pt_dict_with_key(capsys, tmp_path):
    a, b = _signed_zero_pair()
    torch.save({"y": a, "z": b}, tmp_path / "a.pt")
    torch.save({"y": b, "z": b}, tmp_path / "b.pt")
    rc, _, err = run(capsys, "compare", tmp_path / "a.pt", tmp_path / "b.pt", "--mode", "bitwise")
    assert rc == 2 and "--key" in err
    rc, out, _ = run(capsys, "compare", tmp_path / "a.pt", tmp_path / "b.pt", "--mode", "bitwise", "--key", "y")
    assert rc == 1 and "[1, 2]" in out
    rc, _, _ = run(capsys, "compare", tmp_path / "a.pt", tmp_path / "b.pt", "--mode", "bitwise", "--key", "z")
    assert rc == 0


def test_compare_npy_float32_signed_zero(capsys, tmp_path):
    a, b = (t.float() for t in _signed_zero_pair())  # numpy has no bfloat16
    np.save(tmp_path / "a.npy", a.numpy())
    np.save(tmp_path / "b.npy", b.numpy())
    rc, out, _ = run(capsys, "compare", tmp_path / "a.npy", tmp_path / "b.npy", "--mode", "bitwise")
    assert rc == 1 and "[1, 2]" in out and "0x80000000" in out
    rc, _, _ = run(capsys, "compare", tmp_path / "a.npy", tmp_path / "b.npy", "--mode", "accuracy")
    assert rc == 0


def test_compare_safetensors_signed_zero(capsys, tmp_path):
    from safetensors.torch import save_file

    a, b = _signed_zero_pair()
    save_file({"t": a}, str(tmp_path / "a.safetensors"))
    save_file({"t": b}, str(tmp_path / "b.safetensors"))
    rc, out, _ = run(capsys, "compare", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--mode", "bitwise")
    assert rc == 1 and "[1, 2]" in out
    rc, _, _ = run(capsys, "compare", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--mode", "accuracy")
    assert rc == 0
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    rc, _, err = run(capsys, "compare", tmp_path / "junk.safetensors", tmp_path / "b.safetensors", "--mode", "bitwise")
    assert rc == 2 and "junk.safetensors" in err


def test_compare_accuracy_failure_exit_1(capsys, tmp_path):
    a, _ = _signed_zero_pair()
    b = a.clone()
    b.view(torch.int16)[0, 0] ^= _s16(0x4000)  # flip an exponent bit: far outside any tolerance
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    rc, out, _ = run(capsys, "compare", tmp_path / "a.pt", tmp_path / "b.pt", "--mode", "accuracy")
    assert rc == 1 and "FAIL" in out and "[0, 0]" in out


def test_compare_missing_file(capsys, tmp_path):
    a, _ = _signed_zero_pair()
    torch.save(a, tmp_path / "a.pt")
    missing = tmp_path / "does" / "not" / "exist.pt"
    rc, _, err = run(capsys, "compare", tmp_path / "a.pt", missing, "--mode", "bitwise")
    assert rc == 2 and str(missing) in err


def test_compare_unknown_suffix(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("1 2 3")
    rc, _, err = run(capsys, "compare", tmp_path / "a.txt", tmp_path / "a.txt", "--mode", "bitwise")
    assert rc == 2 and "a.txt" in err


def test_compare_shape_mismatch(capsys, tmp_path):
    torch.save(torch.zeros(2, 3, dtype=torch.bfloat16), tmp_path / "a.pt")
    torch.save(torch.zeros(3, 2, dtype=torch.bfloat16), tmp_path / "b.pt")
    for mode in ("bitwise", "accuracy"):
        rc, _, err = run(capsys, "compare", tmp_path / "a.pt", tmp_path / "b.pt", "--mode", mode)
        assert rc == 2 and "[2, 3]" in err and "[3, 2]" in err


class _Payload:
    """Unpickling this runs code that creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


@pytest.mark.parametrize("fmt", ["raw_pickle", "torch_save"])
def test_compare_refuses_malicious_pt(capsys, tmp_path, fmt):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pt"
    if fmt == "raw_pickle":
        evil.write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    else:
        torch.save({"t": _Payload(marker)}, evil)
    good = tmp_path / "good.pt"
    torch.save(torch.zeros(2), good)
    rc, _, err = run(capsys, "compare", evil, good, "--mode", "bitwise")
    assert rc == 2
    assert "evil.pt" in err and "refused" in err
    assert not marker.exists(), "the payload ran: the loader executed code from the file"
    # the payload is live: an unrestricted unpickler does run it (proves the test can fail)
    if fmt == "raw_pickle":
        pickle.loads(evil.read_bytes())
        assert marker.exists()


def test_compare_refuses_pickled_npy(capsys, tmp_path):
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = {"a": 1}, [1, 2]
    np.save(tmp_path / "obj.npy", arr, allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.zeros(2, dtype=np.float32))
    rc, _, err = run(capsys, "compare", tmp_path / "obj.npy", tmp_path / "ok.npy", "--mode", "bitwise")
    assert rc == 2 and "obj.npy" in err and "pickle" in err


# ------------------------------------------------------------------------------------------------
# gate, report, diff


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate") / "run1"
    rc = main(["gate", "--ops", "silu", "--workload", "smoke", "--out", str(out)])
    return rc, out


def test_gate_smoke_silu(gate_dir):
    rc, out = gate_dir
    assert rc == 0
    for name in ("evidence.json", "report.md", "report.html"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    ev = json.loads((out / "evidence.json").read_text())
    assert ev["complete"] is True and ev["ops"] == ["silu"] and ev["summary"]["red"] == 0
    assert ev["workload"]["name"] == "smoke"


def test_gate_json_summary(capsys, tmp_path):
    rc, out, _ = run(capsys, "gate", "--ops", "silu", "--judgments", "forward_accuracy", "--out", tmp_path / "o",
                     "--json")
    assert rc == 0
    s = json.loads(out)
    judged = json.loads(Path(s["evidence"]).read_text())["backends"]["judged"]
    assert judged  # every backend that can run here: one on a CPU, the Triton and CUDA kernels on a GPU
    # one op x one judgment: exactly one cell per judged backend, all green
    assert s["summary"]["green"] == len(judged) and s["summary"].get("red", 0) == 0 and s["root_cause"] is None


@pytest.mark.parametrize("argv, words", [
    (["--ops", "silu", "nonsense_op"], ["nonsense_op", "embedding", "batch_invariant_logp"]),
    (["--ops", "silu", "--backend", "nonsense_backend"], ["nonsense_backend", "triton_cuda_bf16", "cuda_bf16"]),
    (["--ops", "silu", "--workload", "nonsense_workload"], ["nonsense_workload", "smoke", "qwen3-8b"]),
    (["--ops", "silu", "--judgments", "nonsense_judgment"], ["nonsense_judgment", "forward_accuracy"]),
    (["--ops", "silu", "--backend", "fp8"], ["fp8", "out of scope"]),
])
def test_gate_unknown_names_exit_2(capsys, tmp_path, argv, words):
    rc, _, err = run(capsys, "gate", *argv, "--out", tmp_path / "o")
    assert rc == 2
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "o" / "evidence.json").exists()


def test_gate_out_is_a_file(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, _, err = run(capsys, "gate", "--ops", "silu", "--out", f)
    assert rc == 2 and str(f) in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gate_cuda_backend_without_gpu(capsys, tmp_path):
    rc, _, err = run(capsys, "gate", "--ops", "silu", "--backend", "cuda_bf16", "--out", tmp_path / "o")
    assert rc == 2 and "cuda_bf16" in err and "no CUDA GPU" in err


def test_report_rerenders(capsys, gate_dir, tmp_path):
    _, out = gate_dir
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(out / "evidence.json", copy / "evidence.json")
    rc, stdout, _ = run(capsys, "report", copy)
    assert rc == 0
    assert (copy / "report.md").read_text() == (out / "report.md").read_text()
    assert "data:image/png;base64," in (copy / "report.html").read_text()
    assert "report.md" in stdout


def test_report_bad_evidence(capsys, tmp_path):
    rc, _, err = run(capsys, "report", tmp_path)
    assert rc == 2 and "evidence" in err
    (tmp_path / "evidence.json").write_text("{ not json")
    rc, _, err = run(capsys, "report", tmp_path)
    assert rc == 2 and "line 1" in err
    (tmp_path / "evidence.json").write_text(json.dumps({"kind": "gate"}))
    rc, _, err = run(capsys, "report", tmp_path)
    assert rc == 2 and "schema" in err


def _gzipped_copy(src: Path, folder: Path) -> Path:
    """``folder/evidence.json.gz`` holding ``src``'s bytes, as older committed gate folders store it."""
    import gzip

    folder.mkdir()
    (folder / "evidence.json.gz").write_bytes(gzip.compress(src.read_bytes(), compresslevel=9, mtime=0))
    return folder / "evidence.json.gz"


def test_report_and_diff_read_a_gzipped_evidence_folder(capsys, gate_dir, tmp_path):
    """Gate folders other than the newest are committed with evidence.json.gz (evidence/README.md):
    the loader, report and diff read it as the folder's evidence, or as a path given directly."""
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    gz = _gzipped_copy(out / "evidence.json", tmp_path / "gz")
    plain = evidence_io.load(out / "evidence.json")
    assert evidence_io.load(gz.parent) == evidence_io.load(gz) == plain == evidence_io.load(out)
    rc, stdout, _ = run(capsys, "report", gz.parent)
    assert rc == 0 and "report.md" in stdout
    assert (gz.parent / "report.md").read_text() == (out / "report.md").read_text()
    assert (gz.parent / "report.html").is_file()
    for new in (gz.parent, gz):
        rc, stdout, _ = run(capsys, "diff", "--same-bits", out, new)
        assert rc == 0 and "same bits: yes" in stdout, stdout


def test_a_folder_with_both_evidence_files_is_refused(capsys, gate_dir, tmp_path):
    from rl_engine.errors import RLEngineError
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    both = _gzipped_copy(out / "evidence.json", tmp_path / "both").parent
    shutil.copy(out / "evidence.json", both / "evidence.json")
    with pytest.raises(RLEngineError, match="ambiguous"):
        evidence_io.load(both)
    for argv in (("report", both), ("diff", out, both)):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and "ambiguous" in err and str(both) in err, err
    assert not (both / "report.md").exists()
    # naming one of the two files picks it, with nothing to guess
    assert evidence_io.load(both / "evidence.json") == evidence_io.load(both / "evidence.json.gz")


def test_a_corrupt_gzipped_evidence_file_is_an_error_naming_it(capsys, gate_dir, tmp_path):
    import gzip

    from rl_engine.errors import RLEngineError
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    gz = _gzipped_copy(out / "evidence.json", tmp_path / "bad")
    whole = gz.read_bytes()
    for name, data, says in (("not gzip", b"{ plain JSON, not gzip }", "gzip"),
                             ("cut short", whole[:len(whole) // 2], "gzip"),
                             ("gzip of no JSON", gzip.compress(b"{ not json", mtime=0), "line 1")):
        gz.write_bytes(data)
        with pytest.raises(RLEngineError) as ei:
            evidence_io.load(gz.parent)
        assert str(gz) in str(ei.value) and says in str(ei.value), (name, ei.value)
        rc, _, err = run(capsys, "report", gz.parent)
        assert rc == 2 and str(gz) in err and "Traceback" not in err, (name, err)


def test_diff_lists_changed_cells(capsys, gate_dir, tmp_path):
    _, out = gate_dir
    ev = json.loads((out / "evidence.json").read_text())
    rc, stdout, _ = run(capsys, "diff", out, out / "evidence.json")
    assert rc == 0 and "no cell changed" in stdout
    new = json.loads(json.dumps(ev))
    cell = next(c for c in new["cells"] if c["judgment"] == "forward_invariance" and c["transform"] == "batch")
    cell["status"], cell["reason"] = "red", "planted by the test"
    new["summary"]["green"] -= 1
    new["summary"]["red"] += 1
    acc = next(c for c in new["cells"] if c["judgment"] == "forward_accuracy")
    acc["details"]["reports"][0]["accuracy"]["max_abs_error"] *= 2
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "evidence.json").write_text(json.dumps(new))
    rc, stdout, _ = run(capsys, "diff", out, tmp_path / "new")
    assert rc == 1
    assert "silu/triton_cuda_bf16/forward_invariance/batch: green -> red" in stdout
    assert "silu/triton_cuda_bf16/forward_accuracy: green -> green" in stdout and "max_abs" in stdout
    assert stdout.strip().splitlines()[-1] == ("2 cells differ: 1 changed status (1 green -> red), "
                                               "1 changed only their max_abs_error or bits")
    rc, stdout, _ = run(capsys, "diff", out, tmp_path / "new", "--json")
    d = json.loads(stdout)
    assert d["status_changes"] == 1 and len(d["changes"]) == 2


def test_diff_same_bits_compares_every_cells_digest(capsys, gate_dir, tmp_path):
    _, out = gate_dir
    ev = json.loads((out / "evidence.json").read_text())
    assert all(c["details"].get("bits_digest") for c in ev["cells"] if c["status"] != "n/a")
    rc, stdout, _ = run(capsys, "diff", out, out, "--same-bits")
    assert rc == 0 and "same bits: yes" in stdout
    new = json.loads(json.dumps(ev))
    variables = new["provenance"]["software"]["host_arithmetic"]["variables"]
    before = variables.get("OPENBLAS_CORETYPE")
    variables["OPENBLAS_CORETYPE"] = "PlantedByTheTest"
    cell = next(c for c in new["cells"] if c["judgment"] == "repeat")
    cell["details"]["bits_digest"] = "0" * 32  # the status stays green: only the bits moved
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "evidence.json").write_text(json.dumps(new))
    rc, stdout, _ = run(capsys, "diff", out, tmp_path / "new", "--same-bits")
    assert rc == 1 and "same bits: NO" in stdout
    assert "silu/triton_cuda_bf16/repeat: green -> green" in stdout and "bits differ" in stdout
    assert f"OPENBLAS_CORETYPE: {before} -> PlantedByTheTest" in stdout
    rc, stdout, _ = run(capsys, "diff", out, tmp_path / "new")
    assert rc == 0, "without --same-bits a bit change alone is reported, not a failure"


def test_diff_of_runs_sharing_no_cell_exits_2(capsys, gate_dir, tmp_path):
    """Issue #36: two runs of different ops used to exit 0 with "no cell changed" after comparing
    nothing. Now it is exit 2 (the artifacts cannot be compared, as for unlike workloads)."""
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    ev = json.loads((out / "evidence.json").read_text())
    other = dict(ev, ops=["swiglu"], cells=[dict(c, op="swiglu") for c in ev["cells"]])
    (tmp_path / "other").mkdir()
    evidence_io.write_atomic(tmp_path / "other" / "evidence.json", other)
    for extra in ([], ["--json"], ["--same-bits"], ["--allow-different"]):
        rc, stdout, err = run(capsys, "diff", out, tmp_path / "other", *extra)
        assert rc == 2, extra
        assert "no cell in common, so nothing was compared" in err and "ops silu" in err and "ops swiglu" in err
        assert "no cell changed" not in stdout
    # control: a run sharing its cells, with the same bits, compares and passes
    (tmp_path / "same").mkdir()
    evidence_io.write_atomic(tmp_path / "same" / "evidence.json", ev)
    rc, stdout, err = run(capsys, "diff", out, tmp_path / "same", "--same-bits")
    assert rc == 0 and "same bits: yes" in stdout and "no cell in common" not in err
    rc, stdout, _ = run(capsys, "diff", out, tmp_path / "same")
    assert rc == 0 and "no cell changed" in stdout


def test_diff_help_documents_its_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["diff", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "2 when the two cannot be compared" in text and "no cell in common" in text


def test_diff_counts_cells_outside_the_other_runs_matrix_instead_of_listing_them(capsys, gate_dir, tmp_path):
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    ev = json.loads((out / "evidence.json").read_text())
    small = dict(ev, judgments=["forward_accuracy"], seed=ev["seed"] + 1,
                 cells=[c for c in ev["cells"] if c["judgment"] == "forward_accuracy"])
    (tmp_path / "small").mkdir()
    evidence_io.write_atomic(tmp_path / "small" / "evidence.json", small)
    rc, stdout, err = run(capsys, "diff", out, tmp_path / "small")
    dropped = len(ev["cells"]) - len(small["cells"])
    assert f"{dropped} cells only in OLD and 0 only in NEW" in stdout
    assert "absent" not in stdout
    assert "different seeds" in err


def test_diff_a_run_without_the_chain_does_not_list_the_chain_cross_backend_cell(capsys, gate_dir, tmp_path):
    """A gate of a few ops (--ops) judges cross_backend but not chain_parity, so it has no
    chain/cuda_bf16/cross_backend cell: the diff counts that cell as outside the run's matrix
    (it once listed it as 'n/a -> absent' and so failed --same-bits)."""
    from rl_engine.gate import evidence as evidence_io

    _, out = gate_dir
    ev = json.loads((out / "evidence.json").read_text())
    chain_cell = dict(ev["cells"][0], op="chain", backend="cuda_bf16", judgment="cross_backend", transform=None,
                      status="n/a", reason="not declared", details={})
    full = dict(ev, judgments=[*ev["judgments"], "cross_backend"], cells=[*ev["cells"], chain_cell],
                backends=dict(ev["backends"], judged=[*ev["backends"]["judged"], "cuda_bf16"]))
    few = dict(ev, judgments=[j for j in full["judgments"] if j != "chain_parity"],
               cells=[c for c in ev["cells"] if c["op"] != "chain"], backends=full["backends"])
    for name, doc in (("full", full), ("few", few)):
        (tmp_path / name).mkdir()
        evidence_io.write_atomic(tmp_path / name / "evidence.json", doc)
    rc, stdout, _ = run(capsys, "diff", "--same-bits", tmp_path / "full", tmp_path / "few")
    assert "absent" not in stdout and "same bits: yes" in stdout and rc == 0, stdout
    # control: the same run with chain_parity judged but its chain cells missing is a real absence
    few_chain = dict(few, judgments=[*few["judgments"], "chain_parity"])
    (tmp_path / "few_chain").mkdir()
    evidence_io.write_atomic(tmp_path / "few_chain" / "evidence.json", few_chain)
    rc, stdout, _ = run(capsys, "diff", "--same-bits", tmp_path / "full", tmp_path / "few_chain")
    assert "chain/cuda_bf16/cross_backend: n/a -> absent" in stdout and rc == 1, stdout
