"""Append's semantics suites run again over AppendStream: test_rpcs' Append cases and
test_errors' Append refusals, unchanged, against a stub whose Append sends its request on an
AppendStream and raises the request's own error as unary Append raises its status
(``StreamingStub``). A pass here says each stream request is exactly a unary Append: the same
seqs, drops, replays, conflicts, and the same code, reason and metadata for every refusal.

One server for the module; the imported tests name their sessions through ``sid``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionlog.testing import RunningServer
from tests.e2e import test_errors, test_rpcs
from tests.e2e._helpers import StreamingStub
from tests.e2e._proc import running_server
from tests.e2e.test_errors import seeded as seeded

REPLAYED = {
    test_rpcs: (
        "test_append_response_matches_stored_events",
        "test_client_time_preserved_to_the_nanosecond",
        "test_empty_append_on_a_new_session",
        "test_empty_append_on_an_existing_session",
        "test_example_nested_replace_keeps_hidden",
        "test_example_summary_in_the_middle",
        "test_expected_seq_matches",
        "test_expected_seq_race",
        "test_lenient_append_drops_and_reports",
        "test_lenient_append_with_everything_dropped",
        "test_lenient_future_replace_is_judged_after_earlier_drops",
        "test_missing_time_is_the_server_now",
        "test_replace_does_not_hide_later_events",
        "test_request_id_is_per_session",
        "test_request_id_replay_beats_seq_conflict",
        "test_request_id_replay_of_a_lenient_append",
        "test_request_id_replay_returns_the_same_response",
        "test_seq_is_dense_from_zero",
        "test_sessions_are_independent",
        "test_strict_append_reports_no_drops",
    ),
    test_errors: (
        "test_bookkeeping_events_have_no_field_shapes",
        "test_client_supplied_seq",
        "test_event_just_under_the_limit_is_accepted",
        "test_event_too_large",
        "test_explicit_append_op_on_step_start",
        "test_first_failing_event_is_reported",
        "test_invalid_message_field",
        "test_invalid_session_id_beats_event_errors",
        "test_long_request_id_is_not_internal",
        "test_nesting_of_24_levels_is_accepted",
        "test_null_string_fields_are_accepted",
        "test_replace_may_start_at_its_own_seq",
        "test_replace_op_on_tool_call",
        "test_replace_pointing_at_the_future",
        "test_replace_start_after_stop",
        "test_request_id_reused_beats_seq_conflict",
        "test_request_id_reused_with_other_events",
        "test_rule_order_within_one_event",
        "test_seq_conflict",
        "test_seq_conflict_beats_event_errors",
        "test_seq_conflict_on_a_never_written_session",
        "test_seq_conflict_on_an_empty_append",
        "test_surface_op_with_no_kind_counts_as_unset",
        "test_time_outside_timestamp_range",
        "test_unknown_event_type",
        "test_unknown_event_type_on_first_append_creates_nothing",
        "test_unserializable_data",
        "test_unserializable_first_append_creates_nothing",
        "test_valid_session_ids",
    ),
}
"""The Append cases of each suite (its reads, and the cases that start servers of their own
settings, stay there)."""

for _suite, _names in REPLAYED.items():
    for _name in _names:
        globals()[_name] = getattr(_suite, _name)  # collected here, with this module's fixtures

pytestmark = pytest.mark.workers  # the core semantics, as test_rpcs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for every test of the module."""
    with running_server(tmp_path_factory.mktemp("stream-semantics") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> StreamingStub:
    """The server's stub, its Append sent over AppendStream."""
    return StreamingStub(server.stub())
