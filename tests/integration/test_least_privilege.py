"""Least privilege, from the calls themselves: a drop played through intake, trigger, the state
machine, training, evaluation, notification and a sweep, with every AWS call each function makes
recorded and checked against that function's statements in template.yaml, as IAM would on AWS.
Every grant tests/permissions.py declares must be used by some call, or be in NOT_REACHED
with the reason this run cannot reach it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from retrain.local.cloudformation import stack as stack_module
from retrain.local.cloudformation.resources import ResourceBuilder
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.cloudformation.template import Resolver, load_template
from tests import iam
from tests.integration.aws_calls import CallRecorder, needs
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import Pair, bad_label, scene, upload, upload_pair
from tests.integration.runs import drop_with_validation, run_to_end
from tests.permissions import FUNCTION_PLACEHOLDERS, PERMISSIONS
from tests.unit.test_permissions import EVIDENCE_SIDS

pytestmark = pytest.mark.slow(seconds=15)  # the longest test here, on 2 cores

# A sweep right after the run closes what is quiet and gives up on the lone file at once.
PARAMETERS = {**DATA, **TRAINING, "QuietPeriodSeconds": "0", "IncompleteAfterSeconds": "0"}

# (function, action, declared resource): granted, needed on AWS, and not reached by this run.
NOT_REACHED = {
    ("IntakeFunction", "s3:GetObjectVersion", "{bucket}/quarantine/*"): "a quarantined file curated with a new partner",
    ("IntakeFunction", "s3:DeleteObjectVersion", "{bucket}/quarantine/*"): "the same: its quarantined copy removed",
    ("IntakeFunction", "s3:ListBucketVersions", "{bucket}"): "the same: its .reason.json's versions listed",
    ("IntakeFunction", "s3:ListBucket", "{bucket}"): "an upload withdrawn before the intake read it (404)",
    ("IntakeFunction", "s3:AbortMultipartUpload", "{bucket}/dataset/images/*"): "a failed copy of a file over 5 GiB",
    ("IntakeFunction", "s3:AbortMultipartUpload", "{bucket}/dataset/labels/*"): "a failed copy of a file over 5 GiB",
    ("IntakeFunction", "s3:AbortMultipartUpload", "{bucket}/quarantine/*"): "a failed copy of a file over 5 GiB",
    ("IntakeFunction", "dynamodb:DeleteItem", "{idempotency}"): "Powertools deletes its record when processing fails",
    ("IntakeFunction", "sqs:SendMessage", "{intake_queue}"): "a record left unstarted for lack of time",
    ("IntakeFunction", "sqs:DeleteMessage", "{intake_queue}"): "a record delivered again, after others finished",
    ("IntakeFunction", "dynamodb:GetItem", "{idempotency}"): "a redelivered event: Powertools reads the record it hit",
    ("SweeperFunction", "s3:AbortMultipartUpload", "{bucket}/quarantine/*"): "a failed copy of a file over 5 GiB",
    ("TriggerFunction", "s3:GetObject", "{bucket}/dataset/manifests/*"): "an operator's rerun of a frozen version",
    ("TriggerFunction", "s3:ListBucket", "{bucket}"): "a rerun of a version with no manifest (404)",
    ("TriggerFunction", "states:DescribeExecution", "{executions}"): "a look while another run holds the lock",
    ("PrepareRunFunction", "dynamodb:PutItem", "{ledger}"): "a manual StartExecution takes a free lock itself",
    ("PrepareRunFunction", "states:DescribeExecution", "{executions}"): "a manual start while another run may hold it",
    ("DatasetSyncFunction", "fsx:CancelDataRepositoryTask", "{fsx_tasks}"): "an import that outlived its timeout",
    (
        "TrainingJobFunction",
        "sagemaker:StopTrainingJob",
        "{jobs}",
    ): "a run that fails, overruns or is stopped after its job started",
    ("TrainingJobFunction", "s3:ListBucket", "{bucket}"): "the run's trainer was deleted after it started (404)",
    ("EvaluateRunFunction", "sagemaker:DescribeModelPackage", "{model_packages}"): "a retry after registering",
    ("EvaluateRunFunction", "sagemaker:CreateModelPackage", "{model_package_group}"): (
        "the group ARN is authorised for AWS's check of the group; the call names the new package's ARN"
    ),
    (
        "NotifyFunction",
        "s3:PutObject",
        "{bucket}/reports/failures/*",
    ): "a failed run's summary.json (this run succeeds)",
    ("NotifyFunction", "states:GetExecutionHistory", "{executions}"): "the same: which state the failed run failed at",
    ("EvaluateRunFunction", "dynamodb:GetItem", "{ledger}"): "a batch held by screening: its report is rewritten",
    ("EvaluateRunFunction", "s3:PutObject", "{bucket}/reports/batches/*"): "the same: the held batch's report",
    ("EvaluateRunFunction", "s3:GetObject", "{bucket}/models/packages/*"): "a retry that finds its model sealed",
    ("EvaluateRunFunction", "s3:GetObject", "{bucket}/reports/failures/*"): "an earlier failed run, in the history",
    ("EvaluateRunFunction", "dynamodb:Query", "{ledger}"): "the same: the held batch's files and pairs are read",
    # Trust is recorded from a screening's verdicts, and this run is the first: nothing judges it.
    ("EvaluateRunFunction", "dynamodb:PutItem", "{ledger}"): "a screened run's pair verdicts (trust#<batch>)",
    ("TrainingJobFunction", "dynamodb:Query", "{ledger}/index/state"): "the safety poll (its schedule is not played)",
    ("TrainingJobFunction", "sagemaker:ListTrainingJobs", "*"): "the same: the safety poll's look for orphaned jobs",
    ("TrainingJobFunction", "sagemaker:ListTags", "{jobs}"): "the same: which run an InProgress job belongs to",
    ("TrainingJobFunction", "states:SendTaskFailure", "*"): "a job that failed or was stopped",
    ("TrainingJobFunction", "states:SendTaskHeartbeat", "*"): "the safety poll, for a job still running",
    # RunEndedFunction acts after a console stop or a timeout only (tests/integration/test_run_ends.py).
    ("RunEndedFunction", "dynamodb:GetItem", "{ledger}"): "a run stopped from the console or timed out",
    ("RunEndedFunction", "lambda:InvokeFunction", "{notify}"): "the same: the team is told",
    ("RunEndedFunction", "lambda:InvokeFunction", "{release}"): "the same: the lock is released",
    ("RunEndedFunction", "sagemaker:DescribeTrainingJob", "{jobs}"): "the same: is its job still running?",
    ("RunEndedFunction", "sagemaker:StopTrainingJob", "{jobs}"): "the same: its job is stopped",
    ("RunEndedFunction", "states:GetExecutionHistory", "{executions}"): "the same: the state it was in",
    ("RunEndedFunction", "sqs:SendMessage", "{run_ended_failures}"): (
        "its on-failure destination: Lambda sends there as the role, after three failed tries"
    ),
    # This run ends well: its last state told the team before it released, owing no message.
    ("ReleaseFunction", "dynamodb:PutItem", "{ledger}"): "a run end that owes its message is recorded",
    ("NotifyFunction", "dynamodb:UpdateItem", "{ledger}"): "the same: that message claimed, then marked sent",
}


def test_every_call_is_granted_and_every_grant_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = CallRecorder()
    resolvers: list[Resolver] = []

    class CapturingBuilder(ResourceBuilder):
        def __init__(self, template: Any, resolver: Resolver, aws: Any) -> None:
            resolvers.append(resolver)
            super().__init__(template, resolver, aws)

    monkeypatch.setattr(stack_module, "ResourceBuilder", CapturingBuilder)
    options = StackOptions(parameters=PARAMETERS, poll=False, tick=False, batching_window_seconds=0)
    with recorder.install(monkeypatch), OfflineStack(options) as stack:
        drop_with_validation(stack, "least-privilege", train=2, val=1)
        upload_pair(stack, "least-privilege", "broken", Pair(scene(7).image, bad_label([0, 251])))
        run = run_to_end(stack)
        assert run["status"] == "SUCCEEDED", run
        upload(stack, "incoming/strays/images/lonely.jpg", scene(8).image)
        stack.poller.poll_once(stack.poller.mappings[0], wait_seconds=0.1)
        sweep = stack.runtime.invoke(stack.ref("SweeperFunction"), {"source": "schedule"})
        assert not sweep.failed and sweep.payload["incomplete"] == 1, sweep.payload
        region, account = stack.runtime.region, stack.runtime.account_id
        key_arn = stack.resource("DataKey").attributes["Arn"]
        logical_ids = {spec.name: spec.logical_id for spec in stack.runtime.functions.values()}
        calls = list(recorder.calls)

    body = load_template(options.template).body
    (resolver,) = resolvers
    # The bucket policy's evidence statements too: conditional, so moto leaves them out offline.
    evidence = iam.bucket_policy_denials(body, resolver, EVIDENCE_SIDS)
    statements = {
        logical_id: [*iam.statements_of(body, logical_id, resolver), *evidence] for logical_id in FUNCTION_PLACEHOLDERS
    }
    observed: dict[str, list[iam.Need]] = defaultdict(list)
    denied = []
    for call in calls:
        logical_id = logical_ids[call.function]
        role = str(resolver.resolve({"Fn::GetAtt": [iam.own_role(body, logical_id), "Arn"]}))
        for need in needs(call, region=region, account=account, key_arn=key_arn):
            observed[logical_id].append(need)
            if not iam.allowed(
                statements[logical_id], iam.Need(need.action, need.resource, {**need.context, "aws:PrincipalArn": role})
            ):
                denied.append(f"{logical_id}: {call.service}.{call.operation} needs {need}")
    assert sorted(set(denied)) == [], "calls the template's statements do not allow (they would fail on AWS)"

    names = iam.placeholders(body, resolver)
    unused = {
        (logical_id, action, resource)
        for logical_id in FUNCTION_PLACEHOLDERS
        for grant in PERMISSIONS[logical_id]
        for action in grant.actions
        for resource in grant.resources
        if not any(
            need.action == action and iam.matches(resource.format(**names), need.resource)
            for need in observed[logical_id]
        )
    }
    extra = sorted(unused - NOT_REACHED.keys())
    assert extra == [], f"granted, but no call used it: not needed, or say why: {extra}"
    reached = sorted(NOT_REACHED.keys() - unused)
    assert reached == [], f"reached after all: take it off NOT_REACHED: {reached}"
