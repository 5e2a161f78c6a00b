"""Run model-written programs safely: `rlctl.sandbox.run(code, stdin)` -> RunResult.

Namespaces through bubblewrap (no network, host files hidden, own PID space, unprivileged user)
plus resource limits (wall and CPU time, memory, processes, open files, file size, output size);
limits alone, announced loudly, where namespaces are unavailable. See docs/sandbox.md.
"""

from rlctl.sandbox.isolation import Isolation, detect
from rlctl.sandbox.run import LANGUAGES, STATUSES, Limits, RunResult, Session, run

__all__ = ["Isolation", "LANGUAGES", "Limits", "RunResult", "STATUSES", "Session", "detect", "run"]
