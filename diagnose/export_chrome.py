"""Merged Chrome/Perfetto trace: one process per rank, spans named as recorded.

Lanes (threads) per rank: 0 "main" (steps are drawn on 1 so phases nest
cleanly), 2 "comm in flight" for async collectives from issue to completion,
3 "host syncs". Times are microseconds on rank 0's aligned clock.
"""
import gzip
import json

import numpy as np

LANES = {"step": (1, "steps"), "comm": (2, "comm in flight"), "sync": (3, "host syncs")}
MAIN_LANE = (0, "main")


def chrome_events(run) -> list[dict]:
    events = run.events()
    trace = []
    for rank in run.ranks:
        host = run.rank_meta.get(rank, {}).get("host", "")
        trace.append({"ph": "M", "name": "process_name", "pid": rank,
                      "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, name in [MAIN_LANE, *LANES.values()]:
            trace.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    spans = events[~events["kind"].isin(["wait", "done"])]
    done = events.loc[events["kind"] == "done", ["rank", "group", "seq", "start_ns"]]
    done = done.drop_duplicates(["rank", "group", "seq"]).rename(columns={"start_ns": "done_ns"})
    spans = spans.merge(done, on=["rank", "group", "seq"], how="left")
    kinds, names = spans["kind"].astype(str).to_numpy(), spans["name"].astype(str).to_numpy()
    columns = {c: spans[c].to_numpy() for c in ("rank", "start_ns", "end_ns", "step", "microbatch",
                                                "stage", "group", "seq", "peer", "bytes",
                                                "async_op", "callsite", "detail", "done_ns")}
    for i in range(len(spans)):
        kind = kinds[i]
        start, end = int(columns["start_ns"][i]), int(columns["end_ns"][i])
        args = {"step": int(columns["step"][i])}
        for key in ("microbatch", "stage", "seq", "peer", "bytes"):
            if int(columns[key][i]) >= 0 and (key != "bytes" or columns[key][i]):
                args[key] = int(columns[key][i])
        for key in ("group", "callsite", "detail"):
            if columns[key][i] not in ("", None) and not (isinstance(columns[key][i], float) and np.isnan(columns[key][i])):
                args[key] = str(columns[key][i])
        tid = LANES.get(kind, MAIN_LANE)[0]
        if kind in ("collective", "p2p") and columns["async_op"][i]:
            if not np.isnan(columns["done_ns"][i]):
                end = max(end, int(columns["done_ns"][i]))
            tid = LANES["comm"][0]
        trace.append({"name": names[i], "cat": kind, "ph": "X", "pid": int(columns["rank"][i]),
                      "tid": tid, "ts": start / 1000, "dur": max(end - start, 0) / 1000, "args": args})
    return trace


def write_chrome_trace(run, path: str) -> str:
    payload = {"traceEvents": chrome_events(run), "displayTimeUnit": "ms",
               "otherData": {"wall_t0_ns": run.wall_t0_ns, "tool": "diagnose"}}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(payload, f)
    return path
