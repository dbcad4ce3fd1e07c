"""What a fix saves, by replaying the run's steps (diagnose/analysis/step_replay.py)
with the finding's cause removed; and the ideal step.

Per finding kind, what "removed" means:
- straggler: the rank's own work (its gaps: compute, and whatever else it does
  outside collectives) in each step brought down to the median of its
  pipeline-stage peers' in that step (a step it was faster stays as it was);
- workload_imbalance: every rank's compute in each step set to its stage's
  mean for that step (token-balanced micro-batches: same total work; the only
  what-if that lengthens some durations, so it can lengthen a step: hidden_sync
  on dp4 replayed 0.9 ms slower, a saving of 0);
- stage_imbalance: the stage's own work brought down to the mean stage's;
- input_stall: the data waits removed;
- hidden_sync: the callsite's collectives and host syncs removed;
- exposed_comm: every collective takes no time (fully overlapped);
- accumulation_sync: the gradient reductions of every backward but each step's
  last removed;
- pipeline_bubble: the bubble at the schedule's theoretical size for the
  recommended micro-batch count (the detector's arithmetic: a schedule change
  is not a duration change the replay can make).
blocking_async keeps its detector's estimate: moving a wait changes the order of
a lane, not a duration, and on the pipelined bench (sends waited at once on
pp4) a replay that waited them at the step's end saved 218 ms where the fix
measured 5.9 +- 6.9 ms (bench/results/2026-12-04-whatif-accuracy.md).
The saving is the replayed step time, as is, minus the what-if's, averaged over
the steady steps: the replay's own error cancels. A what-if changes only the
steady steps' durations, so the step before them ends as recorded and every
saving is measured from the same origin (changing earlier steps too would
shift it: a what-if that shortens only every step's durations could read as a
loss). The ideal step brings every rank's compute down to its stage's median
per step (no rank made slower).
"""
from collections import defaultdict

import numpy as np
import pandas as pd

from diagnose.analysis import device_lanes
from diagnose.analysis.step_replay import StepModel, job_step_ms, overlap_ns

COMPUTE_PHASES = ("forward", "backward", "optimizer")


