"""The web console in headless Chromium against a real server: the sessions page, a seeded
session's transcript beside its raw events (shadowed ones greyed, the replace's range shown), live
appends appearing as they commit, hovering a replace, fork labels, and the token prompt when auth
is on.

Needs Debian's chromium and chromium-driver (`make test` installs them with apt-get).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import running_server
from tests.e2e._web import CALL_ID, OVERLAP, RESULT, SESSION, event, seed, seed_overlap

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT_SECONDS = 10.0
TOKEN = "console-reader-token-8d2f61"
SEEDER = "console-seeder-token-51c7a9e0"

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
    rows = driver.find_elements(By.CSS_SELECTOR, "#raw tbody tr[data-seq]")
    return {
        int(r.get_attribute("data-seq") or -1): set((r.get_attribute("class") or "").split())
        for r in rows
    }


def rows_with(driver: WebDriver, name: str) -> set[int]:
    return {seq for seq, c in row_classes(driver).items() if name in c}


def rgb(css: str) -> tuple[float, float, float]:
    """An rgb()/rgba() colour as computed by the browser, channels 0..255."""
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    return r, g, b


def contrast(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """WCAG's contrast ratio of two colours (1 = none, 21 = black on white)."""

    def luminance(c: tuple[float, float, float]) -> float:
        lin = [
            x / 255 / 12.92 if x / 255 <= 0.03928 else ((x / 255 + 0.055) / 1.055) ** 2.4 for x in c
        ]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[RunningServer]:
    """A server with the web console on a free port and the demo sessions seeded."""
    with running_server(tmp_path / "data", http_listen="127.0.0.1:0") as server:
        stub = server.stub()
        seed(stub)
        seed_overlap(stub)
        yield server


def url(server: RunningServer, fragment: str = "#/") -> str:
    return f"http://127.0.0.1:{server.http_port}/{fragment}"


def test_sessions_page_lists_the_seeded_session(
    browser: WebDriver, console: RunningServer, tmp_path: Path
) -> None:
    """The front page shows the status cards and the session with its event count, linking to
    the session's page; a session with usage shows its tokens."""
    spent = event(event_pb2.EVENT_TYPE_STEP_END)
    spent.usage.CopyFrom(event_pb2.Usage(model="m", input_tokens=1200, output_tokens=80))
    console.stub().Append(pb.AppendRequest(session_id="spender", events=[spent]))
    browser.get(url(console))
    tokens = wait(
        browser,
        "the spender's row",
        lambda d: d.find_element(By.CSS_SELECTOR, '#sessions tr[data-session="spender"]'),
    )
    assert tokens.find_elements(By.TAG_NAME, "td")[-1].text == "1,200 in / 80 out"
    row = wait(
        browser,
        "the session row",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#sessions tr[data-session="{SESSION}"]'),
    )
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == SESSION
    assert cells[1] == "9"
    assert cells[6] == "\u2013"  # an en dash: no usage
    status = wait(browser, "status cards", lambda d: d.find_element(By.ID, "status").text)
    assert "SESSIONS" in status.upper()
    assert "MAP USAGE" in status.upper()
    assert browser.find_element(By.ID, "role").text == "primary"
    browser.save_screenshot(str(tmp_path / "sessions.png"))
    row.find_element(By.TAG_NAME, "a").click()
    wait(browser, "the session page", lambda d: d.find_element(By.CSS_SELECTOR, "#raw tbody tr"))
    assert browser.current_url.endswith(f"#/s/{SESSION}")


def test_session_page_shows_transcript_and_raw_events(
    browser: WebDriver, console: RunningServer, tmp_path: Path
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
    browser: WebDriver, console: RunningServer, tmp_path: Path
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


def test_shadowed_rows_are_greyed_not_struck_through(
    browser: WebDriver, console: RunningServer
) -> None:
    """A shadowed row's JSON is greyed (lighter than a live row's, still at least 4.5:1 against
    its background) with no line-through, and names the replace that hides it."""
    browser.get(url(console, f"#/s/{SESSION}"))
    wait(browser, "the shadowed rows", lambda d: rows_with(d, "shadowed") == {1, 2})
    hidden = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="1"] td.data pre')
    live = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="0"] td.data pre')
    assert "line-through" not in hidden.value_of_css_property("text-decoration-line")
    assert "Hello there!" in hidden.text
    cell = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="1"] td.data')
    ink, paper = (
        rgb(hidden.value_of_css_property("color")),
        rgb(cell.value_of_css_property("background-color")),
    )
    live_ink = rgb(live.value_of_css_property("color"))
    assert contrast(ink, paper) >= 4.5
    assert contrast(ink, paper) < contrast(live_ink, (255.0, 255.0, 255.0))
    badge = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="1"] .badge.shadow')
    assert badge.text == "hidden by seq 8"


def hover(driver: WebDriver, seq: int) -> None:
    cell = driver.find_element(By.CSS_SELECTOR, f'#raw tr[data-seq="{seq}"] td.num')
    ActionChains(driver).move_to_element(cell).perform()


