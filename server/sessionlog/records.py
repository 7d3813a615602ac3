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

from sessionlog import errors, fold

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

    def render(self) -> str:
        """The term in the grammar's canonical spelling, which ``parse_filter`` reads back as
        this same term: one space around the operator, the value double-quoted."""
        subject = f"labels.{self.key}" if self.name == "labels" else self.name
        if self.op == ":*":
            return f"{subject}:*"
        return f"{subject} {self.op} {json.dumps(self.value, ensure_ascii=False)}"


@dataclass(frozen=True)
class Filter:
    """Terms joined by AND; no terms matches every session."""

    terms: tuple[Term, ...] = ()

    def render(self) -> str:
        """The filter in canonical spelling (see ``Term.render``); "" for no terms."""
        return " AND ".join(term.render() for term in self.terms)

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


FIELDS = "labels.KEY, owner, status, parent, pinned, update_time, expire_time"
KEYWORDS = frozenset({"AND", "OR", "NOT"})
RESERVED = "=!<>:*()\"'\\"
"""The characters a bare value may not hold: the operators, the has-wildcard, parentheses,
quotes and the backslash. A value holding one is written as a double-quoted string."""

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_RE = re.compile(r"[A-Za-z0-9._/-]+")
_OP_RE = re.compile(r"!=|>=|<=|=|>|<|:")
_WORD_RE = re.compile(r"[^\s\x00-\x1f\x7f" + re.escape(RESERVED) + r"]+")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SPACE_RE = re.compile(r"\s*")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_LOOKALIKE_QUOTES = (
    "\u201c\u201d\u201e\u2018\u2019\u201a\u00ab\u00bb\u2039\u203a\uff02\uff07\u0060\u00b4"
)
"""Quote-like characters a bare value may not start or end with: a value pasted with them
(``owner = “ann”``) is a typo, not a name; written inside "..." they are taken."""
_ONLY_AND = "only AND is supported (not OR, NOT, '-' or parentheses)"
_QUOTE_IT = f"a value holding whitespace or any of {' '.join(RESERVED)} is written in double quotes"
_EQUALITY = ("=", "!=")
_ORDERING = (">", ">=", "<", "<=")
_OPS = {
    "labels": (*_EQUALITY, ":"),
    "owner": _EQUALITY,
    "status": _EQUALITY,
    "parent": _EQUALITY,
    "pinned": _EQUALITY,
    "update_time": _ORDERING,
    "expire_time": _ORDERING,
}
"""The operators each field compares with (``:`` is ``:*``, has)."""


def parse_filter(text: str) -> Filter:
    """Parse a ListSessions filter (also EraseSessions' and FollowSessions'), or raise
    InvalidFilter naming what is wrong and the character (1-based) where it is.

    The grammar, whole (whitespace may surround every token)::

        filter := "" | term ( AND term )*        blank: every session
        AND    := the word AND, with whitespace on both sides (OR, NOT, -, ( ) are refused)
        term   := labels.KEY ":" "*"             has the label
                | labels.KEY ( "=" | "!=" ) value
                | ( owner | status | parent ) ( "=" | "!=" ) value
                | pinned ( "=" | "!=" ) ( true | false )
                | ( update_time | expire_time ) ( ">" | ">=" | "<" | "<=" ) RFC 3339 time
        KEY    := a label key (``[prefix/]name``, the rule labels follow)
        value  := string | word
        string := a double-quoted JSON string ("", "a b", "say \\"hi\\"", "\\u00e9")
        word   := one or more characters, none of them whitespace, a control character or
                  one of = ! < > : * ( ) " ' \\ ; not AND, OR or NOT

    So a bare value is one plain word, and a value with an operator character in it is only
    read when quoted: ``owner ==ann`` and ``labels.team ==`` are refused, not read as a
    comparison with "=ann" or "=". A bare word in typographic quotes (``“ann”``) and a value
    no session can hold (a label value or status outside its rule, a parent that is no
    session id, an owner with a control character) are refused at the value too. Every
    token ends where whitespace, the end or (after a field or a key) an operator begins;
    anything else is refused.
    """
    if len(text) > MAX_FILTER_CHARS:
        raise _bad(
            MAX_FILTER_CHARS,
            f"a filter is at most {MAX_FILTER_CHARS} characters (this one has {len(text)})",
        )
    at = _skip_space(text, 0)
    if at == len(text):
        return Filter()
    terms: list[Term] = []
    while True:
        term, at = _parse_term(text, at)
        terms.append(term)
        spaced = _skip_space(text, at)
        if spaced == len(text):
            return Filter(tuple(terms))
        word = _NAME_RE.match(text, spaced)
        joiner = "" if word is None else word[0]
        if joiner == "OR":
            raise _bad(spaced, _ONLY_AND)
        if spaced == at or joiner != "AND":
            raise _bad(spaced, f"expected AND between terms, found {_show(text, spaced)}")
        after = spaced + len("AND")
        at = _skip_space(text, after)
        if at == len(text):
            raise _bad(at, "expected a term after AND, found the end of the filter")
        if at == after:
            raise _bad(after, f"expected whitespace after AND, found {_show(text, after)}")


