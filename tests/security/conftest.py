"""Hypothesis settings of the hostile-record tests: a fixed, derandomized budget for CI.

`ci` (the default here): 50 examples per in-process test, derandomized so that a CI run is
reproducible, no example database (nothing written into the tree), deadlines generous (a
loaded 2-core machine) but finite. Tests through S3 or subprocesses set fewer examples
themselves. HYPOTHESIS_PROFILE=deep explores more when run by hand.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=50,
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "deep", parent=settings.get_profile("ci"), max_examples=2000, derandomize=False
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
