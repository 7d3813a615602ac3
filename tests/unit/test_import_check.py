"""`sessionlog import`'s check of a whole file before its first write (``transfer.check_jsonl``):
the record's own faults, the target id, the limits given, and the events it keeps for sending."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping

import pytest

from sessionlog import fold, transfer

WHEN = "2024-05-01T12:00:00Z"


def numbered(record: Mapping[str, object], *events: Mapping[str, object]) -> list[tuple[int, str]]:
    """An export file's lines, numbered from 1: the record line, then the event lines."""
    lines = [json.dumps({"sessionlog_export": 1, "session": record})]
    lines += [json.dumps(event) for event in events]
    return list(enumerate(lines, start=1))


def said(seq: int, content: str = "hi") -> dict[str, object]:
    return {
        "seq": str(seq),
        "type": "EVENT_TYPE_USER_MESSAGE",
        "time": WHEN,
        "data": {"content": content},
    }


def test_a_record_the_server_would_refuse_is_refused_at_line_1() -> None:
    """A last-append time before the create time is INVALID_IMPORT, named at the record's line."""
    record = {"session_id": "s", "create_time": WHEN, "last_append_time": "2020-01-01T00:00:00Z"}
    with pytest.raises(transfer.BadLine, match=r"^line 1: INVALID_IMPORT"):
        transfer.check_jsonl(iter(numbered(record, said(0))))


def test_a_bad_target_id_is_refused_before_any_line_is_sent() -> None:
    """An id the server refuses (from --session-id or the record) is named as the session id."""
    with pytest.raises(transfer.BadLine, match=r"^session id: INVALID_SESSION_ID"):
        transfer.check_jsonl(iter(numbered({"session_id": "s"}, said(0))), "-bad")


def test_the_limits_given_are_the_ones_checked() -> None:
    """An event within the default limit but over a smaller one given is refused at its line."""
    lines = numbered({"session_id": "s"}, said(0), said(1, "x" * 2000))
    assert transfer.check_jsonl(iter(lines))[1] == 2
    small = fold.Limits(max_event_bytes=1000)
    with pytest.raises(transfer.BadLine, match=r"^line 3: EVENT_TOO_LARGE"):
        transfer.check_jsonl(iter(lines), limits=small)


def test_the_events_checked_are_kept_and_read_back_with_their_lines() -> None:
    """What the check keeps reads back as the same events, numbered with their file lines."""
    kept = io.BytesIO()
    record, count = transfer.check_jsonl(
        iter(numbered({"session_id": "s"}, said(0, "a"), said(1, "b"))), keep=kept
    )
    assert (record.session_id, count) == ("s", 2)
    kept.seek(0)
    back = list(transfer._read_back(kept))
    assert [(number, e.seq, e.data["content"]) for number, e in back] == [(2, 0, "a"), (3, 1, "b")]
