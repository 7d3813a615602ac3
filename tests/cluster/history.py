"""The history check of a failover run (Jepsen-style): what the writers saw against what the
members hold at the end.

A run records every append a writer sent (``Append``: its request id, session, where it went,
when, and how it ended), when each epoch was known to exist and who led it (``EpochStart``),
and, once the faults stop and the group settles, every member's final log (``Entry`` per event,
read back from the event's payload, which names its request id). ``check`` is pure: the same
history always gives the same anomalies, and a test can make one up.

The rules, one anomaly kind each:

- ``lost``: an acknowledged append is not in the primary's log (every event of it).
- ``misplaced``: it is there, but not at the seqs its acknowledgement gave.
- ``duplicated``: an event of one append is in a member's log more than once.
- ``phantom``: a member's log holds an event of an append nobody sent (or in another session).
- ``refused_present``: an append refused for good (a refusal that means "not applied", e.g.
  NOT_PRIMARY with no retry that could have applied it) is in the primary's log.
- ``gap``: a member's seqs for a session are not exactly 0..n-1.
- ``diverged``: a member's log differs from the primary's.
- ``split_brain``: acknowledgements of one epoch came from two servers.
- ``wrong_leader``: an acknowledgement of epoch E came from a server that did not lead E.
- ``stale_ack``: an append acknowledged at epoch E had been sent after a later epoch began: a
  deposed primary took a write it must have refused (it fences itself before the new epoch
  can exist, so nothing sent after that may be acknowledged at the old epoch).

Timed-out and failed appends are indeterminate: present once or absent, both are fine (present
twice is still ``duplicated``).

Several groups (sessions sharded over them, ``check_groups``): each group's history is checked
as above, with the appends to the sessions it owns, and one more rule:

- ``misrouted``: a member's store holds a session its group does not own.

Behind a proxy (HAProxy), a writer does not know which member acknowledged an append: it names
the proxy (``check``'s ``proxy``), and the two rules that compare servers (``split_brain``,
``wrong_leader``) skip those appends; ``stale_ack`` still applies.

``longest_gap`` measures a history: the longest time between two acknowledgements (the pause a
failover caused to some sessions' writers).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["ok", "refused", "timeout", "error"]
KINDS = (
    "lost",
    "misplaced",
    "duplicated",
    "phantom",
    "refused_present",
    "gap",
    "diverged",
    "split_brain",
    "wrong_leader",
    "stale_ack",
    "misrouted",
)


@dataclass(frozen=True)
class Append:
    """One append (all its attempts: a retry keeps the request id) and how it ended."""

    request_id: str
    session: str
    server: str
    """ok: the server that acknowledged it; otherwise the last one it was sent to."""
    sent_at: float
    """Monotonic clock before the first attempt was sent."""
    outcome: Outcome
    done_at: float
    seq: int | None = None
    """ok: the seq of its first event."""
    count: int = 1
    """Events in the append."""
    epoch: int | None = None
    """ok: the epoch the reply carried (``sessionlog-epoch``)."""
    reason: str = ""
    """refused: the ErrorInfo reason."""


@dataclass(frozen=True)
class Entry:
    """One event of a final log: its seq, and which append (and which event of it) wrote it."""

    seq: int
    request_id: str
    index: int = 0


@dataclass(frozen=True)
class EpochStart:
    """Epoch ``epoch``, led by ``leader``, certainly existed from ``began_at`` on (monotonic;
    e.g. when its leader said it leads)."""

    epoch: int
    leader: str
    began_at: float


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str


Logs = Mapping[str, Mapping[str, Sequence[Entry]]]
"""member -> session -> its events."""


def check(
    appends: Sequence[Append],
    logs: Logs,
    primary: str,
    epochs: Sequence[EpochStart] = (),
    proxy: str = "",
) -> list[Anomaly]:
    """Every anomaly of the history, in rule order; [] for a clean run. ``primary`` names the
    member whose log is the reference (the group's primary at the end); ``proxy``, the server
    that appends acknowledged through a proxy name (who answered behind it is unknown)."""
    if primary not in logs:
        raise ValueError(f"the primary {primary!r} has no log among {sorted(logs)}")
    sent = {a.request_id: a for a in appends}
    found: list[Anomaly] = []
    found += _acknowledged(appends, logs[primary], primary)
    for member in sorted(logs):
        found += _one_log(member, logs[member], sent)
    found += _convergence(logs, primary)
    found += _epochs(appends, epochs, proxy)
    return _in_order(found)


def check_groups(
    appends: Sequence[Append],
    logs: Mapping[str, Logs],
    primaries: Mapping[str, str],
    owner: Callable[[str], str],
    epochs: Mapping[str, Sequence[EpochStart]] | None = None,
    proxy: str = "",
) -> list[Anomaly]:
    """Every anomaly of a history over several groups, in rule order. ``logs``: group -> its
    members' logs (a member's log may list a session it holds without its events: ``[]``, e.g.
    one it does not own and so cannot read); ``primaries``: group -> its primary at the end;
    ``owner(session)``: the group that owns it; ``epochs``: group -> its epochs. Each anomaly's
    detail starts with its group's name."""
    found: list[Anomaly] = []
    for group in sorted(logs):
        own: dict[str, dict[str, Sequence[Entry]]] = {}
        for member in sorted(logs[group]):
            own[member] = {}
            for session, entries in logs[group][member].items():
                if owner(session) == group:
                    own[member][session] = entries
                else:
                    found.append(
                        Anomaly(
                            "misrouted",
                            f"{group}: {member} holds session {session!r} "
                            f"({len(entries)} events read), which {owner(session)} owns",
                        )
                    )
        mine = [a for a in appends if owner(a.session) == group]
        primary = primaries[group]
        theirs = (epochs or {}).get(group, ())
        found += [
            Anomaly(a.kind, f"{group}: {a.detail}")
            for a in check(mine, own, primary, theirs, proxy)
        ]
    strays = sorted({a.session for a in appends if owner(a.session) not in logs})
    if strays:
        raise ValueError(f"no logs of the groups owning {strays[:5]}")
    return _in_order(found)


