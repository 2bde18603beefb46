"""OpenVINO GenAI as a peer: `LLMPipeline` plain, with its prompt lookup, and with a draft model.

(Named so that, run as a script, its folder on sys.path does not shadow the `openvino_genai` package.)
Runs with the Python of its own environment (optimum-intel pins transformers < 5.6, which this project's environment
does not take), so it imports nothing of specbench's:

    specbench peers install openvino-genai
    # as a worker of the peers suite (bench/measure/peers/peer_worker.py), which starts it itself:
    SPECBENCH_PEER_EXTERNAL=openvino-genai pytest bench/test_bench_peer_runtimes.py --benchmark-only -m realmodel -s
    # or only the export (cached: a second call checks the marker and returns):
    $SPECBENCH_HOME/peers/openvino-genai/bin/python bench/measure/peers/openvino_genai_peer.py --model DIR --export-only

What it needs: a stateful IR (the KV cache inside the model's state, with the input names GenAI feeds) and the
tokenizer as IR (openvino_tokenizer.xml, openvino_detokenizer.xml): optimum-intel's exporter writes both,
`optimum-cli export openvino --task text-generation-with-past --weight-format int4 --sym --group-size 128
--ratio 1.0`, into `<model dir>/openvino-genai-int4/` (int4 symmetric, every Linear but the head, data-free: the
same bits per weight as specbench's int4 kernels, in OpenVINO's own CPU kernels). The export is cached beside the
model: a marker `specbench-peer-export.json`, written last, holds the command, the exporter's versions and each
output file's size and sha256; a folder without it (an export cut short) is exported again.

Engines (`--engines`, loaded first, not timed): `openvino-genai` plain; `openvino-genai-lookup`,
`LLMPipeline(..., prompt_lookup=True)` with `num_assistant_tokens` K and `max_ngram_size` 3; `openvino-genai-draft`,
`draft_model=` the 0.5B's export with `num_assistant_tokens` K. Greedy, `INFERENCE_NUM_THREADS` threads, prompts
as token ids. The time is this process's clock around `generate`; the first token's time is GenAI's own
(`perf_metrics.get_ttft()`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ENGINES = ("openvino-genai", "openvino-genai-lookup", "openvino-genai-draft")
EXPORT_DIR = "openvino-genai-int4"
MARKER = "specbench-peer-export.json"
EXPORT_FLAGS = ("--task", "text-generation-with-past", "--weight-format", "int4", "--sym", "--group-size", "128",
                "--ratio", "1.0")
INSTALL = "specbench peers install openvino-genai"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export(model: Path, log=print) -> Path:
    """`model`'s stateful int4 IR and tokenizer IR, exported once (module docstring)."""
    out = model / EXPORT_DIR
    marker = out / MARKER
    command = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(model),
               *EXPORT_FLAGS, str(out)]
    if marker.is_file() and json.loads(marker.read_text())["flags"] == list(EXPORT_FLAGS):
        return out
    log(f"exporting {model.name} for OpenVINO GenAI (int4, stateful, tokenizer IR) into {out}")
    start = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, env=env, stdout=sys.stderr)
    if done.returncode != 0 or not (out / "openvino_model.xml").is_file() or not (out / "openvino_tokenizer.xml").is_file():
        raise RuntimeError(f"optimum-intel's export of {model} failed (exit {done.returncode}, its output above)")
    from importlib.metadata import version

    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(out.iterdir()) if p.is_file()}
    marker.write_text(json.dumps({"flags": list(EXPORT_FLAGS), "command": command[1:], "seconds":
                                  round(time.monotonic() - start, 1), "versions": {
                                      name: version(name) for name in ("optimum-intel", "openvino", "nncf",
                                                                       "transformers", "openvino-tokenizers")},
                                  "files": files}, indent=1))
    return out


def load_engines(model: Path, draft: Path | None, names: list[str], threads: int, k: int):
    import openvino_genai as ov_genai

    properties = {"INFERENCE_NUM_THREADS": threads}
    path = str(export(model))
    engines = {}
    for name in names:
        config = ov_genai.GenerationConfig()
        config.do_sample = False
        if name == "openvino-genai":
            pipe = ov_genai.LLMPipeline(path, "CPU", **properties)
        elif name == "openvino-genai-lookup":
            pipe = ov_genai.LLMPipeline(path, "CPU", prompt_lookup=True, **properties)
            config.num_assistant_tokens, config.max_ngram_size = k, 3
        elif name == "openvino-genai-draft":
            if draft is None:
                raise ValueError("openvino-genai-draft needs --draft, the draft model's folder")
            assistant = ov_genai.draft_model(str(export(draft)), "CPU", **properties)
            pipe = ov_genai.LLMPipeline(path, "CPU", draft_model=assistant, **properties)
            config.num_assistant_tokens = k
        else:
            raise ValueError(f"unknown engine {name!r}: use some of {', '.join(ENGINES)}")
        engines[name] = (pipe, config)
    return engines


def generate(pipe, config, ids: list[int], max_tokens: int) -> tuple[list[int], float | None, dict]:
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    config.max_new_tokens = max_tokens
    inputs = ov_genai.TokenizedInputs(ov.Tensor(np.array([ids], dtype=np.int64)),
                                      ov.Tensor(np.ones((1, len(ids)), dtype=np.int64)))
    result = pipe.generate(inputs, config)
    ttft = result.perf_metrics.get_ttft().mean / 1e3  # ms
    return [int(t) for t in result.tokens[0]], ttft, {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the verifier's folder (the registry's float folder)")
    parser.add_argument("--draft", help="the draft model's folder (openvino-genai-draft)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"some of {', '.join(ENGINES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="tokens proposed per step")
    parser.add_argument("--worker", action="store_true", help="serve the peers suite on stdin/stdout (peer_worker.py)")
    parser.add_argument("--export-only", action="store_true", help="export --model (and --draft) and stop")
    args = parser.parse_args(argv)
    try:
        import openvino_genai
    except ImportError:
        print(f"error: openvino-genai is not installed in this Python: run `{INSTALL}` and this file with "
              "$SPECBENCH_HOME/peers/openvino-genai/bin/python", file=sys.stderr)
        return 2
    model = Path(args.model).expanduser()
    draft = Path(args.draft).expanduser() if args.draft else None
    try:
        if args.export_only:
            for folder in (model, draft):
                if folder is not None:
                    print(export(folder, log=lambda m: print(m, file=sys.stderr)))
            return 0
        if not args.worker:
            print("error: give --worker (the peers suite starts it) or --export-only", file=sys.stderr)
            return 2
        import peer_worker  # this file's sibling: run as a script, its folder is on sys.path

        protocol = peer_worker.take_stdout()  # before the export and the pipelines print anything
        engines = load_engines(model, draft, [n.strip() for n in args.engines.split(",") if n.strip()], args.threads,
                               args.k)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return peer_worker.serve({name: partial(generate, *engine) for name, engine in engines.items()},
                             {"openvino-genai": openvino_genai.__version__}, stdout=protocol)


if __name__ == "__main__":
    raise SystemExit(main())
