"""What timing DDP's all-reduces costs: four DDP copies of samples/ddp_mlp.py's
model in the same 2-rank gloo job, stepped in turn (so machine noise hits all
alike; the order shuffled each round), differing only in how their gradients are reduced and timed:

    builtin   DDP's C++ all-reduce, untimed (what the job runs without diagnose)
    timer     the same, timed by DDP's own runtime timer (diagnose's default on CPU)
    hook      collectors/instrument/ddp.py's timing comm hook (records every bucket;
              diagnose's way for GPU modules)
    python    torch's own default_hooks.allreduce_hook (any Python comm hook)

The collectors are installed in all four (after `builtin` and `python` were
built), so the timing is the only difference. Prints the median extra ms per
step (2 micro-batches, each with its backward and all-reduce, then the
optimizer) over `builtin`, per part.

    .venv/bin/python -m bench.ddp_hook_cost [--steps 200]
"""

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK_CODE = r"""
import os, random, statistics, sys, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from collectors.activate import install_torch_instrumentors
from collectors.recorder import start_recorder

steps, run_dir = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
torch.manual_seed(0)
def mlp():
    return nn.Sequential(nn.Linear(512, 1536), nn.GELU(), nn.Linear(1536, 1536), nn.GELU(), nn.Linear(1536, 1))
builtin = DDP(mlp())
python = DDP(mlp())
python.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
install_torch_instrumentors(start_recorder(run_dir))
os.environ["DIAGNOSE_DDP_TIMING"] = "hook"
hooked = DDP(mlp())
os.environ["DIAGNOSE_DDP_TIMING"] = "timer"
timed = DDP(mlp())
assert getattr(hooked, "_diagnose_hook_state", None) is not None and getattr(timed, "_diagnose_timer", None)
models = {"builtin": builtin, "timer": timed, "hook": hooked, "python": python}
optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
x, y = torch.randn(40, 512), torch.randn(40, 1)
times = {name: [] for name in models}
order = random.Random(0)  # the same on every rank: all run the same model in a step
for _ in range(steps):
    names = list(models)
    order.shuffle(names)  # a fresh order each round: no model always follows the same one
    for name in names:
        model, optimizer = models[name], optimizers[name]
        dist.barrier()
        t0 = time.perf_counter()
        backward_s = 0.0
        for _ in range(2):
            loss = nn.functional.mse_loss(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            backward_s += time.perf_counter() - t1
        optimizer.step()
        optimizer.zero_grad()
        times[name].append((time.perf_counter() - t0, backward_s))
if dist.get_rank() == 0:
    warm = steps // 10
    for part, j in (("step", 0), ("backward", 1)):
        base = statistics.median(t[j] for t in times["builtin"][warm:]) * 1e3
        extra = {n: statistics.median(t[j] for t in times[n][warm:]) * 1e3 - base for n in ("timer", "hook", "python")}
        print(f"{part:8s} builtin {base:6.2f} ms  " + "  ".join(
            f"{n} {e:+5.2f} ms ({e / base:+.1%})" for n, e in extra.items()), flush=True)
dist.destroy_process_group()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory(prefix="diagnose-ddp-hook-") as work:
        script = os.path.join(work, "rank.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(RANK_CODE)
        for r in range(args.repeat):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    script,
                    str(args.steps),
                    os.path.join(work, f"run{r}"),
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            if out.returncode:
                print(out.stdout[-1500:], out.stderr[-1500:])
                return 1
            print(f"job {r + 1}/{args.repeat}")
            print(out.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
