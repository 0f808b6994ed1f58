"""Keep the cyclic garbage collector's full passes off the serving path.

A full (generation-2) collection walks every object the collector tracks, holding the GIL: every
thread, the event loop included, stops for it. What a server holds for its whole life (the imports,
an engine's modules and tensors' Python wrappers) is most of that heap, and it is walked again each
time the heap grows by a quarter: a pass of a fraction of a second with a model loaded
(bench/results/gc_freeze.md, `python bench/gc_pause.py`). `gc.freeze()` moves every object tracked now
into a permanent generation that no pass walks, so later passes cost only what was made since.

The price: an object frozen that later becomes garbage in a reference cycle is never freed. So a
freeze comes when what is alive is what will stay: before serving starts (after a collection, which
then stalls nobody), and after a model is loaded into a process that is already serving (without
one: a full pass then would stall the sessions; of what they hold at that moment, what later turns
into cyclic garbage stays, once per load, which an operator asks for).
"""

from __future__ import annotations

import gc


def settle(*, collect: bool) -> None:
    """Freeze what is alive now out of the collector's full passes; `collect` first when nothing is
    being served (a full pass then stalls nobody, and no garbage is frozen)."""
    if collect:
        gc.collect()
    gc.freeze()
