"""``rl-engine bench``: CLI exits, the dry run's bench.json, exact FLOP / byte counts, and the row
logic of a measured run with a fake timer. Speed is never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_engine.bench import counts
from rl_engine.bench.targets import TARGETS, target_for
from rl_engine.cli.main import main

RL_ENGINE = Path(sys.executable).parent / "rl-engine"
DEFAULT_ROW_COUNT = 396
"""Rows of a default run (6 token counts, both backends), counted by hand:
det_gemm 4 projections x 2 backends x (2 decode tokens x 2 baselines + 4 prefill tokens x 3 products) = 128;
lm_head 6 x 2 = 12; attention fwd 4 x 2 = 8, fwd+bwd 8, decode 3 x 2 x 2 = 12;
rms_norm / rope / swiglu 6 x 2 x 3 = 36 each; silu 6 x 2 x 2 = 24; linear_logp 6 x 2 x 2 x 2 = 48;
chain_decode 2 contexts x 3 batches x 2 backends x (graph: 2 baselines, but 1 at B = 64, context 8192;
eager: 1) = 34; chain_generate 2; chain_teacher_forcing 2 shapes x 2 = 4; chain_train_step
2 shapes x (time, memory) x 2 = 8."""


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------
# CLI exits


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_exits_2(capsys, tmp_path):
    rc, _, err = run(capsys, "bench", "--out", tmp_path / "b")
    assert rc == 2
    assert "benchmarks need a CUDA GPU; none here" in err
    assert not (tmp_path / "b" / "bench.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--ops", "no_such_op"], "unknown bench op 'no_such_op'"),
    (["--ops", "rms_norm", "gemmm"], "unknown bench op 'gemmm'"),
    (["--backend", "no_such_backend"], "unknown bench backend no_such_backend"),
    (["--backend", "torch_bf16"], "unknown bench backend torch_bf16"),
    (["--tokens", "0"], "--tokens must be positive"),
])
@pytest.mark.parametrize("dry", [False, True])
def test_bad_usage_exits_2(capsys, tmp_path, argv, needle, dry):
    rc, _, err = run(capsys, "bench", "--out", tmp_path / "b", *argv, *(["--dry-run"] if dry else []))
    assert rc == 2
    assert needle in err


def test_out_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dry-run"])
    assert exc.value.code == 2


# ------------------------------------------------------------------------------------------------
# dry run


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One full default dry run through the console script, with TRITON_INTERPRET unset so the
    CLI must switch the interpreter on itself before any kernel is imported."""
    out = tmp_path_factory.mktemp("bench") / "dry"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if torch.cuda.is_available():
        pytest.skip("the CPU dry run is checked on machines without a GPU")
    proc = subprocess.run([str(RL_ENGINE), "bench", "--dry-run", "--out", str(out), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc, out


def test_dry_run_cli(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["summary"]["rows"] == DEFAULT_ROW_COUNT
    assert summary["summary"]["measured"] == 0 and summary["summary"]["errors"] == 0
    assert "backend cuda_bf16 skipped" in proc.stderr  # the printed reason
    assert summary["bench_png"] == str(out / "bench.png")


def test_dry_run_bench_json_valid_and_complete(dry_run):
    from rl_engine.bench import report
    from rl_engine.bench.runner import BENCH_OPS, SCHEMA_VERSION

    _, out = dry_run
    doc = report.load(out / "bench.json")  # validates against bench.schema.json
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["complete"] is True and doc["dry_run"] is True
    assert doc["provenance"]["triton_interpret"] is True
    assert doc["peaks"]["copy_gbps"] is None and doc["peaks"]["cublas_tflops"] is None
    rows = doc["rows"]
    assert len(rows) == DEFAULT_ROW_COUNT
    assert {r["op"] for r in rows} == set(BENCH_OPS)
    for r in rows:
        assert r["value"] is None and r["baseline_value"] is None and r["ratio"] is None
        assert r["meets_target"] is None and r["spread"] is None
        assert r["dry_run_shape"] is not None
    # every (op, variant, tokens, shape, backend, baseline) appears exactly once (chain_decode: one per context)
    keys = [(r["op"], r["variant"], r["tokens"], r["shape"], r["backend"], r["baseline"]) for r in rows]
    assert len(set(keys)) == len(keys)
    # the cuda_bf16 backend is skipped with its reason; the Triton one ran every callable
    cuda = [r for r in rows if r["backend"] == "cuda_bf16"]
    assert len(cuda) == DEFAULT_ROW_COUNT // 2
    assert all(r["status"] == "skipped" and "no CUDA GPU" in r["note"] for r in cuda)
    triton_rows = [r for r in rows if r["backend"] == "triton_cuda_bf16"]
    assert all(r["status"] == "dry-run" for r in triton_rows)
    liger = [r for r in rows if "Liger" in r["baseline"]]
    assert {r["op"] for r in liger} == {"rms_norm", "rope", "swiglu", "linear_logp"}
    try:
        import liger_kernel  # noqa: F401
        installed = True
    except ImportError:
        installed = False
    if not installed:
        assert all(r["baseline_status"] == "not installed" for r in liger)
    hf = [r for r in triton_rows if "Hugging Face" in r["baseline"]]  # chain_decode's GPU-only baseline
    assert hf and all(r["baseline_status"] == "skipped" and "needs a CUDA GPU" in r["baseline_note"] for r in hf)
    others = [r for r in triton_rows if "Liger" not in r["baseline"] and "Hugging Face" not in r["baseline"]]
    assert all(r["baseline_status"] == "dry-run" for r in others)


def test_dry_run_targets_on_the_right_rows(dry_run):
    from rl_engine.bench import report

    doc = report.load(dry_run[1] / "bench.json")

    def row(op, tokens, baseline, variant=None):
        hits = [r for r in doc["rows"] if r["op"] == op and r["tokens"] == tokens and r["baseline"] == baseline
                and r["backend"] == "triton_cuda_bf16" and (variant is None or r["variant"] == variant)]
        assert len(hits) == 1, (op, tokens, baseline, variant)
        return hits[0]

    cublas = "torch.matmul (cuBLAS)"
    assert row("det_gemm", 1024, cublas, "down_proj")["target"] == TARGETS["det_gemm.prefill"].target_ratio
    assert row("det_gemm", 128, cublas, "down_proj")["target"] is None
    assert row("det_gemm", 16, "copy bandwidth", "down_proj")["target"] == TARGETS["det_gemm.decode"].target_ratio
    assert row("det_gemm", 16, cublas, "down_proj")["target"] is None
    sdpa = "F.scaled_dot_product_attention (flash)"
    assert row("attention_fwd", 4096, sdpa)["target"] == TARGETS["attention.fwd"].target_ratio
    assert row("attention_fwd", 1024, sdpa)["target"] is None
    assert row("attention_fwd_bwd", 8192, sdpa)["target"] == TARGETS["attention.fwd_bwd"].target_ratio
    assert row("attention_fwd_bwd", 1024, sdpa)["target"] is None
    assert row("attention_decode", 16, "copy bandwidth")["target"] == TARGETS["attention.decode"].target_ratio
    for op in ("rms_norm", "rope", "swiglu"):
        r = row(op, 4096, "copy bandwidth")
        assert (r["target"], r["target_sense"], r["metric"]) == (TARGETS[op].target_ratio, ">=", "GB/s")
    assert row("silu", 4096, "copy bandwidth")["target"] is None
    assert row("rms_norm", 16, "copy bandwidth")["target"] is None  # judged from 1024 tokens up
    assert row("det_gemm", 1, "copy bandwidth", "q_proj/o_proj")["target"] == TARGETS["det_gemm.decode"].target_ratio
    assert row("attention_decode", 1, "copy bandwidth")["target"] == TARGETS["attention.decode"].target_ratio
    unfused = "unfused lm_head + log_softmax + gather"
    t = row("linear_logp", 8192, unfused, "fwd+bwd time")
    m = row("linear_logp", 8192, unfused, "fwd+bwd memory")
    assert (t["metric"], t["target"], t["target_sense"]) == ("ms", TARGETS["linear_logp.time"].target_ratio, "<=")
    assert (m["metric"], m["target"], m["target_sense"]) == ("GiB", TARGETS["linear_logp.memory"].target_ratio, "<=")
    assert row("linear_logp", 4096, unfused, "fwd+bwd time")["target"] is None
    # counts are taken at the real Qwen3-8B shapes, never the dry-run ones
    down = row("det_gemm", 1024, cublas, "down_proj")
    assert down["sizes"] == {"M": 1024, "K": 12288, "N": 4096}
    assert down["flops"] == counts.gemm_flops(1024, 4096, 12288) == 2 * 1024 * 4096 * 12288
    lp = row("linear_logp", 8192, unfused, "fwd+bwd time")
    assert lp["flops"] == 6 * 8192 * 4096 * 151936


def test_dry_run_md_and_png(dry_run):
    out = dry_run[1]
    md = (out / "bench.md").read_text()
    assert "DRY RUN" in md
    for op in ("det_gemm", "lm_head", "attention_fwd", "attention_decode", "rms_norm", "linear_logp"):
        assert f"## {op}" in md
    assert "not installed" in md or "Liger" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".bench*"))  # no temporary files left behind


def test_dry_run_backend_subset_in_process(capsys, tmp_path):
    """``--backend cuda_bf16 --dry-run`` without a GPU: every row skipped with the reason, exit 0."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU skip")
    rc, out, err = run(capsys, "bench", "--dry-run", "--ops", "silu", "--backend", "cuda_bf16",
                       "--tokens", "3", "--out", tmp_path / "s", "--json")
    assert rc == 0, err
    doc = json.loads((tmp_path / "s" / "bench.json").read_text())
    assert doc["config"]["backends"] == [] and "cuda_bf16" in doc["config"]["skipped_backends"]
    assert [r["status"] for r in doc["rows"]] == ["skipped", "skipped"]


# ------------------------------------------------------------------------------------------------
# exact counts (integers computed by hand from the formulas in the docstrings)


def test_gemm_counts():
    assert counts.gemm_flops(3, 5, 7) == 210
    assert counts.gemm_bytes(3, 5, 7) == 2 * (3 * 7 + 7 * 5) + 2 * 3 * 5 == 142
    assert counts.gemm_bytes(3, 5, 7, out_bytes=4) == 112 + 60
    assert counts.lm_head_flops(2, 3, 11) == 2 * 2 * 11 * 3 == 132
    assert counts.lm_head_bytes(2, 3, 11) == 2 * (6 + 33) + 4 * 22 == 166


def test_causal_pairs_match_enumeration():
    assert counts.causal_pairs(4, 4) == 1 + 2 + 3 + 4
    assert counts.causal_pairs(2, 5) == 4 + 5
    assert counts.causal_pairs(1, 7) == 7
    for lq, lk in [(1, 1), (3, 3), (5, 9), (16, 16), (7, 30)]:
        visible = torch.ones(lq, lk, dtype=torch.int64).tril(diagonal=lk - lq)
        assert counts.causal_pairs(lq, lk) == int(visible.sum())
    with pytest.raises(ValueError):
        counts.causal_pairs(5, 4)


def test_attention_counts():
    assert counts.attention_flops(10, 2, 8) == 4 * 10 * 2 * 8 == 640
    assert counts.attention_flops(10, 2, 8, backward=True) == 14 * 10 * 2 * 8 == 2240
    # prefill T=3, H=4, Hkv=2, D=8: q/o 3*4*8*2 = 192 bytes each, k/v 3*2*8*2 = 96 each
    assert counts.attention_prefill_bytes(3, 4, 2, 8) == 2 * 192 + 2 * 96 == 576
    assert counts.attention_prefill_bytes(3, 4, 2, 8, backward=True) == 576 + (3 * 192 + 2 * 96) + (192 + 2 * 96)
    assert counts.attention_decode_flops(2, 3, 4, 8) == 4 * 2 * 3 * 4 * 8 == 768
    # decode B=2, L=3, H=4, Hkv=2, D=8: q 128, o 128, K+V 2*2*3*2*8*2 = 384, lens 8
    assert counts.attention_decode_bytes(2, 3, 4, 2, 8) == 128 + 128 + 384 + 8 == 648


def test_elementwise_and_logprob_counts():
    assert counts.rms_norm_bytes(3, 8) == 2 * (3 * 8) * 2 + 8 * 2 == 112
    # rope T=2, H=4, Hkv=2, D=8: q+k 2*6*8 = 96 elements read and written (BF16), cos+sin 2*2*4 FP32
    assert counts.rope_bytes(2, 4, 2, 8) == 96 * 2 * 2 + 2 * 2 * 4 * 4 == 448
    assert counts.swiglu_bytes(3, 5) == 3 * 15 * 2 == 90
    assert counts.silu_bytes(3, 5) == 2 * 15 * 2 == 60
    assert counts.linear_logp_flops(2, 3, 5) == 6 * 2 * 3 * 5 == 180
    assert counts.linear_logp_flops(2, 3, 5, backward=False) == 60
    fwd = 2 * (2 * 3 + 5 * 3) + 8 * 2 + 4 * 2  # hidden + weight, targets int64, logprobs FP32
    assert counts.linear_logp_bytes(2, 3, 5, backward=False) == fwd == 66
    assert counts.linear_logp_bytes(2, 3, 5) == fwd + fwd + 2 * (2 * 3 + 5 * 3) == 174


def test_targets_are_design_data():
    assert {k: (t.target_ratio, t.sense) for k, t in TARGETS.items()} == {
        "det_gemm.prefill": (0.85, ">="), "det_gemm.decode": (0.7, ">="), "attention.fwd": (0.8, ">="),
        "attention.fwd_bwd": (0.7, ">="),
        "attention.decode": (0.6, ">="), "rms_norm": (0.85, ">="), "rope": (0.8, ">="), "swiglu": (0.95, ">="),
        "linear_logp.memory": (1 / 16, "<="), "linear_logp.time": (1.0, "<="), "chain.decode": (1 / 1.5, ">="),
        "chain.teacher_forcing": (1.1, ">="), "chain.train_step": (1.0, ">="), "chain.train_step_memory": (0.7, "<="),
    }
    assert target_for("det_gemm.prefill", 1024) is not None and target_for("det_gemm.prefill", 128) is None
    assert target_for("det_gemm.decode", 16) is not None and target_for("det_gemm.decode", 17) is None
    assert [target_for("attention.fwd", t) is not None for t in (1024, 2048, 8192, 16384)] == [False, True, True, False]
    assert [target_for("swiglu", t) is not None for t in (1, 128, 1024, 8192)] == [False, False, True, True]
    assert TARGETS["linear_logp.time"].met(1.0) and not TARGETS["linear_logp.time"].met(1.2)
    assert TARGETS["rms_norm"].met(0.9) and not TARGETS["rms_norm"].met(0.5)
    # the whole-chain rows: rates higher is better, memory lower is better, at every size
    assert TARGETS["chain.teacher_forcing"].met(1.2) and not TARGETS["chain.teacher_forcing"].met(1.0)
    assert TARGETS["chain.train_step"].met(1.0) and not TARGETS["chain.train_step"].met(0.9)
    assert TARGETS["chain.train_step_memory"].met(0.5) and not TARGETS["chain.train_step_memory"].met(0.8)
    assert all(target_for(k, t) is not None for k in ("chain.teacher_forcing", "chain.train_step",
                                                       "chain.train_step_memory") for t in (8192, 16384))


def test_sdpa_flash_fallbacks(monkeypatch):
    """The SDPA baseline is flash with native GQA, else flash on pre-expanded K/V, else the default
    dispatch; each fallback is named (checked with stand-ins: no GPU here)."""
    import contextlib

    from rl_engine.bench import attention

    monkeypatch.setattr(attention, "_flash_context", lambda device: contextlib.nullcontext())
    cuda = torch.device("cuda")

    def refuse():
        raise RuntimeError("No available kernel. Aborting execution.")

    fn, note = attention._sdpa_fn(cuda, lambda: torch.ones(1), lambda: refuse)
    assert note is None and fn().item() == 1
    fn, note = attention._sdpa_fn(cuda, refuse, lambda: (lambda: torch.zeros(1)))
    assert "K/V expanded to H heads" in note and fn().item() == 0
    fn, note = attention._sdpa_fn(cuda, refuse, lambda: refuse)
    assert "SDPA default dispatch" in note and "No available kernel" in note and fn is refuse
    k, v = torch.arange(2 * 3 * 2).reshape(1, 2, 3, 2), torch.zeros(1, 2, 3, 2)
    ke, _ = attention._expand_kv(k, v, heads=4)
    assert [torch.equal(ke[0, h], k[0, h // 2]) for h in range(4)] == [True] * 4


# ------------------------------------------------------------------------------------------------
# the measured path, with a fake timer (nothing timed, no kernel launched)


@pytest.fixture
def fake_measured(monkeypatch, tmp_path):
    """Patch the timer, memory probe and peaks; shrink the "real" shapes to TINY so inputs are
    cheap. Ours takes 2 ms per call, every baseline 1 ms; ours uses 1 MiB of scratch, baselines
    100 MiB; copy peak 1e-6 GB/s (every bandwidth row meets its target)."""
    from rl_engine.bench import common, runner, timing

    monkeypatch.setattr(runner, "QWEN3_8B", common.TINY)
    who: dict[str, str] = {}
    original = runner._Runner.measure

    def measure(self, make, case, dry_key=None):
        who["now"] = dry_key[-1]
        return original(self, make, case, dry_key)

    def fake_time(fn, warmup_ms, rep_ms):
        ms = 2.0 if who["now"] in runner.BENCH_BACKENDS else 1.0
        return timing.Timing(ms, ms * 0.9, ms * 1.2)

    def fake_memory(fn):
        ours = who["now"] in runner.BENCH_BACKENDS
        return timing.Memory(peak_extra_bytes=(1 if ours else 100) * 2**20 + 4096, result_bytes=4096)

    def fake_peaks(device, warmup_ms, rep_ms, dry_run):
        return {"copy_gbps": 1e-6, "cublas_tflops": 1e-6, "copy_bytes": 2**31, "matmul_flops": 2 * 8192**3,
                "matmul_mnk": [8192, 8192, 8192], "copy_spread": None, "cublas_spread": None}

    monkeypatch.setattr(runner._Runner, "measure", measure)
    monkeypatch.setattr(timing, "time_fn", fake_time)
    monkeypatch.setattr(timing, "time_once", lambda fn: fake_time(fn, 0.0, 0.0))
    monkeypatch.setattr(timing, "time_calls", lambda fn: fake_time(fn, 0.0, 0.0))
    monkeypatch.setattr(timing, "memory_fn", fake_memory)
    monkeypatch.setattr(timing, "measure_peaks", fake_peaks)

    def go(**kw):
        cfg = runner.BenchConfig(ops=kw.get("ops", ["det_gemm", "rms_norm", "attention_decode", "linear_logp"]),
                                 backends=["triton_cuda_bf16"], tokens=kw.get("tokens", [1, 1024, 8192]),
                                 out_dir=tmp_path, skipped_backends={"cuda_bf16": "not here"},
                                 time_budget_s=kw.get("time_budget_s"))
        return runner.run_bench(cfg, log=lambda msg: None)

    return go


def test_measured_rows_ratios_and_verdicts(fake_measured, tmp_path):
    from rl_engine.bench import report

    doc = fake_measured()
    report.write_json(tmp_path / "bench.json", doc)  # schema-valid
    rows = [r for r in doc["rows"] if r["backend"] == "triton_cuda_bf16"]
    assert all(r["status"] == "measured" and r["value"] is not None for r in rows)
    for r in rows:
        if r["baseline_status"] != "measured":  # Liger without liger_kernel
            assert r["baseline_value"] is None and r["ratio"] is None and r["meets_target"] is None
            continue
        assert r["ratio"] == r["value"] / r["baseline_value"]
        if r["target"] is not None:
            ok = r["ratio"] >= r["target"] if r["target_sense"] == ">=" else r["ratio"] <= r["target"]
            assert r["meets_target"] is ok
        else:
            assert r["meets_target"] is None
    prefill = [r for r in rows if r["op"] == "det_gemm" and r["tokens"] >= 1024]
    assert prefill and all(r["ratio"] == 0.5 and r["meets_target"] is False for r in prefill)  # 1 ms / 2 ms
    assert all(r["spread"]["p20_ms"] <= r["spread"]["median_ms"] <= r["spread"]["p80_ms"] for r in prefill)
    bandwidth = [r for r in rows if r["baseline"] == "copy bandwidth" and r["target"] is not None]
    assert bandwidth and all(r["meets_target"] is True for r in bandwidth)
    t8k = [r for r in rows if r["op"] == "linear_logp" and r["tokens"] == 8192 and r["target"] is not None]
    by_metric = {r["metric"]: r for r in t8k}
    assert by_metric["ms"]["ratio"] == 2.0 and by_metric["ms"]["meets_target"] is False
    assert by_metric["GiB"]["value"] == 1 / 1024 and by_metric["GiB"]["meets_target"] is True
    assert all(r["status"] == "skipped" and r["note"] == "not here" for r in doc["rows"] if r["backend"] == "cuda_bf16")
    s = doc["summary"]
    assert s["targets_missed"] == len(prefill) + 1 and s["targets_met"] == len(bandwidth) + 1
    md = report.render_md(doc)
    assert "**MISSES** by 0.350x" in md and "below target" in md and "% over target" in md
    assert f"{len(prefill) + 1} miss it" in md
    assert report.write_png(tmp_path / "bench.png", doc)


def test_time_budget_skips_remaining_cases(fake_measured):
    doc = fake_measured(ops=["rms_norm"], tokens=[1, 16], time_budget_s=0.0)
    assert doc["complete"] is True
    assert all(r["status"] == "skipped" and "time budget" in r["note"] for r in doc["rows"])


# ------------------------------------------------------------------------------------------------
# on a GPU: a short real run (never asserts speed)


@pytest.mark.gpu
def test_real_bench_short(tmp_path):
    proc = subprocess.run([str(RL_ENGINE), "bench", "--ops", "rms_norm", "det_gemm", "--tokens", "16", "1024",
                           "--backend", "triton_cuda_bf16", "--warmup-ms", "2", "--rep-ms", "5",
                           "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from rl_engine.bench import report

    doc = report.load(tmp_path / "bench.json")
    assert doc["peaks"]["copy_gbps"] > 0 and doc["peaks"]["cublas_tflops"] > 0
    for r in doc["rows"]:
        assert r["status"] == "measured" and r["value"] > 0 and r["ratio"] > 0
        assert r["spread"]["p20_ms"] <= r["spread"]["median_ms"] <= r["spread"]["p80_ms"]


def test_chain_decode_bound_counts_every_weight_once_and_the_kv_cache():
    """The weight + KV-read bound of one Qwen3-8B decode step, written out by hand, and the rows
    that carry the chain.decode target (the graph rows at the three (B, context) of issue #19)."""
    from rl_engine.bench import chain
    from rl_engine.bench.common import QWEN3_8B
    from rl_engine.chain.config import get_config

    c = get_config("qwen3-8b")
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 12288 * 4096 + 2 * 4096 + 2 * 128
    weights = 36 * per_layer + 4096 + 151936 * 4096  # layers, final norm, lm_head (untied)
    assert chain.step_bytes(c, 1, 0) == 2 * (weights + 4096)  # + one embedding row, not the table
    assert chain.step_bytes(c, 2, 10) - chain.step_bytes(c, 2, 0) == 2 * (2 * 36 * 2 * 10 * 8 * 128)
    cases = chain.cases("chain_decode", [], quick=False)
    targeted = [k for k in cases if any(b.target for b in k.baselines)]
    assert sorted((k.tokens, k.sizes(QWEN3_8B, k.tokens)["context"]) for k in targeted) == sorted(chain.TARGETED)
    assert {k.variant for k in targeted} == {"graph"} and {k.variant for k in cases} == {"graph", "eager"}


def test_chain_generate_bound_sums_the_decode_steps():
    """The generation row's bytes: decode step i (1 .. C-1) reads every weight and a cache of P + i
    positions per sequence; the first token comes from the prefill, which is not counted."""
    from rl_engine.bench import chain
    from rl_engine.chain.config import get_config

    c = get_config("qwen3-8b")
    assert chain.generate_bytes(c, 64, 128, 1) == 0
    assert chain.generate_bytes(c, 64, 128, 3) == chain.step_bytes(c, 64, 129) + chain.step_bytes(c, 64, 130)
    (case,) = chain.cases("chain_generate", [], quick=False)
    assert case.measure == "once" and case.sizes(chain.QWEN3_8B, 64)["C"] == 512


# ------------------------------------------------------------------------------------------------
# whole-chain teacher forcing and train step (issue #33)

CHAIN_TF_OPS = ("chain_teacher_forcing", "chain_train_step")
CHAIN_TF_TARGET = {("chain_teacher_forcing", "time"): ("chain.teacher_forcing", "tokens/s"),
                   ("chain_train_step", "time"): ("chain.train_step", "tokens/s"),
                   ("chain_train_step", "memory"): ("chain.train_step_memory", "GiB")}


def test_tokens_per_second_from_a_time():
    """tokens/s = the case's real token count / the time; the other metrics ignore the count."""
    from rl_engine.bench import runner
    from rl_engine.bench.common import HIGHER_IS_BETTER, METRICS

    assert "tokens/s" in METRICS and HIGHER_IS_BETTER["tokens/s"] is True
    assert runner._from_ms("tokens/s", 500.0, 7, 11, 8192) == 16384.0  # 8192 tokens in half a second
    assert runner._from_ms("tokens/s", 4.0, 7, 11, 16384) == 4096000.0
    assert runner._from_ms("tokens/s", 0.0, 7, 11, 8192) is None
    assert runner._from_ms("ms", 2.5, 7, 11, 8192) == 2.5
    assert runner._from_ms("GB/s", 2.0, 7, 4_000_000, 8192) == 2.0
    assert runner._from_ms("TFLOP/s", 2.0, 4 * 10**9, 11, 8192) == 2.0


def test_chain_teacher_forcing_counts():
    """FLOPs and bytes of the teacher-forcing and train-step rows at Qwen3-8B, written out by hand."""
    from rl_engine.bench import chain
    from rl_engine.chain.config import get_config

    c = get_config("qwen3-8b")
    projections = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 12288 * 4096  # q, o; k, v; gate, up, down
    params = 36 * projections + 151936 * 4096  # + lm_head; the embedding is a gather
    assert chain.matmul_params(c) == params
    pairs = 36 * 8 * (1024 * 1025 // 2)  # causal (query, key) pairs of 8 sequences of 1024, every layer
    assert chain.teacher_forcing_flops(c, 8, 1024) == 2 * 8192 * params + 4 * pairs * 32 * 128
    assert chain.teacher_forcing_flops(c, 8, 1024, backward=True) == 3 * 2 * 8192 * params + 14 * pairs * 32 * 128
    embed = 151936 * 4096
    others = 36 * (projections + 2 * 4096 + 2 * 128) + 4096 + 151936 * 4096  # layers, final norm, lm_head
    fwd = 2 * (others + 8192 * 4096) + 8 * 8192 * 2 + 4 * 8192  # 8192 embedding rows; ids, targets; logprobs
    assert chain.teacher_forcing_bytes(c, 8, 1024) == fwd
    assert chain.teacher_forcing_bytes(c, 8, 1024, backward=True) == fwd + 2 * others + 2 * (others + embed)


def test_chain_teacher_forcing_cases():
    from rl_engine.bench import chain
    from rl_engine.bench.common import QWEN3_8B
    from rl_engine.bench.runner import ALIASES, resolve_ops

    assert resolve_ops(["chain"])[-2:] == list(CHAIN_TF_OPS) and set(CHAIN_TF_OPS) <= set(resolve_ops(["all"]))
    assert set(CHAIN_TF_OPS) <= set(ALIASES["chain"])
    for quick, shapes in ((False, {(8, 1024), (2, 8192)}), (True, {(8, 1024)})):
        tf = chain.cases("chain_teacher_forcing", [], quick=quick)
        train = chain.cases("chain_train_step", [], quick=quick)
        assert {(k.variant, k.measure, k.metric) for k in tf} == {("time", "calls", "tokens/s")}
        assert {(k.variant, k.measure, k.metric) for k in train} == {("time", "calls", "tokens/s"),
                                                                    ("memory", "memory", "GiB")}
        assert len(tf) == len(shapes) and len(train) == 2 * len(shapes)
        for k in tf + train:
            s = k.sizes(QWEN3_8B, k.tokens)
            assert (s["B"], s["seq"]) in shapes and k.tokens == s["B"] * s["seq"] == s["T"]
            (b,) = k.baselines
            assert b.primary and b.needs_cuda and b.requires == "transformers" and b.label == chain.HF_LABEL
            assert b.target == CHAIN_TF_TARGET[(k.op, k.variant)][0]


def test_chain_teacher_forcing_dry_run_rows(capsys, tmp_path):
    """The two items in a dry run: every callable ran once (tiny model, 2 x 3 tokens); the rows
    carry the real shapes and counts, tokens/s or GiB, and their target against Hugging Face."""
    from rl_engine.bench import chain, report

    gpu = torch.cuda.is_available()
    rc, _, err = run(capsys, "bench", "--dry-run", "--ops", ",".join(CHAIN_TF_OPS), "--out", tmp_path / "c")
    assert rc == 0, err
    doc = report.load(tmp_path / "c" / "bench.json")  # schema-valid (tokens/s, the new items)
    rows = doc["rows"]
    assert len(rows) == 2 * (2 + 4)  # backends x (teacher forcing 2 shapes; train step 2 shapes x time, memory)
    assert doc["summary"]["errors"] == 0 and doc["summary"]["with_target"] == len(rows)
    for r in rows:
        key, metric = CHAIN_TF_TARGET[(r["op"], r["variant"])]
        t = TARGETS[key]
        assert (r["metric"], r["target_key"], r["target"], r["target_sense"]) == (metric, key, t.target_ratio, t.sense)
        assert r["ratio_sense"] == ("lower is better" if metric == "GiB" else "higher is better")
        assert r["target_sense"] == ("<=" if metric == "GiB" else ">=")
        assert r["baseline"] == chain.HF_LABEL and r["primary"] and r["baseline_kind"] == "implementation"
        assert r["tokens"] == r["sizes"]["B"] * r["sizes"]["seq"] and r["shape"] == (
            f"B{r['sizes']['B']}-seq{r['sizes']['seq']}-L36")
        assert r["dry_run_shape"] == "B2-seq3-L1"
        train = r["op"] == "chain_train_step"
        assert r["flops"] == chain.teacher_forcing_flops(chain._config(chain.QWEN3_8B), r["sizes"]["B"],
                                                         r["sizes"]["seq"], backward=train)
        assert r["value"] is None and r["ratio"] is None and r["meets_target"] is None
        if r["backend"] == "triton_cuda_bf16" or gpu:
            assert r["status"] == "dry-run" and "all 6 rows scored" in r["note"]
            assert ("backward into every weight" in r["note"]) is train
        else:
            assert r["status"] == "skipped"
        if gpu:
            assert r["baseline_status"] == "dry-run"
        else:
            assert r["baseline_status"] == "skipped" and r["baseline_note"] == "needs a CUDA GPU"
    assert {(r["sizes"]["B"], r["sizes"]["seq"]) for r in rows} == {(8, 1024), (2, 8192)}
    md = (tmp_path / "c" / "bench.md").read_text()
    assert "## chain_teacher_forcing" in md and "## chain_train_step" in md and "| tokens/s |" in md


def test_chain_train_step_gives_every_weight_a_gradient_and_clears_it():
    """Ours and Hugging Face's train-step callables on the tiny model (CPU): each returns one
    gradient per weight, leaves no ``.grad`` behind, and a second call gives the same gradients
    (nothing accumulated). Teacher forcing returns FP32 logprobs of all B * L rows."""
    pytest.importorskip("transformers")
    from rl_engine.bench import chain
    from rl_engine.bench.common import TINY, Pool
    from rl_engine.chain.weights import expected_shapes

    (case, _) = chain.cases("chain_train_step", [], quick=True)
    pool = Pool(torch.device("cpu"), 0)
    st = case.build(case.sizes(TINY, 3), TINY, pool)
    n_weights = len(expected_shapes(st["weights"].config))
    for make in (lambda: case.ours("triton_cuda_bf16", st), lambda: case.baselines[0].make(st)):
        step, note = make()
        first, second = step(), step()
        fresh = make()[0]()  # new leaves: one call's gradients
        assert len(first) == n_weights and all(g is not None and g.dtype == torch.bfloat16 for g in first)
        assert all(a is not b for a, b in zip(first, second))  # .grad was cleared: a new tensor per call
        assert [torch.equal(a, b) and torch.equal(b, c) for a, b, c in zip(first, second, fresh)] == [True] * n_weights
        assert "backward into every weight" in note
    assert all(t.grad is None for _, t in st["weights"].named_tensors())  # the cached weights never get one
    (tf_case,) = chain.cases("chain_teacher_forcing", [], quick=True)
    lp, _ = tf_case.ours("triton_cuda_bf16", st)
    hf_lp, _ = tf_case.baselines[0].make(st)
    assert lp().dtype == torch.float32 and lp().shape == (6,) and not lp().requires_grad
    assert hf_lp().dtype == torch.float32 and hf_lp().shape == (2, 3) and not hf_lp().requires_grad


def test_chain_rows_measured_tokens_per_second_and_verdicts(fake_measured, monkeypatch, tmp_path):
    """With the fake timer (ours 2 ms, Hugging Face 1 ms; scratch 1 MiB vs 100 MiB) and the Hugging
    Face baseline allowed on the CPU: tokens/s = the real token count / time, ratio 0.5 misses
    both rate targets (>=), memory ratio 0.01 meets its target (<=)."""
    pytest.importorskip("transformers")
    from rl_engine.bench import chain, report

    original = chain.cases

    def anywhere(op, tokens, quick):
        out = original(op, tokens, quick)
        for case in out:
            for b in case.baselines:
                b.needs_cuda = False
        return out

    monkeypatch.setattr(chain, "cases", anywhere)
    doc = fake_measured(ops=list(CHAIN_TF_OPS))
    report.write_json(tmp_path / "bench.json", doc)  # schema-valid
    rows = [r for r in doc["rows"] if r["backend"] == "triton_cuda_bf16"]
    assert len(rows) == 6 and all(r["status"] == r["baseline_status"] == "measured" for r in rows)
    for r in rows:
        if r["metric"] == "tokens/s":
            assert r["value"] == r["tokens"] / 2.0 * 1e3 and r["baseline_value"] == r["tokens"] / 1.0 * 1e3
            assert r["spread"]["value_low"] < r["value"] < r["spread"]["value_high"]
            assert r["ratio"] == 0.5 and r["meets_target"] is False
            assert r["achieved"]["tflops"] == r["flops"] / 2.0 / 1e9
        else:
            assert r["value"] == 1 / 1024 and r["baseline_value"] == 100 / 1024
            assert r["ratio"] < r["target"] and r["meets_target"] is True
    assert doc["summary"]["targets_missed"] == 4 and doc["summary"]["targets_met"] == 2
    md = report.render_md(doc)
    assert "for TFLOP/s, GB/s and tokens/s higher is better" in md and "| tokens/s |" in md


def test_chain_decode_hf_baseline_runs_on_the_installed_transformers():
    """The decode row's Hugging Face step (GPU-only in the bench, so the dry run skips it) on the tiny
    model on the CPU: the shared model builder and the per-step crop work with the pinned transformers;
    the cache stays at ``context - 1`` positions."""
    pytest.importorskip("transformers")
    from rl_engine.bench import chain
    from rl_engine.bench.common import TINY, Pool

    case = chain.cases("chain_decode", [], quick=True)[0]
    st = case.build(case.sizes(TINY, 3), TINY, Pool(torch.device("cpu"), 0))
    step, _ = chain._hf(st)
    first, second = step(), step()
    assert first.shape == (3, 1, st["weights"].config.vocab_size) and torch.equal(first, second)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events")
def test_time_calls_times_each_call_after_one_warm_up():
    """``measure="calls"`` (the chain rows): one untimed warm-up call, then ``reps`` timed calls whose
    median and p20 / p80 are ordered; nothing about the speed is asserted."""
    from rl_engine.bench import timing

    calls = []
    x = torch.ones(1024, device="cuda")
    t = timing.time_calls(lambda: calls.append((x * 2).sum()), reps=4)
    assert len(calls) == 5 and t.p20_ms <= t.median_ms <= t.p80_ms
