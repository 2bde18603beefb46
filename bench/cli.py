"""The `specbench` command line. Bad input: one line naming the problem and the fix, exit 2."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from bench.commands.calibrate import add_calibrate_parser, cmd_calibrate
from bench.commands.compare import add_compare_parser, cmd_compare
from bench.commands.fleet import add_fleet_parser, cmd_fleet
from bench.commands.gate import add_gate_parser, cmd_gate
from bench.commands.link import add_link_parser, cmd_link
from bench.commands.models import add_models_parser, cmd_models
from bench.commands.peers import add_peers_parser, cmd_peers
from bench.commands.predict import add_predict_parser, cmd_predict
from bench.commands.profile import add_profile_parser, cmd_profile
from bench.commands.report import add_report_parser, cmd_report
from bench.commands.run import add_run_parser, cmd_run
from bench.commands.score import add_score_parser, cmd_score
from bench.commands.serve import add_serve_parser, cmd_serve
from bench.commands.sweep import add_sweep_parser, cmd_sweep
from bench.core.folder import os_error_line
from specdec.errors import SpecdecError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specbench", description="edge-cloud speculative decoding: run, measure, compare")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)
    add_profile_parser(sub)
    add_gate_parser(sub)
    add_compare_parser(sub)
    add_score_parser(sub)
    add_serve_parser(sub)
    add_link_parser(sub)
    add_fleet_parser(sub)
    add_models_parser(sub)
    add_peers_parser(sub)
    add_predict_parser(sub)
    add_calibrate_parser(sub)
    return parser


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "models": cmd_models, "peers": cmd_peers, "report": cmd_report,
            "profile": cmd_profile,
            "gate": cmd_gate, "compare": cmd_compare, "score": cmd_score,
            "serve": cmd_serve, "link": cmd_link, "fleet": cmd_fleet,
            "predict": cmd_predict, "calibrate": cmd_calibrate}


def _stop(signum, frame) -> None:
    """SIGTERM stops a command as Ctrl-C does (a sweep stops its workers on the way out); a
    second SIGTERM kills at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if in_main_thread else None
    try:
        return COMMANDS[args.command](args)
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the filesystem at the edges: an --out that is a file, read-only, full, not ours
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: results written so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
