"""Deadline: a limit on each await of one task, with one timer for many awaits."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadline import Deadline


async def test_each_await_gets_its_whole_limit_and_one_past_it_times_out() -> None:
    deadline = Deadline(0.1)
    for _ in range(5):  # 0.35 s of awaits in all, each under its limit
        with deadline:
            await asyncio.sleep(0.07)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError), deadline:
        await asyncio.sleep(10)
    assert 0.09 <= loop.time() - t0 < 0.5
    with deadline:  # usable again afterwards, and the task is not left cancelled
        await asyncio.sleep(0.01)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    deadline.close()


async def test_between_awaits_it_does_not_fire_and_a_shorter_limit_takes_effect() -> None:
    deadline = Deadline(0.05)
    with deadline:
        await asyncio.sleep(0)
    await asyncio.sleep(0.15)  # idle past the limit: not an await it bounds
    deadline.seconds = 10.0
    with deadline:
        await asyncio.sleep(0.01)
    deadline.seconds = 0.05
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError), deadline:
        await asyncio.sleep(10)
    assert asyncio.get_running_loop().time() - t0 < 0.5
    deadline.close()


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    deadline = Deadline(5.0)

    async def waiter() -> None:
        with deadline:
            await asyncio.sleep(10)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline.close()


async def test_a_second_task_using_it_is_caught_per_await_in_debug_mode_and_else_where_it_expires() -> None:
    async def bind(deadline: Deadline) -> None:
        with deadline:
            await asyncio.sleep(0)

    async def await_under(deadline: Deadline, seconds: float) -> None:
        with deadline:
            await asyncio.sleep(seconds)

    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    try:
        checked = Deadline(10.0)
        await asyncio.create_task(bind(checked))
        with pytest.raises(AssertionError, match="one task"):
            await asyncio.create_task(await_under(checked, 0))
        checked.close()
    finally:
        loop.set_debug(False)
    # Outside debug mode an await that ends within its limit is not checked (the per-frame path); one that
    # expires is, as the cancel went to the bound task, not the one awaiting.
    deadline = Deadline(0.05)
    await asyncio.create_task(bind(deadline))
    await asyncio.create_task(await_under(deadline, 0))
    with pytest.raises(AssertionError, match="one task"):
        await asyncio.create_task(await_under(deadline, 0.3))
    deadline.close()
