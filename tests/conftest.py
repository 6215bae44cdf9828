import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# `ci`: derandomised, so every run of .ci/run explores the same cases.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# `dev`: random and larger, for local bug hunting: HYPOTHESIS_PROFILE=dev pytest
settings.register_profile(
    "dev",
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def every_obligation() -> list[Any]:
    """``leaseproto prove``'s obligations, every one, built once per session from the
    rules as they are (building them runs the core on z3 terms: about 40 s of CPU). For
    tests that only read them; a test that patches a rule builds its own."""
    pytest.importorskip("z3")
    from leaseproto.proofs import check

    return check.all_obligations()
