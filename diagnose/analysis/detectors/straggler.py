"""straggler: the rank whose late arrival at collectives makes the others wait.

Signal: every collective instance is matched across its members; the last to
arrive caused the others' waits (last arrival - own arrival). Per rank we sum
the waiting it caused per steady step (the typical other member's wait, per
instance it was last at: straggler_waits.waiting_caused), less the part during
which it was itself blocked waiting for another rank, which is that rank's
(pass_blame: a tensor-parallel partner of the straggler is last at its
data-parallel collectives only because it waited). Only groups whose members run
the same pipeline stage are used: across stages, arriving last is the schedule,
not a straggler.

Threshold: the rank must cause >= 2x the median of what its stage peers cause
plus 0.5 ms per step (jitter makes everyone last sometimes), be the top
waiter-maker among its peers in >= 50% of steady steps, or busier than the busy
gate below in >= 50% of them, each step on its own (on a loaded box the others'
waits for a core made them last in 7 of 12 steps of a dp2 x tp2 job whose
straggler worked 5.1x as long), and slow on the median step ("persistent"), or in >= 20% and slow on the steps it was last in
("intermittent": last in at least 4 steps and more often than chance among its n
peers gives, binomial p <= 0.01, and busier beyond its peers on those steps than
on its own other steps, Mann-Whitney p <= 0.01: the steps it was last in are by
that choice its slowest, and without these tests a plain 4-rank DDP job with no
fault got a false straggler in 1 of 4 runs, a 2-rank one in tests/data/runs/
ddp-clean-jitter, last in 8 of 10 steps, a coin's odds), and, persistent or
intermittent, not when its micro-batches' work explains its slowness
(workload_imbalance.explains_slowness: the rank that drew the long batches),
its busy time (step minus time blocked waiting on others, per step; the median
over the judged steps, not the median step minus the median waits, which mixes
steps: 1.47x for ddp-clean-jitter's rank 0, whose median busy step is 1.27x)
must be >= 1.4x the median of its pipeline-stage peers' (clean 4-rank runs sharing 2 cores have
shown up to 1.31x: the scheduler favours some ranks; a 30 ms slowdown of a
~50 ms step is ~1.7x); on host time busy is net of the time its training thread
waited for a CPU core (the run delay of its compute rows, tables/run_delay.py):
a rank kept off a core works no longer. It is late all the same, and named for
that, cause "cpu contention", when its busy time with the wait counted passes
1.4x and its wait beyond its peers' is at least half of that excess
(straggler_causes.cpu_contention): the suite's clean 2-rank run beside another
test's 4-rank job came out 1.70x busy on rank 1, both ranks at 41% of a core;
on a real job the same says "another process, or this rank's own threads, take
its cores". Of the ranks that pass, the one with the most busy time
beyond its peers' is reported (a pipeline neighbour of the straggler also arrives
last at its own stage's collectives), and it must cost >= 3% of the step to be a warning (severity
from impact). Evidence: busy and compute (forward+backward+optimizer) ratios to
the median rank, and which part of its step is slow.

Host-bound (device traces with kernels): a rank whose device compute is within
DEVICE_BUSY_RATIO of its peers' can still be late because its host launches
late (HTA's DLRM trace: rank 7 last into 5 of 8 collectives, compute equal).
Its cause then is "host-bound" when, in at least half of the collectives it was
last into, its GPU sat idle for at least half of its lateness (the median
member's wait) until kernels that started within LAUNCH_BOUND_NS of their launch
(the kernel row's queued_ns): an empty queue, the GPU waiting for the host. 20
us: an idle GPU starts a launched kernel ~5-10 us after the runtime call, one
with work queued ahead waits that work (a kernel's length); the margin covers
the profiler's GPU-to-host clock mapping. Not when its own data loading (the
data wait beyond its peers') explains half the waits it caused: input_stall.
Ranked after device-slow candidates; its impact is the waits it causes.

A persistent device straggler on a trace with kernels must also run its
kernels slower (kernels_slower: the typical kernel, matched to its peers' by
step, name and order), where the ranks run one program: heavy-tailed jitter (a
kernel 20 ms late now and then) moves a small group's busy time on a few
steps, which passed the 1.1x gate on the median step in 8 of 20 jittered pp2 x
dp2 runs.
"""

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.detectors.significance import binomial_greater, mann_whitney_greater
from diagnose.analysis.detectors.straggler_causes import (
    DEVICE_BUSY_RATIO,
    busy_gate,
    busy_ratio,
    busy_rows,
    cpu_contention,
    kernels_slower,
    launch_bound,
)
from diagnose.analysis.detectors.straggler_waits import members_seen, waiting_caused
from diagnose.analysis.detectors.workload_imbalance import explains_slowness
from diagnose.analysis.tables.device_idle import LAUNCH_BOUND_NS

