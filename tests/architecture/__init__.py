"""The repository's layout: data flows one way, module names, the test tree."""
