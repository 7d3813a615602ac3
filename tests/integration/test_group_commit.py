"""Concurrent appends share transactions (group commit) without losing order or isolation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from sessionlog import errors
from sessionlog.storage import writer
from sessionlog.storage.store import AppendResult, Store, prepare_append
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import WriterGate, decoded, read_all, user

WRITERS = 16
APPENDS_EACH = 50
WAIT_SECONDS = 30


def _hammer(store: Store, writer: int, failures: list[BaseException]) -> None:
    try:
        for i in range(APPENDS_EACH):
            own = store.append(f"own-{writer}", [user(f"{writer}:{i}")])
            assert own.next_seq == i + 1
            store.append("shared", [user(f"{writer}:{i}", writer=writer, i=i)])
    except BaseException as exc:  # reported by the test thread
        failures.append(exc)


def test_concurrent_writers_get_dense_seqs_and_share_commits(store: Store) -> None:
    """16 threads x 50 appends: all acknowledged, dense per session, fewer commits than appends."""
    failures: list[BaseException] = []
    threads = [threading.Thread(target=_hammer, args=(store, w, failures)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []

    total = WRITERS * APPENDS_EACH * 2
    for w in range(WRITERS):
        own = decoded(read_all(store, f"own-{w}"))
        assert [e.seq for e in own] == list(range(APPENDS_EACH))
        assert [e.data.fields["content"].string_value for e in own] == [
            f"{w}:{i}" for i in range(APPENDS_EACH)
        ]
    shared = decoded(read_all(store, "shared"))
    assert [e.seq for e in shared] == list(range(WRITERS * APPENDS_EACH))
    per_writer: dict[int, list[int]] = defaultdict(list)
    for e in shared:
        per_writer[int(e.data.fields["writer"].number_value)].append(
            int(e.data.fields["i"].number_value)
        )
    assert per_writer == {w: list(range(APPENDS_EACH)) for w in range(WRITERS)}

    stats = store.writer.stats
    assert stats.commands == total
    assert stats.commits < total
    assert stats.largest_group > 1


def test_queued_appends_commit_as_one_group(store: Store) -> None:
    """Appends queued while the writer is busy all land in a single transaction."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    commits_before = store.writer.stats.commits
    futures = [store.submit_append(prepare_append(f"g{i % 3}", [user(str(i))])) for i in range(30)]
    gate.release.set()
    held.result(WAIT_SECONDS)
    results = [f.result(WAIT_SECONDS) for f in futures]
    assert store.writer.stats.commits == commits_before + 2
    assert store.writer.stats.largest_group >= 30
    assert [r.next_seq for r in results] == [i // 3 + 1 for i in range(30)]


def test_failure_inside_group_leaves_other_appends_intact(store: Store) -> None:
    """A SEQ_CONFLICT, a bad event and a reused request id fail alone; the group's rest commits."""
    store.append("s", [user("base")], request_id="r1")
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    commits_before = store.writer.stats.commits

    def submit(session: str, events: list[Event], **options: Any) -> Future[AppendResult]:
        return store.submit_append(prepare_append(session, events, **options))

    ok_before = submit("s", [user("one")], expected_seq=1)
    conflict = submit("s", [user("lost")], expected_seq=1)
    ok_other = submit("t", [user("t0"), user("t1")])
    bad_event = submit("s", [user("x"), Event()])
    reused = submit("s", [user("different")], request_id="r1")
    ok_after = submit("s", [user("two")], expected_seq=2)
    gate.release.set()
    held.result(WAIT_SECONDS)

    assert ok_before.result(WAIT_SECONDS).next_seq == 2
    with pytest.raises(errors.SeqConflict) as caught:
        conflict.result(WAIT_SECONDS)
    assert caught.value.metadata["next_seq"] == "2"
    with pytest.raises(errors.UnknownEventType):
        bad_event.result(WAIT_SECONDS)
    with pytest.raises(errors.RequestIdReused):
        reused.result(WAIT_SECONDS)
    assert ok_other.result(WAIT_SECONDS).next_seq == 2
    assert ok_after.result(WAIT_SECONDS).next_seq == 3
    assert store.writer.stats.commits == commits_before + 2

    stored = decoded(read_all(store, "s"))
    assert [e.data.fields["content"].string_value for e in stored] == ["base", "one", "two"]
    assert [e.seq for e in stored] == [0, 1, 2]
    assert len(read_all(store, "t")) == 2


# -- callers on an event loop (the gRPC handlers): Store.commit_* ------------------------------


def test_loop_callers_of_one_group_are_answered_with_one_loop_callback(store: Store) -> None:
    """30 appends awaited on a loop share one commit, and their outcomes (results and a refusal)
    reach the loop in a single call_soon_threadsafe, not one per append."""

    async def run() -> tuple[list[Any], int]:
        loop = asyncio.get_running_loop()
        handed: list[Any] = []
        original = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any) -> Any:
            if threading.current_thread().name == "sessionlog-writer":
                handed.append(callback)
            return original(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        gate = WriterGate()
        held = store.writer.submit(gate)
        assert await asyncio.to_thread(gate.entered.wait, WAIT_SECONDS)
        commits_before = store.writer.stats.commits
        futures = [
            store.commit_append(prepare_append(f"l{i % 3}", [user(str(i))])) for i in range(29)
        ]
        futures.append(store.commit_append(prepare_append("l0", [user("x")], expected_seq=0)))
        handed.clear()
        gate.release.set()
        await asyncio.to_thread(held.result, WAIT_SECONDS)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert store.writer.stats.commits == commits_before + 2  # the gate's, then the group's
        return outcomes, len(handed)

    outcomes, callbacks = asyncio.run(run())
    assert [r.next_seq for r in outcomes[:29]] == [i // 3 + 1 for i in range(29)]
    assert isinstance(outcomes[29], errors.SeqConflict)
    assert callbacks == 1


def test_a_loop_caller_that_gave_up_before_its_group_is_never_written(store: Store) -> None:
    """Cancelling the loop future before the writer takes the append leaves the log untouched;
    the append queued beside it is written."""

    async def run() -> None:
        gate = WriterGate()
        held = store.writer.submit(gate)
        assert await asyncio.to_thread(gate.entered.wait, WAIT_SECONDS)
        dropped = store.commit_append(prepare_append("gone", [user("never")]))
        kept = store.commit_append(prepare_append("kept", [user("stored")]))
        dropped.cancel()
        gate.release.set()
        await asyncio.to_thread(held.result, WAIT_SECONDS)
        assert (await kept).next_seq == 1

    asyncio.run(run())
    assert store.next_seq("gone") == 0
    assert store.next_seq("kept") == 1


def test_a_loop_caller_that_gives_up_once_its_group_is_taken_still_has_it_written(
    store: Store,
) -> None:
    """Cancelled after the writer took its group, the append is written (nothing is undone) and
    its outcome is dropped; the writer carries on with the next append."""

    async def run() -> None:
        first, second = WriterGate(), WriterGate()
        held = store.writer.submit(first)
        assert await asyncio.to_thread(first.entered.wait, WAIT_SECONDS)
        late = store.commit_append(prepare_append("late", [user("written")]))
        inside = store.writer.submit(second)  # taken in the same group, after the append
        first.release.set()
        assert await asyncio.to_thread(second.entered.wait, WAIT_SECONDS)
        late.cancel()
        second.release.set()
        await asyncio.to_thread(held.result, WAIT_SECONDS)
        await asyncio.to_thread(inside.result, WAIT_SECONDS)
        assert late.cancelled()
        assert (await store.commit_append(prepare_append("late", [user("next")]))).next_seq == 2

    asyncio.run(run())
    assert [e.data.fields["content"].string_value for e in decoded(read_all(store, "late"))] == [
        "written",
        "next",
    ]


def test_a_barrier_from_the_loop_comes_after_the_appends_it_submitted_before(store: Store) -> None:
    """An append submitted on the loop, then a barrier from the same thread: the barrier is
    resolved only once the append is committed (a loop-side batching of appends must hand its
    batch over before any other submission from that thread)."""

    async def run() -> None:
        appended = store.commit_append(prepare_append("first", [user("a")]))
        barrier = store.writer.barrier()
        await asyncio.to_thread(barrier.result, WAIT_SECONDS)
        assert store.next_seq("first") == 1  # committed before the barrier was resolved
        assert (await appended).next_seq == 1

    asyncio.run(run())


def test_a_closed_store_refuses_a_loop_caller_at_once(store: Store) -> None:
    """After close, commit_append's future already holds UNAVAILABLE: nothing is queued."""
    store.writer.close()

    async def run() -> BaseException | None:
        future = store.commit_append(prepare_append("s", [user("late")]))
        assert future.done()
        return future.exception()

    assert isinstance(asyncio.run(run()), errors.Unavailable)


def test_a_queued_write_is_admitted_in_its_transaction(store: Store) -> None:
    """``admits`` (the shard map's word) is asked when the write applies, not when it queued:
    an append queued before a slot froze is refused, writing nothing; a move's copy passes; a
    barrier resolves only after the writes queued before it."""
    store.append("frozen", [user("before")])
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    queued = store.submit_append(prepare_append("frozen", [user("late")]))
    other = store.submit_append(prepare_append("other", [user("fine")]))
    copy = prepare_append("frozen", [user("copied")], expected_seq=1)
    copy.moving_in = True
    copied = store.submit_append(copy)
    barrier = store.writer.barrier()
    refusal = errors.SlotMoving("frozen", session_id="frozen")
    store.writer.admits = lambda session_id: refusal if session_id == "frozen" else None
    assert not barrier.done()
    gate.release.set()
    held.result(WAIT_SECONDS)
    barrier.result(WAIT_SECONDS)
    assert all(f.done() for f in (queued, other, copied))
    with pytest.raises(errors.SlotMoving):
        queued.result(0)
    assert other.result(0).next_seq == 1
    assert copied.result(0).next_seq == 2
    assert [e.data["content"] for e in decoded(read_all(store, "frozen"))] == ["before", "copied"]


class _Background:
    """A command that writes nothing and notes when, and in which group (its ``now_ns``), it
    ran."""

    kind = "update"
    session_id = ""
    moving_in = True

    def __init__(self) -> None:
        self.now_ns = 0
        self.ran_at = 0.0

    def apply(self, txn: Any, now_ns: int) -> None:
        self.now_ns, self.ran_at = now_ns, time.monotonic()

    def size(self) -> int:
        return 0

    def touched(self) -> list[str]:
        return []


def test_a_background_command_rides_at_the_end_of_the_next_group(store: Store) -> None:
    """Queued before another command, a background command still runs after it, in its
    transaction: it adds no commit of its own."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    background, foreground = _Background(), _Background()
    done = store.writer.submit_background(background)
    other = store.writer.submit(foreground)
    commits_before = store.writer.stats.commits
    gate.release.set()
    held.result(WAIT_SECONDS)
    other.result(WAIT_SECONDS)
    done.result(WAIT_SECONDS)
    assert background.now_ns == foreground.now_ns  # one group's clock
    assert background.ran_at >= foreground.ran_at
    assert store.writer.stats.commits - commits_before == 2  # the gate's, then theirs


def test_a_background_command_alone_waits_for_the_writers_idle_gap(store: Store) -> None:
    """With no write to ride with, it runs alone, but only once the writer has been idle
    BACKGROUND_IDLE_SECONDS since its last commit."""
    store.append("before", [user("x")])
    background = _Background()
    store.writer.submit_background(background).result(WAIT_SECONDS)
    # From the end of the writer's last group, as it counts (a clock read here, after this
    # thread woke from the append, can be late by more than the gap on a busy machine).
    committed = store.writer._last_foreground
    assert background.ran_at - committed >= writer.BACKGROUND_IDLE_SECONDS * 0.9


def test_background_commands_keep_running_under_continuous_appends(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of appends never leaves the writer idle, yet one background command after
    another runs, each beside an append (none starves). The idle gap is made long here: on a
    busy machine the appender thread can wait for a CPU longer than the real 5 ms, and the
    writer, idle by its own clock, rightly runs the command alone."""
    monkeypatch.setattr(writer, "BACKGROUND_IDLE_SECONDS", 0.5)
    stop = threading.Event()

    def appender() -> None:
        while not stop.is_set():
            store.append("busy", [user("y")])

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        ran = []
        for _ in range(50):
            background = _Background()
            store.writer.submit_background(background).result(WAIT_SECONDS)
            ran.append(background.now_ns)
    finally:
        stop.set()
        thread.join(WAIT_SECONDS)
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    appended = {c.commit_time.ToNanoseconds() for c in feed if c.session_id == "busy"}
    assert len(ran) == 50
    rode = sum(now in appended for now in ran)
    assert rode >= 25  # most rode in an append's transaction


class _Budget(_Background):
    """Notes whether the writer ran it as alone (the longer budget) or riding."""

    def __init__(self) -> None:
        super().__init__()
        self.alone = False
        self.ran_alone: bool | None = None

    def apply(self, txn: Any, now_ns: int) -> None:
        self.ran_alone = self.alone
        super().apply(txn, now_ns)


def _commit_as_another_process(store: Store) -> None:
    """A commit that is not this writer's, as another worker's writer would make (the same
    LMDB file, the same write lock)."""
    with store.env.begin(write=True) as txn:  # a key of LMDB's main table, which no one reads
        txn.put(b"test-another-writer", str(time.monotonic_ns()).encode())


def test_a_lone_background_command_keeps_short_when_another_process_commits(store: Store) -> None:
    """Idle in its own process, the writer runs a background command alone (the longer
    budget), unless another process has committed since its own last commit: that process's
    writes are waiting for the lock (`--workers N`), so it runs as if riding."""
    store.append("before", [user("x")])
    quiet = _Budget()
    store.writer.submit_background(quiet).result(WAIT_SECONDS)
    assert quiet.ran_alone is True
    _commit_as_another_process(store)
    busy = _Budget()
    store.writer.submit_background(busy).result(WAIT_SECONDS)
    assert busy.ran_alone is False


class _Failing(_Background):
    """A background command that fails the way a bug would (not a refusal)."""

    def apply(self, txn: Any, now_ns: int) -> None:
        super().apply(txn, now_ns)
        raise ValueError("a chunk met something it did not expect")


def test_a_failing_background_job_costs_its_riders_one_retry_not_one_each(store: Store) -> None:
    """A group whose background job fails is retried as the other commands in one
    transaction, then the job alone: the appends are written, in one commit, and the job's
    caller gets the failure."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    failing = store.writer.submit_background(_Failing())
    appends = [store.submit_append(prepare_append(f"s{i}", [user("x")])) for i in range(10)]
    commits_before = store.writer.stats.commits
    gate.release.set()
    held.result(WAIT_SECONDS)
    assert [a.result(WAIT_SECONDS).next_seq for a in appends] == [1] * 10
    with pytest.raises(ValueError, match="did not expect"):
        failing.result(WAIT_SECONDS)
    assert store.writer.stats.commits - commits_before == 2  # the gate's, then the ten's


class _Countdown(_Background):
    """Says ``more`` until it has run ``times`` times, noting each group's clock."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.left = times
        self.clocks: list[int] = []

    def apply(self, txn: Any, now_ns: int) -> Any:
        self.left -= 1
        self.clocks.append(now_ns)
        return SimpleNamespace(more=self.left > 0, left=self.left)


def test_a_repeated_background_command_runs_until_it_says_no_more(store: Store) -> None:
    """With ``repeat`` the writer runs the command again, once per group, and gives only its
    last result; appends keep going in between."""
    countdown = _Countdown(5)
    done = store.writer.submit_background(countdown, repeat=True)
    for n in range(5):
        store.append("between", [user(str(n))])
    assert done.result(WAIT_SECONDS).left == 0
    assert len(countdown.clocks) == len(set(countdown.clocks)) == 5  # five groups


class _Paced(_Countdown):
    """A countdown noting when each run began (monotonic)."""

    def __init__(self, times: int) -> None:
        super().__init__(times)
        self.ran: list[float] = []

    def apply(self, txn: Any, now_ns: int) -> Any:
        self.ran.append(time.monotonic())
        return super().apply(txn, now_ns)


def test_a_paced_background_command_rides_one_group_per_pace_while_appends_flow(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under appends that never pause, a repeated command with a ``pace`` rides at most one
    group per pace, not every group: most commits carry none of it. (The idle gap is made
    long, as above: a starved appender would leave the writer idle, and an idle writer runs
    the command back to back, as it should.)"""
    monkeypatch.setattr(writer, "BACKGROUND_IDLE_SECONDS", 0.5)
    stop = threading.Event()
    appended = [0]

    def appender() -> None:
        while not stop.is_set():
            store.append("busy", [user("y")])
            appended[0] += 1

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        while appended[0] < 20:  # the writer is busy: no idle gap from here on
            time.sleep(0.001)
        paced = _Paced(6)
        store.writer.submit_background(paced, repeat=True, pace=0.05).result(WAIT_SECONDS)
    finally:
        stop.set()
        thread.join(WAIT_SECONDS)
    gaps = [later - earlier for earlier, later in zip(paced.ran, paced.ran[1:], strict=False)]
    assert min(gaps) >= 0.05 * 0.95, gaps
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    commits = {c.commit_time.ToNanoseconds() for c in feed if c.session_id == "busy"}
    assert sum(clock in commits for clock in paced.clocks) >= 3  # they rode with appends
    assert len(commits) > 4 * len(paced.clocks)


def test_an_idle_writer_runs_a_repeated_background_command_back_to_back(store: Store) -> None:
    """With no other write, a repeated command's runs follow each other at once (each alone),
    not one per idle gap: an idle server frees a long session at full speed."""
    store.append("before", [user("x")])
    paced = _Paced(40)  # its pace holds only while writes flow
    store.writer.submit_background(paced, repeat=True, pace=60.0).result(WAIT_SECONDS)
    gaps = sorted(later - earlier for earlier, later in zip(paced.ran, paced.ran[1:], strict=False))
    assert gaps[len(gaps) // 2] < writer.BACKGROUND_IDLE_SECONDS / 2, gaps


def test_a_repeated_background_command_goes_behind_the_jobs_waiting(store: Store) -> None:
    """A repeated command's next run queues behind the background jobs already waiting: a job
    submitted after it runs before it ends, not after its last run."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    countdown = _Countdown(10)
    repeated = store.writer.submit_background(countdown, repeat=True)
    single = _Background()
    once = store.writer.submit_background(single)
    gate.release.set()
    held.result(WAIT_SECONDS)
    once.result(WAIT_SECONDS)
    repeated.result(WAIT_SECONDS)
    assert countdown.clocks[0] < single.now_ns < countdown.clocks[-1]


class _CountingEnv:
    """The store's real LMDB environment, counting the calls of ``info``."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.infos = 0

    def info(self) -> dict[str, int]:
        self.infos += 1
        info: dict[str, int] = self._env.info()
        return info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def test_the_writer_asks_lmdb_for_its_info_only_while_a_background_job_waits(
    store: Store,
) -> None:
    """Appends cost no ``env.info()``: the transaction id that tells whether another process
    committed is read from the writer's own transaction, and compared only for background
    jobs."""
    counting = _CountingEnv(store.env)
    store.writer._env = counting  # type: ignore[assignment]
    for n in range(20):
        store.append("plain", [user(str(n))])
    assert counting.infos == 0
    store.writer.submit_background(_Background()).result(WAIT_SECONDS)
    assert counting.infos >= 1


class _HalfDone:
    """Writes a key, then refuses itself: what a bug in a command's checks would do."""

    kind = "update"
    session_id = ""
    moving_in = True

    def __init__(self, store: Store) -> None:
        self._db = store.tables.counters

    def apply(self, txn: Any, now_ns: int) -> None:
        txn.put(b"test-half-done", b"written", db=self._db)
        raise errors.InvalidArgument("refused after writing")

    def size(self) -> int:
        return 0

    def touched(self) -> list[str]:
        return []


def test_a_command_refusing_itself_after_writing_leaves_nothing_and_the_others_commit(
    store: Store,
) -> None:
    """A refusal after a write aborts the transaction (never a half-applied command
    committed); the group is retried without it, and its caller gets the refusal."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    before = store.submit_append(prepare_append("a", [user("x")]))
    half = store.writer.submit(_HalfDone(store))
    after = store.submit_append(prepare_append("b", [user("y")]))
    gate.release.set()
    held.result(WAIT_SECONDS)
    assert before.result(WAIT_SECONDS).next_seq == after.result(WAIT_SECONDS).next_seq == 1
    with pytest.raises(errors.InvalidArgument, match="refused after writing"):
        half.result(WAIT_SECONDS)
    with store.env.begin() as txn:
        assert txn.get(b"test-half-done", db=store.tables.counters) is None
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    assert [c.session_id for c in feed] == ["a", "b"]
