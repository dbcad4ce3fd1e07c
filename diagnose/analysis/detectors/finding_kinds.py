"""The kinds of finding diagnose reports, one entry each: the one place a cause is
spelled. The detectors run in this order (run_detectors.py); the CLI, the report,
compare, the regression gate, the what-if and MLflow read their kinds, labels
and what-ifs here, and show a kind this version does not know (a findings.json
of another version) by its name.

Adding a cause: a detector module (`detect(ctx) -> list[Finding]`, its docstring
stating signal and threshold) and an entry here; tests/analysis/test_finding_kinds.py
lists what an entry must provide and shows a kind added in a test reach the
CLI, the report, compare and MLflow.

Readers look KINDS up when they run, not when they are imported, so that a test
can register a kind with monkeypatch.
"""

from dataclasses import dataclass

DETECTORS_PACKAGE = "diagnose.analysis.detectors"
# where most causes' time shows in the host breakdown: the others wait for it in collectives
DEFAULT_PARTS = ("exposed_comm",)


@dataclass(frozen=True)
class FindingKind:
    name: str  # the `kind` of its findings (findings.json, metric and tag names)
    label: str  # what a person reads: the CLI, the report, compare
    docs: str  # where its signal and threshold are explained: "docs/FILE.md#anchor"
    # what the what-if replay removes to price a fix (docs/whatif.md, "What each fix
    # changes"); None: the detector's estimate is the impact
    whatif: str | None = None
    device_whatif: bool = False  # the device graph (GPU traces) replays it too
    # why its impact stays the detector's estimate even where the replay holds
    estimate_why: str | None = None
    # the report's views that prove it, the first one present wins (dashboards/fig_findings.py)
    evidence: tuple = ()
    # the parts of the host breakdown its time shows in (the regression gate's impact check)
    parts: tuple = DEFAULT_PARTS
    job_stopped: bool = False  # the job did not finish: leads the findings, keeps its own severity
    culprits: bool = False  # its ranks are to blame: their machines are tracked across runs
    detector: str | None = None  # the detector's module; None: DETECTORS_PACKAGE.<name>

    @property
    def module(self) -> str:
        return self.detector or f"{DETECTORS_PACKAGE}.{self.name}"


