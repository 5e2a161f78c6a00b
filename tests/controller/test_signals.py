"""Stop signals during training: the first asks for a stop at the next safe point (with the final
checkpoint), a second one of either kind stops at once (StopNow), with the right exit code."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlctl.controller.signals import StopFlag, StopNow
from rlctl.errors import Interrupted


def deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)   # Python runs the handler between bytecodes of the main thread


@pytest.mark.parametrize("first,second,code", [(signal.SIGTERM, signal.SIGTERM, 143),
                                               (signal.SIGTERM, signal.SIGINT, 130),
                                               (signal.SIGINT, signal.SIGINT, 130)])
def test_first_signal_waits_for_the_safe_point_second_stops_now(first, second, code):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopFlag() as stop:
        deliver(first)                        # nothing raised: the step goes on
        assert stop.signum == first
        with pytest.raises(Interrupted, match="at a safe point") as safe:
            stop.check()
        assert safe.value.exit_code == (143 if first == signal.SIGTERM else 130)
        with pytest.raises(StopNow, match="twice: the step in progress was abandoned") as now:
            deliver(second)
        assert now.value.exit_code == code
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_starting_is_not_swallowed_by_code_that_retries_on_exception(signum, code):
    # code in Ray's start-up catches `except Exception`; the stop must get through such a loop
    # instead of being taken for an ordinary error
    from rlctl.controller.signals import startup_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + 10
    with pytest.raises(Interrupted, match="while starting") as stopped:
        with startup_signals():
            sent = False
            while time.monotonic() < deadline:   # a retry loop like Ray's
                try:
                    if not sent:
                        sent = True
                        os.kill(os.getpid(), signum)
                    time.sleep(0.01)
                except Exception:
                    continue
    assert stopped.value.exit_code == code and time.monotonic() < deadline
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
