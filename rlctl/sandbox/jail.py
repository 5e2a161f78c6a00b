"""The command line that starts one sandboxed program: bwrap's namespaces, then the limits.

Inside bwrap the program sees the host's system folders read-only (/usr, /lib*, /bin, a few
files of /etc), its own working directory read-write at /sandbox, a small private /tmp, a fresh
/proc and /dev, loopback-only networking, and no other host file (no home, no project, no keys).
The limits are set by a tiny launcher inside the namespaces, after bwrap made them: a process
limit set before the user namespace exists would count every process of the caller's uid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

JAIL_DIR = "/sandbox"
TMP_SIZE_BYTES = 64 << 20
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/alternatives", "/etc/localtime", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf")

# Runs inside the sandbox as `python -S -E -c LAUNCHER LIMITS_JSON ARGV...`: set the rlimits, then
# become the program. Kept to the standard library's resource and os modules.
LAUNCHER = (
    "import json,os,resource,sys\n"
    "for name,(soft,hard) in json.loads(sys.argv[1]).items():\n"
    "    resource.setrlimit(getattr(resource,name),(soft,hard))\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


def bwrap_args(python: str, workdir: Path, *, rw: bool = True) -> list[str]:
    """bwrap options for a jail with `workdir` mounted at /sandbox (read-only when rw is False)."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_SIZE_BYTES), "--tmpfs", "/tmp"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    prefix = _interpreter_prefix(python)
    if prefix is not None:
        args += ["--ro-bind", prefix, prefix]
    args += ["--bind" if rw else "--ro-bind", str(workdir), JAIL_DIR, "--chdir", JAIL_DIR]
    args += ["--remount-ro", "/"]  # bwrap's root is a tmpfs: unbounded memory if left writable
    return args


def _interpreter_prefix(python: str) -> str | None:
    """The folder of an interpreter outside the system folders (a pyenv or conda install)."""
    real = Path(os.path.realpath(python))
    if any(str(real).startswith(d + "/") for d in SYSTEM_DIRS):
        return None
    return str(real.parent.parent)  # <prefix>/bin/python3 -> <prefix>


def launcher(python: str, rlimits: dict[str, tuple[int, int]], argv: list[str]) -> list[str]:
    """`argv` wrapped by the launcher that applies `rlimits` (resource.RLIMIT_* names) first."""
    return [python, "-S", "-E", "-c", LAUNCHER, json.dumps(rlimits), *argv]


def clean_env(home: str) -> dict[str, str]:
    """The whole environment a program gets: nothing of the caller's (tokens, keys, paths)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
