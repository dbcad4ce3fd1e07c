"""The `diagnose` command line (typer). Misuse is one line on stderr and exit 2.
Option values are checked in option_checks.py; what `run` and `demo` print
at the end is after_run.finish."""

import json
import os
import sys

import click
import typer

try:  # recent typer vendors its own click
    from typer._click import exceptions as _typer_click

    USAGE_ERRORS = (click.exceptions.UsageError, _typer_click.UsageError)
    ABORTS = (click.exceptions.Abort, getattr(_typer_click, "Abort", KeyboardInterrupt), KeyboardInterrupt)
except ImportError:
    USAGE_ERRORS = (click.exceptions.UsageError,)
    ABORTS = (click.exceptions.Abort, KeyboardInterrupt)

from diagnose import rundir
from diagnose.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Profile and diagnose distributed PyTorch training jobs.",
)
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
PEAK_HELP = (
    "the GPU's peak TFLOP/s MFU divides by (default: a table of common GPUs by name and precision; "
    "a CPU run has none) (DIAGNOSE_PEAK_TFLOPS)"
)


@app.command(context_settings=PASSTHROUGH)
def run(
    ctx: typer.Context,
    out: str | None = typer.Option(None, "--out", help="run directory (default runs/<timestamp>)"),
    name: str | None = typer.Option(None, "--name", help="a name for the run"),
    no_analyze: bool = typer.Option(False, "--no-analyze", help="skip analysis at the end"),
    no_outputs: bool = typer.Option(
        False,
        "--no-outputs",
        help="analyze, but write only findings.json and the analysis tables: "
        "no merged trace, report or MLflow run (also DIAGNOSE_OUTPUTS=off)",
    ),
    force: bool = typer.Option(False, "--force", help="reuse a non-empty --out"),
    hang_timeout: str = typer.Option(
        "auto",
        "--hang-timeout",
        metavar="auto|SECONDS",
        help="no progress for this long is a hang; auto: 10x the median step, at least --hang-floor",
    ),
    hang_floor: float = typer.Option(
        300.0, "--hang-floor", metavar="SECONDS", help="the least an auto hang timeout can be"
    ),
    kill_on_hang: bool = typer.Option(
        False,
        "--kill-on-hang",
        help="end the job on a hang (default: diagnose dumps, analyzes "
        "and reports; ending it stays with its backend or you)",
    ),
    nsys: bool = typer.Option(False, "--nsys", help="run each rank under `nsys profile` (if on PATH)"),
    torch_profiler: str | None = typer.Option(
        None,
        "--torch-profiler",
        metavar="STEPS",
        help="record steps FIRST-LAST with the PyTorch profiler and import its kernels",
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        metavar="PORT",
        help="serve live Prometheus metrics on this port, one endpoint per node (0: any free port, "
        "written to RUN/metrics_port; needs prometheus-client)",
    ),
):
    """Run COMMAND (after `--`) with every rank instrumented, then analyze it."""
    from diagnose.run.launcher import RunOptions, launch

    command = list(ctx.args)
    unknown = [a for a in command[:1] if a.startswith("-")]
    if unknown:
        raise UserError(f"unknown option {unknown[0]!r} (put the job after `--`)")
    if metrics_port is not None:
        from diagnose.live.prometheus_metrics import client_missing

        if not 0 <= metrics_port <= 65535:
            raise UserError("--metrics-port must be 0 (any free port) to 65535")
        if client_missing():  # before the job starts, not a warning lost in its output
            raise UserError(client_missing())
    from diagnose.cli.after_run import analyze_during_hang, finish
    from diagnose.cli.option_checks import hang_timeout_option, steps_option

    run_dir, status = launch(
        RunOptions(
            command=command,
            out_dir=out,
            name=name,
            force=force,
            hang_timeout_s=hang_timeout_option(hang_timeout),
            hang_floor_s=hang_floor,
            kill_on_hang=kill_on_hang,
            on_hang=analyze_during_hang,
            nsys=nsys,
            torch_profiler=steps_option(torch_profiler),
            metrics_port=metrics_port,
        )
    )
    return finish(run_dir, status, not no_analyze, outputs=not no_outputs)


