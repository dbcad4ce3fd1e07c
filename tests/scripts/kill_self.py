"""Trains a little, then kills itself at a chosen step (rank 1 only) with SIGKILL, or
SIGABRT as NCCL's async error handling aborts a rank on a collective timeout (argv[3]),
after writing its own monotonic clock to a file: the test then checks what survived."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

kill_step, marker = int(sys.argv[1]), sys.argv[2]
kill_signal = getattr(signal, f"SIG{sys.argv[3]}") if len(sys.argv) > 3 else signal.SIGKILL
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1000):
    loss = model(torch.randn(32, 64)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.02)  # the scenario: steps of ~20 ms
    if rank == 1 and step == kill_step:
        with open(marker, "w") as f:
            f.write(str(time.monotonic_ns()))
        os.kill(os.getpid(), kill_signal)
    if rank == 0 and step > kill_step + 200:
        break
