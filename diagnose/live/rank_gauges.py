"""What the live monitor knows of each rank right now: the state behind the
Prometheus endpoint (prometheus_metrics.py, read from its server thread) and
the launcher's progress line (<run>/live.json, read by diagnose/run/progress_line.py).

Updated at every tick of the monitor (0.25 s) from the ranks' progress.json
(step time, data wait, steps done, NVML samples), and at every event poll
(every 10 s while steps keep their pace, every 1 s while one departs:
monitor.py) from the event parts (exposed-communication share, arrival lags:
diagnose.live.arrivals)."""

import collections
import json
import os
import statistics
import threading
import time

LIVE_STATE = "live.json"  # in the run directory: the rank the others wait for, for the progress line
LIVE_STATE_EVERY_S = 1.0  # rewritten at most this often, and only when it changed or is 5 s old
# every kind the monitor raises (monitor.py, node_health.py): their counters exist at 0
# from a rank's first report, so that a rise is a rise and rate() has a start
ALERT_KINDS = ("compute", "data_wait", "step_time", "stalled", "heartbeat", "gpu_util", "network")


class RankGauges:
    def __init__(self, run_dir: str, now=time.monotonic, wall_ns=time.time_ns, warn=lambda message: None):
        self.run_dir, self.now, self.wall_ns, self.warn = run_dir, now, wall_ns, warn
        self.off = False
        self.lock = threading.Lock()  # the metrics server reads from its own thread
        self.ranks: dict = {}  # rank -> {name: value} (see update)
        self.alerts = collections.Counter()  # (kind, rank) -> alerts raised
        self.lags_ms: dict = {}  # rank -> arrival lag (diagnose.live.arrivals)
        self.waited_for = None  # (rank, lag ms) or None
        self.written = (None, -1e18)  # (live.json's content, when)

    def update(self, progress: dict, reader=None, where: dict | None = None) -> None:
        """progress: rank -> progress.json; reader: the monitor's ComputeReader (or
        None); where: rank -> (host, GPU index) from node health. Never raises: a
        failure here stops the gauges (one warning), not the monitor's alerts."""
        if self.off:
            return
        try:
            self._update(progress, reader, where or {})
        except Exception as exc:
            self.off = True
            self.warn(
                f"live gauges off (Prometheus metrics, the progress line's waited-for rank): "
                f"{type(exc).__name__}: {exc}"
            )

    def _update(self, progress: dict, reader, where: dict) -> None:
        fresh = {}
        for rank, snap in progress.items():
            if not isinstance(snap, dict):
                continue
            values = {"steps_done": _number(snap.get("steps_done"))}
            recent = snap.get("recent_steps")
            if isinstance(recent, list) and recent and isinstance(recent[-1], list) and len(recent[-1]) >= 3:
                values["step_ms"], values["data_wait_ms"] = _number(recent[-1][1]), _number(recent[-1][2])
            samples = snap.get("samples") if isinstance(snap.get("samples"), dict) else {}
            for name in ("gpu_util_pct", "mem_used_mb"):
                values[name] = _number(samples.get(name))
            values["gpu"] = (where.get(rank) or (None, None))[1]
            fresh[int(rank)] = values
        exposed = dict(getattr(reader, "exposed_comm_frac", None) or {})
        arrivals = getattr(reader, "arrivals", None)
        lags = arrivals.lags_ms() if arrivals is not None else {}
        step_times = [v["step_ms"] for v in fresh.values() if v.get("step_ms") is not None]
        waited_for = (
            arrivals.waited_for(statistics.median(step_times) if step_times else None) if arrivals is not None else None
        )
        with self.lock:
            for rank, values in fresh.items():
                values["exposed_comm_frac"] = exposed.get(rank)
                self.ranks[rank] = values
                for kind in ALERT_KINDS:
                    self.alerts.setdefault((kind, rank), 0)
            self.lags_ms, self.waited_for = lags, waited_for
        self._write_state()

    def alert(self, kind: str, rank: int) -> None:
        with self.lock:
            self.alerts[(str(kind), int(rank))] += 1

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "ranks": {r: dict(v) for r, v in self.ranks.items()},
                "alerts": dict(self.alerts),
                "lags_ms": dict(self.lags_ms),
                "waited_for": self.waited_for,
            }

    def _write_state(self) -> None:
        """<run>/live.json: {wall_ns, waited_for: {rank, lag_ms} or null}, replaced
        whole (a reader never sees half of it)."""
        now = self.now()
        content = (
            None
            if self.waited_for is None
            else {"rank": int(self.waited_for[0]), "lag_ms": round(float(self.waited_for[1]), 1)}
        )
        last, at = self.written
        if now - at < LIVE_STATE_EVERY_S or (content == last and now - at < 5.0):
            return
        self.written = (content, now)
        path = os.path.join(self.run_dir, LIVE_STATE)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"wall_ns": self.wall_ns(), "waited_for": content}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the progress line then names no rank; nothing else reads it


def read_live_state(run_dir: str, max_age_s: float = 30.0, wall_ns=time.time_ns) -> dict | None:
    """live.json if the live monitor wrote it in the last max_age_s (a monitor
    that stopped leaves an old one), else None."""
    try:
        with open(os.path.join(run_dir, LIVE_STATE), encoding="utf-8") as f:
            state = json.load(f)
        return state if (wall_ns() - int(state["wall_ns"])) / 1e9 <= max_age_s else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