class WhatIf:
    def __init__(self, run, steady: list[int], stages: dict[int, int], device: bool = False):
        """`device`: lanes of GPUs, not host threads (diagnose/analysis/device_lanes.py)."""
        self.steady, self.stages, self.device = steady, stages, device
        if device:
            kernels = run.kernels()
            self.model = StepModel(device_lanes.device_calls(run.collectives()),
                                   device_lanes.device_steps(kernels))
        else:
            self.model = StepModel(run.collectives(), run.in_window(run.steps()))
        self.ok = self.model.ok
        if not self.ok:
            return
        self.base = job_step_ms(self.model.replay(), steady)
        self.ok = bool(self.base)
        events = run.events()
        self._events = events
        self._windows = {r: self.model.gap_windows(r) for r in self.model.lanes}
        # per gap, the ns of work to scale: the compute phases (device: compute
        # kernels) where the job has them (workload, ideal), or all of the rank's own
        # work (straggler, stage: a rank can be slow outside its phases, in logging
        # or Python overhead)
        self._own = {r: np.maximum(g, 0.0) for r, g in self.model.gaps.items()}
        phases = (device_lanes.compute_rows(kernels) if device else
                  events[(events["kind"] == "phase") & events["name"].isin(COMPUTE_PHASES)])
        self._compute = self._overlaps(phases) if len(phases) else self._own
        self._step_of = {r: np.array([p[4] for p in lane]) for r, lane in self.model.lanes.items()}
        self._in_steady = {r: np.isin(steps, steady) for r, steps in self._step_of.items()}
        inst_step = self.model.calls.groupby("_inst")["step"].max().reindex(range(len(self.model.length_ns)))
        self._inst_steady = inst_step.isin(steady).to_numpy()

    def _overlaps(self, rows: pd.DataFrame) -> dict[int, np.ndarray]:
        """rank -> per gap, the ns of these event rows inside it."""
        by_rank = {int(r): part for r, part in rows.groupby("rank")}
        out = {}
        for r, windows in self._windows.items():
            mine = by_rank.get(r, rows.iloc[:0]).sort_values("start_ns")
            intervals = list(zip(mine["start_ns"].astype(np.int64), mine["end_ns"].astype(np.int64)))
            out[r] = overlap_ns(windows, intervals)
        return out

    def step_ms(self) -> float:
        return float(np.mean(list(self.base.values())))

    def _saving(self, gaps=None, length_ns=None, skip=frozenset()) -> tuple[float, float] | None:
        m = self.model
        if gaps is not None:  # the steady steps' only (see the module's docstring)
            gaps = {r: np.where(self._in_steady[r], g, m.gaps[r]) for r, g in gaps.items()}
        if length_ns is not None:
            length_ns = np.where(self._inst_steady, length_ns, m.length_ns)
        skip = frozenset(i for i in skip if self._inst_steady[i])
        ends = m.replay(gaps=gaps, length_ns=length_ns, skip=skip)
        after = job_step_ms(ends, self.steady)
        common = [s for s in self.base if s in after]
        if not common:
            return None
        before_ms = float(np.mean([self.base[s] for s in common]))
        after_ms = float(np.mean([after[s] for s in common]))
        return before_ms - after_ms, after_ms

    def _compute_per_step(self, basis=None) -> dict[int, dict[int, float]]:
        """rank -> step -> ns of compute (or of `basis`) in its gaps."""
        out = {}
        for r, compute in (basis or self._compute).items():
            per = defaultdict(float)
            for step, ns in zip(self._step_of[r], compute):
                per[int(step)] += ns
            out[r] = per
        return out

    def _scaled(self, target: dict, basis=None) -> dict:
        """Gaps with each (rank, step)'s compute (or `basis`) scaled to target[rank][step] ns."""
        basis = basis or self._compute
        per_step = self._compute_per_step(basis)
        gaps = {}
        for r, gap in self.model.gaps.items():
            new = gap.copy()
            for k, step in enumerate(self._step_of[r]):
                own = per_step[r].get(int(step), 0.0)
                want = target.get(r, {}).get(int(step))
                if want is None or own <= 0:
                    continue
                # (compute lies only in positive gaps: a negative one is left as it is)
                new[k] = gap[k] - basis[r][k] * (1.0 - want / own)
            gaps[r] = new
        return gaps

    def _peer_target(self, reduce, ranks=None, with_self=False, basis=None) -> dict:
        """rank -> step -> reduce(compute of the rank's stage peers in that step)."""
        per_step = self._compute_per_step(basis)
        by_stage = defaultdict(list)
        for r in per_step:
            by_stage[self.stages.get(r, 0)].append(r)
        target = {}
        for r in (ranks if ranks is not None else per_step):
            peers = [p for p in by_stage[self.stages.get(r, 0)] if with_self or p != r] or [r]
            target[r] = {s: float(reduce([per_step[p].get(s, 0.0) for p in peers]))
                         for s in per_step[r]}
        return target

    def straggler(self, rank: int):
        own = self._compute_per_step(self._own)[rank]
        median = self._peer_target(np.median, ranks=[rank], basis=self._own)[rank]
        target = {rank: {s: min(ns, own.get(s, ns)) for s, ns in median.items()}}
        return self._saving(gaps=self._scaled(target, basis=self._own))

    def workload_imbalance(self):
        return self._saving(gaps=self._scaled(self._peer_target(np.mean, with_self=True)))

    def stage_imbalance(self, stage: int):
        per_step = self._compute_per_step(self._own)
        stage_mean = defaultdict(list)
        for r, per in per_step.items():
            stage_mean[self.stages.get(r, 0)].append(np.mean(list(per.values())) if per else 0.0)
        means = {s: float(np.mean(v)) for s, v in stage_mean.items()}
        mean_stage = float(np.mean(list(means.values())))
        if means.get(stage, 0.0) <= 0:
            return None
        factor = min(mean_stage / means[stage], 1.0)
        target = {r: {s: ns * factor for s, ns in per.items()} for r, per in per_step.items()
                  if self.stages.get(r, 0) == stage}
        return self._saving(gaps=self._scaled(target, basis=self._own))

    def input_stall(self):
        events = self._events
        waits = self._overlaps(events[events["kind"] == "data"])
        return self._saving(gaps={r: g - waits[r] for r, g in self.model.gaps.items()})

    def hidden_sync(self, same_place):
        """same_place(callsite) -> bool: the finding's callsite (the run's are absolute)."""
        calls = self.model.calls
        mask = calls["callsite"].astype(str).map(same_place).astype(bool)
        skip = frozenset(int(i) for i in calls.loc[mask, "_inst"])
        events = self._events
        syncs = self._overlaps(events[(events["kind"] == "sync")
                                      & events["callsite"].astype(str).map(same_place).astype(bool)])
        return self._saving(gaps={r: g - syncs[r] for r, g in self.model.gaps.items()}, skip=skip)

    def without_instances(self, rows: pd.DataFrame):
        """The collective instances named by rows' (group, seq) removed."""
        calls = self.model.calls
        named = pd.MultiIndex.from_arrays([rows["group"].astype(str), rows["seq"].astype(np.int64)])
        mask = pd.MultiIndex.from_arrays([calls["group"].astype(str), calls["seq"].astype(np.int64)]).isin(named)
        return self._saving(skip=frozenset(int(i) for i in calls.loc[mask, "_inst"]))

    def exposed_comm(self):
        return self._saving(length_ns=np.zeros_like(self.model.length_ns))

    def ideal_step_ms(self) -> float | None:
        """Every rank's compute per step at most its stage's median: slowness removed,
        nobody made slower (the replay is monotone: the ideal is never above it;
        raising a fast rank to the median can lengthen a pipeline's critical path).
        The lower median: with two replicas per stage the median is the straggler's and
        its peer's mean (dp2 x pp4: an ideal 478 ms per step short of fixing the straggler)."""
        per_step = self._compute_per_step()
        median = self._peer_target(lower_median, with_self=True)
        target = {r: {s: min(ns, per_step[r].get(s, ns)) for s, ns in steps.items()} for r, steps in median.items()}
        result = self._saving(gaps=self._scaled(target))
        return None if result is None else result[1]


