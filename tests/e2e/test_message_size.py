"""Oversized requests from the Python client: a clear error naming the limit and the setting to
change, nothing written, the server still serving (issue 31).

One server per module at the default 4 MiB --max-message-size. A request up to that plus
TRANSPORT_MARGIN_BYTES reaches the handler (REQUEST_TOO_LARGE with its ErrorInfo); one past it is
refused by gRPC itself, which the client says in its own words; one past the client's own
max_message_bytes is never sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionlog.defaults import DEFAULT_MAX_MESSAGE_BYTES
from sessionlog.service.app import TRANSPORT_MARGIN_BYTES, transport_limit
from sessionlog.testing import RunningServer
from sessionlog_client import Client, errors, event
from sessionlog_client.v1.event_pb2 import Event
from tests.e2e._proc import running_server

pytestmark = pytest.mark.workers  # every worker process reads requests with its own transport limit

TWENTY_MB = 20_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("size") / "data") as running:
        yield running


def big(size: int) -> Event:
    return event("user_message", {"content": "x" * size})


def assert_untouched_and_serving(client: Client, session_id: str) -> None:
    assert not client.get_session(session_id).session.exists, "the oversized append wrote something"
    assert client.append(session_id, [event("user_message", {"content": "ok"})]).next_seq == 1


def test_the_transport_reads_past_the_limit_by_a_bounded_margin() -> None:
    """The default 4 MiB limit lets the transport read 36 MiB, so a 20 MB request is answered by
    the handler; the margin is bounded and gRPC's 2 GiB is never passed."""
    assert transport_limit(DEFAULT_MAX_MESSAGE_BYTES) == DEFAULT_MAX_MESSAGE_BYTES + (32 << 20)
    assert transport_limit(DEFAULT_MAX_MESSAGE_BYTES) > TWENTY_MB
    assert transport_limit(100 << 20) == 200 << 20
    assert transport_limit(1 << 30) == (2 << 30) - 1
    assert TRANSPORT_MARGIN_BYTES == 32 << 20


def test_a_20_mb_event_names_the_limit_and_the_setting(server: RunningServer) -> None:
    with Client(server.address) as client:
        with pytest.raises(errors.RequestTooLarge) as caught:
            client.append("size.twenty", [big(TWENTY_MB)])
        text = str(caught.value)
        assert f"{DEFAULT_MAX_MESSAGE_BYTES}-byte" in text, text
        assert "--max-message-size" in text, text
        assert "larger than max" not in text, text
        assert_untouched_and_serving(client, "size.twenty")


def test_past_the_transport_margin_the_client_still_says_what_to_change(
    server: RunningServer,
) -> None:
    past = transport_limit(DEFAULT_MAX_MESSAGE_BYTES) + (1 << 20)
    with Client(server.address) as client:
        with pytest.raises(errors.RequestTooLarge) as caught:
            client.append("size.past", [big(past)])
        text = str(caught.value)
        assert "--max-message-size" in text, text
        assert f"no request over {transport_limit(DEFAULT_MAX_MESSAGE_BYTES)} bytes" in text
        assert_untouched_and_serving(client, "size.past")


def test_over_the_clients_own_limit_nothing_is_sent(server: RunningServer) -> None:
    with Client(server.address, max_message_bytes=2 << 20) as client:
        with pytest.raises(errors.RequestTooLarge) as caught:
            client.append("size.local", [big(3 << 20)])
        text = str(caught.value)
        assert "max_message_bytes" in text, text
        assert f"{2 << 20}-byte" in text, text
        assert_untouched_and_serving(client, "size.local")
