"""``smdebug-rules``: run built-in rules against a run directory (finished or still training).

Usage::

    smdebug-rules RUN_DIR [--rules VanishingGradient,ExplodingTensor,...]
                  [--param Rule.key=value ...] [--follow] [--report PATH]
                  [--start-step N] [--end-step N] [--stop-training] [--idle-timeout S]
    smdebug-rules --list
    python -m smdebug.rules ...            # the same

Without ``--rules`` every built-in rule that works with its default parameters runs (see
``--list``). Each step is read once for all rules. Rules that fire are printed as they fire,
with a summary at the end. ``--follow`` waits for new steps until the run's end marker
appears (or ``--idle-timeout`` seconds pass without a new step); without it, the steps
present now are evaluated. ``--stop-training`` asks the training process to stop when a rule
fires (the stop-request file of ``smdebug.rules.stop_protocol``).

Reports: every rule's JSON report goes to ``RUN_DIR/rule_reports/<Rule>.json``; ``--report
PATH`` also writes all of them in one file ``{"run": ..., "rules": {name: report}}``.

Parameter values are Python literals when they parse as one (``1e-5``, ``True``,
``(-9, 9)``, ``['a', 'b']``) and strings otherwise (``gradients,weights``, ``TRAIN``).

Exit status: 0 no rule fired; 1 a rule fired; 2 usage error (bad option, unknown rule or
parameter, bad value, no such directory); 3 the run could not be read; 130 interrupted.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from typing import Dict, List, Optional

from ..exceptions import ConfigError, SMDebugError
from .actions import StopTraining
from .builtin import BUILTIN_RULES, NEEDS_PARAMETERS, default_rule_names, rule_parameters
from .report import default_report_path
from .rule import run_rules

EXIT_OK, EXIT_FIRED, EXIT_USAGE, EXIT_UNREADABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smdebug-rules",
        description="Run smdebug built-in rules against a run directory.",
        epilog="Exit status: 0 nothing fired, 1 a rule fired, 2 usage error, 3 run unreadable.",
    )
    parser.add_argument("run_dir", nargs="?", help="the run directory (the hook's out_dir)")
    parser.add_argument("--rules", help="comma-separated built-in rule names (default: every rule that needs no "
                                        "parameters; see --list)")
    parser.add_argument("--param", action="append", default=[], metavar="RULE.KEY=VALUE",
                        help="a rule parameter, e.g. VanishingGradient.threshold=1e-5 (repeatable)")
    parser.add_argument("--follow", action="store_true",
                        help="keep evaluating new steps until training ends")
    parser.add_argument("--report", metavar="PATH", help="also write all reports into this one JSON file")
    parser.add_argument("--start-step", type=int, default=0, metavar="N", help="first global step (default 0)")
    parser.add_argument("--end-step", type=int, default=None, metavar="N", help="stop before this global step")
    parser.add_argument("--stop-training", action="store_true",
                        help="when a rule fires, ask the training process to stop (stop-request file)")
    parser.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                        help="with --follow: give up after S seconds without a new step")
    parser.add_argument("--poll-interval", type=float, default=0.5, metavar="S",
                        help="with --follow: seconds between looks for new steps (default 0.5)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="show a progress bar (default: when stderr is a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--list", action="store_true", help="list the built-in rules and their parameters")
    return parser


def _rule_names(spec: Optional[str]) -> List[str]:
    if spec is None:
        return default_rule_names()
    by_lower = {name.lower(): name for name in BUILTIN_RULES}
    names = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name = by_lower.get(item.lower())
        if name is None:
            raise _UsageError(f"unknown rule {item!r}; built-in rules: {', '.join(BUILTIN_RULES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise _UsageError("--rules names no rule")
    return names


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _params(specs: List[str], names: List[str]) -> Dict[str, Dict[str, object]]:
    out: Dict[str, Dict[str, object]] = {name: {} for name in names}
    by_lower = {name.lower(): name for name in names}
    for spec in specs:
        key, eq, value = spec.partition("=")
        rule, dot, param = key.strip().partition(".")
        if not eq or not dot or not rule or not param:
            raise _UsageError(f"--param {spec!r}: expected RULE.KEY=VALUE, e.g. VanishingGradient.threshold=1e-5")
        name = by_lower.get(rule.lower())
        if name is None:
            hint = "" if rule not in BUILTIN_RULES and rule.lower() not in {n.lower() for n in BUILTIN_RULES} \
                else " (add it to --rules)"
            raise _UsageError(f"--param {spec!r}: rule {rule!r} is not among the rules being run{hint}")
        allowed = rule_parameters(name)
        if param not in allowed:
            raise _UsageError(f"--param {spec!r}: {name} has no parameter {param!r}; its parameters: "
                              f"{', '.join(allowed)}")
        out[name][param] = _parse_value(value.strip())
    return out


def _list_rules() -> str:
    lines = []
    for name, cls in BUILTIN_RULES.items():
        import inspect

        params = []
        for pname, p in inspect.signature(cls.__init__).parameters.items():
            if pname in ("self", "base_trial", "actions", "name"):
                continue
            params.append(pname if p.default is inspect.Parameter.empty else f"{pname}={p.default!r}")
        marker = "  (needs parameters; not run by default)" if name in NEEDS_PARAMETERS else ""
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        lines.append(f"{name}{marker}\n    {summary}\n    parameters: {', '.join(params) or '-'}")
    return "\n".join(lines)


def _writer(progress_bar: bool):
    if progress_bar:
        try:
            from tqdm.auto import tqdm

            return lambda text: tqdm.write(text, file=sys.stdout)
        except ImportError:  # pragma: no cover
            pass
    return lambda text: print(text, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``smdebug-rules``; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 for --help
        return int(exc.code or 0)
    if args.list:
        print(_list_rules())
        return EXIT_OK
    try:
        if args.run_dir is None:
            raise _UsageError("give the run directory (or --list)")
        run_dir = os.path.abspath(os.path.expanduser(args.run_dir))
        if not os.path.isdir(run_dir):
            raise _UsageError(f"{args.run_dir}: no such directory")
        if args.start_step < 0 or (args.end_step is not None and args.end_step <= args.start_step):
            raise _UsageError(f"--start-step {args.start_step} / --end-step {args.end_step}: need "
                              "0 <= start < end")
        if args.idle_timeout is not None and args.idle_timeout < 0:
            raise _UsageError("--idle-timeout must be >= 0")
        if not args.poll_interval > 0:
            raise _UsageError("--poll-interval must be > 0")
        names = _rule_names(args.rules)
        params = _params(args.param, names)
    except _UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from ..trials import create_trial

    try:
        # Not following: a directory without a collections file is an error at once.
        wait = float("inf") if args.follow and args.idle_timeout is None else (
            args.idle_timeout if args.follow else 0.0)
        trial = create_trial(run_dir, wait_timeout=wait)
    except SMDebugError as exc:
        print(f"smdebug-rules: cannot read {run_dir}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE

    try:
        rules = [BUILTIN_RULES[name](trial, **params[name]) for name in names]
    except (ConfigError, ValueError, TypeError) as exc:
        parser.print_usage(sys.stderr)
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    emit = _writer(show_progress)

    def on_fire(rule, step, message):
        mode, mode_step = trial.mode_modestep(step) if step >= 0 else (None, None)
        where = f"step {step}" + (f" ({mode.name} {mode_step})" if mode is not None else "")
        emit(f"{where}: {rule.rule_name}: {message}")

    status = EXIT_OK
    try:
        run_rules(rules, args.start_step, args.end_step, actions=[StopTraining()] if args.stop_training else None,
                  follow=args.follow, poll_interval=args.poll_interval, idle_timeout=args.idle_timeout,
                  on_fire=on_fire, progress=show_progress)
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    except (SMDebugError, OSError) as exc:
        print(f"smdebug-rules: error while reading {run_dir}: {exc}", file=sys.stderr)
        status = EXIT_UNREADABLE

    width = max(len(r.rule_name) for r in rules)
    reports = {}
    for rule in rules:
        report = rule.report.to_dict()
        reports[rule.rule_name] = report
        if report["triggered"]:
            steps = [v["step"] for v in report["violations"]]
            shown = ", ".join(map(str, steps[:10])) + (" ..." if len(steps) > 10 else "")
            line = f"fired at {report['triggered']} step(s): {shown}"
        else:
            line = "did not fire" + (f" ({report['notices'][0]})" if report["notices"] else "")
        print(f"{rule.rule_name:<{width}}  {line}  ({report['datapoints']} steps evaluated)")
    if args.report:
        try:
            directory = os.path.dirname(os.path.abspath(args.report))
            os.makedirs(directory, exist_ok=True)
            with open(args.report, "w") as fh:
                json.dump({"run": run_dir, "rules": reports}, fh, indent=1)
        except OSError as exc:
            print(f"smdebug-rules: cannot write --report {args.report}: {exc.strerror or exc}", file=sys.stderr)
            status = status or EXIT_USAGE
    print(f"reports: {os.path.dirname(default_report_path(run_dir, 'x'))}"
          + (f", {args.report}" if args.report else ""))
    if status:
        return status
    return EXIT_FIRED if any(r["triggered"] for r in reports.values()) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
