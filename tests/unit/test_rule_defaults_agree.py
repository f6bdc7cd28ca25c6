"""The one guard that the two profiling back ends judge Debugger's rules with the same numbers.

Each back end declares the defaults once, and they cannot share a module:
- `functions/common/debugger.py` (`PROFILER_RULE_DEFAULTS`) is what a `debugger` job's request
  sends for each built-in profiler rule (as the SageMaker SDK v2 does, checked in
  `training_job/test_sdk_parity.py`); it is in the Lambda package, which must not carry
  `trainer/` (`FORBIDDEN_MODULES` in `retrain/lambda_package.py`);
- `trainer/profiling/rules/common.py` (`DEFAULTS`) is what the `builtin` back end evaluates the same
  rules with; the trainer ships alone (`sourcedir.tar.gz` holds `trainer/` only, see
  `retrain/package.py`), so it imports nothing from `functions/`.

So the numbers are written twice, and this test is what keeps them equal: change one table, and
it fails until the other says the same (or `KNOWN_DIFFERENCES` says why not). Only the rules both
cover are compared: ProfilerReport exists only in the request, and the trainer's own rules
(DataStall, LossNotDecreasing, Dataloader) only in the trainer.

The shapes differ in two ways, adapted here rather than in either file:
- the request stores every value as the string the API takes; the trainer stores numbers (and
  None), which it reports as `str(value)` (`rules._params`), so both sides are compared as strings;
- the request sends `scan_interval_us` (microseconds) with each rule, where the trainer has one
  interval for all of its rules, `SCAN_INTERVAL_SECONDS`: that is compared on its own.
"""

from __future__ import annotations

import pytest

from functions.common.debugger import PROFILER_RULE_DEFAULTS
from trainer.profiling import rules

SCAN_INTERVAL = "scan_interval_us"
SHARED_RULES = sorted(set(PROFILER_RULE_DEFAULTS) & set(rules.DEFAULTS))

# (rule, parameter) -> why the two tables differ there. A pair listed must still differ (so the
# list never outlives its reason); any other difference fails.
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {
    ("StepOutlier", "n_steps"): (
        "the trainer's StepOutlier waits for n_steps=100 steps per node and phase before judging; "
        "the SDK v2 (and so the request) sends no such parameter, and smdebug's StepOutlier takes "
        "none"
    ),
}


def _trainer_parameters(rule: str) -> dict[str, str]:
    return {name: str(value) for name, value in rules.DEFAULTS[rule].items()}


def _request_parameters(rule: str) -> dict[str, str]:
    return {name: value for name, value in PROFILER_RULE_DEFAULTS[rule].items() if name != SCAN_INTERVAL}


def _differences(rule: str) -> dict[str, tuple[str | None, str | None]]:
    """parameter -> (the trainer's value, the request's value); None where a side lacks it."""
    trainer, request = _trainer_parameters(rule), _request_parameters(rule)
    return {
        name: (trainer.get(name), request.get(name))
        for name in sorted(set(trainer) | set(request))
        if trainer.get(name) != request.get(name)
    }


def _shown(value: str | None) -> str:
    return "no such parameter" if value is None else repr(value)


def test_both_tables_have_rules_in_common() -> None:
    # Guards the comparison below against comparing nothing after a rename.
    assert len(SHARED_RULES) >= 5, f"only {SHARED_RULES} are in both tables"


@pytest.mark.parametrize("rule", SHARED_RULES)
def test_the_trainer_defaults_a_rule_as_the_job_request_does(rule: str) -> None:
    unexplained = {name: pair for name, pair in _differences(rule).items() if (rule, name) not in KNOWN_DIFFERENCES}
    assert not unexplained, "; ".join(
        f"{rule}.{name}: trainer/profiling/rules/common.py has {_shown(trainer)}, "
        f"functions/common/debugger.py has {_shown(request)}"
        for name, (trainer, request) in unexplained.items()
    )


def test_the_known_differences_still_exist() -> None:
    stale = [
        f"{rule}.{name}"
        for rule, name in KNOWN_DIFFERENCES
        if rule not in SHARED_RULES or name not in _differences(rule)
    ]
    assert not stale, f"the tables now agree on {stale}: remove them from KNOWN_DIFFERENCES"


@pytest.mark.parametrize("rule", [rule for rule in SHARED_RULES if SCAN_INTERVAL in PROFILER_RULE_DEFAULTS[rule]])
def test_the_request_scans_a_rule_as_often_as_the_trainer(rule: str) -> None:
    sent = PROFILER_RULE_DEFAULTS[rule][SCAN_INTERVAL]
    assert float(sent) / 1_000_000 == rules.SCAN_INTERVAL_SECONDS, (
        f"{rule}.{SCAN_INTERVAL}: functions/common/debugger.py sends {sent!r} microseconds, "
        f"trainer/profiling/rules/common.py scans every {rules.SCAN_INTERVAL_SECONDS} s"
    )