def notes(driver: WebDriver) -> dict[int, str]:
    """The note rows shown under marked events: {seq of the event: text}."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#raw tr.range-note")
    return {int(r.get_attribute("data-note-for") or -1): r.text for r in rows}


def test_hovering_a_replace_marks_its_range_by_position(
    browser: WebDriver, console: RunningServer, tmp_path: Path
) -> None:
    """Hovering S (seq 3, replacing 0..2) marks 0..2 as hidden by it and X (seq 4, position 0)
    as in range but appended after S, so not hidden, with a note under X and a line saying so;
    hovering X marks a and S (position 0); leaving clears every mark."""
    browser.get(url(console, f"#/s/{OVERLAP}"))
    wait(browser, "five rows", lambda d: len(row_classes(d)) == 5)
    assert rows_with(browser, "shadowed") == {0, 1, 2, 3}
    badges = {
        seq: browser.find_element(By.CSS_SELECTOR, f'#raw tr[data-seq="{seq}"] .badge.shadow').text
        for seq in (0, 1, 3)
    }
    assert badges == {0: "hidden by seqs 3, 4", 1: "hidden by seq 3", 3: "hidden by seq 4"}

    hover(browser, 3)
    wait(browser, "S's range", lambda d: rows_with(d, "in-range") == {0, 1, 2})
    assert rows_with(browser, "range-after") == {4}
    assert rows_with(browser, "range-source") == {3}
    assert notes(browser) == {
        4: "↑ seq 4 stands at position 0: in range, but appended after this replace: not hidden"
    }
    assert browser.find_element(By.ID, "range-info").text == (
        "seq 3 replaces positions 0..2, hiding 0, 1, 2 · "
        "4 in range, but appended after it: not hidden"
    )
    assert "appended after it: not hidden" in browser.find_element(By.ID, "legend").text
    browser.save_screenshot(str(tmp_path / "hover.png"))

    hover(browser, 4)
    wait(browser, "X's range", lambda d: rows_with(d, "in-range") == {0, 3})
    assert rows_with(browser, "range-after") == set()
    assert notes(browser) == {}

    hover(browser, 1)  # not a replace: leaving X clears every mark
    wait(browser, "marks cleared", lambda d: rows_with(d, "in-range") == set())
    assert notes(browser) == {}
    assert browser.find_element(By.ID, "range-info").text.startswith("Hover a replace")


def test_fork_label_names_the_last_copied_seq(
    browser: WebDriver, console: RunningServer, tmp_path: Path
) -> None:
    """A fork made with at_seq 3 reads "at seq 3" in the sessions list and "forked from PARENT
    at seq 3" on its own page (it copied seqs 0..3, four events)."""
    console.stub().ForkSession(
        pb.ForkSessionRequest(parent_session_id=SESSION, session_id="demo.fork", at_seq=3),
        timeout=5,
    )
    browser.get(url(console))
    row = wait(
        browser,
        "the fork's row",
        lambda d: d.find_element(By.CSS_SELECTOR, '#sessions tr[data-session="demo.fork"]'),
    )
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "4"
    assert cells[4] == f"{SESSION} at seq 3"
    browser.save_screenshot(str(tmp_path / "fork.png"))
    browser.get(url(console, "#/s/demo.fork"))
    origin = wait(
        browser,
        "the fork line",
        lambda d: (t := d.find_element(By.ID, "origin").text) and t,
    )
    assert origin == f"forked from {SESSION} at seq 3"
    link = browser.find_element(By.CSS_SELECTOR, "#origin a")
    assert (link.get_attribute("href") or "").endswith(f"#/s/{SESSION}")


def test_session_page_shows_the_state_and_renders_a_hide(
    browser: WebDriver, console: RunningServer, tmp_path: Path
) -> None:
    """The session view shows GetState's state as JSON (updated live as deltas commit), marks
    the raw events that carry a delta, and renders a hide as "hides A..B" with its range greyed
    and nothing in its place in the transcript."""
    stub = console.stub()
    first = event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="one")
    first.state_delta.update({"user": "ann", "cart": {"apples": 1}})
    hide = event(event_pb2.EVENT_TYPE_HIDE)
    hide.surface_op.replace.start_seq = hide.surface_op.replace.stop_seq = 1
    events = [first, event(event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE, content="two"), hide]
    stub.Append(pb.AppendRequest(session_id="demo.state", events=events), timeout=5)
    browser.get(url(console, "#/s/demo.state"))
    shown = wait(browser, "the state", lambda d: (t := d.find_element(By.ID, "state").text) and t)
    assert json.loads(shown) == {"user": "ann", "cart": {"apples": 1}}
    hide_row = wait(
        browser, "the hide row", lambda d: d.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="2"]')
    )
    assert "hides 1..1" in hide_row.text
    assert rows_with(browser, "shadowed") == {1}
    delta_row = browser.find_element(By.CSS_SELECTOR, '#raw tr[data-seq="0"]')
    assert "state Δ" in delta_row.text
    messages = browser.find_elements(By.CSS_SELECTOR, "#transcript .message")
    assert [m.get_attribute("data-seq") for m in messages] == ["0"]
    wait(browser, "live", lambda d: d.find_element(By.ID, "live").text == "● live")
    later = event(event_pb2.EVENT_TYPE_TURN_START)
    later.state_delta.update({"user": None, "step": 2})
    stub.Append(pb.AppendRequest(session_id="demo.state", events=[later]), timeout=5)
    wait(
        browser,
        "the state after the live delta",
        lambda d: (
            json.loads(d.find_element(By.ID, "state").text or "{}")
            == {"cart": {"apples": 1}, "step": 2}
        ),
    )
    browser.save_screenshot(str(tmp_path / "state.png"))


def test_token_prompt_when_auth_is_on(browser: WebDriver, tmp_path: Path) -> None:
    """With auth on, the page asks for a token, then lists only the sessions that token's
    prefix allows."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[token]]\nname = "viewer"\ntoken = "{TOKEN}"\npermissions = ["read"]\n'
        'session_prefix = "demo."\n\n'
        f'[[token]]\nname = "seeder"\ntoken = "{SEEDER}"\npermissions = ["write"]\n'
    )
    with running_server(
        tmp_path / "data", http_listen="127.0.0.1:0", auth_tokens=str(tokens)
    ) as server:
        stub = server.stub()
        seed(stub, token=SEEDER)
        seed(stub, "other.session", token=SEEDER)
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
