"""While the job runs: stream per-step metrics to its MLflow run and raise alerts.

A `LiveMonitor` is ticked every 0.25 s with `read_progress(run_dir)` snapshots
(each rank's progress.json: recent_steps = [[step, step_ms, data_wait_ms], ...],
events_total, wall_ns). The launcher runs it in a child process (diagnose.live.child)
and never gets an exception from it: a failure becomes one warning line and
that part of the monitor turns off.

Alerts compare each rank with its own recent past (robust: median + k x MAD of
its last steps, with a floor, after warm-up, confirmed on two steps in a row):

- compute: step time minus data wait, exposed communication, pipeline wait and
  host syncs, from the event parts the rank has written (diagnose.analysis.tables.breakdown, as the
  analysis does). In a synchronous job one slow rank makes every rank's step
  slower, but only the slow rank's own compute grows, so this names it. When
  the compute of more than half the ranks departs at the same steps, no rank is
  to blame (the machine or the whole job slowed: another process, clocks,
  thermals): that is one `diagnose: note:` line, not an alert per rank.
- data wait: the time its DataLoader made it wait in the step.
- step time: when nobody's compute explains it (or events cannot be read).
- heartbeat: a rank that stopped recording while the others go on, or whose
  recorder stopped writing progress.json (process frozen or gone): heartbeat.py.
- gpu_util, network: node health (node_health.py; it streams system metrics too).

What it knows of each rank now (rank_gauges.py) is served as Prometheus metrics
with `diagnose run --metrics-port` (prometheus_metrics.py) and names, for the
launcher's progress line, the rank the others wait for (arrivals.py).

An alert is a `diagnose: ALERT rank R: ...` line, a line of `<run>/alerts.jsonl` and an
MLflow tag + metric. Cadence, priority and cost: docs/outputs.md#live-alerts.
"""

import collections
import json
import os
import sys
import time

import numpy as np

from diagnose import rundir
from diagnose.live.baseline import CONFIRM, WINDOW, rank_baselines
from diagnose.live.compute_reader import ComputeReader
from diagnose.live.heartbeat import HeartbeatWatch
from diagnose.live.mlflow_stream import MlflowStreamer
from diagnose.live.node_health import NodeHealth
from diagnose.live.rank_gauges import RankGauges

WARMUP_STEPS = 2  # the first steps of a job are always slow
MAX_EVENT_RANKS = 64  # above this, alerts use progress.json only
EVENT_POLL_S = 2.0  # a poll costs ~20 ms of CPU (pandas), almost all fixed per call...
QUIET_POLL_S = 10.0  # ...so while nothing departs, polls are rarer (see _poll_interval_s),
DEPARTING_POLL_S = 1.0  # and while a step departs, more frequent: the first alert within 3 s
# A step WATCH_RATIO x its rank's median polls at DEPARTING_POLL_S for WATCH_S: a rank
# whose compute doubled raised the step ~2x, under the step alert's limit (median + 5 x
# 25%), and waited for a quiet poll: 5 s on average (bench/live_alert_latency.py). At
# 1.2x, 4-25% of a noisy 2-core job's steps polled fast; at 1.5x, 0-7%.
WATCH_RATIO, WATCH_S = 1.5, 3.0
UNITS = {"gpu_util": "pct", "network": "mb_per_s"}  # an alert's values; ms for the others


