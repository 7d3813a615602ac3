"""The web console in headless Chromium against a real server: the sessions page, a seeded
session's transcript beside its raw events (shadowed ones greyed, the replace's range shown), live
appends appearing as they commit, and the token prompt when auth is on.

Needs Debian's chromium and chromium-driver (`make test` installs them with apt-get).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from sessionlog.testing import ThreadedServer, running_server
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._web import CALL_ID, RESULT, SESSION, event, seed

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT_SECONDS = 10.0
TOKEN = "console-reader-token-8d2f61"

T = TypeVar("T")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module, with a fresh profile."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            pytest.fail(
                f"{path} is missing: run `make test` (it installs chromium and chromium-driver) "
                "or apt-get install -y chromium chromium-driver"
            )
    profile = tempfile.mkdtemp(prefix="sessionlog-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: WebDriver, what: str, check: Callable[[WebDriver], T]) -> T:
    """Poll ``check`` until it returns something truthy (stale elements count as not yet)."""

    def attempt(d: WebDriver) -> T | bool:
        try:
            return check(d)
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.05).until(attempt)  # type: ignore[return-value]
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}") from None


def row_classes(driver: WebDriver) -> dict[int, set[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#raw tbody tr")
    return {
        int(r.get_attribute("data-seq") or -1): set((r.get_attribute("class") or "").split())
        for r in rows
    }


@pytest.fixture
def console(tmp_path: Path) -> Iterator[ThreadedServer]:
    """A server with the web console on a free port and the demo session seeded."""
    with running_server(tmp_path / "data", http_listen="127.0.0.1:0") as server:
        seed(server.store)
        yield server


def url(server: ThreadedServer, fragment: str = "#/") -> str:
    return f"http://127.0.0.1:{server.server.http_port}/{fragment}"


def test_sessions_page_lists_the_seeded_session(
    browser: WebDriver, console: ThreadedServer, tmp_path: Path
) -> None:
    """The front page shows the status cards and the session with its event count, linking to
    the session's page."""
    browser.get(url(console))
    row = wait(
        browser,
        "the session row",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#sessions tr[data-session="{SESSION}"]'),
    )
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == SESSION
    assert cells[1] == "9"
    status = wait(browser, "status cards", lambda d: d.find_element(By.ID, "status").text)
    assert "SESSIONS" in status.upper()
    assert "MAP USAGE" in status.upper()
    assert browser.find_element(By.ID, "role").text == "primary"
    browser.save_screenshot(str(tmp_path / "sessions.png"))
    row.find_element(By.TAG_NAME, "a").click()
    wait(browser, "the session page", lambda d: d.find_element(By.CSS_SELECTOR, "#raw tbody tr"))
    assert browser.current_url.endswith(f"#/s/{SESSION}")


def test_session_page_shows_transcript_and_raw_events(
    browser: WebDriver, console: ThreadedServer, tmp_path: Path
) -> None:
    """Raw events: all nine, 1 and 2 greyed as shadowed, 5 as bookkeeping, 8 showing its range
    1..2. Transcript: the roles in surface order, the summary in place of 1..2, and the tool
    call with its result paired under it."""
    browser.get(url(console, f"#/s/{SESSION}"))
    classes = wait(browser, "nine raw rows", lambda d: len(r := row_classes(d)) == 9 and r)
    assert isinstance(classes, dict)
    assert {seq for seq, c in classes.items() if "shadowed" in c} == {1, 2}
    assert {seq for seq, c in classes.items() if "bookkeeping" in c} == {5}
    replace_row = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="8"]')
    assert "replaces 1..2" in replace_row.text
    grey = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="1"] td')
    plain = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="0"] td')
    assert grey.value_of_css_property("background-color") != plain.value_of_css_property(
        "background-color"
    )

    messages = wait(
        browser,
        "the transcript",
        lambda d: d.find_elements(By.CSS_SELECTOR, "#transcript .message") or None,
    )
    assert messages is not None
    seqs = [m.get_attribute("data-seq") for m in messages]
    roles = [
        next(c for c in (m.get_attribute("class") or "").split() if c.startswith("role-"))
        for m in messages
    ]
    assert seqs == ["0", "8", "3", "4", "7"]
    assert roles == ["role-system", "role-system", "role-user", "role-assistant", "role-assistant"]
    assert "replaces 1..2" in messages[1].text
    call = browser.find_element(
        By.CSS_SELECTOR, f'#transcript .tool-call[data-call-id="{CALL_ID}"]'
    )
    assert "get_weather" in call.text
    result = call.find_element(By.CSS_SELECTOR, ".tool-result")
    assert RESULT in result.text
    assert result.get_attribute("data-seq") == "6"
    browser.save_screenshot(str(tmp_path / "session.png"))
    assert (tmp_path / "session.png").stat().st_size > 10_000


def test_live_appends_appear_and_shadow(
    browser: WebDriver, console: ThreadedServer, tmp_path: Path
) -> None:
    """With the page open, an append shows up in the raw events and the transcript without a
    reload, and a live replace greys the rows it hides."""
    browser.get(url(console, f"#/s/{SESSION}"))
    wait(browser, "live", lambda d: d.find_element(By.ID, "live").text == "● live")
    stub = console.stub()
    stub.Append(
        pb.AppendRequest(
            session_id=SESSION,
            events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="and tomorrow?")],
        ),
        timeout=5,
    )
    wait(browser, "row 9", lambda d: d.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="9"]'))
    wait(
        browser,
        "the live message in the transcript",
        lambda d: "and tomorrow?" in d.find_element(By.ID, "transcript").text,
    )
    summary = event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, content="[summary] weather talk")
    summary.surface_op.replace.start_seq = 3
    summary.surface_op.replace.stop_seq = 7
    stub.Append(pb.AppendRequest(session_id=SESSION, events=[summary]), timeout=5)
    shadowed = wait(
        browser,
        "rows 3..7 greyed",
        lambda d: (
            (s := {q for q, c in row_classes(d).items() if "shadowed" in c}) >= {3, 4, 6, 7} and s
        ),
    )
    assert shadowed == {1, 2, 3, 4, 6, 7}
    browser.save_screenshot(str(tmp_path / "live.png"))
    assert browser.find_element(By.ID, "counts").text == "11 events"


def test_token_prompt_when_auth_is_on(browser: WebDriver, tmp_path: Path) -> None:
    """With auth on, the page asks for a token, then lists only the sessions that token's
    prefix allows."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[token]]\nname = "viewer"\ntoken = "{TOKEN}"\npermissions = ["read"]\n'
        'session_prefix = "demo."\n'
    )
    with running_server(
        tmp_path / "data", http_listen="127.0.0.1:0", auth_tokens=str(tokens)
    ) as server:
        seed(server.store)
        seed(server.store, "other.session")
        browser.get(url(server))
        browser.execute_script("sessionStorage.clear()")
        browser.refresh()
        field = wait(
            browser,
            "the token prompt",
            lambda d: (f := d.find_element(By.ID, "token-input")).is_displayed() and f,
        )
        assert not isinstance(field, bool)
        field.send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
        wait(
            browser,
            "the session row",
            lambda d: d.find_element(By.CSS_SELECTOR, f'#sessions tr[data-session="{SESSION}"]'),
        )
        listed = [
            r.get_attribute("data-session")
            for r in browser.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
        ]
        assert listed == [SESSION]
        browser.execute_script("sessionStorage.clear()")
