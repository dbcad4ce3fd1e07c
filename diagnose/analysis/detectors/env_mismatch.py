"""env_mismatch: the ranks of one job do not run in the same environment.

Signal: each rank's `meta.json: env` (collectors/instrument/rank_environment.py
writes it once its first step has ended). For every property below, the
majority value over the ranks that report it is the reference (a tie goes to
the value the lowest such rank holds) and the ranks holding anything else are
the odd ones out. A rank that does not report a property (probe failed, NVML
absent, killed before torch was imported) is left out of that comparison:
unknown is not different.

Properties and threshold (any difference at all is a finding; one finding per
job lists them all, `ranks` = every odd rank):

* critical: torch, torch's CUDA runtime (`torch.version.cuda`) or NCCL
  versions differ (ranks then run different collective implementations or
  wire protocols: hangs, wrong results or errors at the first collective); a
  rank has no InfiniBand device while most have some (its NCCL falls back to
  TCP sockets, several times slower across nodes, and paces every collective).
* warning: driver or driver CUDA version, Python version, GPU model,
  application clocks or ECC mode differ (the slowest or smallest GPU sets the
  pace; a driver split usually points at a node left out of an update);
  fewer InfiniBand devices than the majority (less bandwidth); an `NCCL_*` /
  `TORCH_NCCL_*` variable set on some ranks only or set differently (NCCL
  reads its settings per process: one node with another NCCL_ALGO, NCCL_PROTO
  or NCCL_IB_DISABLE runs differently from its peers, or hangs).

What legitimately differs per rank is not compared: LOCAL_RANK, hosts,
CUDA_VISIBLE_DEVICES and interface names are not compared at all; variables
that name a path or a host (`*_FILE`, `*_DIR`, `*_PATH`, NCCL_HOSTID) are
skipped; list-valued variables (NCCL_SOCKET_IFNAME, NCCL_IB_HCA) are compared
as sets, since their order means nothing. A difference costs no step time
that can be measured here, so impact is 0 and severity is set here.
"""

from collections import Counter

from diagnose.analysis.detectors.finding_record import Finding