CAUSED_RATIO = 2.0
FLOOR_MS = 0.5
PERSISTENT_FRAC = 0.5
INTERMITTENT_FRAC = 0.2
MIN_INTERMITTENT_STEPS = 4
ALPHA = 0.01


def _per_step_busy(ctx, rank, stages, steps, net_of_core_wait=True):
    """(busy ms per step x stage peer, None without the rank or a peer; its busy gate)."""
    rows, busy = busy_rows(ctx, rank, stages, list(steps), net_of_core_wait)
    per_step = busy.groupby([rows["step"], rows["rank"]]).median().unstack("rank")
    gate = busy_gate(rows.columns)
    return (per_step if rank in per_step.columns and per_step.shape[1] >= 2 else None), gate


def _slow_when_last(ctx, rank, stages, straggling, net_of_core_wait) -> bool:
    """An intermittent straggler is judged on the steps it was last in, a choice
    that favours noise: with n peers anyone is last in ~1/n of the steps, and on
    the steps it was last its busy time was, by that choice, its highest. So the
    rank must be last in more steps than chance gives (binomial, p <= ALPHA), in at
    least MIN_INTERMITTENT_STEPS, and on those steps work more beyond its peers
    than on its own other steps (Mann-Whitney, one-sided, p <= ALPHA): a periodic
    stall on its host does both; a scheduler's hiccup on a clean run does neither."""
    judged = set(straggling[straggling].index)
    n_peers = straggling.attrs["peers"]
    if len(judged) < MIN_INTERMITTENT_STEPS or n_peers < 2:
        return False
    if binomial_greater(len(judged), len(straggling), 1 / n_peers) > ALPHA:
        return False
    per_step, _ = _per_step_busy(ctx, rank, stages, straggling.index, net_of_core_wait)
    if per_step is None:
        return False
    excess = (per_step[rank] - per_step.drop(columns=rank).median(axis=1)).dropna()
    slow, other = excess[excess.index.isin(judged)], excess[~excess.index.isin(judged)]
    if len(slow) < MIN_INTERMITTENT_STEPS or len(other) < MIN_INTERMITTENT_STEPS:
        return False
    return mann_whitney_greater(slow, other) <= ALPHA


def _slow_most_steps(ctx, rank, stages, steps) -> bool:
    """Its busy time (own work) at least the busy gate times its stage peers' median
    in at least PERSISTENT_FRAC of the steps, each step judged on its own."""
    per_step, gate = _per_step_busy(ctx, rank, stages, steps)
    if per_step is None:
        return False
    peers = per_step.drop(columns=rank).median(axis=1)
    return bool(((per_step[rank] >= gate * peers) & (peers > 0)).mean() >= PERSISTENT_FRAC)


