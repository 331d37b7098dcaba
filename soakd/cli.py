"""Command line: argument parsing only; each subcommand calls one function elsewhere.

Exit codes: the table in :mod:`soakd.errors`.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import gc
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import soakd
from soakd.config import config_keys, flag_help, load_config
from soakd.errors import ConfigError, Exit, RunFailed, SoakdError

# `soakd run` flag -> (config key path, argparse options). Flags override the config file;
# each flag's --help (what it does, its unit and its default) is the key's own declaration in
# soakd/config/schema.py (config/keys.py:flag_help), and docs/running.md says more.
RUN_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--model": ("model.spec", {"metavar": "SPEC"}),
    "--device": ("model.device", {"metavar": "auto|cpu|cuda[:N]"}),
    "--warmup": ("model.warmup", {"metavar": "N"}),
    "--concurrency": ("load.concurrency", {"metavar": "N"}),
    "--rate": ("load.rate", {"metavar": "RPS"}),
    "--arrival": ("load.arrival", {"metavar": "constant|poisson|gamma"}),
    "--burstiness": ("load.burstiness", {"metavar": "K"}),
    "--workers": ("load.workers", {"metavar": "N"}),
    "--shard": ("load.shard", {"metavar": "I/N"}),
    "--start-at": ("load.start_at", {"metavar": "INSTANT"}),
    "--duration": ("load.duration", {"metavar": "DUR"}),
    "--max-batch-size": ("batcher.max_batch_size", {"metavar": "N"}),
    "--max-queue-delay-ms": ("batcher.max_queue_delay_ms", {"metavar": "MS"}),
    "--input-shapes": ("input.shapes", {"metavar": "SPEC"}),
    "--samples": ("input.samples", {"metavar": "DIR"}),
    "--metrics-addr": ("metrics.addr", {"metavar": "HOST:PORT"}),
    "--summary-json": ("output.summary_json", {"metavar": "PATH"}),
    "--state-dir": ("state.dir", {"metavar": "DIR"}),
    "--run-id": ("state.run_id", {"metavar": "ID"}),
    "--log-file": ("output.log_file", {"metavar": "PATH"}),
    "--memory-interval": ("memory.interval", {"metavar": "DUR"}),
    "--leak-warmup": ("leak.warmup", {"metavar": "DUR"}),
    "--leak-window": ("leak.window", {"metavar": "DUR"}),
    "--preprocess-workers": ("input.preprocess_workers", {"metavar": "N"}),
    "--postprocess": ("input.postprocess", {"metavar": "auto|none|classify|detect"}),
    "--pad": ("input.pad", {"metavar": "true|false"}),
    # A served model instead of --model (docs/network-targets.md).
    "--target": ("target.url", {"metavar": "URL"}),
    "--api": ("target.api", {"metavar": "http|openai|kserve-v2"}),
    "--target-model": ("target.model", {"metavar": "NAME"}),
    "--watch-pid": ("target.watch_pid", {"metavar": "PID", "action": "append"}),
    "--watch-unit": ("target.watch_unit", {"metavar": "UNIT", "action": "append"}),
    "--scrape": ("target.scrape", {"metavar": "URL", "action": "append"}),
    "--output-tokens": ("target.output_tokens", {"metavar": "N|LENGTH-SPEC"}),
    "--tokenizer": ("target.tokenizer", {"metavar": "PATH"}),
    # Trace replay (docs/replay.md).
    "--replay": ("load.replay", {"metavar": "FILE"}),
    "--replay-format": ("load.replay_format", {"metavar": "auto|mooncake|azure|burstgpt|soakd"}),
    "--replay-speed": ("load.replay_speed", {"metavar": "X"}),
    "--replay-loop": ("load.replay_loop", {"action": "store_const", "const": True}),
    "--replay-block-tokens": ("load.replay_block_tokens", {"metavar": "N"}),
    "--replay-keep-failed": ("load.replay_keep_failed", {"action": "store_const", "const": True}),
    "--replay-sort-window": ("load.replay_sort_window", {"metavar": "ROWS"}),
    "--record-requests": ("output.record_requests", {"metavar": "FILE"}),
}


def _flag_help(key: str) -> str:
    """What the flag does, its unit, the key it overrides and that key's default."""
    section, name = key.split(".")
    return flag_help(config_keys()[section][name])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors too; keep its message
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"soakd: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="soakd", description="Soak-test daemon for PyTorch inference.")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="soak a model (the default: builtin convnet, until stopped)")
    run.add_argument("--config", metavar="FILE", help="TOML config; flags override it")
    for flag, (key, kw) in RUN_FLAGS.items():
        run.add_argument(flag, dest=key, default=None, help=_flag_help(key), **kw)

    check = sub.add_parser(
        "check-config", help="validate a config file without running (the same answer on every machine)"
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument(
        "--host",
        action="store_true",
        help="also check the bounds of this host (its RAM for soakd's buffers, its cores for model threads), "
        "as `soakd run` does before it loads anything",
    )

    _add_sweep(sub)

    # ---- analyze (issue: leak verdicts): must not import torch
    analyze = sub.add_parser("analyze", help="judge recorded memory traces (CSV: timestamp_seconds,bytes)")
    analyze.add_argument("--json", action="store_true", help="one JSON object per file per line")
    analyze.add_argument("--config", metavar="FILE", help="leak settings from a config file")
    analyze.add_argument("--leak-warmup", dest="leak.warmup", metavar="DUR", help=_flag_help("leak.warmup"))
    analyze.add_argument("--leak-window", dest="leak.window", metavar="DUR", help=_flag_help("leak.window"))
    analyze.add_argument("--cycle", dest="leak.cycle", metavar="DUR", help=_flag_help("leak.cycle"))
    analyze.add_argument(
        "--headroom",
        metavar="SIZE",
        help="memory each series had left (8GiB): a rise that would not exhaust it within leak.horizon is "
        "a finding (creep, exit 0), as the live page rule says; none: every rise the test is sure of is a leak",
    )
    analyze.add_argument("files", metavar="FILE", nargs="+")

    # ---- report / compare (issue: reports and gates)
    report = sub.add_parser("report", help="summarise a run from its state dir, or a fleet of runs")
    where = report.add_mutually_exclusive_group(required=True)
    where.add_argument("--state-dir", metavar="DIR")
    where.add_argument(
        "--fleet",
        nargs="+",
        metavar="SRC",
        help="one soak per GPU: state dirs and report/summary/fleet JSONs; exit 1 when any GPU fails",
    )
    where.add_argument(
        "--merge",
        nargs="+",
        metavar="SRC",
        help="one soak, many drivers (--shard, --workers): state dirs and report/summary/merged JSONs "
        "merged into one report; exit 1 when its gate fails or a shard is missing or failed",
    )
    report.add_argument("--run-id", metavar="ID", help="default: the most recent run")
    report.add_argument("--format", choices=("json", "html", "md"), default="json")
    report.add_argument("--output", metavar="FILE", help="default: stdout")
    report.add_argument("--config", metavar="FILE", help="SLOs to check")

    compare = sub.add_parser("compare", help="compare two run summaries (or two fleet reports); exit 1 on a regression")
    compare.add_argument("a", metavar="A.json")
    compare.add_argument("b", metavar="B.json")
    compare.add_argument("--config", metavar="FILE", help="regression thresholds")
    return parser


def _add_sweep(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``soakd sweep``: the run flags it shares, and its own (issue: production-like requests;
    read by soakd/run/sweep/planner.py)."""
    sweep = sub.add_parser("sweep", help="step through load settings; find the knee and the best setting")
    sweep.add_argument("--config", metavar="FILE")
    for flag, (key, kw) in RUN_FLAGS.items():
        if flag not in ("--concurrency", "--rate", "--max-batch-size", "--duration", "--replay-speed"):
            sweep.add_argument(flag, dest=key, default=None, help=_flag_help(key), **kw)
    sweep.add_argument(
        "--concurrency",
        dest="sweep_concurrency",
        metavar="LIST",
        help="e.g. 1,4,8,16; 2x: twice each step's max batch size",
    )
    sweep.add_argument("--rate", dest="sweep_rate", metavar="LIST", help="e.g. 50,100,200")
    sweep.add_argument(
        "--replay-speed",
        dest="sweep_replay_speed",
        metavar="LIST",
        help="with --replay: speeds to step through, e.g. 0.5,1,2,4 (where the server falls behind)",
    )
    sweep.add_argument("--max-batch-size", dest="sweep_max_batch_size", metavar="LIST", help="e.g. 1,4,8,16,32")
    sweep.add_argument("--step-duration", metavar="DUR", help="fixed time per step (skips the stability wait)")
    sweep.add_argument("--slo-p99-ms", type=float, metavar="MS", help="p99 the recommendation must meet")
    sweep.add_argument("--json", dest="json_out", metavar="FILE", help="write the steps, knee and recommendation")
    sweep.add_argument(
        "--tolerance",
        dest="stability_tolerance",
        type=float,
        default=10.0,
        metavar="PCT",
        help="stable: throughput and p99 of the last three windows within PCT%% (default 10)",
    )
    sweep.add_argument("--window", dest="sweep_window", default="2s", metavar="DUR", help="window length (2s)")
    sweep.add_argument("--min-step", dest="min_step", default="10s", metavar="DUR", help="minimum step time (10s)")
    sweep.add_argument(
        "--max-step",
        dest="max_step",
        default="60s",
        metavar="DUR",
        help="maximum step time; still unstable then: the step is marked unstable (60s)",
    )


def _version() -> str:
    return f"soakd {soakd.__version__}"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    return {key: getattr(ns, key) for key, _ in RUN_FLAGS.values() if getattr(ns, key, None) is not None}


COMMANDS = ("run", "sweep", "analyze", "report", "compare", "check-config")


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser  # pragma: no cover - build_parser always adds the subcommands


def _check_flags(args: Sequence[str], parser: argparse.ArgumentParser) -> None:
    """Before argparse (whose 'required' errors would hide a typo): every ``--flag`` must be one
    of the subcommand's or a prefix of just one; else name the closest."""
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for arg in args:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in flags or sum(f.startswith(name) for f in flags) == 1:
            continue
        parser.error(f"unrecognized argument {name}{_did_you_mean(name, flags)}")


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """A bare ``soakd`` (or ``soakd --flags``) is ``soakd run``; an unknown first word is a
    mistyped subcommand, not a flag of ``run``: name the subcommands and the closest one."""
    first = next((a for a in args if a not in ("-v", "--verbose")), None)
    if first is None or (first.startswith("-") and first not in ("-h", "--help", "--version")):
        args.insert(args.index(first) if first is not None else len(args), "run")
        first = "run"
    if first not in COMMANDS and not first.startswith("-"):
        parser.error(
            f"unknown command {first!r}{_did_you_mean(first, COMMANDS)}; commands: {', '.join(COMMANDS)} (soakd --help)"
        )
    if first in COMMANDS:
        at = args.index(first)
        _check_flags(args[at + 1 :], _subparser(parser, first))
    return parser.parse_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    _setup_logging(ns.verbose)
    command = ns.command

    # Each subcommand imports only what it runs: `analyze` and `check-config` start without torch.
    try:
        if command == "check-config":
            cfg = load_config(ns.file)
            if ns.host:
                from soakd.host_limits import check_host  # lazy: only the subcommand's own modules load

                check_host(cfg)
            print(f"{ns.file}: ok{' on this host' if ns.host else ''}")
            return Exit.OK
        if command == "analyze":
            from soakd.analysis.offline import analyze_command  # lazy: only the subcommand's own modules load

            return analyze_command(ns)
        if command == "report":
            from soakd.report.command import report_command  # lazy: only the subcommand's own modules load

            return report_command(ns)
        if command == "compare":
            from soakd.report.command import compare_command  # lazy: only the subcommand's own modules load

            return compare_command(ns)
        overrides = _overrides(ns)
        if "model.spec" in overrides and "target.url" in overrides:
            raise ConfigError("--model and --target: choose one (a model in soakd's process, or a served one)")
        cfg = load_config(ns.config, overrides)
        from soakd.preflight import preflight  # after load_config: the checks need a valid config

        preflight(cfg)  # before anything is loaded: a bad address or path costs a second, not a soak
        if command == "sweep":
            from soakd.run.sweep import sweep_command  # lazy: only the subcommand's own modules load

            return sweep_command(cfg, ns)
        if cfg.load.workers > 1:
            from soakd.run.workers import run_workers  # lazy: the parent of driver processes loads no model code

            return run_workers(cfg, overrides, {key: flag for flag, (key, _) in RUN_FLAGS.items()}, ns.config)
        from soakd.run.session import run  # lazy: only the subcommand's own modules load

        return run(cfg)
    except RunFailed as exc:
        print(f"soakd: error: {exc}", file=sys.stderr)
        return Exit.CRASH
    except SoakdError as exc:
        kind = "config error" if isinstance(exc, ConfigError) else "error"
        print(f"soakd: {kind}: {exc}", file=sys.stderr)
        return Exit.USAGE
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            print(f"soakd: error: cannot listen: {exc.strerror} (metrics.addr / --metrics-addr)", file=sys.stderr)
            return Exit.USAGE
        logging.getLogger("soakd").exception("soakd crashed")
        return Exit.CRASH


def entry() -> None:
    """The ``soakd`` command. Exits even when user code (a model factory) left non-daemon
    threads running, which would otherwise keep the process alive after the run has ended, and
    without the interpreter's seconds-long final garbage collection."""
    code = main()
    stray = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if stray:
        logging.getLogger("soakd").warning(
            "exiting past %d thread(s) left running by user code: %s", len(stray), ", ".join(sorted(stray)[:5])
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    # The interpreter's teardown runs full collections over every object still alive: ~280k with
    # torch, numpy, grpc and aiohttp loaded, 1-3 s of CPU and tens of seconds on a loaded host,
    # after the run (or a failed start) has ended (#15). Frozen, those collections skip them;
    # atexit handlers, thread joins and file flushes still run as on any exit.
    gc.freeze()
    sys.exit(code)
