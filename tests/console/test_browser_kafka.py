"""Kafka dead-letter topics in Chromium (issue 46, item 3), against the real broker and
``outbox console --kafka-dead-letters TOPIC`` started as a user starts it: the list, one record
with its body shown as text, and a requeue of a ticked record behind the token and the
confirmation (the copy back on the topic it came from; the record stays in the dead-letter
topic). The browser fixtures are in this folder's conftest, the topics the test client's
Kafka test's."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.browser import by, every, go, start_console
from testkit.kafka import KafkaBroker, read_records
from tests.console.conftest import ConsoleWorkspace, quiet
from tests.console.test_browser import _unlock_in
from tests.kafka.test_console_kafka_dead_letters import dead_lettered_topics


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_a_kafka_dead_letter_listed_shown_and_requeued_in_chromium(
    console_ws: ConsoleWorkspace, browser: Any, kafka: KafkaBroker
) -> None:
    orders, dlt = dead_lettered_topics(kafka)
    quiet(console_ws.path)
    with (console_ws.path / "outbox.toml").open("a") as settings:
        settings.write(f'kafka_bootstrap_servers = "{kafka.bootstrap}"\n')
    console = start_console(console_ws.path, "--kafka-dead-letters", dlt)
    try:
        browser.get(console.url + f"kafka?topic={dlt}")
        assert by(browser, "#total").text == "2 records."
        cells = [r.text for r in every(browser, "#kafka-dead-letters tbody td.mono")]
        assert cells == ["m-1", "m-0"]  # newest first
        assert "Purge" not in browser.page_source
        go(browser, "#show-2")
        assert by(browser, "#reason").text == "Poison"
        assert '"order": "<b>7</b>"' in by(browser, "#body").text  # markup shown as text

        _unlock_in(browser, console)
        browser.get(console.url + f"kafka?topic={dlt}")
        by(browser, "#select-1").click()
        go(browser, "#requeue-selected")
        go(browser, "#confirm")
        assert "1 dead letter of" in by(browser, ".flash").text
        back = read_records(kafka.bootstrap, orders)
        assert [(r.key(), r.value()) for r in back] == [(b"cust-0", b'{"order": 1}')]
        assert len(read_records(kafka.bootstrap, dlt)) == 2  # Kafka deletes nothing
    finally:
        assert console.stop() == 0