def _parse_term(text: str, at: int) -> tuple[Term, int]:
    """The term starting at ``at`` (no whitespace there) and where it ends."""
    name, key, at = _parse_field(text, at)
    subject = f"labels.{key}" if key else name
    at = _skip_space(text, at)
    op_match = _OP_RE.match(text, at)
    if op_match is None:
        raise _bad(
            at,
            f"expected an operator after {subject} ({_spell(_OPS[name])}), found {_show(text, at)}",
        )
    op, op_at = op_match[0], at
    if op not in _OPS[name]:
        raise _bad(op_at, f"{subject} compares with {_spell(_OPS[name])} only, not {op}")
    at = _skip_space(text, op_match.end())
    if op == ":":
        if not text.startswith("*", at):
            raise _bad(at, f"{subject}: takes * only (has the label): {subject}:*")
        return Term("labels", ":*", key=key), _end_of_token(text, at + 1)
    value, value_at, at = _parse_value(text, at, f"{subject} {op}")
    _check_holdable(name, key, subject, value, value_at)
    if key:
        return Term("labels", op, key=key, value=value), at
    if name == "pinned" and value not in ("true", "false"):
        raise _bad(value_at, "pinned compares with = or != to true or false: pinned = true")
    if name in ("update_time", "expire_time"):
        return Term(name, op, value=value, time_ns=_rfc3339_ns(name, value, value_at)), at
    return Term(name, op, value=value), at


def _parse_field(text: str, at: int) -> tuple[str, str, int]:
    """The field a term starting at ``at`` compares, its label key ("" but for labels) and
    where they end."""
    word = _NAME_RE.match(text, at)
    if word is None or word[0] in KEYWORDS:
        if text.startswith(("OR", "NOT", "-", "(", ")"), at):
            raise _bad(at, _ONLY_AND)
        raise _bad(
            at,
            f'expected a term such as labels.team = "core", found {_show(text, at)}; '
            f"filterable: {FIELDS}",
        )
    name, at = word[0], word.end()
    if not text.startswith(".", at):
        if name == "labels":
            raise _bad(at, "name the label: labels.KEY")
        if name not in _OPS:
            raise _bad(word.start(), f"unknown field '{name[:40]}'; filterable: {FIELDS}")
        return name, "", at
    found = _KEY_RE.match(text, at + 1)
    if name != "labels":
        shown = name + "." + ("" if found is None else found[0])
        raise _bad(word.start(), f"'{shown[:60]}' is not filterable; filterable: {FIELDS}")
    if found is None:
        raise _bad(at + 1, f"name the label after 'labels.', found {_show(text, at + 1)}")
    try:
        check_label_key(found[0])
    except errors.InvalidSessionField as error:
        raise _bad(at + 1, error.message) from None
    return name, found[0], found.end()


