"""Scaling across runs of one job at different world sizes or layouts
(`diagnose compare A B [C ...]`): throughput per rank, efficiency against the
smallest run, and which parts of the step grew.

Work per step: the tokens (or samples) the ranks' DataLoaders yielded per steady
step (collectors/instrument/dataloader.py writes each batch's size in the data
event's detail). The ranks of one data-parallel replica load the same batch
(tensor-parallel peers, pipeline stages), so the job's work is one loading rank's
times the replicas: `dp` from the layout in the manifest, else every loading
rank counted as its own replica (plain DDP). Without batch sizes in either run,
every rank is assumed to do the same work per step (weak scaling, what keeping
the micro-batch per rank means): throughput per rank is then 1 / step time, and
the table says "assumed".

Efficiency = throughput per rank over the smallest run's (1 = perfect scaling,
< 1 the extra ranks bought less than their share, < 1 / (world ratio) the job
got slower in total: scaling went negative). What grew: the parts of the step
(breakdown, ms per step, steady-state mean over ranks) that grew most against
the smallest run.
"""

import re

import numpy as np

from diagnose.analysis.tables.breakdown import PART_LABELS, PARTS

_SIZE = re.compile(r"\b(tokens|samples)=(\d+)")
GREW_MIN_MS = 1.0
GREW_TOP = 2


def work_per_step(run) -> dict:
    """{"unit": "tokens" | "samples" | None, "per_step": the job's work per steady step}."""
    events = run.events()
    data = events[(events["kind"] == "data") & events["step"].isin(run.steady_steps())]
    if data.empty:
        return {"unit": None, "per_step": None}
    sizes = data["detail"].astype(str).str.extract(_SIZE)
    data = data.assign(unit=sizes[0], n=sizes[1].astype(float))
    data = data[data["unit"].notna()]
    if data.empty:
        return {"unit": None, "per_step": None}
    unit = "tokens" if (data["unit"] == "tokens").any() else "samples"
    data = data[data["unit"] == unit]
    per_rank = data.groupby(["rank", "step"])["n"].sum().groupby("rank").median()
    dp = (run.manifest or {}).get("layout") or {}
    replicas = dp.get("dp") if isinstance(dp, dict) else None
    per_step = float(per_rank.median() * replicas) if replicas else float(per_rank.sum())
    return {"unit": unit, "per_step": per_step}


def scaling(summaries: list) -> list:
    """One row per run, by world size: world size, layout, step ms, work per step,
    throughput per rank, efficiency vs the smallest run, and what grew."""
    runs = sorted(summaries, key=lambda s: (s["world_size"], s["step_ms"] or 0.0))
    units = {s["work"]["unit"] for s in runs}
    unit = units.pop() if len(units) == 1 and None not in units else None
    base = runs[0]
    rows = []
    for s in runs:
        step_ms = s["step_ms"]
        if unit and step_ms:
            per_rank = s["work"]["per_step"] / (step_ms / 1000) / s["world_size"]
        else:  # equal work per rank assumed: steps per second per rank
            per_rank = 1000 / step_ms if step_ms else None
        rows.append(
            {
                "root": s["root"],
                "name": s["name"],
                "world_size": s["world_size"],
                "layout": s.get("layout") or "-",
                "step_ms": step_ms,
                "work_per_step": s["work"]["per_step"] if unit else None,
                "unit": unit or "steps (equal work per rank assumed)",
                "per_rank_per_s": per_rank,
                "grew": _grew(base, s),
            }
        )
    first = rows[0]["per_rank_per_s"]
    for row in rows:
        row["efficiency"] = row["per_rank_per_s"] / first if first and row["per_rank_per_s"] is not None else None
    return rows


def _grew(base: dict, run: dict) -> list:
    """The parts that grew most from the smallest run, as (part, label, +ms per step)."""
    deltas = [(p, PART_LABELS[p], run["parts"].get(p, 0.0) - base["parts"].get(p, 0.0)) for p in PARTS]
    deltas = [d for d in deltas if d[2] >= GREW_MIN_MS and np.isfinite(d[2])]
    return sorted(deltas, key=lambda d: -d[2])[:GREW_TOP]
