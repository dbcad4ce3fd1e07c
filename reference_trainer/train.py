"""The training loop: build mesh, stage model, data, gradient sync and optimizer,
then for each step: load the micro-batches, run the pipeline schedule, wait for
the gradient collectives, step the optimizer, log the global-batch loss."""

import json
import os
import time

import torch
import torch.distributed as dist

from reference_trainer.config import TrainConfig, parse_args
from reference_trainer.data import make_loader
from reference_trainer.dp import GradBuckets
from reference_trainer.faults import Faults
from reference_trainer.mesh import Mesh, init_mesh
from reference_trainer.model import GPTStage
from reference_trainer.optional_collectors import phase
from reference_trainer.p2p import PipelineP2P
from reference_trainer.pipeline import StageRunner, run_schedule
from reference_trainer.zero import ZeroAdamW


def build_model(cfg: TrainConfig, mesh: Mesh) -> GPTStage:
    lo, hi = cfg.stage_layer_ranges()[mesh.pp_rank]
    model = GPTStage(
        vocab=cfg.vocab,
        seq_len=cfg.seq_len,
        d_model=cfg.d_model,
        heads=cfg.heads,
        n_layers=cfg.layers,
        layer_lo=lo,
        layer_hi=hi,
        first=mesh.is_first_stage,
        last=mesh.is_last_stage,
        seed=cfg.seed,
        tp_rank=mesh.tp_rank,
        tp=mesh.tp,
        tp_group=mesh.tp_group,
    )
    return model.to(mesh.device)


def global_mean_loss(runner: StageRunner, cfg: TrainConfig, mesh: Mesh) -> torch.Tensor:
    """Mean over micro-batches and dp ranks: comparable whatever the layout. A
    tensor on the device: reading it on the host is a device sync."""
    loss = runner.loss_sum.detach() / cfg.microbatches
    if mesh.dp > 1:
        loss = loss.reshape(1)
        dist.all_reduce(loss, group=mesh.dp_group)
        loss = loss / mesh.dp
    return loss.reshape(())


