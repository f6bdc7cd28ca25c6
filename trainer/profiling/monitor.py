"""One system sampler per host, writing SageMaker Debugger's own system-metric records.

Local rank 0 of each node starts it (the other ranks share the host, so a second sampler would
only count the same cores twice). A daemon thread wakes every `interval_ms` (Debugger's allowed
ProfilingIntervalInMilliseconds: 100, 200, 500, 1000, 5000, 60000) and appends one JSON line per
metric to `profile/system/<node>.jsonl`, flushed at once so the file can be read while the job
runs:

    {"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 48.0,
     "NodeId": "algo-1", "Timestamp": 1764687600.5}

Debugger's dimensions (`CPUUtilization` per core, `GPUUtilization` and `GPUMemoryUtilization` per
GPU, `I/OWaitPercentage`) are written exactly so; what Debugger learns from its framework
profiler instead (data-loader processes) and what it has no record for (memory, disk, network)
gets dimensions of our own, with the same shape:

- `DataLoaderWorkersCPUUtilization` (percent of one core, summed over the workers: descendants of
  the training processes, but for multiprocessing's fork server and resource tracker; the workers
  are the fork server's children), `DataLoaderWorkers` (how many there are) and `TrainingProcesses`
  (how many training processes this host runs; each iterates its loader);
- `MemoryUtilization` (percent of RAM in use);
- `DiskReadBytesPerSecond`, `DiskWriteBytesPerSecond`, `NetworkReceiveBytesPerSecond`,
  `NetworkSendBytesPerSecond`.

psutil does the work where it is installed. Without it, CPU per core, I/O wait and memory come
from `/proc` (Linux), and the rest is logged once as not available. GPUs: NVML through `pynvml`
(nvidia-ml-py) if importable, else `nvidia-smi --query-gpu=... --format=csv`, else none.
Every sample's records share one timestamp, so they form one Debugger "snapshot".
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("trainer.profiling")

ALLOWED_INTERVALS_MS = (100, 200, 500, 1000, 5000, 60000)
DEFAULT_INTERVAL_MS = 500

# psutil has no type stubs here, and the trainer must run without it: import it as a value.
psutil: Any
try:
    psutil = importlib.import_module("psutil")
except ImportError:  # pragma: no cover - psutil is in the environment we test with
    psutil = None

Record = dict[str, Any]
# (busy, total, iowait) jiffies or seconds for one CPU line.
CpuTimes = tuple[float, float, float]


def check_interval(interval_ms: int) -> int:
    """The interval, if SageMaker's ProfilerConfig would accept it; a clear error otherwise."""
    if interval_ms not in ALLOWED_INTERVALS_MS:
        allowed = ", ".join(str(value) for value in ALLOWED_INTERVALS_MS)
        raise ValueError(f"profiling interval {interval_ms} ms is not one of {allowed} ms")
    return interval_ms


def system_file(profile_dir: Path, node_id: str) -> Path:
    return profile_dir / "system" / f"{node_id}.jsonl"


def node_id() -> str:
    """SageMaker's host name (`algo-1`, ...) from SM_CURRENT_HOST; the host name elsewhere."""
    return os.environ.get("SM_CURRENT_HOST") or os.uname().nodename or "localhost"


def training_pids() -> list[int]:
    """This host's training processes: torchrun's children when torchrun launched us."""
    me = os.getpid()
    if psutil is None or "LOCAL_WORLD_SIZE" not in os.environ:
        return [me]
    try:
        agent = psutil.Process(me).parent()
        pids = [child.pid for child in agent.children()] if agent is not None else []
    except psutil.Error:
        return [me]
    return pids if me in pids else [me, *pids]


# --- CPU ---------------------------------------------------------------------------------------


def _cpu_times() -> dict[str, CpuTimes]:
    """Cumulative (busy, total, iowait) per core (`cpu0`, ...) and for all cores (`cpu`)."""
    if psutil is not None:
        per_core = psutil.cpu_times(percpu=True)
        times = {f"cpu{index}": _from_psutil(core) for index, core in enumerate(per_core)}
        times["cpu"] = _from_psutil(psutil.cpu_times())
        return times
    return _proc_stat()


def _from_psutil(core: Any) -> CpuTimes:
    fields = core._asdict()
    # guest time is already counted in user time (as in /proc/stat).
    total = sum(value for name, value in fields.items() if not name.startswith("guest"))
    idle = fields.get("idle", 0.0)
    iowait = fields.get("iowait", 0.0)
    return total - idle - iowait, total, iowait


