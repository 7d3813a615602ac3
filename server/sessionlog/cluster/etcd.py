"""etcd through its JSON gateway (``etcd3gw``): several endpoints, every call bounded, off the
event loop.

etcd3gw is synchronous (requests). ``Etcd`` runs each call in a thread of its own executor, so a
slow etcd never blocks the event loop, and one caller's calls never queue behind another's
(the keepalive has an ``Etcd`` of its own). Every HTTP request carries ``timeout``; the await
around it is bounded too, so even a thread that somehow stays stuck costs the caller no more
than the budget.

An endpoint that cannot be reached, times out, or answers 5xx (e.g. a member without quorum) is
left for the next one, in the order given, from the one that last worked; an answer from etcd
(a 4xx, a failed compare) is an answer and is raised as ``EtcdError``. When every endpoint
failed, ``EtcdUnavailable``.

Only the calls the election needs are here, written against the gateway's /v3 API (etcd 3.4+):
etcd3gw's own helpers drop the response header (the revision), and its watch opens its stream
without a timeout, which a dead endpoint would hold forever.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client

from sessionlog.cluster.settings import Endpoint

log = logging.getLogger(__name__)

T = TypeVar("T")

API_PATH = "/v3/"
"""The gateway's path on etcd 3.4 and later; given, so no call is spent discovering it."""


class EtcdUnavailable(Exception):
    """No endpoint answered within its timeout."""


