"""A chunked body may have at most ``max(MIN_CHUNKS, max_body_bytes // MIN_CHUNK)`` chunks
(issue 32, item 2): aiohttp calls into Python per chunk, so a body of tiny chunks under
the byte limit cost the loop a request's worth of CPU per few KiB. Past the bound it is
refused with 413 in ``error_response``'s shape and its connection closed unparsed; bodies
of few large chunks, and a body at the limit in ``MIN_CHUNK``-byte chunks, are served."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from coeffd.base.http import MIN_CHUNK, MIN_CHUNKS, HttpServer, Request, Response, Router

LIMIT = 64 * 1024


def _router() -> Router:
    router = Router()

    def echo(req: Request) -> Response:
        return Response(200, req.body, content_type="application/octet-stream")

    router.add_route("POST", "/echo", echo)
    return router


def _status(status: int, reason: str, _ctype: str) -> Response:
    return Response(status, b"status: " + reason.encode(), content_type="application/x-protobuf")


@pytest.fixture
def refusals() -> list[tuple[int, str]]:
    return []


@pytest.fixture
def server(request: pytest.FixtureRequest, refusals: list[tuple[int, str]]) -> Iterator[HttpServer]:
    s = HttpServer(
        "127.0.0.1",
        0,
        _router(),
        max_body_bytes=getattr(request, "param", LIMIT),
        on_refused=lambda status, reason, _client: refusals.append((status, reason)),
        error_response=_status,
    )
    s.start()
    yield s
    s.stop()


def _connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


HEAD = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunks(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


def _read_response(s: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one Content-Length response."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = s.recv(65536)
        assert piece, f"closed before a response: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        piece = s.recv(65536)
        assert piece
        body += piece
    return head, body[:length]


def _read_to_eof(s: socket.socket) -> bytes:
    out = b""
    while piece := s.recv(65536):
        out += piece
    return out


def test_the_bound_follows_the_body_limit(server: HttpServer) -> None:
    assert server.max_body_chunks == max(MIN_CHUNKS, LIMIT // MIN_CHUNK) == 64
    big = HttpServer("127.0.0.1", 0, max_body_bytes=16 << 20)
    try:
        assert big.max_body_chunks == (16 << 20) // MIN_CHUNK
    finally:
        big.stop()


def test_tiny_chunks_under_the_byte_limit_are_refused_and_the_connection_closed(
    server: HttpServer, refusals: list[tuple[int, str]], caplog: pytest.LogCaptureFixture
) -> None:
    """2,000 two-byte chunks (4 KB, far under the 64 KiB limit) and no last chunk: the
    answer comes without the rest of the body, and the server closes the connection
    (without aiohttp reading on after the answer: it would log the stream's error)."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    with _connect(server) as s:
        s.sendall(HEAD + b"2\r\nxx\r\n" * 2000)
        head, body = _read_response(s)
        assert head.startswith(b"HTTP/1.1 413 ")
        assert b"connection: close" in head.lower()
        assert b"application/x-protobuf" in head  # error_response's shape
        assert body == b"status: body in more than 64 chunks"
        assert _read_to_eof(s) == b""  # closed by the server, the body never ended
    assert refusals == [(413, "body in more than 64 chunks")]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("server", [32 << 20], indirect=True)
def test_a_chunk_flood_is_not_read_to_its_end(
    server: HttpServer, refusals: list[tuple[int, str]]
) -> None:
    """30 MiB in 2-byte chunks (105 MiB on the wire, under the 32 MiB body limit): the
    sender is cut off long before its end — the server stopped reading, not drained it.
    The bound (32,768) is past what aiohttp parses before the body is read (it pauses at
    16,385 chunks), so here the count that trips it is the one made as data arrives."""
    piece = b"2\r\nxx\r\n" * 16384
    total = (30 << 20) // (2 * 16384)
    sent = 0
    error: list[BaseException] = []

    def flood(s: socket.socket) -> None:
        nonlocal sent
        try:
            s.sendall(HEAD)
            for _ in range(total):
                s.sendall(piece)
                sent += 1
        except OSError as e:
            error.append(e)

    with _connect(server) as s:
        s.settimeout(60)
        sender = threading.Thread(target=flood, args=(s,), daemon=True)
        sender.start()
        sender.join(90)
        assert not sender.is_alive()
        assert error, "the whole flood was read"
        assert sent * len(piece) < 48 << 20, sent  # socket buffers, not the body
    assert refusals == [(413, f"body in more than {(32 << 20) // MIN_CHUNK} chunks")]


def test_a_body_of_a_few_large_chunks_is_served(
    server: HttpServer, refusals: list[tuple[int, str]]
) -> None:
    pieces = [bytes([i]) * 16384 for i in range(3)] + [b"end"]
    with _connect(server) as s:
        s.sendall(HEAD + _chunks(pieces) + b"0\r\n\r\n")
        head, body = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == b"".join(pieces)
    assert refusals == []


def test_bodies_at_the_bound_are_served_one_after_another_on_a_connection(
    server: HttpServer, refusals: list[tuple[int, str]]
) -> None:
    """A body at the byte limit in ``MIN_CHUNK``-byte chunks is exactly at the bound; the
    count starts again with each request on a kept-alive connection."""
    pieces = [bytes([i % 251]) * MIN_CHUNK for i in range(LIMIT // MIN_CHUNK)]
    with _connect(server) as s:
        for _ in range(3):
            s.sendall(HEAD + _chunks(pieces) + b"0\r\n\r\n")
            head, body = _read_response(s)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert body == b"".join(pieces)
    assert refusals == []
