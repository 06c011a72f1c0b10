"""The Spark engine receives the settings' ``storage_options`` as Hadoop reader options."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rescuer.planner import FeedWindow


class _Reader:
    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen = seen

    def format(self, _name: str) -> _Reader:
        return self

    def options(self, **opts: Any) -> _Reader:
        self.seen.update(opts)
        return self

    def option(self, key: str, value: Any) -> _Reader:
        self.seen[key] = value
        return self

    def load(self, _uri: str) -> _Reader:
        return self

    def select(self, *_cols: Any) -> _Reader:
        return self


class _Spark:
    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    @property
    def read(self) -> _Reader:
        return _Reader(self.seen)


def test_make_engine_passes_storage_options_to_spark(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from outbox.core.settings import Settings
    from outbox.wiring import Backends
    from rescuer import cdf_spark

    spark = _Spark()
    monkeypatch.setattr(cdf_spark, "get_spark", lambda: spark)
    options = {
        "AWS_ACCESS_KEY_ID": "AK",
        "aws_secret_access_key": "SK",
        "azure_storage_account_name": "acct",
        "azure_storage_account_key": "KEY",
        "fs.gs.auth.type": "APPLICATION_DEFAULT",
        "azure_storage_sas_token": "secret-sas",
    }
    with caplog.at_level(logging.WARNING, logger="outbox.rescuer"):
        engine = Backends(Settings(storage_options=options)).rescuer_engine("spark")
    engine.feed_frame("s3://b/t", FeedWindow(1, 2, 3))  # type: ignore[attr-defined]
    assert spark.seen["fs.s3a.access.key"] == "AK"
    assert spark.seen["fs.s3a.secret.key"] == "SK"
    assert spark.seen["fs.azure.account.key.acct.dfs.core.windows.net"] == "KEY"
    assert spark.seen["fs.gs.auth.type"] == "APPLICATION_DEFAULT"
    assert spark.seen["readChangeFeed"] == "true"
    assert "secret-sas" not in spark.seen.values()
    # what could not be passed is named (never its value)
    assert "azure_storage_sas_token" in caplog.text
    assert "secret-sas" not in caplog.text
