"""Socket checks shared by the HTTP server's tests."""

from __future__ import annotations

import socket


def peek_closed(s: socket.socket) -> bool:
    """Whether the server closed ``s``, without waiting: a connection the server still
    holds open has nothing to read, and the peek leaves any bytes where they are."""
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        s.setblocking(True)
