"""Where the step goes, as shares that add up to 1 (issue 48):

    1 = MFU + sum over findings of share_i + rest

- MFU: the model FLOPs' share of the step at the GPU's peak (diagnose/analysis/tables/mfu.py),
  where known; without a peak (CPU, an unknown GPU, an imported trace) it is left
  out and sits in the rest;
- share_i: finding i's impact as a fraction of the measured step. Two findings
  can claim the same time (a straggler and the stage it slows; the bubble and a
  slow stage): the fixes whose impact is the replay's are replayed together
  (WhatIf.combined), the estimates added on top, and when the findings' impacts
  sum to more than that joint saving each share is scaled down by the same
  factor, so overlaps are counted once;
- rest: what no finding explains, >= 0. If MFU and the shares still exceed 1
  (an estimate that overstates), the shares are scaled down to make room.
"""

REST_LABEL = "not explained by any finding"


def step_waterfall(findings, step_ms: float, joint_saving_ms: float | None, mfu_frac: float | None) -> dict:
    """{"step_ms", "mfu_frac", "shares": [{kind, ranks, stage, impact_ms, share_frac}],
    "rest_frac", "rest_label", "overlap_scale"}. `findings`: objects or dicts with
    kind, impact_ms_per_step, ranks, stage; `joint_saving_ms`: every finding's fix
    at once (None: assume no overlap)."""
    items = [_fields(f) for f in findings]
    items = [f for f in items if f["impact_ms"] > 0]
    total_ms = sum(f["impact_ms"] for f in items)
    if step_ms <= 0:
        return {
            "step_ms": step_ms,
            "mfu_frac": mfu_frac,
            "shares": [],
            "rest_frac": None,
            "rest_label": REST_LABEL,
            "overlap_scale": None,
        }
    scale = 1.0
    if joint_saving_ms is not None and total_ms > 0 and joint_saving_ms < total_ms:
        scale = max(joint_saving_ms, 0.0) / total_ms
    mfu = min(max(mfu_frac or 0.0, 0.0), 1.0)
    room = 1.0 - mfu
    explained = total_ms * scale / step_ms
    if explained > room:
        scale *= room / explained if explained > 0 else 0.0
    shares = [dict(f, share_frac=f["impact_ms"] * scale / step_ms) for f in items]
    rest = max(1.0 - mfu - sum(s["share_frac"] for s in shares), 0.0)
    return {
        "step_ms": step_ms,
        "mfu_frac": mfu_frac,
        "shares": shares,
        "rest_frac": rest,
        "rest_label": REST_LABEL,
        "overlap_scale": scale,
    }


def _fields(finding) -> dict:
    get = finding.get if isinstance(finding, dict) else lambda key: getattr(finding, key)
    return {
        "kind": get("kind"),
        "ranks": [int(r) for r in (get("ranks") or [])],
        "stage": get("stage"),
        "impact_ms": float(get("impact_ms_per_step") or 0.0),
    }
