"""ListSessions across groups: real servers of two static groups (``--shard-map FILE --group``).

Through either group's server a listing returns every group's sessions in id order, each once,
with page tokens that stay valid across writes; tenant scoping holds in every group; the
console and `sessionlog sessions` show the whole cluster; a group that does not answer fails the
listing UNAVAILABLE / GROUP_UNAVAILABLE instead of leaving its sessions out.

Group g2 lists a member where nothing listens before its real one, so every listing also shows
the fallback from a group's first member to the next. The servers are module-scoped: one start
for the whole module.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.listing import encode_page_token
from sessionlog.shard import scatter
from sessionlog.shard.slots import slot_of
from sessionlog.testing import error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli

ADMIN, TENANT = "admin-secret-0123456789", "tenant-a-secret-0123456789"
TOKENS = f"""
[[token]]
name = "admin"
token = "{ADMIN}"
permissions = ["admin"]

[[token]]
name = "tenant-a"
token = "{TENANT}"
permissions = ["read", "write"]
session_prefix = "tenant-a."
"""
G1_SLOTS, G2_SLOTS = '["0-255", "512-767"]', '["256-511", "768-1023"]'
"""Alternate quarters: ids of one length and prefix have slots close together (CRC32 is
linear), so each prefix of the test has sessions in both groups."""


def group_of(session_id: str) -> str:
    return "g1" if slot_of(session_id) // 256 % 2 == 0 else "g2"


@dataclass
class Member:
    name: str
    address: str
    http: str
    args: list[str]
    folder: Path
    process: ServerProcess | None = None

    def start(self) -> None:
        self.process = ServerProcess(self.args, self.folder, name=self.name).start()
        self.process.wait_serving(self.address)

    def stop(self) -> None:
        assert self.process is not None
        self.process.stop()


@dataclass
class Cluster:
    members: dict[str, Member]
    sessions: set[str] = field(default_factory=set)
    """Every session created so far (tests may add some)."""
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def stub(self, group: str) -> pb_grpc.SessionLogServiceStub:
        address = self.members[group].address
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return pb_grpc.SessionLogServiceStub(self.channels[address])  # type: ignore[no-untyped-call]

    def create(self, session_id: str) -> None:
        """Create ``session_id`` on the server of the group that owns it."""
        self.stub(group_of(session_id)).CreateSession(
            pb.CreateSessionRequest(session_id=session_id), metadata=bearer(ADMIN), timeout=5
        )
        self.sessions.add(session_id)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def list_pages(
    stub: pb_grpc.SessionLogServiceStub,
    *,
    token: str = ADMIN,
    prefix: str = "",
    page_size: int = 7,
    between: Any = None,
) -> list[list[str]]:
    """Every page of a listing (``between(n)`` runs before page n > 0), bounded in count."""
    pages: list[list[str]] = []
    page_token = ""
    for number in range(200):
        if number and between is not None:
            between(number)
        reply = stub.ListSessions(
            pb.ListSessionsRequest(prefix=prefix, page_size=page_size, page_token=page_token),
            metadata=bearer(token),
            timeout=10,
        )
        pages.append([s.session_id for s in reply.sessions])
        page_token = reply.next_page_token
        if not page_token:
            return pages
    raise AssertionError("the listing did not end within 200 pages")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """g1 (one member) and g2 (a dead first member, then a real one), with tokens, each with
    its console; 60 sessions spread over both."""
    root = tmp_path_factory.mktemp("across")
    tokens = root / "tokens.toml"
    tokens.write_text(TOKENS)
    g1, g2, dead = (f"127.0.0.1:{free_port()}" for _ in range(3))
    shard_map = root / "shards.toml"
    shard_map.write_text(
        "epoch = 1\n\n"
        f'[groups.g1]\nmembers = ["{g1}"]\nslots = {G1_SLOTS}\n\n'
        f'[groups.g2]\nmembers = ["{dead}", "{g2}"]\nslots = {G2_SLOTS}\n'
    )
    members: dict[str, Member] = {}
    for name, address in (("g1", g1), ("g2", g2)):
        http = f"127.0.0.1:{free_port()}"
        folder = root / name
        folder.mkdir()
        args = ["--data", str(folder / "data"), "--listen", address, "--http-listen", http]
        args += ["--shard-map", str(shard_map), "--group", name]
        args += ["--auth-tokens", str(tokens), "--auth-open-health"]
        members[name] = Member(name, address, http, args, folder)
    try:
        for member in members.values():
            member.start()
        cluster = Cluster(members)
        for tenant in ("tenant-a", "tenant-b", "s"):
            for number in range(20):
                cluster.create(f"{tenant}.{number:02d}")
        for tenant in ("tenant-a.", "tenant-b."):
            spread = {group_of(s) for s in cluster.sessions if s.startswith(tenant)}
            assert spread == {"g1", "g2"}, f"{tenant} sessions lie in both groups"
        yield cluster
    finally:
        for member in members.values():
            if member.process is not None:
                member.process.__exit__(None, None, None)
        for channel in locals().get("cluster", Cluster({})).channels.values():
            channel.close()


def test_pages_through_either_server_list_every_session_once_in_order(cluster: Cluster) -> None:
    """page_size 7 through g1's server and through g2's: every session of both groups exactly
    once, in id order, no page over 7."""
    for group in ("g1", "g2"):
        pages = list_pages(cluster.stub(group))
        listed = [s for page in pages for s in page]
        assert listed == sorted(cluster.sessions), f"through {group}"
        assert all(len(page) <= 7 for page in pages)
        assert len(pages) >= len(cluster.sessions) // 7


def test_the_group_scope_lists_one_groups_own_sessions(cluster: Cluster) -> None:
    """``x-sessionlog-scope: group`` (what a forwarded listing carries): no fan-out."""
    for group in ("g1", "g2"):
        reply = cluster.stub(group).ListSessions(
            pb.ListSessionsRequest(page_size=1000),
            metadata=(*bearer(ADMIN), ("x-sessionlog-scope", "group")),
            timeout=10,
        )
        listed = [s.session_id for s in reply.sessions]
        assert listed == sorted(s for s in cluster.sessions if group_of(s) == group)


def test_a_prefix_filters_in_every_group(cluster: Cluster) -> None:
    """prefix 'tenant-b.': its 20 sessions of both groups, no other."""
    pages = list_pages(cluster.stub("g1"), prefix="tenant-b.")
    listed = [s for page in pages for s in page]
    assert listed == sorted(s for s in cluster.sessions if s.startswith("tenant-b."))
    assert len(listed) == 20


def test_page_tokens_stay_valid_while_sessions_are_created(cluster: Cluster) -> None:
    """Sessions created in both groups between pages: the listing goes on from its token,
    lists each session once, the new ones past the cursor included, those behind it not."""
    behind: list[str] = []
    ahead: list[str] = []

    def create(number: int) -> None:
        made = [f"a.{number:02d}-{g}" for g in ("x", "y", "z")]  # before the first page's "s."
        made += [f"w.{number:02d}-{g}" for g in ("x", "y", "z")]  # after every "tenant-"
        for session_id in made:
            cluster.create(session_id)
        behind.extend(made[:3])
        ahead.extend(made[3:])

    pages = list_pages(cluster.stub("g2"), between=create)
    listed = [s for page in pages for s in page]
    assert listed == sorted(set(listed)), "each once, in id order"
    assert {group_of(s) for s in ahead} == {"g1", "g2"}, "created in both groups"
    assert set(ahead) <= set(listed), "created ahead of the cursor: listed"
    assert not set(behind) & set(listed), "created behind the cursor: not listed"
    assert set(listed) == cluster.sessions - set(behind)


def test_a_tenant_token_lists_its_prefix_across_groups(cluster: Cluster) -> None:
    """A token limited to 'tenant-a.' lists tenant-a's sessions of both groups and nothing
    else, asked with no prefix; a prefix outside its own is refused by every group."""
    pages = list_pages(cluster.stub("g1"), token=TENANT)
    listed = [s for page in pages for s in page]
    assert listed == sorted(s for s in cluster.sessions if s.startswith("tenant-a."))
    with pytest.raises(grpc.RpcError) as refused:
        list_pages(cluster.stub("g2"), token=TENANT, prefix="tenant-b.")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def get_json(url: str, token: str = ADMIN) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_console_lists_both_groups(cluster: Cluster) -> None:
    """GET /api/sessions on either server: every session of both groups; paged by after=."""
    for group in ("g1", "g2"):
        status, body = get_json(f"http://{cluster.members[group].http}/api/sessions?limit=1000")
        assert status == 200
        assert [s["session_id"] for s in body["sessions"]] == sorted(cluster.sessions)
        assert body["more"] is False
        assert all(s["exists"] and "create_time_ms" in s for s in body["sessions"])
    http = cluster.members["g1"].http
    status, body = get_json(f"http://{http}/api/sessions?limit=5&prefix=tenant-a.", TENANT)
    assert status == 200
    assert body["more"] is True
    first = [s["session_id"] for s in body["sessions"]]
    query = f"limit=1000&prefix=tenant-a.&after={first[-1]}"
    status, body = get_json(f"http://{http}/api/sessions?{query}", TENANT)
    rest = [s["session_id"] for s in body["sessions"]]
    assert first + rest == sorted(s for s in cluster.sessions if s.startswith("tenant-a."))


def test_the_cli_lists_the_whole_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """`sessionlog sessions` through g2's server prints every session of both groups."""
    address = cluster.members["g2"].address
    done = run_cli(
        ["sessions", "--server", address, "--token", ADMIN, "--limit", "1000"],
        tmp_path,
        env=clean_env(workers=False),
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split("\t")[0] for line in done.stdout.splitlines()]
    assert listed == sorted(cluster.sessions)


