"""Text a client controls that the server parses itself: page tokens and the authorization header.

A page token is opaque to clients but not to the server, which decodes it; the authorization
header reaches the interceptor as whatever bytes the client put on the wire. Neither may turn
into INTERNAL, a crash, or a secret in the log.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import socket
import time
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import ServerProcess, free_port, running_server
from tests.e2e.test_raw_http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    frame,
    opening,
    prefixed,
)

LIST = "/sessionlog.v1.SessionLogService/ListSessions"
SECRET = "client-text-secret-4f0a9c2e7b"


def b64(payload: bytes) -> str:
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def token(last_id: bytes, prefix: str = "", version: int = 1) -> str:
    """A page token in the server's layout: version, 8 bytes of SHA-256(prefix), the last id."""
    return b64(bytes((version,)) + hashlib.sha256(prefix.encode()).digest()[:8] + last_id)


def list_refusal(server: RunningServer, page_token: str, prefix: str = "") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        server.stub().ListSessions(
            pb.ListSessionsRequest(page_token=page_token, prefix=prefix), timeout=5
        )
    return caught.value


def assert_refused_token(error: grpc.RpcError) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    info = error_info(error)
    assert info.reason == "INVALID_PAGE_TOKEN"
    assert info.metadata["field"] == "page_token"
    assert "list again from the start" in error.details()


def create(server: RunningServer, *session_ids: str) -> None:
    for session_id in session_ids:
        event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
        server.stub().Append(pb.AppendRequest(session_id=session_id, events=[event]), timeout=5)


# -- page tokens --------------------------------------------------------------------------------


def test_a_deeply_nested_page_token_is_refused_not_internal(server: RunningServer) -> None:
    """A token of 5,000 nested JSON arrays (past any JSON parser's recursion limit) is
    INVALID_PAGE_TOKEN, and listing still works after it."""
    create(server, "s1")
    assert_refused_token(list_refusal(server, b64(b"[" * 5000 + b"]" * 5000)))
    reply = server.stub().ListSessions(pb.ListSessionsRequest(), timeout=5)
    assert [s.session_id for s in reply.sessions] == ["s1"]


FORGED = {
    "json-of-older-servers": b64(b'["s1", ""]'),
    "unknown-version": token(b"s1", version=2),
    "other-prefix": token(b"s1", prefix="s"),
    "id-not-utf8": token(b"s\xff"),
    "lone-surrogate": token(b"s\xed\xa0\x80"),
    "id-invalid": token(b"s 1"),
    "id-too-long": token(b"s" * 236),
    "no-id": token(b""),
    "cut-short": token(b"s1")[:6],
    "not-base64url": token(b"s1")[:-2] + "+/",
    "not-ascii": "AQé",
    "huge": "A" * 1_000_000,
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_page_tokens_are_refused(server: RunningServer, case: str) -> None:
    """A token the server did not hand out for this listing is INVALID_PAGE_TOKEN."""
    create(server, "s1", "s2")
    assert_refused_token(list_refusal(server, FORGED[case]))


def test_a_page_token_continues_its_listing(server: RunningServer) -> None:
    """The layout the forgeries imitate is the real one: a hand-built token for "t.1" under
    prefix "t." continues right after it, as the server's own token does."""
    create(server, "t.1", "t.2", "t.3", "u.1")
    first = server.stub().ListSessions(pb.ListSessionsRequest(prefix="t.", page_size=1))
    assert first.next_page_token == token(b"t.1", prefix="t.")
    rest = server.stub().ListSessions(
        pb.ListSessionsRequest(prefix="t.", page_token=token(b"t.1", prefix="t."))
    )
    assert [s.session_id for s in rest.sessions] == ["t.2", "t.3"]


# -- the authorization header, byte for byte ----------------------------------------------------


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, no Huffman, values under 127 bytes."""
    assert len(name) < 127
    assert len(value) < 127
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


def _list_with_authorization(port: int, value: bytes) -> str:
    """A raw HTTP/2 ListSessions call carrying ``authorization: value``; its grpc-status."""
    fields = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", LIST.encode()),
        (b":authority", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"authorization", value),
    ]
    block = b"".join(_literal(name, val) for name, val in fields)
    data = (
        opening()
        + frame(HEADERS, END_HEADERS, 1, block)
        + frame(DATA, END_STREAM, 1, prefixed(b""))
    )
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(data)
        deadline = time.monotonic() + 5
        while b"grpc-status" not in received and time.monotonic() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        time.sleep(0.05)  # the rest of the trailers frame
        conn.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            received += conn.recv(65536)
    found = re.search(rb"grpc-status.(\d+)", received)
    assert found, f"no grpc-status in the reply: {received!r}"
    return found.group(1).decode()


def test_an_undecodable_authorization_header_is_unauthenticated_and_unlogged(
    tmp_path: Path,
) -> None:
    """An authorization value that is not UTF-8 (a secret plus one stray byte) is
    UNAUTHENTICATED, the server keeps serving, and its log never shows the secret (grpc's own
    log line for undecodable metadata prints the raw value)."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "ops"\ntoken = "{SECRET}"\npermissions = ["read"]\n')
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["--data", str(tmp_path / "data"), "--listen", address, "--auth-tokens", str(tokens)]
    with ServerProcess([*args, "--auth-open-health"], cwd=tmp_path) as proc:
        proc.wait_serving(address)
        bearer = b"Bearer " + SECRET.encode()
        assert _list_with_authorization(port, bearer) == "0", "the raw call itself works"
        for value in (bearer + b"\xff", bearer + b"\xed\xa0\x80", "Bearer é".encode()):
            assert _list_with_authorization(port, value) == "16", value
        assert _list_with_authorization(port, bearer) == "0", "still serving"
        assert proc.stop() == 0
    log = proc.log()
    assert SECRET not in log, log
    assert "metadata that is not valid UTF-8; its value is withheld" in log
    assert "Traceback" not in log


def test_a_binary_authorization_header_is_not_a_bearer_token(tmp_path: Path) -> None:
    """`authorization-bin` (binary metadata, base64 on the wire) is not the bearer header: a
    call carrying a valid secret only there is UNAUTHENTICATED; the same secret in
    `authorization` passes."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "ops"\ntoken = "{SECRET}"\npermissions = ["read"]\n')
    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as server:
        stub = server.stub()
        binary = (("authorization-bin", f"Bearer {SECRET}".encode()),)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListSessions(pb.ListSessionsRequest(), metadata=binary, timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(caught.value).reason == "UNAUTHENTICATED"
        text = (("authorization", f"Bearer {SECRET}"),)
        assert not stub.ListSessions(pb.ListSessionsRequest(), metadata=text, timeout=5).sessions
