"""Where the per-rank pass runs (diagnose/analysis/load/rank_pass.py): the loader
hands an engine its tasks (rank_batch's arguments: a batch of ranks, the steps
to keep) and gets their tables back in task order; the cross-rank pass (clock
alignment, matching, detectors, what-if) then runs in the calling process,
whatever the engine. Results are the same for every engine
(tests/analysis/test_analysis_engines.py): the per-rank pass is a pure function of the
rank's folder.

    in-process   a few threads (Parquet decoding releases the GIL); the default
    processes    local worker processes: one machine's cores (--processes N)
    dask         Dask distributed: an existing scheduler (--scheduler ADDRESS,
                 e.g. a SLURM or Kubernetes cluster's) or a LocalCluster this
                 process starts (--dask-workers N). The workers read the run
                 directory themselves, so it must be on storage they share
                 (the same path on every worker: NFS, Lustre, a shared volume).
                 A worker lost mid-pass is replaced by Dask, which re-runs its
                 ranks (their results are the same).

Dask is optional (`pip install diagnose[cluster]`): only its engine imports it.
"""

import os
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context

from diagnose.analysis.load.rank_pass import rank_batch
from diagnose.errors import UserError

THREADS_FROM_TASKS = 8  # fewer tasks run one after the other: threads cost more than they save


class InProcess:
    name = "in-process"

    def map_tasks(self, tasks: list, on_done) -> list:
        """rank_batch(*task) for each task, in task order; on_done(index) as each ends."""
        if len(tasks) < THREADS_FROM_TASKS:
            return _in_order((rank_batch(*task) for task in tasks), on_done)
        # On 1,024 ranks the per-file overhead, not the bytes, is what costs.
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            return _in_order(pool.map(rank_batch, *zip(*tasks)), on_done)

    def close(self) -> None:
        pass


class Processes:
    """Local worker processes, started fresh (spawn: no fork of a threaded parent)."""

    def __init__(self, workers: int):
        if workers < 1:
            raise UserError("--processes must be >= 1")
        self.workers = workers
        self.name = f"{workers} local processes"

    def map_tasks(self, tasks: list, on_done) -> list:
        chunk = max(1, len(tasks) // (8 * self.workers))
        try:
            with ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn")) as pool:
                return _in_order(pool.map(rank_batch, *zip(*tasks), chunksize=chunk), on_done)
        except Exception as exc:  # e.g. a worker killed by the OOM killer
            raise UserError(f"the per-rank pass failed in a worker process: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        pass


class Dask:
    """Dask distributed: connect to a scheduler, or start a LocalCluster of `workers` processes."""

    def __init__(self, scheduler: str | None = None, workers: int | None = None, client=None):
        """client: a distributed.Client the caller already has (library use, e.g. in a
        notebook): used as it is and left open by close()."""
        self.cluster, self.own_client = None, client is None
        if client is not None:
            self.client, self.name = client, f"Dask scheduler {client.scheduler.address}"
            return
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise UserError("the Dask engine needs Dask distributed: pip install 'diagnose[cluster]'") from None
        try:
            if scheduler:
                self.client = Client(scheduler, timeout="20s")
                self.name = f"Dask scheduler {scheduler}"
            else:
                if workers is None or workers < 1:
                    raise UserError("--dask-workers must be >= 1")
                self.cluster = LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
                )  # any free port: 8787 may be taken
                self.client = Client(self.cluster)
                self.name = f"Dask LocalCluster of {workers} workers"
        except (OSError, TimeoutError, ValueError) as exc:  # ValueError: not an address
            self.close()
            raise UserError(f"cannot reach the Dask scheduler {scheduler or ''}: {exc}") from None

    @property
    def dashboard(self) -> str | None:
        return self.client.dashboard_link if _has_dashboard() else None

    def map_tasks(self, tasks: list, on_done) -> list:
        from distributed import as_completed

        columns = list(zip(*tasks)) if tasks else [(), ()]
        token = uuid.uuid4().hex[:12]  # keys of this pass only: a cluster outlives passes
        # a task's key names its first rank
        keys = [f"rank_batch-{batch[0][0]}-{token}" for batch in columns[0]]
        futures = self.client.map(rank_batch, *columns, key=keys)
        position = {future.key: i for i, future in enumerate(futures)}
        results = [None] * len(futures)
        try:
            for future in as_completed(futures):  # a result lost with its worker is computed again
                index = position[future.key]
                results[index] = future.result()
                future.release()  # its copy on the worker is no longer needed
                if on_done is not None:
                    on_done(index)
        except Exception as exc:  # e.g. KilledWorker: a rank whose workers died too often
            raise UserError(f"the per-rank pass failed on {self.name}: {type(exc).__name__}: {exc}") from None
        return results

    def close(self) -> None:
        for part in (getattr(self, "client", None) if self.own_client else None, self.cluster):
            if part is not None:
                part.close()


def make_engine(processes: int | None = None, scheduler: str | None = None, dask_workers: int | None = None):
    """The engine the CLI's options ask for (at most one of them)."""
    if sum(option is not None for option in (processes, scheduler, dask_workers)) > 1:
        raise UserError("give one of --processes, --scheduler and --dask-workers")
    if processes is not None:
        return Processes(processes)
    if scheduler is not None or dask_workers is not None:
        return Dask(scheduler, dask_workers)
    return InProcess()


def _in_order(results, on_done) -> list:
    out = []
    for result in results:
        out.append(result)
        if on_done is not None:
            on_done(len(out) - 1)
    return out


def _has_dashboard() -> bool:
    try:
        import bokeh  # noqa: F401  (Dask's dashboard needs it)
    except ImportError:
        return False
    return True
