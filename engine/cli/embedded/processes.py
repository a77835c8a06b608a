"""Process helpers shared by the embedded servers: free ports, dying with the parent, waiting for exit."""

from __future__ import annotations

import ctypes
import signal
import socket

import psutil


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG: if the process that started the broker is killed
    # (even with SIGKILL) the kernel sends the broker SIGTERM, so no stray
    # broker outlives `chronoq up` or a test session.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def wait_for_exit(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True
