"""A series' normal, from its own recent values: the live monitor's departures
(diagnose/live/monitor.py) and node health's (node_health.py) share the window
and the confirmation rule."""

import collections
import statistics

WINDOW = 32  # a series' own recent values that define its normal
MIN_HISTORY = 5
CONFIRM = 2  # consecutive departing values before an alert


class Baseline:
    """A series' robust recent spread: value departs when above
    median + k * max(1.4826 * MAD, rel_floor * median, abs_floor)."""

    def __init__(self, k: float, rel_floor: float, abs_floor: float, window: int = WINDOW):
        self.k, self.rel_floor, self.abs_floor = k, rel_floor, abs_floor
        self.values = collections.deque(maxlen=window)
        self.streak = 0
        self.active = False
        self.median = None  # of the values before the last one fed (None: too few yet)

    def threshold(self) -> tuple[float, float] | None:
        if len(self.values) < MIN_HISTORY:
            return None
        # statistics, not numpy: on 32 values a call of numpy costs 5x more
        median = statistics.median(self.values)
        mad = statistics.median([abs(v - median) for v in self.values])
        scale = max(1.4826 * mad, self.rel_floor * median, self.abs_floor)
        return median, median + self.k * scale

    def update(self, value: float) -> tuple[bool, float, float] | None:
        """Feed one value. Returns (confirmed new departure, median, threshold)
        once per episode, None otherwise."""
        limits = self.threshold()
        self.values.append(value)
        if limits is None:
            return None
        median, limit = limits
        self.median = median
        if value <= limit:
            self.streak, self.active = 0, False
            return None
        self.streak += 1
        if self.streak >= CONFIRM and not self.active:
            self.active = True
            return True, median, limit
        return None


def rank_baselines() -> dict:
    """A rank's watched series: its own compute, step time and data wait."""
    return {
        "compute": Baseline(k=5.0, rel_floor=0.25, abs_floor=5.0),
        "step": Baseline(k=5.0, rel_floor=0.25, abs_floor=5.0),
        "data_wait": Baseline(k=5.0, rel_floor=0.5, abs_floor=10.0),
    }
