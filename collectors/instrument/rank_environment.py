"""What makes this rank differ from its peers: versions, NCCL settings, GPU and
network hardware. Written into meta.json as `env` (docs/run-directory.md) and
compared across ranks by the env_mismatch detector.

Not an instrumentor (it is not in INSTRUMENTORS): nothing here hooks torch. The
recorder's writer thread calls `probe` (Recorder._probe_env), never the
training thread, so the hot path pays nothing:

* once when the writer starts (before the user's script has run: torch is not
  imported yet, so its versions are absent; a rank killed before its first
  step still says which driver, NCCL settings and InfiniBand devices it had);
* again once the first optimizer step has ended (or at the hang dump, or at
  exit, whichever comes first). By then the script has imported torch, set any
  `NCCL_*` variable it sets itself, and created its process group, so this is
  what NCCL actually read. It replaces the first probe.

Every probe is guarded: what fails or cannot be known is left out of its
section and its reason goes into `env.absent` (a reader treats a missing value
as unknown, never as a difference). Rules that keep the user's job as it is:

* torch is read from `sys.modules`, never imported (activate.py: importing it
  before the script would freeze thread counts and CUDA_VISIBLE_DEVICES);
* the NCCL version is asked only when the script has initialised CUDA
  (`torch.cuda.is_initialized()`): asking `is_available()` ourselves could
  initialise CUDA in a process that never meant to use it;
* NVML (pynvml, from nvidia-ml-py) is initialised and shut down here (NVML
  counts its users, so the sampler's own handle is unaffected); it reads the
  driver without touching CUDA.
"""

import os
import socket
import sys
import time

SYS_NET = "/sys/class/net"
SYS_INFINIBAND = "/sys/class/infiniband"
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_")


def probe(stage: str, nvml_part: dict | None = None, sys_net: str = SYS_NET, sys_ib: str = SYS_INFINIBAND) -> dict:
    """This rank's environment now. `nvml_part`: the result of an earlier
    `nvml_facts()` to reuse (the driver and the board do not change while the
    process runs, and NVML initialisation costs up to a few hundred ms on a
    large node)."""
    absent: dict = {}
    versions = {"python": ".".join(map(str, sys.version_info[:3]))}
    versions.update(_guard(absent, "torch", torch_versions, absent))
    nvml = nvml_part if nvml_part is not None else nvml_facts()
    versions.update(nvml.get("versions", {}))
    absent.update(nvml.get("absent", {}))
    env = {"probed": stage, "wall_ns": time.time_ns(), "versions": versions, "nccl_env": nccl_env()}
    if nvml.get("gpu"):
        env["gpu"] = nvml["gpu"]
    interfaces = _guard(absent, "net_interfaces", net_interfaces, sys_net)
    if interfaces is not None:
        env["net_interfaces"] = interfaces
    ib = _guard(absent, "ib_devices", ib_devices, sys_ib)
    if ib is not None:
        env["ib_devices"] = ib
    env["absent"] = absent
    return env


def _guard(absent: dict, name: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # a probe never fails the job: the value is absent
        absent[name] = f"{type(exc).__name__}: {exc}"
        return {} if name == "torch" else None


def nccl_env() -> dict:
    """Every NCCL_*, TORCH_NCCL_* and TORCH_FR_* variable of this process, as set now."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def torch_versions(absent: dict) -> dict:
    torch = sys.modules.get("torch")
    if torch is None:
        absent["torch"] = "torch not imported yet"
        return {}
    out = {"torch": str(torch.__version__)}
    version = getattr(torch, "version", None)
    cuda = getattr(version, "cuda", None)
    if cuda:
        out["cuda"] = str(cuda)
    else:
        absent["cuda"] = "CPU-only torch build"
    try:
        initialised = bool(torch.cuda.is_initialized())
    except Exception as exc:
        absent["nccl"] = f"{type(exc).__name__}: {exc}"
        return out
    if not initialised:
        absent["nccl"] = "CUDA not initialised by the job"
        return out
    try:
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:
        absent["nccl"] = f"{type(exc).__name__}: {exc}"
    return out


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_facts(nvml=None) -> dict:
    """{versions: {driver, cuda_driver}, gpu: {...}, absent: {...}} from NVML;
    `nvml`: the pynvml module (a test passes a fake one)."""
    absent: dict = {}
    out = {"versions": {}, "gpu": {}, "absent": absent}
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:
        absent["driver"] = absent["gpu"] = f"NVML: {type(exc).__name__}: {exc}"
        return out
    try:
        _read_nvml(nvml, out, absent)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _read_nvml(nvml, out: dict, absent: dict) -> None:
    versions, gpu = out["versions"], out["gpu"]

    def read(section, key, fn):
        try:
            section[key] = fn()
        except Exception as exc:  # not supported on this board or driver: absent
            absent[key] = f"{type(exc).__name__}: {exc}"

    read(versions, "driver", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    # NVML encodes the driver's CUDA version as 1000 * major + 10 * minor
    read(
        versions, "cuda_driver", lambda: "{}.{}".format(*divmod(int(nvml.nvmlSystemGetCudaDriverVersion()) // 10, 100))
    )
    try:
        from collectors.instrument.nvml_sampler import open_device

        handle = open_device(nvml)
    except Exception as exc:
        absent["gpu"] = f"NVML cannot open this rank's GPU: {type(exc).__name__}: {exc}"
        return
    if handle is None:
        absent["gpu"] = "this rank sees no GPU (CUDA_VISIBLE_DEVICES)"
        return
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    read(gpu, "model", lambda: _text(nvml.nvmlDeviceGetName(handle)))
    # which physical GPU: a culprit named across runs (diagnose/exporters/repeat_offenders.py)
    read(gpu, "uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    read(gpu, "serial", lambda: _text(nvml.nvmlDeviceGetSerial(handle)))
    read(gpu, "index", lambda: int(nvml.nvmlDeviceGetIndex(handle)))
    read(gpu, "pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    read(gpu, "max_sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, sm)))
    read(gpu, "max_mem_clock_mhz", lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, mem)))
    # application clocks are what an admin may lock lower on one node (nvidia-smi -ac)
    read(gpu, "app_sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetApplicationsClock(handle, sm)))
    read(gpu, "app_mem_clock_mhz", lambda: int(nvml.nvmlDeviceGetApplicationsClock(handle, mem)))

    def ecc():
        current, pending = nvml.nvmlDeviceGetEccMode(handle)
        return {"current": bool(current), "pending": bool(pending)}

    read(gpu, "ecc", ecc)


def net_interfaces(root: str = SYS_NET) -> list:
    """Interface names, sorted (their order means nothing); loopback left out."""
    try:
        names = os.listdir(root)
    except OSError:
        names = [name for _, name in socket.if_nameindex()]
    return sorted(n for n in names if n != "lo")


def ib_devices(root: str = SYS_INFINIBAND) -> list:
    """InfiniBand / RoCE devices (what NCCL's IB transport uses), sorted. No
    /sys/class/infiniband at all means none (the kernel has no IB device); any
    other error raises and the value is absent, not empty."""
    try:
        return sorted(os.listdir(root))
    except FileNotFoundError:
        return []
