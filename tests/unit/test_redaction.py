"""A redaction keeps the fold's shape: whatever events are redacted, the surface holds the same
seqs in the same order, the replace generation is unchanged, and each redacted message projects
with no content and the redacted mark."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog.fold import REDACTED_MARK, SurfaceFold, fold_state, project
from sessionlog.storage.erasure import redacted
from sessionlog.v1.event_pb2 import Event
from tests.unit.test_fold_property import logs


@settings(max_examples=200, deadline=None)
@given(logs(), st.data())
def test_redacting_any_events_keeps_the_surface(events: list[Event], data: st.DataObject) -> None:
    chosen = data.draw(st.sets(st.integers(min_value=0, max_value=max(len(events) - 1, 0))))
    for event in events:
        event.state_delta.update({"k": event.seq})
    after = [
        redacted(e, 1_700_000_000_000_000_000, "privacy") if e.seq in chosen else e for e in events
    ]
    before_fold, after_fold = SurfaceFold(), SurfaceFold()
    before_fold.extend(events)
    after_fold.extend(after)
    assert after_fold.seqs == before_fold.seqs
    assert after_fold.replace_generation == before_fold.replace_generation
    for event in after_fold.surface:
        message = project(event)
        if event.seq in chosen:
            assert not message.HasField("content")
            assert message.metadata[REDACTED_MARK] is True
            assert message.created_at == event.time
        else:
            assert REDACTED_MARK not in message.metadata
    kept = [e.seq for e in events if e.seq not in chosen]
    state = fold_state(after)
    assert ("k" in state.fields) == bool(kept)
    if kept:
        assert state["k"] == max(kept)
