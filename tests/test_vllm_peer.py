"""bench/measure/peers/vllm_cpu.py without vLLM installed (it runs in vLLM's own environment): it picks the first N
questions of each category from Spec-Bench's format, and without vllm it is one line naming the install."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.measure.peers.vllm_cpu import questions

SCRIPT = Path(__file__).parent.parent / "bench" / "measure" / "peers" / "vllm_cpu.py"


def test_the_first_questions_of_each_category_in_order(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": "summarization" if i % 2 else "translation", "turns": [f"q{i}"]}
            for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    picked = questions(str(path), ["summarization", "translation"], 2)
    assert [q["question_id"] for q in picked] == [1, 3, 0, 2]


@pytest.mark.subprocess  # runs the script in a child Python
def test_without_vllm_it_is_one_line_naming_the_install(tmp_path):
    code = f"import sys; sys.modules['vllm'] = None\nsys.argv = ['x'] + sys.argv[1:]\nexec(open({str(SCRIPT)!r}).read())"
    result = subprocess.run([sys.executable, "-c", code, "--model", "m", "--questions", "q", "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: vllm is not installed in this Python: run `specbench peers install vllm` and this file with "
        "$SPECBENCH_HOME/peers/vllm/bin/python"]
