"""Record the reference trainer's scenarios into tests/data/runs/<scenario>/.

The detector tests analyze these run directories in-process (the recorded_scenario
fixture, tests/conftest.py) instead of launching 4-8 ranks per scenario: the live
path is tested where it is the point (docs/testing.md). Each recording keeps the
rank traces and the manifest (the analysis is the tests' to make) and a SOURCE.txt
with the command, torch version, schema version and date; tests fail when the
schema version moves and the runs were not recorded again.

    .venv/bin/python scripts/record_test_runs.py            # every scenario of the matrix
    .venv/bin/python scripts/record_test_runs.py clean varlen
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "runs"
KEEP = ("manifest.json", "traces")  # the analysis, report, trace and MLflow id are remade by the tests
# recordings besides the matrix: a scenario with the trainer's phases off (no stage or
# micro-batch marked), for the pipeline-inference tests; slow_input as the what-if bench
# measures it (dp2, one rank per core, an emulated device per rank: bench/whatif_accuracy.py),
# with its fault and without, for the test of an impact against the saving measured
VARIANTS = {
    "slow_stage-unmarked": ("slow_stage", {"REFERENCE_TRAINER_PHASES": "0"}),
    "bubble-unmarked": ("bubble", {"REFERENCE_TRAINER_PHASES": "0"}),
    "whatif-slow_input": ("slow_input", {}),
    "whatif-slow_input-fixed": ("slow_input", {}),
    "ring3-gloo": ("ring", {}),
    "ring3-gloo-fixed": ("ring", {}),
}
# a ring of 3 batched exchanges (issue 46), natively on gloo: rank 1 at 1.5x the
# others' emulated device time, and without a slow rank (tests/analysis/test_ring_replay.py)
RING_ARGV = {"ring3-gloo": ["--slow-rank", "1", "--factor", "1.5"], "ring3-gloo-fixed": []}


def _command(name: str, scenario: str, out: Path) -> tuple[list, str]:
    """(the command that records `name`, how SOURCE.txt says it)."""
    if name in RING_ARGV:
        job = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "3",
            "tests/scripts/ring_job.py",
            *RING_ARGV[name],
        ]
        return (
            [sys.executable, "-m", "diagnose", "run", "--out", str(out), "--", sys.executable, *job],
            f"diagnose run -- python {' '.join(job)}",
        )
    if not name.startswith("whatif-"):
        return (
            [sys.executable, "-m", "diagnose", "demo", "--scenario", scenario, "--out", str(out)],
            f"diagnose demo --scenario {scenario}",
        )
    from bench.whatif_accuracy import pair_of  # the repository root is on sys.path (below)

    nproc, faulty, fixed, _ = pair_of(scenario, emulate_all=True)
    argv = fixed if name.endswith("-fixed") else faulty
    return (
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--out",
            str(out),
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "reference_trainer",
            *argv,
        ],
        f"diagnose run -- <job> (bench/whatif_accuracy.py's {'fault-free' if name.endswith('-fixed') else 'faulty'} "
        f"{scenario} job, --emulate-all)",
    )


def record(name: str) -> Path:
    import torch

    from collectors.schema import SCHEMA_VERSION

    scenario, extra_env = VARIANTS.get(name, (name, {}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIAGNOSE_TRACKING": "off", "DIAGNOSE_OUTPUTS": "off", **extra_env}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / name
        command, said = _command(name, scenario, out)
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: {said} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        target = RUNS / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for part in KEEP:
            source = out / part
            if source.is_dir():  # (a temporary left by a write the rank's exit cut short is not the run's)
                shutil.copytree(source, target / part, ignore=shutil.ignore_patterns("*.tmp-*"))
            else:
                shutil.copy2(source, target / part)
        manifest = json.loads((out / "manifest.json").read_text())
    (target / "SOURCE.txt").write_text(
        f"recorded by scripts/record_test_runs.py on {datetime.date.today().isoformat()}\n"
        f"command: {' '.join(f'{k}={v}' for k, v in extra_env.items())}{' ' if extra_env else ''}{said}\n"
        f"job: {manifest['command']}\n"
        f"torch: {torch.__version__}\n"
        f"schema_version: {SCHEMA_VERSION}\n"
        f"machine: {os.cpu_count()} CPU cores, no GPU (gloo)\n"
        "license: this project's\n"
    )
    return target


def main(names) -> None:
    from reference_trainer.scenarios import SCENARIOS

    names = names or [n for n in SCENARIOS if n not in ("hang", "crash")] + list(VARIANTS)
    for name in names:
        if name not in SCENARIOS and name not in VARIANTS:
            raise SystemExit(f"unknown scenario {name!r} (known: {', '.join([*SCENARIOS, *VARIANTS])})")
        print(f"recorded {record(name).relative_to(REPO)}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