def test_a_group_without_an_answering_member_fails_the_listing(cluster: Cluster) -> None:
    """g2 down: a listing through g1 fails UNAVAILABLE / GROUP_UNAVAILABLE naming g2 (not a
    list without g2's sessions), and the console answers 503 with that reason; with g2 back,
    the listing is whole again."""
    g2 = cluster.members["g2"]
    g2.stop()
    try:
        with pytest.raises(grpc.RpcError) as failed:
            list_pages(cluster.stub("g1"))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(failed.value)
        assert info.reason == "GROUP_UNAVAILABLE"
        assert info.metadata["group"] == "g2"
        status, body = get_json(f"http://{cluster.members['g1'].http}/api/sessions")
        assert status == 503
        assert body["reason"] == "GROUP_UNAVAILABLE"
        scoped = cluster.stub("g1").ListSessions(
            pb.ListSessionsRequest(page_size=1000),
            metadata=(*bearer(ADMIN), ("x-sessionlog-scope", "group")),
            timeout=10,
        )
        assert scoped.sessions, "g1's own listing still answers"
    finally:
        g2.start()
    listed = [s for page in list_pages(cluster.stub("g1"), page_size=1000) for s in page]
    assert listed == sorted(cluster.sessions)


def test_tail_every_group_follows_each_groups_feed_with_its_own_cursor(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`sessionlog tail --prefix P --every-group`: the events of P's sessions from both
    groups' change feeds, each line naming its group and its position in that group's feed;
    `--cursor GROUP=N` starts that group's feed at N."""
    written = sorted(s for s in cluster.sessions if s.startswith("tenant-a."))[:6]
    for session_id in written:
        said = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
        said.data.update({"content": f"hello {session_id}"})
        cluster.stub(group_of(session_id)).Append(
            pb.AppendRequest(session_id=session_id, events=[said]),
            metadata=bearer(ADMIN),
            timeout=5,
        )
    args = ["tail", "--prefix", "tenant-a.", "--every-group", "--no-follow", "--json"]
    args += ["--server", cluster.members["g1"].address, "--token", ADMIN]

    def tail(*extra: str) -> list[dict[str, Any]]:
        done = run_cli([*args, *extra], tmp_path, env=clean_env(workers=False))
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    lines = tail()
    assert sorted(line["session_id"] for line in lines) == written
    assert all(line["group"] == group_of(line["session_id"]) for line in lines)
    assert {line["group"] for line in lines} == {"g1", "g2"}
    for group in ("g1", "g2"):
        mine = [line["position"] for line in lines if line["group"] == group]
        assert mine == sorted(mine), "a group's feed in its order"
    past_g2 = 1 + max(line["position"] for line in lines if line["group"] == "g2")
    later = tail("--cursor", f"g2={past_g2}")
    assert later == [line for line in lines if line["group"] == "g1"]

    mistyped = run_cli([*args, "--cursor", "g3=5"], tmp_path, env=clean_env(workers=False))
    assert mistyped.returncode == 2, mistyped.stdout
    assert "--cursor names no group of the shard map: g3 (groups: g1, g2)" in mistyped.stderr


@pytest.mark.serial  # fails within the group deadline + 3 s
def test_a_hanging_group_fails_the_listing_within_its_deadline(cluster: Cluster) -> None:
    """g2's member stopped (SIGSTOP: it accepts connections and never answers): a listing
    through g1 still ends, GROUP_UNAVAILABLE within the group deadline (no caller deadline), and
    by the caller's own deadline when that is shorter; after SIGCONT it is whole again."""
    process = cluster.members["g2"].process
    assert process is not None
    process.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as failed:
            cluster.stub("g1").ListSessions(
                pb.ListSessionsRequest(), metadata=bearer(ADMIN), timeout=30
            )
        took = time.monotonic() - started
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(failed.value).reason == "GROUP_UNAVAILABLE"
        assert took < scatter.GROUP_DEADLINE_SECONDS + 3, took

        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as failed:
            cluster.stub("g1").ListSessions(
                pb.ListSessionsRequest(), metadata=bearer(ADMIN), timeout=1.0
            )
        assert time.monotonic() - started < 3
        assert failed.value.code() in (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNAVAILABLE,
        )
    finally:
        process.signal(signal.SIGCONT)
    listed = [s for page in list_pages(cluster.stub("g1"), page_size=1000) for s in page]
    assert listed == sorted(cluster.sessions)


@pytest.mark.parametrize("page_size", [0, 1, 100_000])
def test_any_page_size_pages_through_every_session_once(cluster: Cluster, page_size: int) -> None:
    """0 is the default size and a huge one is capped: either way every session once."""
    listed = [s for page in list_pages(cluster.stub("g2"), page_size=page_size) for s in page]
    assert listed == sorted(cluster.sessions)


@pytest.mark.parametrize(
    "page_token",
    ["x", "A" * 10_000, "AQ", encode_page_token("tenant-a.05", "other-prefix")],
)
def test_a_forged_page_token_is_invalid_page_token(cluster: Cluster, page_token: str) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        cluster.stub("g1").ListSessions(
            pb.ListSessionsRequest(page_token=page_token), metadata=bearer(ADMIN), timeout=10
        )
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(failed.value).reason == "INVALID_PAGE_TOKEN"
