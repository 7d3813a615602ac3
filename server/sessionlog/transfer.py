"""The export file: a session to a file and back, exactly (the commands `sessionlog export` and
`sessionlog import` are ``cli/transfer.py``; this module holds the format, its check and the
sending, and imports nothing of the CLI).

The export format (``--format jsonl``), one JSON object per line:

    {"sessionlog_export": 1, "session": {...}}       the session's record (GetSession's Session
                                                      in protobuf's JSON mapping, lease left out)
    {"seq": "0", "type": "EVENT_TYPE_USER_MESSAGE", "time": "...", "data": {...}, ...}
                                                      one event per line, seq order, protobuf's
                                                      JSON mapping of Event (lossless)

Both ends stream: the export writes events as Since returns them (up to the record's
event_count, so the record and the events agree), the import reads the file line by line and
sends ImportSession chunks of at most CHUNK_EVENTS events (CHUNK_BYTES), so a session of any
length is never held whole. The imported session keeps its seqs, times, types, data, surface
ops, create and last-append times and fork parent. ``--format openai`` writes the derived
messages in the chat-completions format instead (a JSON list, what `sessionlog seed` reads):
a view for a model, not a copy (it cannot be imported).

A bad file imports nothing: the import first reads all of the file and checks it as the server
will check its chunks (every line parsed, the seqs dense, the count the record's, each chunk
through the server's own ``service.importing`` and ``fold.admit``, against the server's default
limits or ``--max-event-size`` / ``--max-data-depth``), keeping the parsed events, serialized,
in a temporary file; only then does it send them, read back from there. The server
cannot make a chunked import all-or-nothing: each chunk is one atomic write, and a chunk it
refuses (a limit tighter than the CLI checked, a lease taken meanwhile) or a connection lost
leaves the chunks before it stored, as an imported session that only an import continues. The
error then says how many events are in and that ``--resume`` sends the rest (or ``delete``
drops them).

``import --resume`` continues an import that stopped midway: it reads the whole file again (the
seqs are checked as ever) but sends only the events from the target session's next seq on, once
the target's last event is found to be the file's at that seq.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from google.protobuf import json_format

from sessionlog import errors as server_errors
from sessionlog import fold
from sessionlog.service import importing
from sessionlog.v1 import session_log_service_pb2 as server_pb
from sessionlog_client import Client, DeadlineExceeded, errors
from sessionlog_client._common import import_request
from sessionlog_client.v1 import event_pb2
from sessionlog_client.v1 import session_log_service_pb2 as pb

EXPORT_VERSION = 1
CHUNK_EVENTS = 500
"""Events per ImportSession chunk, at most."""
CHUNK_BYTES = 1 << 20
"""Bytes of events per chunk, at most (one larger event goes alone)."""


class BadLine(Exception):
    """A line of the import file that is not what it should be; the message names it."""


class NotTheSameImport(Exception):
    """--resume onto a session that is not a prefix of the file; the message says how."""


# -- export ---------------------------------------------------------------------------------------


def export_jsonl(client: Client, session_id: str, out: IO[str]) -> int:
    """Write the export lines of ``session_id`` to ``out``; the number of events written.
    LookupError when there is no such session."""
    session = client.get_session(session_id).session
    if not session.exists:
        raise LookupError(f"session '{session_id}' does not exist: nothing to export")
    session.ClearField("lease")
    header = {"sessionlog_export": EXPORT_VERSION, "session": _json(session)}
    out.write(json.dumps(header, ensure_ascii=False) + "\n")
    written = 0
    if session.event_count:
        for event in client.since(session_id):
            if event.seq >= session.event_count:
                break  # appended after the record was read: the next export's
            out.write(json.dumps(_json(event), ensure_ascii=False) + "\n")
            written += 1
    return written


def _json(message: Any) -> dict[str, Any]:
    """A message as JSON, fields in field order and the keys of its maps and Structs (labels,
    data, state_delta) sorted: the runtime gives those in a hash order of its own, different
    in every process, and an export must come out the same each time."""
    value: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    for name in _MAPS:
        if isinstance(value.get(name), dict):
            value[name] = sorted_keys(value[name])
    return value


_MAPS = ("labels", "data", "state_delta")
"""The map and Struct fields of a Session or an Event."""


def sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(item) for item in value]
    return value


# -- import ---------------------------------------------------------------------------------------


def numbered(lines: IO[bytes]) -> Iterator[tuple[int, str]]:
    """The file's lines that are not blank, numbered from 1, decoded (BadLine for one that is
    not UTF-8)."""
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadLine(f"line {number}: not UTF-8 (byte {exc.start + 1} of the line)") from None
        if line.strip():
            yield number, line


def import_jsonl(
    client: Client,
    lines: Iterator[tuple[int, str]],
    session_id: str = "",
    *,
    resume: bool = False,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
) -> pb.Session:
    """Import export lines (numbered) as ``session_id`` (default: the exported id); the session
    as stored. The lines are checked to the end first (``check_jsonl``), so a BadLine, naming
    the first line that is wrong and its fault, writes nothing.

    With ``resume``, an import that stopped midway goes on: the events before the target's next
    seq are read (and checked) but not sent, once the target's last event is found to be the
    file's at its seq (NotTheSameImport otherwise). The server takes the rest only into a
    session an import made (SESSION_ALREADY_EXISTS for any other). A refusal after a chunk was
    written says how many events are in and how to go on."""
    with tempfile.TemporaryFile() as kept:
        record, total = check_jsonl(lines, session_id, limits, kept)
        kept.seek(0)
        return _send_all(client, record, total, _chunks(_read_back(kept)), session_id, resume)


def _send_all(
    client: Client,
    record: pb.Session,
    total: int,
    chunks: Iterator[list[tuple[int, event_pb2.Event]]],
    session_id: str,
    resume: bool,
) -> pb.Session:
    """Send the checked events (``import_jsonl``)."""
    target = session_id or record.session_id
    start, last_stored = _resume_point(client, target) if resume else (0, None)
    if total < start:
        raise NotTheSameImport(
            f"session '{target}' holds {start} events, more than the file's {total}: it is not "
            "this import stopped midway"
        )
    written = start
    sent: pb.ImportSessionResponse | None = None
    for chunk in chunks:
        for number, event in chunk:
            if last_stored is not None and event.seq == start - 1:
                _check_same(target, number, event, last_stored)
        unsent = [(number, event) for number, event in chunk if event.seq >= start]
        if unsent:
            try:
                sent = _send(client, target, record, unsent[0][1].seq, unsent, resume=resume)
            except errors.SessionLogError as exc:
                exc.message += _stopped(exc, target, written, total)
                raise
            written = unsent[-1][1].seq + 1
    if sent is None and start > 0:  # resumed where nothing was left to send
        return client.get_session(target).session
    if sent is None:  # an empty session: one chunk without events creates it
        sent = _send(client, target, record, 0, [])
    return sent.session


def check_jsonl(
    lines: Iterator[tuple[int, str]],
    session_id: str = "",
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    keep: IO[bytes] | None = None,
) -> tuple[pb.Session, int]:
    """Read export lines through to the end and check them as the server will check the chunks
    they are sent in (``limits`` standing for its own); the record and the number of events.
    BadLine names the first line that is wrong. Nothing is sent. The events checked are
    written to ``keep``, when given, for ``_read_back``."""
    first = next(lines, None)
    if first is None:
        raise BadLine("the file is empty; it should start with the session's record line")
    record = _header(*first)
    target = session_id or record.session_id
    try:
        fold.check_session_id(target)
    except server_errors.SessionLogError as error:
        raise BadLine(f"session id: {error.reason}: {error.message}") from None
    count = 0
    for chunk in _chunks(_parsed(lines)):
        if (
            record.event_count and chunk[-1][1].seq >= record.event_count
        ):  # 0: a record that says none
            extra = next(n for n, e in chunk if e.seq == record.event_count)
            raise BadLine(
                f"line {extra}: the record says {record.event_count} events, but the file holds "
                "more from this line on (nothing was imported)"
            )
        _check_chunk(target, record, chunk, limits)
        count += len(chunk)
        if keep is not None:
            for number, event in chunk:
                body = event.SerializeToString()
                keep.write(_KEPT.pack(number, len(body)) + body)
    if count < record.event_count:
        raise BadLine(
            f"the record says {record.event_count} events, but the file holds {count}: it is "
            "cut short (nothing was imported)"
        )
    return record, count


def _check_chunk(
    target: str, record: pb.Session, chunk: list[tuple[int, event_pb2.Event]], limits: fold.Limits
) -> None:
    """The chunk as ``_send`` will send it, through the server's own checks (those that need
    no stored state); BadLine naming the line of the event refused (line 1, the record's, for
    the record's own faults)."""
    first_seq = chunk[0][1].seq
    fields = _chunk_fields(record, first_seq)
    sent = import_request(target, [event for _, event in chunk], first_seq, **fields)
    request = server_pb.ImportSessionRequest.FromString(sent.SerializeToString())
    try:
        batch = importing.prepare_import(request, limits, moving_in=False).events
        fold.admit(batch.events, batch.prechecked, first_seq, lenient=False, ranges=batch.replaces)
    except server_errors.SessionLogError as error:
        index = error.metadata.get("index", "")
        number = chunk[int(index)][0] if index.isdigit() and int(index) < len(chunk) else 1
        raise BadLine(f"line {number}: {error.reason}: {error.message}") from None


def _stopped(exc: errors.SessionLogError, target: str, written: int, total: int) -> str:
    """What a refusal or a lost connection midway left behind, and how to go on ("" when
    nothing can have been written)."""
    lost = isinstance(exc, errors.Unavailable | DeadlineExceeded)
    if isinstance(exc, errors.SessionAlreadyExists):
        return ""  # the target was not made by an import: its events are not this file's
    if not written and not lost:
        return ""
    how = (
        "`sessionlog import --resume` with the same file and options sends the rest once the "
        f"cause is fixed, or `sessionlog delete {target}` drops them"
    )
    if lost:
        return (
            f"; at least {written} of the file's {total} events are imported in session "
            f"'{target}' (the chunk in flight may be too): {how}"
        )
    return f"; {written} of the file's {total} events are imported in session '{target}': {how}"


def _resume_point(client: Client, session_id: str) -> tuple[int, event_pb2.Event | None]:
    """Where a resumed import goes on: the session's next seq and its last event (0 and None
    for a session that does not exist yet)."""
    page = client.list_events(session_id, page_size=1, order_by="seq desc")
    if not page.events:
        return 0, None
    return page.event_count, page.events[0]


def _check_same(
    session_id: str, number: int, event: event_pb2.Event, stored: event_pb2.Event
) -> None:
    """The file's event at the session's last seq is the one stored there (an import keeps
    events as sent: type, time, data and all)."""
    if event != stored:
        raise NotTheSameImport(
            f"line {number}: seq {event.seq} differs from the event session '{session_id}' "
            "holds there: the session is not this file's import stopped midway; import under "
            "another id (--session-id) instead"
        )


def _header(number: int, line: str) -> pb.Session:
    value = _json_line(number, line)
    if not isinstance(value, dict) or value.get("sessionlog_export") != EXPORT_VERSION:
        raise BadLine(
            f"line {number}: not a session record line (a `sessionlog export` file starts "
            f'with {{"sessionlog_export": {EXPORT_VERSION}, "session": ...}})'
        )
    session = value.get("session") or {}
    if not isinstance(session, dict):
        raise BadLine(f"line {number}: the session record is not valid (not a JSON object)")
    try:
        return json_format.ParseDict(session, pb.Session())
    except json_format.ParseError as exc:
        raise BadLine(f"line {number}: the session record is not valid ({exc})") from None


def _json_line(number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadLine(f"line {number}: not JSON ({exc.msg})") from None
    except RecursionError:  # the decoder's own limit: deeper than any event the server takes
        raise BadLine(f"line {number}: not JSON (nested too deeply to read)") from None


_KEPT = struct.Struct("<QI")
"""A kept event's header: its line number, then the length of the serialized event after it."""


def _read_back(kept: IO[bytes]) -> Iterator[tuple[int, event_pb2.Event]]:
    """The events ``check_jsonl`` kept, with their line numbers."""
    while header := kept.read(_KEPT.size):
        number, length = _KEPT.unpack(header)
        yield number, event_pb2.Event.FromString(kept.read(length))


def _parsed(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, event_pb2.Event]]:
    """The event lines parsed, their seqs checked."""
    for seq, (number, line) in enumerate(lines):
        event = _event(number, line)
        if event.seq != seq:
            raise BadLine(f"line {number}: seq {event.seq}, but the line before it makes it {seq}")
        yield number, event


def _chunks(
    events: Iterator[tuple[int, event_pb2.Event]],
) -> Iterator[list[tuple[int, event_pb2.Event]]]:
    """The events (with their line numbers) in the chunks they are sent in."""
    chunk: list[tuple[int, event_pb2.Event]] = []
    size = 0
    for number, event in events:
        size += event.ByteSize()
        if chunk and (len(chunk) >= CHUNK_EVENTS or size > CHUNK_BYTES):
            yield chunk
            chunk, size = [], event.ByteSize()
        chunk.append((number, event))
    if chunk:
        yield chunk


def _event(number: int, line: str) -> event_pb2.Event:
    value = _json_line(number, line)
    if not isinstance(value, dict):
        raise BadLine(f"line {number}: an event line holds a JSON object")
    try:
        return json_format.ParseDict(value, event_pb2.Event())
    except json_format.ParseError as exc:
        raise BadLine(f"line {number}: not an event ({exc})") from None


def _send(
    client: Client,
    session_id: str,
    record: pb.Session,
    first_seq: int,
    chunk: list[tuple[int, event_pb2.Event]],
    *,
    resume: bool = False,
) -> pb.ImportSessionResponse:
    """One chunk, with the record's times and parent; a refused event names its line, and a
    first chunk that finds the session begun says how to go on."""
    try:
        return client.import_session(
            session_id,
            [event for _, event in chunk],
            first_seq=first_seq,
            **_chunk_fields(record, first_seq),
        )
    except errors.ImportSeqMismatch as exc:
        if first_seq == 0 and not resume:
            exc.message += "; `sessionlog import --resume` continues an import that stopped"
        raise
    except errors.SessionLogError as exc:
        index = exc.metadata.get("index", "")
        if index.isdigit() and int(index) < len(chunk):
            exc.message = f"line {chunk[int(index)][0]}: {exc.message}"
        raise


def _chunk_fields(record: pb.Session, first_seq: int) -> dict[str, Any]:
    """A chunk's fields besides its events, taken from the record line."""
    return {
        "create_time": record.create_time if record.HasField("create_time") else None,
        "last_append_time": (
            record.last_append_time if record.HasField("last_append_time") else None
        ),
        "parent_session_id": record.parent_session_id,
        "parent_event_count": record.parent_event_count,
        "record": record if first_seq == 0 else None,
    }