def longest_gap(appends: Iterable[Append], start: float, end: float) -> tuple[float, float]:
    """The longest time within [start, end] with no acknowledgement among ``appends``, and when
    it began: (seconds, monotonic time). The edges count: a run of acknowledgements that stops
    at t gives a gap from t to ``end``."""
    times = sorted(a.done_at for a in appends if a.outcome == "ok" and start <= a.done_at <= end)
    edges = [start, *times, end]
    return max(((b - a, a) for a, b in itertools.pairwise(edges)), default=(0.0, start))


def _in_order(found: list[Anomaly]) -> list[Anomaly]:
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found, key=lambda a: order[a.kind])


def _where(log: Mapping[str, Sequence[Entry]]) -> dict[tuple[str, str, int], list[int]]:
    """(session, request id, index) -> the seqs it is at."""
    where: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for session, entries in log.items():
        for entry in entries:
            where[(session, entry.request_id, entry.index)].append(entry.seq)
    return where


def _acknowledged(
    appends: Sequence[Append], log: Mapping[str, Sequence[Entry]], primary: str
) -> list[Anomaly]:
    where = _where(log)
    found = []
    for append in appends:
        if append.outcome not in ("ok", "refused"):
            continue
        for index in range(append.count):
            seqs = where.get((append.session, append.request_id, index), [])
            name = f"{append.request_id}[{index}] in {append.session!r}"
            if append.outcome == "refused":
                if seqs:
                    found.append(
                        Anomaly(
                            "refused_present",
                            f"{name} was refused ({append.reason}) yet is at seq {seqs[0]} "
                            f"on the primary {primary}",
                        )
                    )
            elif not seqs:
                found.append(
                    Anomaly(
                        "lost",
                        f"{name}, acknowledged by {append.server} at epoch "
                        f"{append.epoch}, is not on the primary {primary}",
                    )
                )
            elif append.seq is not None and append.seq + index not in seqs:
                found.append(
                    Anomaly(
                        "misplaced",
                        f"{name} was acknowledged at seq {append.seq + index} "
                        f"but is at seq {seqs[0]} on the primary {primary}",
                    )
                )
    return found


