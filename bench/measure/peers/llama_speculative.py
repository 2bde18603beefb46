"""llama.cpp's own speculative decoding as a peer: the upstream example `llama-speculative-simple`,
built from the llama.cpp source that llama-cpp-python 0.3.36 vendors, run as a subprocess per prompt.

    python -m bench.measure.peers.llama_speculative build --out ~/llama-spec      # once: compiles llama.cpp again
    export SPECBENCH_LLAMA_SPECULATIVE=~/llama-spec/build/bin/llama-speculative-simple
    python -m bench.measure.peers.llama_speculative run --target T.gguf --draft D.gguf --prompt "..."  # one prompt
    python -m bench.measure.peers.llama_speculative run --target T.gguf --spec-type ngram-mod --prompt "..."  # draft-free

Why the example and not llama-cpp-python's draft-model hook (read in llama_cpp/llama.py, 0.3.36):
`Llama(draft_model=...)` forces `logits_all=True` (`self._logits_all = logits_all if draft_model is None
else True`: an n_ctx x vocab float buffer, every row of every eval copied out), its drafter is called
with the token ids alone (`draft_model(input_ids)`, no KV cache of its own, so a GGUF drafter would
re-run its context per draft or be hand-written around a second `Llama`), and the only drafter it
ships is `LlamaPromptLookupDecoding` (n-gram prompt lookup). The example is llama.cpp's reference for
a draft model: both models in C++, the draft keeps its KV cache, the target verifies
[last, d_0..d_{n-1}] in one decode and greedily accepts the agreeing prefix plus one token.

Settings: greedy (`--temp 0 --top-k 1`: the target's sampler takes the argmax),
`--spec-type draft-simple` (this llama.cpp defaults the type to none and does not infer it from a
plain GGUF draft: without the flag nothing is drafted), the same threads for target and draft
(`-t`, `-td`), and this llama.cpp's draft defaults left as they are: `--spec-draft-n-max 3` (tokens
per draft), `--spec-draft-n-min 0` (a shorter draft is still verified), `--spec-draft-p-min 0.0`
(no confidence cut: every drafted token is kept; the draft takes its top-1 of a top-10 sampler).

Time is the example's own report, `encoded N tokens in S seconds` (the prompt through target and
draft) plus `decoded N tokens in S seconds`: model load excluded, as for every other peer. The
example stops once it has decoded more than `-n` tokens, and its last draft is not bounded by the
budget left, so it may decode up to n-max + 1 tokens past `-n`: the rate uses the tokens it says it
decoded. stdout is two newlines, the prompt as its tokens detokenize, the generated text (an
end-of-generation token ends it unprinted) and four newlines (two after the text, two at exit); the
report goes to stderr, each line prefixed with a timestamp and its level.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.core.folder import os_error_line
from specdec.errors import ConfigError, SpecdecError

BINARY_ENV = "SPECBENCH_LLAMA_SPECULATIVE"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the pin whose vendored llama.cpp the example is built from
BUILD_COMMAND = "python -m bench.measure.peers.llama_speculative build --out DIR"
# Its log is written by a thread; in 1 of 10 runs here the report's tail was cut short at exit:
# such a run is run again (its time is its own report, so a rerun costs nothing in fairness).
REPORT_ATTEMPTS = 3
GREEDY_FLAGS = ("--temp", "0", "--top-k", "1")
# The example's speculation types run here: a draft model (draft-simple), or the target's own context, no draft
# model (common/speculative.cpp of the vendored llama.cpp: ngram-simple looks the last tokens up in the context,
# ngram-mod keeps a hashed n-gram table across the generation). `none` is refused by the example itself ("failed
# to initialize speculative decoding"): llama.cpp's plain decoding is llama-cpp-python's, a peer of its own.
SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-mod")
# Named settings of the draft-free types, for text that repeats its context in short runs (a summary, a translation,
# an edit). Their defaults (ngram-simple: a 12-token lookup, 48 drafted; ngram-mod: a 24-token match and at least 48
# drafted, common/common.h) suit long verbatim repeats (code edits): on Spec-Bench's summaries and translations they
# drafted nothing (docs/peers.md). Chosen on questions outside the measured ones (docs/peers.md, the tuning).
SPEC_SETTINGS = {
    "ngram-simple-short": ("ngram-simple", ("--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4")),
    "ngram-mod-short": ("ngram-mod", ("--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1",
                                      "--spec-ngram-mod-n-max", "4")),
}
_REPORT = {
    "encoded": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "n_draft": re.compile(r"n_draft\s+=\s+(\d+)"),
    "n_drafted": re.compile(r"n_drafted\s+=\s+(\d+)"),
    "n_accept": re.compile(r"n_accept\s+=\s+(\d+)"),
}


@dataclass(frozen=True)
class SpeculativeReport:
    text: str  # generated text, the prompt's echo removed
    prompt_tokens: int  # as the example tokenized the prompt
    encode_s: float
    new_tokens: int  # decoded, as it counts them (an end-of-generation token included)
    decode_s: float
    draft_max: int
    drafted: int
    accepted: int

    @property
    def wall_s(self) -> float:
        return self.encode_s + self.decode_s


def find_binary(path: str | None = None) -> Path:
    """The example's binary: `path`, else $SPECBENCH_LLAMA_SPECULATIVE; a missing one is one line."""
    given = path or os.environ.get(BINARY_ENV)
    if not given:
        raise ConfigError(f"llama.cpp's speculative example is not set: build it with `{BUILD_COMMAND}` and set "
                          f"{BINARY_ENV}=DIR/build/bin/llama-speculative-simple")
    binary = Path(given).expanduser()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ConfigError(f"llama.cpp's speculative example {str(binary)!r} ({BINARY_ENV}) is not an executable file: "
                          f"build it with `{BUILD_COMMAND}`")
    return binary


