"""Transport security: TLS, mutual TLS, and a replica authenticating to a TLS+mTLS+token primary.

Certificates are made at test time (``_certs``): one CA issues the server certificate (for
127.0.0.1 and localhost) and the good client certificates; a second, unrelated CA issues the
certificates that must be refused. Each refusal is checked to write nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._certs import Authority, Issued, authority
from tests.e2e._helpers import get, stats, user
from tests.e2e._proc import running_server

pytestmark = pytest.mark.workers

REFUSAL_TIMEOUT = 3.0
"""A refused handshake fails fast; this only bounds a hang."""
REPLICATION_SECONDS = 15.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
REPLICA_SECRET = "replica-secret-0123456789abcdef"
WRITER_SECRET = "writer-secret-0123456789abcdef"


@dataclass(frozen=True)
class Pki:
    """The trusted CA with a server and a client certificate, and a stranger CA."""

    ca: Authority
    server: Issued
    client: Issued
    stranger: Authority
    stranger_client: Issued
    stranger_server: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Fresh keys and certificates for this module's tests."""
    folder = tmp_path_factory.mktemp("pki")
    ca = authority(folder, "trusted")
    stranger = authority(folder, "stranger")
    return Pki(
        ca=ca,
        server=ca.issue_server(),
        client=ca.issue_client("worker"),
        stranger=stranger,
        stranger_client=stranger.issue_client("intruder"),
        stranger_server=stranger.issue_server("impostor"),
    )


def secure_channel(
    server: RunningServer, root: bytes, client: Issued | None = None
) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    return grpc.secure_channel(server.address, credentials)


def stub(channel: grpc.Channel) -> pb_grpc.SessionLogServiceStub:
    return pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]


def append_one(channel: grpc.Channel, session_id: str, content: str) -> pb.AppendResponse:
    request = pb.AppendRequest(session_id=session_id, events=[user(content)])
    reply: pb.AppendResponse = stub(channel).Append(request, timeout=REFUSAL_TIMEOUT)
    return reply


def assert_refused(channel: grpc.Channel, server: RunningServer, pki: Pki, session_id: str) -> None:
    """An append over ``channel`` fails with UNAVAILABLE (no connection) and writes nothing
    (as a trusted client then reads)."""
    with channel, pytest.raises(grpc.RpcError) as caught:
        append_one(channel, session_id, "must not land")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    with secure_channel(server, pki.ca.pem, pki.client) as trusted:
        assert not get(stub(trusted), session_id).exists


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RunningServer]:
    """A server that speaks TLS only, with the trusted CA's server certificate; one for the
    module (each test writes a session of its own)."""
    with running_server(
        tmp_path_factory.mktemp("tls") / "data",
        tls_cert=str(pki.server.cert_path),
        tls_key=str(pki.server.key_path),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RunningServer]:
    """A TLS server that also requires a client certificate signed by the trusted CA; one for
    the module (each test writes a session of its own)."""
    with running_server(
        tmp_path_factory.mktemp("mtls") / "data",
        tls_cert=str(pki.server.cert_path),
        tls_key=str(pki.server.key_path),
        tls_client_ca=str(pki.ca.path),
    ) as server:
        yield server


# -- TLS ----------------------------------------------------------------------------------------


def test_tls_client_trusting_the_ca_appends_and_reads(tls_server: RunningServer, pki: Pki) -> None:
    """A TLS client that trusts the CA appends and reads back over the encrypted channel."""
    with secure_channel(tls_server, pki.ca.pem) as channel:
        reply = append_one(channel, "tls.ok", "over tls")
        surface = stub(channel).Surface(pb.SurfaceRequest(session_id="tls.ok"), timeout=5)
    assert reply.next_seq == 1
    assert [e.data["content"] for e in surface.events] == ["over tls"]


def test_tls_server_refuses_a_plaintext_client(tls_server: RunningServer, pki: Pki) -> None:
    """A plaintext client cannot talk to a TLS-only server, and nothing is written."""
    assert_refused(grpc.insecure_channel(tls_server.address), tls_server, pki, "tls.plain")


def test_tls_client_not_trusting_the_ca_is_refused(tls_server: RunningServer, pki: Pki) -> None:
    """A client that trusts only another CA rejects the server's certificate; nothing is written."""
    channel = secure_channel(tls_server, pki.stranger.pem)
    assert_refused(channel, tls_server, pki, "tls.untrusted")


def test_tls_health_check_over_tls(tls_server: RunningServer, pki: Pki) -> None:
    """The health service is reachable over TLS, so a TLS deployment can still be probed."""
    with secure_channel(tls_server, pki.ca.pem) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert reply.status == SERVING


# -- mutual TLS ---------------------------------------------------------------------------------


def test_mtls_client_with_a_certificate_from_the_ca_works(
    mtls_server: RunningServer, pki: Pki
) -> None:
    """A client presenting a certificate signed by the client CA is served."""
    with secure_channel(mtls_server, pki.ca.pem, pki.client) as channel:
        reply = append_one(channel, "mtls.ok", "mutual")
        assert get(stub(channel), "mtls.ok").exists
    assert reply.next_seq == 1


