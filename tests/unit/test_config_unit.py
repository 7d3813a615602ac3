"""Parsing and precedence of `sessionlog serve` settings, in memory (no file, no socket).

``resolve`` is given an argparse Namespace from the real flags and a fake environment without
SESSIONLOG_CONFIG, so no file is read; the file source is covered end to end in
tests/e2e/test_config.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from typing import Any

import pytest

from sessionlog import config, defaults, fold
from sessionlog.config import ConfigError, ServerConfig

SECRET = "unit-secret-4b9e21c7d05f"


def parse_flags(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    return parser.parse_args(list(flags))


def resolve(*flags: str, **env: str) -> config.Resolved:
    return config.resolve(parse_flags(*flags), environ=env)


# -- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("512", 512),
        (" 512 ", 512),
        ("10B", 10),
        ("1K", 1 << 10),
        ("1KiB", 1 << 10),
        ("1kib", 1 << 10),
        ("3KB", 3 << 10),
        ("64MiB", 64 << 20),
        ("64mb", 64 << 20),
        ("64 M", 64 << 20),
        ("8GiB", 8 << 30),
        ("8g", 8 << 30),
        ("2TiB", 2 << 40),
        (4096, 4096),
    ],
)
def test_parse_size_reads_bytes_and_binary_units(text: str | int, size: int) -> None:
    """Plain bytes, and K/M/G/T with or without i/B in any case, all in powers of 1024."""
    assert config.parse_size(text) == size


@pytest.mark.parametrize(
    "text", ["", "lots", "1.5GiB", "-1", -1, "1 PB", "GiB", "1GiBs", "1 0", True, 2.5, None]
)
def test_parse_size_refuses_what_is_not_a_size(text: Any) -> None:
    """Fractions, negatives, unknown units, booleans and words are refused with a hint."""
    with pytest.raises(ValueError, match="not a size"):
        config.parse_size(text)


def test_the_message_size_must_fit_grpc() -> None:
    """max_message_size refuses 2 GiB and more (gRPC lengths are 32-bit), accepts just below."""
    parse = config.BY_NAME["max_message_size"].parse
    assert parse("2047MiB") == 2047 << 20
    with pytest.raises(ValueError, match="2GiB"):
        parse("2GiB")


# -- other value types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("On", True),
        (True, True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        ("", False),
        (False, False),
    ],
)
def test_booleans_read_the_usual_words(text: str | bool, value: bool) -> None:
    """1/true/yes/on and 0/false/no/off (any case, spaces trimmed); empty is false."""
    assert config.BY_NAME["auth_open_health"].parse(text) is value


@pytest.mark.parametrize("text", ["maybe", "2", "enabled", "truthy"])
def test_booleans_refuse_other_words(text: str) -> None:
    """Anything else is an error, not silently false."""
    with pytest.raises(ValueError, match="true or false"):
        config.BY_NAME["auth_open_health"].parse(text)


def test_counts_are_whole_numbers_of_at_least_one() -> None:
    """max_streams takes "5", 5 and 5.0, up to a million; refuses 0, negatives, fractions,
    booleans, words, 1e9 and more than a million, naming the range."""
    parse = config.BY_NAME["max_streams"].parse
    assert parse("5") == parse(5) == parse(5.0) == 5
    assert parse("1000000") == 1_000_000
    for bad in ("0", 0, "-3", 2.5, "2.5", True, "many", "1e9", 10**14, float("inf")):
        with pytest.raises(ValueError, match="must be a whole number from 1 to 1,000,000, not"):
            parse(bad)


def test_durations_are_finite_and_within_their_range() -> None:
    """Seconds accept 0 and fractions (except the heartbeat, 0.1s at least) and units; they
    refuse negatives, NaN, infinity, booleans, words and 1e9, each with the one message that
    names the range."""
    grace = config.BY_NAME["shutdown_grace"].parse
    heartbeat = config.BY_NAME["heartbeat"].parse
    assert grace("0") == 0.0
    assert grace("2.5") == heartbeat(2.5) == 2.5
    assert grace("500ms") == 0.5
    assert heartbeat("1h") == 3600.0
    for bad in ("-1", "nan", "inf", "-inf", True, "soon", "1e9", "61m", 1e9, float("inf")):
        with pytest.raises(ValueError, match=r"must be a duration from 0s to 1h, not"):
            grace(bad)
    for bad in ("0", "0.09", "-1", "nan", "soon", True):
        with pytest.raises(ValueError, match=r"must be a duration from 0\.1s to 1h, not"):
            heartbeat(bad)


def test_sizes_are_within_their_range() -> None:
    """map_size takes 1MiB to 128TiB; less, more and what is not a size name that range."""
    parse = config.BY_NAME["map_size"].parse
    assert parse("1MiB") == 1 << 20
    assert parse("128TiB") == 128 << 40
    for bad in ("1023KiB", "129TiB", "999999TiB", "1e9", "-1", 2.5, True):
        with pytest.raises(ValueError, match="must be a size from 1MiB to 128TiB, not"):
            parse(bad)


def test_retention_durations_take_units() -> None:
    """--retention-idle reads 90d, 12h, a number of seconds, or forever/0 (off); the sweep
    interval must be above 0; anything else names the value."""
    idle = config.BY_NAME["retention_idle"].parse
    interval = config.BY_NAME["retention_sweep_interval"].parse
    assert idle("90d") == 90 * 86400.0
    assert idle("12h") == interval("12h") == 43200.0
    assert idle("forever") == idle("0") == 0.0
    assert interval("0.2") == 0.2
    for bad in ("-1d", "soon", True, "0.5", "36501d"):
        with pytest.raises(ValueError, match=r"from 1s to 36500d or 0 \(off\), not"):
            idle(bad)
    for bad in ("0", "8d"):
        with pytest.raises(ValueError, match=r"from 0\.1s to 7d, not"):
            interval(bad)


def test_choices_refuse_unknown_values() -> None:
    """durability and log settings accept only their listed values, case-sensitively."""
    assert config.BY_NAME["durability"].parse("nosync") == "nosync"
    for name, bad in (("durability", "fast"), ("log_format", "JSON"), ("log_level", "trace")):
        with pytest.raises(ValueError, match="must be one of"):
            config.BY_NAME[name].parse(bad)


def test_every_default_parses_to_itself() -> None:
    """Each setting's default is a value its own parser accepts unchanged."""
    for setting in config.SETTINGS:
        assert setting.parse(setting.default) == setting.default, setting.name


