"""Shared test configuration: hypothesis profiles.

* ``ci`` (selected when the environment has ``CI=true``): few examples, derandomized, so CI runs
  are fast and reproducible.
* ``dev`` (the default otherwise): more examples, random seeds.
* ``thorough``: many examples, for a long local run (``HYPOTHESIS_PROFILE=thorough``).

Every profile has ``deadline=None``: conversion timings vary with the machine and the first call
of a torch kernel is slow, which is not what these tests are about.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("ci", max_examples=20, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=60, **_COMMON)
settings.register_profile("thorough", max_examples=500, **_COMMON)

if os.environ.get("CI", "").strip().lower() == "true":
    settings.load_profile("ci")
else:
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tests with one intra-op thread.

    The tests build thousands of tiny tensors; on a 2-core machine some torch CPU kernels
    (``torch.repeat_interleave`` notably, which the storage engine uses per level) pay a
    multi-millisecond thread start-up per call with 2 threads and microseconds with 1, which
    would make the suite 10x slower without testing anything more. Opt in with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