def _proc_stat() -> dict[str, CpuTimes]:
    times: dict[str, CpuTimes] = {}
    try:
        lines = Path("/proc/stat").read_text(encoding="ascii").splitlines()
    except OSError:
        return times
    for line in lines:
        if not line.startswith("cpu"):
            continue
        name, *raw = line.split()
        values = [float(value) for value in raw[:8]]
        total = sum(values)
        idle, iowait = values[3], values[4] if len(values) > 4 else 0.0
        times[name] = (total - idle - iowait, total, iowait)
    return times


def _percent(part: float, whole: float) -> float:
    return round(max(0.0, min(100.0, 100.0 * part / whole)), 2) if whole > 0 else 0.0


def _memory_percent() -> float | None:
    if psutil is not None:
        return float(psutil.virtual_memory().percent)
    try:
        info = {
            line.split(":")[0]: float(line.split()[1])
            for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines()
        }
    except (OSError, ValueError, IndexError):
        return None
    total, available = info.get("MemTotal", 0.0), info.get("MemAvailable", 0.0)
    return _percent(total - available, total)


# --- GPUs --------------------------------------------------------------------------------------

GpuReading = tuple[float, float]  # (utilization %, memory used / total %)


def _nvml() -> Callable[[], list[GpuReading]] | None:
    try:
        nvml: Any = importlib.import_module("pynvml")
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:  # no NVML library, no driver, no GPU: all mean "not this way"
        return None

    def read() -> list[GpuReading]:
        readings = []
        for handle in handles:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            readings.append((utilization, _percent(float(memory.used), float(memory.total))))
        return readings

    return read


def parse_nvidia_smi(text: str) -> list[GpuReading]:
    """`utilization.gpu, memory.used, memory.total` lines (csv, noheader, nounits)."""
    readings = []
    for line in text.strip().splitlines():
        try:
            utilization, used, total = (float(part) for part in line.split(","))
        except ValueError:
            continue
        readings.append((utilization, _percent(used, total)))
    return readings


def _nvidia_smi() -> Callable[[], list[GpuReading]] | None:
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    query = [
        command,
        "--query-gpu=utilization.gpu,memory.used,memory.total",
        "--format=csv,noheader,nounits",
    ]

    def read() -> list[GpuReading]:
        try:
            done = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)  # noqa: S603
        except (OSError, subprocess.SubprocessError):
            return []
        return parse_nvidia_smi(done.stdout)

    return read if read() else None


def gpu_reader() -> tuple[str, Callable[[], list[GpuReading]] | None]:
    """How this host's GPUs are read: ("nvml" | "nvidia-smi" | "none", reader)."""
    for name, make in (("nvml", _nvml), ("nvidia-smi", _nvidia_smi)):
        reader = make()
        if reader is not None:
            return name, reader
    return "none", None


# --- the sampler -------------------------------------------------------------------------------


