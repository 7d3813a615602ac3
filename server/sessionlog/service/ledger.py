"""The usage ledger on the wire: fold totals to ``ModelUsage`` messages and back, in model order.

Model order is the UTF-8 byte order of the names, as the ledger's rows are stored, so a reply
is the same bytes on a primary and its replicas.
"""

from __future__ import annotations

from collections.abc import Iterable

from sessionlog import fold
from sessionlog.v1 import session_log_service_pb2 as pb


def model_usages(totals: fold.UsageByModel) -> list[pb.ModelUsage]:
    """Totals as ModelUsage messages, in model order."""
    return [
        pb.ModelUsage(
            model=model,
            input_tokens=sums.input_tokens,
            output_tokens=sums.output_tokens,
            cached_input_tokens=sums.cached_input_tokens,
            reasoning_tokens=sums.reasoning_tokens,
            event_count=sums.event_count,
        )
        for model, sums in sorted(totals.items(), key=lambda item: item[0].encode("utf-8"))
    ]


def from_messages(usages: Iterable[pb.ModelUsage]) -> fold.UsageByModel:
    """ModelUsage messages back as totals (a scattered listing's sessions come as messages)."""
    return {
        u.model: fold.ModelTotals(
            u.input_tokens,
            u.output_tokens,
            u.cached_input_tokens,
            u.reasoning_tokens,
            u.event_count,
        )
        for u in usages
    }


def page_total(sessions: Iterable[pb.Session]) -> list[pb.ModelUsage]:
    """The usage of a listing's page: its sessions' totals summed per model."""
    return model_usages(fold.sum_usage(from_messages(s.usage) for s in sessions))
