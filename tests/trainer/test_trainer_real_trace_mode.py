"""A live run that holds what a profiler's trace of a real job holds (issue 45,
item 6): the reference trainer with its phases off (REFERENCE_TRAINER_PHASES=0)
under `diagnose run` with DIAGNOSE_COMPUTE_ROWS=0, so no phase, forward or
backward row at all; the analysis infers the forwards and backwards from each
pipeline rank's own sends and receives (diagnose/analysis/tables/inferred_compute.py).
The trainer posts its pipeline traffic as Megatron does (--p2p-mode batched:
one batch_isend_irecv with both neighbours; preposted: each receive alone,
posted a compute early): the slow stage must still be named, and every mode
must train the same model. Each pass waits for an emulated device, as on a GPU.
Two launches (pp4, 4 ranks), shared by the tests."""

import json
import threading
import types

import pytest
import torch

from reference_trainer import p2p as p2p_module
from reference_trainer.p2p import BACKWARD, FORWARD, P2P_MODES, PipelineP2P
from reference_trainer.pipeline import run_schedule
from reference_trainer.scenarios import SCENARIOS
from tests.support.jobs import job_env, load_run, run_diagnose, torchrun

SLOW_STAGE = SCENARIOS["slow_stage"]  # pp4, 1F1B, 8 micro-batches, stage 2 three times slower
STEPS = 10


# Each pass waits for an emulated device (4 ms a forward, 8 a backward; stage 2's 3x
# that), as a GPU's kernels would: on 2 shared cores a rank's host compute alone was
# once 4x slower in a loaded suite (5 -> 20 ms a micro-batch, beside an 8-rank job),
# which made stage 3 the slowest in wall time (stage 2: 11 ms). The device's time
# does not depend on the host's cores; the host's is what this box's load makes it.
EMULATED_DEVICE = ["--emulated-device-ms-per-sample", "2"]


def _argv(mode: str, log_path) -> list:
    argv = list(SLOW_STAGE.argv)
    argv[argv.index("--steps") + 1] = str(STEPS)
    return argv + EMULATED_DEVICE + ["--p2p-mode", mode, "--log-jsonl", log_path]


@pytest.fixture(scope="module")
def real_trace_run(tmp_path_factory):
    runs = {}

    def get(mode: str):
        if mode not in runs:
            out = tmp_path_factory.mktemp(mode)
            run_diagnose(
                [
                    "run",
                    "--out",
                    out / "run",
                    "--",
                    *torchrun(SLOW_STAGE.nproc, "-m", "reference_trainer", *_argv(mode, out / "loss.jsonl")),
                ],
                env=job_env(REFERENCE_TRAINER_PHASES=0, DIAGNOSE_COMPUTE_ROWS=0),
            )
            losses = [json.loads(line)["loss"] for line in (out / "loss.jsonl").read_text().splitlines()]
            runs[mode] = (out / "run", losses)
        return runs[mode]

    return get


def _findings(run_dir) -> list:
    return json.loads((run_dir / "analysis" / "findings.json").read_text())


def _check_recorded_like_a_profiler_trace_and_slow_stage_named(run_dir) -> None:
    run = load_run(run_dir)
    events = run.events()
    markup = events[events["kind"].isin(["phase", "forward", "backward"]) & (events["detail"] != "inferred")]
    assert markup.empty, markup[["rank", "kind", "name", "detail"]].drop_duplicates().head(20)
    assert run.stage_source == "inferred: 4 stages x 1 pipelines"
    inferred = events[events["kind"].isin(["forward", "backward"])]
    # every rank's compute is inferred, on its stage (pp4: rank r is stage r); which of its
    # gaps are forwards and which backwards has known limits (inferred_compute.py)
    assert inferred.groupby("rank")["stage"].unique().map(list).to_dict() == {r: [r] for r in range(4)}
    serious = [f for f in _findings(run_dir) if f["severity"] != "info"]
    titles = [f"{f['kind']} ranks={f['ranks']} stage={f.get('stage')}: {f['title']}" for f in serious]
    assert any(
        f["kind"] == SLOW_STAGE.expected_kind
        and tuple(f["ranks"]) == SLOW_STAGE.expected_ranks
        and f["stage"] == SLOW_STAGE.expected_stage
        for f in serious
    ), titles
    assert not any(f["kind"] == "stage_imbalance" and f["stage"] != SLOW_STAGE.expected_stage for f in serious), titles


def test_batched_exchanges_without_compute_rows_name_the_slow_stage(real_trace_run):
    run_dir, losses = real_trace_run("batched")
    assert len(losses) == STEPS
    _check_recorded_like_a_profiler_trace_and_slow_stage_named(run_dir)


def test_preposted_receives_name_the_same_stage_and_train_the_same_model(real_trace_run):
    run_dir, losses = real_trace_run("preposted")
    _check_recorded_like_a_profiler_trace_and_slow_stage_named(run_dir)
    # the modes move the same tensors between the same computes: bit-for-bit the same losses
    assert losses == real_trace_run("batched")[1]


# ---- the modes' operations, without a launch: each stage a thread over a fake dist


