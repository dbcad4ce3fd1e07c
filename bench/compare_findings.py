"""Findings before and after a code change, on the same saved run directories.

Re-running a scenario changes its timings (and so its impacts) by noise; re-analyzing
the run directories it left does not. So a refactor is checked in two steps:

    # with the code before the change: run the demo scenarios once, save what they found
    python -m bench.compare_findings record --runs-root /tmp/scenario-runs --out before.json
    # with the code after it: analyze the same run directories again and compare
    python -m bench.compare_findings check before.json

`record --scenarios all` first runs every `diagnose demo` scenario into the runs
root (~10 min on 2 cores); `--import-fixtures` also imports the Kineto and Nsight
fixtures from tests/data into it. Only the public surface is used (the `diagnose`
command), so one script serves both sides of a move. Compared per finding: kind,
severity, ranks, stage, callsite and impact (exactly: same input, same code path).
Exit status 1 when anything differs.
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIAGNOSE = [sys.executable, "-m", "diagnose"]
KEYS = ("kind", "severity", "ranks", "stage", "callsite", "impact_ms_per_step")
FIXTURES = {  # run name -> (importer, fixture paths under tests/data)
    "import-kineto-nccl": (
        "kineto",
        ["kineto/hta/trace_filter/sampled_rank-0.json.gz", "kineto/hta/trace_filter/sampled_rank-1.json.gz"],
    ),
    "import-kineto-resnet": ("kineto", ["kineto/tb_plugin_resnet50/resnet50_num_workers_4/worker0.pt.trace.json.gz"]),
    "import-nsys": ("nsys", ["nsys/tc_report1.sqlite"]),
}


def _diagnose(*args, check=True):
    proc = subprocess.run([*DIAGNOSE, *args], cwd=REPO, capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"compare_findings: `diagnose {' '.join(args)}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc


def findings_of(run_dir: str) -> list[dict]:
    out = _diagnose("analyze", run_dir, "--json").stdout
    return [{k: f.get(k) for k in KEYS} for f in json.loads(out)]


def _make_runs(root: str, scenarios: list[str], import_fixtures: bool) -> None:
    os.makedirs(root, exist_ok=True)
    for name in scenarios:
        out = os.path.join(root, name)
        if not os.path.isdir(out):
            # the job's own exit status is the scenario's (hang and crash exit non-zero)
            _diagnose("demo", "--scenario", name, "--out", out, check=False)
    if import_fixtures:
        for name, (importer, paths) in FIXTURES.items():
            out = os.path.join(root, name)
            if not os.path.isdir(out):
                _diagnose("import", importer, *[os.path.join(REPO, "tests", "data", p) for p in paths], "--out", out)


def record(args) -> int:
    if args.scenarios:
        from reference_trainer.scenarios import SCENARIOS

        names = list(SCENARIOS) if args.scenarios == ["all"] else args.scenarios
        _make_runs(args.runs_root, names, args.import_fixtures)
    elif args.import_fixtures:
        _make_runs(args.runs_root, [], True)
    runs = sorted(
        os.path.join(args.runs_root, d)
        for d in os.listdir(args.runs_root)
        if os.path.isfile(os.path.join(args.runs_root, d, "manifest.json"))
    )
    saved = {os.path.abspath(run): findings_of(run) for run in runs}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=1, sort_keys=True)
    print(f"compare_findings: {sum(map(len, saved.values()))} findings of {len(saved)} runs -> {args.out}")
    return 0


def check(args) -> int:
    with open(args.saved, encoding="utf-8") as f:
        saved = json.load(f)
    differ = 0
    for run, before in sorted(saved.items()):
        after = findings_of(run)
        same = before == after
        differ += not same
        kinds = ", ".join(f"{f['kind']}({f['severity']}, ranks {f['ranks']})" for f in after) or "-"
        print(f"{'same   ' if same else 'DIFFERS'} {os.path.basename(run):24s} {kinds}")
        if not same:
            print(f"  before: {json.dumps(before)}\n  after:  {json.dumps(after)}")
    print(f"compare_findings: {len(saved) - differ} of {len(saved)} runs found the same")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="save the findings of every run under a runs root")
    rec.add_argument("--runs-root", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--scenarios", nargs="*", help="run these demo scenarios first ('all': every one)")
    rec.add_argument(
        "--import-fixtures", action="store_true", help="import the Kineto and Nsight fixtures of tests/data first"
    )
    chk = sub.add_parser("check", help="analyze the saved runs again and compare")
    chk.add_argument("saved")
    args = parser.parse_args()
    return record(args) if args.command == "record" else check(args)


if __name__ == "__main__":
    sys.exit(main())
