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


def test_a_second_signal_inside_a_ray_call_is_raised_at_the_safe_point_after_it():
    # a handler raising inside ray.wait comes out as a SystemError: it records, the poll raises
    from rlctl.utils.interrupts import in_native_call, safe_point

    with StopFlag() as stop:
        deliver(signal.SIGTERM)
        with in_native_call():
            deliver(signal.SIGINT)            # nothing raised inside the "Ray call"
        assert stop.signum == signal.SIGTERM
        with pytest.raises(StopNow, match="twice") as now:
            safe_point()
        assert now.value.exit_code == 130
        safe_point()                          # raised once
    safe_point()                              # no stop handler in force: nothing


def _starting(**kw):
    from rlctl.utils.interrupts import StartupStop

    exits, cleaned = [], []
    stop = StartupStop([cleaned.append], exit_fn=exits.append, **kw)
    return stop, exits, cleaned


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_starting_is_raised_at_the_next_safe_point_not_inside_the_handler(signum, code):
    # Ray's compiled code runs Python's signal handlers inside its own calls: an exception raised
    # there is a SystemError, so the handler only records; the start-up's safe point raises
    from rlctl.utils.interrupts import safe_point

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop, exits, cleaned = _starting(grace_s=30)
    with stop:
        deliver(signum)                          # nothing raised here
        with pytest.raises(Interrupted, match="while starting") as stopped:
            safe_point()
        safe_point()                             # raised once: the unwinding is not stopped again
    stop.disarm()
    assert stopped.value.exit_code == code and exits == [] and cleaned == []
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
    safe_point()                                 # no start-up in progress: nothing to raise


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_start_up_stuck_where_it_cannot_stop_is_ended_by_the_watchdog(signum, code):
    # the main thread blocked (in native code, say) never reaches a safe point: after the grace
    # period the watchdog runs the clean-ups and ends the process with the stop's exit code
    stop, exits, cleaned = _starting(grace_s=0.3)
    with stop:
        deliver(signum)
        time.sleep(1.5)                          # stuck: no safe point
    assert exits == [code] and [c.exit_code for c in cleaned] == [code]
    assert "did not stop in time" in cleaned[0].message


def test_a_second_signal_while_starting_ends_the_start_up_at_once():
    stop, exits, cleaned = _starting(grace_s=60)
    with stop:
        deliver(signal.SIGINT)
        deliver(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exits == [130]                        # the first signal names the stop


def test_a_stop_that_reached_its_safe_point_gets_the_clean_up_time_then_the_watchdog_ends_it():
    from rlctl.utils.interrupts import safe_point

    stop, exits, cleaned = _starting(grace_s=0.2, cleanup_s=0.6)
    with stop:
        deliver(signal.SIGTERM)
        with pytest.raises(Interrupted):
            safe_point()
    time.sleep(0.4)
    assert exits == []                           # still unwinding within cleanup_s
    time.sleep(1.0)
    assert exits == [143]                        # ray.shutdown hung: ended anyway
    stop.disarm()


def test_the_wait_before_a_restart_ends_at_a_stop_signal():
    from rlctl.controller.signals import startup_signals

    start = time.monotonic()
    with pytest.raises(Interrupted, match="while starting") as stopped:
        with startup_signals() as waiting:
            os.kill(os.getpid(), signal.SIGTERM)
            waiting.sleep(30)
    assert stopped.value.exit_code == 143 and time.monotonic() - start < 5


def test_an_error_after_a_signal_while_starting_is_the_stop_not_a_crash():
    """SIGTERM to the whole process group also reaches Ray's GCS, and ray.init, still starting, then
    fails to connect: that error, raised after the signal, ends the start-up as the stop (143)."""
    stop, exits, cleaned = _starting(grace_s=30)
    with pytest.raises(Interrupted, match="while starting") as stopped:
        with stop:
            deliver(signal.SIGTERM)
            raise RuntimeError("Failed to connect to GCS")
    stop.disarm()
    assert stopped.value.exit_code == 143 and isinstance(stopped.value.__context__, RuntimeError)
    assert exits == [] and cleaned == []
    with pytest.raises(RuntimeError):   # without a signal, an error stays what it is
        with _starting(grace_s=30)[0]:
            raise RuntimeError("a real failure")


STUCK_IN_NATIVE_CODE = """
import ctypes, sys
from rlctl.utils.interrupts import StartupStop

libc = ctypes.CDLL(None)
mutex, cond = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)   # zeroed: initialised

def cleanup(stop):
    print("cleaned up", stop.exit_code, flush=True)

with StartupStop([cleanup], grace_s=0.5):
    print("ready", flush=True)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_cond_wait(cond, mutex)   # blocked for good in native code, like Ray's GCS client in ray.init
print("never here", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_watchdog_hears_a_signal_while_the_main_thread_is_blocked_in_native_code(signum, code):
    """Python runs no handler while the main thread is stuck in native code; the watchdog hears the
    signal through the wakeup fd, runs the clean-ups and ends the process with one line."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", STUCK_IN_NATIVE_CODE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)   # into pthread_cond_wait
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert out.split("\n")[0] == f"cleaned up {code}" and "never here" not in out
    assert err.strip().count("\n") == 0 and "did not stop in time" in err, err
