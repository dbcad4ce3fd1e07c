"""`diagnose import kineto|nsys ... --out RUN` and the nvtxt / nsys-rep exports,
wired into diagnose/cli/commands.py (`app.add_typer(import_app, name="import")`)."""

import typer

import_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Import PyTorch-profiler or Nsight Systems traces, or Flight Recorder dumps, into a run directory.",
)


def _report(kind: str, run_dir: str, summary: dict) -> int:
    ranks = sorted(summary["ranks"])
    shown = ",".join(map(str, ranks[:16])) + (",..." if len(ranks) > 16 else "")
    print(f"diagnose: imported {kind} for rank(s) {shown}: {summary['events']} events into {run_dir}")
    print(f"diagnose: next: diagnose analyze {run_dir}")
    return 0


@import_app.command("kineto")
def kineto(
    files: list[str] = typer.Argument(..., help="trace .json or .json.gz, one per rank"),
    out: str | None = typer.Option(None, "--out", help="new run directory"),
):
    """PyTorch profiler (Kineto) traces; the rank comes from distributedInfo, else the order given."""
    from diagnose import rundir
    from diagnose.importers.kineto import import_kineto

    run_dir, summary = import_kineto(list(files), out or rundir.default_out_dir(name="kineto"))
    return _report("Kineto traces", run_dir, summary)


@import_app.command("nsys")
def nsys(
    files: list[str] = typer.Argument(..., help="Nsight Systems SQLite exports (nsys export --type sqlite)"),
    out: str | None = typer.Option(None, "--out", help="new run directory"),
):
    """Nsight Systems SQLite exports; rank from a `rank<N>` file name, else the order given."""
    from diagnose import rundir
    from diagnose.importers.nsys import import_nsys

    run_dir, summary = import_nsys(list(files), out or rundir.default_out_dir(name="nsys"))
    return _report("Nsight Systems exports", run_dir, summary)


@import_app.command("flight-recorder")
def flight_recorder(
    paths: list[str] = typer.Argument(..., help="dump files, or folders of them (pickle or JSON)"),
    out: str | None = typer.Option(None, "--out", help="new run directory"),
    force: bool = typer.Option(False, "--force", help="replace RUN if it exists"),
):
    """PyTorch Flight Recorder dumps (any backend); the rank is the file name's trailing digits.
    Read safely (no code in a pickle can run), then analyzed: who stopped where."""
    from diagnose import rundir
    from diagnose.cli.after_run import analyze_run
    from diagnose.cli.console import print_findings
    from diagnose.importers.flight_recorder_import import import_flight_recorder

    run_dir, summary = import_flight_recorder(
        list(paths), out or rundir.default_out_dir(name="flight-recorder"), force=force
    )
    ranks = summary["ranks"]
    print(
        f"diagnose: imported Flight Recorder dumps (format {', '.join(summary['versions'])}) of "
        f"{len(ranks)} rank(s) into {run_dir}"
    )
    _, findings = analyze_run([run_dir])
    print_findings(findings)
    return 0


def export_interop(run_dir: str, fmt: str, out: str | None) -> int:
    from diagnose.analysis.load.loader import load

    run = load(run_dir)
    if fmt == "nvtxt":
        from diagnose.exporters.nvtxt import write_nvtxt

        for path in write_nvtxt(run, out):
            print(path)
    else:
        from diagnose.exporters.nsys_rep import write_nsys_rep

        print(write_nsys_rep(run, out))
    return 0
