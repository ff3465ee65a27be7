"""Provenance of a copied tree: the commit named by whoever copied it wins over a git directory there."""

from __future__ import annotations

from rl_engine import provenance


def test_source_commit_from_the_environment_wins_over_git(monkeypatch):
    monkeypatch.delenv("RL_ENGINE_SOURCE_COMMIT", raising=False)  # the caller may have set it (GPU runs do)
    seen = provenance.git_state()
    monkeypatch.setenv("RL_ENGINE_SOURCE_COMMIT", "f" * 40)
    monkeypatch.setenv("RL_ENGINE_SOURCE_DIRTY", "0")
    state = provenance.git_state()
    assert state["git_commit"] == "f" * 40
    assert state["git_dirty"] is False
    assert state["git_commit_source"].startswith("environment")
    # what git itself saw stays visible beside it
    assert state["git_seen"]["commit"] == seen["git_commit"]
    # git's file list describes git's view, not the declared commit (a GPU artifact once said
    # git_dirty false beside a list of 16 "dirty" files)
    assert state["git_dirty_files"] == [] and state["git_seen"]["dirty_files"] == seen["git_dirty_files"]


def test_without_the_variable_git_answers(monkeypatch):
    monkeypatch.delenv("RL_ENGINE_SOURCE_COMMIT", raising=False)
    state = provenance.git_state()
    assert state["git_commit_source"] == "git"
    assert "git_seen" not in state
