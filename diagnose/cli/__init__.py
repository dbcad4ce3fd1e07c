"""The `diagnose` command line: parse, compose, print. Every command body is here.

Enters: argv. commands is the typer application (`diagnose.cli:main`, the
console script); the bodies compose the stages: after_run (analyze, then the merged
trace, report and MLflow run), report_commands, compare_command,
interop_commands (import and the Nsight exports), demo_command; console prints
tables; allocator sets the process's memory behaviour. Leaves: files in the run
directory, text on stdout, one-line errors on stderr with exit status 2."""

from diagnose.cli.commands import main

__all__ = ["main"]
