"""Issue 47, item 4: checkpoint_stall's impact against the saving measured by
running the same job without its saves.

    .venv/bin/python -m bench.checkpoint_stall [--pairs 3]

Job: the reference trainer, dp2, 24 steps, a save every 4 steps, under `diagnose
run` (findings and tables only), one run after the other, nothing else running.
Per mode (torch.save with rank 1's disk slow, DCP save, DCP async_save) and pair:
a run with saves and one without; the measured saving is the difference of
their mean steady step (median rank per step: a step holding a save is long),
the predicted one the finding's impact (0 when there is none). Writes
bench/results/<date>-checkpoint-stall.md.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.campaign import run_trainer, write

REPO = Path(__file__).resolve().parents[1]
JOB = [
    "--dp",
    "2",
    "--steps",
    "24",
    "--layers",
    "2",
    "--d-model",
    "64",
    "--heads",
    "4",
    "--seq-len",
    "64",
    "--micro-batch-size",
    "2",
    "--microbatches",
    "2",
]
MODES = {
    "torch.save, rank 1 slow disk": "checkpoint:every=4,mode=torch,slow_rank=1,slow_ms=2",
    "DCP save": "checkpoint:every=4,mode=dcp",
    "DCP async_save": "checkpoint:every=4,mode=dcp_async",
}


def run(out: Path, fault: str | None) -> tuple[float, float]:
    """(mean steady step ms on the median rank, checkpoint_stall's impact or 0)."""
    run_trainer(REPO, out, 2, JOB + (["--fault", fault] if fault else []))
    import diagnose

    loaded = diagnose.load(str(out), warn=lambda w: None)
    b = loaded.breakdown()
    b = b[b["step"].isin(loaded.steady_steps())]
    step_ms = float(b.groupby("step")["step_ms"].median().mean())
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    impact = next((f["impact_ms_per_step"] for f in findings if f["kind"] == "checkpoint_stall"), 0.0)
    return step_ms, impact


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fault in MODES.items():
            measured, predicted = [], []
            for i in range(args.pairs):
                with_ms, impact = run(Path(tmp) / f"{len(rows)}-{i}-with", fault)
                without_ms, _ = run(Path(tmp) / f"{len(rows)}-{i}-without", None)
                measured.append(with_ms - without_ms)
                predicted.append(impact)
                print(
                    f"{name} pair {i + 1}: measured {with_ms - without_ms:.1f} ms/step, predicted {impact:.1f}",
                    flush=True,
                )
            rows.append((name, measured, predicted))
    body = [
        "| saves | measured saving ms/step (mean +- sd) | predicted (mean) | predicted / measured |",
        "|---|---|---|---|",
    ]
    for name, measured, predicted in rows:
        m, p = statistics.mean(measured), statistics.mean(predicted)
        sd = statistics.stdev(measured) if len(measured) > 1 else 0.0
        body.append(f"| {name} | {m:.1f} +- {sd:.1f} | {p:.1f} | {f'{p / m:.2f}' if m else '-'} |")
    write(
        REPO,
        "checkpoint-stall",
        "checkpoint_stall: impact vs measured saving",
        f"python -m bench.checkpoint_stall --pairs {args.pairs}",
        body,
    )


if __name__ == "__main__":
    main()
