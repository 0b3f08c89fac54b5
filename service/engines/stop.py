"""Stop-string matching for streamed text, with hold-back.

Text that could be the start of a stop string is held back until it is known
not to be one, so a stop string is never partly streamed to the client.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add new text; return (text safe to emit, matched stop or None)."""
        if not self._stops:
            return text, None
        buf = self._held + text
        first: tuple[int, str] | None = None
        for stop in self._stops:
            at = buf.find(stop)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self._held = ""
            return buf[: first[0]], first[1]
        keep = 0
        for stop in self._stops:
            # Longest suffix of buf that is a proper prefix of this stop.
            for n in range(min(len(stop) - 1, len(buf)), 0, -1):
                if buf.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """At the end of the stream, release what was held back."""
        held, self._held = self._held, ""
        return held
