"""A request's reads under one deadline (rlctl.api.http): a slow client cannot hold a thread past it."""

from __future__ import annotations

import io
import time


class DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by what is left of the handler's read deadline.

    A per-recv timeout alone never fires for a client sending one byte a second; recomputing it
    from a deadline before every recv does. Past the deadline the read raises TimeoutError."""

    def __init__(self, handler):
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        handler = self.handler
        if handler.deadline is not None:
            left = handler.deadline - time.monotonic()
            if left <= 0:
                handler.expired = True
                raise TimeoutError("the client did not send its request in time")
            handler.connection.settimeout(left)
        try:
            got = handler.connection.recv_into(buffer)
        except TimeoutError:
            handler.expired = handler.deadline is not None
            raise
        handler.received += got
        return got
