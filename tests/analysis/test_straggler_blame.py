"""Waits passed on to the rank the late rank was itself waiting for
(diagnose/analysis/detectors/straggler_waits.py, pass_blame): with data x tensor
parallel groups, the straggler's tensor-parallel partner arrives last at its
data-parallel collective only because it waited for the straggler."""

import numpy as np
import pandas as pd

from diagnose.analysis.detectors.straggler_waits import pass_blame


def _waits(rows):
    """(group, rank, arrival, last arrival, last rank, blocked from) -> the waits table."""
    frame = pd.DataFrame(
        rows, columns=["group", "rank", "arrival_ns", "last_arrival_ns", "last_rank", "blocked_from_ns"]
    ).assign(step=0)
    return frame[frame["rank"] != frame["last_rank"]]


def _caused(parts):
    """(late rank, waiting rank) -> ns waited, summed over parts."""
    ns = parts["last_arrival_ns"] - parts["arrival_ns"]
    return ns.groupby([parts["last_rank"], parts["rank"]]).sum().to_dict()


def _dp2_tp2(tp_blocks: bool):
    """Rank 1 is slow: tensor-parallel all-reduce {0,1} at 10 and 50, {2,3} at 10
    and 12; then the data-parallel all-gathers {0,2} and {1,3}: 2 and 3 arrive at 15,
    0 and 1 at 52."""
    blocked = 10.0 if tp_blocks else np.nan  # rank 0's all-reduce: sync, or async and never waited
    return _waits(
        [
            ("tp01", 0, 10, 50, 1, blocked),
            ("tp01", 1, 50, 50, 1, 50.0),
            ("tp23", 2, 10, 12, 3, 10.0),
            ("tp23", 3, 12, 12, 3, 12.0),
            ("dp02", 0, 52, 52, 0, 52.0),
            ("dp02", 2, 15, 52, 0, 15.0),
            ("dp13", 1, 52, 52, 1, 52.0),
            ("dp13", 3, 15, 52, 1, 15.0),
        ]
    )


def test_the_partners_lateness_is_the_stragglers():
    caused = _caused(pass_blame(_dp2_tp2(tp_blocks=True)))
    # rank 2 waited 15..52 for rank 0, which was blocked for rank 1 until 50
    assert caused == {(1, 0): 40, (1, 2): 35, (0, 2): 2, (1, 3): 37, (3, 2): 2}


def test_a_wait_that_did_not_block_passes_nothing_on():
    """An async op never waited (DDP's buckets): the rank went on working meanwhile."""
    caused = _caused(pass_blame(_dp2_tp2(tp_blocks=False)))
    assert caused == {(1, 0): 40, (0, 2): 37, (1, 3): 37, (3, 2): 2}


def test_blame_goes_down_a_chain_and_stops_where_the_late_rank_worked():
    """0 waits for 1 (until 20), 1 had waited for 2 (until 18): 0's wait before 18
    is 2's. 2 then waits for 0 after 0's own wait ended: that is 0's."""
    caused = _caused(
        pass_blame(
            _waits(
                [
                    ("a", 1, 5, 18, 2, 5.0),
                    ("a", 2, 18, 18, 2, 18.0),
                    ("b", 0, 10, 20, 1, 10.0),
                    ("b", 1, 20, 20, 1, 20.0),
                    ("c", 2, 21, 30, 0, 21.0),
                    ("c", 0, 30, 30, 0, 30.0),
                ]
            )
        )
    )
    assert caused == {(2, 1): 13, (2, 0): 8, (1, 0): 2, (0, 2): 9}


def _releases(rows):
    """(rank, exit, waited there) of every call a rank was blocked in."""
    return pd.DataFrame(rows, columns=["rank", "exit_ns", "waited"])


def test_lateness_brought_out_of_an_earlier_wait_is_no_ones():
    """The loaded dp2 x tp2 job (times in 0.1 ms): rank 3 waits for rank 1 in their
    all-gather until 184 (both leave at 190); rank 2 left its own all-gather at 25,
    works 55 and waits at its tensor-parallel all-reduce from 80 for rank 3, which
    left at 190 and worked 60: rank 3 worked 5 longer, that is its own; the rest it
    brought out of the all-gather. The part while rank 3 still waited is rank 1's."""
    waits = _waits(
        [
            ("ag13", 3, 0, 184, 1, 0.0),
            ("ag13", 1, 184, 184, 1, 184.0),
            ("tp23", 2, 80, 250, 3, 80.0),
            ("tp23", 3, 250, 250, 3, 250.0),
        ]
    )
    releases = _releases(
        [(3, 190, True), (1, 190, False), (0, 25, False), (2, 25, True), (2, 255, True), (3, 255, False)]
    )
    assert _caused(pass_blame(waits, releases=releases)) == {(1, 3): 184, (1, 2): 104, (3, 2): 5}
    # without the releases, rank 3 held the 66 after its wait ended
    assert _caused(pass_blame(waits)) == {(1, 3): 184, (1, 2): 104, (3, 2): 66}


def test_a_straggler_keeps_the_waits_its_own_work_makes():
    """One group: rank 1 is last into all-reduce k-1 and both leave it at 10; rank 0
    arrives at k at 15, the slow rank 1 at 40: all 25 are rank 1's, as when it left
    later (30: the transfer reached it late). Had it waited there for rank 0 (it
    arrived first), it would keep only its 10 of work beyond rank 0's 5."""
    waits = _waits([("dp", 0, 15, 40, 1, 15.0), ("dp", 1, 40, 40, 1, 40.0)])
    assert _caused(pass_blame(waits, releases=_releases([(0, 10, True), (1, 10, False)]))) == {(1, 0): 25}
    assert _caused(pass_blame(waits, releases=_releases([(0, 10, True), (1, 30, False)]))) == {(1, 0): 25}
    assert _caused(pass_blame(waits, releases=_releases([(0, 10, False), (1, 30, True)]))) == {(1, 0): 5}