def _check_holdable(name: str, key: str, subject: str, value: str, at: int) -> None:
    """Refuse, at the value, a value no session can hold (a label value or status outside
    their rule, a parent that is no session id, an owner with a control character): ``=``
    would match nothing and ``!=`` everything, so it is a typo (``“core”``, ``core,infra``)
    that an erasure must not take for a filter that matched nothing."""
    try:
        if key:
            check_label_value(key, value)
        elif name == "status" and value and not _NAME.fullmatch(value):
            raise _invalid(
                "status",
                "a status is empty or 1 to 63 letters, digits, '-', '_' or "
                "'.', starting and ending with a letter or digit",
            )
        elif name == "parent" and value:
            fold.check_session_id(value)
        elif name == "owner" and (
            len(value.encode("utf-8", "surrogatepass")) > MAX_OWNER_BYTES or _CONTROL.search(value)
        ):
            raise _invalid(
                "owner", f"an owner is at most {MAX_OWNER_BYTES} bytes with no control characters"
            )
    except (errors.InvalidSessionField, errors.InvalidSessionId) as error:
        raise _bad(at, f"no session can have {subject} {value[:40]!r}: {error.message}") from None


def _spell(ops: tuple[str, ...]) -> str:
    named = [":*" if op == ":" else op for op in ops]
    return f"{', '.join(named[:-1])} or {named[-1]}"


def _parse_value(text: str, at: int, after: str) -> tuple[str, int, int]:
    """The value starting at ``at``, where it starts and where it ends."""
    if at == len(text):
        raise _bad(at, f"expected a value after '{after}', found the end of the filter")
    if text[at] == '"':
        found = _STRING_RE.match(text, at)
        if found is None:
            raise _bad(at, "this string has no closing double quote")
        try:
            value: str = json.loads(found[0])
        except ValueError:
            raise _bad(
                at,
                "this string has a bad escape or a control character (write \\n, \\t, "
                '\\", \\\\ or \\uXXXX)',
            ) from None
        if _SURROGATE_RE.search(value):  # a \ud800 escape alone: no stored text holds one
            raise _bad(at, "this string has a lone surrogate (\\uD800 to \\uDFFF unpaired)")
        return value, at, _end_of_token(text, found.end())
    found = _WORD_RE.match(text, at)
    if found is None:
        raise _bad(
            at,
            f"expected a value after '{after}', found {_show(text, at)}; {_QUOTE_IT}",
        )
    if found[0] in KEYWORDS:
        raise _bad(at, f'{found[0]} is a keyword: write the value "{found[0]}" in double quotes')
    end = _end_of_token(text, found.end())
    if found[0][0] in _LOOKALIKE_QUOTES or found[0][-1] in _LOOKALIKE_QUOTES:
        raise _bad(
            at,
            f'a value in typographic quotes: quote it with " (or write {found[0]!r} '
            'inside "..." if the quotes are part of it)',
        )
    return found[0], at, end


def _end_of_token(text: str, at: int) -> int:
    """``at``, once sure a token ending there is followed by whitespace or the end."""
    if at < len(text) and not text[at].isspace():
        raise _bad(at, f"unexpected {_show(text, at)} after a value; {_QUOTE_IT}")
    return at


def _skip_space(text: str, at: int) -> int:
    found = _SPACE_RE.match(text, at)
    return at if found is None else found.end()


def _show(text: str, at: int) -> str:
    return "the end of the filter" if at >= len(text) else repr(text[at : at + 20])


def _bad(at: int, message: str) -> errors.InvalidFilter:
    """``at``: the 0-based index of the problem; the message counts from 1, as editors do."""
    return errors.InvalidFilter(f"invalid filter at character {at + 1}: {message}", position=at + 1)


def _rfc3339_ns(name: str, text: str, at: int) -> int:
    stamp = Timestamp()
    try:
        stamp.FromJsonString(text)
    except ValueError:
        raise _bad(
            at,
            f"{name} wants an RFC 3339 time with a zone, such as "
            f'"2026-01-02T15:04:05Z", not {text[:40]!r}',
        ) from None
    nanos: int = stamp.ToNanoseconds()
    return nanos
