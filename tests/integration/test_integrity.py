"""Damaged data files on a real LMDB: the check before mapping, reads and writes that meet
damage (DATA_CORRUPTED, nothing written), and the verify walk.

Damage is made the way it happens: bytes of the real file cut off or overwritten, or a stored
value replaced by bytes that are not the record (put with LMDB itself, beside the store).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage import integrity, schema
from sessionlog.storage.integrity import DamagedStore, check_data_file
from sessionlog.storage.store import Store
from sessionlog.storage.usage import open_readonly
from tests.integration.helpers import opened, replace, sid_of, user

PAGE = 4096


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A closed store of three sessions with a replace, a lease and a request id."""
    path = tmp_path / "data"
    with opened(path) as store:
        for n in range(3):
            store.append(f"s{n}", [user(f"m{n}-{i}" + "x" * 300) for i in range(40)])
        store.append("s1", [replace("summary", 0, 3)], request_id="r-1")
        store.submit_lease("acquire", "s2", "worker", ttl_ns=10**9).result()
    return path


def data_file(folder: Path) -> Path:
    return folder / integrity.DATA_FILE


def put_raw(store: Store, db: bytes, key: bytes, value: bytes) -> None:
    """Overwrite one stored value behind the store's back, as damage would."""
    with store.env.begin(write=True) as txn:
        txn.put(key, value, db=store.tables.by_name[db.decode()])


def problems_of(store: Store) -> list[str]:
    return [str(problem) for problem in integrity.verify(store.env, store.tables)[0]]


# -- the check before LMDB maps the file -------------------------------------------------------


def test_a_whole_file_passes(folder: Path) -> None:
    """A data file as LMDB left it passes the check, and so does its compacted backup."""
    assert check_data_file(data_file(folder)) is None
    env, _ = open_readonly(str(folder))
    try:
        backup = folder.parent / "backup"
        backup.mkdir()
        env.copy(str(backup), compact=True)
    finally:
        env.close()
    assert check_data_file(backup / integrity.DATA_FILE) is None


def test_a_missing_or_empty_file_is_a_new_store(tmp_path: Path) -> None:
    """No data.mdb, or a 0-byte one, is left to LMDB (a new store), not refused."""
    assert check_data_file(tmp_path / "data.mdb") is None
    (tmp_path / "data.mdb").write_bytes(b"")
    assert check_data_file(tmp_path / "data.mdb") is None