def lower_median(values) -> float:
    """The median, or the lower middle value of an even count."""
    return float(np.percentile(values, 50, method="lower"))


# what-ifs of device lanes: durations of device work. A data wait or a sync is
# host time whose device cost gpu_tables measures; exposed communication is
# overlapped on the device, which its lane serialises (device_lanes.py)
DEVICE_KINDS = ("straggler", "workload_imbalance", "stage_imbalance", "pipeline_bubble")
FIDELITY_FRAC = 0.05  # the replay, as recorded, must give each steady step back within this


def _one(w: WhatIf, ctx, finding):
    kind = finding.kind
    if kind == "straggler" and finding.ranks:
        return w.straggler(int(finding.ranks[0]))
    if kind == "workload_imbalance":
        return w.workload_imbalance()
    if kind == "stage_imbalance" and finding.stage is not None:
        return w.stage_imbalance(int(finding.stage))
    if kind == "input_stall":
        return w.input_stall()
    if kind == "hidden_sync" and finding.callsite:
        return w.hidden_sync(lambda raw: ctx.relpath(raw) == finding.callsite)
    if kind == "exposed_comm":
        return w.exposed_comm()
    if kind == "accumulation_sync":
        from diagnose.analysis.detectors.accumulation_sync import extra_rounds
        rounds = extra_rounds(ctx)
        return None if rounds is None else w.without_instances(rounds.attrs["extra"])
    if kind == "pipeline_bubble":
        saving = finding.metrics["whatif_saving_ms_per_step"]
        return saving, w.step_ms() - saving
    return None


def fidelity(w: WhatIf) -> float | None:
    """The largest per-step error of the replay (recorded durations) against the record."""
    from diagnose.analysis.step_replay import recorded_ends
    recorded = job_step_ms(recorded_ends(w.model), w.steady)
    errors = [abs(w.base[s] - recorded[s]) / recorded[s] for s in recorded if s in w.base and recorded[s] > 0]
    return max(errors) if errors else None


def apply(ctx, findings) -> dict | None:
    """Set each finding's impact to its what-if saving where the replay holds on this
    run (host lanes, or GPU lanes where kernels cover the steady steps), keeping the
    detector's own estimate as `estimate_ms_per_step`. Returns the run's step figures."""
    if not ctx.steady:
        return None
    if ctx.on_device and ctx.kernel_steady != ctx.steady:
        return {"impact_from_replay": False,
                "why": "collectives timed on the device, kernels recorded in too few steps to replay"}
    w = WhatIf(ctx.run, ctx.steady, ctx.run.rank_stages(), device=ctx.on_device)
    if not w.ok:
        return {"measured_step_ms": ctx.step_ms, "impact_from_replay": False,
                "why": w.model.why or "the replay deadlocked: a dependency the trace does not show"}
    error = fidelity(w)
    summary = {"measured_step_ms": ctx.step_ms, "replay_step_ms": w.step_ms(),
               "replay_max_step_error_frac": None if error is None else float(error),
               "ideal_step_ms": w.ideal_step_ms()}
    trusted = bool(error is not None and error <= FIDELITY_FRAC)
    for finding in findings:
        if w.device and finding.kind not in DEVICE_KINDS:
            continue
        result = _one(w, ctx, finding)
        if result is None:
            continue
        saving, after = result
        finding.metrics.update(whatif_step_ms=after, replay_step_ms=summary["replay_step_ms"],
                               whatif_saving_ms_per_step=max(saving, 0.0))
        if trusted:
            finding.metrics.setdefault("estimate_ms_per_step", finding.impact_ms_per_step)
            finding.impact_ms_per_step = max(saving, 0.0)
    summary["impact_from_replay"] = trusted
    return summary
