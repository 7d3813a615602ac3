"""The Python client turns one AppendStream request's error into the class a unary Append's
status gives (``_status.stream_error`` beside ``_status.to_error``)."""

from __future__ import annotations

import grpc

from sessionlog_client import errors
from sessionlog_client._status import stream_error


def test_a_known_reason_is_its_own_class_with_its_metadata() -> None:
    """SEQ_CONFLICT becomes SeqConflict carrying next_seq, as from a unary Append."""
    error = stream_error(
        grpc.StatusCode.ABORTED.value[0], "expected 0, at 3", "SEQ_CONFLICT", {"next_seq": "3"}
    )
    assert type(error) is errors.SeqConflict
    assert (error.message, error.metadata) == ("expected 0, at 3", {"next_seq": "3"})


def test_a_reason_newer_than_the_client_gets_its_codes_class() -> None:
    """An unknown reason keeps its name, in the domain class of its status code."""
    code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
    error = stream_error(code, "not yet", "SOMETHING_NEW", {"k": "v"})
    assert type(error) is errors.FailedPrecondition
    assert error.reason == "SOMETHING_NEW"
    assert error.metadata == {"k": "v"}
    other = stream_error(99, "odd", "ODDER", {})
    assert type(other) is errors.SessionLogError
    assert other.reason == "ODDER"
