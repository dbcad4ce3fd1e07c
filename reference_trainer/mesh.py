"""The (dp, pp, tp) process-group mesh, built once at start-up.

Global rank = (dp_rank * pp + pp_rank) * tp + tp_rank: tp is innermost so a
tensor-parallel group sits on neighbouring ranks (one node, fastest links), and
dp is outermost because its traffic is the easiest to overlap.
"""

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Mesh:
    rank: int
    world_size: int
    dp: int
    pp: int
    tp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    backend: str
    device: torch.device

    def global_rank(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        return (dp_rank * self.pp + pp_rank) * self.tp + tp_rank

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def prev_stage_rank(self) -> int | None:
        return None if self.is_first_stage else self.global_rank(self.dp_rank, self.pp_rank - 1, self.tp_rank)

    @property
    def next_stage_rank(self) -> int | None:
        return None if self.is_last_stage else self.global_rank(self.dp_rank, self.pp_rank + 1, self.tp_rank)

    @property
    def logs_loss(self) -> bool:
        return self.is_last_stage and self.tp_rank == 0 and self.dp_rank == 0


def _default_single_process_env() -> None:
    """Let `python -m reference_trainer` run as one process without torchrun."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def init_mesh(dp: int, pp: int, tp: int, timeout_s: float = 1800.0) -> Mesh:
    _default_single_process_env()
    # the backend's own watchdog: how long a collective may wait before it raises
    timeout = datetime.timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        backend = "nccl"
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        # device_id makes NCCL create communicators eagerly, so the first pipeline
        # send/recv pair does not need every rank of its group to join it
        dist.init_process_group(backend, device_id=device, timeout=timeout)
    else:
        backend, device = "gloo", torch.device("cpu")
        dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != dp * pp * tp:
        raise SystemExit(f"world size {world} != dp*pp*tp = {dp}*{pp}*{tp}")
    coords = torch.arange(world).reshape(dp, pp, tp)
    dp_rank, pp_rank, tp_rank = (int(c) for c in (coords == rank).nonzero()[0])

    def groups(along: int):
        # every rank must create every group, in the same order
        moved = coords.movedim(along, -1).reshape(-1, coords.shape[along])
        # (a subgroup does not inherit the default group's timeout: pass it on)
        group, _ = dist.new_subgroups_by_enumeration([row.tolist() for row in moved], backend=backend, timeout=timeout)
        return group

    dp_group, pp_group, tp_group = groups(0), groups(1), groups(2)
    return Mesh(rank, world, dp, pp, tp, dp_rank, pp_rank, tp_rank, dp_group, pp_group, tp_group, backend, device)
