"""The roles of a run's process groups, where its traces name them
(meta.json `process_groups`, from a Kineto trace's `distributedInfo.pg_config`:
diagnose/importers/process_groups.py): a group's description such as
"default_pg" or Megatron's "PIPELINE_MODEL_PARALLEL_GROUP", keyed by the group's
name and by its ranks as the event rows spell them ("0,1,2,3"), so that a
finding about a group can say what it is. "undefined" (torch's default
description) says nothing and is left out."""


def group_roles(rank_meta: dict) -> dict:
    """{group name or ranks string: description}, merged over the ranks' meta."""
    roles = {}
    for meta in rank_meta.values():
        groups = meta.get("process_groups") if isinstance(meta, dict) else None
        if not isinstance(groups, dict):
            continue
        for name, group in groups.items():
            desc = str(group.get("desc") or "")
            if not desc or desc == "undefined":
                continue
            roles.setdefault(str(name), desc)
            ranks = ",".join(map(str, group.get("ranks") or []))
            if ranks and desc not in roles.get(ranks, "").split(" / "):
                roles[ranks] = f"{roles[ranks]} / {desc}" if ranks in roles else desc
    return roles