class SystemMonitor:
    """Samples this host in a background thread; `start()`, then `stop()` (or use `with`)."""

    def __init__(
        self,
        profile_dir: Path,
        *,
        node: str | None = None,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        pids: Sequence[int] | None = None,
        gpus: bool = True,
    ) -> None:
        self.interval_ms = check_interval(interval_ms)
        self.node = node or node_id()
        self.path = system_file(profile_dir, self.node)
        self._pids = list(pids) if pids is not None else None
        self.gpu_source, self._gpu = gpu_reader() if gpus else ("none", None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: TextIO | None = None
        self._last_cpu: dict[str, CpuTimes] = {}
        self._last_io: tuple[float, dict[str, float]] | None = None
        self._processes: dict[int, Any] = {}
        self._helpers: dict[int, bool] = {}  # pid -> whether it is a multiprocessing helper
        # What sampling itself cost: CPU seconds of the sampling thread, and samples taken.
        self.cpu_seconds = 0.0
        self.samples = 0
        if psutil is None:
            log.warning(
                "psutil is not available: CPU and memory come from /proc; data-loader, disk and "
                "network metrics are not recorded"
            )

    def start(self) -> SystemMonitor:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._last_cpu = _cpu_times()
        self._last_io = self._io_counters()
        self._thread = threading.Thread(target=self._run, name="system-monitor", daemon=True)
        self._thread.start()
        log.info(
            "system monitor on %s every %d ms (GPUs: %s) -> %s",
            self.node,
            self.interval_ms,
            self.gpu_source,
            self.path,
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> SystemMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        period = self.interval_ms / 1000.0
        next_tick = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            began = time.thread_time()
            try:
                records = self.sample()
                self._write(records)
            except Exception:
                # A broken sample must never take the training job down with it.
                log.exception("system monitor: sample failed")
            self.cpu_seconds += time.thread_time() - began
            self.samples += 1
            next_tick += period
            # Fell behind (a stalled host): skip the missed ticks rather than burst.
            next_tick = max(next_tick, time.monotonic())

    def _write(self, records: list[Record]) -> None:
        if self._file is None or not records:
            return
        lines = (json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        self._file.write("".join(lines))
        self._file.flush()

    def sample(self) -> list[Record]:
        """One snapshot: every metric of this host, one timestamp."""
        now = time.time()
        records: list[Record] = []

        def add(kind: str, name: str, dimension: str, value: float) -> None:
            records.append(
                {
                    "Type": kind,
                    "Name": name,
                    "Dimension": dimension,
                    "Value": round(float(value), 3),
                    "NodeId": self.node,
                    "Timestamp": round(now, 3),
                }
            )

        current = _cpu_times()
        for name, (busy, total, iowait) in current.items():
            before = self._last_cpu.get(name)
            if before is None:
                continue
            busy_delta, total_delta = busy - before[0], total - before[1]
            if name == "cpu":
                add("cpu", "cpu", "I/OWaitPercentage", _percent(iowait - before[2], total_delta))
            else:
                add("cpu", name, "CPUUtilization", _percent(busy_delta, total_delta))
        self._last_cpu = current

        memory = _memory_percent()
        if memory is not None:
            add("memory", "memory", "MemoryUtilization", memory)
        workers = self._loader_workers()
        if workers is not None:
            add("process", "dataloader", "DataLoaderWorkers", workers[0])
            add("process", "dataloader", "DataLoaderWorkersCPUUtilization", workers[1])
            add("process", "training", "TrainingProcesses", workers[2])
        io = self._io_counters()
        if io is not None and self._last_io is not None:
            seconds = max(1e-6, io[0] - self._last_io[0])
            for dimension, value in io[1].items():
                kind = "network" if dimension.startswith("Network") else "io"
                rate = max(0.0, value - self._last_io[1].get(dimension, value)) / seconds
                add(kind, "disk" if kind == "io" else "network", dimension, rate)
        self._last_io = io
        if self._gpu is not None:
            for index, (utilization, memory_used) in enumerate(self._gpu()):
                add("gpu", f"gpu{index}", "GPUUtilization", utilization)
                add("gpu", f"gpu{index}", "GPUMemoryUtilization", memory_used)
        return records

    def _io_counters(self) -> tuple[float, dict[str, float]] | None:
        if psutil is None:
            return None
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk is not None:
            counters["DiskReadBytesPerSecond"] = float(disk.read_bytes)
            counters["DiskWriteBytesPerSecond"] = float(disk.write_bytes)
        net = psutil.net_io_counters()
        if net is not None:
            counters["NetworkReceiveBytesPerSecond"] = float(net.bytes_recv)
            counters["NetworkSendBytesPerSecond"] = float(net.bytes_sent)
        return time.monotonic(), counters

    def _loader_workers(self) -> tuple[int, float, int] | None:
        """(how many, percent of one core summed) for the training processes' children, and how
        many training processes are alive."""
        if psutil is None:
            return None
        pids = self._pids if self._pids is not None else training_pids()
        seen: dict[int, Any] = {}
        helpers: dict[int, bool] = {}
        alive = 0
        for pid in pids:
            try:
                children = psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
            alive += 1
            for child in children:
                known = self._helpers.get(child.pid)
                helpers[child.pid] = _multiprocessing_helper(child, pids) if known is None else known
                if not helpers[child.pid]:
                    # Keep the Process objects: cpu_percent() measures since the previous call.
                    seen[child.pid] = self._processes.get(child.pid, child)
        self._helpers = helpers
        total = 0.0
        for process in seen.values():
            try:
                total += process.cpu_percent(interval=None)
            except psutil.Error:
                continue
        self._processes = seen
        return len(seen), round(total, 2), alive


# How multiprocessing starts its helpers (`python -c "from multiprocessing.<module> import main; ..."`).
_HELPER_COMMANDS = ("from multiprocessing.forkserver import main", "from multiprocessing.resource_tracker import main")


def _multiprocessing_helper(process: Any, training: Sequence[int]) -> bool:
    """A training process's fork server (`loader.START_METHOD`) or resource tracker: no loader
    worker. The workers, forked from the fork server, share its command line but not its parent."""
    try:
        if process.ppid() not in training:
            return False
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return any(helper in command for helper in _HELPER_COMMANDS)
