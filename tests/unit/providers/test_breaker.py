"""The scorer's circuit breaker on a clock the test moves: it opens after enough refused
connects in a row, lets one probe through per delay while open, and closes on an answer."""

from __future__ import annotations

from service.providers.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_opens_after_the_threshold_of_refusals_in_a_row_only() -> None:
    breaker = Breaker(threshold=3, delay_s=5.0, clock=Clock())
    breaker.refused()
    breaker.refused()
    breaker.answered()  # an answer in between: not in a row
    breaker.refused()
    breaker.refused()
    assert (breaker.state, breaker.allows()) == ("closed", True)
    breaker.refused()
    assert (breaker.state, breaker.allows()) == ("open", False)


def test_while_open_one_probe_per_delay_goes_through_until_one_is_answered() -> None:
    clock = Clock()
    breaker = Breaker(threshold=1, delay_s=5.0, clock=clock)
    breaker.refused()
    clock.now += 4.9
    assert not breaker.allows()
    clock.now += 0.1
    assert [breaker.allows(), breaker.allows()] == [True, False]  # one probe
    breaker.refused()  # the probe was refused: another delay
    clock.now += 4.9
    assert not breaker.allows()
    clock.now += 0.1
    assert breaker.allows()
    clock.now += 5.0  # that probe timed out, neither refused nor answered: the next one goes
    assert breaker.allows()
    breaker.answered()
    assert (breaker.state, breaker.allows(), breaker.allows()) == ("closed", True, True)
