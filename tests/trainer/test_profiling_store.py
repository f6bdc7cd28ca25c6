"""The online evaluator's reading and memory: only appended lines are parsed, records are held in
columns (bounded bytes per record) that give every value back exactly, and a store read in
pieces makes the rules and the report say what one full read makes them say."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer.profiling import jsonl
from trainer.profiling.jsonl import JsonlTail
from trainer.profiling.report import render_html
from trainer.profiling.rules import ProfileData, evaluate
from trainer.profiling.store import ProfileStore

T0 = 1764687600.0


def line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def read_all(tail: JsonlTail) -> list[dict[str, Any]]:
    return [record for batch in tail.read() for record in batch]


def test_the_tail_parses_only_appended_lines_and_waits_for_a_partial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_text(line({"step": 1}) + line({"step": 2}))
    parsed: list[bytes] = []
    real = jsonl._parse
    monkeypatch.setattr(jsonl, "_parse", lambda data: parsed.append(data) or real(data))
    tail = JsonlTail(path)
    assert read_all(tail) == [{"step": 1}, {"step": 2}]
    assert read_all(tail) == [] and not tail.poll(), "nothing new: nothing read"

    parsed.clear()
    third, fourth = line({"step": 3}), line({"step": 4, "loss": 1.25})
    with path.open("a") as handle:
        handle.write(third + fourth[:9])  # the writer is in the middle of line 4
    assert read_all(tail) == [{"step": 3}]
    assert parsed[0] == third.encode(), "only the appended complete line was parsed"

    with path.open("a") as handle:
        handle.write(fourth[9:])
    assert read_all(tail) == [{"step": 4, "loss": 1.25}], "the partial line, once whole"
    assert tail.offset == path.stat().st_size


def test_garbled_lines_and_lines_that_are_no_records_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(line({"a": 1}) + '{"a": 2\n' + "[1, 2]\n" + line({"a": 3}) + '{"a": 4}')
    assert read_all(JsonlTail(path)) == [{"a": 1}, {"a": 3}, {"a": 4}]


def test_a_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    # Rank 0 writes other hosts' files whole at the end of the job: not an append.
    path = tmp_path / "algo-2.jsonl"
    path.write_text(line({"v": 1}) + line({"v": 2}))
    tail = JsonlTail(path)
    assert len(read_all(tail)) == 2
    path.write_text(line({"v": 10}) + line({"v": 20}) + line({"v": 30}))
    assert tail.poll(), "another file under the same name"
    assert read_all(tail) == [{"v": 10}, {"v": 20}, {"v": 30}]


def test_a_line_longer_than_a_read_block(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(line({"text": "x" * 100}) + line({"text": "y"}))
    assert [len(r["text"]) for r in read_all(JsonlTail(path, block_bytes=16))] == [100, 1]


# --- a profile as the trainer writes it --------------------------------------------------------


def write_system(path: Path, first: int, count: int, *, cores: int = 6, gpus: int = 2, seed: int = 0) -> None:
    """Snapshots `first`..`first + count` of one host, as `SystemMonitor` writes them."""
    rnd = random.Random(seed * 7919 + first)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for i in range(first, first + count):
            stamp = round(T0 + i * 0.5 + rnd.random() * 0.004, 3)

            def add(kind: str, name: str, dimension: str, value: float, stamp: float = stamp) -> None:
                handle.write(
                    line(
                        {
                            "Type": kind,
                            "Name": name,
                            "Dimension": dimension,
                            "Value": round(value, 3),
                            "NodeId": path.stem,
                            "Timestamp": stamp,
                        }
                    )
                )

            for core in range(cores):
                add("cpu", f"cpu{core}", "CPUUtilization", 95.0 if core == 0 else rnd.uniform(0, 100))
            add("cpu", "cpu", "I/OWaitPercentage", rnd.uniform(0, 10))
            add("memory", "memory", "MemoryUtilization", 40 + rnd.random())
            add("process", "dataloader", "DataLoaderWorkers", 2)
            add("process", "training", "TrainingProcesses", 2)
            add("io", "disk", "DiskReadBytesPerSecond", rnd.uniform(0, 2e9))  # too large for int32
            for gpu in range(gpus):
                add("gpu", f"gpu{gpu}", "GPUUtilization", rnd.choice([0.0, 5.0, rnd.uniform(0, 100)]))
                add("gpu", f"gpu{gpu}", "GPUMemoryUtilization", 30 + i * 0.01 + rnd.random())


def write_steps(path: Path, rank: int, first: int, count: int) -> None:
    rnd = random.Random(rank * 31 + first)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for step in range(first, first + count):
            phase = "EVAL" if step % 200 > 180 else "TRAIN"
            wait, compute = rnd.random() * 0.1 * (1 + rank), 0.2 + rnd.random() * 0.05
            if step % 97 == 0:
                compute *= 10  # an outlier
            record: dict[str, Any] = {
                "rank": rank,
                "node": "algo-1",
                "phase": phase,
                "epoch": step // 200,
                "step": step,
                "start": round(T0 + step * 0.3, 6),
                "duration": round(wait + compute, 6),
                "data_wait": round(wait, 6),
                "compute": round(compute, 6),
                "communication": 0.0,
            }
            if phase == "TRAIN":
                loss = float(np.float32(3.0 - step * 0.001 + rnd.random() * 0.1))
                record["loss"] = None if step == 300 else loss / 3 if step == 301 else loss
            handle.write(line(record))


def write_profile(profile: Path, first: int, count: int) -> None:
    for host in ("algo-1", "algo-2"):
        write_system(profile / "system" / f"{host}.jsonl", first, count, seed=int(host[-1]))
    for rank in (0, 1):
        write_steps(profile / "steps" / f"rank{rank}.jsonl", rank, first + 1, count)


def same_as_a_full_read(store: ProfileStore, profile: Path) -> None:
    kept = ProfileData(system=store.system, steps=store.steps, started_at=T0 - 60, now=T0 + 2000)
    full = ProfileData.read(profile, started_at=T0 - 60, now=T0 + 2000)
    assert (len(kept.system), len(kept.steps)) == (len(full.system), len(full.steps))
    assert [r.to_dict() for r in evaluate(kept)] == [r.to_dict() for r in evaluate(full)]
    page, expected = render_html(kept, evaluate(kept)), render_html(full, evaluate(full))
    assert page.split("</p>", 1)[1] == expected.split("</p>", 1)[1], "the same report, but for its time"


def test_the_store_read_in_pieces_gives_what_a_full_read_gives(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    store = ProfileStore(profile)
    write_profile(profile, 0, 700)
    assert store.refresh() > 0
    same_as_a_full_read(store, profile)
    write_profile(profile, 700, 500)  # the job goes on: every file grows
    added = store.refresh()
    assert added == 2 * 500 * 15 + 2 * 500, "only the new records were added (15 a snapshot)"
    same_as_a_full_read(store, profile)
    results = {r.name: r for r in evaluate(ProfileData(system=store.system, steps=store.steps))}
    assert results["StepOutlier"].status == "IssuesFound" and results["DataStall"].status == "IssuesFound"


def test_values_come_back_exactly_whatever_their_form(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    odd = [0.1 + 0.2, 1e-9, 123456789.125, -0.5, 1e300, 48.123, float("nan")]
    path = profile / "system" / "algo-1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "".join(
            line({"Type": "x", "Name": "n", "Dimension": "D", "Value": v, "NodeId": "algo-1", "Timestamp": T0 + i})
            for i, v in enumerate(odd)
        )
    )
    steps = profile / "steps" / "rank0.jsonl"
    steps.parent.mkdir()
    lines = [
        {"step": 1, "start": T0, "duration": 0.1 + 0.2, "data_wait": 0.0, "compute": 0.3, "communication": 0.0},
        {"step": 2, "start": T0 + 1.5, "duration": 2.0, "data_wait": 1.0, "compute": 1.0, "communication": 0},
        {"rank": 3, "phase": "EVAL", "step": 2.5, "start": T0 + 2, "duration": 1e7, "data_wait": 0, "compute": 1e7},
    ]
    lines[1]["loss"], lines[2]["communication"], lines[2]["loss"] = None, 0.0, 0.1
    steps.write_text("".join(line(record) for record in lines))
    store = ProfileStore(profile)
    store.refresh()
    [(stamps, values)] = store.system.series("D").values()
    assert values[:-1].tolist() == odd[:-1] and math.isnan(values[-1])
    assert stamps.tolist() == [T0 + i for i in range(len(odd))]
    [held] = store.steps.groups(lambda s: "all", lambda s: True, by_start=False).values()
    for name in ("start", "duration", "data_wait", "compute", "communication"):
        assert held.column(name).tolist() == [float(record.get(name, 0.0)) for record in lines], name
    assert [held.get(i, "step") for i in range(3)] == [1.0, 2.0, 2.5], "a step number that is not whole"
    assert [held.get(i, "rank", 0) for i in range(3)] == [0, 0, 3] and store.steps.ranks() == {0, 3}
    assert held.column("has_loss").tolist() == [False, False, True], "no loss, a null loss, a loss"
    assert held.column("loss")[2] == 0.1


def test_memory_is_bounded_per_record_and_grows_linearly(tmp_path: Path) -> None:
    """The bound the store states: 4 bytes per percentage, 8 per byte rate, 8 per snapshot and
    about 32 per step, plus at most a quarter more of spare capacity."""
    profile = tmp_path / "profile"
    store = ProfileStore(profile)
    sizes = []
    for part in range(4):
        write_system(profile / "system" / "algo-1.jsonl", part * 1500, 1500, cores=32, gpus=8)
        write_steps(profile / "steps" / "rank0.jsonl", 0, part * 3000 + 1, 3000)
        store.refresh()
        sizes.append((len(store.system), len(store.steps), store.system.nbytes, store.steps.nbytes))
    records, steps, system_bytes, step_bytes = sizes[-1]
    snapshots = 4 * 1500
    exact = 4 * (records - snapshots) + 8 * snapshots + 8 * snapshots  # one byte-rate series
    assert system_bytes <= 1.25 * exact + 20_000, (system_bytes, exact)
    assert system_bytes / records < 7, "bytes per system record"
    assert step_bytes / steps < 1.25 * 36, "bytes per step"
    # No record is an object: growth is the columns' growth, linear in the records.
    per_record = [(s[2] + s[3]) / (s[0] + s[1]) for s in sizes[1:]]
    assert max(per_record) < 1.5 * min(per_record)


def test_records_a_few_milliseconds_apart_group_into_snapshots_as_the_rules_group_them(tmp_path: Path) -> None:
    # Another writer may stamp a sample's records a few ms apart: within 20 ms they are one snapshot.
    path = tmp_path / "profile" / "system" / "algo-1.jsonl"
    path.parent.mkdir(parents=True)
    rnd = random.Random(3)
    with path.open("w") as handle:
        for i in range(400):
            stamp = T0 + i * 0.5
            for name, dimension, offset, value in (
                ("cpu0", "CPUUtilization", 0.0, 95.0),
                ("cpu1", "CPUUtilization", 0.004, rnd.uniform(0, 100)),
                ("gpu0", "GPUUtilization", 0.012, rnd.choice([0.0, 0.0, 90.0])),
                ("gpu0", "GPUMemoryUtilization", 0.03 if i % 7 == 0 else 0.012, 30.0),
            ):
                record = {"Name": name, "Dimension": dimension, "Value": value, "NodeId": "algo-1"}
                handle.write(line({**record, "Type": "x", "Timestamp": round(stamp + offset, 3)}))
    data = ProfileData.read(tmp_path / "profile")
    [snapshots] = data.system.per_snapshot(["CPUUtilization", "GPUMemoryUtilization"]).values()
    late = sum(1 for i in range(400) if i % 7 == 0)
    assert len(snapshots.stamps) == 400 + late, "30 ms after a sample's first record starts a snapshot of its own"
    assert snapshots.count["CPUUtilization"].tolist().count(2) == 400, "both cores, 4 ms apart, in one snapshot"
    [cpu] = evaluate(data, names=["CPUBottleneck"])
    assert cpu.status == "IssuesFound", cpu.evidence