def test_setting_names_flags_and_variables_are_unique() -> None:
    """No two settings share a name, a flag or an environment variable."""
    for attribute in ("name", "flag", "env"):
        values = [getattr(setting, attribute) for setting in config.SETTINGS]
        assert len(values) == len(set(values)), attribute
    assert all(s.env == "SESSIONLOG_" + s.name.upper() for s in config.SETTINGS)


# -- precedence -----------------------------------------------------------------------------------


def test_flag_beats_environment_beats_default() -> None:
    """A flag wins over its variable; a variable wins over the default; sources are named."""
    resolved = resolve(
        "--max-streams", "13", SESSIONLOG_MAX_STREAMS="12", SESSIONLOG_MAP_SIZE="1GiB"
    )
    assert resolved.values["max_streams"] == 13
    assert resolved.sources["max_streams"] == "flag --max-streams"
    assert resolved.values["map_size"] == 1 << 30
    assert resolved.sources["map_size"] == "env SESSIONLOG_MAP_SIZE"
    assert resolved.values["max_data_depth"] == 24
    assert resolved.sources["max_data_depth"] == "default"
    assert resolved.file == ""


def test_an_empty_variable_is_still_a_value() -> None:
    """SESSIONLOG_LISTEN="" sets listen to "" from the environment (it is not ignored)."""
    resolved = resolve(SESSIONLOG_LISTEN="", SESSIONLOG_AUTH_OPEN_HEALTH="")
    assert resolved.sources["listen"] == "env SESSIONLOG_LISTEN"
    assert resolved.values["listen"] == ""
    assert resolved.values["auth_open_health"] is False


