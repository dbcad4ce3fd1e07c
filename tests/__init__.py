"""The test suite, by package (docs/testing.md, "Layout"). A package so that tests and
bench/ import the shared helpers as tests.support.<module> from the repository root."""
