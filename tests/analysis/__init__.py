"""diagnose.analysis: the tables, the replay and what-if, the detectors, findings and compare."""
