"""Check a CreateTrainingJob request against botocore's sagemaker model before it leaves.

botocore's client validates types, required members and minimums; SageMaker checks the rest on
its side (enum values, maximum lengths and counts, patterns) and answers a ValidationException
minutes into a run. Both are checked here (the service-side part in
`functions/common/service_model.py`, which the offline stack's emulators use too), so a request
that passes is one AWS accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import botocore.session
from botocore.model import StructureShape
from botocore.validate import ParamValidator

from functions.common.service_model import service_side_problems
from functions.training_job.errors import TrainingRequestInvalidError

# Java character classes in the model's patterns, as Python's `re` spells them (close enough to
# catch real mistakes: tag values, role ARNs, Lambda ARNs).


@cache
def create_training_job_shape() -> StructureShape:
    """CreateTrainingJob's input shape, loaded once (the sagemaker model is large)."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    assert shape is not None
    return shape


def request_problems(request: Mapping[str, Any]) -> list[str]:
    """Every way the request breaks botocore's model or SageMaker's own checks (empty: none)."""
    shape = create_training_job_shape()
    report = ParamValidator().validate(dict(request), shape)
    problems = report.generate_report().splitlines() if report.has_errors() else []
    return [line.strip() for line in problems if line.strip()] + service_side_problems(request, shape)


def check_request(request: Mapping[str, Any]) -> None:
    problems = request_problems(request)
    if problems:
        raise TrainingRequestInvalidError(problems)