@app.command()
def analyze(
    runs: list[str] = typer.Argument(..., help="run directory (several: one per node)"),
    as_json: bool = typer.Option(False, "--json", help="print findings as JSON"),
    quiet: bool = typer.Option(False, "--quiet", help="findings only, no breakdown"),
    no_outputs: bool = typer.Option(
        False,
        "--no-outputs",
        help="write only findings.json and the analysis tables: no merged "
        "trace, report or MLflow run (for very large runs)",
    ),
    processes: int | None = typer.Option(
        None, "--processes", metavar="N", help="read the ranks in N local worker processes"
    ),
    scheduler: str | None = typer.Option(
        None,
        "--scheduler",
        metavar="ADDRESS",
        help="read the ranks on a Dask cluster (tcp://HOST:8786); its workers must see the run directory at this path",
    ),
    dask_workers: int | None = typer.Option(
        None, "--dask-workers", metavar="N", help="read the ranks on a Dask LocalCluster of N workers"
    ),
    max_events: int | None = typer.Option(
        None,
        "--max-events",
        metavar="N",
        help="a run with more events is analyzed over its last "
        "steps that fit N (default 25,000,000, ~6 GB; 0: "
        "every step, whatever the memory)",
    ),
    every_step: bool = typer.Option(
        False,
        "--every-step",
        help="a run over --max-events is analyzed in windows of steps "
        "that fit, one after the other, findings merged (findings "
        "and tables only: no trace, report or MLflow run)",
    ),
    gpu_hour_cost: float | None = typer.Option(
        None,
        "--gpu-hour-cost",
        metavar="PRICE",
        help="the price of one GPU-hour: findings' GPU-hours per day also in money (DIAGNOSE_GPU_HOUR_COST)",
    ),
    peak_tflops: float | None = typer.Option(None, "--peak-tflops", metavar="TFLOPS", help=PEAK_HELP),
):
    """Analyze a run directory: breakdown per rank and findings. The per-rank
    pass runs in this process unless an engine option says otherwise
    (docs/large-runs.md); the cross-rank pass always runs here."""
    from diagnose.analysis.load.rank_pass_engines import make_engine
    from diagnose.cli.after_run import analyze_run, peak_option, print_mfu
    from diagnose.cli.console import print_breakdown, print_findings, print_step_figures

    peak_option(peak_tflops)
    if max_events is not None and max_events < 0:
        raise UserError("--max-events must be >= 0 (0: no budget)")
    if gpu_hour_cost is not None:
        if not gpu_hour_cost > 0 or gpu_hour_cost == float("inf"):
            raise UserError("--gpu-hour-cost must be a positive price")
        os.environ["DIAGNOSE_GPU_HOUR_COST"] = repr(gpu_hour_cost)  # the report and console read it
    engine = make_engine(processes=processes, scheduler=scheduler, dask_workers=dask_workers)
    try:
        if getattr(engine, "dashboard", None):
            print(f"diagnose: per-rank pass on {engine.name}; Dask dashboard: {engine.dashboard}", file=sys.stderr)
        run, findings = analyze_run(
            runs, outputs=not (as_json or no_outputs), engine=engine, max_events=max_events, every_step=every_step
        )
    finally:
        engine.close()
    if as_json:
        print(json.dumps(findings, indent=1))
        return 0
    if not quiet:
        print_breakdown(run)
    print_findings(findings)
    print_step_figures(run.step_figures)
    print_mfu(run)
    return 0


@app.command()
def export(
    run_dir: str = typer.Argument(..., help="run directory"),
    format: str = typer.Option("chrome", "--format", help="chrome | nvtxt | nsys-rep"),
    out: str | None = typer.Option(None, "--out", help="output path"),
):
    """Export a run's merged trace (chrome: Perfetto / chrome://tracing; nvtxt:
    Nsight's ImportNvtxt, one file per rank; nsys-rep: Nsight Systems report)."""
    from diagnose.cli.option_checks import require_local

    require_local("export", run_dir)
    from diagnose.analysis.load.loader import load

    if format in ("nvtxt", "nsys-rep"):
        from diagnose.cli.interop_commands import export_interop

        return export_interop(run_dir, format, out)
    if format != "chrome":
        raise UserError(f"unknown export format {format!r} (known: chrome, nvtxt, nsys-rep)")
    from diagnose.exporters.chrome_trace import write_chrome_trace

    run = load(run_dir)
    path = write_chrome_trace(run, out or os.path.join(run.root, rundir.CHROME_TRACE))
    print(path)
    return 0


