"""Issue 27: `diagnose compare` across world sizes: the reference trainer at dp=2 and
dp=4 (the same micro-batches per rank: weak scaling), each under `diagnose run`.
The scaling table's work per step is the trainer's own tokens per step, its
efficiency is what the trainer's own step times give, and "what grew" names the
part of the step that grew most (on 2 cores, 4 ranks share what 2 had)."""

import json
import statistics

from reference_trainer.scenarios import WARMUP_STEPS
from tests.support.jobs import load_run, run_diagnose, torchrun

MODEL = [
    "--d-model",
    "64",
    "--heads",
    "4",
    "--seq-len",
    "64",
    "--micro-batch-size",
    "2",
    "--layers",
    "4",
    "--microbatches",
    "4",
    "--steps",
    "14",
    "--seed",
    "0",
]


def _trainer_throughput(log, steps) -> tuple[float, float]:
    """(tokens per step, tokens/s) from the trainer's own log over the steps the
    analysis takes as steady: its tokens over the time they took, from the end of
    the step before the first (`end_unix_s`) to the end of the last. Per-step medians
    do not do: the trainer's step starts at its data loading and ends after the
    loss's all-reduce, the analysis's at the optimizer's end, and on a loaded box
    the work between the two moves between steps (dp4 beside another test's job:
    step 7 57 ms by one, 94 by the other; the medians' efficiencies 0.60 and 0.72,
    the totals' 1,403 and 1,422 ms)."""
    rows = {r["step"]: r for r in map(json.loads, log.read_text().splitlines())}
    timed = sorted(s for s in steps if s in rows)
    assert len(timed) >= 14 - WARMUP_STEPS - 2 and timed == list(range(timed[0], timed[-1] + 1)), sorted(rows)
    per_step = statistics.median(rows[s]["tokens_per_s"] * rows[s]["step_time_s"] for s in timed)
    return per_step, per_step * len(timed) / (rows[timed[-1]]["end_unix_s"] - rows[timed[0] - 1]["end_unix_s"])


def test_scaling_table_from_dp2_to_dp4(tmp_path):
    runs, measured = {}, {}
    for dp in (2, 4):
        out, log = tmp_path / f"dp{dp}", tmp_path / f"dp{dp}.jsonl"
        run_diagnose(
            [
                "run",
                "--out",
                out,
                "--",
                *torchrun(dp, "-m", "reference_trainer", "--dp", dp, *MODEL, "--log-jsonl", log),
            ],
            timeout=600,
        )
        runs[dp], measured[dp] = out, _trainer_throughput(log, set(load_run(out).steady_steps()))
    result = json.loads(run_diagnose(["compare", runs[2], runs[4], "--json"]).stdout)
    small, large = result["scaling"]
    assert (small["world_size"], large["world_size"]) == (2, 4) and small["unit"] == "tokens"
    assert (small["layout"], large["layout"]) == ("dp2", "dp4")
    # the job's tokens per step, read from the DataLoaders' batches: the trainer's own count
    assert small["work_per_step"] == round(measured[2][0]) and large["work_per_step"] == round(measured[4][0])
    # efficiency: tokens/s per rank against dp2's, as the trainer's own step times give it
    expected = (measured[4][1] / 4) / (measured[2][1] / 2)
    assert small["efficiency"] == 1.0
    assert abs(large["efficiency"] - expected) <= 0.15 * expected, (large, expected)
    # what grew: the part whose ms per step grew most between the two runs' breakdowns
    parts = {p["part"]: p["delta_ms"] for p in result["parts"]}
    top = max(parts, key=parts.get)
    assert large["grew"] and large["grew"][0][0] == top and large["grew"][0][2] == parts[top] > 0, (
        large["grew"],
        parts,
    )
    text = run_diagnose(["compare", runs[2], runs[4]]).stdout
    assert "Scaling against the smallest run (tokens)" in text and f"{large['efficiency']:.2f}" in text
