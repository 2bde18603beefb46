"""A peer that lives in another Python, driven one generation at a time: JSON lines on its stdin and stdout.

A peer's script (vllm_cpu.py, openvino_genai_peer.py) runs with its own venv's Python (bench/measure/peers/envs.py) and
imports this file as a sibling (`import peer_worker`): nothing here imports specbench, so it loads there too. The
suite (bench/measure/peers/runtimes.py) starts the script with `--worker`, and `PeerWorker` sends it one request
per generation, so its engines take their turn in the same rotation as specbench's own points, on the same cores,
with their models loaded once (not timed).

The protocol, one JSON object per line:
- the worker, once its engines are loaded: {"ready": [engine names], "versions": {package: version}}
- the suite: {"engine": name, "ids": [prompt token ids], "max_tokens": N}
- the worker: {"tokens": [new ids], "seconds": s, "ttft_s": s or null, ...the engine's own figures}
  or {"error": "one line"}; EOF on stdin ends it.
The worker times each generation itself (its own clock around its own call), so the pipe is not in the time.
Anything the engine prints goes to stderr, which the suite keeps in a log file named in any error.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# name -> (ids, max_tokens) -> (new token ids, seconds to the first token or None, extra figures)
Engine = Callable[[list[int], int], tuple[list[int], Any, dict]]


def take_stdout() -> IO[str]:
    """The protocol's stream: a copy of this process's stdout, which from here on goes to stderr, so whatever
    the engines print while they load or run (Python's print, C libraries' printf, loggers) stays off the
    protocol. A worker calls it first, before it loads anything."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def serve(engines: dict[str, Engine], versions: dict[str, str], stdin: IO[str] | None = None,
          stdout: IO[str] | None = None) -> int:
    """The worker's side: answer requests until stdin closes, on `stdout` (take_stdout's stream; by default
    taken here)."""
    stdin = stdin or sys.stdin
    out = stdout or take_stdout()
    out.write(json.dumps({"ready": list(engines), "versions": versions}) + "\n")
    out.flush()
    for line in stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            engine = engines[request["engine"]]
            start = time.perf_counter()
            tokens, ttft, extra = engine([int(i) for i in request["ids"]], int(request["max_tokens"]))
            reply = {"tokens": [int(t) for t in tokens], "seconds": time.perf_counter() - start, "ttft_s": ttft, **extra}
        except KeyError as e:
            reply = {"error": f"the request lacks {e} or names an engine this worker has not loaded ({', '.join(engines)})"}
        except Exception as e:  # one generation's failure is the suite's to report; the worker stays up
            reply = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


class WorkerError(RuntimeError):
    """A worker that could not start, died, or answered with an error (main side)."""


class PeerWorker:
    """The suite's side: start `command` (the peer's Python running its script with --worker), wait for its
    ready line, then `generate` one request at a time."""

    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 900, reply_timeout_s: float = 900):
        self.name, self.log_path, self.reply_timeout_s = name, log_path, reply_timeout_s
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        # its own process group: paused, resumed and stopped whole (vLLM runs its engine in child processes)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                        text=True, env=env, bufsize=1, start_new_session=True)
        assert self.process.stdin is not None and self.process.stdout is not None  # both PIPEs
        self._stdin, self._stdout = self.process.stdin, self.process.stdout
        self.paused = False
        ready = self._read(ready_timeout_s, "to load its engines")
        if "ready" not in ready:
            self.close()
            raise WorkerError(f"peer {name} did not start: {ready.get('error', ready)} (its log: {log_path})")
        self.engines: list[str] = list(ready["ready"])
        self.versions: dict[str, str] = dict(ready.get("versions", {}))

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:  # gone: the next read says how
            pass

    def pause(self) -> None:
        """Stop the worker's whole process group (SIGSTOP) while other engines run: an idle engine that polls
        (vLLM's engine core took half a core of 2 waiting here) takes nothing from them."""
        if not self.paused and self.process.poll() is None:
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self._signal(signal.SIGCONT)
            self.paused = False

    def _read(self, timeout_s: float, doing: str) -> dict:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self._stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            self.close()
            raise WorkerError(f"peer {self.name} took more than {timeout_s:g} s {doing}: killed (its log: {self.log_path})")
        if not found or not found[0]:
            code = self.process.wait()
            raise WorkerError(f"peer {self.name} exited with {code} {doing}: {_last_line(self.log_path)} "
                              f"(its log: {self.log_path})")
        try:
            return json.loads(found[0])
        except json.JSONDecodeError:
            raise WorkerError(f"peer {self.name} wrote a line that is not JSON: {found[0][:120]!r} (its log: "
                              f"{self.log_path})") from None

    def generate(self, engine: str, ids: list[int], max_tokens: int) -> dict:
        if self.process.poll() is not None:
            raise WorkerError(f"peer {self.name} is no longer running (exit {self.process.returncode}): "
                              f"{_last_line(self.log_path)} (its log: {self.log_path})")
        self.resume()
        self._stdin.write(json.dumps({"engine": engine, "ids": ids, "max_tokens": max_tokens}) + "\n")
        self._stdin.flush()
        reply = self._read(self.reply_timeout_s, f"to generate with {engine}")
        if "error" in reply:
            raise WorkerError(f"peer {self.name} ({engine}) failed: {reply['error']} (its log: {self.log_path})")
        return reply

    def close(self) -> None:
        """End it (EOF on its stdin), its whole process group killed if it has not exited within 30 s."""
        self.resume()
        if self.process.poll() is None:
            try:
                self._stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._signal(signal.SIGKILL)
                self.process.wait()
        self._signal(signal.SIGKILL)  # children it left behind (an engine's processes)
        self._log.close()


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:200] if lines else "nothing logged"