def parse_report(stdout: str, stderr: str, prompt_text: str) -> SpeculativeReport:
    """The example's output -> its figures and the generated text (see the module docstring)."""
    found = {key: match for key, pattern in _REPORT.items() if (match := pattern.search(stderr))}
    if missing := [key for key in _REPORT if key not in found]:
        raise SpecdecError(f"llama.cpp's speculative example printed no {', '.join(missing)} report: its stderr ends "
                           f"{stderr.strip()[-200:]!r}; is {BINARY_ENV} the llama-speculative-simple of `{BUILD_COMMAND}`?")
    echo, tail = "\n\n" + prompt_text, "\n\n\n\n"  # two newlines after the text, two more at exit
    if not stdout.startswith(echo) or not stdout.endswith(tail):
        raise SpecdecError("llama.cpp's speculative example echoed a different prompt: its tokens of the prompt "
                           "do not detokenize to the text it was given")
    return SpeculativeReport(
        text=stdout[len(echo):-len(tail)], prompt_tokens=int(found["encoded"][1]), encode_s=float(found["encoded"][2]),
        new_tokens=int(found["decoded"][1]), decode_s=float(found["decoded"][2]), draft_max=int(found["n_draft"][1]),
        drafted=int(found["n_drafted"][1]), accepted=int(found["n_accept"][1]))


def speculative_command(binary: Path, target: str, draft: str | None, prompt_text: str, threads: int,
                        max_new_tokens: int, n_ctx: int = 4096, spec_type: str = "draft-simple") -> list[str]:
    """The example's command line: greedy, the same threads for target and draft, `spec_type` (SPEC_TYPES, or a
    name of SPEC_SETTINGS: a type with its flags); draft-simple takes the draft model, the n-gram types none."""
    spec_type, flags = SPEC_SETTINGS.get(spec_type, (spec_type, ()))
    if spec_type not in SPEC_TYPES:
        raise ConfigError(f"unknown llama.cpp speculation type {spec_type!r}: use one of "
                          f"{', '.join((*SPEC_TYPES, *SPEC_SETTINGS))}")
    if (spec_type == "draft-simple") != (draft is not None):
        raise ConfigError(f"llama.cpp's {spec_type} " + ("needs a draft model: give --draft D.gguf" if draft is None
                          else "drafts from the context, not a draft model: drop --draft"))
    drafting = ["-md", draft, "-td", str(threads)] if draft is not None else []
    return [str(binary), "-m", target, *drafting, "-p", prompt_text, "-n", str(max_new_tokens), "-c", str(n_ctx),
            "-t", str(threads), *GREEDY_FLAGS, "--spec-type", spec_type, *flags]  # its warm-up decode stays in the untimed load


def run_speculative(binary: Path, target: str, draft: str | None, prompt_text: str, threads: int,
                    max_new_tokens: int, timeout_s: float = 600, spec_type: str = "draft-simple") -> SpeculativeReport:
    """One prompt through the example (a fresh process: its models loaded, timed by itself)."""
    command = speculative_command(binary, target, draft, prompt_text, threads, max_new_tokens, spec_type=spec_type)
    for attempt in range(REPORT_ATTEMPTS):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SpecdecError(f"llama.cpp's speculative example ran past {timeout_s:g} s on one prompt: give fewer "
                               "--max-new-tokens or more --threads") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise SpecdecError(f"llama.cpp's speculative example exited with {done.returncode}: {last} (check that "
                               "--target and --draft are GGUF files of one tokenizer)")
        try:
            return parse_report(done.stdout, done.stderr, prompt_text)
        except SpecdecError:
            if attempt == REPORT_ATTEMPTS - 1 or "encoded" not in done.stderr:
                raise
    raise AssertionError("unreachable")


