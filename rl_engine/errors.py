"""Exception types. Each maps to a CLI exit code: judgments fail with 1, everything else with 2."""


class RLEngineError(Exception):
    """Base class for errors raised by rl_engine (exit code 2 in the CLI)."""


class ContractError(RLEngineError):
    """The contract file is missing, malformed, or asked for something it does not hold."""


class BackendUnavailable(RLEngineError):
    """A backend was requested that cannot run here; the message says why."""


class InputError(RLEngineError, ValueError):
    """Bad input to an op: wrong dtype, device, shape, layout or value range. Raised before launch."""
