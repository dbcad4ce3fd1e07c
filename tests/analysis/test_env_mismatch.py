"""Issue 21, "each rank's environment": the per-rank probe (meta.json: env) and
the env_mismatch detector, on hand-written metadata and on a real 4-rank gloo job."""

import json
import subprocess
import textwrap
import types

from collectors.instrument import rank_environment
from diagnose.analysis.detectors import env_mismatch, finding_kinds
from tests.support.jobs import PYTHON, REPO, job_env, load_run, run_diagnose, torchrun

# The training script of the acceptance test. Differences are planted where the
# probe reads them, by the script itself on one rank each, before its first step
# (the probe that counts runs on the writer thread after the first step has ended):
# rank 1 sets another NCCL_SOCKET_NTHREADS in its own environment, rank 2 reports
# another torch version (torch.__version__, what the probe reads). Controls that
# must not count: rank 3 lists NCCL_SOCKET_IFNAME in another order, and every rank
# has its own NCCL_DEBUG_FILE (a path differs per rank by design).
SCRIPT = textwrap.dedent("""
    import os
    import time
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    os.environ["NCCL_DEBUG_FILE"] = f"/tmp/nccl-{rank}.log"
    if rank == 1:
        os.environ["NCCL_SOCKET_NTHREADS"] = "2"
    if rank == 2:
        torch.__version__ = "2.0.0+planted"
    if rank == 3:
        os.environ["NCCL_SOCKET_IFNAME"] = "eth1,eth0"
    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        time.sleep(0.1)  # the scenario: steps long enough for the samplers to see them
    dist.barrier()  # every rank done before any destroys the group (gloo aborts a peer still in it)
    dist.destroy_process_group()
""")


def test_four_rank_job_with_planted_differences_has_one_finding_naming_both(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = job_env(NCCL_SOCKET_NTHREADS=4, NCCL_SOCKET_IFNAME="eth0,eth1")
    run_diagnose(["run", "--out", out, "--", *torchrun(4, script)], env=env, timeout=120)

    metas = {r: json.loads((out / "traces" / f"rank-0000{r}" / "meta.json").read_text()) for r in range(4)}
    for rank, meta in metas.items():
        probed = meta["env"]
        assert probed["probed"] in ("first_step", "exit"), probed  # after user code, not before
        assert probed["versions"]["torch"] == ("2.0.0+planted" if rank == 2 else metas[0]["env"]["versions"]["torch"])
        assert probed["nccl_env"]["NCCL_SOCKET_NTHREADS"] == ("2" if rank == 1 else "4")
        assert isinstance(probed["net_interfaces"], list) and isinstance(probed["ib_devices"], list)
        assert "nccl" in probed["absent"]  # a CPU job: CUDA never initialised, so no NCCL version asked
        assert not any(e["collector"] == "rank_environment" for e in meta["collector_errors"])

    findings = json.loads((out / "analysis" / "findings.json").read_text())
    found = [f for f in findings if f["kind"] == "env_mismatch"]
    assert len(found) == 1, findings
    finding = found[0]
    assert finding["ranks"] == [1, 2]
    assert finding["severity"] == "critical"  # a torch version split
    assert "torch 2.0.0+planted on rank 2" in finding["title"]
    assert "NCCL_SOCKET_NTHREADS=2 on rank 1" in finding["title"]
    assert finding["metrics"]["torch_ranks_differing"] == 1
    assert finding["metrics"]["NCCL_SOCKET_NTHREADS_ranks_differing"] == 1
    assert finding["metrics"]["differences"] == 2  # not the interface order, not the per-rank path
    assert "IFNAME" not in finding["title"] and "DEBUG_FILE" not in finding["title"]
    assert load_run(out).rank_meta[2]["env"]["versions"]["torch"] == "2.0.0+planted"


# -- the detector on hand-written metadata ---------------------------------------
def _env(**over):
    env = {
        "probed": "first_step",
        "versions": {
            "python": "3.12.3",
            "torch": "2.11.0",
            "cuda": "13.0",
            "nccl": "2.27.3",
            "driver": "580.65",
            "cuda_driver": "13.0",
        },
        "nccl_env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG_FILE": "/tmp/x"},
        "gpu": {"model": "NVIDIA H200", "app_sm_clock_mhz": 1980, "ecc": {"current": True, "pending": True}},
        "net_interfaces": ["eth0", "ib0"],
        "ib_devices": ["mlx5_0", "mlx5_1"],
        "absent": {},
    }
    env.update(over)
    return env


def test_a_rank_without_infiniband_devices_is_critical():
    envs = {r: _env() for r in range(8)}
    envs[5] = _env(ib_devices=[])
    [finding] = env_mismatch.mismatch_findings(envs, hosts={r: f"node{r // 4}" for r in range(8)})
    assert finding.kind == "env_mismatch" and finding.ranks == [5] and finding.severity == "critical"
    assert "no InfiniBand device on rank 5" in finding.title and "sockets" in finding.title
    assert finding.metrics["ib_devices_missing_ranks_differing"] == 1
    assert "node1" in finding.recommendation