def _step(what: str, command: list[str], fix: str) -> None:
    """One build step; its failure is one line (the tool's own output is above it)."""
    done = subprocess.run(command)
    if done.returncode != 0:
        raise SpecdecError(f"{what} failed (exit {done.returncode}, its output is above): {fix}")


def build(out: Path) -> Path:
    """Fetch llama-cpp-python's source distribution (the pinned version) and build the two examples
    from the llama.cpp it vendors, Release, no CURL, no tests, no server. Returns the binary."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder: give a folder for the source and build/")
    if not shutil.which("cmake"):
        raise ConfigError("cmake is not on PATH: install cmake (and a C++ compiler), then run the build again")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as download:
        _step(f"pip download {LLAMA_CPP_PYTHON}", [sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON,
                                                   "--no-deps", "--no-binary", ":all:", "-d", download],
              "check the network and pip's index (pip config list), then run the build again")
        archive = next(Path(download).glob("llama_cpp_python-*.tar.gz"), None)
        if archive is None:
            raise SpecdecError(f"pip downloaded no llama_cpp_python-*.tar.gz for {LLAMA_CPP_PYTHON}: the index offers "
                               "no source distribution of it; point pip at one that does (PIP_INDEX_URL), then run again")
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="data")
    source = next(out.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if source is None:
        raise SpecdecError(f"{LLAMA_CPP_PYTHON}'s source in {out} has no vendor/llama.cpp: delete {out} and run the "
                           "build again")
    build_dir = out / "build"
    fix = "install a C++ compiler (gcc, g++) and cmake >= 3.14, delete the folder's build/ and run the build again"
    _step("cmake (configure)", ["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                                "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], fix)
    _step("cmake --build", ["cmake", "--build", str(build_dir), "--target", "llama-speculative-simple",
                            "llama-speculative", "-j", str(os.cpu_count() or 1)], fix)
    return build_dir / "bin" / "llama-speculative-simple"


def _positive(text: str) -> int:
    """argparse type: a whole number >= 1 (threads, tokens)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"need a whole number >= 1, got {text!r}")
    return value


def _gguf(flag: str, path: str) -> str:
    if not Path(path).expanduser().is_file():
        raise ConfigError(f"{flag} {path!r} is not a file: give the path of a GGUF file (`specbench models fetch` keeps "
                          "a registry entry's)")
    return str(Path(path).expanduser())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.measure.peers.llama_speculative", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help=f"build the example from {LLAMA_CPP_PYTHON}'s vendored llama.cpp")
    build_parser.add_argument("--out", required=True, help="folder for the source and build/ (about 350 MB)")
    run_parser = commands.add_parser("run", help="one prompt, greedy; prints its report as JSON")
    run_parser.add_argument("--binary", help=f"the example's binary (default ${BINARY_ENV})")
    run_parser.add_argument("--target", required=True, help="the cloud's GGUF file")
    run_parser.add_argument("--draft", help="the edge's GGUF file (draft-simple only)")
    run_parser.add_argument("--spec-type", choices=(*SPEC_TYPES, *SPEC_SETTINGS), default="draft-simple",
                            help="draft-simple (a draft model) or a draft-free type drafting from the context (with "
                                 "its defaults, or a named setting of it)")
    run_parser.add_argument("--prompt", required=True, help="text as the model sees it (chat template applied)")
    run_parser.add_argument("--threads", type=_positive, default=2)
    run_parser.add_argument("--max-new-tokens", type=_positive, default=48)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            binary = build(Path(args.out).expanduser())
            print(f"built {binary}\nexport {BINARY_ENV}={binary}")
        else:
            binary = find_binary(args.binary)  # first: without it nothing else matters
            draft = _gguf("--draft", args.draft) if args.draft is not None else None
            report = run_speculative(binary, _gguf("--target", args.target), draft, args.prompt, args.threads,
                                     args.max_new_tokens, spec_type=args.spec_type)
            print(json.dumps(asdict(report), ensure_ascii=False))
    except SpecdecError as e:  # one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: as `specbench` does, one line and 130
        what = f"the build in {args.out} is unfinished; run it again" if args.command == "build" else "nothing written"
        print(f"interrupted: {what}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
