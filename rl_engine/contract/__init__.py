"""The WS1 tolerance contract: the only source of thresholds in the package.

Use :func:`load_contract`; never write a tolerance literal anywhere else.
"""

from rl_engine.contract.loader import (
    CONTRACT_VERSION,
    ChainThresholds,
    Contract,
    CrossBackend,
    GradNormThresholds,
    Tolerance,
    default_contract_path,
    load_contract,
)

__all__ = ["CONTRACT_VERSION", "ChainThresholds", "Contract", "CrossBackend", "GradNormThresholds", "Tolerance",
           "default_contract_path", "load_contract"]