def _one_log(
    member: str, log: Mapping[str, Sequence[Entry]], sent: Mapping[str, Append]
) -> list[Anomaly]:
    found = []
    for session in sorted(log):
        entries = log[session]
        seqs = sorted(e.seq for e in entries)
        if seqs != list(range(len(seqs))):
            missing = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
            repeated = sorted(s for s, n in Counter(seqs).items() if n > 1)
            found.append(
                Anomaly(
                    "gap",
                    f"{member}: session {session!r} seqs are not dense: "
                    f"missing {missing[:5]}, repeated {repeated[:5]}, of {len(seqs)}",
                )
            )
        for (request_id, index), times in Counter((e.request_id, e.index) for e in entries).items():
            if times > 1:
                found.append(
                    Anomaly(
                        "duplicated",
                        f"{member}: {request_id}[{index}] is in session {session!r} {times} times",
                    )
                )
        for request_id in sorted({e.request_id for e in entries}):
            append = sent.get(request_id)
            if append is None or append.session != session:
                found.append(
                    Anomaly(
                        "phantom",
                        f"{member}: session {session!r} holds {request_id}, "
                        "which no writer sent to it",
                    )
                )
    return found


def _convergence(logs: Logs, primary: str) -> list[Anomaly]:
    def normal(log: Mapping[str, Sequence[Entry]]) -> dict[str, list[Entry]]:
        return {s: sorted(entries, key=lambda e: e.seq) for s, entries in log.items() if entries}

    reference = normal(logs[primary])
    found = []
    for member in sorted(logs):
        if member == primary:
            continue
        theirs = normal(logs[member])
        if theirs == reference:
            continue
        sessions = sorted(set(theirs) | set(reference))
        session = next(s for s in sessions if theirs.get(s) != reference.get(s))
        mine, other = reference.get(session, []), theirs.get(session, [])
        at = next(
            (i for i, (a, b) in enumerate(zip(mine, other, strict=False)) if a != b),
            min(len(mine), len(other)),
        )
        found.append(
            Anomaly(
                "diverged",
                f"{member} differs from the primary {primary} in session "
                f"{session!r} from event {at} ({len(other)} events against {len(mine)})",
            )
        )
    return found


def _epochs(
    appends: Sequence[Append], epochs: Sequence[EpochStart], proxy: str = ""
) -> list[Anomaly]:
    acked = [a for a in appends if a.outcome == "ok" and a.epoch is not None]
    known = [a for a in acked if not proxy or a.server != proxy]  # who answered is known
    servers: dict[int, set[str]] = defaultdict(set)
    for append in known:
        assert append.epoch is not None
        servers[append.epoch].add(append.server)
    found = [
        Anomaly("split_brain", f"epoch {epoch} was acknowledged by {sorted(names)}")
        for epoch, names in sorted(servers.items())
        if len(names) > 1
    ]
    leader = {e.epoch: e.leader for e in epochs}
    for append in acked:
        assert append.epoch is not None
        behind_proxy = bool(proxy) and append.server == proxy
        if not behind_proxy and append.epoch in leader and append.server != leader[append.epoch]:
            found.append(
                Anomaly(
                    "wrong_leader",
                    f"{append.request_id} was acknowledged at epoch "
                    f"{append.epoch} by {append.server}, but {leader[append.epoch]} led it",
                )
            )
        later = [e for e in epochs if e.epoch > append.epoch and e.began_at < append.sent_at]
        if later:
            first = min(later, key=lambda e: e.began_at)
            found.append(
                Anomaly(
                    "stale_ack",
                    f"{append.request_id}, sent at {append.sent_at:.3f}, was "
                    f"acknowledged by {append.server} at epoch {append.epoch}, after "
                    f"epoch {first.epoch} began at {first.began_at:.3f}",
                )
            )
    return found
