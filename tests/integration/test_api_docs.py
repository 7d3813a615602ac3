"""docs/reference/api.md is what tools/api_docs.py makes of today's proto files and errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sessionlog import errors
from tools import api_docs


@pytest.fixture(scope="module")
def page() -> str:
    return api_docs.page()


def test_the_committed_page_is_fresh(page: str) -> None:
    """The page in the repository equals the one generated now (else: make gen)."""
    assert api_docs.PAGE.read_text() == page


def test_every_rpc_message_enum_and_reason_is_on_the_page(page: str) -> None:
    """Every RPC of every service, every message and enum of the package (nested ones too),
    and every error reason appear under their own heading or row."""
    headings = {line.lstrip("#").strip() for line in page.splitlines() if line[:1] == "#"}
    expected: set[str] = set()
    described = [f for f in api_docs.descriptor_set().file if f.package == api_docs.PACKAGE]
    assert len(described) == len(list(api_docs.PROTO.rglob("*.proto")))
    for proto in described:
        for service in proto.service:
            expected.update(f"{service.name}.{method.name}" for method in service.method)
        expected.update(enum.name for enum in proto.enum_type)
        for message in proto.message_type:
            expected.add(message.name)
            expected.update(
                f"{message.name}.{nested.name}"
                for nested in message.nested_type
                if not nested.options.map_entry
            )
    assert {"SessionLogService.Append", "Event", "SurfaceOp.Replace", "EventType"} <= expected
    assert expected - headings == set()
    for reason in errors.BY_REASON:
        if reason != errors.SessionLogError.reason:
            assert f"| `{reason}` |" in page


def test_every_reason_is_explained(page: str) -> None:
    """No error reason's row has an empty meaning: each error class has a docstring."""
    assert [row.reason for row in api_docs.error_rows() if not row.meaning.strip()] == []
    rows = {row.reason: row for row in api_docs.error_rows()}
    assert rows["SEQ_CONFLICT"].code == "ABORTED"
    assert rows["WRONG_GROUP"].code == "FAILED_PRECONDITION"
    assert rows["SLOT_MOVING"].name == "SlotMoving"


def test_every_link_on_the_page_has_its_heading(page: str) -> None:
    """Each in-page link names an anchor MkDocs gives one of the page's headings, and no two
    headings share an anchor (MkDocs would number the second, and links would miss it)."""
    anchors = {
        api_docs.slug(line.lstrip("#").strip()) for line in page.splitlines() if line[:1] == "#"
    }
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert len(links) > 100
    assert links - anchors == set()
    headings = [line for line in page.splitlines() if line[:1] == "#"]
    assert len(anchors) == len(headings), "two headings share an anchor: a link would go astray"


def test_check_fails_on_a_stale_page(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` (make gen-check) exits 1 naming the page when it differs, 0 when it is
    fresh; writing makes it fresh."""
    stale = tmp_path / "docs" / "reference" / "api.md"
    stale.parent.mkdir(parents=True)
    stale.write_text(page.replace("Append adds events", "Append adds things"))
    monkeypatch.setattr(api_docs, "ROOT", tmp_path)
    monkeypatch.setattr(api_docs, "PAGE", stale)
    assert api_docs.main(["--check"]) == 1
    assert "stale: docs/reference/api.md" in capsys.readouterr().err
    assert api_docs.main([]) == 0
    assert api_docs.main(["--check"]) == 0
    assert stale.read_text() == page
