"""What a job, a node or a record says, made safe to show: every printer of the CLI passes text
through ``printable`` (ui's consoles, the tables, 'distrun logs'), so nothing a training job
prints can drive the terminal that shows it.

Escape sequences (CSI: colours, screen clears, cursor moves, concealment; OSC: clipboard writes,
window titles, hyperlinks; DCS, SOS, PM, APC; their 8-bit C1 forms) are removed. Any other
control character is shown escaped (``\\x07``), as are the Unicode controls that reorder or hide
text (bidirectional overrides and isolates). Newlines and tabs stay; a carriage return that does
not end a line becomes a newline, so a progress bar reads as lines instead of overwriting them.
Ordinary text and UTF-8 are untouched.
"""

from __future__ import annotations

import re

_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI ... final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"  # OSC, DCS, SOS, PM, APC ... ST
    r"|\x1b[ -/]*[0-~]"  # two-byte escapes (ESC c resets the terminal, ESC ( B ...)
)
# The start of a sequence cut off at the end of a chunk: held back until the rest arrives.
_UNFINISHED = re.compile(
    r"(?:(?:\x1b\[|\x9b)[0-?]*[ -/]*|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*\x1b?|\x1b[ -/]*)\Z")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
HOLD_MAX = 4096  # an unfinished sequence longer than this is no sequence: shown as it is


def _shown(m: re.Match[str]) -> str:
    ch = m.group()
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def printable(text: str) -> str:
    """``text`` with escape sequences removed and other control characters shown escaped."""
    if text.isprintable():
        return text  # the common case: nothing to do
    text = _SEQUENCE.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub(_shown, text)


class Stream:
    """``printable`` for text that arrives in pieces (a followed log): a sequence cut between
    two pieces is removed whole, never half shown."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, chunk: str) -> str:
        text = self.held + chunk
        self.held = ""
        m = _UNFINISHED.search(text)
        if m and len(text) - m.start() <= HOLD_MAX:
            text, self.held = text[:m.start()], text[m.start():]
        if text.endswith("\r"):  # the \n of a \r\n may be in the next piece
            text, self.held = text[:-1], "\r" + self.held
        return printable(text)

    def end(self) -> str:
        rest, self.held = self.held, ""
        return printable(rest)
