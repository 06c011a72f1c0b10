"""What was committed, read from the table's own change data feed, and the I4 checks on it.

Why the feed and not the writers' own records: a writer can be SIGKILLed between its commit and
writing down what it committed, and the table drops sent messages from a row on the next save. The
feed keeps every committed image of every row, so the union of the messages in those images is
exactly "what was committed", whoever wrote it and whatever happened to them afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from outbox.core.model import OutboxMessage

FEED_COLUMNS = [
    "id",
    "version",
    "incarnation",
    "last_seq",
    "dispatched_seq",
    "outbox",
    "type",
    "state",
    "deleted",
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
]


@dataclass
class Image:
    """A document as a commit wrote it (a version row: ``version`` > 0)."""

    id: str
    life: str  # the truth's key of its life (``_life``)
    version: int
    incarnation: str | None
    type: str | None
    state: str | None
    last_seq: int
    deleted: bool


@dataclass
class Documents:
    """The model of the current documents, from the feed: what the commits *meant*, not a fold of
    the rows the table keeps (the readers' rule, ``outbox.delta.current``, which this checks).

    An id's document is the newest version any commit wrote for it (a fold's raised post-image
    of that version rewrites it, an older version's image changes nothing); a tombstone
    (``deleted``) means deleted; an id whose every row was removed (an erasure job's delete, or
    the fold once a tombstone's last messages were sent) is deleted too. A new life written over a
    tombstone must come after the tombstone's life's watermark reached its ``last_seq`` (a create
    over an unsent tombstone is refused): anything else is a ``violations`` entry."""

    images: dict[str, Image | None] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)  # id -> rows present (marks included)
    tombstones: int = 0  # tombstones written (a delete through the library)
    new_lives: int = 0  # lives started over a tombstone whose last messages were sent
    violations: list[str] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)  # life -> its highest watermark
    _written: dict[str, Image] = field(default_factory=dict)  # this commit's newest, per id
    _touched: set[str] = field(default_factory=set)

    def row(self, r: dict[str, Any], life: str, *, written: bool) -> None:
        """One change row of the commit being read."""
        doc_id = str(r["id"])
        self._touched.add(doc_id)
        self.rows[doc_id] = self.rows.get(doc_id, 0) + (1 if written else -1)
        version = int(r.get("version") or 0)
        if not written or version <= 0:
            return
        image = Image(
            id=doc_id,
            life=life,
            version=version,
            incarnation=r.get("incarnation"),
            type=r.get("type"),
            state=r.get("state"),
            last_seq=int(r["last_seq"]),
            deleted=bool(r.get("deleted")),
        )
        before = self._written.get(doc_id)
        if before is None or image.version >= before.version:
            self._written[doc_id] = image

    def end_commit(self, watermark: dict[str, int], version: int) -> None:
        for doc_id in sorted(self._touched):
            now = self.images.get(doc_id)
            image = self._written.get(doc_id)
            if image is not None and (now is None or image.version >= now.version):
                self._replace(now, image, watermark, version)
            if self.rows.get(doc_id, 0) <= 0:
                self.images[doc_id] = None  # every row removed: no document
        self._written.clear()
        self._touched.clear()

    def _replace(self, now: Image | None, image: Image, watermark: dict[str, int], v: int) -> None:
        same = now is not None and (now.version, now.life) == (image.version, image.life)
        if image.deleted and not same:
            self.tombstones += 1
        if now is not None and now.deleted and now.life != image.life:
            sent = watermark.get(now.life, 0)
            if sent < now.last_seq:
                self.violations.append(
                    f"{image.id}: a new life at version {v} over a tombstone whose last messages "
                    f"were not sent (watermark {sent} < last_seq {now.last_seq})"
                )
            self.new_lives += 1
        self.images[image.id] = image

    def current(self) -> dict[str, Image]:
        """The documents a reader must return: every id's document that is not deleted."""
        return {i: m for i, m in sorted(self.images.items()) if m is not None and not m.deleted}

    def deleted(self) -> list[str]:
        """The ids a reader must not return: deleted through the library, or every row gone."""
        return sorted(i for i, m in self.images.items() if m is None or m.deleted)


@dataclass
class Truth:
    """Committed messages per document (seq order), when each was first committed, and what the
    feed says about I4."""

    committed: dict[str, list[OutboxMessage]] = field(default_factory=dict)
    committed_at: dict[str, float] = field(default_factory=dict)  # message_id -> epoch seconds
    versions: int = 0
    watermark_regressions: list[str] = field(default_factory=list)  # I4: a sent message came back
    seq_gaps: list[str] = field(default_factory=list)  # a committed seq missing from every image
    changed_content: list[str] = field(default_factory=list)  # same message id, other content
    doc_ids: set[str] = field(default_factory=set)  # the table's document ids
    #: The model of the current documents (``Documents``): what each id's commits made of it.
    model: Documents = field(default_factory=Documents)


WRITTEN = ("insert", "update_postimage")
#: What was removed or replaced (a fold's superseded versions, the old image of a row it raised,
#: an erasure job's whole document).
GONE = ("delete", "update_preimage")
#: The change rows the truth reads: the rows as written, and as removed.
READ = (*WRITTEN, *GONE)


def read_truth(delta_table: Any) -> Truth:
    import pyarrow as pa

    try:
        reader = delta_table.load_cdf(starting_version=0, columns=FEED_COLUMNS)
        rows = pa.RecordBatchReader.from_stream(reader).read_all().to_pylist()
    except pa.ArrowInvalid as e:
        if "nullable" not in str(e):
            raise
        # Change files written by Spark (``--writer spark``): delta-rs refuses them (below).
        return truth_from_images(read_feed_files(delta_table.table_uri))
    return truth_from_images(r for r in rows if str(r["_change_type"]) in READ)


def read_feed_files(table_uri: str) -> list[dict[str, Any]]:
    """The feed's inserts and post-images read from the log and the files themselves.

    Why: delta-spark writes every Parquet field nullable (and timestamps as INT96), and
    deltalake's ``load_cdf`` then refuses to cast the ``outbox`` structs to the table's
    non-nullable fields ("Cannot cast nullable struct field 'seq' to non-nullable field"); its
    plain scans accept the same files. Per commit, the change files (``cdc`` actions) when there
    are any, else the added files as inserts, as the Delta protocol defines the feed. Local
    tables only: the checker's workspace is a folder, and its log is never trimmed (see
    ``run._prepare``).
    """
    import pyarrow.parquet as pq

    root = _local_path(table_uri)
    log = root / "_delta_log"
    versions = sorted(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())
    if versions and versions[0] != 0:
        raise RuntimeError(f"the log of {table_uri} starts at version {versions[0]}, not 0")
    out: list[dict[str, Any]] = []
    wanted = [c for c in FEED_COLUMNS if not c.startswith("_commit")]
    for v in versions:
        actions = [
            json.loads(line)
            for line in (log / f"{v:020d}.json").read_text("utf-8").splitlines()
            if line.strip()
        ]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        at = info.get("inCommitTimestamp") or info.get("timestamp") or 0
        cdc = [a["cdc"]["path"] for a in actions if "cdc" in a]
        files = cdc or [a["add"]["path"] for a in actions if a.get("add", {}).get("dataChange")]
        for path in files:
            table = pq.read_table(root / unquote(path))
            names = [c for c in wanted if c in table.column_names]
            for r in table.select(names).to_pylist():
                if str(r.get("_change_type") or "insert") in READ:
                    out.append({**r, "_commit_version": v, "_commit_timestamp": at})
    return out


def _local_path(table_uri: str) -> Path:
    if "://" in table_uri and not table_uri.startswith("file://"):
        raise RuntimeError(f"{table_uri}: the checker reads a local table's change files only")
    return Path(unquote(urlparse(table_uri).path) if table_uri.startswith("file://") else table_uri)


def truth_from_images(images: Iterable[dict[str, Any]]) -> Truth:
    """``images``: feed rows (inserts, post-images and deletes) in any order.

    The watermark I4 speaks of is the document's (``outbox.delta.versions``): the highest
    ``dispatched_seq`` over its rows of one life, as they stand after each commit. A version row
    that carries a lower one than another row (a save that appended while a watermark raised
    the older row) is no regression; the document's watermark going down is."""
    from outbox.delta.schema import message_from_struct

    ordered = sorted(images, key=lambda r: int(r["_commit_version"]))
    truth = Truth()
    seen: dict[str, OutboxMessage] = {}
    watermark: dict[str, int] = {}
    # document life -> its rows, counted by (version, dispatched_seq): one per version of the
    # document, and any number of mark rows (version 0, one per watermark); a count is what the
    # commits so far added minus what they removed
    live: dict[str, dict[tuple[int, int], int]] = {}
    last: dict[str, int] = {}
    versions: set[int] = set()
    lives: dict[str, dict[Any, str]] = {}  # id -> incarnation -> key of that life
    touched: set[str] = set()
    for n, r in enumerate(ordered):
        doc = _life(lives, str(r["id"]), r.get("incarnation"))
        truth.doc_ids.add(str(r["id"]))
        version = int(r["_commit_version"])
        versions.add(version)
        rows = live.setdefault(doc, {})
        key = (int(r.get("version") or 0), int(r["dispatched_seq"]))
        touched.add(doc)
        if str(r.get("_change_type") or "insert") in GONE:  # a row removed, or its old image
            rows[key] = rows.get(key, 0) - 1
        else:
            rows[key] = rows.get(key, 0) + 1
            _messages(truth, seen, doc, r, message_from_struct)
            last[doc] = max(int(r["last_seq"]), last.get(doc, 0))
        truth.model.row(r, doc, written=str(r.get("_change_type") or "insert") not in GONE)
        end_of_commit = n + 1 == len(ordered) or int(ordered[n + 1]["_commit_version"]) != version
        if end_of_commit:
            for d in touched:
                _check_watermark(truth, watermark, d, live[d], version)
            touched.clear()
            truth.model.end_commit(watermark, version)
    # Every life with a last_seq, not only those with a message of their own: a re-created
    # document whose new messages all carry an earlier life's ids (ids without the incarnation)
    # has none, and its seqs are missing all the same.
    for doc, last_seq in last.items():
        msgs = truth.committed.get(doc, [])
        msgs.sort(key=lambda m: m.seq)
        seqs = [m.seq for m in msgs]
        if seqs != list(range(1, last_seq + 1)):
            truth.seq_gaps.append(f"{doc}: committed seqs {seqs[:8]}... vs last_seq {last_seq}")
    truth.versions = len(versions)
    truth.model.watermarks = watermark
    return truth


def _messages(
    truth: Truth, seen: dict[str, OutboxMessage], doc: str, r: dict[str, Any], from_struct: Any
) -> None:
    at = _epoch(r["_commit_timestamp"])
    for struct in r["outbox"] or []:
        m = from_struct(struct)
        before = seen.get(m.message_id)
        if before is None:
            seen[m.message_id] = m
            truth.committed.setdefault(doc, []).append(m)
            truth.committed_at[m.message_id] = at
        elif (before.body, before.seq, before.destination) != (m.body, m.seq, m.destination):
            truth.changed_content.append(m.message_id)


def _check_watermark(
    truth: Truth,
    watermark: dict[str, int],
    doc: str,
    rows: dict[tuple[int, int], int],
    version: int,
) -> None:
    """I4 after a commit: the document's watermark (the highest of its rows') never goes down
    while it has rows (a document with none was deleted: its life ended)."""
    present = [ds for (_, ds), n in rows.items() if n > 0]
    if not present:
        return
    now = max(present)
    if now < watermark.get(doc, 0):
        truth.watermark_regressions.append(
            f"{doc}: dispatched_seq {watermark[doc]} -> {now} at version {version}"
        )
    watermark[doc] = max(now, watermark.get(doc, 0))


def _life(lives: dict[str, dict[Any, str]], doc_id: str, incarnation: Any) -> str:
    """The key a document's messages are counted under: its id for its first life, ``id~n`` for
    its n-th after it was deleted and created again (a new incarnation restarts seqs and the
    watermark). A row of an earlier life (a late mark row) counts under that life's key."""
    known = lives.setdefault(doc_id, {})
    key = known.get(incarnation)
    if key is None:
        key = doc_id if not known else f"{doc_id}~{len(known)}"
        known[incarnation] = key
    return key


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        dt = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return dt.timestamp()
    return float(value) / 1000.0
