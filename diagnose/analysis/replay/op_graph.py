"""A dependency graph of ops and its replay: the longest path through it, with
what-if durations (the engine of diagnose/analysis/replay/step_replay.py and
device_graph.py, which say what the nodes and edges of a run are).

Each node is an op with its own work (`dur_ns`) and an optional earliest
start (`floor_ns`: a recorded time nothing in the graph explains, such as a
lane's first point). Each edge u -> v carries a weight: v may start `weight_ns`
after u ends (a launch delay, the host work between two calls; negative where
the ranks' clocks disagree by that much). Replayed:

    start(v) = max(floor(v), max over edges u -> v of end(u) + weight(u, v))
    end(v)   = start(v) + dur(v)

A rendezvous (a collective, a batch of p2p messages) is one node that every
member's lane enters and leaves: it starts when its last member is ready.

Why levels: the replay is evaluated level by level (a node's level is the
longest edge count from a source), each level one vectorised gather and
`np.maximum.reduceat` over its nodes' in-edges. The number of levels is about
the number of ops on the longest lane, not the number of nodes: 1,024 ranks
x 200 steps is ~3 x 10^4 levels of ~10^3 nodes each, where a per-node Python
loop would take minutes. The order is computed once (`levels`), then any
number of what-ifs replay it with their own durations and weights.
"""

import numpy as np

NEG_INF = -np.inf


class Cycle(ValueError):
    """The graph is not acyclic: `nodes` is one cycle, in edge order."""

    def __init__(self, nodes: list[int]):
        super().__init__(f"dependency cycle through {len(nodes)} ops")
        self.nodes = nodes


class OpGraph:
    def __init__(self, n: int, src, dst, weight_ns, dur_ns, floor_ns=None):
        self.n = int(n)
        index = np.int32 if self.n < 2**31 - 1 else np.int64  # half the memory of 10^7-edge graphs
        src, dst = np.asarray(src, index), np.asarray(dst, index)
        self.weight_ns = np.asarray(weight_ns, np.float64)
        self.dur_ns = np.asarray(dur_ns, np.float64)
        self.floor_ns = np.full(self.n, NEG_INF) if floor_ns is None else np.asarray(floor_ns, np.float64)
        level = self._levels(src, dst, index)
        # nodes by level; in-edges grouped by their node in that order, so a level's
        # nodes and their edges are two contiguous slices
        self.order = np.argsort(level, kind="stable").astype(index)
        position = np.empty(self.n, index)
        position[self.order] = np.arange(self.n, dtype=index)
        by_node = np.argsort(position[dst], kind="stable").astype(index)
        del position
        self.edge_src, self.edge_index = src[by_node], by_node
        del by_node
        indegree = np.bincount(dst, minlength=self.n)[self.order]
        self.edge_offset = np.concatenate([[0], np.cumsum(indegree)]).astype(np.int64)
        self.level_bounds = np.searchsorted(level[self.order], np.arange(int(level.max(initial=0)) + 2))

    def _levels(self, src, dst, index) -> np.ndarray:
        """Kahn's algorithm, one frontier of nodes at a time (vectorised)."""
        n = self.n
        indegree = np.bincount(dst, minlength=n).astype(index)
        out_dst = dst[np.argsort(src, kind="stable")]
        out_offset = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
        level = np.full(n, -1, index)
        frontier = np.flatnonzero(indegree == 0)
        depth = 0
        while len(frontier):
            level[frontier] = depth
            counts = out_offset[frontier + 1] - out_offset[frontier]
            total = int(counts.sum())
            if not total:
                break
            # the out-edges of every frontier node: concatenated index ranges
            starts = np.repeat(out_offset[frontier] - np.cumsum(counts) + counts, counts)
            targets = out_dst[starts + np.arange(total)]
            hit, times = np.unique(targets, return_counts=True)
            indegree[hit] -= times
            frontier = hit[indegree[hit] == 0]
            depth += 1
        if (level < 0).any():
            raise Cycle(self._a_cycle(src, dst, level))
        return level

    def _a_cycle(self, src, dst, level) -> list[int]:
        """Walk back from an unplaced node through unplaced predecessors until a node repeats."""
        stuck = level < 0
        keep = stuck[src] & stuck[dst]
        pred = {}
        for s, d in zip(src[keep], dst[keep]):
            pred.setdefault(int(d), int(s))
        node, seen = int(np.flatnonzero(stuck)[0]), []
        while node not in seen:
            seen.append(node)
            node = pred[node]
        cycle = seen[seen.index(node) :]
        return cycle[::-1]

    def replay(self, dur_ns=None, weight_ns=None, floor_ns=None) -> np.ndarray:
        """Each node's end, ns. `dur_ns`, `weight_ns` (in the order edges were
        given; -inf removes an edge) and `floor_ns` replace the recorded ones."""
        dur = self.dur_ns if dur_ns is None else np.asarray(dur_ns, np.float64)
        weight = (self.weight_ns if weight_ns is None else np.asarray(weight_ns, np.float64))[self.edge_index]
        floor = self.floor_ns if floor_ns is None else np.asarray(floor_ns, np.float64)
        end = np.full(self.n, NEG_INF)
        order, offset, src = self.order, self.edge_offset, self.edge_src
        bounds = self.level_bounds
        first = order[bounds[0] : bounds[1]]
        end[first] = floor[first] + dur[first]
        for a, b in zip(bounds[1:-1], bounds[2:]):
            nodes = order[a:b]
            ea, eb = offset[a], offset[b]
            ready = np.maximum.reduceat(end[src[ea:eb]] + weight[ea:eb], offset[a:b] - ea)
            end[nodes] = np.maximum(ready, floor[nodes]) + dur[nodes]
        return end
