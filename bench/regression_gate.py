"""Issue 48, item 4: the CI gate (`diagnose compare A B --fail-on regression`) on
live runs of the reference trainer: pairs of the same clean job must pass; a
fault, or a planted slowdown of 10%, must fail naming it; a 2% slowdown is within
noise unless the noise says otherwise.

    .venv/bin/python -m bench.regression_gate [--pairs 10]

Job: the clean scenario's layout (dp2 x pp2, 1F1B, 8 micro-batches, 16 steps)
under `diagnose run`, findings only (DIAGNOSE_OUTPUTS=off, tracking off), one
after the other, nothing else running. Candidates beside each pair's baseline:
the same job (clean), `slowdown:pct=10`, `slowdown:pct=2`, and faults on the same
layout (straggler, slow_input, hidden_sync). Writes
bench/results/<date>-regression-gate.md.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.campaign import QUIET_ENV, run_trainer, write
from reference_trainer.scenarios import SCENARIOS

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

CLEAN = SCENARIOS["clean"]
CANDIDATES = {
    "clean": (),
    "slowdown 10%": ("slowdown:pct=10",),
    "slowdown 2%": ("slowdown:pct=2",),
    "straggler": ("straggler:rank=2,factor=2",),
    "slow_input": ("slow_input:ms=10",),
    "hidden_sync": ("hidden_sync:every=microbatch",),
}


def launch(out: Path, faults: tuple) -> None:
    run_trainer(REPO, out, CLEAN.nproc, list(CLEAN.argv) + [a for f in faults for a in ("--fault", f)])


def gate(a: Path, b: Path) -> tuple[int, list]:
    proc = subprocess.run(
        [PY, "-m", "diagnose", "compare", str(a), str(b), "--fail-on", "regression"],
        cwd=REPO,
        env=QUIET_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, [line for line in proc.stdout.splitlines() if line.startswith(("REGRESSION:", "ok:"))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            base = Path(tmp) / f"base{i}"
            launch(base, ())
            # the clean candidate every pair; the others once (first pair)
            for name, faults in CANDIDATES.items() if i == 0 else [("clean", ())]:
                cand = Path(tmp) / f"{name.replace(' ', '_').replace('%', 'pct')}{i}"
                launch(cand, faults)
                code, lines = gate(base, cand)
                rows.append((i + 1, name, code, lines))
                print(f"pair {i + 1} {name}: exit {code}; " + " | ".join(lines), flush=True)
    clean = [r for r in rows if r[1] == "clean"]
    body = [
        f"Clean vs clean: {sum(r[2] == 0 for r in clean)} of {len(clean)} pairs pass (exit 0).",
        "",
        "| pair | candidate | exit | verdicts |",
        "|---|---|---|---|",
    ]
    for i, name, code, lines in rows:
        body.append(f"| {i} | {name} | {code} | {'<br>'.join(line.replace('|', '/') for line in lines)} |")
    write(
        REPO,
        "regression-gate",
        "CI regression gate on live runs",
        f"python -m bench.regression_gate --pairs {args.pairs}",
        body,
    )


if __name__ == "__main__":
    main()
