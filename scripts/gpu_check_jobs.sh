# Sourced by scripts/gpu_check.sh: the issue-44 jobs, written into $T, and
# run_issue44_jobs, which runs each plain and under `diagnose run` (logs in $T,
# read by scripts/gpu_check_results.py). Each job prints "RESULT <value>" from
# what the user would compare: the same value and exit code with and without
# diagnose is the check that diagnose did not change the job.

cat > "$T/coalesced.py" <<'PYEOF'
import torch, torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager
dist.init_process_group("nccl")
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
grads = [torch.full((1 << 16,), float(i + 1), device=dev) for i in range(3)]
out = torch.empty(1 << 16, device=dev)
for step in range(4):
    with _coalescing_manager(device=dev, async_ops=True) as cm:   # Megatron's DDP: async ops, one wait
        for g in grads:
            dist.all_reduce(g, async_op=True)
    cm.wait()
    with _coalescing_manager(device=dev):                         # sync ops: the work runs at the exit
        dist.all_gather_into_tensor(out, grads[0])
torch.cuda.synchronize()
print("RESULT", float(sum(g.sum() for g in grads) + out.sum()))
print("GROUP_SEQ", dist.group.WORLD._get_sequence_number_for_group())
dist.destroy_process_group()
PYEOF

cat > "$T/graph.py" <<'PYEOF'
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
static_x = torch.randn(256, 1024, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):                    # warm-up on a side stream, as torch's docs do
    for _ in range(3):
        model(static_x).square().mean().backward()
torch.cuda.current_stream().wait_stream(side)
model.zero_grad(set_to_none=False)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):                    # global capture mode (the default)
    static_loss = model(static_x).square().mean()
    static_loss.backward()
gen = torch.Generator(device="cuda").manual_seed(1)
total = torch.zeros((), device="cuda")
for step in range(20):
    static_x.copy_(torch.randn(256, 1024, device="cuda", generator=gen))
    graph.replay()
    total += static_loss
dist.all_reduce(total)
print("RESULT", round(float(total), 4))
dist.destroy_process_group()
PYEOF

cat > "$T/two_devices.py" <<'PYEOF'
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
if torch.cuda.device_count() < 2:
    print("RESULT one-device")
else:
    t = torch.ones(1 << 20, device="cuda:1")     # the current device stays 0
    x = torch.randn(2048, 2048, device="cuda:1")
    for step in range(6):
        y = x @ x                                # work queued on device 1 ahead of the call
        dist.all_reduce(t)
        t.add_(0 * y[0, 0])                      # keeps the GEMM's result in the job
    torch.cuda.synchronize(1)
    print("RESULT", float(t.sum()))
dist.destroy_process_group()
PYEOF

cat > "$T/nccl_timing.py" <<'PYEOF'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
a = torch.randn(4096, 4096, device="cuda")
buf = torch.randn(32 << 20, device="cuda")
def step():
    work = dist.all_reduce(buf, async_op=True)   # overlapped with the GEMMs
    for _ in range(8):
        a.copy_(a @ a / 4096)
    work.wait()
for _ in range(5):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(50):
    step()
torch.cuda.synchronize()
print("STEP_MS", (time.perf_counter() - t0) / 50 * 1e3, "TIMING", os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0"))
dist.destroy_process_group()
PYEOF

cat > "$T/one_rank.py" <<'PYEOF'
import torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("nccl")
torch.cuda.set_device(0)
t = torch.ones(1 << 20, device="cuda")
calls = {
    "all_reduce(AVG)": lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG),
    "all_reduce(SUM)": lambda: dist.all_reduce(t),
    "all_gather (out of place)": lambda: dist.all_gather([torch.empty_like(t)], t),
    "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty_like(t), t),
    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty_like(t), t),
}
for name, call in calls.items():
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = sorted({e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print("LAUNCHES", name, "->", kernels or "nothing on the device")
dist.destroy_process_group()
PYEOF

run_issue44_jobs() {
    local job
    for job in coalesced graph two_devices; do
        "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/$job.py" \
            > "$T/$job.plain.log" 2>&1; echo "EXIT $?" >> "$T/$job.plain.log"
        DIAGNOSE_CUDA_EVENTS_POLL_S=0.001 "${DIAG[@]}" run --out "$T/$job" --no-analyze -- \
            "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/$job.py" \
            > "$T/$job.diag.log" 2>&1; echo "EXIT $?" >> "$T/$job.diag.log"
    done
    for timing in 0 1; do
        TORCH_NCCL_ENABLE_TIMING=$timing "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
            "$T/nccl_timing.py" > "$T/nccl_timing.$timing.log" 2>&1
    done
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/one_rank.py" > "$T/one_rank.log" 2>&1
}
