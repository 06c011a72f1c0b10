"""The declared public API, pinned (as httpx's tests/test_exported_members.py pins its own).

``PUBLIC`` is the one place that says which import paths a user may rely on and what each
exports; every other module is internal and may move. A name added to or dropped from a public
module's ``__all__`` fails here until this list changes with it, deliberately. The README's and
the docs' import lines use only these paths (plus ``outbox.testing``'s modules), and the paths
the README and docs showed before keep working.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("outbox", "dispatcher", "rescuer", "migrations")

_ERRORS = {
    "OutboxError",
    "ConfigurationError",
    "ShadowedPackageError",
    "DeltaNotConfiguredError",
    "ValidationError",
    "MessageTooLargeError",
    "SerializationError",
    "MissingDependencyError",
    "StoreError",
    "TableNotFoundError",
    "ChangeDataFeedDisabledError",
    "SchemaMismatchError",
    "ConcurrencyError",
    "CommitConflictError",
    "ClosedError",
    "WorkspaceError",
    "QueueError",
    "QueueUnavailableError",
    "LockLostError",
    "UnprocessableMessageError",
    "TransportError",
    "RetryableTransportError",
    "TransportUnavailableError",
    "PermanentTransportError",
    "UnknownDestinationError",
    "RescuerError",
    "EngineError",
    "HistoryGoneError",
    "DocumentNotFoundError",
    "TombstoneNotSentError",
}

#: The public import paths and exactly what each exports.
PUBLIC: dict[str, set[str]] = {
    "outbox": {
        "Outbox",
        "UnitOfWork",
        "Document",
        "OutboxMessage",
        "Settings",
        "Backends",
        "DispatchReport",
        "Clock",
        "ManualClock",
        "SystemClock",
        "read_documents",
        "current_sql",
        *_ERRORS,
    },
    "outbox.spark": {"SparkOutbox", "ApplyResult", "local_session"},
    "outbox.queue": {
        "SqlQueue",
        "MAX_DELIVERY_REASON",
        "Consumer",
        "ConsumerOptions",
        "QueueMessage",
        "ReceivedMessage",
        "PeekedMessage",
        "DeadLetter",
        "DeferMessage",
        "QueueStats",
        "QueueSender",
        "QueueReceiver",
        "QueueAdministration",
        "DeferringReceiver",
        "Inbox",
        "SqlInbox",
        "CosmosInbox",
        "ExponentialBackoff",
        "UnprocessableMessageError",
        "LockLostError",
    },
    "outbox.kafka": {
        "KafkaConsumer",
        "KafkaConsumerOptions",
        "BatchReport",
        "KafkaTransport",
        "KafkaConfig",
    },
    "outbox.transports": {
        "Transport",
        "TransportMessage",
        "InMemoryTransport",
        "SqlQueueTransport",
        "GeoReplicatedTransport",
        "SqlClaimLog",
        "ServiceBusTransport",
    },
    "outbox.rescuer": {
        "run_pass",
        "RescuePass",
        "PassReport",
        "Checkpoint",
        "CheckpointStore",
        "SqlCheckpointStore",
        "InMemoryCheckpointStore",
        "LocalEngine",
        "SparkEngine",
        "CommandSink",
        "QueueSink",
        "InMemorySink",
    },
    "outbox.plugins": {
        "Backend",
        "BackendOptions",
        "setting",
        "Registry",
        "CosmosOptions",
        "KafkaOptions",
        "MqttOptions",
        "ServiceBusOptions",
    },
    "outbox.cli": {"main"},
}

#: Public too, module by module: the testing kit (contract suites and fakes, imported by path:
#: ``from outbox.testing.contracts.transport import TransportContract``).
PUBLIC_PREFIXES = ("outbox.testing",)

#: Paths the README and docs showed before this API was declared: each still gives the same object.
OLD_PATHS = {
    ("outbox.app.spark", "SparkOutbox"): ("outbox.spark", "SparkOutbox"),
    ("dispatcher.queue", "SqlQueue"): ("outbox.queue", "SqlQueue"),
    ("dispatcher.queue", "Consumer"): ("outbox.queue", "Consumer"),
    ("dispatcher.queue", "UnprocessableMessageError"): ("outbox", "UnprocessableMessageError"),
    ("dispatcher.queue.inbox", "SqlInbox"): ("outbox.queue", "SqlInbox"),
    ("dispatcher.queue.inbox_cosmos", "CosmosInbox"): ("outbox.queue", "CosmosInbox"),
    ("dispatcher.kafka.consumer", "KafkaConsumer"): ("outbox.kafka", "KafkaConsumer"),
    ("dispatcher.kafka.config", "KafkaConfig"): ("outbox.kafka", "KafkaConfig"),
    ("dispatcher.transports.geo", "GeoReplicatedTransport"): (
        "outbox.transports",
        "GeoReplicatedTransport",
    ),
    ("dispatcher.servicebus.transport", "ServiceBusTransport"): (
        "outbox.transports",
        "ServiceBusTransport",
    ),
    ("rescuer.runner", "run_pass"): ("outbox.rescuer", "run_pass"),
    ("outbox.wiring", "Backends"): ("outbox", "Backends"),
    # before the renovation (issue 30) moved them under outbox.app
    ("outbox.app.cli", "main"): ("outbox.cli", "main"),
    ("rescuer.spark_job", "main"): ("outbox.app.spark.rescue_job", "main"),
}


#: The testing kit's contract suites and fakes, where its docstring and docs/ name them (the kit
#: exports nothing from ``outbox.testing`` itself: a user picks the module).
TESTING = {
    "outbox.testing.contracts.transport": "TransportContract",
    "outbox.testing.contracts.queue": "QueueContract",
    "outbox.testing.contracts.checkpoint_store": "CheckpointStoreContract",
    "outbox.testing.contracts.inbox": "InboxConsumerContract",
    "outbox.testing.contracts.command_sink": "CommandSinkContract",
    "outbox.testing.contracts.rescuer_engine": "RescuerEngineContract",
    "outbox.testing.contracts.claim_log": "ClaimLogContract",
    "outbox.testing.contracts.key_lines": "KeyLinesContract",
    "outbox.testing.contracts.document_store": "DocumentStoreContract",
    "outbox.testing.faulty": "FaultyTransport",
}


def is_public(module: str) -> bool:
    return module in PUBLIC or any(
        module == p or module.startswith(p + ".") for p in PUBLIC_PREFIXES
    )


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_exactly_the_listed_names(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), f"{module}.__all__ names one twice"
    assert set(exported) == PUBLIC[module]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_exported_name_resolves_to_ours(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        value = getattr(mod, name)
        assert name in dir(mod)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.split(".")[0] in OURS, f"{module}.{name}: {value.__module__}"
            assert value.__name__ == name, f"{module}.{name} is {value.__name__}"


@pytest.mark.parametrize(("module", "name"), sorted(TESTING.items()))
def test_the_kits_suites_and_fakes_are_where_the_docs_say(module: str, name: str) -> None:
    assert inspect.isclass(getattr(importlib.import_module(module), name))


def test_an_unknown_name_is_an_attribute_error() -> None:
    import outbox.queue

    with pytest.raises(AttributeError, match="has no attribute 'SqlQeue'"):
        _ = outbox.queue.SqlQeue  # type: ignore[attr-defined]


@pytest.mark.parametrize(("old", "new"), sorted(OLD_PATHS.items()))
def test_old_paths_keep_working(old: tuple[str, str], new: tuple[str, str]) -> None:
    was = getattr(importlib.import_module(old[0]), old[1])
    assert was is getattr(importlib.import_module(new[0]), new[1])


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run(["-c", code], cwd)


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args``, from ``cwd``, with the repository first on the path."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=_env(),
    )


def _env() -> dict[str, str]:
    """This process's environment with the repository first on the path (as pytest has it)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p)}


