"""The host and GPU that keep being the culprit, across the runs of one MLflow
experiment (issue 47, item 5).

A finding that blames ranks (a straggler, a hang's culprits, a failed rank:
the kinds with `culprits` in diagnose/analysis/detectors/finding_kinds.py) blames
machines: each blamed rank's host and, where NVML named it, its GPU (index,
UUID and serial in meta.json env.gpu: collectors/instrument/
rank_environment.py). Each MLflow run keeps them as a tag, `culprit.<kind>`
("host|GPU-uuid" keys, ";"-separated), and when a run is logged the last
LAST_RUNS runs of the experiment (this one included, newest first by start
time) are asked: a machine that was the culprit of the same kind in at least
REPEAT_MIN of them is named, "host-3 GPU 5 (GPU-8f6c...) was the straggler in
3 of the last 5 runs", in the run's tags (`repeat_offender.<kind>`) and its
Description. Why 3: on a cluster of N machines a culprit drawn at random
repeats three times in a row with odds 1/N^2 (under 2% from 8 machines), twice
with 1/N; a real bad machine keeps coming back.
"""

from diagnose.analysis.detectors import finding_kinds

LAST_RUNS = 5
REPEAT_MIN = 3
TAG = "culprit."
LINE_TAG = "repeat_offender."


def machine(meta: dict) -> tuple[str, str] | None:
    """(key, how to say it) of a rank's host and GPU, or None when the host is unknown."""
    host = meta.get("host") if isinstance(meta, dict) else None
    if not host:
        return None
    gpu = ((meta.get("env") or {}).get("gpu") or {}) if isinstance(meta.get("env"), dict) else {}
    uuid, index = gpu.get("uuid"), gpu.get("index")
    if not uuid:
        return str(host), str(host)
    where = f"{host} GPU {index}" if index is not None else f"{host} GPU"
    return f"{host}|{uuid}", f"{where} ({uuid}" + (f", serial {gpu['serial']}" if gpu.get("serial") else "") + ")"


def culprit_tags(rank_meta: dict, findings: list) -> tuple[dict, dict]:
    """({culprit.<kind>: keys}, {key: how to say it}) for this run's blamed ranks."""
    tags, said = {}, {}
    for f in findings:
        kind = f.get("kind")
        entry = finding_kinds.of(kind)
        if not (entry and entry.culprits) or f.get("severity") == "info" or not f.get("ranks"):
            continue
        keys = set(tags.get(TAG + kind, "").split(";")) - {""}
        for rank in f["ranks"]:
            found = machine(rank_meta.get(int(rank), {}))
            if found:
                keys.add(found[0])
                said[found[0]] = found[1]
        if keys:
            tags[TAG + kind] = ";".join(sorted(keys))
    return tags, said


def repeat_lines(client, experiment_id: str, tags: dict, said: dict) -> dict:
    """{repeat_offender.<kind>: line} for the machines blamed in at least REPEAT_MIN
    of the experiment's last LAST_RUNS runs (this run, already tagged, among them)."""
    if not tags:
        return {}
    runs = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"], max_results=LAST_RUNS)
    lines = {}
    for tag, keys in tags.items():
        kind = tag[len(TAG) :]
        for key in keys.split(";"):
            count = sum(1 for r in runs if key in r.data.tags.get(tag, "").split(";"))
            if count >= REPEAT_MIN:
                line = (
                    f"{said.get(key, key)} was the {kind.replace('_', ' ')} culprit in {count} of the "
                    f"last {len(runs)} runs"
                    if kind != "straggler"
                    else f"{said.get(key, key)} was the straggler in {count} of the last {len(runs)} runs"
                )
                lines[LINE_TAG + kind] = "; ".join(filter(None, [lines.get(LINE_TAG + kind), line]))
    return lines