class EtcdError(Exception):
    """etcd answered, and the answer is an error (the text is etcd's)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _key_value(item: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(item["key"]).decode(errors="replace"),
        value=base64.b64decode(item.get("value", "")),
        create_revision=int(item.get("create_revision", 0)),
        mod_revision=int(item.get("mod_revision", 0)),
        lease=int(item.get("lease", 0)),
    )


def _revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


class Endpoints:
    """Blocking calls over several endpoints (one thread at a time: one ``requests`` session
    per endpoint, not shared between threads)."""

    def __init__(self, endpoints: tuple[Endpoint, ...], timeout: float) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint")
        self.timeout = timeout
        self._clients = [
            Etcd3Client(host=e.host, port=e.port, timeout=timeout, api_path=API_PATH)
            for e in endpoints
        ]
        self._names = [str(e) for e in endpoints]
        self._current = 0

    @property
    def current(self) -> str:
        """The endpoint tried first (the one that answered last)."""
        return self._names[self._current]

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the gateway's ``path``, trying each endpoint once from the current."""
        failures = []
        for step in range(len(self._clients)):
            index = (self._current + step) % len(self._clients)
            client = self._clients[index]
            try:
                reply: dict[str, Any] = client.post(client.get_url(path), json=body)
            except (
                etcd_exceptions.ConnectionFailedError,
                etcd_exceptions.ConnectionTimeoutError,
                etcd_exceptions.InternalServerError,
                requests.RequestException,
                ValueError,  # a reply that is not JSON: not etcd, or cut short
            ) as exc:
                failures.append(f"{self._names[index]}: {type(exc).__name__}")
                continue
            except etcd_exceptions.Etcd3Exception as exc:
                self._current = index
                raise EtcdError(f"{self._names[index]}: {exc.detail_text or exc}") from None
            if index != self._current:
                log.info(
                    "etcd endpoint changed",
                    extra={"endpoint": self._names[index], "previous": self.current},
                )
                self._current = index
            return reply
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(failures))

    def close(self) -> None:
        for client in self._clients:
            client.session.close()

    # -- the calls the election makes --------------------------------------------------------

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted)."""
        reply = self.post("lease/grant", {"TTL": ttl, "ID": 0})
        if "error" in reply or "ID" not in reply:
            raise EtcdError(f"lease grant refused: {reply!r}")
        return int(reply["ID"]), int(reply.get("TTL", 0))

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``: its TTL from now, or -1 when etcd no longer has it."""
        reply = self.post("lease/keepalive", {"ID": lease})
        return int(reply.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        """Revoke ``lease`` (its keys go with it); a lease already gone is no error."""
        try:
            self.post("kv/lease/revoke", {"ID": lease})
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    def put(self, key: str, value: bytes, lease: int) -> int:
        """Put ``key`` attached to ``lease``; the revision it was written at."""
        return _revision(
            self.post("kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})
        )

    def delete(self, key: str) -> int:
        """Delete ``key`` (absent is no error); the revision of the store after it."""
        return _revision(self.post("kv/deleterange", {"key": _b64(key)}))

    def get(self, key: str) -> tuple[KeyValue | None, int]:
        """The key (or None) and the store's revision at the read."""
        reply = self.post("kv/range", {"key": _b64(key)})
        kvs = reply.get("kvs", [])
        return (_key_value(kvs[0]) if kvs else None), _revision(reply)

    def get_range(self, key: str, end: str) -> tuple[list[KeyValue], int]:
        """Every key in [key, end) and the store's revision at the read."""
        reply = self.post("kv/range", {"key": _b64(key), "range_end": _b64(end)})
        return [_key_value(item) for item in reply.get("kvs", [])], _revision(reply)

    def txn(self, body: dict[str, Any]) -> tuple[bool, int, dict[str, Any]]:
        """A transaction: (succeeded, its revision, the reply)."""
        reply = self.post("kv/txn", body)
        return bool(reply.get("succeeded", False)), _revision(reply), reply


def txn_ranges(reply: dict[str, Any]) -> list[KeyValue | None]:
    """The keys a transaction's range requests read, in order (None: absent)."""
    found: list[KeyValue | None] = []
    for response in reply.get("responses", []):
        if "response_range" in response:
            kvs = response["response_range"].get("kvs", [])
            found.append(_key_value(kvs[0]) if kvs else None)
    return found


def compare_created(key: str, revision: int) -> dict[str, Any]:
    """A txn compare: ``key``'s create_revision equals ``revision`` (0: the key is absent)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": revision}


def compare_unchanged_since(key: str, end: str, revision: int) -> dict[str, Any]:
    """A txn compare: no key in [key, end) was written after ``revision`` (a key created since
    fails it too; a deleted one does not, it is simply gone)."""
    return {
        "key": _b64(key),
        "range_end": _b64(end),
        "target": "MOD",
        "result": "LESS",
        "mod_revision": revision + 1,
    }


def compare_modified(key: str, revision: int) -> dict[str, Any]:
    """A txn compare: ``key`` was last written at ``revision`` (0: the key is absent)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision}


def request_put(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    """A put attached to ``lease`` (0: to none; the key stays until it is deleted)."""
    return {"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease}}


def request_range(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


def request_delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


class Etcd:
    """``Endpoints`` for asyncio: each call in this instance's one thread, bounded."""

    def __init__(self, endpoints: tuple[Endpoint, ...], timeout: float, name: str) -> None:
        self._endpoints = Endpoints(endpoints, timeout)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"etcd-{name}")
        # Each endpoint may cost a connect and a read timeout; then a little for the thread.
        self.budget = 2 * timeout * len(endpoints) + 0.5

    @property
    def current(self) -> str:
        return self._endpoints.current

    async def call(self, operation: Callable[[Endpoints], T]) -> T:
        """Run ``operation(endpoints)`` in this instance's thread; EtcdUnavailable past the
        budget (the thread finishes on its own, within its request timeouts)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, operation, self._endpoints)
        try:
            # asyncio.timeout, not wait_for: on 3.11, wait_for can swallow a cancellation that
            # arrives as the call completes, and a task that was told to stop would go on.
            async with asyncio.timeout(self.budget):
                return await future
        except TimeoutError:
            raise EtcdUnavailable(f"etcd did not answer within {self.budget:.1f} s") from None

    def close(self) -> None:
        """Stop taking calls; a call still running ends within its timeouts, then the sessions
        close."""
        self._executor.submit(self._endpoints.close)
        self._executor.shutdown(wait=False, cancel_futures=False)


def etcd_command(
    binary: str, name: str, data: Path, port: int, peer_port: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a single-member etcd on 127.0.0.1 (client ``port``, peer
    ``peer_port``, its data in ``data``), logging warnings to stderr: the one way this project
    starts etcd (the dev cluster, the bench, the tests). Flags only: ETCD_* variables in the
    environment would override them, so they are left out of it."""
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    argv = [
        binary,
        "--name", name,
        "--data-dir", str(data),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{name}={peer}",
        "--initial-cluster-state", "new",
        "--logger", "zap",
        "--log-outputs", "stderr",
        "--log-level", "warn",
    ]  # fmt: skip
    return argv, {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
