"""Moved to :mod:`gpuspawner.testing.culler_hub` (shared with the benchmarks); this
name stays for the tests that import it from here, as the very same module."""

import sys

from gpuspawner.testing import culler_hub

sys.modules[__name__] = culler_hub
