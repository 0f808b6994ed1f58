"""`Splitters`: which listeners send sentence by sentence, so their next turn's first stream is held."""

from __future__ import annotations

from engine.cpu.splitters import Splitters


def turn(memory: Splitters, listener: str, sentences: int) -> list[bool]:
    """A turn of `sentences` streams, each after the first opened while its listener hears the one before:
    what `opened` said of each."""
    return [memory.opened(listener, i > 0) for i in range(sentences)]


def test_a_listener_seen_splitting_has_its_next_turns_first_stream_held_and_only_that() -> None:
    memory = Splitters(8)
    assert turn(memory, "a", 2) == [False, False]  # not seen splitting before its turn
    assert turn(memory, "a", 3) == [True, False, False]  # its next turn's first: a next sentence is likely
    assert "a" in memory


def test_a_listener_not_seen_splitting_is_never_held_whatever_the_others_do() -> None:
    memory = Splitters(8)
    for other in "xyz":
        turn(memory, other, 2)
    assert turn(memory, "w", 1) == [False]  # new, though every other listener splits
    assert turn(memory, "w", 1) == [False]  # whole replies
    assert turn(memory, "w", 2) == [False, False]  # then it splits once
    assert turn(memory, "w", 1) == [True]


def test_the_memory_is_bounded_and_forgets_the_least_recently_seen_splitting_first() -> None:
    memory = Splitters(2)
    turn(memory, "a", 2)
    turn(memory, "b", 2)
    turn(memory, "a", 2)  # seen splitting again: the most recent
    turn(memory, "c", 2)  # the third: "b" is forgotten
    assert "b" not in memory and "a" in memory and "c" in memory
    assert turn(memory, "b", 1) == [False]
    for i in range(10_000):
        turn(memory, f"n{i}", 2)
    assert len(memory._seen) == 2
