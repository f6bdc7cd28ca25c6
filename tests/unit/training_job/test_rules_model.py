"""`rules.json` is one contract for both profiling back ends: what the trainer's built-in profiler
will write reads with the same model as Debugger's normalised results."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from functions.common.rules import RulesFile, parse_rules_file

# What the built-in back end is to write (the trainer writes plain JSON of this shape).
BUILTIN = {
    "schema_version": 1,
    "backend": "builtin",
    "job_name": "retrain-2026-05-01-27825959",
    "generated_at": "2026-05-01T14:02:11Z",
    "report_uri": "s3://retrain-data/training/retrain-2026-05-01-27825959/output/profiler-report.html",
    "rules": [
        {
            "name": "LowGPUUtilization",
            "status": "IssuesFound",
            "trigger_count": 2,
            "violations": 2,
            "datapoints": 14000,
            "evidence": {"algo-1": {"gpu2": {"gpu_95": 41.0, "gpu_5": 0.0}}, "ranks": [2, 3]},
            "parameters": {"threshold_p95": "70", "threshold_p5": "10"},
            "recommendation": "GPUs were under-used: give the data loader more workers.",
            "source": "builtin",
        },
        {"name": "CPUBottleneck", "status": "NoIssuesFound", "source": "builtin"},
    ],
}


def test_the_builtin_back_ends_file_reads_with_the_shared_model() -> None:
    rules = parse_rules_file(json.dumps(BUILTIN))

    assert rules.backend == "builtin"
    assert [rule.name for rule in rules.issues] == ["LowGPUUtilization"]
    assert rules.pending == []
    assert rules.rules[1].trigger_count == 0, "a rule that never fired has no triggers"
    assert rules.rules[1].evidence == {}


def test_a_rule_says_whether_it_could_judge_and_older_files_read_as_judged() -> None:
    document = json.loads(json.dumps(BUILTIN))
    reason = "no GPU metrics on this run (a CPU host, or no NVML/nvidia-smi)"
    document["rules"].append(
        {
            "name": "GPUMemoryIncrease",
            "status": "NoIssuesFound",
            "applicable": False,
            "not_applicable_reason": reason,
            "source": "builtin",
        }
    )

    rules = parse_rules_file(json.dumps(document))

    gpu_memory = rules.rules[-1]
    assert gpu_memory.status == "NoIssuesFound", "Debugger's vocabulary is kept"
    assert not gpu_memory.applicable and gpu_memory.not_applicable_reason == reason
    assert not gpu_memory.passed, "a rule with nothing to judge passed nothing"
    assert [rule.name for rule in rules.not_applicable] == ["GPUMemoryIncrease"]
    # BUILTIN as written before the field existed: its rules judged.
    old = parse_rules_file(json.dumps(BUILTIN))
    assert all(rule.applicable and rule.not_applicable_reason is None for rule in old.rules)
    assert old.rules[1].passed and old.not_applicable == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"status": "Passed"}, "status"),
        ({"source": "smppy"}, "source"),
        ({"trigger_count": -1}, "trigger_count"),
        ({"triggers": 3}, "triggers"),
        ({"applicable": "maybe"}, "applicable"),
    ],
)
def test_a_rule_outside_the_contract_is_refused(change: dict[str, object], field: str) -> None:
    document = json.loads(json.dumps(BUILTIN))
    document["rules"][0].update(change)

    with pytest.raises(ValidationError, match=field):
        RulesFile.model_validate(document)
