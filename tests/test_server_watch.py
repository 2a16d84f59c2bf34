"""The watch on a run's Prefect server tells a server that is gone from one that is busy: real
HTTP servers on this host, one that answers its health checks slowly and a port nobody listens on."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flows.local_server import ServerWatch


class SlowHealth(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(1.0)  # a server busy with a large nightly: it answers, later than a check waits
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


def watch(url: str, **kw) -> tuple[ServerWatch, list[float]]:
    lost_at: list[float] = []
    return ServerWatch(url, lambda: lost_at.append(time.monotonic()), interval_s=0.2, **kw), lost_at


def test_a_busy_server_is_given_time_before_it_is_called_lost():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowHealth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        w, lost_at = watch(f"http://127.0.0.1:{server.server_address[1]}/api", busy_s=5.0)
        started = time.monotonic()
        with w:
            time.sleep(2.5)  # more than three unanswered checks of 0.2 s
            assert not w.lost and not lost_at
            while not lost_at and time.monotonic() - started < 15:
                time.sleep(0.1)
        assert w.lost and len(lost_at) == 1 and lost_at[0] - started >= 5.0
    finally:
        server.shutdown()


def test_a_port_nobody_listens_on_is_lost_within_a_few_checks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w, lost_at = watch(f"http://127.0.0.1:{port}/api", busy_s=60.0)
    started = time.monotonic()
    with w:
        while not lost_at and time.monotonic() - started < 10:
            time.sleep(0.05)
    assert w.lost and lost_at[0] - started < 3.0
