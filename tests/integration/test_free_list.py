"""``integrity.check_free_list`` on real LMDB files: a free list of several levels and one with
an overflow page hold together (no problem named), and damage to its branch page or to a
leaf's list of pages is named, where LMDB itself then refuses a write (what stops a server's
start while every read passes)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import lmdb
import pytest

from sessionlog.storage import integrity

PAGE = 4096


def _free_db(path: Path) -> tuple[int, int, int]:
    """(depth, overflow pages, root) of the newest meta's free list."""
    content = path.read_bytes()
    metas = [(struct.unpack_from("<Q", content, at + 144)[0], at) for at in (0, PAGE)]
    _, at = max(metas)
    _, depth, _, _, overflow, _, root = struct.unpack_from("<HHQQQQQ", content, at + 44)
    return depth, overflow, root


def _store(folder: Path, *, rewrites: int, bulk: int) -> Path:
    """A file whose free list grew while a reader pinned an old snapshot: ``rewrites`` small
    transactions (one free-list entry each) and one that frees ``bulk`` keys' pages at once."""
    env = lmdb.open(str(folder), map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            for i in range(3000):
                txn.put(b"k%05d" % i, b"v" * 400)
        pinned = env.begin()
        for n in range(rewrites):
            with env.begin(write=True) as txn:
                txn.put(b"k%05d" % (n * 7 % 3000), b"w" * 400)
        with env.begin(write=True) as txn:
            for i in range(bulk):
                txn.delete(b"k%05d" % i)
        pinned.abort()
        with env.begin(write=True) as txn:
            txn.put(b"last", b"x")
    finally:
        env.close()
    return folder / "data.mdb"


def _lmdb_writes(folder: Path) -> bool:
    """Whether LMDB commits a write that needs pages (it reads the free list for them)."""
    env = lmdb.open(str(folder), map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            for i in range(200):
                txn.put(b"n%05d" % i, b"z" * 400)
    except lmdb.Error:
        return False
    finally:
        env.close()
    return True


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(tmp_path_factory.mktemp("deep"), rewrites=1500, bulk=0)


@pytest.fixture(scope="module")
def bulky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(tmp_path_factory.mktemp("bulky"), rewrites=10, bulk=2500)


def _copy(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "data.mdb").write_bytes(path.read_bytes())
    return copy / "data.mdb"


def test_a_healthy_free_list_of_several_levels_names_nothing(deep: Path) -> None:
    """A free list two levels deep (a branch page over leaves) holds together."""
    depth, _, _ = _free_db(deep)
    assert depth >= 2
    assert integrity.check_free_list(deep) == []


def test_a_healthy_free_list_with_an_overflow_page_names_nothing(bulky: Path) -> None:
    """A transaction that freed more pages than a leaf holds keeps its list on overflow pages."""
    _, overflow, _ = _free_db(bulky)
    assert overflow >= 1
    assert integrity.check_free_list(bulky) == []


def test_a_damaged_branch_page_is_named(deep: Path, tmp_path: Path) -> None:
    """Random bytes over the free list's root (a branch page): named, and LMDB refuses a write."""
    path = _copy(deep, tmp_path)
    _, _, root = _free_db(path)
    content = bytearray(path.read_bytes())
    content[root * PAGE : (root + 1) * PAGE] = random.Random(3).randbytes(PAGE)
    path.write_bytes(bytes(content))
    assert integrity.check_free_list(path) == [
        f"free list page {root} is not a branch page of the free list (damaged)"
    ]
    assert not _lmdb_writes(path.parent)


def test_a_page_number_past_the_file_in_a_list_is_named(bulky: Path, tmp_path: Path) -> None:
    """A leaf's list naming a page past the file's last page is named."""
    path = _copy(bulky, tmp_path)
    _, _, root = _free_db(path)
    content = bytearray(path.read_bytes())
    base = root * PAGE
    lower = struct.unpack_from("<H", content, base + 12)[0]
    assert lower > 16, "the root should be a leaf holding entries"
    node = struct.unpack_from("<H", content, base + 16)[0]
    _, _, flags, ksize = struct.unpack_from("<HHHH", content, base + node)
    assert not flags & 1, "the first entry should be held in place"
    data = base + node + 8 + ksize
    struct.pack_into("<Q", content, data + 8, 10**9)  # its first free page
    path.write_bytes(bytes(content))
    problems = integrity.check_free_list(path)
    assert len(problems) == 1
    assert "names page 1000000000, outside pages 2 to" in problems[0]
