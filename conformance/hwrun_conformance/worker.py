"""The worker process that runs cases, and the client that keeps one alive.

A case may kill its process (a kernel that segfaults or calls ``os._exit``) or never return.
So cases run in a separate Python process: it loads torch and the plugins once and then answers
one JSON request per line; the client turns a dead worker into CRASH and a late answer into
TIMEOUT (killing the worker's process group), then starts a fresh worker for the next case.

Protocol: the worker reads requests on stdin and writes answers on a private copy of its
original stdout; everything the kernels print goes to stderr, which the client keeps in a file
and quotes when the worker dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import IO, Any

STARTUP_TIMEOUT_S = 180.0  # torch + plugin import on a loaded 2-core CI machine


@dataclass(frozen=True)
class Reply:
    """The worker's answer (``kind`` "verdict"), or what happened instead ("crash", "timeout")."""

    kind: str
    verdict: dict[str, Any] | None = None
    reason: str = ""
    seconds: float = 0.0


class _Worker:
    """One worker process: its pipes, the file its stderr goes to, unread output."""

    def __init__(self) -> None:
        # Kept after the process dies, to quote its last words; closed with the worker.
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hwrun_conformance.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            start_new_session=True,  # its own process group: a timeout kills kernels' children too
        )
        self.buffer = b""
        self.ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own meanwhile
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.release()

    def release(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a broken pipe may refuse the final flush
                    pipe.close()
        self.stderr.close()

    def stderr_tail(self, limit: int = 400) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return text[-limit:].replace("\n", " | ")


class WorkerClient:
    """Runs requests in a worker process, replacing it after it crashes or is killed.

    A spare worker is kept loading in the background, so a crash or a timeout costs the next
    case no torch import (seconds on a small CI machine).
    """

    def __init__(self, startup_timeout: float = STARTUP_TIMEOUT_S):
        self.startup_timeout = startup_timeout
        self._active: _Worker | None = None
        self._spare: _Worker | None = None

    def start(self) -> None:
        """Make sure a worker is starting (it loads torch while the caller plans)."""
        if self._active is None or not self._active.alive():
            if self._active is not None:
                self._active.release()
            self._active, self._spare = self._spare or _Worker(), None

    def run(self, request: dict[str, Any], timeout: float) -> Reply:
        self.start()
        worker = self._active
        assert worker is not None and worker.proc.stdin is not None
        if not worker.ready:
            hello = self._read(worker, self.startup_timeout)
            if hello.kind != "verdict":
                return Reply(hello.kind, reason=f"worker did not start: {hello.reason}")
            worker.ready = True
        if self._spare is None:
            # Started only once the active worker is up, so the two imports never compete.
            self._spare = _Worker()
        started = time.monotonic()
        try:
            worker.proc.stdin.write((json.dumps(request) + "\n").encode())
            worker.proc.stdin.flush()
        except BrokenPipeError:
            reply = self._crashed(worker)
        else:
            reply = self._read(worker, timeout)
        return Reply(reply.kind, reply.verdict, reply.reason, time.monotonic() - started)

    def close(self, kill: bool = False) -> None:
        """End the workers; ``kill`` also kills the active one at once (an interrupted run:
        it may be in the middle of a case) instead of letting it finish and exit."""
        if self._spare is not None:
            self._spare.kill()  # it has no work; it may still be importing torch
        if self._active is not None:
            if kill:
                self._active.kill()
            else:
                self._stop(self._active)
        self._active = self._spare = None

    @staticmethod
    def _stop(worker: _Worker) -> None:
        """End an idle worker by closing its input; kill it if it does not exit."""
        if worker.alive():
            assert worker.proc.stdin is not None
            with contextlib.suppress(OSError):
                worker.proc.stdin.close()  # end of input ends the worker's loop
            try:
                worker.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                return
        worker.release()

    def _read(self, worker: _Worker, timeout: float) -> Reply:
        assert worker.proc.stdout is not None
        fd = worker.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in worker.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                worker.kill()
                self._active = None
                return Reply("timeout", reason=f"no answer within {timeout:g} s; worker killed")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return self._crashed(worker)
            worker.buffer += chunk
        line, worker.buffer = worker.buffer.split(b"\n", 1)
        return Reply("verdict", json.loads(line))

    def _crashed(self, worker: _Worker) -> Reply:
        code = worker.proc.wait()
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        tail = worker.stderr_tail()
        worker.release()
        self._active = None
        return Reply("crash", reason=f"worker {how}" + (f"; stderr: {tail}" if tail else ""))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _serve() -> None:
    """Worker main loop: load everything once, then answer requests until stdin closes."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # kernels' prints must not corrupt the protocol
    sys.stdout = sys.stderr
    from hwrun_conformance.execute import Verdict
    from hwrun_conformance.session import CaseSession

    session = CaseSession()
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            verdict = session.run(**json.loads(line))
        except Exception as exc:  # a suite bug (unknown case, impl gone): say so, keep serving
            verdict = Verdict(False, "suite_error", reason=f"worker error: {exc!r}")
        answers.write(json.dumps(asdict(verdict)) + "\n")


if __name__ == "__main__":
    _serve()
