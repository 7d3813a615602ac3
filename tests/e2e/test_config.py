"""`sessionlog serve` configuration and logs, through the real command.

Settings come from a flag, then a SESSIONLOG_* variable, then the TOML file, then the default;
`--print-config` shows each value with its source and exits. A bad value stops the command with
exit 2 and one line naming the setting and where it came from. Logs go to stderr: JSON lines
when asked (or when stderr is not a terminal), readable text when asked, no line per request.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import READY_SECONDS, SESSIONLOG, clean_env, free_port, health_status, run_cli

SECRET = "replica-token-7d0c5e1a9b3f"
STOP_SECONDS = 15.0


Case = tuple[list[str], dict[str, str]]
"""Flags and environment variables of one `serve --print-config` run."""


def run_print_config(tmp_path: Path, cases: list[Case]) -> list[subprocess.CompletedProcess[str]]:
    """Run `serve --print-config` once per case, a few at a time (each start costs ~0.5 s)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = [
            pool.submit(
                run_cli,
                ["serve", "--print-config", *flags],
                tmp_path,
                clean_env(workers=False, **env),
            )
            for flags, env in cases
        ]
        return [run.result() for run in runs]


def parse_printed(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """Each setting's (value, source) as --print-config printed them; the run must succeed."""
    assert result.returncode == 0, result.stderr
    settings: dict[str, tuple[str, str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        assignment, _, source = line.partition("  # ")
        name, _, value = assignment.partition(" = ")
        settings[name] = (value, source)
    return settings


def print_config(
    tmp_path: Path, *flags: str, **env: str
) -> tuple[dict[str, tuple[str, str]], subprocess.CompletedProcess[str]]:
    """Run `serve --print-config FLAGS` with ``env``; each setting's (value, source) as printed."""
    [result] = run_print_config(tmp_path, [(list(flags), env)])
    return parse_printed(result), result


def refusal_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a run that must have exited 2 without printing a configuration."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def refused(tmp_path: Path, *flags: str, **env: str) -> str:
    """Run `serve --print-config FLAGS` expecting exit 2 with one line on stderr; that line."""
    [result] = run_print_config(tmp_path, [(list(flags), env)])
    return refusal_line(result)


# -- precedence ---------------------------------------------------------------------------------


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    """Four settings each decided at a different level show that level's value and source."""
    file = tmp_path / "sessionlog.toml"
    file.write_text(
        'max_streams = 11\nmax_streams_per_connection = 6\nmax_event_size = "2MiB"\n'
        'durability = "nosync"\n'
    )
    settings, _ = print_config(
        tmp_path,
        "--config",
        str(file),
        "--max-streams",
        "13",
        SESSIONLOG_MAX_STREAMS="12",
        SESSIONLOG_MAX_STREAMS_PER_CONNECTION="7",
    )
    assert settings["max_streams"] == ("13", "flag --max-streams")
    assert settings["max_streams_per_connection"] == (
        "7",
        "env SESSIONLOG_MAX_STREAMS_PER_CONNECTION",
    )
    assert settings["max_event_size"] == (str(2 << 20), f"file {file}")
    assert settings["durability"] == ('"nosync"', f"file {file}")
    assert settings["max_data_depth"] == ("24", "default")
    assert settings["listen"] == ('"127.0.0.1:50051"', "default")


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    """SESSIONLOG_CONFIG names the file when --config is absent; --config wins when both are set."""
    from_env, from_flag = tmp_path / "env.toml", tmp_path / "flag.toml"
    from_env.write_text("max_data_depth = 9\n")
    from_flag.write_text("max_data_depth = 8\n")
    settings, _ = print_config(tmp_path, SESSIONLOG_CONFIG=str(from_env))
    assert settings["max_data_depth"] == ("9", f"file {from_env}")
    settings, _ = print_config(
        tmp_path, "--config", str(from_flag), SESSIONLOG_CONFIG=str(from_env)
    )
    assert settings["max_data_depth"] == ("8", f"file {from_flag}")


def test_print_config_lists_every_setting_and_reloads_as_a_config_file(tmp_path: Path) -> None:
    """The printed configuration is a TOML file that, given back with --config, yields the same
    values (every one now from the file)."""
    first, result = print_config(
        tmp_path, "--map-size", "1GiB", "--heartbeat", "2.5", "--auth-open-health"
    )
    assert first["map_size"] == (str(1 << 30), "flag --map-size")
    assert first["auth_open_health"] == ("true", "flag --auth-open-health")
    saved = tmp_path / "printed.toml"
    saved.write_text(result.stdout)
    again, _ = print_config(tmp_path, "--config", str(saved))
    assert {name: value for name, (value, _) in again.items()} == {
        name: value for name, (value, _) in first.items()
    }
    assert {source for _, source in again.values()} == {f"file {saved}"}


def test_switches_and_booleans_from_env_and_file(tmp_path: Path) -> None:
    """A boolean reads yes/on/1 from the environment and true/false from the file."""
    settings, _ = print_config(tmp_path, SESSIONLOG_AUTH_OPEN_HEALTH="yes")
    assert settings["auth_open_health"] == ("true", "env SESSIONLOG_AUTH_OPEN_HEALTH")
    file = tmp_path / "c.toml"
    file.write_text("auth_open_health = false\n")
    settings, _ = print_config(tmp_path, "--config", str(file))
    assert settings["auth_open_health"] == ("false", f"file {file}")


# -- refusals -----------------------------------------------------------------------------------


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    """A typo in the TOML file stops the command with exit 2, naming the key and the file."""
    file = tmp_path / "typo.toml"
    file.write_text('listen = "127.0.0.1:1"\nmax_stream = 4\n')
    line = refused(tmp_path, "--config", str(file))
    assert "max_stream" in line
    assert str(file) in line


BAD_VALUES: list[tuple[str, list[str], dict[str, str], str, str, str]] = [
    # (case, flags, env, file text, setting, source named in the message)
    ("flag", ["--max-streams", "0"], {}, "", "max_streams", "flag --max-streams"),
    ("env", [], {"SESSIONLOG_MAP_SIZE": "lots"}, "", "map_size", "env SESSIONLOG_MAP_SIZE"),
    ("file", [], {}, 'heartbeat = "soon"\n', "heartbeat", "file"),
    ("choice", ["--durability", "fast"], {}, "", "durability", "flag --durability"),
    ("bool", [], {"SESSIONLOG_AUTH_OPEN_HEALTH": "maybe"}, "", "auth_open_health", "env"),
    ("fraction", [], {}, "max_data_depth = 2.5\n", "max_data_depth", "file"),
    ("file-type", [], {}, "listen = 50051\n", "listen", "file"),
    ("zero-heartbeat", ["--heartbeat", "0"], {}, "", "heartbeat", "flag"),
    ("infinite", ["--request-id-ttl", "inf"], {}, "", "request_id_ttl", "flag"),
    ("over-grpc", ["--max-message-size", "4GiB"], {}, "", "max_message_size", "flag"),
]


def test_a_bad_value_names_the_setting_and_its_source(tmp_path: Path) -> None:
    """A bad value from a flag, the environment or the file: exit 2 and one line naming the
    setting and where it came from (fractions, zero heartbeat, infinity and over-2GiB messages
    included)."""
    cases: list[Case] = []
    for name, flags, env, file_text, _, _ in BAD_VALUES:
        if file_text:
            file = tmp_path / f"{name}.toml"
            file.write_text(file_text)
            flags = [*flags, "--config", str(file)]
        cases.append((flags, env))
    results = run_print_config(tmp_path, cases)
    for (name, _, _, _, setting, source), result in zip(BAD_VALUES, results, strict=True):
        line = refusal_line(result)
        assert line.startswith(f"sessionlog: {setting} from {source}"), (name, line)


ABSURD_VALUES: list[tuple[str, str, str]] = [
    # (flag, value, the range its refusal names)
    ("--replica-timeout", "1e9", "from 0.3s to 1h"),
    ("--replica-timeout", "inf", "from 0.3s to 1h"),
    ("--heartbeat", "nan", "from 0.1s to 1h"),
    ("--heartbeat", "2h", "from 0.1s to 1h"),
    ("--shutdown-grace", "-1", "from 0s to 1h"),
    ("--sync-timeout", "-inf", "from 0.01s to 1h"),
    ("--request-id-ttl", "1e9", "from 0s to 30d"),
    ("--retention-idle", "1e9", "from 1s to 36500d or 0 (off)"),
    ("--retention-sweep-interval", "0", "from 0.1s to 7d"),
    ("--map-size", "999999TiB", "from 1MiB to 128TiB"),
    ("--max-event-size", "10", "from 1KiB to 1GiB"),
    ("--max-message-size", "1KiB", "from 64KiB to 2GiB less one byte"),
    ("--max-streams", "1e9", "from 1 to 1,000,000"),
    ("--max-events-per-append", "99999999999999", "from 1 to 1,000,000"),
    ("--max-data-depth", "1000", "from 1 to 100"),
]


def test_absurd_durations_and_sizes_are_refused_naming_the_range(tmp_path: Path) -> None:
    """A duration, size or count flag out of its range (1e9 seconds, inf, nan, a negative,
    999999TiB, a billion streams): exit 2 and one line naming the flag, the range and the
    value."""
    cases: list[Case] = [([f"{flag}={value}"], {}) for flag, value, _ in ABSURD_VALUES]
    results = run_print_config(tmp_path, cases)
    for (flag, value, span), result in zip(ABSURD_VALUES, results, strict=True):
        line = refusal_line(result)
        assert f"from flag {flag}: must be a " in line, line
        assert f"{span}, not {value!r}" in line, line


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    """The ends of each range are values the settings take (in seconds or with a unit)."""
    settings, result = print_config(
        tmp_path,
        *("--replica-timeout", "1h", "--heartbeat", "0.1", "--shutdown-grace", "0"),
        *("--request-id-ttl", "30d", "--retention-idle", "forever", "--map-size", "1MiB"),
        SESSIONLOG_RETENTION_SWEEP_INTERVAL="7d",
    )
    assert result.returncode == 0, result.stderr
    assert settings["replica_timeout"][0] == "3600.0"
    assert settings["heartbeat"][0] == "0.1"
    assert settings["request_id_ttl"][0] == "2592000.0"
    assert settings["retention_idle"][0] == "0.0"
    assert settings["retention_sweep_interval"] == (
        "604800.0",
        "env SESSIONLOG_RETENTION_SWEEP_INTERVAL",
    )
    assert settings["map_size"][0] == str(1 << 20)


def test_a_server_is_not_started_with_an_absurd_replica_timeout(tmp_path: Path) -> None:
    """`sessionlog serve --replica-timeout 1e9` (the defect) exits 2 at once, naming the flag
    and its range, and creates no data folder."""
    data = tmp_path / "never"
    args = ["serve", "--data", str(data), "--listen", f"127.0.0.1:{free_port()}"]
    result = run_cli([*args, "--replica-timeout", "1e9"], tmp_path)
    line = refusal_line(result)
    assert "--replica-timeout" in line
    assert "from 0.3s to 1h" in line
    assert not data.exists()


def test_an_unreadable_or_invalid_file_is_refused(tmp_path: Path) -> None:
    """A missing config file, or one that is not TOML, stops the command with one line."""
    missing = tmp_path / "missing.toml"
    assert str(missing) in refused(tmp_path, "--config", str(missing))
    broken = tmp_path / "broken.toml"
    broken.write_text("listen = \n")
    assert "not valid TOML" in refused(tmp_path, "--config", str(broken))


def test_contradicting_settings_are_refused(tmp_path: Path) -> None:
    """Settings that are fine alone but not together (a message limit below the event limit, a
    TLS key without its certificate) stop the command with one line saying what to change."""
    line = refused(tmp_path, "--max-message-size", "64KiB", "--max-event-size", "1MiB")
    assert "max message size" in line
    line = refused(tmp_path, "--tls-key", str(tmp_path / "key.pem"))
    assert "--tls-cert" in line


def test_ack_flags_are_checked(tmp_path: Path) -> None:
    """--ack takes local or replica; --sync-replicas (a whole number from 1) needs --ack replica;
    --sync-timeout must be above 0; --ack replica refuses several workers and makes auto one."""
    cases: list[Case] = [
        (["--ack", "sometimes"], {}),
        (["--ack", "replica", "--sync-replicas", "0"], {}),
        (["--ack", "replica", "--sync-timeout", "0"], {}),
        (["--sync-replicas", "2"], {}),
        (["--ack", "replica", "--workers", "2"], {}),
        (["--ack", "replica", "--sync-replicas", "2", "--sync-timeout", "0.5"], {}),
    ]
    bad_ack, zero_k, zero_timeout, k_alone, workers, good = run_print_config(tmp_path, cases)
    assert refusal_line(bad_ack).startswith("sessionlog: ack from flag --ack")
    assert "local, replica" in refusal_line(bad_ack)
    assert refusal_line(zero_k).startswith("sessionlog: sync_replicas from flag")
    assert refusal_line(zero_timeout).startswith("sessionlog: sync_timeout from flag")
    assert "--sync-replicas 2 needs --ack replica" in refusal_line(k_alone)
    assert "--ack replica runs in one process" in refusal_line(workers)
    settings = parse_printed(good)
    assert settings["ack"][0] == '"replica"'
    assert settings["sync_replicas"][0] == "2"
    assert settings["sync_timeout"][0] == "0.5"


# -- secrets ------------------------------------------------------------------------------------


def test_secrets_are_masked_from_every_source(tmp_path: Path) -> None:
    """The replica token shows as *** whether it came from a flag, the environment or the file,
    and the secret itself is printed nowhere."""
    file = tmp_path / "c.toml"
    file.write_text(f'replica_token = "{SECRET}"\n')
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--replica-token", SECRET], {}, "flag --replica-token"),
        ([], {"SESSIONLOG_REPLICA_TOKEN": SECRET}, "env SESSIONLOG_REPLICA_TOKEN"),
        (["--config", str(file)], {}, f"file {file}"),
    ]
    results = run_print_config(tmp_path, [(flags, env) for flags, env, _ in cases] + [([], {})])
    for (_, _, source), result in zip(cases, results, strict=False):
        assert parse_printed(result)["replica_token"] == ('"***"', source)
        assert SECRET not in result.stdout + result.stderr
    unset = parse_printed(results[-1])
    assert unset["replica_token"] == ('""', "default"), "an unset secret is shown as unset"


# -- logs -----------------------------------------------------------------------------------------


class Served:
    """A running `sessionlog serve` whose stdout and stderr go to separate files."""

    def __init__(self, process: subprocess.Popen[bytes], address: str, folder: Path) -> None:
        self.process = process
        self.address = address
        self.folder = folder

    @property
    def stderr(self) -> str:
        return (self.folder / "stderr.log").read_text()

    @property
    def stdout(self) -> str:
        return (self.folder / "stdout.log").read_text()


@contextmanager
def serving(tmp_path: Path, *flags: str) -> Iterator[Served]:
    """`sessionlog serve FLAGS`, healthy; the test stops it with ``terminate`` (SIGTERM to its
    PID), and a server still running at the end is killed by PID."""
    address = f"127.0.0.1:{free_port()}"
    args = [str(SESSIONLOG), "serve", "--data", str(tmp_path / "data"), "--listen", address]
    with (tmp_path / "stdout.log").open("wb") as out, (tmp_path / "stderr.log").open("wb") as err:
        process = subprocess.Popen(
            [*args, *flags],
            cwd=tmp_path,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    served = Served(process, address, tmp_path)
    try:
        wait_healthy(served)
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(STOP_SECONDS)


def wait_healthy(served: Served) -> None:
    """Poll the health service until SERVING; fail if the process dies first."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        assert served.process.poll() is None, f"server exited early:\n{served.stderr}"
        if health_status(served.address, timeout=0.5) == 1:
            return
        time.sleep(0.05)
    raise AssertionError(f"server not serving at {served.address}:\n{served.stderr}")


def terminate(served: Served) -> int:
    """SIGTERM the server's PID and wait for it to exit."""
    served.process.send_signal(signal.SIGTERM)
    return served.process.wait(STOP_SECONDS)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line parsed as one JSON object (fails on a line that is not)."""
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(entry, dict) for entry in entries)
    return entries


def do_some_requests(address: str, session_id: str, count: int) -> None:
    """``count`` appends and as many reads of ``session_id``."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for i in range(count):
            event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
            event.data.update({"content": f"request {i}"})
            stub.Append(pb.AppendRequest(session_id=session_id, events=[event]), timeout=5)
            stub.Surface(pb.SurfaceRequest(session_id=session_id), timeout=5)


def test_json_logs_say_start_and_stop_and_nothing_per_request(tmp_path: Path) -> None:
    """--log-format json: stderr is JSON lines only; the start line carries listen, data and
    role, SIGTERM gives the stop lines, and 40 requests add no line."""
    with serving(tmp_path, "--log-format", "json") as served:
        do_some_requests(served.address, "quiet-session", 20)
        assert terminate(served) == 0
    entries = json_lines(served.stderr)
    assert served.stdout == ""
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)
    messages = [entry["message"] for entry in entries]
    start = entries[messages.index("sessionlog serving")]
    assert start["listen"] == served.address
    assert start["data"] == str((tmp_path / "data").absolute())
    assert start["role"] == "primary"
    assert start["level"] == "info"
    assert messages.index("stopping on signal") < messages.index("sessionlog stopped")
    assert messages[-1] == "sessionlog stopped"
    assert len(entries) < 20, f"a line per request? {messages}"
    assert "quiet-session" not in served.stderr
    assert "request 3" not in served.stderr, "no event data in logs"


def test_logs_default_to_json_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """With --log-format left at auto and stderr a file, the logs are JSON lines."""
    with serving(tmp_path) as served:
        assert terminate(served) == 0
    messages = [entry["message"] for entry in json_lines(served.stderr)]
    assert "sessionlog serving" in messages
    assert "sessionlog stopped" in messages


def test_text_logs_are_readable_lines(tmp_path: Path) -> None:
    """--log-format text: each line is time, level, message and key=value pairs, not JSON."""
    with serving(tmp_path, "--log-format", "text") as served:
        do_some_requests(served.address, "text-session", 5)
        assert terminate(served) == 0
    lines = [line for line in served.stderr.splitlines() if line.strip()]
    start = next(line for line in lines if "sessionlog serving" in line)
    assert " INFO " in start
    assert f"listen={served.address}" in start
    assert "role=primary" in start
    assert any("sessionlog stopped" in line for line in lines)
    for line in lines:
        assert not line.startswith("{"), line
    assert "text-session" not in served.stderr