def test_a_switch_flag_sets_true() -> None:
    """--auth-open-health is a switch: present means true, from the flag, over the variable."""
    resolved = resolve("--auth-open-health", SESSIONLOG_AUTH_OPEN_HEALTH="no")
    assert resolved.values["auth_open_health"] is True
    assert resolved.sources["auth_open_health"] == "flag --auth-open-health"


def test_a_bad_value_names_the_setting_and_source() -> None:
    """ConfigError says which setting and which source held the bad value."""
    with pytest.raises(ConfigError, match=r"^map_size from env SESSIONLOG_MAP_SIZE: "):
        resolve(SESSIONLOG_MAP_SIZE="huge")
    with pytest.raises(ConfigError, match=r"^max_streams from flag --max-streams: "):
        resolve("--max-streams", "none", SESSIONLOG_MAX_STREAMS="4")


def test_a_bad_flag_wins_over_a_good_variable_and_is_reported() -> None:
    """Precedence applies before validation: a good lower source does not rescue a bad flag."""
    with pytest.raises(ConfigError, match="flag --heartbeat"):
        resolve("--heartbeat", "-1", SESSIONLOG_HEARTBEAT="5")


def test_the_defaults_make_the_default_server_config() -> None:
    """Resolving nothing gives ServerConfig's own defaults, field for field."""
    built = config.server_config(resolve())
    assert built == dataclasses.replace(ServerConfig(), limits=built.limits)
    assert built.limits == ServerConfig().limits


def test_settings_reach_the_server_config() -> None:
    """Each resolved value lands in the matching ServerConfig field."""
    resolved = resolve(
        "--durability",
        "nosync",
        "--max-event-size",
        "64KiB",
        "--max-data-depth",
        "6",
        "--heartbeat",
        "2.5",
        "--max-streams-per-connection",
        "9",
        SESSIONLOG_REPLICA_TOKEN=SECRET,
    )
    built = config.server_config(resolved)
    assert built.durability == "nosync"
    assert built.limits.max_event_bytes == 64 << 10
    assert built.limits.max_data_depth == 6
    assert built.heartbeat_seconds == 2.5
    assert built.max_streams_per_connection == 9
    assert built.replica_token == SECRET


def test_contradictions_are_config_errors() -> None:
    """A message limit below the event limit is refused when the ServerConfig is built."""
    resolved = resolve("--max-message-size", "64KiB")
    with pytest.raises(ConfigError, match="max message size"):
        config.server_config(resolved)


def test_flags_of_a_default_config_are_none() -> None:
    """The default configuration needs no flag."""
    assert config.flags_of(ServerConfig()) == []


def test_flags_of_a_config_make_that_config_again() -> None:
    """flags_of gives flags that resolve back to the same ServerConfig; between them the two
    configurations here change every setting, so each one's way back is covered."""
    primary = ServerConfig(
        data_dir="/srv/log",
        listen="127.0.0.1:0",
        workers=3,
        metrics_listen="127.0.0.1:9100",
        http_listen="127.0.0.1:9200",
        map_size=1 << 30,
        durability="group",
        max_message_bytes=8 << 20,
        limits=dataclasses.replace(fold.DEFAULT_LIMITS, max_event_bytes=2 << 20, max_data_depth=7),
        max_events_per_append=5,
        append_stream_window=12,
        max_streams=6,
        max_streams_per_connection=4,
        heartbeat_seconds=0.25,
        follow_send_rate=9,
        shutdown_grace_seconds=1.5,
        request_id_ttl_seconds=60,
        replica_timeout_seconds=2.5,
        replica_token_file="/etc/token",
        replica_tls_ca="ca.pem",
        replica_tls_cert="client.pem",
        replica_tls_key="client.key",
        tls_cert="server.pem",
        tls_key="server.key",
        tls_client_ca="clients.pem",
        auth_tokens="tokens.toml",
        auth_open_health=True,
        log_level="debug",
        log_format="text",
        retention_idle_seconds=7 * 86400.0,
        retention_sweep_interval_seconds=30.0,
    )
    replica = ServerConfig(
        workers=1,
        replica_of="127.0.0.1:7000",
        replica_token=SECRET,
        replica_serve_open=True,
        ack="replica",
        sync_replicas=2,
        sync_timeout_seconds=0.5,
    )
    member = ServerConfig(
        cluster="etcd://127.0.0.1:2379,127.0.0.1:2479",
        group="g",
        advertise="127.0.0.1:7001",
        lease_ttl=3,
        shard_map="etcd",
    )
    covered: set[str] = set()
    for made in (primary, replica, member):
        flags = config.flags_of(made)
        assert config.server_config(resolve(*flags)) == made
        covered |= {flag for flag in flags if flag.startswith("--")}
    assert covered == {setting.flag for setting in config.SETTINGS}