class LiveMonitor:
    def __init__(
        self,
        run_dir: str,
        manifest: dict | None = None,
        stream=None,
        track: bool | None = None,
        read_events: bool = True,
        now=time.monotonic,
        wall_ns=time.time_ns,
    ):
        self.run_dir = run_dir
        self.stream = stream or sys.stderr
        self.now, self.wall_ns = now, wall_ns
        self.warned: set = set()
        self.disabled = False
        self.alerts: list = []
        self.baselines: dict = collections.defaultdict(rank_baselines)
        self.last_step: dict = {}  # rank -> last step seen in progress
        self.step_ms: dict = collections.defaultdict(dict)  # step -> rank -> (step_ms, dw)
        self.logged_step = -1
        self.compute_ok: set = set()  # ranks whose compute we can follow
        self.compute_alert_step = -(10**9)  # last step a compute alert fired
        self.compute_over: dict = collections.defaultdict(set)  # step -> ranks whose compute departed
        self.pending_compute_alerts: dict = {}  # rank -> (step, value, median, limit, step_ms, t, polls)
        self.jobwide_noted_step = -(10**9)  # last step of a job-wide slowdown noted
        self.pending_step_alerts: dict = {}  # rank -> (step, value, median, limit, t, event polls)
        self.reader = ComputeReader(run_dir, warn=self._warn) if read_events else None
        self.gauges = RankGauges(run_dir, now=now, wall_ns=wall_ns, warn=self._warn)
        self.heartbeats = HeartbeatWatch(run_dir, self.baselines, self.last_step, self._alert, wall_ns)
        self.last_event_poll = 0.0
        self.watch_until = 0.0  # poll at DEPARTING_POLL_S until then (a step WATCH_RATIO x its median)
        self.event_polls = 0
        self.streamer = None
        self.manifest = manifest
        if track is None:
            from diagnose.exporters.mlflow_store import enabled

            track = enabled()
        self.track = track  # the MLflow run is created at the first tick, before the first step
        self.health = NodeHealth(
            run_dir,
            lambda key, value, step: self.streamer is not None and self.streamer.metric(key, value, step),
            self._alert,
            now=now,
            warn=self._warn,
        )

    # -- plumbing --------------------------------------------------------------
    def _warn(self, message: str) -> None:
        key = message.split(":", 1)[0]
        if key in self.warned:
            return
        self.warned.add(key)
        self._say(f"diagnose: warning: {message}")

    def _say(self, line: str) -> None:
        """One line on the launcher's terminal; a closed stream must not stop the monitor."""
        try:
            self.stream.write(f"\r{line}\n")
            self.stream.flush()
        except Exception:
            pass

    def tick(self, progress: dict) -> None:
        if self.track and not self.disabled:
            # at once, while the ranks still import torch: creating a store costs
            # seconds of CPU, which taken during the first steps slowed every rank
            # while their baselines formed (and starved this process's polls)
            self._start_streamer()
        if self.disabled or not progress:
            return
        try:
            self._tick(progress)
        except Exception as exc:
            self.disabled = True
            self._warn(f"live monitor stopped: {type(exc).__name__}: {exc}")

    def close(self, exit_status=None) -> None:
        try:
            if not self.disabled:
                from diagnose.rundir.progress import read_progress

                self._tick(read_progress(self.run_dir), final=True)
        except Exception as exc:
            self._warn(f"live monitor stopped: {type(exc).__name__}: {exc}")
        try:
            if self.streamer is not None:
                self.streamer.close(exit_status)
        except Exception as exc:
            self._warn(f"live MLflow tracking stopped: {type(exc).__name__}: {exc}")

    # -- per tick --------------------------------------------------------------
    def _start_streamer(self) -> None:
        self.track = False
        try:
            self.streamer = MlflowStreamer(
                self.run_dir, self.manifest or rundir.read_manifest(self.run_dir), self._warn
            )
        except Exception as exc:
            self._warn(f"live MLflow tracking off: {type(exc).__name__}: {exc}")

    def _tick(self, progress: dict, final: bool = False) -> None:
        now = self.now()
        for rank, snap in sorted(progress.items()):
            for entry in snap.get("recent_steps") or []:
                try:
                    step, step_ms, data_wait_ms = int(entry[0]), float(entry[1]), float(entry[2])
                except (TypeError, ValueError, IndexError):
                    continue
                if step <= self.last_step.get(rank, -1):
                    continue
                self.last_step[rank] = step
                self._new_step(rank, step, step_ms, data_wait_ms, now)
        if (
            self.reader is not None
            and len(progress) <= MAX_EVENT_RANKS
            and (final or now - self.last_event_poll >= self._poll_interval_s(now))
        ):
            self.last_event_poll = now
            self.event_polls += 1
            for rank, rows in self.reader.poll(sorted(progress)).items():
                self.compute_ok.add(rank)
                for step, compute_ms, step_ms in rows:
                    self._new_compute(rank, step, compute_ms, step_ms)
        self._resolve_compute_alerts(now, final)
        self._resolve_step_alerts(now, len(progress), final)
        self._stream_steps(len(progress), final)
        if not final:
            self.heartbeats.tick(progress, now)
            self.health.tick(progress)
            self.gauges.update(progress, self.reader, self.health.where)

    def _poll_interval_s(self, now: float) -> float:
        """Compute is what names a slow rank, and it is needed quickly only once a
        step time departs (in a synchronous job a slow rank slows every step): the
        quiet polls just feed the compute baselines, which lose no step by waiting.
        Half of this process's CPU was the 2 s polls (py-spy, ddp_mlp)."""
        if (
            self.pending_step_alerts
            or self.pending_compute_alerts
            or now < self.watch_until
            or any(b["step"].streak or b["compute"].streak for b in self.baselines.values())
        ):
            return DEPARTING_POLL_S  # (bench/live_alert_latency.py: 2 s polls gave up to 3.5 s)
        return EVENT_POLL_S if not self.compute_ok else QUIET_POLL_S

    def _new_step(self, rank, step, step_ms, data_wait_ms, now) -> None:
        self.step_ms[step][rank] = (step_ms, data_wait_ms)
        if step < WARMUP_STEPS:
            return
        base = self.baselines[rank]
        hit = base["data_wait"].update(data_wait_ms)
        if hit and data_wait_ms >= 0.1 * step_ms:
            _, median, limit = hit
            self._alert(
                rank,
                "data_wait",
                step,
                data_wait_ms,
                median,
                limit,
                f"data wait {data_wait_ms:.0f} ms in step {step} "
                f"({data_wait_ms / step_ms:.0%} of it; its usual {median:.0f} ms, "
                f"alert above {limit:.0f} ms): its input pipeline stalls",
            )
        hit = base["step"].update(step_ms)
        if base["step"].median and step_ms > WATCH_RATIO * base["step"].median:
            self.watch_until = now + WATCH_S
        if hit:
            _, median, limit = hit
            self.pending_step_alerts[rank] = (step, step_ms, median, limit, now, self.event_polls)

    def _new_compute(self, rank, step, compute_ms, step_ms) -> None:
        if step < WARMUP_STEPS:
            return
        base = self.baselines[rank]["compute"]
        hit = base.update(compute_ms)
        if base.streak > 0:
            self.compute_over[step].add(rank)
        if hit:
            _, median, limit = hit
            self.pending_compute_alerts[rank] = (step, compute_ms, median, limit, step_ms, self.now(), self.event_polls)

    def _resolve_compute_alerts(self, now, final) -> None:
        """A confirmed compute departure names its rank once the other ranks'
        compute of that step is known (or two polls later): if more than half the
        ranks departed in the same steps, the job or the machine slowed, not a rank."""
        for rank, (step, compute_ms, median, limit, step_ms, seen_at, polls_at) in list(
            self.pending_compute_alerts.items()
        ):
            known = all(self.reader.done_step.get(r, -1) >= step for r in self.compute_ok)
            waited = now - seen_at > 2 * EVENT_POLL_S + 1.0 and self.event_polls - polls_at >= 2
            if not (known or final or waited):
                continue
            del self.pending_compute_alerts[rank]
            self.compute_alert_step = max(self.compute_alert_step, step)
            together = {rank}.union(*(self.compute_over.get(s, ()) for s in range(step - CONFIRM + 1, step + 1)))
            for old in [s for s in self.compute_over if s < step - WINDOW]:
                del self.compute_over[old]
            if len(self.compute_ok) >= 2 and len(together) > len(self.compute_ok) / 2:
                for r in together:  # re-armed: a rank that stays slow once the others recover is named
                    self.baselines[r]["compute"].active = False
                    self.baselines[r]["compute"].streak = 0
                if step > self.jobwide_noted_step + CONFIRM:
                    self._say(
                        f"diagnose: note: ranks {','.join(map(str, sorted(together)))} of "
                        f"{len(self.compute_ok)} slowed down together in step {step} (rank {rank}'s own "
                        f"compute {compute_ms:.0f} ms, usually {median:.0f} ms): the machine or the whole "
                        "job slowed, not one rank"
                    )
                self.jobwide_noted_step = step
                continue
            self._alert(
                rank,
                "compute",
                step,
                compute_ms,
                median,
                limit,
                f"slowed down: its own compute (step minus waiting) took "
                f"{compute_ms:.0f} ms in step {step}, usually {median:.0f} ms (alert above "
                f"{limit:.0f} ms); step time {step_ms:.0f} ms. The other ranks wait for it",
            )

    def _resolve_step_alerts(self, now, n_ranks, final) -> None:
        """A step-time departure is reported only when no rank's compute explains it:
        wait until compute is known up to the next step (a compute departure is
        confirmed a step later, too), or long enough for that to have happened: two
        event polls, the parts' 0.8 s flush, and the next steps (the reader holds
        the newest step back one step), with a margin."""
        # events are read for this job: a rank whose compute is not followed yet (no
        # part of it read: the first polls, a starved monitor) is waited for too
        reading = self.reader is not None and n_ranks <= MAX_EVENT_RANKS
        for rank, (step, step_ms, median, limit, seen_at, polls_at) in list(self.pending_step_alerts.items()):
            followed = rank in self.compute_ok
            known = (
                all(self.reader.done_step.get(r, -1) >= step + 1 for r in self.compute_ok) if followed else not reading
            )
            patience_s = 2 * EVENT_POLL_S + 1.0 + 4 * step_ms / 1000
            # and two polls at least: a starved monitor must not outwait its own reader
            waited = now - seen_at > patience_s and (not reading or self.event_polls - polls_at >= 2)
            if not (known or final or waited):
                continue
            del self.pending_step_alerts[rank]
            departing = any(b["compute"].streak > 0 or b["compute"].active for b in self.baselines.values())
            if self.compute_ok and (departing or self.compute_alert_step >= step - CONFIRM - 1):
                continue  # explained: a straggler's compute alert names the cause
            cause = (
                " while no rank's own compute grew: time goes to communication, data or the host" if followed else ""
            )
            self._alert(
                rank,
                "step_time",
                step,
                step_ms,
                median,
                limit,
                f"step {step} took {step_ms:.0f} ms, usually {median:.0f} ms (alert above {limit:.0f} ms){cause}",
            )

    def _stream_steps(self, n_ranks, final) -> None:
        """Per-step metrics across ranks, once every rank reported the step (or a
        later step is complete, or the job ended)."""
        if self.streamer is None or not self.step_ms:
            return
        complete = [s for s, ranks in self.step_ms.items() if len(ranks) >= n_ranks]
        newest_complete = max(complete, default=-1)
        for step in sorted(self.step_ms):
            ranks = self.step_ms[step]
            if not (len(ranks) >= n_ranks or step < newest_complete or final):
                break
            del self.step_ms[step]
            if step <= self.logged_step:
                continue
            self.logged_step = step
            times = np.array([v[0] for v in ranks.values()])
            waits = np.array([v[1] for v in ranks.values()])
            self.streamer.metric("live/step_time_p50_ms", float(np.median(times)), step)
            self.streamer.metric("live/step_time_max_ms", float(times.max()), step)
            self.streamer.metric(
                "live/data_wait_frac", float(waits.sum() / times.sum()) if times.sum() > 0 else 0.0, step
            )
            self.streamer.metric("live/ranks_reporting", float(len(ranks)), step)
            self.health.job_step(step, float(np.median(times)))

    # -- alerts ----------------------------------------------------------------
    def _alert(self, rank, kind, step, value, median, limit, text) -> None:
        unit = UNITS.get(kind, "ms")
        record = {
            "wall_ns": self.wall_ns(),
            "rank": int(rank),
            "kind": kind,
            "step": int(step),
            f"value_{unit}": round(float(value), 3),
            f"median_{unit}": round(float(median), 3),
            f"threshold_{unit}": round(float(limit), 3),
            "message": f"rank {rank} {text}",
        }
        self.alerts.append(record)
        self.gauges.alert(kind, rank)
        self._say(f"diagnose: ALERT rank {rank}: {text}")
        try:
            with open(os.path.join(self.run_dir, rundir.ALERTS), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            self._warn(f"alerts not recorded: {exc}")
        if self.streamer is not None:
            n = len(self.alerts)
            self.streamer.tag("alerts.count", str(n))
            self.streamer.tag(f"alert.{n}", record["message"])
            self.streamer.metric("live/alerts", float(n), max(step, 0))
            self.streamer.metric("live/alert_rank", float(rank), max(step, 0))
