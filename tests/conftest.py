import os

import pytest
import torch

# The Triton backend runs under the CPU interpreter when there is no GPU (see rl_engine.env).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def contract():
    from rl_engine.contract import load_contract

    return load_contract()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
