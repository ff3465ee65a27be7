"""The Python example of docs/rollout.md runs as written in a fresh process (issue #36: it needed
``TRITON_INTERPRET=1`` without saying so). Control: without its interpreter switch it is refused on a
host without a GPU, with the variable named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    text = (ROOT / "docs" / "rollout.md").read_text(encoding="utf-8")
    api = text.split("## API", 1)[1]
    return re.search(r"```python\n(.*?)```", api, re.S).group(1)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                          cwd=ROOT)


def test_the_api_example_runs_as_written_in_a_fresh_process():
    code = _example() + ("\nassert len(res.completions) == 2\n"
                         "for c in res.completions:\n"
                         "    assert c.tokens.dtype == torch.int64 and c.logprobs.dtype == torch.float32\n"
                         "    assert 1 <= c.tokens.numel() <= 3 and bool(torch.isfinite(c.logprobs).all())\n"
                         "print('EXAMPLE-OK', [c.tokens.tolist() for c in res.completions])\n")
    p = _run(code)
    assert p.returncode == 0 and "EXAMPLE-OK" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter switch only matters without a GPU")
def test_control_without_the_interpreter_switch_the_example_is_refused():
    code = _example()
    switch = "env.enable_triton_interpreter()"
    assert code.count(switch) == 1
    code = code.replace(switch, "pass")
    p = _run(code)
    assert p.returncode != 0 and "TRITON_INTERPRET" in p.stderr and "BackendUnavailable" in p.stderr, p.stderr[-2000:]
