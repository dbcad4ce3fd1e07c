"""The fake GPU's `traced` recorder (tests/support/fake_cuda_collectives.py) for
the tests of collectives on CUDA."""

from tests.support.fake_cuda_collectives import traced  # noqa: F401 (a fixture, found by name)
