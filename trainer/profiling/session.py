"""The profiler as the training loop sees it: start, record steps, maybe stop, finish.

- local rank 0 of every host starts the host's `SystemMonitor`; every rank keeps its step file;
- rank 0 evaluates the rules every `rules_every_seconds` on what its host has written, in a
  background thread (`RuleThread`) that reads the files incrementally into a compact
  `store.ProfileStore`: the training thread never waits for an evaluation. When a rule named in
  `stop_on` finds issues, every rank learns it at the next step boundary after that evaluation
  finished (one broadcast of a flag per step from the training thread, only when some rule may
  stop the run) and leaves the epoch loop together;
- at the end, what lives on other hosts' disks (their system samples, their ranks' steps) travels
  to rank 0 over the process group (`gather_object`): only rank 0's output folder holds the
  report. Rank 0 writes those files under `profile/`, reads what its store lacks, evaluates every
  rule, and writes `rules.json` and `report.html` beside `profile/`;
- `close()` (or leaving a `with` block) stops the threads and closes the files without any
  result or collective, for a run that fails; `finish()` does it first. An interpreter that
  exits without either stops them too (`atexit`).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.profiling import monitor, report, rules, steps, store

log = logging.getLogger("trainer.profiling")

MODES = ("builtin", "off")
# How long close() waits for an evaluation in progress (finish() waits for it to end).
CLOSE_TIMEOUT_SECONDS = 30.0


class RuleThread:
    """Calls `evaluate` every `every_seconds` (counted from the end of the previous call) in a
    daemon thread, until `stop()`. A failing call is logged; the next one still comes."""

    def __init__(self, every_seconds: float, evaluate: Callable[[], object], *, name: str = "profiler-rules") -> None:
        self.every_seconds = every_seconds
        self.evaluations = 0
        self._evaluate = evaluate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> RuleThread:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Asks the thread to end and waits for it (a call in progress finishes first); True
        once it has ended, False if it still runs after `timeout` seconds."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.every_seconds):
            try:
                self._evaluate()
            except Exception:
                # An evaluation that fails must never take the training job down with it.
                log.exception("profiler: the periodic rule evaluation failed; training goes on")
            self.evaluations += 1


class Profiler:
    """One per rank. With mode "off" every method is a cheap no-op."""

    def __init__(
        self,
        output_dir: Path,
        *,
        mode: str = "builtin",
        interval_ms: int = monitor.DEFAULT_INTERVAL_MS,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        rules_every_seconds: float = 0.0,
        stop_on: Sequence[str] = (),
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        loader: Mapping[str, Any] | None = None,
        device: torch.device | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"profiling {mode!r} is not one of {', '.join(MODES)}")
        unknown = sorted(set(stop_on) - set(rules.RULES))
        if unknown:
            raise ValueError(f"--stop-on-rule {unknown}: known rules are {', '.join(rules.RULES)}")
        monitor.check_interval(interval_ms)
        self.enabled = mode == "builtin"
        self.output_dir = output_dir
        self.profile_dir = output_dir / "profile"
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.node = monitor.node_id()
        self.interval_ms = interval_ms
        self.rules_every_seconds = rules_every_seconds
        self.stop_on = tuple(stop_on)
        self.overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        # Refuse a misspelt override now, not after hours of training.
        for name in self.overrides:
            rules.parameters_for(name, self.overrides)
        self.loader = dict(loader or {})
        self.device = device or torch.device("cpu")
        # MaxInitializationTime counts from the process's start, not from ours.
        self.started_at = _process_started()
        self.stopped_by: str | None = None
        self.last_results: list[rules.RuleEvaluation] = []
        self._monitor: monitor.SystemMonitor | None = None
        self._timeline: steps.StepTimeline | None = None
        # Rank 0: what its evaluations have read so far, and the thread that evaluates.
        self._store: store.ProfileStore | None = None
        self._rules_thread: RuleThread | None = None
        # One evaluation at a time: the thread's, a direct evaluate_now(), finish()'s.
        self._evaluating = threading.Lock()
        # The first stopping rule a finished evaluation found; read by should_stop().
        self._verdict: str | None = None
        self._started = False

    def start(self) -> Profiler:
        if not self.enabled or self._started:
            return self
        self._started = True
        if self.local_rank == 0:
            self._monitor = monitor.SystemMonitor(
                self.profile_dir, node=self.node, interval_ms=self.interval_ms
            ).start()
        self._timeline = steps.StepTimeline(self.profile_dir, self.rank, self.node)
        if self.rank == 0 and self.rules_every_seconds > 0:
            self._rules_thread = RuleThread(self.rules_every_seconds, self.evaluate_now).start()
        atexit.register(self.close)
        return self

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(
        self,
        *,
        step: int,
        epoch: int,
        start: float,
        data_wait: float,
        compute: float,
        communication: float,
        loss: float | None = None,
        phase: str = "TRAIN",
    ) -> None:
        """One step's line. `start` is a `time.time()` reading."""
        if self._timeline is not None:
            self._timeline.record(
                step=step,
                epoch=epoch,
                start=start,
                data_wait=data_wait,
                compute=compute,
                communication=communication,
                loss=loss,
                phase=phase,
            )

    def should_stop(self) -> str | None:
        """After a step, on every rank: the rule that stops the run, once one has (else None).

        A collective when some rule may stop the run: every rank must call it at every step.
        It never evaluates: rank 0 sends the verdict of the latest evaluation its background
        thread finished, so every rank stops after the same step, and none waits for the rules.
        """
        if not self.enabled:
            return None
        if self.stopped_by is not None:
            return self.stopped_by
        if not self.stop_on:
            return None
        reason = self._verdict if self.rank == 0 else None
        if _distributed():
            flag = torch.tensor([1 if reason else 0], device=self.device)
            dist.broadcast(flag, src=0)
            if int(flag.item()):
                holder = [reason]
                dist.broadcast_object_list(holder, src=0)
                reason = holder[0]
        self.stopped_by = reason
        return reason

    def evaluate_now(self) -> str | None:
        """Rank 0: the rules on this host's files so far; the first stopping rule that fired.

        The background thread calls it every `rules_every_seconds`; a direct call waits for an
        evaluation in progress. Only the lines appended since the previous evaluation are read.
        `rules.json` and `report.html` are rewritten too, so a running job's are current.
        """
        with self._evaluating:
            data, results = self._judge()
            self.last_results = results
            report.write_outputs(self.output_dir, data, results, metrics=self._metrics())
        for result in results:
            if result.status == "IssuesFound":
                log.warning("rule %s: %s", result.name, result.recommendation)
        for result in results:
            if result.name in self.stop_on and result.status == "IssuesFound":
                if self._verdict is None:
                    log.warning("stopping the run: rule %s found issues (--stop-on-rule)", result.name)
                    self._verdict = result.name
                return result.name
        return None

    def _metrics(self) -> dict[str, Any] | None:
        path = self.output_dir / "metrics.json"
        try:
            document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return document

    def _judge(self) -> tuple[rules.ProfileData, list[rules.RuleEvaluation]]:
        """The rules on what this host's files hold now; only the lines appended since the
        previous call are read. The caller holds `_evaluating`."""
        if self._store is None:
            self._store = store.ProfileStore(self.profile_dir)
        self._store.refresh()
        data = rules.ProfileData(
            system=self._store.system,
            steps=self._store.steps,
            started_at=self.started_at,
            now=time.time(),
            loader=dict(self.loader),
        )
        return data, rules.evaluate(data, self.overrides)

    def close(self, timeout: float | None = CLOSE_TIMEOUT_SECONDS) -> None:
        """Stops the rule thread (an evaluation in progress may finish, for up to `timeout`
        seconds) and the sampler, and closes the step file: no results, no collective. Safe to
        call more than once, on any rank, after a failure."""
        atexit.unregister(self.close)
        thread, self._rules_thread = self._rules_thread, None
        if thread is not None and not thread.stop(timeout):
            log.warning("profiler: a rule evaluation still runs after %s s; not waiting for it", timeout)
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        if self._timeline is not None:
            self._timeline.close()
            self._timeline = None

    def finish(self, *, job_name: str | None = None, metrics: Mapping[str, Any] | None = None) -> Path | None:
        """Every rank: stop sampling, send rank 0 what it lacks; rank 0 writes the results."""
        if not self.enabled:
            return None
        self.close(timeout=None)  # the evaluation in progress, if any, ends first
        self._gather()
        if self.rank != 0:
            return None
        with self._evaluating:
            data, results = self._judge()  # with what was appended since, and other hosts' files
        for result in results:
            if result.name == self.stopped_by:
                result.stopped_training()
        self.last_results = results
        _, page = report.write_outputs(self.output_dir, data, results, job_name=job_name, metrics=metrics)
        return page

    def _gather(self) -> None:
        """Files on other hosts reach rank 0; files on rank 0's host are already there."""
        if not _distributed():
            return
        home = [self.node]
        dist.broadcast_object_list(home, src=0)
        payload: dict[str, Any] = {}
        if self.node != home[0]:
            step_file = steps.steps_file(self.profile_dir, self.rank)
            payload["steps"] = (step_file.name, _read(step_file))
            if self.local_rank == 0:
                system_file = monitor.system_file(self.profile_dir, self.node)
                payload["system"] = (system_file.name, _read(system_file))
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        if gathered is None:
            return
        for item in gathered:
            for kind, (name, text) in (item or {}).items():
                target = self.profile_dir / kind / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")


def _process_started() -> float:
    if monitor.psutil is not None:
        try:
            return float(monitor.psutil.Process().create_time())
        except monitor.psutil.Error:
            pass
    return time.time()


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
