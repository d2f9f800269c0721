"""File names as the audit shows them: escaped, unambiguous, one line.

A name on storage may hold anything but ``/`` and NUL: rich markup (``[bold]x[/bold]``),
terminal escape sequences, newlines, bytes that are not UTF-8 (Python gives them as lone
surrogates, ``surrogateescape``). :func:`shown` maps a name to text that holds none of
these and from which the name comes back exactly (:func:`unshown`):

* ``\\`` becomes ``\\\\``;
* a byte that is not UTF-8 (surrogate U+DC80..U+DCFF) becomes ``\\xNN`` (the byte);
* a space, a control character and every character outside printable ASCII becomes
  ``\\xNN`` (below U+0080; ``\\x80``..``\\xff`` are only ever raw bytes), ``\\uNNNN``
  or ``\\UNNNNNNNN``.

Outside ASCII nothing is printed as itself (issue 32, finding 8): ``café`` written NFC
(``e`` with acute, U+00E9) and NFD (``e`` then a combining acute, U+0301) are two names
that render alike, as are a Latin ``a`` and a Cyrillic ``а``, fullwidth letters, or a name
with a zero-width joiner; only an alphabet with no two look-alike characters keeps two
names that differ in bytes from printing the same, and printable ASCII is one. The names
this store writes are escaped into a safe ASCII alphabet (R3), so only names it did not
write show escapes.

Rich markup is not interpreted where the audit prints a name (``markup=False`` or
``rich.markup.escape``). The deletion log (JSON) holds the exact name: the
``surrogateescape`` string (JSON's ``\\udcNN`` escapes are its undecodable bytes) and, for
a name that is not UTF-8, ``path_hex``, its bytes in hex.
"""

from __future__ import annotations

import re


def shown(name: str, *, spaces: bool = False) -> str:
    """``spaces``: keep spaces (for messages, not names)."""
    out: list[str] = []
    for ch in name:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x80 and ch.isprintable() and (spaces or ch != " "):
            out.append(ch)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


_ESC = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def unshown(text: str) -> str:
    """The name :func:`shown` gave ``text`` for (surrogates for bytes over 0x7f that were
    not UTF-8: a name that was not UTF-8 shows them as ``\\x80``..``\\xff``)."""

    def back(m: re.Match[str]) -> str:
        e = m.group(1)
        if e == "\\":
            return "\\"
        o = int(e[1:], 16)
        if e[0] == "x" and o >= 0x80:
            return chr(0xDC00 + o)
        return chr(o)

    return _ESC.sub(back, text)


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def exact_fields(path: str) -> dict[str, str]:
    """The JSON fields that name ``path`` exactly in the deletion log."""
    doc = {"path": path, "shown": shown(path)}
    if not is_utf8(path):
        doc["path_hex"] = path.encode("utf-8", "surrogateescape").hex()
    return doc
