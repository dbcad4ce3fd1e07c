"""Importers of other tools' traces into ordinary run directories:
`kineto` (PyTorch profiler Chrome traces) and `nsys` (Nsight Systems SQLite
exports); `common` holds what they share (kernel classes, run-dir writing)."""
