"""template.yaml and the ASL stay in step, and the offline stack reads the template faithfully."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from retrain.local.cloudformation.resources import substitute_definition
from retrain.local.cloudformation.template import Created, Resolver, TemplateError, load_template

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9]+)\}")


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


def test_states_are_named_as_sentences_and_every_task_retries() -> None:
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        for name, state in states.items():
            if state["Type"] == "Task":
                assert state.get("Retry"), f"{name} has no Retry"
            if state["Type"] not in {"Succeed", "Fail"}:
                assert " " in name, f"state {name!r} is not a sentence"


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


def test_every_task_of_the_run_that_fails_notes_where_and_stops_the_job_first() -> None:
    failure_branch = {
        "Stop the training job if one was created",
        "Tell the team the run failed",
        "Release the lock after the failure",
        "Release the lock and look for new data",
        "Tell the team the run started",  # a started message that fails never fails the run
    }
    for _, _, asl in state_machines():
        states = json.loads(asl.read_text(encoding="utf-8"))["States"]
        for name, state in states.items():
            if state["Type"] != "Task" or name in failure_branch:
                continue
            (catch,) = state["Catch"]
            noted = states[catch["Next"]]
            assert catch["ErrorEquals"] == ["States.ALL"], name
            assert (noted["Type"], noted["Result"]) == ("Pass", name), f"{name} does not say it failed"
            assert noted["Next"] == "Stop the training job if one was created", name


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
