"""Issue 43: are clean runs silent? N launches of jobs with no fault, counting the
findings above info per kind.

    .venv/bin/python -m bench.clean_silence [--runs 10]

Jobs: the plain-DDP sample at 4 ranks (samples/ddp_mlp.py, 30 steps) and the
reference trainer's clean scenario (dp2 x pp2, 1F1B, 8 micro-batches), each under
`diagnose run` with findings only (DIAGNOSE_OUTPUTS=off, tracking off), one after
the other, nothing else running. Target: no straggler above info in any run; any
other kind above info is a true property of the job, explained in
docs/testing.md with the figure that makes it true. Writes
bench/results/<date>-clean-silence.md.
"""

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.campaign import QUIET_ENV, write

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
JOBS = {
    "ddp_mlp x4": [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "samples/ddp_mlp.py",
        "--steps",
        "30",
    ],
    "trainer clean": None,  # `diagnose demo --scenario clean`
}


def launch(job: str, out: Path) -> list:
    command = (
        [PY, "-m", "diagnose", "demo", "--scenario", "clean", "--out", str(out)]
        if JOBS[job] is None
        else [PY, "-m", "diagnose", "run", "--out", str(out), "--", *JOBS[job]]
    )
    proc = subprocess.run(command, cwd=REPO, env=QUIET_ENV, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{job}: exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out / "analysis" / "findings.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    rows, details = [], []
    for job in JOBS:
        counts, silent = collections.Counter(), 0
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                findings = launch(job, Path(tmp) / "run")
            serious = [f for f in findings if f["severity"] != "info"]
            silent += not serious
            counts.update({f["kind"] for f in serious})
            for f in serious:
                details.append(f"- {job}, run {i + 1}: {f['kind']} [{f['severity']}] {f['title']}")
            print(f"{job} run {i + 1}: {', '.join(f['kind'] for f in serious) or 'silent'}", flush=True)
        rows.append((job, args.runs, silent, counts))
    body = [
        "| job | runs | silent (nothing above info) | runs with a straggler above info | other kinds above info (runs) |",
        "|---|---|---|---|---|",
    ]
    for job, n, silent, counts in rows:
        others = ", ".join(f"{k} ({v})" for k, v in sorted(counts.items()) if k != "straggler") or "-"
        body.append(f"| {job} | {n} | {silent} | {counts.get('straggler', 0)} | {others} |")
    body += ["", "Findings above info:", ""] + (details or ["- none"])
    write(REPO, "clean-silence", "Clean runs are silent", f"python -m bench.clean_silence --runs {args.runs}", body)


if __name__ == "__main__":
    main()
