"""Processes and ports, read from /proc, for the tests that start and stop launchers and servers."""
import os
import queue
import re
import socket
import threading
import time

import pytest


def process_tree(pid):
    """``pid`` and every process descended from it, from /proc (Linux)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parent = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, pending = [], [pid]
    while pending:
        tree.append(pending.pop())
        pending.extend(children.get(tree[-1], []))
    return tree


def process_state(pid):
    """The state of process ``pid`` in /proc/PID/stat (R running, S sleeping, T stopped, Z a zombie: exited, not
    reaped yet), None once it is gone."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid):
    """Whether process ``pid`` runs (a zombie does not)."""
    return process_state(pid) not in (None, 'Z')


def free_port():
    """A TCP port on 127.0.0.1 that no one listens on now (the OS picks it), so that parallel runs differ."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _forward_lines(stream, lines):
    for line in stream:
        lines.put(line)
    lines.put(None)  # end of output


def read_until(process, pattern, timeout):
    """The lines ``process`` writes to its stdout (a text pipe) up to the first that matches ``pattern``.

    A process that exits first, or does not print such a line within ``timeout`` seconds, is killed and
    fails the test with the end of its output: a read loop must not hang the suite.
    """
    lines = queue.Queue()
    threading.Thread(target=_forward_lines, args=(process.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout
    log = []
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            process.kill()
            pytest.fail(f'no line matching {pattern!r} within {timeout} s; last output:\n' + ''.join(log[-50:]))
        if line is None:
            process.wait()
            pytest.fail(f'the process exited ({process.returncode}) before a line matching {pattern!r}; last '
                        'output:\n' + ''.join(log[-50:]))
        log.append(line)
        if re.search(pattern, line):
            return log
