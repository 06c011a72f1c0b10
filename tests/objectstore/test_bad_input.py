"""A table on an object store, set up wrong as a new user would (issue 32): each mistake gives one
``error: ...`` line that names the cause and the fix, through a real process running the
``outbox`` command (so the Rust side's own stderr, such as the AWS SDK's WARN lines, would show),
with no traceback and no object_store error chain. Exit code 1 (an ``OutboxError``), for
``migrate`` and ``status``.

The module's command lines run in two child processes, Azure's and S3's (``tests.cli_child``:
each command with its own environment, stdout and stderr file descriptors and exit code), started
once for the module: a process each cost an interpreter start and the product's imports, about
two seconds a case. The exception: a case that tries the credential chain (``ALONE``) runs in an
``outbox`` process of its own, because the AWS SDK warns about the metadata endpoint only the
first time a process tries it: in a shared child, a Rust log let through (``RUST_LOG=warn``)
showed in the first S3 case only, and the "no credentials" case passed whatever the filter. The
tests then read their own command's outcome.

The servers are real (Azurite, moto's S3 server); a wrong S3 key needs moto's key-checking mode,
so that case has a server of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from outbox.testing.servers import free_port
from tests.cli_child import Done, Run, run_commands
from tests.local_server import unavailable
from tests.objectstore.servers import ACCOUNT, ACCOUNT_KEY, MOTO_MISSING, Azurite, MotoS3, moto_bin

#: The module's tests read the outcomes of one set of processes: they go to one xdist worker, and
#: the first one's set-up runs all the commands (bounded as the processes are, not as one test).
pytestmark = [pytest.mark.xdist_group("objectstore-bad-input"), pytest.mark.timeout(900)]
_AZURE_FIX = "the account key (azure_storage_account_key, or AZURE_STORAGE_ACCOUNT_KEY)"
_S3_FIX = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


@dataclass
class Case:
    uri: str
    options: dict[str, str]
    environment: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def s3_checking_keys() -> Iterator[MotoS3]:
    binary = moto_bin()
    if binary is None:
        unavailable(MOTO_MISSING)
    server = MotoS3(binary, checks_keys=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def servers(azurite_server: Azurite, s3_server: MotoS3, s3_checking_keys: MotoS3) -> Servers:
    azurite_server.create_container_once("good")
    s3_server.create_bucket_once("good")
    return Servers(azurite_server, s3_server, s3_checking_keys)


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


@dataclass
class Servers:
    azurite: Azurite
    s3: MotoS3
    checking: MotoS3  # refuses every key

    def emulator(self, url: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
        return {"azure_storage_use_emulator": "true"}, {
            "AZURITE_BLOB_STORAGE_URL": url or self.azurite.url
        }

    def shared_key(self, key: str) -> dict[str, str]:
        return {
            "azure_storage_account_name": ACCOUNT,
            "azure_storage_endpoint": f"{self.azurite.url}/{ACCOUNT}",
            "azure_storage_account_key": key,
        }

    def s3_without(self, option: str) -> dict[str, str]:
        return {k: v for k, v in self.s3.storage_options().items() if k != option}


_GOOD_AZ = "az://good/documents"
_GOOD_S3 = "s3://good/documents"
#: each mistake: the table it names, made from the running servers
BUILD: dict[str, Callable[[Servers], Case]] = {
    "azure: missing container": lambda s: Case("az://nope/documents", *s.emulator()),
    "azure: unreachable": lambda s: Case(_GOOD_AZ, *s.emulator(_closed_port_url())),
    "azure: no credentials": lambda s: Case(_GOOD_AZ, {"azure_storage_account_name": "someone"}),
    "azure: wrong key": lambda s: Case(
        _GOOD_AZ, {**s.shared_key("d3Jvbmc="), "allow_http": "true"}
    ),
    "azure: http endpoint without allow_http": lambda s: Case(_GOOD_AZ, s.shared_key(ACCOUNT_KEY)),
    "s3: missing bucket": lambda s: Case("s3://nope/documents", s.s3.storage_options()),
    "s3: unreachable": lambda s: Case(
        _GOOD_S3, {**s.s3.storage_options(), "AWS_ENDPOINT_URL": _closed_port_url()}
    ),
    "s3: no credentials": lambda s: Case(_GOOD_S3, {"AWS_REGION": "us-east-1"}),
    "s3: wrong key": lambda s: Case(_GOOD_S3, s.checking.storage_options()),
    "s3: http endpoint without AWS_ALLOW_HTTP": lambda s: Case(
        _GOOD_S3, s.s3_without("AWS_ALLOW_HTTP")
    ),
}


CASES = {
    "azure: missing container": (
        "the container 'nope' does not exist (fix: create it (az storage container create --name "
        "nope), or fix table_uri)"
    ),
    "azure: unreachable": (
        "the store did not answer (fix: check the endpoint (azure_storage_endpoint / "
        "AZURITE_BLOB_STORAGE_URL) and the network; retried by the next run)"
    ),
    "azure: no credentials": f"no credentials for the storage account (fix: set {_AZURE_FIX}",
    "azure: wrong key": f"the storage account refused the credentials (fix: check {_AZURE_FIX}",
    "azure: http endpoint without allow_http": (
        "the endpoint is plain http, which the client refuses by default (fix: set allow_http = "
        '"true" in [storage_options] (only for a local emulator), or use https)'
    ),
    "s3: missing bucket": (
        "the bucket 'nope' does not exist (fix: create it (aws s3 mb s3://nope), or fix table_uri)"
    ),
    "s3: unreachable": (
        "the store did not answer at {endpoint} (fix: check the endpoint (AWS_ENDPOINT_URL) and "
        "the network; retried by the next run)"
    ),
    "s3: no credentials": f"no credentials for S3 (fix: set {_S3_FIX}",
    "s3: wrong key": f"S3 refused the credentials (fix: check {_S3_FIX}",
    "s3: http endpoint without AWS_ALLOW_HTTP": (
        "the endpoint is plain http, which the client refuses by default (fix: set AWS_ALLOW_HTTP "
        '= "true" in [storage_options] (only for a local server), or use https)'
    ),
}


#: The cases that try a credential chain: each command in a process of its own (the module's
#: docstring says why). With ``RUST_LOG=warn`` let through, a process per command, only S3's
#: prints Rust log lines (the SDK's, about the metadata endpoint): no other case can hide one.
ALONE = frozenset({"azure: no credentials", "s3: no credentials"})
WRONG = [(name, command) for name in CASES for command in ("migrate", "status")]
NO_TABLE = "no table"
NO_TABLE_COMMANDS = ("status", "rescue", "maintain")
NO_TABLE_URI = "s3://good/never-migrated"


@dataclass
class Outcomes:
    """What each command line of the module did."""

    wrong: dict[tuple[str, str], tuple[Case, Done]]
    no_table: dict[str, Done]


def _workspace(where: Path, uri: str, options: dict[str, str]) -> Path:
    where.mkdir()
    lines = [f'table_uri = "{uri}"', "[storage_options]"]
    lines += [f'{k} = "{v}"' for k, v in options.items()]
    (where / "outbox.toml").write_text("\n".join(lines) + "\n")
    return where


@pytest.fixture(scope="module")
def outcomes(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    root = tmp_path_factory.mktemp("bad-store-settings")
    runs: dict[tuple[str, str], Run] = {}
    cases: dict[tuple[str, str], Case] = {}
    for i, (name, command) in enumerate(WRONG):
        case = cases[(name, command)] = BUILD[name](servers)
        ws = _workspace(root / f"ws{i}", case.uri, case.options)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "AZURE_", "AZURITE_")) and k != "RUST_LOG"
        }
        env.update(case.environment)
        runs[(name, command)] = (["-w", str(ws), command], env)
    for command in NO_TABLE_COMMANDS:
        ws = _workspace(root / f"never-{command}", NO_TABLE_URI, servers.s3.storage_options())
        runs[(NO_TABLE, command)] = (["-w", str(ws), command], dict(os.environ))
    alone = [key for key in runs if key[0] in ALONE]
    # Azure's commands and S3's in a child each, side by side with the others: most of their
    # time is spent waiting for a refused connection's retries (the unreachable cases).
    azure = [k for k in runs if k[0] not in ALONE and k[0].startswith("azure")]
    s3 = [k for k in runs if k[0] not in ALONE and k not in azure]
    alone_done, (azure_done, s3_done) = run_commands(
        [runs[k] for k in alone], [[runs[k] for k in azure], [runs[k] for k in s3]], root / "runs"
    )
    done = dict(zip([*alone, *azure, *s3], [*alone_done, *azure_done, *s3_done], strict=True))
    return Outcomes(
        {key: (cases[key], done[key]) for key in WRONG},
        {command: done[(NO_TABLE, command)] for command in NO_TABLE_COMMANDS},
    )


@pytest.mark.parametrize("command", ["migrate", "status"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_wrong_object_store_setting_is_one_line_with_its_fix(
    name: str, command: str, outcomes: Outcomes
) -> None:
    case, done = outcomes.wrong[(name, command)]
    expected = CASES[name].format(endpoint=case.options.get("AWS_ENDPOINT_URL"))
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr  # one line: no WARN, no chain, no traceback
    assert done.stderr.startswith(f"error: cannot reach the Delta table at {case.uri}: {expected}")
    secrets = [v for k, v in case.options.items() if "key" in k.lower() or "secret" in k.lower()]
    assert not [v for v in secrets if v in done.stderr]  # names the settings, never their values


def test_every_mistake_has_its_expected_line() -> None:
    assert set(BUILD) == set(CASES)
    assert {*CASES, NO_TABLE} >= ALONE


@pytest.mark.parametrize("command", NO_TABLE_COMMANDS)
def test_a_path_with_no_table_names_migrate(command: str, outcomes: Outcomes) -> None:
    """Reachable store, right credentials, but nothing migrated there yet."""
    done = outcomes.no_table[command]
    assert (done.returncode, done.stdout) == (1, "")
    assert (
        done.stderr
        == f"error: no Delta table at {NO_TABLE_URI} (fix: run `outbox migrate` to create it)\n"
    )
