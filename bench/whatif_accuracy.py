"""Issue 23: is a finding's what-if saving the step time a fix actually saves?

    .venv/bin/python bench/whatif_accuracy.py [--pairs 3] [--scenarios straggler,slow_input,...]

For each reference-trainer scenario, interleaved pairs of the same job under
`diagnose run`: with its fault, then without (the scenario's argv minus its
`--fault`s). Measured saving = fault-free median steady step subtracted from
the faulty one, per pair; its mean and 95% confidence interval (Student's t
over pairs). Predicted saving = the planted finding's `whatif_saving_ms_per_step`
in the faulty run (the mean over pairs). Target: within 25% of the step time
actually saved. Prints one row per scenario and writes
bench/results/<date>-whatif-accuracy.md. Both runs of a pair share the box's
load of the moment; 4-rank scenarios put two ranks on each of this VM's 2 cores.
`bubble` is left out: its cause (too few micro-batches) has no fault to remove.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from reference_trainer.scenarios import SCENARIOS  # noqa: E402

DIAGNOSE = [sys.executable, "-m", "diagnose"]
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def _without_faults(argv: list) -> list:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--fault":
            skip = True
        else:
            out.append(arg)
    return out


def _run(argv: list, nproc: int, out: str) -> dict:
    command = [*DIAGNOSE, "run", "--out", out, "--", sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(nproc), "-m", "reference_trainer", *argv]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=900)
    with open(os.path.join(out, "analysis", "findings.json")) as f:
        findings = json.load(f)
    with open(os.path.join(out, "analysis", "step_figures.json")) as f:
        figures = json.load(f)
    return {"findings": findings, "figures": figures}


def measure(name: str, pairs: int, work: str) -> dict:
    spec = SCENARIOS[name]
    faulty_ms, clean_ms, predicted, estimates, fidelity = [], [], [], [], []
    for i in range(pairs):
        faulty = _run(spec.argv, spec.nproc, os.path.join(work, f"{name}-{i}-fault"))
        clean = _run(_without_faults(spec.argv), spec.nproc, os.path.join(work, f"{name}-{i}-clean"))
        faulty_ms.append(faulty["figures"]["measured_step_ms"])
        clean_ms.append(clean["figures"]["measured_step_ms"])
        fidelity.append(faulty["figures"]["replay_max_step_error_frac"])
        planted = [f for f in faulty["findings"] if f["kind"] == spec.expected_kind]
        if planted:
            m = planted[0]["metrics"]
            predicted.append(m.get("whatif_saving_ms_per_step", float("nan")))
            estimates.append(m.get("estimate_ms_per_step", planted[0]["impact_ms_per_step"]))
    savings = [f - c for f, c in zip(faulty_ms, clean_ms)]
    mean = statistics.mean(savings)
    half = T95.get(len(savings) - 1, 2.0) * statistics.stdev(savings) / len(savings) ** 0.5 if len(savings) > 1 else float("nan")
    pred = statistics.mean(predicted) if predicted else float("nan")
    return {"scenario": name, "kind": spec.expected_kind, "pairs": pairs,
            "faulty_step_ms": statistics.mean(faulty_ms), "clean_step_ms": statistics.mean(clean_ms),
            "measured_saving_ms": mean, "ci95_ms": half, "whatif_saving_ms": pred,
            "old_estimate_ms": statistics.mean(estimates) if estimates else float("nan"),
            "error_frac": (pred - mean) / mean if mean else float("nan"),
            "found_in": f"{len(predicted)}/{pairs}", "replay_max_error": max(fidelity),
            "pair_savings_ms": [round(x, 1) for x in savings], "pair_whatif_ms": [round(x, 1) for x in predicted]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--scenarios", default="straggler,slow_stage,slow_input,hidden_sync")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.scenarios.split(","):
            rows.append(measure(name, args.pairs, work))
            r = rows[-1]
            print(f"{name:12s} {r['kind']:17s} measured {r['measured_saving_ms']:7.1f} +- {r['ci95_ms']:5.1f} ms  "
                  f"what-if {r['whatif_saving_ms']:7.1f}  old estimate {r['old_estimate_ms']:7.1f}  "
                  f"error {r['error_frac']:+.0%}  found {r['found_in']}  pairs {r['pair_savings_ms']} "
                  f"what-if {r['pair_whatif_ms']}", flush=True)
    date = datetime.date.today().isoformat()
    path = os.path.join(REPO, "bench", "results", f"{date}-whatif-accuracy.md")
    with open(path, "w") as f:
        f.write(f"# What-if saving vs measured saving ({date})\n\n`python bench/whatif_accuracy.py --pairs "
                f"{args.pairs} --scenarios {args.scenarios}` on the 2-core VM (4 ranks on 2 cores).\n\n")
        f.write("| scenario | finding | faulty step ms | fault-free step ms | measured saving ms (95% CI) "
                "| what-if saving ms | error | old estimate ms | replay max step error | per pair: measured / what-if |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['scenario']} | {r['kind']} ({r['found_in']}) | {r['faulty_step_ms']:.1f} | "
                    f"{r['clean_step_ms']:.1f} | {r['measured_saving_ms']:.1f} (+-{r['ci95_ms']:.1f}) | "
                    f"{r['whatif_saving_ms']:.1f} | {r['error_frac']:+.0%} | {r['old_estimate_ms']:.1f} | "
                    f"{r['replay_max_error']:.3f} | {r['pair_savings_ms']} / {r['pair_whatif_ms']} |\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
