"""The circuit breaker and the write-behind queue on their own: a ping we control stands in for Redis
(these are the state machines; tests/sessions/test_stalled_redis.py runs them against a real,
SIGSTOPped redis-server)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from sessions import CircuitBreaker, SessionNotFound, StateUnavailable, StoreBusy, WriteBehind


class FakeRedis:
    """Answers at once, hangs (a stopped server) or refuses, as the test says."""

    def __init__(self) -> None:
        self.mode = "up"
        self.pings = 0

    async def op(self, value: object = "ok") -> object:
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "refuse":
            raise aioredis.ConnectionError("Connection refused")
        return value

    def ping(self) -> asyncio.Future[object] | object:
        self.pings += 1
        return self.op("PONG")


def breaker(redis: FakeRedis, **kw: object) -> CircuitBreaker:
    opts: dict[str, object] = {"op_timeout_s": 0.2, "heartbeat_s": 0.1, "probe_backoff_s": (0.05, 0.2)} | kw
    return CircuitBreaker(redis.ping, **opts)  # type: ignore[arg-type]


async def test_one_timeout_opens_it_then_calls_fail_at_once() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    assert await b.call(redis.op()) == "ok"
    redis.mode = "hang"
    t0 = time.monotonic()
    with pytest.raises(StateUnavailable):
        await b.call(redis.op())
    assert 0.15 < time.monotonic() - t0 < 1.0  # the op timeout, once
    assert b.state in ("open", "half_open") and b.trips == 1
    t0 = time.monotonic()
    for _ in range(100):
        with pytest.raises(StateUnavailable) as exc:
            await b.call(redis.op())
    assert time.monotonic() - t0 < 0.1  # nobody else waits
    assert "127.0.0.1" not in str(exc.value) and exc.value.code == "state_unavailable"
    await b.close()


async def test_a_timeout_while_redis_answers_others_is_busy_not_unavailable() -> None:
    """A call whose answer comes too late while Redis answered other calls (a busy event loop, not a
    stalled Redis) waits out its grace, then is refused as capacity (`StoreBusy`) and leaves the circuit
    closed."""
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None, busy_grace_s=0.3)

    async def late() -> object:
        await asyncio.sleep(3600)  # this one call hangs; Redis itself answers the others
        return "never"

    slow = asyncio.create_task(b.call(late()))
    await asyncio.sleep(0.05)
    assert await b.call(redis.op()) == "ok"  # answered after the slow call began
    with pytest.raises(StoreBusy):
        await asyncio.wait_for(slow, 2)
    assert b.is_closed and b.trips == 0
    redis.mode = "hang"  # nobody answered since: a timeout is Redis's again
    with pytest.raises(StateUnavailable):
        await b.call(redis.op())
    assert b.trips == 1
    await b.close()


async def test_a_timeout_at_a_stalls_onset_is_unavailable_though_an_earlier_call_was_answered_after_it_began() -> None:
    """Redis stalls just after answering a call sent before this one: that answer came after this call
    began, but says nothing of this call's fate. Read as "Redis answered others", a call stalled at Redis
    was refused as this replica's business (a canary's segment refused, tests/gateway/test_stalled_store.py)."""
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None, busy_grace_s=0.3)

    async def answered_late() -> object:
        await asyncio.sleep(0.05)  # sent first, answered after the next call was sent
        return "ok"

    earlier = asyncio.create_task(b.call(answered_late()))
    await asyncio.sleep(0.01)
    redis.mode = "hang"  # the stall: this call's answer never comes
    with pytest.raises(StateUnavailable):
        await b.call(redis.op())
    assert await earlier == "ok" and b.trips == 1
    await b.close()


async def test_an_answer_slowed_by_a_busy_loop_is_awaited_within_the_grace() -> None:
    """The loop held past the op timeout (a burst of connects on a busy replica): the timeout fires late,
    and the call gets a fresh op timeout instead of a refusal — its answer, on its way, is returned."""
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None, op_timeout_s=0.1, loop_late_s=0.1)

    async def answer_after(delay: float) -> str:
        await asyncio.sleep(delay)
        return "late but there"

    call = asyncio.create_task(b.call(answer_after(0.15)))
    await asyncio.sleep(0)  # the call is under way, its timeout armed
    time.sleep(0.35)  # the loop is held: the timeout fires 0.25 s late, after the answer was due
    assert await asyncio.wait_for(call, 2) == "late but there"
    assert b.is_closed and b.trips == 0
    await b.close()


async def test_a_redis_silent_for_a_whole_fresh_timeout_after_a_late_loop_is_unavailable() -> None:
    """The loop's lateness buys the call one more op timeout on Redis's clock, not a pass: a Redis that
    stays silent through it, on time, opens the circuit as any stall does."""
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None, op_timeout_s=0.1, loop_late_s=0.1)
    redis.mode = "hang"
    t0 = time.monotonic()
    call = asyncio.create_task(b.call(redis.op()))
    await asyncio.sleep(0)
    time.sleep(0.35)
    with pytest.raises(StateUnavailable):
        await asyncio.wait_for(call, 2)
    assert time.monotonic() - t0 < 0.35 + 0.1 + 0.3  # one fresh timeout after the late one, not the grace
    assert b.trips == 1
    await b.close()


async def test_a_busy_loop_past_the_grace_is_refused_as_capacity() -> None:
    """A loop late at every judgement (the replica is saturated): after the grace the call is refused
    with `StoreBusy` and the circuit stays closed."""
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None, op_timeout_s=0.05, loop_late_s=0.02, busy_grace_s=0.2)
    redis.mode = "hang"
    call = asyncio.create_task(b.call(redis.op()))
    t0 = time.monotonic()
    while not call.done() and time.monotonic() - t0 < 2:
        time.sleep(0.08)  # every timer fires late
        await asyncio.sleep(0)
    with pytest.raises(StoreBusy):
        await asyncio.wait_for(call, 2)
    assert b.is_closed and b.trips == 0
    await b.close()


async def test_connection_errors_open_it_after_consecutive_failures() -> None:
    redis = FakeRedis()
    b = breaker(redis, failures=3, heartbeat_s=None)
    redis.mode = "refuse"
    for _ in range(2):
        with pytest.raises(StateUnavailable):
            await b.call(redis.op())
        assert b.is_closed
    redis.mode = "up"
    await b.call(redis.op())  # a success resets the count
    redis.mode = "refuse"
    for _ in range(3):
        with pytest.raises(StateUnavailable):
            await b.call(redis.op())
    assert not b.is_closed
    await b.close()


async def test_other_errors_pass_through_and_do_not_open_it() -> None:
    redis = FakeRedis()
    b = breaker(redis, failures=1, heartbeat_s=None)

    async def script_error() -> None:
        raise aioredis.ResponseError("ERR in script")

    with pytest.raises(aioredis.ResponseError):
        await b.call(script_error())
    assert b.is_closed
    await b.close()


async def test_heartbeat_notices_a_stall_without_traffic_and_probes_close_it_with_backoff() -> None:
    redis = FakeRedis()
    b = breaker(redis)
    closed: list[float] = []
    b.on_close.append(lambda: closed.append(time.monotonic()))
    await b.call(redis.op())  # starts the watcher
    redis.mode = "hang"
    t0 = time.monotonic()
    while b.is_closed:
        assert time.monotonic() - t0 < 1.0, "a stall must be noticed within heartbeat + op timeout"
        await asyncio.sleep(0.01)
    pings = redis.pings
    await asyncio.sleep(1.2)
    # Probes back off: 0.05 + 0.1 + 0.2 + 0.2 … (each waits out its 0.2 s timeout) — a handful, not 1.2/0.05.
    assert 2 <= redis.pings - pings <= 5
    assert not closed
    redis.mode = "up"
    assert await b.wait_closed(1.0)
    assert len(closed) == 1 and b.latency_ms is not None
    await b.close()


async def test_a_failing_hook_does_not_stop_the_others() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    ran: list[str] = []

    def bad() -> None:
        raise RuntimeError("bug")

    b.on_close += [bad, lambda: ran.append("replay")]
    b.trip("test")
    assert await b.wait_closed(1.0)
    assert ran == ["replay"]
    await b.close()


# -- write-behind ---------------------------------------------------------------------------------------


def queue(b: CircuitBreaker, **kw: object) -> WriteBehind:
    return WriteBehind(b, **kw)  # type: ignore[arg-type]


async def test_writes_replay_in_order_once_redis_answers_again() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    wb = queue(b)
    done: list[int] = []

    def write(i: int) -> object:
        async def run() -> None:
            await b.call(redis.op())
            done.append(i)

        return run

    redis.mode = "hang"
    futures = [wb.put("k", f"write {i}", write(i)) for i in range(20)]
    await asyncio.sleep(0.5)  # the first write trips the breaker; the rest wait behind it
    assert done == [] and len(wb) == 20
    redis.mode = "up"
    assert await wb.flush(2.0)
    assert done == list(range(20))
    assert all(f.result() for f in futures) and wb.dropped == 0
    await wb.close()
    await b.close()


async def test_the_queue_is_bounded_by_entries_and_drops_the_oldest() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    redis.mode = "hang"
    b.trip("test")  # open: nothing is written until a probe is answered
    wb = queue(b, max_entries=5)
    done: list[int] = []

    def write(i: int) -> object:
        async def run() -> None:
            done.append(i)

        return run

    futures = [wb.put("k", "w", write(i)) for i in range(8)]
    assert len(wb) == 5 and wb.dropped == 3
    assert [f.done() and not f.result() for f in futures[:3]] == [True] * 3
    redis.mode = "up"
    assert await b.wait_closed(2.0)
    assert await wb.flush(1.0)
    assert done == [3, 4, 5, 6, 7]
    await wb.close()
    await b.close()


async def test_the_queue_is_bounded_by_bytes() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    redis.mode = "hang"
    b.trip("test")
    wb = queue(b, max_bytes=1000)

    async def run() -> None:
        pass

    for _ in range(10):
        wb.put("k", "w", run, size=300)
    assert len(wb) == 3 and wb.bytes == 900 and wb.dropped == 7
    await wb.close()
    await b.close()


async def test_a_refused_write_is_dropped_and_the_rest_go_on() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    wb = queue(b)
    done: list[str] = []

    async def gone() -> None:
        raise SessionNotFound("session x not found")

    async def ok() -> None:
        done.append("ok")

    refused = wb.put("a", "record", gone)
    wb.put("b", "record", ok)
    assert await wb.flush(1.0)
    assert refused.result() is False and done == ["ok"] and wb.dropped == 1
    await wb.close()
    await b.close()


async def test_settled_waits_for_one_keys_writes_only() -> None:
    redis = FakeRedis()
    b = breaker(redis, heartbeat_s=None)
    wb = queue(b)
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    wb.put("a", "slow", slow)
    assert await wb.settled("other", 0.01)  # nothing queued for it: at once
    assert not await wb.settled("a", 0.05)  # bounded
    gate.set()
    assert await wb.settled("a", 1.0)
    await wb.close()
    await b.close()
