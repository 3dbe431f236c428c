"""Multi-process runs shared by the tests: every scenario of _dist_scenarios.py once at 2 and at 4 ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _run(nprocs: int):
    from sparsetorch_distributed.launch import run_local

    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    return run_local(nprocs, "_dist_scenarios:run_all", (), timeout=170, env=env, collective_timeout=30)


@pytest.fixture(scope="session")
def ranks2():
    return _run(2)


@pytest.fixture(scope="session")
def ranks4():
    return _run(4)


@pytest.fixture(params=[2, 4], ids=["p2", "p4"])
def runs(request, ranks2, ranks4):
    return ranks2 if request.param == 2 else ranks4
