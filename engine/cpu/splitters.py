"""Which listeners' clients send a reply sentence by sentence, learnt from the streams they open.

A client that splits a reply into sentences (vLLM-Omni's sentence mode, a framework's sentence
aggregator) opens each sentence as its own stream, the next while its listener still hears the one
before. The first stream of such a client's turn has a next sentence behind it, likely but not yet
opened, so its first audio is held as for text still to come (`CpuStream._hold_first`): let go alone,
"Well..." played out before "Let me check." was made (bench/results/overload_s19.md).

A listener not seen before (a new connection's first turn) is taken to split when most listeners
remembered *of its group* do: a tenant's clients are mostly alike. The group
(`StreamRequest.listener_group`, set by the gateway from the tenant) keeps one tenant's traffic from
changing another's first audio (`SplitterGroups`). Unheld, the first turns of splitting clients
were the `sentence`-mode gaps left up to the knee: "Dr." and "Well..." played out before the next
sentence was made (Piper at 2 and 4 replies/s: 4 of 657 replies gapped, 1 with the prior, and that
one by 0.3 ms; bench/results/overload_s20.md). The price is those first turns' wait, as for a known
splitter's: +0.2 s median at Piper's knee; nothing for clients sending whole replies, whose long
streams already cover the piece still to come (`auto` unchanged). On an engine just started nothing
is remembered, and nothing is held.

Bounded: the `limit` listeners seen most recently per group, and the `groups` groups seen most recently,
least recently seen forgotten first. Not thread-safe: the engine calls it under its listeners' lock.
"""

from __future__ import annotations

from collections import OrderedDict


class Splitters:
    """Per listener, whether its client was seen splitting (opening a stream while it still heard one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, bool] = OrderedDict()
        self._splitting = 0  # how many of `_seen` split

    def opened(self, listener: str, continues: bool) -> bool:
        """`listener` opened a stream, continuing audio it still hears or not (a turn's first). Whether a
        next stream is likely to open behind this one: a turn's first, of a listener that splits, or of
        one not seen before while most remembered split."""
        known = self._seen.pop(listener, None)
        likely = (2 * self._splitting > len(self._seen)) if known is None else known
        splits = bool(known) or continues
        self._splitting += splits - bool(known)
        self._seen[listener] = splits  # the most recently seen, last
        while len(self._seen) > self.limit:
            _, forgotten = self._seen.popitem(last=False)
            self._splitting -= forgotten
        return likely and not continues

    def splits(self, listener: str) -> bool | None:
        """Whether `listener` was seen splitting (None: not remembered)."""
        return self._seen.get(listener)

    def __len__(self) -> int:
        """How many listeners it remembers."""
        return len(self._seen)

    @property
    def splitting(self) -> int:
        """How many of the listeners it remembers split."""
        return self._splitting


class SplitterGroups:
    """One `Splitters` per listener group (a tenant), so no group's vote moves another's."""

    def __init__(self, per_group: int, groups: int) -> None:
        self.per_group, self.groups = per_group, groups
        self._groups: OrderedDict[str, Splitters] = OrderedDict()

    def opened(self, group: str | None, listener: str, continues: bool) -> bool:
        """`Splitters.opened` in `group`'s vote (None: the group of listeners named by no tenant)."""
        key = group or ""
        splitters = self._groups.pop(key, None) or Splitters(self.per_group)
        self._groups[key] = splitters  # the most recently seen, last
        while len(self._groups) > self.groups:
            self._groups.popitem(last=False)
        return splitters.opened(listener, continues)

    def splits(self, group: str | None, listener: str) -> bool | None:
        """Whether `listener` of `group` was seen splitting (None: not remembered)."""
        splitters = self._groups.get(group or "")
        return None if splitters is None else splitters.splits(listener)
