"""The console's session list over session records: /api/sessions with filter and newest-first
order, and the page showing titles and labels, following updates without a reload."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import append, check, failure, say
from tests.e2e._proc import running_server
from tests.e2e._web import get
from tests.e2e.test_web_console import browser, url, wait  # noqa: F401  (one Chromium here too)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("web-records") / "data"
    with running_server(data, http_listen="127.0.0.1:0") as server:
        stub = server.stub()
        stub.CreateSession(
            pb.CreateSessionRequest(
                session_id="w.first", title="Plan a trip", labels={"team": "travel"}
            )
        )
        stub.CreateSession(pb.CreateSessionRequest(session_id="w.second", labels={"team": "ops"}))
        append(stub, "w.first", say("go"))
        stub.CreateSession(
            pb.CreateSessionRequest(session_id="w.kid", parent_session_id="w.first", parent_seq=0)
        )
        yield server


def sessions(server: RunningServer, **query: str) -> tuple[int, dict[str, Any]]:
    address = f"http://127.0.0.1:{server.http_port}/api/sessions"
    status, _, body = get(f"{address}?{urllib.parse.urlencode(query)}")
    return status, body


def test_api_filters_orders_and_refuses_bad_filters(console: RunningServer) -> None:
    """filter and order=update_time as ListSessions has them; records in every row; a filter,
    order or limit with a stray character is refused."""
    status, body = sessions(console, prefix="w.", filter='labels.team = "travel"')
    assert status == 200
    rows = body["sessions"]
    assert isinstance(rows, list)
    assert [(r["session_id"], r["title"], r["labels"]) for r in rows] == [
        ("w.first", "Plan a trip", {"team": "travel"})
    ]
    assert rows[0]["update_time_ms"] >= rows[0]["last_append_time_ms"] > 0
    _, newest = sessions(console, prefix="w.", order="update_time")
    assert [r["session_id"] for r in newest["sessions"]] == ["w.kid", "w.first", "w.second"]
    _, kids = sessions(console, filter='parent = "w.first"')
    assert [(r["session_id"], r["parent_seq"]) for r in kids["sessions"]] == [("w.kid", 0)]
    status, refused = sessions(console, filter="nonsense")
    assert status == 400
    assert refused["reason"] == "INVALID_FILTER"
    status, refused = sessions(console, filter="owner ==ann")
    assert (status, refused["reason"], refused["metadata"]) == (
        400,
        "INVALID_FILTER",
        {"position": "8"},
    )
    status, refused = sessions(console, order="newest")  # not read as id order
    assert (status, refused["reason"]) == (400, "INVALID_ORDER_BY")
    for limit in ("1_0", " 10", "\uff11\uff10", "1" * 5000):  # fullwidth; over int()'s limit
        status, refused = sessions(console, limit=limit)
        assert (status, refused["reason"]) == (400, "MALFORMED_REQUEST")


def test_order_is_read_as_list_sessions_reads_order_by(console: RunningServer) -> None:
    """order goes through ListSessions' parser: what it accepts lists the same, what it refuses
    gets the same reason and metadata; "update_time" alone stays newest first."""
    ids = ["w.first", "w.kid", "w.second"]
    for order, expected in [
        ("", ids),
        ("session_id", ids),
        ("session_id asc", ids),
        ("update_time", ["w.kid", "w.first", "w.second"]),
        ("update_time desc", ["w.kid", "w.first", "w.second"]),
        ("UPDATE_TIME  DESC", ["w.kid", "w.first", "w.second"]),
    ]:
        status, body = sessions(console, prefix="w.", order=order)
        assert status == 200, (order, body)
        assert [r["session_id"] for r in body["sessions"]] == expected, order
        if order != "update_time":  # the console's own word; ListSessions reads it as ascending
            listed = console.stub().ListSessions(pb.ListSessionsRequest(order_by=order))
            assert [s.session_id for s in listed.sessions if s.session_id in ids] == expected
    for order in ("update_time asc", "session_id desc", "newest", "update_time desc, x"):
        status, refused = sessions(console, order=order)
        error = failure(console.stub().ListSessions, pb.ListSessionsRequest(order_by=order))
        check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ORDER_BY")
        assert (status, refused["reason"]) == (400, "INVALID_ORDER_BY"), order
        assert refused["metadata"] == dict(error_info(error).metadata), order
        assert refused["message"] == error.details(), order


def test_page_shows_records_and_follows_updates(
    browser: WebDriver,  # noqa: F811
    console: RunningServer,
    tmp_path: Path,
) -> None:
    """Title and labels in the list; an UpdateSession shows without a reload; newest first
    puts the updated session on top."""
    browser.get(url(console))
    row = wait(
        browser,
        "the titled row",
        lambda d: d.find_element(By.CSS_SELECTOR, '#sessions tr[data-session="w.first"]'),
    )
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[6:8] == ["Plan a trip", "team=travel"]
    kid = browser.find_element(By.CSS_SELECTOR, '#sessions tr[data-session="w.kid"]')
    assert kid.find_elements(By.TAG_NAME, "td")[4].text == "w.first spawned at seq 0"
    console.stub().UpdateSession(
        pb.UpdateSessionRequest(
            session=pb.Session(session_id="w.second", status="done", labels={"env": "prod"}),
            update_mask=FieldMask(paths=["status", "labels.env"]),
        )
    )

    def updated(d: WebDriver) -> bool:
        cells = d.find_elements(By.CSS_SELECTOR, '#sessions tr[data-session="w.second"] td')
        texts = [c.text for c in cells]
        return len(texts) == 10 and "env=prod" in texts[7] and texts[8] == "done"

    wait(browser, "the update to show", updated)
    Select(browser.find_element(By.ID, "order")).select_by_value("update_time")

    def first_row(d: WebDriver) -> str:
        rows = d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
        return (rows[0].get_attribute("data-session") or "") if rows else ""

    wait(browser, "newest first", lambda d: first_row(d) == "w.second")
    browser.save_screenshot(str(tmp_path / "records.png"))
    assert (tmp_path / "records.png").stat().st_size > 10_000
