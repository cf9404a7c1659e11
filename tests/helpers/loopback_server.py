"""A loopback HTTP server for the tests of checkpoints loaded from a URL: it answers a bounded number of requests
and stops by itself."""
import contextlib
import functools
import http.server
import threading
import time


class QuietFileHandler(http.server.SimpleHTTPRequestHandler):

    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def serving(directory, max_requests=8, timeout=120):
    """The files of ``directory`` served at http://127.0.0.1:PORT/ (yields that URL) by a thread that answers
    at most ``max_requests`` requests and stops by itself after ``timeout`` seconds, or when the block ends."""
    server = http.server.HTTPServer(('127.0.0.1', 0), functools.partial(QuietFileHandler,
                                                                        directory=str(directory)))
    server.timeout = 0.2  # handle_request returns after this without a request, so the loop sees the stop
    stop = threading.Event()
    deadline = time.monotonic() + timeout

    def answer():
        answered = 0
        while answered < max_requests and not stop.is_set() and time.monotonic() < deadline:
            before = server.handled_requests
            server.handle_request()
            answered += server.handled_requests - before

    server.handled_requests = 0
    original_finish = server.finish_request

    def finish_request(request, client_address):
        server.handled_requests += 1
        original_finish(request, client_address)

    server.finish_request = finish_request
    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}'
    finally:
        stop.set()
        thread.join(timeout=10)
        server.server_close()
