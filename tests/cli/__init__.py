"""The commands end to end: diagnose run under launchers and failures, report, MLflow tracking and UI."""