CRITICAL_VERSIONS = ("torch", "cuda", "nccl")
WARNING_VERSIONS = ("driver", "cuda_driver", "python")
GPU_FIELDS = ("model", "app_sm_clock_mhz", "app_mem_clock_mhz")
LABELS = {
    "torch": "torch {}",
    "cuda": "CUDA {} (torch build)",
    "nccl": "NCCL {}",
    "driver": "driver {}",
    "cuda_driver": "driver CUDA {}",
    "python": "Python {}",
    "model": "GPU {}",
    "app_sm_clock_mhz": "application SM clock {} MHz",
    "app_mem_clock_mhz": "application memory clock {} MHz",
    "ecc": "ECC {}",
}
SKIPPED_SUFFIXES = ("_FILE", "_DIR", "_PATH")
SKIPPED_VARS = {"NCCL_HOSTID"}
SET_VALUED_VARS = {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"}


def detect(ctx):
    envs = {}
    for rank, meta in ctx.run.rank_meta.items():
        env = meta.get("env") if isinstance(meta, dict) else None
        if isinstance(env, dict):
            envs[rank] = env
    if len(envs) < 2:
        return []
    hosts = {r: m.get("host") for r, m in ctx.run.rank_meta.items() if isinstance(m, dict)}
    return mismatch_findings(envs, hosts)


def mismatch_findings(envs: dict, hosts: dict | None = None) -> list:
    """envs: {rank: meta["env"]} -> [] or [the one Finding]."""
    diffs = []  # (severity, metric name, odd ranks, phrase)
    for key in CRITICAL_VERSIONS + WARNING_VERSIONS:
        values = {r: _section(e, "versions").get(key) for r, e in envs.items()}
        _compare(
            diffs,
            "critical" if key in CRITICAL_VERSIONS else "warning",
            key,
            LABELS[key].format,
            {r: v for r, v in values.items() if isinstance(v, (str, int))},
        )
    for key in GPU_FIELDS:
        values = {r: _section(e, "gpu").get(key) for r, e in envs.items()}
        _compare(
            diffs,
            "warning",
            f"gpu_{key}",
            LABELS[key].format,
            {r: v for r, v in values.items() if isinstance(v, (str, int))},
        )
    ecc = {r: _section(e, "gpu").get("ecc") for r, e in envs.items()}
    _compare(
        diffs,
        "warning",
        "gpu_ecc",
        LABELS["ecc"].format,
        {r: ("on" if v.get("current") else "off") for r, v in ecc.items() if isinstance(v, dict)},
    )
    _compare_ib(diffs, envs)
    _compare_nccl_env(diffs, envs)
    if not diffs:
        return []
    odd = sorted({r for _, _, ranks, _ in diffs for r in ranks})
    severity = "critical" if any(s == "critical" for s, _, _, _ in diffs) else "warning"
    metrics = {"ranks_compared": len(envs), "differences": len(diffs)}
    metrics.update({name: len(ranks) for _, name, ranks, _ in diffs})
    return [
        Finding(
            kind="env_mismatch",
            ranks=odd,
            severity=severity,
            title=f"{_ranks(odd).capitalize()} {'differs' if len(odd) == 1 else 'differ'} from the rest of "
            "the job: " + "; ".join(phrase for _, _, _, phrase in diffs),
            recommendation=_recommendation(diffs, odd, hosts or {}),
            metrics=metrics,
        )
    ]


def _section(env: dict, name: str) -> dict:
    value = env.get(name)
    return value if isinstance(value, dict) else {}


def _majority(values: dict):
    """The reference value: the most common; a tie goes to the lowest rank's value."""
    counts = Counter(values.values())
    top = max(counts.values())
    return next(values[r] for r in sorted(values) if counts[values[r]] == top)


def _compare(diffs: list, severity: str, name: str, show, values: dict) -> None:
    """show(value) -> the value as a person reads it ('torch 2.4.0', 'NCCL_ALGO=Ring')."""
    if len(values) < 2 or len(set(values.values())) < 2:
        return
    reference = _majority(values)
    by_value: dict = {}
    for rank in sorted(values):
        if values[rank] != reference:
            by_value.setdefault(values[rank], []).append(rank)
    odd = sorted(r for ranks in by_value.values() for r in ranks)
    groups = ", ".join(f"{show(v)} on {_ranks(ranks)}" for v, ranks in by_value.items())
    diffs.append((severity, f"{name}_ranks_differing", odd, f"{groups} (the others: {show(reference)})"))


def _compare_ib(diffs: list, envs: dict) -> None:
    """Fewer InfiniBand devices than the majority. Names are not compared (one
    node's mlx5_0 is another's mlx5_2); more devices than the majority harms no one."""
    counts = {r: len(e["ib_devices"]) for r, e in envs.items() if isinstance(e.get("ib_devices"), list)}
    if len(counts) < 2:
        return
    reference = _majority(counts)
    none = sorted(r for r, n in counts.items() if n == 0 and reference > 0)
    fewer = sorted(r for r, n in counts.items() if 0 < n < reference)
    if none:
        diffs.append(
            (
                "critical",
                "ib_devices_missing_ranks_differing",
                none,
                f"no InfiniBand device on {_ranks(none)} (the others: {reference}), "
                "so NCCL falls back to TCP sockets there",
            )
        )
    if fewer:
        shown = ", ".join(f"{counts[r]}" for r in fewer)
        diffs.append(
            (
                "warning",
                "ib_devices_fewer_ranks_differing",
                fewer,
                f"fewer InfiniBand devices on {_ranks(fewer)} ({shown}; the others: {reference})",
            )
        )


def _compare_nccl_env(diffs: list, envs: dict) -> None:
    tables = {r: e["nccl_env"] for r, e in envs.items() if isinstance(e.get("nccl_env"), dict)}
    names = sorted({n for t in tables.values() for n in t if isinstance(n, str)})
    for name in names:
        if name in SKIPPED_VARS or name.endswith(SKIPPED_SUFFIXES):
            continue
        values = {r: _normalised(name, t.get(name)) for r, t in tables.items()}
        _compare(diffs, "warning", name, lambda v, n=name: f"{n} unset" if v is None else f"{n}={v}", values)


def _normalised(name: str, value):
    if not isinstance(value, str):
        return None
    if name in SET_VALUED_VARS:
        # "^docker,lo" and "lo,^docker" are not the same, but "eth1,eth0" is "eth0,eth1":
        # keep the leading ^ (exclude) or = (exact) prefix, sort the names after it
        prefix = value[:1] if value[:1] in "^=" and value else ""
        return prefix + ",".join(sorted(p.strip() for p in value[len(prefix) :].split(",") if p.strip()))
    return value


def _ranks(ranks: list) -> str:
    """'rank 3', 'ranks 1,5', 'ranks 8-15': contiguous runs shortened (a node's ranks)."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}" if r > start + 1 else f"{start},{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def _recommendation(diffs: list, odd: list, hosts: dict) -> str:
    names = {name for _, name, _, _ in diffs}
    out = []
    if names & {f"{k}_ranks_differing" for k in CRITICAL_VERSIONS + WARNING_VERSIONS}:
        out.append(
            "Run every rank from the same image or environment (torch, CUDA, NCCL, driver): "
            "mixed versions can hang or fail at the first collective."
        )
    if any(n.startswith("ib_devices") for n in names):
        out.append(
            "Check the InfiniBand devices and drivers on the odd nodes (ibv_devinfo); "
            "NCCL_DEBUG=INFO shows 'NET/Socket' where NCCL fell back to sockets."
        )
    if any(n.startswith("gpu_") for n in names):
        out.append("Use the same GPU model, clocks and ECC mode on every rank, or expect the slowest to pace the job.")
    if any(n.startswith(("NCCL_", "TORCH_NCCL_")) for n in names):
        out.append(
            "Set NCCL_*/TORCH_NCCL_* variables once in the launcher's environment so every "
            "rank gets the same, not per node or in the script on some ranks."
        )
    where = sorted({str(hosts[r]) for r in odd if hosts.get(r)})
    if where and len(where) <= 8:
        out.append(f"The odd ranks run on {', '.join(where)}.")
    return " ".join(out)
