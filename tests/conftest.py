import os

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
