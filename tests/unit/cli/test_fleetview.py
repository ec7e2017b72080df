"""scrape(): a service that dies mid-answer is unhealthy, never an exception (the live view,
`rlfleet status` and the chaos test's watcher scrape services that are being killed)."""

from __future__ import annotations

import socket
import threading

from rlfleet.cli.fleetview import scrape


def _serve_once(reply: bytes) -> tuple[str, threading.Thread]:
    """A one-connection HTTP 'server' on a free port that answers ``reply`` and closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)

    def run() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", t


def test_an_answer_cut_short_is_unhealthy_not_an_error() -> None:
    # headers promise 83 bytes, none follow: http.client raises IncompleteRead (not an OSError)
    url, t = _serve_once(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 83\r\n\r\n")
    got = scrape(url, timeout_s=5.0)
    t.join(5)
    assert not got.healthy
    assert got.samples == {}


def test_a_whole_answer_is_read() -> None:
    body = b'{"ok": true}'
    url, t = _serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    got = scrape(url, health_only=True, timeout_s=5.0)
    t.join(5)
    assert got.healthy and got.health == {"ok": True}
