"""The model thread's hand-off to the event loop (runner.serve.outbox), in process, on a clock the
test sets: what goes at once, what waits, what is joined, and what never is."""

from __future__ import annotations

from runner.serve.outbox import Outbox

MS = 0.001


class Answer:
    """A generation as the outbox sees one: a key, held weakly."""


def texts(sent: list[tuple[object, object]]) -> list[object]:
    return [part for _, part in sent]


def opened(box: Outbox, generation: object, now: float) -> None:
    """The generation's first part out (it always goes at once), at `now`."""
    box.post(generation, ("answer", "Once"))
    assert texts(box.take(now)) == [("answer", "Once")]


def test_a_first_part_and_an_end_go_at_once_the_pieces_between_wait_and_are_joined() -> None:
    box, answer = Outbox(16 * MS), Answer()
    opened(box, answer, 0.0)
    box.post(answer, ("answer", " upon"))
    assert box.take(6 * MS) == []  # held: it will have waited 6 ms + a 6 ms step, within 16
    box.post(answer, ("answer", " a"))
    assert box.take(12 * MS) == []  # 6 + 6 = 12 ms, still within
    box.post(answer, ("answer", " time"))
    assert texts(box.take(18 * MS)) == [("answer", " upon a time")]  # 12 + 6 = 18 ms: past 16
    box.post(answer, ("answer", ","))
    box.post(answer, None)  # the end: out at once, with what waited
    assert texts(box.take(19 * MS)) == [("answer", ","), None]
    assert len(box) == 0


def test_a_slow_step_holds_nothing() -> None:
    """Steps longer than the interval: every step's parts go as they come."""
    box, answer = Outbox(16 * MS), Answer()
    opened(box, answer, 0.0)
    for i in range(1, 4):
        box.post(answer, ("answer", f" {i}"))
        assert texts(box.take(i * 20 * MS)) == [("answer", f" {i}")]


def test_interval_0_and_force_hand_over_every_part() -> None:
    every, answer = Outbox(0.0), Answer()
    opened(every, answer, 0.0)
    every.post(answer, ("answer", " upon"))
    assert texts(every.take(1 * MS)) == [("answer", " upon")]
    held = Outbox(16 * MS)
    opened(held, answer, 0.0)
    held.post(answer, ("answer", " upon"))
    assert held.take(1 * MS) == []
    assert texts(held.take(2 * MS, force=True)) == [("answer", " upon")]  # a prompt's step comes next


def test_scored_tokens_and_other_kinds_are_never_joined() -> None:
    """A logprobs entry rides on the chunk of the text it made: a stream that asked for them keeps a
    chunk a token; reasoning and answer stay apart, in order."""
    box, answer = Outbox(16 * MS), Answer()
    opened(box, answer, 0.0)
    parts = [
        ("logprobs", [1]),
        ("answer", " upon"),
        ("logprobs", [2]),
        ("answer", " a"),
        ("reasoning", "hm"),
        ("reasoning", "m"),
        ("answer", " time"),
    ]
    for part in parts:
        box.post(answer, part)
    assert box.take(1 * MS) == []
    assert texts(box.take(20 * MS)) == [*parts[:4], ("reasoning", "hmm"), ("answer", " time")]


def test_answers_interleaved_are_each_joined_and_a_new_answer_goes_at_once() -> None:
    box, a, b = Outbox(16 * MS), Answer(), Answer()
    opened(box, a, 0.0)
    box.post(a, ("answer", " one"))
    assert box.take(1 * MS) == []
    box.post(a, ("answer", " two"))
    box.post(b, ("answer", "Hello"))  # b's first part: out now, with what a held
    box.post(a, ("answer", " three"))
    sent = box.take(2 * MS)
    assert sent == [(a, ("answer", " one two three")), (b, ("answer", "Hello"))]
    box.post(b, ("answer", " there"))
    assert box.take(3 * MS) == []  # b's later pieces wait as a's do
