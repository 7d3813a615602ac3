"""Text the CLI prints for people, from data it did not write.

A stored message may hold control characters (NUL, ESC and the terminal sequences it starts, a
carriage return that writes over the line) or bidirectional formatting characters (U+202E
turns what follows around; the isolates and marks reorder it). Printed raw, they let a session's
content change what its reader sees. The human output shows each as an escape, ``\\u202e``; a
newline and a tab stay, as a message's own layout. ``--json`` output is never passed through
here: it stays exact.
"""

from __future__ import annotations

import re

_SHOWN = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 and C1 controls and DEL, but \t and \n
    r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional marks, embeddings, isolates
    r"\u2028\u2029]"  # line and paragraph separators
)


def escaped(text: str) -> str:
    """``text`` with every control and bidirectional formatting character (but \\t and \\n)
    shown as ``\\uXXXX``."""
    return _SHOWN.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
