"""Each finding's impact: its what-if saving on the replay where the replay holds
(diagnose/analysis/replay/whatif.py), else its detector's estimate, with
`impact_source` saying which and why; and the step's waterfall: the fixes of
all findings replayed together, so that their shares add up
(diagnose/analysis/findings/step_waterfall.py).
"""

from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.findings.step_waterfall import step_waterfall
from diagnose.analysis.replay.whatif import WhatIf

# what-ifs of the device graph (device_graph.py): durations of device work and
# transfers, and host syncs removed. A data wait is host time the device graph
# does not hold: its detector's estimate stands
DEVICE_KINDS = finding_kinds.with_device_whatif()
# what the kinds without a replayed what-if are estimated from (impact_source)
NOT_REPLAYED = finding_kinds.estimated()
FIDELITY_FRAC = 0.05  # the replay, as recorded, must give each steady step back within this


def _one(w: WhatIf, ctx, finding):
    kind = finding.kind
    if kind == "straggler" and finding.ranks and w.device and finding.metrics.get("cause") == "host-bound":
        return w.host_bound_straggler(int(finding.ranks[0]))
    if kind == "straggler" and finding.ranks:
        return w.straggler(int(finding.ranks[0]))
    if kind == "workload_imbalance":
        return w.workload_imbalance()
    if kind == "stage_imbalance" and finding.stage is not None:
        return w.stage_imbalance(int(finding.stage))
    if kind == "input_stall":
        return w.input_stall()
    if kind == "hidden_sync" and w.device:
        site = finding.metrics.get("sync_site")
        return None if site is None else w.device_syncs(site)
    if kind == "hidden_sync" and finding.callsite:
        return w.hidden_sync(lambda raw: ctx.relpath(raw) == finding.callsite)
    if kind == "blocking_async" and finding.callsite and not w.device:
        return w.deferred_sends(lambda raw: ctx.relpath(raw) == finding.callsite)
    if kind == "exposed_comm":
        return w.exposed_comm()
    if kind == "host_bound" and w.device:
        return w.host_bound()
    if kind == "accumulation_sync":
        from diagnose.analysis.detectors.accumulation_sync import extra_rounds

        rounds = extra_rounds(ctx)
        return None if rounds is None else w.without_instances(rounds.attrs["extra"])
    if kind == "pipeline_bubble":
        saving = finding.metrics["whatif_saving_ms_per_step"]
        return saving, w.step_ms() - saving
    return None


def fidelity(w: WhatIf) -> tuple[float | None, float | None]:
    """(the largest per-step error of the replay, recorded durations, against the
    record; the recorded step it is checked against, ms). On device lanes that is
    the GPUs' step (one step's last kernel end to the next's), which a short
    profiled window can show longer than the host's steps (a host running ahead
    of its GPU): the measured step is the host's."""
    recorded = w._step_ms(w.model.recorded_end_ns)
    steps = [s for s in recorded if s in w.base and recorded[s] > 0]
    if not steps:
        return None, None
    errors = [abs(w.base[s] - recorded[s]) / recorded[s] for s in steps]
    return max(errors), sum(recorded[s] for s in steps) / len(steps)


def apply(ctx, findings) -> dict | None:
    """Set each finding's impact to its what-if saving where the replay holds on this
    run (host lanes, or the device graph where kernels cover the steady steps), keeping
    the detector's own estimate as `estimate_ms_per_step`; each finding's
    `impact_source` says which it is. Returns the run's step figures."""
    summary, w = _replay(ctx)
    why = summary.get("why") if summary else "no steady steps to replay"
    if w is not None:
        error, recorded_ms = fidelity(w)
        summary.update(
            replay_step_ms=w.step_ms(),
            recorded_step_ms=recorded_ms,
            replay_lanes="device" if w.device else "host",
            replay_max_step_error_frac=None if error is None else float(error),
            ideal_step_ms=w.ideal_step_ms(),
        )
        summary["impact_from_replay"] = trusted = bool(error is not None and error <= FIDELITY_FRAC)
        if not trusted:
            why = (
                f"the replay gives the recorded steps back only within {error:.0%}"
                if error is not None
                else "no step to check the replay against"
            )
        if w.device:
            summary.update(inferred_waits=w.model.inferred_waits, recorded_waits=w.model.recorded_waits)
    edits = []
    for finding in findings:
        finding.impact_source = f"estimate: {why}"
        if finding.kind in NOT_REPLAYED:
            finding.impact_source = f"estimate: {NOT_REPLAYED[finding.kind]}"
        if w is None or (w.device and finding.kind not in DEVICE_KINDS):
            if w is not None and finding.kind not in NOT_REPLAYED:
                finding.impact_source = "estimate: no device what-if for this kind"
            continue
        w.last_edit = None
        result = _one(w, ctx, finding)
        if result is None:
            continue
        saving, after = result
        finding.metrics.update(
            whatif_step_ms=after, replay_step_ms=summary["replay_step_ms"], whatif_saving_ms_per_step=max(saving, 0.0)
        )
        if summary["impact_from_replay"] and finding.kind not in NOT_REPLAYED:
            finding.metrics.setdefault("estimate_ms_per_step", finding.impact_ms_per_step)
            finding.impact_ms_per_step = max(saving, 0.0)
            finding.impact_source = "replay"
            if w.last_edit is not None:
                edits.append(w.last_edit)
    if summary is not None and ctx.step_ms > 0:
        summary["waterfall"] = _waterfall(ctx, findings, w, edits)
    return summary


def _waterfall(ctx, findings, w, edits) -> dict:
    """The findings' shares of the step with their overlaps counted once: the replayed
    fixes replayed together, the estimates added (step_waterfall.py)."""
    joint = None
    if w is not None and edits:
        together = w.combined(edits)
        if together is not None:
            joint = max(together[0], 0.0) + sum(f.impact_ms_per_step for f in findings if f.impact_source != "replay")
    try:  # MFU where a peak is known (mfu.py); a figure the waterfall can do without
        from diagnose.analysis.tables import mfu

        mfu_frac = mfu.summarize(ctx.run).get("mfu")
    except Exception:  # noqa: BLE001 - no MFU is a waterfall without its bar, not a failed analysis
        mfu_frac = None
    return step_waterfall(findings, ctx.step_ms, joint, mfu_frac)


def _replay(ctx):
    """(the run's step figures so far, the what-if model or None with the reason in figures["why"])."""
    if not ctx.steady:
        return None, None
    if ctx.on_device and ctx.kernel_steady != ctx.steady:
        return {
            "impact_from_replay": False,
            "why": "collectives timed on the device, kernels recorded in too few steps to replay",
        }, None
    w = WhatIf(ctx.run, ctx.steady, ctx.run.rank_stages(), device=ctx.on_device)
    if not w.ok:
        return {
            "measured_step_ms": ctx.step_ms,
            "impact_from_replay": False,
            "why": w.why,
        }, None
    return {"measured_step_ms": ctx.step_ms}, w