@pytest.mark.parametrize("keep", [8 << 10, "half", 3 * PAGE])
def test_a_truncated_file_is_refused_before_mapping(folder: Path, keep: int | str) -> None:
    """A file cut short of its last page is refused with one line naming it; Store refuses to
    open it (instead of dying of SIGBUS on the first read)."""
    path = data_file(folder)
    size = path.stat().st_size
    with path.open("r+b") as data:
        data.truncate(size // 2 if keep == "half" else int(keep))
    problem = check_data_file(path)
    assert problem is not None
    assert str(path) in problem
    assert "truncated" in problem
    with pytest.raises(DamagedStore) as refused:
        Store(folder)
    message = str(refused.value)
    assert "\n" not in message
    assert str(path) in message
    assert "backup" in message
    with pytest.raises(DamagedStore):
        open_readonly(str(folder))


def test_both_metas_with_a_bad_magic_are_refused(folder: Path) -> None:
    """A file whose two meta pages lack LMDB's magic is not an LMDB file."""
    path = data_file(folder)
    with path.open("r+b") as data:
        for page in (0, 1):
            data.seek(page * PAGE + 16)
            data.write(b"\0\0\0\0")
    problem = check_data_file(path)
    assert problem is not None
    assert "not an LMDB data file" in problem


def test_one_damaged_meta_page_is_refused_with_the_runbook(folder: Path) -> None:
    """With one meta's magic gone LMDB refuses the file, so the check does too (and says it is a
    meta page), instead of leaving LMDB's bare MDB_INVALID to the operator."""
    path = data_file(folder)
    with path.open("r+b") as data:
        data.seek(PAGE + 16)
        data.write(b"\0\0\0\0")
    assert "damaged meta page" in (check_data_file(path) or "")
    with pytest.raises(DamagedStore, match="backup"):
        Store(folder)


def test_a_meta_with_a_garbage_transaction_id_is_called_damaged(folder: Path) -> None:
    """Random bytes over a meta's tail (its last page and txnid) are a damaged meta page, not a
    file 'truncated' to a size no disk has."""
    path = data_file(folder)
    with path.open("r+b") as data:
        data.seek(PAGE + 136)
        data.write(bytes(range(200, 216)))
    problem = check_data_file(path) or ""
    assert "damaged meta page" in problem
    assert "truncated" not in problem


def test_the_newer_meta_decides_the_size(folder: Path) -> None:
    """The truncation check applies to what the newer meta says."""
    path = data_file(folder)
    metas = []
    with path.open("rb") as data:
        head = data.read(2 * PAGE)
    for page in (0, 1):
        metas.append(struct.unpack_from("<QQ", head, page * PAGE + 136))
    newer = max((0, 1), key=lambda page: metas[page][1])
    assert check_data_file(path) is None
    last_pg = metas[newer][0]
    with path.open("r+b") as data:
        data.truncate(last_pg * PAGE)
    assert "truncated" in (check_data_file(path) or "")


def test_a_file_shorter_than_two_pages_is_refused(folder: Path) -> None:
    """A file holding one meta page and part of the second is refused."""
    path = data_file(folder)
    with path.open("r+b") as data:
        data.truncate(PAGE + 100)
    problem = check_data_file(path)
    assert problem is not None
    assert str(path) in problem
    assert "two meta pages" in problem


# -- reads and writes that meet damage --------------------------------------------------------


@pytest.fixture
def store(folder: Path) -> Iterator[Store]:
    with opened(folder) as reopened:
        yield reopened


def test_an_undecodable_event_is_data_corrupted(store: Store) -> None:
    """Surface, DeriveMessages and fork over a damaged event raise DataCorrupted naming the
    session and seq (not its data); other sessions read on."""
    put_raw(store, b"events", schema.event_key(sid_of(store, "s0"), 7), b"\xff\xfe garbage")
    for read in (
        lambda: store.surface("s0"),
        lambda: store.surface("s0", messages=True),
        lambda: store.submit_fork("s0", 10, "child").result(),
    ):
        with pytest.raises(errors.DataCorrupted) as raised:
            read()
        assert "event 7 of session 's0'" in raised.value.message
        assert "admin verify" in raised.value.message
        assert "garbage" not in raised.value.message
    assert store.meta("child") is None
    assert store.surface("s1").count == 41


def test_an_event_under_the_wrong_key_is_data_corrupted(store: Store) -> None:
    """An event whose own seq differs from its key's is damage too."""
    sid = sid_of(store, "s0")
    with store.env.begin() as txn:
        other = txn.get(schema.event_key(sid, 5), db=store.tables.events)
    assert other is not None
    put_raw(store, b"events", schema.event_key(sid, 6), other)
    with pytest.raises(errors.DataCorrupted, match="event 6 of session 's0'"):
        store.surface("s0")


def test_a_damaged_session_record_fails_reads_and_writes(store: Store) -> None:
    """A session record that does not decode fails its reads, the listing, and appends to it,
    which write nothing (the change feed does not move)."""
    put_raw(store, b"sessions", b"s1", b"\x07 not a record")
    position = store.head()[0]
    for call in (
        lambda: store.meta("s1"),
        lambda: store.session("s1"),
        lambda: store.list_sessions(),
        lambda: store.append("s1", [user("more")]),
    ):
        with pytest.raises(errors.DataCorrupted, match="session 's1'"):
            call()
    assert store.head()[0] == position
    assert store.append("s0", [user("still fine")]).next_seq == 41


def test_damaged_lease_and_request_records_fail_their_callers(store: Store) -> None:
    """A lease or request-id record that does not decode fails the write that needs it."""
    put_raw(store, b"leases", b"s2", b"{not json")
    with pytest.raises(errors.DataCorrupted, match="lease of session 's2'"):
        store.append("s2", [user("x")])
    key = schema.request_key(sid_of(store, "s1"), "r-1")
    put_raw(store, b"requests", key, b"[1, 2]")
    with pytest.raises(errors.DataCorrupted, match="request record 'r-1'"):
        store.append("s1", [replace("summary", 0, 3)], request_id="r-1")


def test_a_damaged_change_record_fails_the_feed(store: Store) -> None:
    """A change-feed record that does not decode fails the feed read at its position; the
    records after it still read."""
    put_raw(store, b"changes", schema.u64(2), b"\xff" * 20)
    assert len(store.read_changes(3)) == 3
    with pytest.raises(errors.DataCorrupted, match="change-feed record 2"):
        store.read_changes(1)


def test_missing_events_are_data_corrupted(store: Store) -> None:
    """A session whose record counts more events than are stored fails its fold."""
    with store.env.begin(write=True) as txn:
        txn.delete(schema.event_key(sid_of(store, "s2"), 39), db=store.tables.events)
    with pytest.raises(errors.DataCorrupted, match="events 39 to 39 of session 's2'"):
        store.surface("s2")


def test_a_newest_first_page_over_missing_events_names_the_first_one(store: Store) -> None:
    """ListEvents newest first over a gap raises DataCorrupted naming the missing seq, at the
    session's oldest event too (where the walk leaves the session's keys); a page that stops
    before the gap reads as stored; a byte budget keeps the first event, then what fits."""
    s0, s2 = sid_of(store, "s0"), sid_of(store, "s2")
    with store.env.begin(write=True) as txn:
        txn.delete(schema.event_key(s2, 30), db=store.tables.events)
        txn.delete(schema.event_key(s0, 0), db=store.tables.events)
    with pytest.raises(errors.DataCorrupted, match="events 30 to 30 of session 's2'"):
        store.list_events("s2", None, 20, descending=True)
    with pytest.raises(errors.DataCorrupted, match="events 0 to 0 of session 's0'"):
        store.list_events("s0", None, 40, descending=True)
    assert len(store.list_events("s2", None, 9, descending=True).events) == 9
    whole = store.list_events("s1", None, 20, descending=True).events
    budgets = {1: 1, len(whole[0]) + len(whole[1]): 2, sum(map(len, whole)) - 1: 19}
    for budget, fits in budgets.items():
        assert (
            store.list_events("s1", None, 20, descending=True, max_bytes=budget).events
            == (whole[:fits])
        )
    assert len(store.list_events("s0", None, 39, descending=True).events) == 39


# -- verify -------------------------------------------------------------------------------------


def test_verify_finds_nothing_in_a_whole_store(store: Store) -> None:
    """A store written only by the server has no problems, and every record is counted."""
    problems, records = integrity.verify(store.env, store.tables)
    assert problems == []
    assert records["sessions"] == 3
    assert records["events"] == 121
    assert records["changes"] == 5
    assert records["leases"] == 1
    assert records["requests"] == 1


def test_verify_lists_each_kind_of_damage(store: Store) -> None:
    """Undecodable events, sessions, changes and leases, a seq gap, a wrong replace count and a
    broken ids map are each listed where they are."""
    sid0, sid1 = sid_of(store, "s0"), sid_of(store, "s1")
    put_raw(store, b"events", schema.event_key(sid0, 3), b"\xff\xff")
    with store.env.begin(write=True) as txn:
        txn.delete(schema.event_key(sid1, 40), db=store.tables.events)
    put_raw(store, b"sessions", b"s2", b"\x09junk")
    put_raw(store, b"changes", schema.u64(3), b"\xff\xff\xff")
    put_raw(store, b"leases", b"s2", b"[]")
    put_raw(store, b"ids", schema.u64(sid0), b"someone-else")
    found = problems_of(store)
    expected = [
        "events: session 's0' seq 3: the event does not decode",
        "sessions: 's2': the record does not decode",
        "changes: position 3: the record does not decode",
        "leases: 's2': the record does not decode",
        f"ids: sid {sid0}: does not map back to session 's0'",
        "sessions: 's1': next_seq is 41 but 40 events exist",
        "sessions: 's1': replace_generation is 1 but 0 replace events exist",
        f"changes: position 4: names events 40..40 of sid {sid1}, but 1 are missing",
    ]
    for line in expected:
        assert any(problem.startswith(line) for problem in found), (line, found)


def test_verify_runs_every_change_check(store: Store) -> None:
    """Extra change checks (where checksums plug in) see every record in position order with
    its events, and their findings are listed."""
    seen: list[tuple[int, int]] = []

    def check(position: int, record: bytes, events: Sequence[bytes]) -> str | None:
        seen.append((position, len(events)))
        return "checksum differs" if position == 2 else None

    problems, _ = integrity.verify(store.env, store.tables, change_checks=[check])
    assert seen == [(1, 40), (2, 40), (3, 40), (4, 1), (5, 0)]
    assert [str(p) for p in problems] == ["changes: position 2: checksum differs"]
