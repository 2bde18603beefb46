"""One client process of the soak (bench/measure/serving/soak.py), a process so the soak can SIGKILL or
SIGSTOP it. Its job (argv[1], JSON) names the replay scripts' file, the server and a deadline.

  edge   replays the recorded split generations in turn (starting at prompt `client`) until the
         deadline; prints `{"event": "start", ...}` before each and `{"event": "end", ...}` with
         its outcome after: the replay's measured fields, or `failed` with the reason
  hold   opens one session, takes one verdict, prints `{"event": "held"}` and waits: the soak
         then SIGSTOPs it, a client that vanished without closing its connection

Logs go to stderr; each line on stdout is one JSON object, flushed.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

from bench.measure.serving.clients import Connection, Script, Step, open_fields, replay
from specdec.core.verdict import CloudLost

RETRY_S = 1.0  # after a failed generation (the server stopped, refused or lost): a pause, not a tight loop


def write_scripts(path: Path, scripts: list[Script]) -> None:
    path.write_text(json.dumps([dataclasses.asdict(s) for s in scripts]), encoding="utf-8")


def read_scripts(path: str | Path) -> list[Script]:
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    return [Script(**{**row, "steps": [Step(**step) for step in row["steps"]]}) for row in rows]


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


async def edge(job: dict, scripts: list[Script]) -> None:
    sequence = 0
    while time.time() < job["deadline"]:
        script = scripts[(job["client"] + sequence) % len(scripts)]
        where = {"client": job["client"], "incarnation": job["incarnation"], "seq": sequence, "id": script.id}
        emit({"event": "start", **where, "t": time.time()})
        try:
            row = {"status": "ok", **await replay(job["url"], script, job["vocab"], None, job["timeout_s"])}
        except CloudLost as e:
            row = {"status": "failed", "error": str(e)}
        emit({"event": "end", **where, "t": time.time(), **row})
        sequence += 1
        if row["status"] != "ok":
            await asyncio.sleep(RETRY_S)


async def hold(job: dict, scripts: list[Script]) -> None:
    script = scripts[job["client"] % len(scripts)]
    step = script.steps[0]
    async with Connection(job["url"], None, job["timeout_s"]) as server:
        await server.send("open", **open_fields(script, step.base - len(script.prompt_ids), job["vocab"]))
        await server.send("verify", base=step.base, new=[], draft=step.draft, probs=None)
        await server.receive("verdict")
        emit({"event": "held", "t": time.time()})
        await asyncio.sleep(job["deadline"] - time.time() + 3600)  # stopped (SIGSTOP) long before, then killed


def main(job: dict) -> int:
    scripts = read_scripts(job["scripts"])
    asyncio.run((hold if job["role"] == "hold" else edge)(job, scripts))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
