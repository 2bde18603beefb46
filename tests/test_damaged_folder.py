"""A finished sweep folder damaged at generated offsets (issue 34): `results.jsonl`, `sweep.json` and
the lock truncated mid-line, with flipped bytes, a line duplicated, a line from another folder, made
empty, or missing. Each of resume (the sweep run again), report, compare and predict either refuses
in one `error:` line or carries on, and never silently drops, duplicates or adopts a row.
(`specbench gate` reads no results folder: it measures its own suite.)"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from bench.cli import main
from bench.core.folder import LOCK
from bench.core.records import read_records
from tests.test_robust import sweep_args

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out

KEY = ("id", "mode", "k", "repeat")  # a row of this sweep (one axis: the mode)


@pytest.fixture(scope="module")
def finished(pair, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "sweep"
    assert main(sweep_args(pair, prompts, out)) == 0
    return out


def key(record: dict) -> tuple:
    return tuple(record.get(name) for name in KEY)


def damage(folder: Path, target: str, how: str, offset_seed: int) -> None:
    """Damage `target` in `folder`; the offset is drawn from `offset_seed`."""
    path, draw = folder / target, random.Random(f"{target} {how} {offset_seed}")
    if how == "missing":
        path.unlink()
        return
    if how == "empty":
        path.write_bytes(b"")
        return
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if how == "truncated line":  # a line cut short mid-file (the lines after it kept)
        i = draw.randrange(len(lines))
        lines[i] = lines[i][: draw.randrange(1, len(lines[i]) - 1)] + b"\n"
    elif how == "flipped bytes":  # the high bit of a few bytes: never valid UTF-8 in ASCII JSON
        flipped = bytearray(data)
        for at in draw.sample(range(len(data) - 1), 3):
            flipped[at] ^= 0x80
        path.write_bytes(bytes(flipped))
        return
    elif how == "duplicated line":
        i = draw.randrange(len(lines))
        lines.insert(draw.randrange(len(lines) + 1), lines[i])
    elif how == "line from another folder":  # the same prompt measured with another budget elsewhere
        other = json.loads(lines[draw.randrange(len(lines))])
        other.update(max_new_tokens=4, new_tokens=4, prompts="/elsewhere/p.jsonl")
        lines.insert(draw.randrange(len(lines) + 1), (json.dumps(other) + "\n").encode())
    path.write_bytes(b"".join(lines))


COMMANDS = {
    "resume": lambda pair, prompts, folder, tmp: sweep_args(pair, prompts, folder),
    "report": lambda pair, prompts, folder, tmp: ["report", folder, "--out", tmp / "rep"],
    "compare": lambda pair, prompts, folder, tmp: ["compare", folder, folder, "--out", tmp / "cmp"],
    "predict": lambda pair, prompts, folder, tmp: ["predict", folder],
}
DAMAGE = [("results.jsonl", how) for how in ("truncated line", "flipped bytes", "duplicated line",
                                             "line from another folder", "empty", "missing")] + \
         [("sweep.json", how) for how in ("truncated line", "flipped bytes", "empty", "missing")] + \
         [(LOCK, how) for how in ("flipped bytes", "empty", "missing")]


@pytest.mark.parametrize("offset_seed", [0, 1])
@pytest.mark.parametrize("target,how", DAMAGE, ids=[f"{t}: {h}" for t, h in DAMAGE])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_folder_is_refused_in_one_line_or_read_whole(pair, prompts, finished, tmp_path, capsys, command,
                                                                target, how, offset_seed):
    if target == LOCK and how == "flipped bytes" and not (finished / LOCK).exists():
        pytest.skip("the finished sweep left no lock")
    folder = Path(shutil.copytree(finished, tmp_path / "sweep"))
    rows = [key(r) for r in read_records(finished / "results.jsonl")]
    original = (finished / "results.jsonl").read_bytes().splitlines(keepends=True)
    damage(folder, target, how, offset_seed)
    capsys.readouterr()
    code = main([str(a) for a in COMMANDS[command](pair, prompts, folder, tmp_path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if code == 2:
        assert len([line for line in err.splitlines() if line.startswith("error: ")]) == 1, err
        return
    assert code == 0, err
    adds_a_row = target == "results.jsonl" and how in ("duplicated line", "line from another folder")
    assert not adds_a_row, f"{command} carried on with a duplicated or foreign row"
    if command == "resume":  # carried on: every row once, the same rows, each measured line kept or redone
        after = read_records(folder / "results.jsonl")
        assert sorted(key(r) for r in after) == sorted(rows), "resume dropped, duplicated or adopted a row"
        kept = (folder / "results.jsonl").read_bytes().splitlines(keepends=True)
        assert len(set(kept) & set(original)) >= len(original) - 1 or how in ("empty", "missing"), \
            "resume rewrote measured lines beyond the damaged one"
