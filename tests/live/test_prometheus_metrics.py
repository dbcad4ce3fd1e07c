"""Issue 48 item 5: live Prometheus metrics from the live monitor's child, and the
rank the others wait for (arrival lag at collectives). In-process: the
collector, its HTTP endpoint, the arrival lags and the CLI's checks. The scrape
during a live 2-rank job is in test_live.py (test_node_health_reaches_mlflow_while_the_job_runs)."""

import io
import json
import socket
import sys
import urllib.request

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnose.live.arrivals import ArrivalLags
from diagnose.live.monitor import LiveMonitor
from diagnose.live.prometheus_metrics import METRICS, METRICS_PORT_FILE, serve
from diagnose.live.rank_gauges import LIVE_STATE, RankGauges, read_live_state


def collectives(arrivals, group="0", group_ranks="0,1,2,3", detail=""):
    """Event rows of collectives: arrivals = [(rank, seq, step, issue ms)]."""
    return pd.DataFrame(
        {
            "rank": [a[0] for a in arrivals],
            "kind": "collective",
            "group": group,
            "group_ranks": group_ranks,
            "seq": [a[1] for a in arrivals],
            "step": [a[2] for a in arrivals],
            "start_ns": [int(a[3] * 1e6) for a in arrivals],
            "detail": detail,
        }
    )


def job(late_rank=None, late_ms=0.0, steps=12, ranks=(0, 1, 2, 3)):
    """Two collectives a step, 100 ms apart; each rank a little later than the
    one before (scheduling), late_rank late_ms later still at the first of them."""
    rows = []
    for step in range(steps):
        for k in range(2):
            for rank in ranks:
                extra = late_ms if rank == late_rank and k == 0 else 0.0
                rows.append((rank, 2 * step + k, step, step * 100.0 + k * 50.0 + 0.3 * rank + extra))
    return collectives(rows)


def test_arrival_lag_names_the_rank_the_others_wait_for_not_the_lowest_index():
    lags = ArrivalLags()
    frame = job(late_rank=2, late_ms=30.0)
    lags.add(frame.iloc[:49], [0, 1, 2, 3])  # two polls, an instance across them
    lags.add(frame.iloc[49:], [0, 1, 2, 3])
    by_rank = lags.lags_ms()
    assert by_rank[2] == pytest.approx(30.0 + 2 * 0.6) and by_rank[0] == 0.0
    assert lags.waited_for(step_ms=100.0) == (2, by_rank[2])
    # no rank late by 10% of the step: nobody is named (scheduling skew is not a straggler)
    balanced = ArrivalLags()
    balanced.add(job(), [0, 1, 2, 3])
    assert balanced.waited_for(step_ms=100.0) is None


def test_arrival_lag_matches_only_this_nodes_members_and_prefers_device_rows():
    lags = ArrivalLags()
    # ranks 2-3 are on another node: each instance closes on ranks 0 and 1
    lags.add(job(late_rank=1, late_ms=20.0, ranks=(0, 1)), [0, 1])
    assert lags.waited_for(step_ms=100.0)[0] == 1 and not lags.open
    # a group of one member here is skipped; a device row replaces its host twin
    host_late = collectives(
        [(0, 0, 0, 0.0), (1, 0, 0, 40.0), (0, 1, 1, 100.0), (1, 1, 1, 140.0), (0, 2, 2, 200.0), (1, 2, 2, 240.0)],
        group="7",
        group_ranks="0,1",
    )
    device = host_late.assign(detail="gpu", start_ns=host_late["start_ns"] - (host_late["rank"] * 40e6).astype(int))
    solo = collectives([(0, 0, 0, 5.0)], group="9", group_ranks="0,8")
    fresh = ArrivalLags()
    fresh.add(pd.concat([host_late, device, solo], ignore_index=True), [0, 1])
    assert fresh.lags_ms() == {0: 0.0, 1: 0.0} and not fresh.open