# -- render ---------------------------------------------------------------------------------------


def test_render_masks_secrets_and_names_sources() -> None:
    """The replica token prints as ***; every setting has one line with its source."""
    text = config.render(resolve("--replica-token", SECRET, SESSIONLOG_MAX_STREAMS="7"))
    assert SECRET not in text
    lines = text.splitlines()
    assert 'replica_token = "***"  # flag --replica-token' in lines
    assert "max_streams = 7  # env SESSIONLOG_MAX_STREAMS" in lines
    assert len([line for line in lines if not line.startswith("#")]) == len(config.SETTINGS)


def test_render_shows_an_unset_secret_as_unset() -> None:
    """An empty secret is shown as "", so the reader can tell it is not set."""
    assert 'replica_token = ""  # default' in config.render(resolve()).splitlines()


def test_render_quotes_text_safely() -> None:
    """Quotes and backslashes in text values are escaped, so the output stays valid TOML."""
    text = config.render(resolve("--data", 'C:\\data "main"'))
    assert tomllib.loads(text)["data"] == 'C:\\data "main"'


# -- a cluster member ----------------------------------------------------------------------------

CLUSTER = ("--cluster", "etcd://127.0.0.1:2379", "--group", "g", "--advertise", "127.0.0.1:7001")


def test_cluster_settings_reach_the_server_config_and_run_one_process() -> None:
    """--cluster with --group and --advertise makes a member: its settings parsed, one process
    (auto means 1), the default TTL unless told."""
    built = config.server_config(resolve(*CLUSTER, "--lease-ttl", "3"))
    member = built.cluster_settings
    assert member is not None
    assert (member.group, member.advertise, member.lease_ttl) == ("g", "127.0.0.1:7001", 3)
    assert str(member.endpoints[0]) == "127.0.0.1:2379"
    assert config.worker_count(built) == 1
    assert config.server_config(resolve(*CLUSTER)).lease_ttl == defaults.DEFAULT_LEASE_TTL_SECONDS
    assert config.server_config(resolve()).cluster_settings is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (CLUSTER[:4], "--cluster needs --advertise"),
        (("--cluster", "etcd://127.0.0.1:2379"), "--cluster needs --group and --advertise"),
        (("--group", "g"), "--group need --cluster"),
        ((*CLUSTER, "--replica-of", "127.0.0.1:7000"), "exclude each other"),
        ((*CLUSTER, "--workers", "2"), "a cluster member runs in one process: workers is 2"),
    ],
)
def test_a_cluster_member_refuses_what_contradicts_an_election(
    flags: tuple[str, ...], message: str
) -> None:
    """The group needs its name and an address to be reached at; etcd picks the roles, so no
    --replica-of; and its lease lives in one process, so no --workers N."""
    with pytest.raises(ConfigError, match=message):
        config.server_config(resolve(*flags))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--cluster", "http://127.0.0.1:2379"), r"^cluster from flag --cluster: .*etcd://"),
        (("--lease-ttl", "1"), r"^lease_ttl from flag --lease-ttl: must be a whole number"),
        (("--advertise", "0.0.0.0:7001"), r"^advertise from flag --advertise: .*wildcard"),
        (("--group", "a/b"), r"^group from flag --group: must be 1 to 63"),
    ],
)
def test_a_bad_cluster_value_names_its_setting(flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(*flags)