class FakeDist:
    """torch.distributed's p2p as gloo does it: receives from a peer take that peer's
    sends in the order the receives were posted; each rank's posts are logged."""

    isend, irecv = object(), object()

    def __init__(self):
        self.local, self.cond = threading.local(), threading.Condition()
        self.sent, self.posted = {}, {}  # (src, dst) -> tensors sent / receives posted
        self.log: dict = {}  # rank -> [("batch", [(op, peer)]) | ("compute", kind, mb)]
        self.posted_at: dict = {}  # id(receive buffer) -> its batch's index in its rank's log

    def P2POp(self, op, tensor, peer, group):  # noqa: N802 (torch's name)
        return types.SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group)

    def batch_isend_irecv(self, ops):
        me, works = self.local.rank, []
        log = self.log.setdefault(me, [])
        log.append(("batch", [("send" if o.op is self.isend else "recv", o.peer) for o in ops]))
        with self.cond:
            for o in ops:
                if o.op is self.isend:
                    self.sent.setdefault((me, o.peer), []).append(o.tensor.clone())
                    self.cond.notify_all()
                    works.append(types.SimpleNamespace(wait=lambda: None))
                else:
                    n = self.posted.get((o.peer, me), 0)
                    self.posted[(o.peer, me)] = n + 1
                    self.posted_at[id(o.tensor)] = len(log) - 1
                    works.append(types.SimpleNamespace(wait=lambda o=o, n=n: self._take(o.peer, me, n, o.tensor)))
        return works

    def _take(self, src, dst, n, buffer):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent.get((src, dst), [])) > n, timeout=10), "deadlock"
            buffer.copy_(self.sent[(src, dst)][n])


class StubRunner:
    """A compute whose output names its stage and micro-batch (backward: negated)."""

    def __init__(self, stage: int, fake: FakeDist, received: dict):
        self.stage, self.fake, self.received = stage, fake, received

    def _note(self, kind, mb, tensor):
        log = self.fake.log.setdefault(self.stage, [])
        posted = None if tensor is None else self.fake.posted_at[id(tensor)]
        self.received[(self.stage, kind, mb)] = (
            None if tensor is None else float(tensor.detach()[0]),
            posted,
            len(log),
        )
        log.append(("compute", kind, mb))

    def forward(self, x, mb):
        self._note(FORWARD, mb, x)
        return torch.full((2,), 100.0 * self.stage + mb)

    def backward(self, x, y, dy, mb):
        self._note(BACKWARD, mb, dy)
        return None if x is None else torch.full((2,), -(100.0 * self.stage + mb))

    def note_inflight(self, n):
        pass


def _simulate(monkeypatch, mode: str, schedule: str, pp: int = 4, m: int = 5):
    fake, received, errors = FakeDist(), {}, []
    monkeypatch.setattr(p2p_module, "dist", fake)

    def stage_main(s):
        fake.local.rank = s
        try:
            p2p = PipelineP2P(
                stage=s,
                prev_rank=s - 1 if s else None,
                next_rank=s + 1 if s < pp - 1 else None,
                group=None,
                activation_shape=(2,),
                dtype=torch.float32,
                device=torch.device("cpu"),
                blocking=False,
                mode=mode,
            )
            run_schedule(schedule, StubRunner(s, fake, received), p2p, m, pp, s)
        except Exception as exc:  # noqa: BLE001 (reported by the test)
            errors.append((s, repr(exc)))

    threads = [threading.Thread(target=stage_main, args=(s,)) for s in range(pp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and not any(t.is_alive() for t in threads), errors
    return fake, received


@pytest.mark.parametrize("schedule", ["afab", "1f1b"])
@pytest.mark.parametrize("mode", P2P_MODES)
def test_every_mode_hands_each_compute_its_neighbours_output(monkeypatch, mode, schedule):
    pp, m = 4, 5
    _, received = _simulate(monkeypatch, mode, schedule, pp, m)
    for s in range(pp):
        for mb in range(m):
            assert received[(s, FORWARD, mb)][0] == (None if s == 0 else 100.0 * (s - 1) + mb)
            assert received[(s, BACKWARD, mb)][0] == (None if s == pp - 1 else -(100.0 * (s + 1) + mb))


def test_what_one_exchange_posts_in_each_mode(monkeypatch):
    """Stage 1 of pp4 1F1B (2 warm-up forwards): its warm-up, steady and cool-down exchanges."""
    batches = {
        mode: [b[1] for b in _simulate(monkeypatch, mode, "1f1b")[0].log[1] if b[0] == "batch"] for mode in P2P_MODES
    }
    # separate: a batch never holds both neighbours
    assert all(len({peer for _, peer in b}) == 1 for b in batches["separate"])
    # batched: the warm-up's activation on and next activation in are one batch, in Megatron's
    # order (send prev, recv prev, send next, recv next); so are the cool-down's gradients
    assert batches["batched"][:3] == [[("recv", 0)], [("recv", 0), ("send", 2)], [("recv", 0), ("send", 2)]]
    assert [("send", 2), ("recv", 2)] in batches["batched"] and [("send", 0), ("recv", 0)] in batches["batched"]
    assert batches["batched"][-2:] == [[("send", 0), ("recv", 2)], [("send", 0)]]
    # preposted: one operation per batch
    assert all(len(b) == 1 for b in batches["preposted"])


def test_preposted_receives_are_posted_a_compute_before_their_use(monkeypatch):
    fake, received = _simulate(monkeypatch, "preposted", "1f1b")
    for stage, log in fake.log.items():
        computes = [i for i, entry in enumerate(log) if entry[0] == "compute"]
        for (s, kind, mb), (_, posted, at) in received.items():
            if s != stage or posted is None or computes.index(at) == 0:
                continue  # the step's first input: nothing comes before it
            assert posted < computes[computes.index(at) - 1], (stage, kind, mb)
