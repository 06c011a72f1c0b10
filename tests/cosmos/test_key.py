"""A malformed ``cosmos_key`` is a setting to fix, not a network problem (issue 29, item 5): every
Cosmos DB adapter refuses it with a ``ConfigurationError`` (not retryable) that names the setting,
its variable and the fix, and never shows the key. A key azure-cosmos itself accepts is never
refused."""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

import pytest

from outbox.core.errors import (
    CheckpointError,
    CheckpointUnavailableError,
    ConfigurationError,
    OutboxError,
)
from outbox.core.settings import Settings

pytest.importorskip("azure.cosmos", reason="pip install 'delta-outbox[azure]'")

BAD_KEYS = ["not-base64!!", "abc", "!!!!", "clé-sans-base64"]


def _adapters() -> list[tuple[str, Callable[[Settings], Any]]]:
    from dispatcher.claims.cosmos import CosmosClaimLog
    from dispatcher.queue.inbox_cosmos import CosmosInbox
    from rescuer.checkpoint_cosmos import CosmosCheckpointStore

    return [
        ("checkpoints", CosmosCheckpointStore.from_settings),
        ("inbox", lambda s: CosmosInbox.from_settings(s, "consumer")),
        ("claim log", CosmosClaimLog.from_settings),
    ]


def _assert_names_the_setting(error: OutboxError, key: str) -> None:
    text = str(error)
    assert type(error) is ConfigurationError
    assert not error.retryable
    assert text.startswith("setting 'cosmos_key' is not a valid Cosmos DB account key")
    assert "OUTBOX_COSMOS_KEY" in text
    assert "unreachable" not in text
    assert key not in text  # a secret, even a wrong one


@pytest.mark.parametrize("key", BAD_KEYS)
def test_make_client_refuses_a_key_that_is_not_base64(key: str) -> None:
    from outbox.core.cosmos import make_client

    with pytest.raises(OutboxError) as err:  # no request is made: the port is closed anyway
        make_client(
            "https://127.0.0.1:1/",
            key,
            unavailable=CheckpointUnavailableError,
            failed=CheckpointError,
        )
    _assert_names_the_setting(err.value, key)


@pytest.mark.parametrize(("name", "open_adapter"), _adapters())
def test_every_adapter_reports_the_setting(
    name: str, open_adapter: Callable[[Settings], Any], tmp_path: Any
) -> None:
    settings = Settings(
        workspace=tmp_path / "ws",
        cosmos_endpoint="https://127.0.0.1:1/",
        cosmos_key="not-base64!!",
    )
    with pytest.raises(OutboxError) as err:
        open_adapter(settings)
    _assert_names_the_setting(err.value, "not-base64!!")


def test_the_sdk_failing_to_decode_the_key_is_translated_too() -> None:
    """Should the SDK decode the key later (a request signed after a key rotation, a new code
    path), its error still says which setting to fix."""
    from outbox.core.cosmos import translate

    error = translate(
        binascii.Error("Invalid base64-encoded string"),
        "reading the checkpoint",
        "https://account.documents.azure.com",
        unavailable=CheckpointUnavailableError,
        failed=CheckpointError,
    )
    _assert_names_the_setting(error, "Invalid base64")


@pytest.mark.parametrize("padding", ["\n", " ", '"'])
def test_a_key_the_sdk_accepts_is_not_refused(cosmos_endpoint: str, padding: str) -> None:
    """azure-cosmos decodes the key leniently (characters outside the alphabet are skipped), so
    a key pasted with a newline, a space or quotes works against the account: keep it working."""
    from outbox.core.cosmos import make_client
    from tests.cosmos.server import KEY

    key = f"{padding}{KEY}{padding}"
    client = make_client(
        cosmos_endpoint, key, unavailable=CheckpointUnavailableError, failed=CheckpointError
    )
    try:
        assert isinstance(list(client.list_databases()), list)
    finally:
        client.close()
