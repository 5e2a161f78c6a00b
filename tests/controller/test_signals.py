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
