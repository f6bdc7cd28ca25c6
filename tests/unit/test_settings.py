"""A function whose deployment forgot a variable says which one, at its cold start."""

from __future__ import annotations

import pytest

from functions.common.errors import ConfigurationError
from functions.common.prefixes import batch_of
from functions.common.requests import RunInput
from functions.common.settings import DatasetSyncSettings, IntakeSettings, load_settings


@pytest.fixture(autouse=True)
def _fresh_settings() -> None:
    load_settings.cache_clear()


def test_a_missing_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "intake")
    monkeypatch.setenv("DATA_BUCKET", "retrain-data")
    monkeypatch.delenv("LEDGER_TABLE", raising=False)

    with pytest.raises(ConfigurationError, match="IntakeSettings is invalid: LEDGER_TABLE"):
        load_settings(IntakeSettings)


def test_settings_are_read_once_per_function_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "dataset-sync")
    monkeypatch.setenv("DATA_BUCKET", "bucket-one")
    first = load_settings(DatasetSyncSettings)
    monkeypatch.setenv("DATA_BUCKET", "bucket-two")

    assert load_settings(DatasetSyncSettings) is first
    assert first.data_bucket == "bucket-one"


@pytest.mark.parametrize("version", ["v 1", "a/b", "x" * 81, "", "v{1}"])
def test_a_dataset_version_must_be_a_valid_execution_name(version: str) -> None:
    with pytest.raises(ValueError, match="dataset_version"):
        RunInput(dataset_version=version)


@pytest.mark.parametrize(
    ("key", "batch"),
    [
        ("incoming/b1/images/x.jpg", "b1"),
        ("incoming/b1/_COMPLETE", "b1"),
        ("incoming/b1", None),
        ("incoming//x.jpg", None),
        ("dataset/images/b1/x.jpg", None),
    ],
)
def test_the_batch_of_a_key_is_the_folder_under_incoming(key: str, batch: str | None) -> None:
    assert batch_of(key) == batch
