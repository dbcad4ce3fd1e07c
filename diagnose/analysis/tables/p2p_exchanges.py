"""Pipeline sends a deferred wait could free, and those it could not.

A pipeline stage exchanges with its neighbours between two computes: it sends
what the compute before produced and receives what the compute after needs.
When the receive is from the same peer the send went to (1F1B's steady state:
activation on, gradient back from the same neighbour; Megatron's
send_forward_recv_backward), the two are one exchange: the receive cannot end
before the peer has taken the send and answered, so waiting the send later
frees nothing; batching the pair is the fix, and it saves one transfer at most.
A send with no such receive beside it (warm-up and cool-down, or a receive from
the other neighbour) only holds the sender until its receiver is ready: waited
at the end of the schedule instead, the sender computes meanwhile.

"Beside" is read off the host's own order, as a trace without phase rows gives
it: the call next to the send on the rank's thread (before or after it), in the
same step, with nothing between them (NOTHING_BETWEEN_NS: under it no compute
ran; it is the blocking_async detector's "waited immediately" bound too), or
issued in the same batch.
"""

import numpy as np
import pandas as pd

NOTHING_BETWEEN_NS = 500_000


def host_end_ns(calls: pd.DataFrame) -> np.ndarray:
    """When the call let the thread go: its wait's end if waited, else its return."""
    ret = calls["return_ns"].to_numpy(np.float64)
    waited = calls["wait_end_ns"].to_numpy(np.float64)
    return np.where(np.isnan(waited), ret, waited)


def exchange_partners(calls: pd.DataFrame) -> np.ndarray:
    """Per row of `calls`, the row of the receive a send is exchanged with (or of the
    send a receive is), for the earlier op of each such pair on the rank's thread;
    -1 elsewhere (the later op of a pair, a lone op). Column arrays only, sorted by
    index: no copy of the frame (millions of rows at 1,024 ranks)."""
    order = np.lexsort((calls["issue_ns"].to_numpy(), calls["rank"].to_numpy()))
    rank, step = calls["rank"].to_numpy()[order], calls["step"].to_numpy()[order]
    is_send = (calls["name"] == "send").to_numpy()[order]
    is_recv = (calls["name"] == "recv").to_numpy()[order]
    peer = calls["peer"].to_numpy()[order] if "peer" in calls else np.full(len(calls), -1)
    issue, end = calls["issue_ns"].to_numpy(np.float64)[order], host_end_ns(calls)[order]
    same = (rank[1:] == rank[:-1]) & (step[1:] == step[:-1]) & (peer[1:] == peer[:-1]) & (peer[1:] >= 0)
    adjacent = same & (issue[1:] - end[:-1] <= NOTHING_BETWEEN_NS)
    pair = adjacent & ((is_send[:-1] & is_recv[1:]) | (is_recv[:-1] & is_send[1:]))
    # a chain (send, recv, send) pairs its first two
    pair[1:] &= ~pair[:-1]
    partner = np.full(len(calls), -1)
    first = np.flatnonzero(pair)
    partner[order[first]] = order[first + 1]
    return partner
