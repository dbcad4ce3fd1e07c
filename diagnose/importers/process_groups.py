"""A trace's process groups, as its profiler recorded them: Kineto's
`distributedInfo.pg_config` (PyTorch >= 2.3), one entry per group the rank
created, with its name (the `pg_name` collectives carry as "Process Group
Name"), its description (`pg_desc`: "default_pg", a framework's role such as
Megatron's "PIPELINE_MODEL_PARALLEL_GROUP", or "undefined"), its global ranks and
backend. Stored in the rank's meta.json as `process_groups`
({name: {"desc", "ranks", "backend"}}) so that findings can name a group's role.
Data, not code: ranks given as a string are read as JSON; anything else malformed
leaves that group out."""

import json


def process_groups(pg_config) -> dict:
    """{name: {"desc": str, "ranks": [int], "backend": str}} from a pg_config list
    (or the older dict keyed by name); {} when absent or unreadable."""
    if isinstance(pg_config, dict):
        entries = [dict(v, pg_name=k) for k, v in pg_config.items() if isinstance(v, dict)]
    elif isinstance(pg_config, list):
        entries = [e for e in pg_config if isinstance(e, dict)]
    else:
        return {}
    groups = {}
    for entry in entries:
        name, ranks = entry.get("pg_name"), entry.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                continue
        if name is None or not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            continue
        groups[str(name)] = {
            "desc": str(entry.get("pg_desc") or ""),
            "ranks": ranks,
            "backend": str(entry.get("backend_config") or ""),
        }
    return groups
