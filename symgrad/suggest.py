"""Did-you-mean suggestions for misspelled names, shared by the CLI and the API."""

from __future__ import annotations

import difflib


def closest(word: str, candidates) -> str | None:
    """The candidate closest to word (case, dashes and underscores aside), or None."""
    def norm(w: str) -> str:
        return w.lstrip("-").lower().replace("_", "-")
    by_norm = {norm(c): c for c in candidates}
    if norm(word) in by_norm:
        return by_norm[norm(word)]
    close = difflib.get_close_matches(norm(word), list(by_norm), n=1, cutoff=0.6)
    return by_norm[close[0]] if close else None


def unexpected(caller: str, kind: str, names, expected) -> TypeError:
    """The one-line TypeError for keyword names a call does not take (the first in sorted order),
    with the expected name closest to it and every expected name."""
    word = sorted(names)[0]
    close = closest(word, expected)
    hint = f"; did you mean {close!r}?" if close and close != word else ""
    return TypeError(f"{caller}: unexpected {kind} {word!r}{hint} ({caller} takes "
                     f"{', '.join(expected) or 'no parameters'})")
