"""What a newcomer who starts `retrain local up` is told about the training jobs it will run."""

from __future__ import annotations

from pathlib import Path

from retrain.commands.local import training_settings
from retrain.local.cloudformation.stack import OFFLINE_TRAINING, StackOptions
from retrain.local.demo import DemoOptions


def test_local_up_says_its_jobs_train_small_on_this_cpu_and_what_a_deployed_stack_trains_with() -> None:
    used, why = training_settings(StackOptions(parameters=dict(OFFLINE_TRAINING)))

    assert used == (
        'training jobs    1 x ml.m5.xlarge, 4 epochs, crop 128x64, width 0.25, batch 4, trainer flags {"workers": 0}'
    )
    assert "instead of a deployed stack's 1 x ml.g5.2xlarge, 100 epochs, crop 1024x512, width 1.0, batch 8" in why
    assert "torchrun on this machine's CPU, on small images" in why
    assert "--param" in why, "it says how to change them"


def test_what_the_engineer_overrides_is_what_it_names() -> None:
    (used, _) = training_settings(StackOptions(parameters={**OFFLINE_TRAINING, "TrainingEpochs": "30"}))

    assert "30 epochs" in used


def test_a_stack_on_the_deployed_settings_says_so() -> None:
    (only,) = training_settings(StackOptions())

    assert only.endswith("crop 1024x512, width 1.0, batch 8 (a deployed stack's defaults)")


def test_the_demo_trains_the_same_way_with_its_own_hosts_epochs_and_crop() -> None:
    demo = DemoOptions(size=(256, 128), epochs=2, processes=2, out=Path("unused")).parameters()

    assert {name: demo[name] for name in OFFLINE_TRAINING} == {
        **OFFLINE_TRAINING,
        "TrainingInstanceCount": "2",
        "TrainingEpochs": "2",
        "TrainingCrop": "128x64",
        "TrainingBatchSize": "8",
        "TrainingExtraHyperparameters": '{"workers": 0, "lr": 0.05, "class-weighting": "balanced"}',
    }