def test_identical_ranks_and_legitimate_differences_are_no_finding():
    envs = {r: _env() for r in range(4)}
    assert env_mismatch.mismatch_findings(envs) == []
    # what differs per rank by design, or is merely unknown, is no difference either
    envs[1] = _env(
        nccl_env={"NCCL_IB_HCA": "mlx5_1,mlx5_0", "NCCL_DEBUG_FILE": "/tmp/y"},
        net_interfaces=["ib0", "eth0", "docker0"],
    )
    envs[2] = _env(versions={"python": "3.12.3"}, gpu={}, absent={"torch": "torch not imported yet"})
    envs[3] = _env(ib_devices=["mlx5_0", "mlx5_1", "mlx5_2"])  # more devices than its peers: harmless
    assert env_mismatch.mismatch_findings(envs) == []


def test_warnings_ties_and_rank_ranges():
    envs = {r: _env() for r in range(16)}
    for r in range(8, 16):  # one node of eight set NCCL_ALGO, and has another driver
        envs[r] = _env(
            nccl_env={**_env()["nccl_env"], "NCCL_ALGO": "Tree"}, versions={**_env()["versions"], "driver": "570.1"}
        )
    [finding] = env_mismatch.mismatch_findings(envs)
    assert finding.severity == "warning" and finding.ranks == list(range(8, 16))  # tie: rank 0's side wins
    assert "NCCL_ALGO=Tree on ranks 8-15 (the others: NCCL_ALGO unset)" in finding.title
    assert "driver 570.1 on ranks 8-15" in finding.title
    assert finding.metrics["differences"] == 2


def test_detect_reads_rank_meta_and_is_registered():
    assert "env_mismatch" in finding_kinds.names()
    run = types.SimpleNamespace(
        rank_meta={
            0: {"env": _env()},
            1: {"env": _env(versions={"nccl": "2.21.5"})},
            2: {"env": _env()},
            3: {},
            4: {"env": "garbage"},
        }
    )
    [finding] = env_mismatch.detect(types.SimpleNamespace(run=run))
    assert finding.ranks == [1] and "NCCL 2.21.5 on rank 1 (the others: NCCL 2.27.3)" in finding.title


# -- the probe ---------------------------------------------------------------------
class FakeNvml:
    """pynvml's names, as rank_environment calls them."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"580.65.06"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetMaxClockInfo(self, h, c):
        return 1980 if c == 1 else 3201

    def nvmlDeviceGetApplicationsClock(self, h, c):
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetEccMode(self, h):
        return (1, 1)

    def nvmlDeviceGetUUID(self, h):
        return "GPU-8f6c1d2e-1b7a-4c1e-9a0b-3d5e7f9a1b2c"

    def nvmlDeviceGetSerial(self, h):
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetIndex(self, h):
        return h[1]

    def nvmlDeviceGetPciInfo(self, h):
        return type("nvmlPciInfo_t", (), {"busId": b"00000000:18:00.0"})()


def test_probe_guards_every_part(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    facts = rank_environment.nvml_facts(FakeNvml())
    assert facts["versions"] == {"driver": "580.65.06", "cuda_driver": "13.0"}
    assert facts["gpu"] == {
        "model": "NVIDIA H200",
        "uuid": "GPU-8f6c1d2e-1b7a-4c1e-9a0b-3d5e7f9a1b2c",
        "index": 0,
        "pci_bus_id": "00000000:18:00.0",
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 3201,
        "ecc": {"current": True, "pending": True},
    }
    assert "app_sm_clock_mhz" in facts["absent"] and "serial" in facts["absent"]  # unsupported: absent, why

    class Broken:
        def nvmlInit(self):
            raise OSError("no driver")

    monkeypatch.setenv("NCCL_PROTO", "Simple")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    (tmp_path / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "net" / "lo").mkdir()
    env = rank_environment.probe(
        "start", rank_environment.nvml_facts(Broken()), sys_net=str(tmp_path / "net"), sys_ib=str(tmp_path / "absent")
    )
    assert env["net_interfaces"] == ["eth0"] and env["ib_devices"] == []
    assert env["nccl_env"]["NCCL_PROTO"] == "Simple" and env["nccl_env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "gpu" not in env and "driver" not in env["versions"] and "NVML" in env["absent"]["driver"]
    (tmp_path / "ibfile").write_text("")  # listing fails (not a directory): absent, not empty
    env = rank_environment.probe("start", {}, sys_ib=str(tmp_path / "ibfile"))
    assert "ib_devices" not in env and "ib_devices" in env["absent"]


def test_probe_never_imports_torch():
    code = (
        "import sys; from collectors.instrument import rank_environment as r; "
        "e = r.probe('start'); assert 'torch' not in sys.modules, 'imported torch'; "
        "assert e['absent']['torch'] == 'torch not imported yet'; "
        # once the script has imported it, the same probe reads it (so the check can fail)
        "import torch; assert r.probe('first_step')['versions']['torch'] == torch.__version__"
    )
    subprocess.run([PYTHON, "-c", code], cwd=REPO, check=True, env=job_env(), timeout=60)
