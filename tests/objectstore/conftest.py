"""Object-store fixtures: Azurite and the S3 server for the session (one of each per test worker),
and a fresh container or bucket per test. Under ``CI=true`` a server that cannot start fails the
test; elsewhere it skips with the command that installs it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.local_server import unavailable
from tests.objectstore.servers import MOTO_MISSING, Azurite, MotoS3, azurite_bin, moto_bin

#: The servers this test process started, by fixture name: one each per process, whichever
#: conftest registers the fixture (see ``azurite_server``).
_STARTED: dict[str, Any] = {}


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Azurite]:
    """Azurite, once per test process. deltalake finds it through this process's
    ``AZURITE_BLOB_STORAGE_URL``, so there must be one: tests/erasure's conftest imports this
    fixture, which pytest registers as a second session fixture, and its second server took the
    variable from the first's tests, whose containers then "did not exist" (seen in CI on the
    worker that ran both folders, depending on the order)."""
    pytest.importorskip("azure.storage.blob", reason="the dev install has azure-storage-blob")
    shared = _STARTED.get("azurite")
    if shared is not None:
        yield shared
        return
    binary = azurite_bin()
    if binary is None:
        unavailable("Azurite is not installed; run scripts/ensure-azurite.sh")
    server = _STARTED["azurite"] = Azurite(binary)
    server.start()
    os.environ.update(server.environment())  # deltalake reads it in this process
    try:
        yield server
    finally:
        del _STARTED["azurite"]
        # Its data is thrown away: no graceful close, which takes Azurite 10 s once it has
        # served requests (as tests/benchmarks/conftest.py's fixture does).
        if server._proc is not None:
            server._proc.kill()
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3]:
    """moto's S3 server, once per test process, as ``azurite_server`` (a second one would only
    cost its start: its tables name their endpoint in their storage options)."""
    shared = _STARTED.get("s3")
    if shared is not None:
        yield shared
        return
    binary = moto_bin()
    if binary is None:
        unavailable(MOTO_MISSING)
    server = _STARTED["s3"] = MotoS3(binary)
    server.start()
    try:
        yield server
    finally:
        del _STARTED["s3"]
        server.stop()


@dataclass
class Remote:
    """One object store, as a test uses it: where a fresh table goes, and how to reach it."""

    kind: str  # "azure" or "s3"
    root: str  # az://container or s3://bucket, created for this test
    storage_options: dict[str, str]
    environment: dict[str, str] = field(default_factory=dict)

    def uri(self, name: str = "documents") -> str:
        return f"{self.root}/{name}"


def _fresh(server: Any, kind: str) -> Remote:
    name = f"t{uuid.uuid4().hex[:16]}"
    if kind == "azure":
        # deltalake would look for the container on whichever Azurite the variable names
        assert os.environ.get("AZURITE_BLOB_STORAGE_URL") == server.url, "two Azurites"
        server.create_container(name)
        root = f"az://{name}"
    else:
        server.create_bucket(name)
        root = f"s3://{name}"
    return Remote(kind, root, server.storage_options(), server.environment())


@pytest.fixture(params=["azure", "s3"])
def remote(request: pytest.FixtureRequest) -> Remote:
    """A fresh container (Azurite) or bucket (S3 server), once per store kind."""
    server = request.getfixturevalue("azurite_server" if request.param == "azure" else "s3_server")
    return _fresh(server, request.param)


@pytest.fixture
def azure_remote(azurite_server: Azurite) -> Remote:
    return _fresh(azurite_server, "azure")


@pytest.fixture
def s3_remote(s3_server: MotoS3) -> Remote:
    return _fresh(s3_server, "s3")
