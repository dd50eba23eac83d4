"""Shared fixtures: a fresh manager per test, the global policy restored."""
import os
import sys

import pytest

import tefl

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def manager():
    """A manager over a registry of its own (built-ins registered on first use)."""
    m = tefl.OpManager(tefl.OpRegistry())
    m.ensure_initialized()
    return m


@pytest.fixture(autouse=True)
def _restore_policy():
    yield
    tefl.reset_global_policy()


def impl_ids(manager, op):
    return [i.impl_id for i in manager.registry.get_implementations(op)]
