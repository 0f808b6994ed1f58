"""`Splitters`: which listeners send sentence by sentence, and the prior for a listener not seen yet."""

from __future__ import annotations

from engine.cpu.splitters import SplitterGroups, Splitters


def turn(memory: Splitters, listener: str, sentences: int) -> list[bool]:
    """A turn of `sentences` streams, each after the first opened while its listener hears the one before:
    what `opened` said of each."""
    return [memory.opened(listener, i > 0) for i in range(sentences)]


def test_a_listener_seen_splitting_has_its_next_turns_first_stream_held_and_only_that() -> None:
    memory = Splitters(8)
    assert turn(memory, "a", 2) == [False, False]  # nothing remembered: a new listener is not taken to split
    assert turn(memory, "a", 3) == [True, False, False]  # its next turn's first: a next sentence is likely
    assert memory.splits("a") is True


def test_a_listener_seen_sending_whole_replies_is_never_held() -> None:
    memory = Splitters(8)
    for other in "xyz":  # most listeners split
        turn(memory, other, 2)
    assert turn(memory, "w", 1) == [True]  # not seen before: taken to split, as most do
    assert turn(memory, "w", 1) == [False]  # now seen: whole replies
    assert memory.splits("w") is False
    assert turn(memory, "w", 2) == [False, False]  # then it splits once
    assert turn(memory, "w", 1) == [True]


def test_a_new_listener_is_taken_to_split_only_when_most_listeners_seen_do() -> None:
    memory = Splitters(8)
    turn(memory, "s", 2)
    turn(memory, "w", 1)
    assert memory.opened("new1", False) is False  # one of two: not most
    memory.opened("new1", True)  # it split after all: two of three now
    assert memory.opened("new2", False) is True


def test_the_memory_is_bounded_and_forgets_the_least_recently_seen_first() -> None:
    memory = Splitters(2)
    turn(memory, "a", 2)
    turn(memory, "b", 1)
    turn(memory, "a", 1)  # seen again: the most recent
    turn(memory, "c", 2)  # the third: "b" is forgotten
    assert memory.splits("b") is None and memory.splits("a") is True and memory.splits("c") is True
    assert len(memory) == 2 and memory.splitting == 2  # the count follows what is forgotten
    turn(memory, "d", 1)  # "a" forgotten, a splitter
    assert memory.splitting == 1 and memory.opened("e", False) is False  # "c" and "d": one of two splits
    for i in range(10_000):
        memory.opened(f"n{i}", i % 2 == 1)
    assert len(memory) == 2
    assert memory.splitting == sum(bool(memory.splits(f"n{i}")) for i in range(9_998, 10_000))


def test_one_tenants_splitting_clients_do_not_change_another_tenants_first_audio() -> None:
    groups = SplitterGroups(per_group=8, groups=4)
    for other in "xyz":  # tenant A's clients all split
        [groups.opened("A", other, i > 0) for i in range(2)]
    assert groups.opened("A", "new-a", False) is True  # A's newcomer is taken to split, as A's clients do
    assert groups.opened("B", "new-b", False) is False  # B has seen nothing: its newcomer is not held
    assert groups.splits("B", "x") is None  # and knows nothing of A's listeners


def test_listener_groups_are_bounded_least_recently_seen_forgotten_first() -> None:
    groups = SplitterGroups(per_group=8, groups=2)
    for group in ("A", "B", "C"):
        groups.opened(group, "l", True)
    assert groups.splits("A", "l") is None and groups.splits("C", "l") is True