KINDS = (
    FindingKind(
        "hang",
        "The job hung",
        "docs/analysis.md#hang",
        evidence=("timeline", "collectives"),
        job_stopped=True,
        culprits=True,
    ),
    FindingKind(
        "rank_failure",
        "A rank died",
        "docs/analysis.md#rank_failure",
        evidence=("timeline",),
        job_stopped=True,
        culprits=True,
    ),
    FindingKind(
        "straggler",
        "Straggler rank",
        "docs/analysis.md#straggler",
        whatif="its own work per step down to its stage peers' median",
        device_whatif=True,
        evidence=("heat-busy", "heat-wait-caused", "breakdown-ranks"),
        culprits=True,
    ),
    FindingKind(
        "workload_imbalance",
        "Uneven work per micro-batch",
        "docs/analysis.md#workload_imbalance",
        whatif="every rank's compute per step at its stage's mean",
        device_whatif=True,
        evidence=("heat-busy", "heat-wait-caused", "breakdown-ranks"),
    ),
    FindingKind(
        "stage_imbalance",
        "Unbalanced pipeline stages",
        "docs/analysis.md#stage_imbalance",
        whatif="the stage's own work down to the other stages' mean",
        device_whatif=True,
        evidence=("pipeline-stages", "pipeline", "breakdown-ranks"),
        parts=("pipeline_wait",),
    ),
    FindingKind(
        "pipeline_bubble",
        "Pipeline bubble",
        "docs/analysis.md#pipeline_bubble",
        whatif="the schedule's theoretical bubble at the recommended micro-batch count",
        device_whatif=True,
        estimate_why="the schedule's theoretical bubble at the recommended micro-batch count "
        "(a schedule change, not a duration the replay can change)",
        evidence=("pipeline", "pipeline-stages", "breakdown-steps"),
        parts=("pipeline_wait",),
    ),
    FindingKind(
        "input_stall",
        "Input pipeline stall",
        "docs/analysis.md#input_stall",
        whatif="the data waits removed",
        evidence=("data-wait", "breakdown-steps"),
        parts=("data_wait",),
    ),
    FindingKind(
        "hidden_sync",
        "Hidden synchronization",
        "docs/analysis.md#hidden_sync",
        whatif="the callsite's collectives and host syncs removed",
        device_whatif=True,
        # a hidden sync is a blocking collective or a device sync
        evidence=("timeline", "breakdown-ranks"),
        parts=("host_sync", "exposed_comm"),
    ),
    FindingKind(
        "accumulation_sync",
        "Gradients reduced every micro-batch",
        "docs/analysis.md#accumulation_sync",
        whatif="the extra reduction rounds removed",
    ),
    FindingKind(
        "blocking_async",
        "Async operation waited at once",
        "docs/analysis.md#blocking_async",
        whatif="the p2p ops waited at once posted as the fix would: a send and the receive from "
        "its own peer as one batch, a lone send waited at the end of its step's schedule",
        evidence=("timeline", "breakdown-ranks"),
    ),
    FindingKind(
        "exposed_comm",
        "Exposed communication",
        "docs/analysis.md#exposed_comm",
        whatif="every collective instant",
        device_whatif=True,
        evidence=("breakdown-ranks", "timeline"),
    ),
    FindingKind(
        "host_bound",
        "GPUs wait for their hosts",
        "docs/analysis.md#host_bound",
        whatif="the host's own work between its launches gone, its data waits kept",
        device_whatif=True,
        evidence=("timeline", "breakdown-ranks"),
        # the host's time goes to its own work: the passes and whatever it does between them
        parts=("forward", "backward", "optimizer", "other"),
    ),
    FindingKind("fp32_math", "Matrix math in fp32", "docs/analysis.md#fp32_math"),
    FindingKind("copy_stall", "Host-device copies on the critical path", "docs/analysis.md#copy_stall"),
    FindingKind("checkpoint_stall", "Checkpoint saves block training", "docs/analysis.md#checkpoint_stall"),
    FindingKind(
        "memory_imbalance",
        "Uneven peak memory",
        "docs/analysis.md#memory_imbalance",
        evidence=("samples", "breakdown-ranks"),
    ),
    FindingKind("env_mismatch", "Ranks run in different environments", "docs/analysis.md#env_mismatch"),
)


def names() -> tuple[str, ...]:
    """Every kind, in the detectors' run order."""
    return tuple(k.name for k in KINDS)


def of(kind) -> FindingKind | None:
    return next((k for k in KINDS if k.name == kind), None)


def label(kind) -> str:
    """The kind's label; a kind this version does not know reads as its name."""
    entry = of(kind)
    return entry.label if entry else str(kind)


def where(finding: dict, callsite: bool = True) -> str:
    """Where a finding is, as a label says it: the ranks to blame (a kind with
    culprits), else its pipeline stage, else (`callsite`) its line; "" when none."""
    entry, ranks = of(finding.get("kind")), finding.get("ranks") or []
    if entry and entry.culprits and ranks:
        return "rank " + ", ".join(map(str, ranks[:4])) + (", ..." if len(ranks) > 4 else "")
    if finding.get("stage") is not None:
        return f"stage {finding['stage']}"
    return (finding.get("callsite") or "") if callsite else ""


def job_stopped(kind) -> bool:
    entry = of(kind)
    return bool(entry and entry.job_stopped)


def parts_of(kind) -> tuple:
    entry = of(kind)
    return entry.parts if entry else DEFAULT_PARTS


def with_device_whatif() -> tuple[str, ...]:
    return tuple(k.name for k in KINDS if k.device_whatif)


def estimated() -> dict[str, str]:
    """kind -> why its impact is the detector's estimate wherever the replay holds."""
    return {k.name: k.estimate_why for k in KINDS if k.estimate_why}