def test_mtls_client_without_a_certificate_is_refused(mtls_server: RunningServer, pki: Pki) -> None:
    """A TLS client that presents no certificate is refused by an mTLS server."""
    assert_refused(secure_channel(mtls_server, pki.ca.pem), mtls_server, pki, "mtls.anonymous")


def test_mtls_client_with_a_certificate_from_another_ca_is_refused(
    mtls_server: RunningServer, pki: Pki
) -> None:
    """A client certificate signed by an unrelated CA is refused, and nothing is written."""
    channel = secure_channel(mtls_server, pki.ca.pem, pki.stranger_client)
    assert_refused(channel, mtls_server, pki, "mtls.stranger")


def test_mtls_server_refuses_a_plaintext_client(mtls_server: RunningServer, pki: Pki) -> None:
    """A plaintext client gets nowhere with an mTLS server."""
    assert_refused(grpc.insecure_channel(mtls_server.address), mtls_server, pki, "mtls.plain")


# -- a replica of a TLS + mTLS + token primary ---------------------------------------------------


def write_tokens(path: Path) -> Path:
    path.write_text(
        "[[token]]\n"
        'name = "replica"\n'
        f'token = "{REPLICA_SECRET}"\n'
        'permissions = ["admin"]\n'
        "\n"
        "[[token]]\n"
        'name = "writer"\n'
        f'token = "{WRITER_SECRET}"\n'
        'permissions = ["read", "write"]\n'
    )
    return path


@pytest.fixture
def secured_primary(tmp_path: Path, pki: Pki) -> Iterator[RunningServer]:
    """A primary that requires TLS, a client certificate from the CA, and a bearer token."""
    with running_server(
        tmp_path / "primary",
        tls_cert=str(pki.server.cert_path),
        tls_key=str(pki.server.key_path),
        tls_client_ca=str(pki.ca.path),
        auth_tokens=str(write_tokens(tmp_path / "tokens.toml")),
    ) as primary:
        yield primary


def write_through(primary: RunningServer, pki: Pki, session_id: str, *contents: str) -> None:
    """Append ``contents`` to the primary as the writer (TLS, client certificate, token)."""
    metadata = (("authorization", f"Bearer {WRITER_SECRET}"),)
    with secure_channel(primary, pki.ca.pem, pki.client) as channel:
        request = pb.AppendRequest(session_id=session_id, events=[user(c) for c in contents])
        stub(channel).Append(request, metadata=metadata, timeout=5)


def replica_health(replica: RunningServer) -> int | None:
    with grpc.insecure_channel(replica.address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return None
    status: int = reply.status
    return status


def replica_contents(replica: RunningServer, session_id: str) -> list[str]:
    with grpc.insecure_channel(replica.address) as channel:
        responses = stub(channel).Since(pb.SinceRequest(session_id=session_id), timeout=5)
        return [e.data["content"] for r in responses for e in r.events]


def test_replica_authenticates_to_a_tls_mtls_token_primary(
    tmp_path: Path, pki: Pki, secured_primary: RunningServer
) -> None:
    """A replica with the CA, a client certificate and an admin token replicates a session."""
    write_through(secured_primary, pki, "rep.one", "before the replica")
    with running_server(
        tmp_path / "replica",
        replica_of=secured_primary.address,
        replica_tls_ca=str(pki.ca.path),
        replica_tls_cert=str(pki.client.cert_path),
        replica_tls_key=str(pki.client.key_path),
        replica_token=REPLICA_SECRET,
        replica_serve_open=True,  # this test reads the replica without a token
    ) as replica:
        write_through(secured_primary, pki, "rep.one", "while replicating")
        deadline = time.monotonic() + REPLICATION_SECONDS
        contents: list[str] = []
        while time.monotonic() < deadline:
            contents = replica_contents(replica, "rep.one")
            if len(contents) == 2 and replica_health(replica) == SERVING:
                break
            time.sleep(0.05)
        assert contents == ["before the replica", "while replicating"]
        assert replica_health(replica) == SERVING


@pytest.mark.parametrize(
    ("token", "with_cert"),
    [
        pytest.param("wrong-secret-0123456789abcdef", True, id="wrong-token"),
        pytest.param(WRITER_SECRET, True, id="token-without-admin"),
        pytest.param(REPLICA_SECRET, False, id="no-client-certificate"),
    ],
)
def test_replica_with_bad_credentials_gets_nothing(
    tmp_path: Path, pki: Pki, secured_primary: RunningServer, token: str, with_cert: bool
) -> None:
    """A replica with a wrong or under-privileged token, or no client certificate, stays
    NOT_SERVING and holds no data."""
    write_through(secured_primary, pki, "rep.secret", "tenant data")
    cert_options = (
        {
            "replica_tls_cert": str(pki.client.cert_path),
            "replica_tls_key": str(pki.client.key_path),
        }
        if with_cert
        else {}
    )
    with running_server(
        tmp_path / "replica",
        replica_of=secured_primary.address,
        replica_tls_ca=str(pki.ca.path),
        replica_token=token,
        replica_serve_open=True,
        **cert_options,
    ) as replica:
        time.sleep(1.0)  # several reconnect attempts (backoff starts at 0.1 s)
        assert replica_health(replica) == NOT_SERVING
        assert replica_contents(replica, "rep.secret") == []
        with grpc.insecure_channel(replica.address) as channel:
            assert stats(channel).position == 0
