"""Run -> other tools' formats.

Enters: a loaded run (diagnose.analysis) and its findings. Leaves: a merged
Chrome/Perfetto trace (chrome_trace), NVTXT files for Nsight's ImportNvtxt
(nvtxt), an .nsys-rep through NVTXW (nsys_rep), and the run's MLflow run:
params, per-step metrics, finding tags and artifacts (mlflow_run; the store
and the run of a run dir: mlflow_store; the metrics: mlflow_metrics)."""
