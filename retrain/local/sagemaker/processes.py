"""The processes of one emulated host, and this machine's cores shared between jobs.

A host is one process group (`start_new_session=True`): the launcher (torchrun) and what it
starts. torchrun starts every worker in a session of its own, so a signal to the launcher's group
does not reach them: every descendant seen while the host runs is remembered, and a kill reaches
each of them (and their groups) even after the launcher is gone. Processes are told apart from a
later one that reuses their PID by their start time.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

# psutil is optional (as for the trainer's monitor); without it /proc does the work on Linux.
psutil: Any
try:
    psutil = importlib.import_module("psutil")
except ImportError:  # pragma: no cover - psutil is in the environment we test with
    psutil = None

STDERR_LINES_KEPT = 200


def identity(pid: int) -> str | None:
    """Something that tells this process from a later one with its PID; None once it is gone
    (a zombie counts as gone: it runs nothing, its parent has only to reap it)."""
    if psutil is not None:
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return str(process.create_time())
        except psutil.Error:
            return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return "alive"
    return None if fields[0] in {"Z", "X"} else fields[19]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now (children, their children, ...)."""
    if psutil is not None:
        try:
            return [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _signal(pid: int, known: str, sig: signal.Signals) -> None:
    if identity(pid) != known:
        return  # gone, or the PID now belongs to someone else
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        os.kill(pid, sig)


class HostProcess:
    """One host's launcher, its output (to `logs.txt` and `on_line`) and its descendants."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        log_file: Path,
        on_line: Callable[[str], None],
        preamble: Sequence[str] = (),
    ) -> None:
        """`preamble`: lines the launcher writes before the script's own (the toolkit's)."""
        self.name = name
        self.argv = argv
        self._on_line = on_line
        self._log = log_file.open("a", encoding="utf-8")
        self._log_lock = threading.Lock()
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self._known: dict[int, str] = {}
        for line in preamble:
            self._write(line + "\n")
        self.popen = subprocess.Popen(  # noqa: S603 (our own interpreter, our own arguments)
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        launcher = identity(self.pid)
        if launcher is not None:
            self._known[self.pid] = launcher
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(stream, is_stderr), name=f"{name}-{label}", daemon=True)
            for stream, is_stderr, label in (
                (self.popen.stdout, False, "stdout"),
                (self.popen.stderr, True, "stderr"),
            )
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], is_stderr: bool) -> None:
        for raw in stream:
            line = self._write(raw)
            if is_stderr:
                self.stderr_tail.append(line)
        stream.close()

    def _write(self, raw: str) -> str:
        line = raw.rstrip("\n")
        with self._log_lock:
            self._log.write(line + "\n")
            self._log.flush()
        self._on_line(line)
        return line

    # ------------------------------------------------------------- watching --
    def poll(self) -> int | None:
        return self.popen.poll()

    def refresh(self) -> None:
        """Remember every descendant running now (call it often while the host runs)."""
        for pid in descendants(self.pid):
            if pid not in self._known and (known := identity(pid)) is not None:
                self._known[pid] = known

    def pids(self) -> list[int]:
        """Every process of this host seen so far, launcher first."""
        return list(self._known)

    def alive(self) -> bool:
        """The launcher, or any process it started, still runs."""
        if self.popen.poll() is None:
            return True
        return any(identity(pid) == known for pid, known in self._known.items())

    # ------------------------------------------------------------- stopping --
    def terminate(self) -> None:
        """SIGTERM to the host's process group (the launcher passes it on to its workers)."""
        self.refresh()
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to every process of the host, and to their groups."""
        if self.popen.poll() is None:
            self.refresh()
        for pid, known in self._known.items():
            _signal(pid, known, signal.SIGKILL)
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self, timeout: float = 10.0) -> None:
        """Reap the launcher and drain its output (after it and its descendants ended)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=timeout)
            if reader.is_alive():
                log.warning("the output of %s is still open after %.0f s", self.name, timeout)
        with self._log_lock:
            self._log.close()


class CorePool:
    """This machine's cores, handed to jobs first come first served: a job starts only once all
    the processes it runs fit (never more than `size` at once)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._free = self.size
        self._queue: deque[object] = deque()
        self._changed = threading.Condition()

    def acquire(self, count: int, *, cancelled: threading.Event, on_wait: Callable[[], None]) -> bool:
        """Take `count` cores, waiting in line; False when `cancelled` is set first."""
        ticket = object()
        waited = False
        with self._changed:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self._free >= count):
                    if cancelled.is_set():
                        return False
                    if not waited:
                        waited = True
                        on_wait()
                    self._changed.wait(timeout=0.2)
                self._free -= count
                return True
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()

    def release(self, count: int) -> None:
        with self._changed:
            self._free = min(self.size, self._free + count)
            self._changed.notify_all()
