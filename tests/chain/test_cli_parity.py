"""``rl-engine parity`` and ``rl-engine parity-report`` (exit codes 0 / 1 / 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rl_engine.cli.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    """The FP32 reference chain on tiny-smoke: its two styles differ in the last FP32 bits."""
    out = tmp_path_factory.mktemp("parity")
    rc = main(["parity", "--model", "tiny-smoke", "--backend", "reference_fp32", "--seeds", "0", "1",
               "--logit-scale", "1", "4", "--profile", "ws1", "--no-reference", "--dump", "--out", str(out)])
    return rc, out


def test_parity_writes_json_and_passes_ws1(ref_run):
    rc, out = ref_run
    assert rc == 0
    data = json.loads((out / "parity.json").read_text())
    assert data["schema_version"] == "rl_engine.parity/1" and data["backend"] == "reference_fp32"
    assert data["seeds"] == [0, 1] and [r["logit_scale"] for r in data["runs"]] == [1.0, 4.0]
    assert data["active_tokens"] == 2 * 6
    assert data["sampling"] == {"temperature": 1.0, "top_k": None, "top_p": None,
                                "tokens": "fed from the fixture (teacher-forced decode), not sampled"}
    assert len(data["runs"][0]["fixture"]["fixture_hash"]) == 64
    assert data["aggregate"]["ws1"]["passed"] and not data["aggregate"]["strict"]["passed"]
    fd = data["runs"][0]["first_divergence"]
    assert fd is not None and fd["op"] and fd["token"]["seq"] >= 0
    for name in ("logp_train.pt", "logp_rollout.pt", "logp_train.jsonl", "logp_rollout.jsonl"):
        assert (out / name).is_file()


def test_parity_report_profiles(capsys, ref_run):
    _, out = ref_run
    rc, text, _ = run(capsys, "parity-report", out / "logp_train.jsonl", out / "logp_rollout.jsonl")
    assert rc == 0 and "chain[ws1] ok" in text
    rc, text, _ = run(capsys, "parity-report", out / "logp_train.pt", out / "logp_rollout.pt", "--profile", "strict")
    assert rc == 1 and "chain[strict] FAIL" in text
    rc, text, _ = run(capsys, "parity-report", out / "logp_train.pt", out / "logp_train.jsonl", "--json")
    data = json.loads(text)
    assert rc == 0 and data["reports"]["strict"]["passed"] and data["aligned"].startswith("by order")


def test_parity_report_npy(capsys, tmp_path):
    a = np.array([-1.5, -2.25, -0.125], dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a.copy())
    rc, text, _ = run(capsys, "parity-report", tmp_path / "a.npy", tmp_path / "b.npy", "--profile", "strict")
    assert rc == 0 and "chain[strict] ok" in text


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(dict(zip(("seq", "pos", "token_id", "logp"), r))) + "\n" for r in rows))


def test_parity_report_misaligned_token_exit_2(capsys, tmp_path):
    _jsonl(tmp_path / "l.jsonl", [(0, 3, 11, -1.0), (0, 4, 12, -2.0), (1, 2, 13, -3.0)])
    _jsonl(tmp_path / "r.jsonl", [(0, 3, 11, -1.0), (0, 5, 12, -2.0), (1, 2, 13, -3.0)])
    rc, _, err = run(capsys, "parity-report", tmp_path / "l.jsonl", tmp_path / "r.jsonl")
    assert rc == 2 and "first misaligned position is entry 1" in err and "seq 0 pos 4" in err and "seq 0 pos 5" in err


def test_parity_report_token_id_mismatch_exit_2(capsys, tmp_path):
    _jsonl(tmp_path / "l.jsonl", [(0, 3, 11, -1.0), (0, 4, 12, -2.0)])
    _jsonl(tmp_path / "r.jsonl", [(0, 4, 99, -2.0), (0, 3, 11, -1.0)])  # order in the file does not matter
    rc, _, err = run(capsys, "parity-report", tmp_path / "l.jsonl", tmp_path / "r.jsonl")
    assert rc == 2 and "entry 1" in err and "token 12" in err and "token 99" in err


def test_parity_report_missing_token_exit_2(capsys, tmp_path):
    _jsonl(tmp_path / "l.jsonl", [(0, 3, 11, -1.0), (0, 4, 12, -2.0)])
    _jsonl(tmp_path / "r.jsonl", [(0, 3, 11, -1.0)])
    rc, _, err = run(capsys, "parity-report", tmp_path / "l.jsonl", tmp_path / "r.jsonl")
    assert rc == 2 and "entry 1" in err and "seq 0 pos 4" in err


def test_parity_report_length_mismatch_tensors_exit_2(capsys, tmp_path):
    torch.save(torch.zeros(5), tmp_path / "a.pt")
    torch.save(torch.zeros(4), tmp_path / "b.pt")
    rc, _, err = run(capsys, "parity-report", tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 2 and "first misaligned position is index 4" in err


@pytest.mark.parametrize("line,word", [('{"seq": 0, "pos": 1, "logp": -1.0}', "token_id"),
                                       ('{"seq": 0, "pos": 1.5, "token_id": 3, "logp": -1.0}', "pos"),
                                       ("not json", "not valid JSON")])
def test_parity_report_bad_jsonl_exit_2(capsys, tmp_path, line, word):
    (tmp_path / "l.jsonl").write_text(line + "\n")
    _jsonl(tmp_path / "r.jsonl", [(0, 1, 3, -1.0)])
    rc, _, err = run(capsys, "parity-report", tmp_path / "l.jsonl", tmp_path / "r.jsonl")
    assert rc == 2 and word in err


def test_parity_report_duplicate_token_exit_2(capsys, tmp_path):
    _jsonl(tmp_path / "l.jsonl", [(0, 3, 11, -1.0), (0, 3, 11, -1.0)])
    _jsonl(tmp_path / "r.jsonl", [(0, 3, 11, -1.0), (0, 4, 11, -1.0)])
    rc, _, err = run(capsys, "parity-report", tmp_path / "l.jsonl", tmp_path / "r.jsonl")
    assert rc == 2 and "appears twice" in err


def test_parity_on_a_checkpoint_directory(capsys, tmp_path):
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.weights import save_checkpoint, synthetic_weights

    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=128)
    save_checkpoint(synthetic_weights(cfg, 3, logit_scale=2.0), tmp_path / "ckpt")
    rc, _, err = run(capsys, "parity", "--model", tmp_path / "ckpt", "--backend", "reference_fp32", "--tokens", "9",
                     "--profile", "ws1", "--out", tmp_path / "out")
    assert rc == 0, err
    data = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert data["model"]["weights"]["kind"] == "checkpoint" and data["active_tokens"] == 9
    assert data["runs"][0]["vs_reference"]["train"]["max_abs_dlogp"] == 0  # reference against itself


@pytest.mark.parametrize("argv,word", [(["--model", "nope-7b"], "not a preset"),
                                       (["--backend", "cuda_bf16"], "cuda_bf16"),
                                       (["--tokens", "0"], "--tokens")])
def test_parity_usage_errors_exit_2(capsys, tmp_path, argv, word):
    if "cuda_bf16" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is present: cuda_bf16 may be available")
    rc, _, err = run(capsys, "parity", "--backend", "reference_fp32", *argv, "--out", tmp_path)
    assert rc == 2 and word in err


def test_parity_baseline_is_printed_beside_ours(capsys, tmp_path):
    rc, _, err = run(capsys, "parity", "--model", "tiny-smoke", "--backend", "reference_fp32", "--seeds", "0",
                     "--profile", "ws1", "--no-reference", "--no-localize", "--baseline", "--out", tmp_path)
    assert rc == 0
    assert "baseline torch_bf16: chain[ws1]" in err
    data = json.loads((tmp_path / "parity.json").read_text())
    assert "baseline_torch_bf16" in data["runs"][0]
