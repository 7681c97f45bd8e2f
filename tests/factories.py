"""Small node factories for placement tests: :mod:`gpuspawner.testing.factories` (shared with
the benchmarks, which import the project, never ``tests/``)."""

from gpuspawner.testing.factories import GiB, make_node

__all__ = ["GiB", "make_node"]
