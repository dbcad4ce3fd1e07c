"""Across runs (`diagnose compare`): what changed from one run to another
(run_compare, with the GPU figures of device_figures), scaling across world
sizes (run_scaling), and the CI regression gate (regression_gate). It reads the
runs' steps, breakdowns and findings as load/ and findings/ left them.

May import: tables/, load/, replay/, detectors/, findings/ (tests/architecture/test_layout.py)."""
