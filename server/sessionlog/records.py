"""Session records: what a person sets on a session (title, labels, owner, status), the rules
those values follow, UpdateSession's field mask (AIP-134), and ListSessions' filter (a subset
of AIP-160).

Pure: no grpc, no lmdb, no clock. The store keeps a record per session that has one
(``storage.schema``, table ``records``); what the server derives (counts, times, parent) lives
in the session's SessionMeta and is never set here.

Decisions:
- ``status`` is a free string (the label value rule), not an enum: frameworks name their own
  states ("running", "waiting_for_user", "done") and the server gives them no meaning.
- Labels follow Kubernetes: key ``[prefix/]name``, name and value at most 63 characters of
  letters, digits, ``-_.`` starting and ending alphanumeric; the prefix a DNS subdomain. So no
  key or value holds NUL, ``=`` or whitespace, which the label index (NUL-separated) and the
  CLI's ``k=v`` rely on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import errors

MAX_TITLE_BYTES = 1024
MAX_OWNER_BYTES = 256
MAX_LABELS = 64
MAX_LABEL_PREFIX = 253
MAX_FILTER_CHARS = 4096

_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

SETTABLE = ("title", "labels", "owner", "status")
"""The Session fields UpdateSession may set, in the order "*" names them."""
RETENTION = ("expire_time", "pinned")
"""The retention fields (``sessionlog.retention``): UpdateSession sets them only when a path
names them ("ttl" is turned into "expire_time" by the service, which knows the time)."""
OUTPUT_ONLY = frozenset(
    {
        "session_id",
        "exists",
        "event_count",
        "replace_generation",
        "create_time",
        "last_append_time",
        "parent_session_id",
        "parent_event_count",
        "lease",
        "update_time",
        "parent_seq",
    }
)


@dataclass
class SessionRecord:
    """The person-set fields of a session, and when UpdateSession last changed them."""

    title: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    status: str = ""
    update_time_ns: int = 0
    """The last UpdateSession (0: never; creating a session with fields is no update)."""
    parent_seq: int | None = None
    """A sub-agent child's spawning event in its parent (set once, at create)."""
    expire_time_ns: int = 0
    """When the retention sweeper deletes the session (0: never)."""
    pinned: bool = False
    """Exempt from expiry and the retention policy."""

    def copy(self) -> SessionRecord:
        return SessionRecord(
            self.title,
            dict(self.labels),
            self.owner,
            self.status,
            self.update_time_ns,
            self.parent_seq,
            self.expire_time_ns,
            self.pinned,
        )

    def empty(self) -> bool:
        return not (
            self.title
            or self.labels
            or self.owner
            or self.status
            or self.expire_time_ns
            or self.pinned
        ) and (self.parent_seq is None)


# -- rules --------------------------------------------------------------------------------------


def _invalid(field_name: str, message: str) -> errors.InvalidSessionField:
    return errors.InvalidSessionField(message, field=field_name)