class LossLog:
    """Step rows of the loss log. On CUDA a row waits until its loss has been
    copied to the host (an event queried, never waited on in the step), so
    logging does not synchronize every step; the rest are written at the end."""

    def __init__(self, writer, device: torch.device):
        self.writer, self.cuda = writer, device.type == "cuda"
        self.pending: list = []  # (row, loss on the host, copy done event)

    def add(self, row: dict, loss: torch.Tensor) -> None:
        if not self.cuda:
            self.writer.write({**row, "loss": float(loss.item())})
            return
        host = loss.to("cpu", non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((row, host, done))
        while self.pending and self.pending[0][2].query():
            self._write(self.pending.pop(0))

    def close(self) -> None:
        for item in self.pending:  # after the last step: waiting costs nothing now
            item[2].synchronize()
            self._write(item)
        self.pending = []
        self.writer.close()

    def _write(self, item) -> None:
        row, host, _ = item
        self.writer.write({**row, "loss": float(host.item())})


class JsonlWriter:
    """Line-buffered, so a killed or hung run still leaves every finished step on disk."""

    def __init__(self, path: str | None):
        self.file = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, "w", buffering=1)

    def write(self, row: dict) -> None:
        if self.file:
            self.file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.file:
            self.file.close()


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    mesh = init_mesh(cfg.dp, cfg.pp, cfg.tp, timeout_s=cfg.pg_timeout_s)
    if cfg.p2p_mode == "preposted" and mesh.pp > 1 and mesh.backend == "nccl":
        # a hang is worse than a refusal (reference_trainer/p2p.py says why it would hang)
        raise SystemExit(
            "--p2p-mode preposted is gloo-only: on NCCL a receive posted ahead queues the send it waits for behind it"
        )
    torch.manual_seed(cfg.seed)
    stage, device = mesh.pp_rank, mesh.device
    precision = cfg.precision or ("bf16" if device.type == "cuda" else "fp32")
    faults = Faults(
        cfg.faults,
        mesh.rank,
        stage,
        device,
        dp_rank=mesh.dp_rank,
        emulated_device_ms=cfg.emulated_device_ms_per_sample * cfg.micro_batch_size,
    )

    model = build_model(cfg, mesh)
    faults.checkpoint_state = model.state_dict
    buckets = GradBuckets(
        model.parameters(),
        group=mesh.dp_group,
        dp=mesh.dp,
        device=device,
        bucket_cap_mb=cfg.bucket_cap_mb,
        reduce_scatter=cfg.zero1,
        before_first_launch=faults.before_collective,
    )
    if cfg.zero1:
        optimizer = ZeroAdamW(
            buckets, group=mesh.dp_group, dp_rank=mesh.dp_rank, lr=cfg.lr, weight_decay=cfg.weight_decay
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    needs_data = mesh.is_first_stage or mesh.is_last_stage
    loader_iter = None
    if needs_data:
        loader_iter = iter(
            make_loader(
                path=cfg.data,
                vocab=cfg.vocab,
                seq_len=cfg.seq_len,
                micro_batch_size=cfg.micro_batch_size,
                microbatches=cfg.microbatches,
                dp=mesh.dp,
                dp_rank=mesh.dp_rank,
                steps=cfg.steps,
                seed=cfg.seed,
                num_workers=cfg.num_workers,
                load_delay_ms=faults.slow_input_ms,
                pin_memory=device.type == "cuda" and not faults.unpinned_copies,
            )
        )
    runner = StageRunner(
        model,
        stage=stage,
        first=mesh.is_first_stage,
        last=mesh.is_last_stage,
        microbatches=cfg.microbatches,
        buckets=buckets,
        faults=faults,
        dp_group=mesh.dp_group,
        autocast_dtype=torch.bfloat16 if precision == "bf16" else None,
        device=device,
    )
    p2p = PipelineP2P(
        stage=stage,
        prev_rank=mesh.prev_stage_rank,
        next_rank=mesh.next_stage_rank,
        group=mesh.pp_group,
        activation_shape=(cfg.micro_batch_size, cfg.seq_len, cfg.d_model),
        dtype=torch.float32,
        device=device,
        blocking=faults.blocking_p2p,
        mode=cfg.p2p_mode,
    )
    log = LossLog(JsonlWriter(cfg.log_jsonl if mesh.logs_loss else None), device)
    debug = JsonlWriter(os.path.join(cfg.debug_dir, f"rank-{mesh.rank:05d}.jsonl") if cfg.debug_dir else None)
    tokens_per_step = cfg.global_batch_samples * cfg.seq_len

    async_copies = not faults.unpinned_copies  # pinned and not waited for, unless the fault is on
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        faults.step = step
        batches, data_s = [], 0.0
        if needs_data:
            with phase("data", stage=stage):
                for _ in range(cfg.microbatches):
                    tokens, targets = next(loader_iter)
                    batches.append(
                        (tokens.to(device, non_blocking=async_copies), targets.to(device, non_blocking=async_copies))
                    )
            data_s = time.perf_counter() - t0
        buckets.zero_grad()
        runner.start_step(batches)
        run_schedule(cfg.schedule, runner, p2p, cfg.microbatches, cfg.pp, stage)
        with phase("grad_sync", stage=stage):
            buckets.wait()
            faults.extra_comm(mesh.dp_group if mesh.dp > 1 else None)
        with phase("optimizer", stage=stage):
            faults.offload_states()
            faults.slow_step()
            optimizer.step()
        loss = global_mean_loss(runner, cfg, mesh) if mesh.is_last_stage else None
        # no device sync per step on CUDA: the host runs ahead, as in real training, so
        # step_time_s is the host's (equal to the device's once the queue backs up)
        step_time_s = time.perf_counter() - t0
        faults.after_step(step, step_time_s)
        if mesh.logs_loss:
            log.add(
                {
                    "step": step,
                    "step_time_s": round(step_time_s, 6),
                    "tokens_per_s": round(tokens_per_step / step_time_s, 3),
                    "end_unix_s": round(time.time(), 4),
                },
                loss,
            )
        debug.write(
            {
                "step": step,
                "rank": mesh.rank,
                "dp_rank": mesh.dp_rank,
                "pp_rank": mesh.pp_rank,
                "tp_rank": mesh.tp_rank,
                "max_inflight_activations": runner.max_inflight,
                "optimizer_state_numel": optimizer_state_numel(optimizer),
                "param_numel": sum(p.numel() for p in model.parameters()),
                "step_time_s": round(step_time_s, 6),
                "end_unix_s": round(time.time(), 6),  # a job's step ends on its last rank
                "compute_s": round(runner.compute_s, 6),
                "fault_compute_s": round(faults.take_added_compute_s(), 6),
                "data_s": round(data_s, 6),
            }
        )
    log.close()
    debug.close()
    if faults.checkpointer is not None:
        faults.checkpointer.close()  # an async upload still running finishes first
    dist.barrier()  # torn down together (samples/ddp_mlp.py says why)
    dist.destroy_process_group()


def optimizer_state_numel(optimizer) -> int:
    if isinstance(optimizer, ZeroAdamW):
        return optimizer.state_numel()
    return sum(t.numel() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
