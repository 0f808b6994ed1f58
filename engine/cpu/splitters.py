"""Which listeners' clients send a reply sentence by sentence, learnt from the streams they open.

A client that splits a reply into sentences (vLLM-Omni's sentence mode, a framework's sentence
aggregator) opens each sentence as its own stream, the next while its listener still hears the one
before. The first stream of such a client's next turn has a next sentence behind it, likely but not
yet opened, so its first audio is held as for text still to come (`CpuStream._hold_first`): let go
alone, "Well..." played out before "I guess that could work." was made (bench/results/overload_s19.md).

A listener not seen splitting (a new connection's first turn, or a client sending whole replies) is
not held so. Taking a new listener to split when most listeners seen did was tried: in `sentence` mode
at 1 reply/s it held English first sentences up to the hold's 2 s cap (+0.4 s mean audible first
audio) for one 0.13 s gap less in 110 replies (bench/results/overload_s20.md).

Bounded: the `limit` splitting listeners seen most recently, least recently seen forgotten first. Not
thread-safe: the engine calls it under its listeners' lock.
"""

from __future__ import annotations

from collections import OrderedDict


class Splitters:
    """The listeners seen opening a stream while they still heard an earlier one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, None] = OrderedDict()

    def opened(self, listener: str, continues: bool) -> bool:
        """`listener` opened a stream, continuing audio it still hears or not (a turn's first). Whether a
        next stream is likely to open behind this one: a turn's first, of a listener seen splitting."""
        if not continues:
            return listener in self._seen
        self._seen[listener] = None
        self._seen.move_to_end(listener)  # the most recently seen, last
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return False

    def __contains__(self, listener: str) -> bool:
        return listener in self._seen