def check_label_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > MAX_LABEL_PREFIX or not _PREFIX.fullmatch(prefix)):
        raise _invalid(
            "labels",
            f"label key prefix {prefix[:64]!r} is not a DNS subdomain (lowercase letters, digits, "
            "'-' and '.', at most 253 characters)",
        )
    if not _NAME.fullmatch(name):
        raise _invalid(
            "labels",
            f"label key {key[:80]!r} is not valid: the name (after an optional 'prefix/') must be "
            "1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        )


def check_label_value(key: str, value: str) -> None:
    if value and not _NAME.fullmatch(value):
        raise _invalid(
            "labels",
            f"the value of label {key!r} is not valid: empty, or 1 to 63 letters, digits, '-', "
            "'_' or '.', starting and ending with a letter or digit",
        )


def check(record: SessionRecord) -> None:
    """Raise InvalidSessionField unless every person-set field follows its rule."""
    if len(record.title.encode()) > MAX_TITLE_BYTES or _CONTROL.search(record.title):
        raise _invalid(
            "title", f"a title is at most {MAX_TITLE_BYTES} bytes with no control characters"
        )
    if len(record.owner.encode()) > MAX_OWNER_BYTES or _CONTROL.search(record.owner):
        raise _invalid(
            "owner", f"an owner is at most {MAX_OWNER_BYTES} bytes with no control characters"
        )
    if record.status and not _NAME.fullmatch(record.status):
        raise _invalid(
            "status",
            "a status is empty or 1 to 63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit",
        )
    if len(record.labels) > MAX_LABELS:
        raise _invalid("labels", f"a session has at most {MAX_LABELS} labels")
    for key, value in record.labels.items():
        check_label_key(key)
        check_label_value(key, value)


# -- UpdateSession's field mask -----------------------------------------------------------------


def check_mask(paths: Sequence[str]) -> None:
    """Raise InvalidUpdateMask for a path UpdateSession cannot set."""
    for path in paths:
        if path == "*" or path in SETTABLE or path in RETENTION:
            continue
        if path.startswith("labels."):
            check_label_key(path[len("labels.") :])
            continue
        if path in OUTPUT_ONLY:
            raise errors.InvalidUpdateMask(
                f"update_mask names '{path}', which the server keeps (output only or "
                f"immutable); settable: {', '.join(SETTABLE + RETENTION)}, ttl, labels.KEY",
                path=path,
            )
        raise errors.InvalidUpdateMask(
            f"update_mask names '{path[:80]}', which is no Session field UpdateSession sets; "
            f"settable: {', '.join(SETTABLE + RETENTION)}, ttl, labels.KEY",
            path=path[:80],
        )


def apply_mask(
    current: SessionRecord,
    title: str,
    labels: Mapping[str, str],
    owner: str,
    status: str,
    paths: Sequence[str] | None,
    *,
    expire_time_ns: int = 0,
    pinned: bool = False,
) -> SessionRecord:
    """The record after an update: ``current`` with the fields ``paths`` names taken from the
    request (None: no mask given, so the settable fields the request fills). Checked whole;
    ``expire_time_ns`` has been checked by the caller (``retention.expire_at``)."""
    given: dict[str, object] = {
        "title": title,
        "labels": dict(labels),
        "owner": owner,
        "status": status,
        "expire_time": expire_time_ns,
        "pinned": pinned,
    }
    if paths is None or not paths:
        paths = [name for name in SETTABLE if given[name]]
    elif "*" in paths:
        paths = list(SETTABLE)
    check_mask(paths)
    updated = current.copy()
    for path in paths:
        if path == "labels":
            updated.labels = dict(labels)
        elif path.startswith("labels."):
            key = path[len("labels.") :]
            if key in labels:
                updated.labels[key] = labels[key]
            else:
                updated.labels.pop(key, None)
        elif path == "expire_time":
            updated.expire_time_ns = expire_time_ns
        else:
            setattr(updated, path, given[path])
    check(updated)
    return updated


# -- ListSessions' filter -----------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One comparison of a filter."""

    name: str
    """``labels``, ``owner``, ``status``, ``parent``, ``pinned``, ``update_time`` or
    ``expire_time``."""
    op: str
    """``=``, ``!=``, ``:*`` (has), ``>``, ``>=``, ``<``, ``<=``."""
    key: str = ""
    """The label key, for ``labels``."""
    value: str = ""
    time_ns: int = 0
    """For ``update_time`` and ``expire_time``: the value as ns since the epoch."""


@dataclass(frozen=True)
class Filter:
    """Terms joined by AND; no terms matches every session."""

    terms: tuple[Term, ...] = ()

    def matches(self, record: SessionRecord | None, parent_id: str, update_time_ns: int) -> bool:
        labels = {} if record is None else record.labels
        for term in self.terms:
            if term.name == "labels":
                have = labels.get(term.key)
                if term.op == ":*":
                    ok = have is not None
                elif term.op == "=":
                    ok = have == term.value
                else:
                    ok = have != term.value
            elif term.name == "update_time":
                ok = _compare(update_time_ns, term.op, term.time_ns)
            elif term.name == "expire_time":
                # a session that never expires has no expire_time: no comparison matches it
                expires = 0 if record is None else record.expire_time_ns
                ok = bool(expires) and _compare(expires, term.op, term.time_ns)
            elif term.name == "pinned":
                pinned = record is not None and record.pinned
                ok = (pinned == (term.value == "true")) == (term.op == "=")
            else:
                if term.name == "parent":
                    have_text = parent_id
                else:
                    have_text = "" if record is None else getattr(record, term.name)
                ok = (have_text == term.value) == (term.op == "=")
            if not ok:
                return False
        return True

    def first(self, name: str, op: str = "=") -> Term | None:
        """The first term on ``name`` with ``op``: an index the listing can walk instead."""
        return next((t for t in self.terms if t.name == name and t.op == op), None)

    def updated_after(self) -> int | None:
        """The lowest update time a match can have (ns), from ``update_time >``/``>=``; None
        when the filter sets none. A walk newest first stops once it falls below."""
        bounds = [t.time_ns for t in self.terms if t.name == "update_time" and t.op in (">", ">=")]
        return max(bounds) if bounds else None


def _compare(have: int, op: str, want: int) -> bool:
    if op == ">":
        return have > want
    if op == ">=":
        return have >= want
    if op == "<":
        return have < want
    return have <= want


_TERM = re.compile(
    r"\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<key>[^\s=!<>:\"]+))?\s*"
    r"(?P<op>!=|>=|<=|=|>|<|:)\s*"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|\*|[^\s\"()]+)\s*"
)
_AND = re.compile(r"AND(?:\s+|$)")
FIELDS = "labels.KEY, owner, status, parent, pinned, update_time, expire_time"


def parse_filter(text: str) -> Filter:
    """Parse a ListSessions filter, or raise InvalidFilter naming what is wrong and where."""
    if len(text) > MAX_FILTER_CHARS:
        raise _bad(f"a filter is at most {MAX_FILTER_CHARS} characters")
    if not text.strip():
        return Filter()
    terms: list[Term] = []
    at = 0
    while True:
        match = _TERM.match(text, at)
        if match is None:
            rest = text[at:].strip()
            if rest.startswith(("OR", "NOT", "(", "-")):
                raise _bad(f"only AND is supported (at character {at + 1}: {rest[:20]!r})")
            raise _bad(
                f'expected a term such as labels.team = "core" at character {at + 1}: '
                f"{rest[:30]!r}; filterable: {FIELDS}"
            )
        terms.append(_term(match))
        at = match.end()
        if at == len(text):
            return Filter(tuple(terms))
        joined = _AND.match(text, at)
        if joined is None:
            raise _bad(f"expected AND between terms at character {at + 1}: {text[at : at + 20]!r}")
        at = joined.end()


def _bad(message: str) -> errors.InvalidFilter:
    return errors.InvalidFilter(f"invalid filter: {message}")


def _term(match: re.Match[str]) -> Term:
    name, key, op, raw = match["name"], match["key"], match["op"], match["value"]
    value = _unquote(raw)
    if name == "labels":
        if key is None:
            raise _bad("name the label: labels.KEY")
        if op == ":":
            if raw != "*":
                raise _bad(f"labels.{key}: takes * only (has the label): labels.{key}:*")
            return Term("labels", ":*", key=key)
        if op not in ("=", "!="):
            raise _bad(f"labels.{key} compares with =, != or :* only, not {op}")
        return Term("labels", op, key=key, value=value)
    if key is not None:
        raise _bad(f"'{name}.{key}' is not filterable; filterable: {FIELDS}")
    if name in ("owner", "status", "parent"):
        if op not in ("=", "!="):
            raise _bad(f"{name} compares with = or != only, not {op}")
        return Term(name, op, value=value)
    if name == "pinned":
        if op not in ("=", "!=") or value not in ("true", "false"):
            raise _bad("pinned compares with = or != to true or false: pinned = true")
        return Term(name, op, value=value)
    if name in ("update_time", "expire_time"):
        if op not in (">", ">=", "<", "<="):
            raise _bad(f"{name} compares with >, >=, < or <=, not {op}")
        return Term(name, op, value=value, time_ns=_rfc3339_ns(name, value))
    raise _bad(f"unknown field '{name[:40]}'; filterable: {FIELDS}")


def _unquote(raw: str) -> str:
    if not raw.startswith('"'):
        return raw
    try:
        value: str = json.loads(raw)
    except ValueError:
        raise _bad(f"the string {raw[:40]} has a bad escape") from None
    return value


def _rfc3339_ns(name: str, text: str) -> int:
    stamp = Timestamp()
    try:
        stamp.FromJsonString(text)
    except ValueError:
        raise _bad(
            f"{name} wants an RFC 3339 time with a zone, such as "
            f'"2026-01-02T15:04:05Z", not {text[:40]!r}'
        ) from None
    nanos: int = stamp.ToNanoseconds()
    return nanos