def test_importing_the_public_modules_loads_no_heavy_dependency() -> None:
    """``import outbox`` (and the other public modules) stays light: PySpark, librdkafka, the
    Azure SDKs, SQLAlchemy, deltalake and the dispatcher load when a name is first used."""
    heavy = ("pyspark", "confluent_kafka", "azure", "sqlalchemy", "deltalake", "dispatcher")
    code = (
        "import sys\n"
        f"import {', '.join(m for m in PUBLIC if m != 'outbox.cli')}\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_import_outbox_loads_only_the_lazy_table() -> None:
    """``import outbox`` loads three modules of ours and nothing else of ours (measured: as fast
    as before the public API, ``python -X importtime -c "import outbox"``)."""
    code = (
        "import sys\n"
        "import outbox\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OURS!r}))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(["outbox", "outbox.core", "outbox.core.lazy"])


def test_the_old_cli_module_runs(tmp_path: Path) -> None:
    proc = _run(["-m", "outbox.cli", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: python -m outbox.cli" in proc.stdout


# --- the docs use only public paths -------------------------------------------------------------

_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(.+)|import[ \t]+([\w., \t]+))$", re.M
)


def doc_imports() -> list[tuple[str, str, str]]:
    """(file, module, line) for each import line in a code block of README.md and docs/*.md."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in _FENCE.findall(path.read_text()):
            for m in _IMPORT.finditer(block):
                line = m.group(0).strip()
                modules = [m.group(1)] if m.group(1) else m.group(3).split(",")
                for module in modules:
                    found.append((path.name, module.strip().split(" as ")[0], line))
    return found


def test_the_docs_import_only_public_paths() -> None:
    imports = doc_imports()
    assert any(module == "outbox" for _, module, _ in imports)
    private = [
        f"{name}: {line}"
        for name, module, line in imports
        if module.split(".")[0] in OURS and not is_public(module)
    ]
    assert private == [], "use a public path (tests/test_exported_members.py, PUBLIC)"


def test_the_docs_check_finds_a_private_import() -> None:
    """The scan above can fail: an internal path in a block is found."""
    text = (
        "```python\nimport json\n\nfrom dispatcher.queue import SqlQueue\n"
        "    import outbox.app.facade, os\n```\n"
    )
    found = [
        (m.group(1) or m.group(3)).strip()
        for b in _FENCE.findall(text)
        for m in _IMPORT.finditer(b)
    ]
    assert found == ["json", "dispatcher.queue", "outbox.app.facade, os"]
    assert not is_public("dispatcher.queue")
    assert not is_public("outbox.app.facade")


#: A backticked dotted path in prose: `dispatcher.queue.SqlQueue`, `rescuer.checkpoint.X`.
_PROSE_PATH = re.compile(r"`((?:dispatcher|rescuer|migrations|outbox)(?:\.\w+)+)`")


def _public_home(path: str) -> str | None:
    """The public path of the name a dotted prose path ends in, when the path is internal and a
    public module exports that name (``outbox.queue.SqlQueue`` for
    ``dispatcher.queue.SqlQueue``)."""
    module, _, name = path.rpartition(".")
    if is_public(module) or not name[:1].isupper():
        return None  # already public, or a module/function named for what it is inside
    homes = sorted(f"{m}.{name}" for m, names in PUBLIC.items() if name in names)
    return homes[0] if homes else None


def prose_paths(text: str) -> list[tuple[str, str]]:
    """(internal path, public path) for each internal path in ``text``'s prose and tables whose
    name a public module exports."""
    out = []
    for m in _PROSE_PATH.finditer(_FENCE.sub("", text)):
        home = _public_home(m.group(1))
        if home is not None:
            out.append((m.group(1), home))
    return out


def test_the_docs_prose_names_public_paths() -> None:
    """Prose and tables name a class by its public path where it has one (a user copies what the
    text says as much as what a code block imports). design.md and development.md describe the
    inside, by its inside paths."""
    inside = {"design.md", "development.md"}
    found = [
        f"{path.name}: `{internal}` -> `{public}`"
        for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        if path.name not in inside
        for internal, public in prose_paths(path.read_text())
    ]
    assert found == [], "name the public path in the docs"


def test_the_prose_check_finds_an_internal_path() -> None:
    """The scan above can fail: an internal path to a public class is found, a public path, a
    module path and an internal class nobody exports are not."""
    text = (
        "The queue (`dispatcher.queue.SqlQueue`) and `outbox.queue.SqlQueue` and "
        "`dispatcher.queue.receiver` and `dispatcher.claims.ports.ClaimLog`.\n"
        "```python\nx = `dispatcher.queue.Consumer`\n```\n"
    )
    assert prose_paths(text) == [("dispatcher.queue.SqlQueue", "outbox.queue.SqlQueue")]
