"""Kafka dead-letter topics in the console (issue 46, item 3): the same list, show and requeue as
the SQL queue's dead letters, for each topic ``outbox console --kafka-dead-letters TOPIC``
names, through ``dispatcher.kafka.dead_letters.KafkaDeadLetters`` (what ``outbox dead-letters
--kafka-topic`` uses).

What Kafka cannot do is said, not faked: a record cannot be deleted from a topic, so there is no
purge, and a requeued record stays in the dead-letter topic (its copy goes back to the topic it
came from with its key, message id and headers; the consumer's inbox runs the handler once).
Each page reads the topic afresh (a dead-letter topic is small by design: a large one is read
whole on each page, which this page's speed follows)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flask import Flask, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from outbox.app.console import access, params, reads
from outbox.app.console import security as sec
from outbox.app.operators import Audit, ids_target
from outbox.core.errors import MessageNotFoundError

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

log = logging.getLogger("outbox.console")

PAGE_SIZE = 50


def register(app: Flask, config: ConsoleConfig, sessions: sec.Sessions, audit: Audit) -> None:
    topics = config.kafka_topics

    def open_topic() -> tuple[str, Any]:
        topic = request.values.get("topic", "")
        if config.kafka_dead_letters is None or topic not in topics:
            abort(404, "this console shows no such Kafka dead-letter topic "
                       "(outbox console --kafka-dead-letters TOPIC names them)")  # fmt: skip
        return topic, config.kafka_dead_letters(topic)

    @app.get("/kafka")
    def kafka_dead_letters() -> str:
        topic, letters = open_topic()
        before = params.dead_letter_id(request.args.get("before"), "before")
        shown, total, more = letters.page(before, PAGE_SIZE)  # newest first; reads only those
        return render_template(
            "kafka_dead_letters.html", page="kafka", topic=topic, topics=topics, rows=shown,
            total=total, next_before=shown[-1].id if more else None,
            first_page=before is None,
        )  # fmt: skip

    @app.get("/kafka/show")
    def kafka_dead_letter() -> str | tuple[str, int]:
        topic, letters = open_topic()
        dead_id = params.dead_letter_id(request.args.get("id"), "id")
        try:
            d = letters.get_dead_letter(dead_id or 0)
        except MessageNotFoundError as e:
            return render_template("error.html", title=f"No dead letter {dead_id} in {topic}",
                                   detail=str(e), hint=None), 404  # fmt: skip
        return render_template(
            "kafka_dead_letter.html", page="kafka", topic=topic, d=d,
            body=reads.show_body(d.body), headers=reads.pretty(d.headers),
        )  # fmt: skip

    @app.post("/kafka/confirm")
    def kafka_confirm() -> str | tuple[str, int]:
        refused = access.refusal(config, sessions)
        if refused:
            return refused
        topic, letters = open_topic()
        ids = params.dead_letter_ids(request.form)
        found = letters.by_ids(ids)
        return render_template(
            "kafka_confirm.html", page="kafka", topic=topic, ids=[d.id for d in found],
            shown=found[:20],
        )  # fmt: skip

    @app.post("/kafka/apply")
    def kafka_apply() -> Response | tuple[str, int]:
        refused = access.refusal(config, sessions)
        if refused:
            return refused
        topic, letters = open_topic()
        ids = params.dead_letter_ids(request.form)
        done = letters.requeue(ids=ids) if ids else 0
        target = f"{topic}: " + ids_target("dead letters", ids)
        audit.record(
            access.actor(sessions), "kafka-dead-letters.requeue", target, f"{done:,} requeued"
        )
        flash(f"{done:,} dead letter{'s' if done != 1 else ''} of {topic} requeued (they stay in "
              "the dead-letter topic too: Kafka cannot delete a record).")  # fmt: skip
        return redirect(url_for("kafka_dead_letters", topic=topic))


#: Builds a topic's dead letters: ``KafkaDeadLetters(KafkaConfig.from_settings(...), topic)``.
OpenTopic = Callable[[str], Any]
