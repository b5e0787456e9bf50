"""The lookup chain alone (store.chain): its levels asked in order, each hit or miss
counted exactly once and by the level that found it, a failing level a miss.

The end-to-end tests (test_tier_hits, test_prefetch, test_quick_keys, ...) drive it
through real compiles; these pin its contract with levels that record what they are
asked, so that a change to the walk shows here first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from artifactstore.store.chain import LEVELS, Chain, Found, Missed, Request

ORDER = ("first", "second", "third")


@dataclass
class Level:
    """A level that answers `answer` (a Found is built for it; "raise" raises)."""

    name: str
    answer: Any = None  # None, "hit", "raise", or a Missed
    usable: bool = True  # what `unusable` answers: ask the next level
    asked: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)  # shared by levels: who was asked, in turn
    counted: list[Found | Missed] = field(default_factory=list)

    def peek(self, request: Request) -> Found | Missed | None:
        self.asked.append(request.key)
        self.trace.append(self.name)
        if self.answer == "raise":
            raise OSError(f"{self.name} is down")
        if self.answer == "hit":
            return Found(entry=self.name, payload=self.name.encode())
        return self.answer  # type: ignore[no-any-return]

    def count(self, request: Request, outcome: Found | Missed) -> None:
        self.counted.append(outcome)

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool:
        return self.usable


def chain(*levels: Level) -> Chain:
    return Chain(levels, order=ORDER)


def request() -> Request:
    return Request("k" * 64, "f" * 64)


@pytest.mark.parametrize("answering", ORDER)
def test_each_level_answers_and_counts_once(answering: str) -> None:
    levels = [Level(name, "hit" if name == answering else None) for name in ORDER]
    found = chain(*levels).get(request())
    assert found is not None and found.entry == answering and found.source.name == answering
    assert found.payload == answering.encode() and found.request is not None
    for level in levels:
        assert level.counted == ([found] if level.name == answering else [])
    below = ORDER[ORDER.index(answering) + 1 :]
    assert all(level.asked == [] for level in levels if level.name in below)


def test_levels_are_asked_in_the_chains_order_whatever_order_they_are_added() -> None:
    asked: list[str] = []
    first, third = Level("first", trace=asked), Level("third", trace=asked)
    second = Level("second", Missed("misses"), trace=asked)
    walk = Chain([third, first], order=ORDER)
    walk.add(second)
    assert [s.name for s in walk.sources] == list(ORDER)
    assert walk.get(request()) is None
    assert asked == list(ORDER)
    assert second.counted == [Missed("misses")] and first.counted == third.counted == []


def test_the_sessions_levels_have_their_places() -> None:
    """What the session and the load ahead register is in LEVELS (else `add` refuses)."""
    assert LEVELS == ("ahead", "tier", "quick", "store")
    with pytest.raises(ValueError, match="not a level"):
        Chain([Level("elsewhere")])


def test_a_replaced_level_is_asked_once() -> None:
    old, new = Level("second", "hit"), Level("second", "hit")
    walk = chain(Level("first"), old)
    walk.add(new)
    assert walk.get(request()) is not None
    assert old.asked == [] and new.asked == ["k" * 64] and len(new.counted) == 1
    walk.remove("second")
    assert [s.name for s in walk.sources] == ["first"]


def test_each_miss_counts_once_where_it_was_found() -> None:
    levels = [Level(name, Missed(f"{name} miss")) for name in ORDER]
    assert chain(*levels).get(request()) is None
    assert [level.counted for level in levels] == [[Missed(f"{n} miss")] for n in ORDER]


def test_a_final_miss_ends_the_lookup() -> None:
    second, third = Level("second", Missed("quick", final=True)), Level("third", "hit")
    walk = chain(Level("first"), second, third)
    assert walk.get(request()) is None
    assert second.counted == [Missed("quick", final=True)] and third.asked == []
    assert walk.peek(request()) is None and third.asked == []


def test_a_failing_level_is_a_miss_and_the_next_answers() -> None:
    broken, below = Level("first", "raise"), Level("second", "hit")
    found = chain(broken, below).get(request())
    assert found is not None and found.source is below
    assert broken.counted == [] and below.counted == [found]


def test_peek_counts_nothing_and_claim_counts_once() -> None:
    missing, holder = Level("first", Missed("misses")), Level("second", "hit")
    walk = chain(missing, holder)
    found = walk.peek(request())
    assert found is not None and found.source is holder
    assert missing.counted == holder.counted == []
    Chain.claim(found)
    assert holder.counted == [found] and missing.counted == []


def test_names_asks_only_those_levels() -> None:
    first, second = Level("first", "hit"), Level("second", "hit")
    found = chain(first, second).get(request(), names=("second",))
    assert found is not None and found.source is second and first.asked == []


def test_load_turns_the_payload_into_the_value() -> None:
    found = chain(Level("first", "hit")).get(request(), lambda payload: payload.decode().upper())
    assert found is not None and found.value == "FIRST" and not found.unloadable


def fails(payload: bytes) -> Any:
    raise ValueError("does not deserialize")


def test_an_unloadable_hit_asks_the_next_level_when_the_level_says_so() -> None:
    bad, good = Level("first", "hit"), Level("second", "hit")
    loads = iter([fails, lambda payload: "loaded"])
    found = chain(bad, good).get(request(), lambda payload: next(loads)(payload))
    assert found is not None and found.source is good and found.value == "loaded"
    assert bad.counted == [] and good.counted == [found]


def test_an_unloadable_hit_that_ends_the_lookup_is_none() -> None:
    bad, good = Level("first", "hit", usable=False), Level("second", "hit")
    assert chain(bad, good).get(request(), fails) is None
    assert good.asked == [] and bad.counted == [] and good.counted == []
