"""Typed run configuration and its command line."""

import argparse
from dataclasses import dataclass, field

from reference_trainer.faults import FaultSpec, parse_fault
from reference_trainer.p2p import P2P_MODES


@dataclass
class TrainConfig:
    # parallel layout: world = dp * pp * tp, tp innermost
    dp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    p2p_mode: str = "separate"  # how pipeline sends and receives are posted (reference_trainer/p2p.py)
    microbatches: int = 4
    layers_per_stage: tuple[int, ...] | None = None
    zero1: bool = False
    precision: str | None = None  # None: bf16 on CUDA, fp32 on CPU
    bucket_cap_mb: float = 0.25  # small, so even the tiny default model has several buckets
    # run
    steps: int = 20
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    faults: list[FaultSpec] = field(default_factory=list)
    log_jsonl: str | None = None
    debug_dir: str | None = None
    pg_timeout_s: float = 1800.0  # the process group's timeout (its backend's watchdog)
    # CPU only: a forward lasts this long per sample (a backward twice), or its host
    # compute if longer, as a rank waits for its own accelerator: compute that scales with
    # the micro-batch and does not contend for the host's cores, so a benchmark of 8 ranks
    # on 2 cores keeps a "device" per rank (faults.py compute_ends)
    emulated_device_ms_per_sample: float = 0.0
    # model
    layers: int = 4
    d_model: int = 64
    heads: int = 4
    seq_len: int = 64
    vocab: int = 256
    micro_batch_size: int = 2
    # data
    data: str | None = None
    num_workers: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def global_batch_samples(self) -> int:
        return self.dp * self.microbatches * self.micro_batch_size

    def stage_layer_ranges(self) -> list[tuple[int, int]]:
        """[lo, hi) block indices per pipeline stage."""
        counts = self.layers_per_stage
        if counts is None:
            base, extra = divmod(self.layers, self.pp)
            # the earlier stages take the remainder: the last stage also runs the head and loss
            counts = tuple(base + (1 if s < extra else 0) for s in range(self.pp))
        ranges, lo = [], 0
        for n in counts:
            ranges.append((lo, lo + n))
            lo += n
        return ranges

    def validate(self) -> None:
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(msg)

        need(
            min(self.dp, self.tp, self.pp, self.microbatches, self.steps) >= 1,
            "dp, tp, pp, microbatches and steps must be >= 1",
        )
        need(self.schedule in ("afab", "1f1b"), f"unknown schedule {self.schedule!r}")
        need(self.p2p_mode in P2P_MODES, f"unknown p2p mode {self.p2p_mode!r}")
        need(
            self.p2p_mode == "separate" or not any(f.name == "blocking_p2p" for f in self.faults),
            "the blocking_p2p fault waits each operation of the separate mode at once: use it with --p2p-mode separate",
        )
        need(self.precision in (None, "fp32", "bf16"), f"unknown precision {self.precision!r}")
        need(self.d_model % self.heads == 0, "d_model must be a multiple of heads")
        need(self.heads % self.tp == 0, "heads must be a multiple of tp")
        need(self.vocab <= 65536, "tokens are stored as uint16")
        if self.layers_per_stage is not None:
            need(len(self.layers_per_stage) == self.pp, "--layers-per-stage needs one count per stage")
            need(sum(self.layers_per_stage) == self.layers, "--layers-per-stage must sum to --layers")
            need(min(self.layers_per_stage) >= 1, "every stage needs at least one layer")
        else:
            need(self.layers >= self.pp, "need at least one layer per pipeline stage")
        # ZeRO-1's reduce-scatter divides the accumulating buffer at every round
        need(
            not (self.zero1 and any(f.name == "accum_sync" for f in self.faults)),
            "the accum_sync fault needs the all-reduce path (not --zero1)",
        )


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m reference_trainer", description=__doc__)
    g = p.add_argument_group("parallel layout")
    g.add_argument("--dp", type=int, default=d.dp)
    g.add_argument("--tp", type=int, default=d.tp)
    g.add_argument("--pp", type=int, default=d.pp)
    g.add_argument("--schedule", choices=("afab", "1f1b"), default=d.schedule)
    g.add_argument(
        "--p2p-mode",
        choices=P2P_MODES,
        default=d.p2p_mode,
        help="pipeline sends/receives: a batch per neighbour (separate), one batch with both "
        "neighbours (batched), or each alone with receives posted ahead (preposted)",
    )
    g.add_argument("--microbatches", type=int, default=d.microbatches, help="micro-batches per step on each dp rank")
    g.add_argument("--layers-per-stage", default=None, help="comma-separated block counts, e.g. 1,1,1,5")
    g.add_argument("--zero1", action="store_true", help="shard optimizer state over dp (ZeRO-1)")
    g.add_argument(
        "--precision", choices=("fp32", "bf16"), default=None, help="default: bf16 autocast on CUDA, fp32 on CPU"
    )
    g.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=int, default=d.steps)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME:k=v,...",
        help="inject a fault (repeatable); see reference_trainer/faults.py",
    )
    g.add_argument("--log-jsonl", default=None, help="one JSON object per step, from the loss rank")
    g.add_argument("--debug-dir", default=None, help="per-rank JSONL of step ends, schedule and memory stats")
    g.add_argument(
        "--pg-timeout-s",
        type=float,
        default=d.pg_timeout_s,
        help="how long a collective waits before the backend raises (torch's default 30 min)",
    )
    g.add_argument(
        "--emulated-device-ms-per-sample",
        type=float,
        default=d.emulated_device_ms_per_sample,
        help="CPU only: each forward also waits this long per sample (backward twice), as for "
        "a rank's own accelerator (benchmarks of many ranks on few cores)",
    )
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--d-model", type=int, default=d.d_model)
    g.add_argument("--heads", type=int, default=d.heads)
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--vocab", type=int, default=d.vocab)
    g.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=None, help="uint16 token file; generated when omitted")
    g.add_argument("--num-workers", type=int, default=d.num_workers)
    return p


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    a = build_parser().parse_args(argv)
    lps = tuple(int(x) for x in a.layers_per_stage.split(",")) if a.layers_per_stage else None
    cfg = TrainConfig(
        dp=a.dp,
        tp=a.tp,
        pp=a.pp,
        schedule=a.schedule,
        p2p_mode=a.p2p_mode,
        microbatches=a.microbatches,
        layers_per_stage=lps,
        zero1=a.zero1,
        precision=a.precision,
        bucket_cap_mb=a.bucket_cap_mb,
        steps=a.steps,
        seed=a.seed,
        lr=a.lr,
        weight_decay=a.weight_decay,
        faults=[parse_fault(f) for f in a.fault],
        log_jsonl=a.log_jsonl,
        debug_dir=a.debug_dir,
        pg_timeout_s=a.pg_timeout_s,
        emulated_device_ms_per_sample=a.emulated_device_ms_per_sample,
        layers=a.layers,
        d_model=a.d_model,
        heads=a.heads,
        seq_len=a.seq_len,
        vocab=a.vocab,
        micro_batch_size=a.micro_batch_size,
        data=a.data,
        num_workers=a.num_workers,
    )
    cfg.validate()
    return cfg
