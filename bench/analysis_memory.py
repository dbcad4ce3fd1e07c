"""Where the analysis' memory goes, table by table (issue 25's groundwork): one
process loads a run and builds the derived tables in the order the detectors
ask for them, printing its resident and peak memory after each, and each
table's own size.

    .venv/bin/python -m bench.analysis_memory RUN      # e.g. a run kept by bench/scale.py --keep DIR

The peak over the whole analysis is what `bench/scale.py` reports; this says
which table holds it, per event of the run, so that the two-level design
(per-rank compact tables, a cross-rank pass over them) targets the right ones.
"""

import sys
import time


def rss_mb() -> tuple[float, float]:
    """(resident, peak resident) of this process, MB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def frame_mb(frame) -> float:
    return float(frame.memory_usage(deep=True).sum()) / 2**20 if frame is not None else 0.0


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[3].strip())
    from diagnose.cli.allocator import keep_freed_memory  # as the CLI runs the analysis

    keep_freed_memory()
    import diagnose
    from diagnose.analysis.findings.run_detectors import detect

    t0 = time.perf_counter()
    run = diagnose.load(sys.argv[1], warn=lambda m: None)
    events = len(run.events())
    rows = [("load (events)", frame_mb(run.events()))]

    def line(name, size_mb):
        rss, peak = rss_mb()
        print(
            f"{name:22s} table {size_mb:8.0f} MB ({size_mb * 2**20 / max(events, 1):6.1f} B/event)  "
            f"rss {rss:8.0f} MB  peak {peak:8.0f} MB ({peak * 2**20 / max(events, 1):6.1f} B/event)  "
            f"t={time.perf_counter() - t0:6.1f} s",
            flush=True,
        )

    print(f"{len(run.ranks)} ranks, {events:,} events")
    line(*rows[0])
    for name in ("steps", "collectives", "arrivals", "breakdown", "spans"):
        line(name, frame_mb(getattr(run, name)()))
    findings = detect(run)
    line(f"detect ({len(findings)} findings)", 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
