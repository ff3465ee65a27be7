"""Screenshots of a failing and a passing gate report (docs/report-fail.png, docs/report-pass.png).

The failing run is the planted fault of tests/test_gate.py: a silu "kernel" one BF16 ulp off in
row 0 whenever more than one row runs together (the batch/chunk/padding invariance cells and the
relative criterion turn red). The passing run is the real silu kernel. Both on the smoke workload,
on the CPU (Triton interpreter) in about a minute each. Needs headless Chromium on PATH.

    python tools/report_screenshots.py [--out docs] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def _planted(real):
    def planted(x):
        y = real(x)
        if x.shape[0] > 1:
            bits = y.detach().clone()
            bits.view(torch.int16)[0] ^= 1
            y = y + (bits - y.detach())
        return y

    planted.__name__ = "planted_silu_triton"
    return planted


def _gate(out: Path, plant: bool) -> int:
    from rl_engine import env

    if not torch.cuda.is_available() and not env.triton_interpret():
        env.enable_triton_interpreter()
    from rl_engine.cli.main import main
    from rl_engine.ops.registry import get_spec

    spec = get_spec("silu")
    real = spec.impls["triton_cuda_bf16"]
    if plant:
        spec.impls["triton_cuda_bf16"] = _planted(real)
    try:
        return main(["gate", "--ops", "silu", "--backend", "triton_cuda_bf16", "--workload", "smoke",
                     "--judgments", "forward_accuracy,gradient_accuracy,forward_invariance,gradient_invariance",
                     "--out", str(out)])
    finally:
        spec.impls["triton_cuda_bf16"] = real


def _shoot(html: Path, png: Path, height: int) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("no headless Chromium on PATH (apt-get install chromium)")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1280,{height}", f"--screenshot={png}", html.resolve().as_uri()],
                   check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs", help="folder for report-fail.png and report-pass.png (default: docs)")
    ap.add_argument("--keep", default=None, help="keep the two gate folders here (default: a temporary folder)")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="rl-engine-shots-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    assert _gate(work / "fail", plant=True) == 1, "the planted fault must fail the gate"
    assert _gate(work / "pass", plant=False) == 0, "the real kernel must pass the gate"
    _shoot(work / "fail" / "report.html", out / "report-fail.png", 1400)
    _shoot(work / "pass" / "report.html", out / "report-pass.png", 900)
    print(f"wrote {out / 'report-fail.png'} and {out / 'report-pass.png'} (runs in {work})")


if __name__ == "__main__":
    main()