@app.command()
def merge(
    runs: list[str] = typer.Argument(..., help="run directories, one per node"),
    out: str = typer.Option(..., "--out", help="the merged run directory"),
):
    """Merge per-node run directories of one multi-node job into one run."""
    from diagnose.cli.option_checks import require_local

    require_local("merge", *runs)
    from diagnose.rundir.node_merge import merge_runs

    merged = merge_runs(runs, out)
    print(f"diagnose: merged {len(runs)} run directories into {merged}")
    return 0


@app.command()
def demo(
    scenario: str = typer.Option("showcase", "--scenario", help="scenario name"),
    out: str | None = typer.Option(None, "--out", help="run directory"),
    hang_timeout: float = typer.Option(20.0, "--hang-timeout"),
    no_outputs: bool = typer.Option(
        False, "--no-outputs", help="findings.json and the analysis tables only (also DIAGNOSE_OUTPUTS=off)"
    ),
):
    """Run the reference trainer under `diagnose run` with one injected problem."""
    from diagnose.cli.demo_command import demo_command
    from diagnose.run.launcher import RunOptions, launch

    command = demo_command(scenario)
    print(f"diagnose: demo scenario {scenario!r}: {' '.join(command)}")
    from diagnose.cli.after_run import analyze_during_hang, finish

    # the demo ends its hung job (the trainer's hung rank waits forever)
    run_dir, status = launch(
        RunOptions(
            command=command,
            out_dir=out,
            name=f"demo-{scenario}",
            hang_timeout_s=hang_timeout,
            kill_on_hang=True,
            on_hang=analyze_during_hang,
        )
    )
    return finish(run_dir, status, True, outputs=not no_outputs)


@app.command()
def report(
    run_dir: str = typer.Argument(..., help="run directory"),
    out: str | None = typer.Option(None, "--out", help="output path (default <run>/report.html)"),
    steps: str | None = typer.Option(None, "--steps", help="timeline steps FIRST-LAST (default: a few steady steps)"),
):
    """(Re)write a run's self-contained HTML report."""
    from diagnose.cli.option_checks import require_local

    require_local("report", run_dir)
    from diagnose.cli.report_commands import report_command

    print(report_command(run_dir, out, steps))
    return 0


@app.command()
def compare(
    run_a: str = typer.Argument(..., help="run directory A (before)"),
    run_b: str = typer.Argument(..., help="run directory B (after)"),
    more: list[str] | None = typer.Argument(None, help="more runs: a scaling table"),
    html: str | None = typer.Option(None, "--html", help="also write the comparison as HTML here"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
    fail_on: str | None = typer.Option(
        None,
        "--fail-on",
        metavar="CHECKS",
        help="exit 3 when B regressed beyond A's noise: regression (all), or a list of step-time, new-critical, impact",
    ),
):
    """Compare runs: step time, breakdown per phase, findings gained and lost; across
    world sizes or layouts (or three runs and more), scaling efficiency and what grew.
    With --fail-on, a CI gate: one line per verdict, exit 3 on a regression."""
    from diagnose.cli.option_checks import require_local

    require_local("compare", run_a, run_b, *(more or []))
    from diagnose.analysis.compare.regression_gate import parse_fail_on
    from diagnose.cli.compare_command import compare_command

    try:
        checks = parse_fail_on(fail_on) if fail_on is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if checks and more:
        raise UserError("--fail-on compares two runs: a baseline and a candidate")
    return compare_command(run_a, run_b, html, as_json, more, checks)


@app.command()
def ui(
    port: int = typer.Option(5000, "--port", help="port on 127.0.0.1"),
    runs_root: str = typer.Option("runs", "--runs-root", help="directory holding the run directories (and mlflow.db)"),
):
    """Start the MLflow UI on 127.0.0.1 over the runs' tracking store."""
    from diagnose.cli.report_commands import ui_command

    return ui_command(runs_root, port)


from diagnose.cli.interop_commands import import_app  # noqa: E402  (`diagnose import kineto|nsys`)

app.add_typer(import_app, name="import")


def main(argv=None) -> None:
    from diagnose.cli.allocator import keep_freed_memory

    keep_freed_memory()
    try:
        status = app(args=argv, standalone_mode=False, prog_name="diagnose")
    except USAGE_ERRORS as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
            print(exc.ctx.get_help())
            sys.exit(0)
        print(f"diagnose: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except UserError as exc:
        print(f"diagnose: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ABORTS:
        print("diagnose: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)


if __name__ == "__main__":
    main()