def test_collector_serves_every_documented_metric_and_alert_counters_rise(tmp_path):
    gauges = RankGauges(str(tmp_path))
    reader = type("Reader", (), {"arrivals": ArrivalLags(), "exposed_comm_frac": {0: 0.4, 1: 0.05}})()
    reader.arrivals.add(job(late_rank=1, late_ms=40.0, ranks=(0, 1)), [0, 1])
    progress = {
        r: {
            "steps_done": 12 - r,
            "recent_steps": [[11 - r, 120.0 + r, 3.0]],
            "samples": {"gpu_util_pct": 90.0 - r, "mem_used_mb": 1024.0},
        }
        for r in (0, 1)
    }
    lines = []
    server = serve(str(tmp_path), 0, gauges, lines.append)
    try:
        port = int((tmp_path / METRICS_PORT_FILE).read_text())
        assert lines == [f"diagnose: Prometheus metrics at http://{socket.gethostname()}:{port}/metrics"]
        assert scrape(port)[("diagnose_ranks_reporting", ())] == 0  # served before any rank reports
        gauges.update(progress, reader, where={0: ("node", 0), 1: ("node", 1)})
        before = scrape(port)
        gauges.alert("compute", 1)
        after = scrape(port)
        # a second server on the same port: one warning line, no exception
        assert serve(str(tmp_path), port, gauges, lines.append) is None
        assert len(lines) == 2 and lines[1].startswith("diagnose: warning: Prometheus metrics off: OSError")
    finally:
        server.shutdown()
        server.server_close()
    one = lambda rank: (("rank", str(rank)),)  # noqa: E731
    assert before[("diagnose_step_time_seconds", one(1))] == pytest.approx(0.121)
    assert before[("diagnose_steps_total", one(1))] == 11 and before[("diagnose_steps_behind", one(1))] == 1
    assert before[("diagnose_input_wait_seconds", one(0))] == pytest.approx(0.003)
    assert before[("diagnose_exposed_comm_ratio", one(0))] == 0.4
    assert before[("diagnose_arrival_lag_seconds", one(1))] == pytest.approx(0.0406)
    assert (before[("diagnose_waited_for", one(0))], before[("diagnose_waited_for", one(1))]) == (0, 1)
    assert before[("diagnose_gpu_utilization_percent", (("gpu", "1"), ("rank", "1")))] == 89.0
    assert before[("diagnose_gpu_memory_used_bytes", (("gpu", "0"), ("rank", "0")))] == 2**30
    compute_1 = ("diagnose_alerts_total", (("kind", "compute"), ("rank", "1")))
    assert (before[compute_1], after[compute_1]) == (0, 1)
    served = {name for name, _ in after} | {name.removesuffix("_total") for name, _ in after}
    assert set(METRICS) <= served, set(METRICS) - served
    assert json.loads((tmp_path / LIVE_STATE).read_text())["waited_for"]["rank"] == 1


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_monitor_counts_its_alerts_and_a_failing_gauge_stops_only_itself(tmp_path):
    stream = io.StringIO()
    mon = LiveMonitor(str(tmp_path), manifest={}, stream=stream, track=False, read_events=False)
    steps = {0: [], 1: []}
    for s in range(24):
        for r in (0, 1):
            steps[r].append([s, 100.0 + (s % 3) + (400.0 if r == 1 and s >= 12 else 0.0), 1.0])
        mon.tick({r: {"recent_steps": v[-64:], "steps_done": s + 1, "events_total": s} for r, v in steps.items()})
    assert mon.gauges.snapshot()["alerts"][("step_time", 1)] == 1
    assert mon.gauges.snapshot()["alerts"][("step_time", 0)] == 0
    mon.gauges.update({0: {"recent_steps": [[1, "x", None]], "samples": []}})  # garbage is skipped
    mon.gauges._update = None  # and a gauge that breaks says so once, the alerts go on
    mon.tick({0: {"recent_steps": [[30, 100.0, 1.0]], "events_total": 99}})
    assert not mon.disabled and mon.gauges.off
    assert sum("live gauges off" in line for line in stream.getvalue().splitlines()) == 1


def test_live_state_is_ignored_once_stale(tmp_path):
    (tmp_path / LIVE_STATE).write_text(json.dumps({"wall_ns": 1_000 * 10**9, "waited_for": {"rank": 3}}))
    assert read_live_state(str(tmp_path), wall_ns=lambda: 1_010 * 10**9)["waited_for"] == {"rank": 3}
    assert read_live_state(str(tmp_path), wall_ns=lambda: 1_100 * 10**9) is None
    assert read_live_state(str(tmp_path / "absent")) is None


def test_metrics_port_without_prometheus_client_is_one_line_before_the_job(monkeypatch, capsys):
    from diagnose.cli import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # an import of it raises ImportError
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--metrics-port", "0", "--", sys.executable, "-c", "raise SystemExit(5)"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "--metrics-port needs prometheus-client: pip install 'diagnose[metrics]'" in err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--metrics-port", "70000", "--", sys.executable, "-c", "pass"])
    assert exit_.value.code == 2 and "65535" in capsys.readouterr().err
