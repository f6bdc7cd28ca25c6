"""template.yaml and the ASL stay in step, and the offline stack reads the template faithfully."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from functions.notify.history import FAILURE_BRANCH
from retrain import statemachine
from retrain.local.cloudformation.resources import substitute_definition
from retrain.local.cloudformation.template import Created, Resolver, TemplateError, load_template

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9]+)\}")
ASL_YAML = ROOT / "statemachine" / "retrain.asl.yaml"
ASL_JSON = ROOT / "statemachine" / "retrain.asl.json"


def state_machines() -> list[tuple[str, dict[str, object], Path]]:
    template = load_template(ROOT / "template.yaml")
    return [
        (logical_id, resource["Properties"], ROOT / resource["Properties"]["DefinitionUri"])
        for logical_id, resource in template.resources_of_type("AWS::Serverless::StateMachine").items()
    ]


@pytest.mark.parametrize(("logical_id", "properties", "asl"), state_machines())
def test_every_asl_placeholder_has_a_substitution_and_every_substitution_is_used(
    logical_id: str, properties: dict[str, object], asl: Path
) -> None:
    placeholders = set(PLACEHOLDER.findall(asl.read_text(encoding="utf-8")))
    substitutions = set(properties.get("DefinitionSubstitutions", {}))  # type: ignore[arg-type]

    assert placeholders - substitutions == set(), f"{asl.name}: no substitution for these"
    assert substitutions - placeholders == set(), f"{logical_id}: substituted but never used"


def test_a_placeholder_left_without_substitution_stops_the_offline_stack(tmp_path: Path) -> None:
    asl = tmp_path / "machine.asl.json"
    asl.write_text(json.dumps({"Resource": "${TopicArn}", "Other": "${Missing}"}))

    with pytest.raises(TemplateError, match=r"no substitution: \$\{Missing\}"):
        substitute_definition(asl, {"TopicArn": "arn:aws:sns:us-east-1:1:t"})


def test_states_are_named_as_sentences() -> None:
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        for name, state in states.items():
            if state["Type"] not in {"Succeed", "Fail"}:
                assert " " in name, f"state {name!r} is not a sentence"


def test_every_task_retries_transient_errors_with_backoff_and_jitter() -> None:
    transient = {
        "Lambda.ServiceException",
        "Lambda.TooManyRequestsException",
        "Sandbox.Timedout",
        "AwsServiceBusyError",
    }
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        for name, state in states.items():
            if state["Type"] != "Task":
                continue
            retried = {error for rule in state.get("Retry", []) for error in rule["ErrorEquals"]}
            assert transient <= retried, f"{name} does not retry {transient - retried}"
            for rule in state["Retry"]:
                assert rule["BackoffRate"] > 1 and rule["JitterStrategy"] == "FULL", name
                assert "States.ALL" not in rule["ErrorEquals"], f"{name} retries what is not transient"


def test_the_json_that_sam_deploys_is_exactly_the_rendering_of_the_yaml() -> None:
    assert statemachine.is_current(ASL_YAML, ASL_JSON), (
        f"{ASL_JSON.name} is not the rendering of {ASL_YAML.name}: edit the YAML, then run make statemachine"
    )
    assert PLACEHOLDER.findall(ASL_YAML.read_text(encoding="utf-8")), "the ${...} substitutions are in the YAML"


def test_the_rendering_resolves_anchors_leaves_shared_out_and_keeps_placeholders(tmp_path: Path) -> None:
    source = tmp_path / "machine.asl.yaml"
    source.write_text(
        "# a comment, which the JSON cannot keep\n"
        "Shared:\n  Retry: &retry [{ErrorEquals: [Sandbox.Timedout], MaxAttempts: 2}]\n"
        "StartAt: Start training\n"
        "States:\n"
        "  Start training:\n    Type: Task\n    Resource: ${F}\n    Retry: *retry\n    Next: Stop\n"
        "  Stop:\n    Type: Task\n    Resource: ${G}\n    Retry: *retry\n    ResultPath: null\n    End: true\n",
        encoding="utf-8",
    )
    target = tmp_path / "machine.asl.json"
    retry = [{"ErrorEquals": ["Sandbox.Timedout"], "MaxAttempts": 2}]

    assert json.loads(statemachine.render(source)) == {
        "StartAt": "Start training",
        "States": {
            "Start training": {"Type": "Task", "Resource": "${F}", "Retry": retry, "Next": "Stop"},
            "Stop": {"Type": "Task", "Resource": "${G}", "Retry": retry, "ResultPath": None, "End": True},
        },
    }
    assert not statemachine.is_current(source, target), "no JSON yet"
    target.write_text(statemachine.render(source), encoding="utf-8")
    assert statemachine.is_current(source, target)
    target.write_text(statemachine.render(source).replace('"MaxAttempts": 2', '"MaxAttempts": 3', 1))
    assert not statemachine.is_current(source, target), "a hand edit of the JSON is caught"


def test_every_error_the_state_machine_names_is_one_the_functions_raise() -> None:
    from functions.common import errors  # noqa: PLC0415

    ours = {name for name, value in vars(errors).items() if isinstance(value, type)}
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        named = {
            error
            for state in states.values()
            for rule in [*state.get("Retry", []), *state.get("Catch", [])]
            for error in rule["ErrorEquals"]
            if not error.startswith(("States.", "Lambda.", "Sandbox."))
        }
        assert named, "the machine retries at least one of our own errors by name"
        assert named - ours == set(), f"{asl.name} names errors nothing raises"


def test_every_task_of_the_run_that_fails_stops_the_job_first() -> None:
    # Their own Catch on purpose: the failure branch goes on whatever happens to its states, and
    # the lock release ends the run as it went.
    own_catch = {
        *FAILURE_BRANCH,
        "Release the lock and look for new data",
        "Tell the team the run started",  # a started message that fails never fails the run
        "Tell the team how the run went",  # nor does a failed last message undo the run's outcome
    }
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        tasks = [name for name, state in states.items() if state["Type"] == "Task" and name not in own_catch]
        assert len(tasks) >= 7
        for name in tasks:
            assert states[name]["Catch"] == [
                {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": FAILURE_BRANCH[0]}
            ], f"{name} does not go to the failure branch with its error"
        assert not [name for name, state in states.items() if "failed_state" in json.dumps(state)], (
            "the failed state is read from the execution's history, not written into the state"
        )


def test_the_failure_branch_is_the_one_notify_knows_and_each_of_its_states_goes_on() -> None:
    """functions/notify/history.py takes the failed state to be the last one entered before the
    first of FAILURE_BRANCH: the branch must be exactly those states, in that order. Each Task
    catches everything and goes on forward (never back, never out of the branch); the release
    comes before the message and records the run's end owing it, so the message is sent once,
    by this branch or, should it fail, by RunEndedFunction (the one clean-up's rule,
    functions/run_ended/cleanup.py)."""
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        branch, name = [], FAILURE_BRANCH[0]
        while name is not None:
            branch.append(name)
            state = states[name]
            if state["Type"] == "Task":
                (catch,) = state["Catch"]
                assert catch["ErrorEquals"] == ["States.ALL"], name
                assert catch["Next"] in FAILURE_BRANCH[FAILURE_BRANCH.index(name) + 1 :], name
            if state["Type"] == "Choice":
                (choice,) = state["Choices"]
                assert (choice["Variable"], choice["BooleanEquals"]) == ("$.released.released", True), name
                assert state["Default"] == FAILURE_BRANCH[-1], "nobody is told twice"
                name = choice["Next"]
                continue
            name = state.get("Next")
        assert tuple(branch) == FAILURE_BRANCH
        release, tell = (
            FAILURE_BRANCH.index("Release the lock after the failure"),
            FAILURE_BRANCH.index("Tell the team the run failed"),
        )
        assert release < tell, "whoever frees the lock tells the team: the release comes first"
        assert states[FAILURE_BRANCH[-1]]["Type"] == "Fail"
        entered_otherwise = {
            target
            for source, state in states.items()
            if source not in FAILURE_BRANCH
            for target in [state.get("Next"), state.get("Default")]
            + [rule["Next"] for rule in [*state.get("Choices", []), *state.get("Catch", [])]]
        }
        assert entered_otherwise & set(FAILURE_BRANCH) == {FAILURE_BRANCH[0]}, "the branch is entered at its start"


def test_the_failure_branchs_release_owes_the_message_and_the_finished_runs_does_not() -> None:
    """The finished run's last state told the team before it released; the failure branch tells
    after, so its release records the run's end with the message owed (functions/notify/once.py).
    Both release through ReleaseFunction: the trigger frees no lock."""
    for _, properties, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        releases = {name: state for name, state in states.items() if state.get("Resource") == "${ReleaseFunctionArn}"}
        assert {name: state["Parameters"]["owes_message"] for name, state in releases.items()} == {
            "Release the lock and look for new data": False,
            "Release the lock after the failure": True,
        }
        assert "TriggerFunctionArn" not in properties.get("DefinitionSubstitutions", {})  # type: ignore[operator]


def test_a_failed_last_message_leaves_the_runs_outcome_and_still_releases_the_lock() -> None:
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        (catch,) = states["Tell the team how the run went"]["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"] and catch["ResultPath"] == "$.notify_error"
        noted = states[catch["Next"]]
        assert (noted["Type"], noted["Next"]) == ("Pass", "Release the lock and look for new data")


def test_short_form_tags_resolve_like_cloudformation(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(
        "Parameters:\n  Env: {Type: String, Default: dev}\n"
        "Resources:\n"
        "  Queue: {Type: AWS::SQS::Queue}\n"
        "  Thing:\n    Type: AWS::SNS::Topic\n    Properties:\n"
        '      TopicName: !Sub "${AWS::StackName}-${Env}-${Queue.QueueName}"\n'
        "      DisplayName: !Join [':', [!Ref Env, !GetAtt Queue.Arn]]\n"
        "      Other: !Select [1, [a, !Ref AWS::Region]]\n",
        encoding="utf-8",
    )
    template = load_template(path)
    resolver = Resolver("stack", "eu-west-1", "111122223333", {"Env": "dev"})
    resolver.created["Queue"] = Created(ref="https://queue", attributes={"QueueName": "q1", "Arn": "arn:q1"})

    assert template.creation_order() == ["Queue", "Thing"]
    assert resolver.resolve(template.resources["Thing"]["Properties"]) == {
        "TopicName": "stack-dev-q1",
        "DisplayName": "dev:arn:q1",
        "Other": "eu-west-1",
    }


def test_an_intrinsic_the_offline_stack_does_not_know_is_named_in_the_error() -> None:
    resolver = Resolver("stack", "us-east-1", "1", {})

    with pytest.raises(TemplateError, match="Fn::ImportValue is not supported"):
        resolver.resolve({"Fn::ImportValue": "shared-vpc"})


def test_resources_that_reference_each_other_in_a_cycle_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(
        "Resources:\n"
        "  A: {Type: AWS::SQS::Queue, Properties: {QueueName: !GetAtt B.QueueName}}\n"
        "  B: {Type: AWS::SQS::Queue, Properties: {QueueName: !GetAtt A.QueueName}}\n",
        encoding="utf-8",
    )

    with pytest.raises(TemplateError, match="cycle"):
        load_template(path).creation_order()


def test_maps_and_escaped_policy_variables_resolve_like_cloudformation() -> None:
    resolver = Resolver(
        "stack",
        "eu-west-1",
        "111122223333",
        {},
        mappings={"Registries": {"eu-west-1": {"PyTorch": "763104351884"}}},
    )

    assert resolver.resolve({"Fn::FindInMap": ["Registries", {"Ref": "AWS::Region"}, "PyTorch"]}) == "763104351884"
    # `${!Name}` is a literal `${Name}`: an IAM policy variable, not a reference.
    assert resolver.resolve({"Fn::Sub": "incoming/${!aws:PrincipalTag/team}-* in ${AWS::Region}"}) == (
        "incoming/${aws:PrincipalTag/team}-* in eu-west-1"
    )
    with pytest.raises(TemplateError, match=r"no us-east-2\.PyTorch"):
        resolver.resolve({"Fn::FindInMap": ["Registries", "us-east-2", "PyTorch"]})


def test_the_functions_tests_run_under_the_python_the_functions_are_deployed_with() -> None:
    """`make test-lambda-python` builds its environment from the Makefile's version: a new runtime
    in template.yaml must move it, or the functions' tests would run under a Python Lambda lacks."""
    runtime = load_template(ROOT / "template.yaml").body["Globals"]["Function"]["Runtime"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (version,) = re.findall(r"^LAMBDA_PYTHON_VERSION := (\S+)$", makefile, re.MULTILINE)

    assert runtime == f"python{version}"
