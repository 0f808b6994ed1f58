"""Engines in child processes behind the same `Engine`/`Stream` contract: the gateway's loop shares no GIL with them.

`start_engine(spec, **options)` starts `load_engine(spec, **options)` in a supervised child (spawn start
method) and returns a `ProcessEngine` at once; `await engine.ready()` waits for it to be warm. A child
that dies ends its open streams with an `error` (`engine_restarting`) and is restarted with back-off.
"""

from engine.process.client import RESTARTING, ProcessEngine, start_engine
from engine.process.stream import ProcessStream
from engine.process.verdicts import UNAVAILABLE

__all__ = ["RESTARTING", "UNAVAILABLE", "ProcessEngine", "ProcessStream", "start_engine"]
