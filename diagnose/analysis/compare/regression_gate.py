"""A CI regression gate: did the candidate run get slower, or bring a cause back,
beyond what the baseline's own noise explains? (`diagnose compare BASELINE
CANDIDATE --fail-on ...`, docs/outputs.md.)

Checks, each one verdict line with its statistic:

    step-time     the candidate's mean steady step over the baseline's (each
                  step: the median over ranks). A 95% interval from a moving-
                  block bootstrap of both runs' step series: step times are
                  autocorrelated (a slow phase, a noisy neighbour last several
                  steps), so steps are resampled in blocks of ceil(n^(1/3)),
                  which keeps that correlation inside a block. A regression when
                  the interval's lower end is above 1 and the estimate is at
                  least MIN_EFFECT (3%: the share of a step a finding needs to be
                  a warning; a smaller change is not worth a red build).
    new-critical  a critical finding of the candidate that the baseline did not
                  have as critical (matched by kind, ranks, stage, callsite).
    impact        for each part of the step that the candidate's findings above
                  info live in (each kind's `parts` in finding_kinds.py:
                  input_stall: data wait; hidden_sync: host sync and exposed
                  communication; pipeline findings: pipeline wait; the others:
                  exposed communication), the candidate's mean ms
                  per step minus the
                  baseline's; one-sided bootstrap p-values (the share of
                  resampled differences at or below 0), Holm-corrected across the
                  parts tested, a regression when p <= ALPHA after correction and
                  the growth is at least MIN_EFFECT of the baseline's step.

The bootstrap is seeded (SEED): the same runs give the same verdict.
"""

import math

import numpy as np

from diagnose.analysis.detectors import finding_kinds

ALPHA = 0.05
MIN_EFFECT = 0.03
RESAMPLES = 2000
SEED = 0
CHECKS = ("step-time", "new-critical", "impact")


def parse_fail_on(text: str) -> list[str]:
    """ "regression" (every check) or a comma list of CHECKS; ValueError otherwise."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["regression"]:
        return list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if not names or unknown:
        raise ValueError(f"--fail-on takes regression or a list of {', '.join(CHECKS)}; not {text!r}")
    return names


def _block_means(series: np.ndarray, rng, resamples: int) -> np.ndarray:
    """Means of moving-block bootstrap resamples of `series`."""
    n = len(series)
    block = max(1, math.ceil(n ** (1 / 3)))
    starts = rng.integers(0, n - block + 1, size=(resamples, math.ceil(n / block)))
    index = (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]
    return series[index].mean(axis=1)


def step_time(a: np.ndarray, b: np.ndarray, rng) -> dict:
    ratio = _block_means(b, rng, RESAMPLES) / _block_means(a, rng, RESAMPLES)
    low, high = np.percentile(ratio, [2.5, 97.5])
    estimate = float(b.mean() / a.mean())
    worse = low > 1.0 and estimate >= 1.0 + MIN_EFFECT
    why = (
        "beyond noise"
        if worse
        else "below the minimum effect"
        if low > 1.0
        else "faster beyond noise"
        if high < 1.0
        else "within noise"
    )
    return {
        "check": "step-time",
        "regression": bool(worse),
        "line": (
            f"step-time {estimate - 1:+.1%} (95% CI {low - 1:+.1%} to {high - 1:+.1%}, "
            f"block bootstrap, {len(a)} vs {len(b)} steps): {why}"
        ),
        "ratio": estimate,
        "ci": [float(low), float(high)],
    }


def new_critical(findings_a: list, findings_b: list, key) -> list[dict]:
    before = {key(f) for f in findings_a if f.get("severity") == "critical"}
    return [
        {
            "check": "new-critical",
            "regression": True,
            "line": f"new-critical {f['kind']} (ranks {','.join(map(str, f.get('ranks') or [])) or '-'}): "
            f"{f.get('title', '')}",
        }
        for f in findings_b
        if f.get("severity") == "critical" and key(f) not in before
    ]


def impact(parts_a: dict, parts_b: dict, findings_b: list, base_step_ms: float, rng) -> list[dict]:
    parts = sorted(
        {
            p
            for f in findings_b
            if f.get("severity") in ("warning", "critical")
            for p in finding_kinds.parts_of(f.get("kind"))
        }
        & set(parts_a)
        & set(parts_b)
    )
    tests = []
    for part in parts:
        a, b = np.asarray(parts_a[part], float), np.asarray(parts_b[part], float)
        if len(a) < 2 or len(b) < 2:
            continue
        diffs = _block_means(b, rng, RESAMPLES) - _block_means(a, rng, RESAMPLES)
        tests.append((part, float(b.mean() - a.mean()), float((np.sum(diffs <= 0) + 1) / (RESAMPLES + 1))))
    verdicts, m = [], len(tests)
    running = 0.0
    for i, (part, grew_ms, p) in enumerate(sorted(tests, key=lambda t: t[2])):  # Holm, step-down
        running = max(running, min(1.0, (m - i) * p))
        worse = running <= ALPHA and grew_ms >= MIN_EFFECT * base_step_ms
        verdicts.append(
            {
                "check": "impact",
                "regression": bool(worse),
                "part": part,
                "line": (
                    f"impact {part} {grew_ms:+.1f} ms/step (Holm p={running:.3g} over {m} "
                    f"part{'s' if m > 1 else ''}): "
                    + ("beyond noise" if worse else "within noise or below the minimum effect")
                ),
            }
        )
    return verdicts


def gate(a: dict, b: dict, checks: list, key) -> list[dict]:
    """Verdicts of `checks` for baseline summary `a` and candidate `b`
    (diagnose.analysis.compare.run_compare.summarize: steady_step_ms, steady_parts)."""
    rng = np.random.default_rng(SEED)
    out = []
    series_a, series_b = (
        np.asarray(a.get("steady_step_ms") or [], float),
        np.asarray(b.get("steady_step_ms") or [], float),
    )
    if "step-time" in checks:
        if len(series_a) >= 2 and len(series_b) >= 2:
            out.append(step_time(series_a, series_b, rng))
        else:
            out.append(
                {
                    "check": "step-time",
                    "regression": False,
                    "line": "step-time: not judged (fewer than 2 steady steps in a run)",
                }
            )
    if "new-critical" in checks:
        found = new_critical(a["findings"], b["findings"], key)
        out.extend(found or [{"check": "new-critical", "regression": False, "line": "new-critical: none"}])
    if "impact" in checks and len(series_a):
        out.extend(
            impact(a.get("steady_parts") or {}, b.get("steady_parts") or {}, b["findings"], float(series_a.mean()), rng)
        )
    return out