def detect(ctx):
    caused = waiting_caused(ctx)
    if caused is None or caused.empty or len(caused) < 2:
        return []
    per_rank_ms = caused.mean(axis=1)
    stages = ctx.run.rank_stages()
    # A rank up- or downstream of a straggler in a pipeline arrives late at its own
    # stage's collectives too, and on a loaded host can pass the busy gate
    # (pipeline_straggler on 2 cores: rank 4, stage 0 of the slow rank's pipeline,
    # once came out 1.41x and caused more waiting than the straggler): of the
    # waiter-makers that pass, the one with the most excess work is the cause.
    passed = []
    for top in per_rank_ms.sort_values(ascending=False).index.astype(int):
        peers = [r for r in caused.index if not stages or stages.get(r) == stages.get(top)]
        others = [r for r in peers if r != top] or [r for r in caused.index if r != top]
        baseline_ms = float(per_rank_ms[others].median())
        top_ms = float(per_rank_ms[top])
        if top_ms < CAUSED_RATIO * baseline_ms + FLOOR_MS:
            continue
        straggling = caused.loc[peers].idxmax(axis=0) == top
        straggling.attrs["peers"] = len(peers)
        top_in_steps = float(straggling.mean())
        if top_in_steps < INTERMITTENT_FRAC:
            continue
        # a persistent straggler is judged on every step; an intermittent one on
        # the steps it straggled in (its median over all steps is a normal step).
        # Last in most steps yet normal on the median step is intermittent too: slow
        # in a third of the steps, with 3 peers it is also last in a quarter of the rest
        # Last in fewer than half the steps yet slower in its own work in most: persistent
        # all the same (a loaded box: the others' waits for a core made them last in 7 of
        # 12 steps of the dp2 x tp2 job, whose straggler worked 5.1x as long)
        persistent_too = top_in_steps >= PERSISTENT_FRAC or _slow_most_steps(ctx, top, stages, straggling.index)
        judgements = ([(straggling.index, True)] if persistent_too else []) + [(straggling[straggling].index, False)]
        for judged, persistent in judgements:
            ratio, excess_busy_ms, breakdown = busy_ratio(ctx, top, stages, judged)
            gate = busy_gate(breakdown.columns)
            cause = None  # slower work; else (name, evidence): late, but not by its own work
            if ratio is not None and ratio < gate:
                if gate == DEVICE_BUSY_RATIO:
                    found = launch_bound(ctx, top, judged, top_ms, breakdown)
                    cause = ("host-bound", found) if found else None
                else:
                    found = cpu_contention(ctx, top, stages, judged)
                    cause = ("cpu contention", found) if found else None
            if ratio is None or (ratio < gate and cause is None):
                continue
            if (
                persistent
                and cause is None
                and ctx.kernel_steady
                and gate == DEVICE_BUSY_RATIO
                and not kernels_slower(ctx, top, stages, judged)
            ):
                continue
            # slow by its own micro-batches' work in a run whose lengths vary
            # (workload_imbalance), persistent or not: the rank that drew the long
            # batches, not a slow rank
            net = cause is None or cause[0] != "cpu contention"
            if explains_slowness(ctx, top) or (
                not persistent and not _slow_when_last(ctx, top, stages, straggling, net)
            ):
                break
            # a rank late for another cause works no longer: rank it by the waits it causes
            rank_by = top_ms if cause else excess_busy_ms
            passed.append((rank_by, top, baseline_ms, top_ms, top_in_steps, ratio, breakdown, persistent, cause))
            break
    if not passed:
        return []
    _, top, baseline_ms, top_ms, top_in_steps, ratio, breakdown, persistent, cause = max(
        passed, key=lambda c: (c[8] is None, c[0])
    )
    seen, group_size = members_seen(ctx)
    on_device = "device_compute_ms" in breakdown.columns
    compute = (
        breakdown["device_compute_ms"]
        if on_device
        else breakdown["forward_ms"] + breakdown["backward_ms"] + breakdown["optimizer_ms"]
    )
    compute_ratio = float(compute[top] / compute.drop(top).median())
    parts = ["data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms", "host_sync_ms", "other_ms"]
    excess = {p: float(breakdown.loc[top, p] - breakdown[p].drop(top).median()) for p in parts}
    slow_part = max(excess, key=excess.get)
    impact_ms = top_ms - baseline_ms
    where = "device compute" if on_device else slow_part.removesuffix("_ms").replace("_", " ")
    extra_ms = float(compute[top] - compute.drop(top).median()) if on_device else excess[slow_part]
    clock = "on the GPUs' clocks" if on_device else "on the hosts' clocks"
    kind = "a persistent" if persistent else "an intermittent"
    title = (
        f"rank {top} is {kind} straggler: it works {ratio:.2f}x as long per step as the median rank "
        f"(most in {where}, +{extra_ms:.1f} ms); the others wait {top_ms:.1f} ms/step for it in collectives ({clock})"
    )
    evidence = cause[1] if cause else {}
    if cause and cause[0] == "host-bound":
        title = (
            f"rank {top} is {kind} straggler, host-bound: it launches late; its GPU sat idle until kernels it "
            f"had just launched (started within {LAUNCH_BOUND_NS // 1000} us) before {evidence['launch_bound']} "
            f"of the {evidence['last_in']} collectives it was last into, while its device compute is "
            f"{compute_ratio:.2f}x the median rank's; the others wait {top_ms:.1f} ms/step for it ({clock})"
        )
        where = "its host (launches late)"
    elif cause:
        title = (
            f"rank {top} is {kind} straggler from CPU contention: its training thread waited "
            f"{evidence['core_wait_excess_ms']:.1f} ms/step longer than the median rank's for a CPU core "
            f"(runnable, not running: Linux's run delay), which makes its step {evidence['wall_ratio']:.2f}x as "
            f"long, while its own work is {ratio:.2f}x; the others wait {top_ms:.1f} ms/step for it ({clock})"
        )
        where = "waiting for a CPU core"
    partial = seen < group_size
    if partial:
        title = (
            f"rank {top} is the later of the {seen} ranks seen (of the group's {group_size}): it works "
            f"{ratio:.2f}x as long per step (most in {where}, +{extra_ms:.1f} ms) and the other "
            f"ranks seen wait {top_ms:.1f} ms/step for it ({clock}); only {seen}/{group_size} members "
            "were traced, so this wait is a lower bound and an unseen rank may be the cause"
        )
    advice = {
        "data wait": "its input pipeline is slower: check its data shard, disk and loader workers",
        "its host (launches late)": "its CPU side falls behind its GPU: profile its host (the profiler's "
        "CPU ops, py-spy) for extra Python work, logging, garbage collection, "
        "or CPU contention and affinity (fewer or busier cores than its peers)",
        "waiting for a CPU core": "its host runs more busy threads than it has cores for this rank: check "
        "what else runs there (another job, data-loader workers, OMP_NUM_THREADS/MKL threads of each rank) "
        "and pin each rank to cores of its own (taskset, numactl, the launcher's affinity options)",
        "other": "it spends more time outside the recorded phases: check for extra work "
        "(logging, checkpointing, Python overhead) on that rank",
    }.get(
        where,
        "check that rank's host and device (thermal throttling, a noisy neighbour, "
        "a slower GPU or CPU affinity) or rebalance its work",
    )
    if partial:
        advice += "; trace all ranks of the group (or a wider sample) to confirm it is the slowest"
    return [
        Finding(
            kind="straggler",
            title=title,
            ranks=[top],
            impact_ms_per_step=impact_ms,
            recommendation=f"Rank {top} is slowest in {where}: {advice}.",
            metrics={
                "waiting_caused_ms_per_step": top_ms,
                "others_caused_median_ms": baseline_ms,
                "compute_ratio_x": compute_ratio,
                "busy_ratio_x": ratio,
                "last_in_steps_frac": top_in_steps,
                "persistent": float(persistent),
                "ranks_seen": seen,
                "group_size": group_size,
                "members_seen_frac": seen / group_size,
                "wait_is_lower_bound": float(partial),
                "device_time": float(on_device),
                "cause": cause[0] if cause else "slower work",
                **(
                    {"launch_bound_frac": evidence["launch_bound"] / evidence["last_in"]}
                    if "last_in" in evidence
                    else {}
                ),
                **({"core_wait_excess_ms": evidence["core_wait_excess_ms"]} if "core_wait_ms" in evidence else {}),
                # (rank 0's clock is the reference: its own error is nil)
                **(
                    {
                        "clock_error_us": max([ctx.run.offset_errors_ns.get(r, 0) for r in ctx.run.ranks[1:]] or [0])
                        / 1e3
                    }
                    if on_device
                    else {}
                ),
            },
        )
    ]
