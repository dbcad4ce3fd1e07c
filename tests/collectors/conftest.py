"""The fake GPU's `traced` recorder (tests/collectors/test_collective_events.py),
shared with the tests of more calls."""

from tests.collectors.test_collective_events import traced  # noqa: F401 (a fixture, found by name)
