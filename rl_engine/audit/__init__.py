"""``rl-engine audit``: the conformance table of WS1 §9, generated from checks that run."""

from rl_engine.audit.checks import AuditRow, run_audit

__all__ = ["AuditRow", "run_audit"]
