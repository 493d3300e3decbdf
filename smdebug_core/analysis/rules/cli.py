"""``smdebug-rules``: run built-in rules against a run directory (finished or still training).

Usage::

    smdebug-rules RUN_DIR [--rules VanishingGradient,ExplodingTensor,...]
                  [--param Rule.key=value ...] [--follow] [--report DIR] [--verbose]
                  [--start-step N] [--end-step N] [--stop-training] [--idle-timeout S]
    smdebug-rules --list
    python -m smdebug.rules ...            # the same

Without ``--rules`` the rules are chosen from what the run contains: of the built-in rules
that work with their default parameters (see ``--list``), those with something to read (no
gradient rules for an XGBoost run, no tree rules for a PyTorch run, no loss rules without
losses); the skipped ones are listed with the reason. Each step is read once for all rules.

Output: one line per rule at the end: how many of the evaluated steps it fired at, the
first and last of them and the worst firing (by the rule's measure); for a rule that did
not fire, how many steps were evaluated and why the others were not. ``--verbose`` prints
every firing as it happens and the rules' notices. ``--follow`` waits for the run directory
to appear and for new steps until the run's end marker appears (or ``--idle-timeout``
seconds pass without a new step), printing each rule's first firing as it happens; without
it, the steps present now are evaluated. ``--stop-training`` asks the training process to
stop when a rule fires (the stop-request file of ``smdebug.storage.stop_request``).

Reports: with ``--report DIR``, each rule's JSON report goes to ``DIR/<Rule>.json`` and all
of them, with the skipped rules, to ``DIR/summary.json``; without it nothing is written.

Parameter values are Python literals when they parse as one (``1e-5``, ``True``,
``(-9, 9)``, ``['a', 'b']``) and strings otherwise (``gradients,weights``, ``TRAIN``).

Exit status: 0 no rule fired; 1 a rule fired; 2 usage error (bad option, unknown rule or
parameter, bad value, no such directory); 3 the run could not be read; 130 interrupted.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import sys
import textwrap
from typing import Dict, List, Optional

from ...exceptions import ConfigError, RunNotFound, SMDebugError
from .actions import StopTraining
from .builtin import BUILTIN_RULES, NEEDS_PARAMETERS, choose_rules, make_rule, rule_parameters
from .report import culprit_line, summary_line
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
    parser.add_argument("--rules", help="comma-separated built-in rule names (default: the rules that work with "
                                        "their defaults and have something to read in this run; see --list)")
    parser.add_argument("--param", action="append", default=[], metavar="RULE.KEY=VALUE",
                        help="a rule parameter, e.g. VanishingGradient.threshold=1e-5 (repeatable)")
    parser.add_argument("--follow", action="store_true",
                        help="wait for the run directory and keep evaluating new steps until training ends")
    parser.add_argument("--report", metavar="DIR", help="write each rule's JSON report to DIR/<Rule>.json and "
                                                        "all of them to DIR/summary.json (default: no files)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="print every firing as it happens and the rules' notices")
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


def _rule_names(spec: str) -> List[str]:
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


def _params(specs: List[str], names: Optional[List[str]]) -> Dict[str, Dict[str, object]]:
    """``--param`` values by rule; ``names`` None: any built-in rule (the set is chosen later)."""
    allowed_rules = names if names is not None else list(BUILTIN_RULES)
    out: Dict[str, Dict[str, object]] = {name: {} for name in allowed_rules}
    by_lower = {name.lower(): name for name in allowed_rules}
    for spec in specs:
        key, eq, value = spec.partition("=")
        rule, dot, param = key.strip().partition(".")
        if not eq or not dot or not rule or not param:
            raise _UsageError(f"--param {spec!r}: expected RULE.KEY=VALUE, e.g. VanishingGradient.threshold=1e-5")
        name = by_lower.get(rule.lower())
        if name is None:
            hint = "" if rule.lower() not in {n.lower() for n in BUILTIN_RULES} else " (add it to --rules)"
            raise _UsageError(f"--param {spec!r}: rule {rule!r} is not among the rules being run{hint}")
        allowed = rule_parameters(name)
        if param not in allowed:
            raise _UsageError(f"--param {spec!r}: {name} has no parameter {param!r}; its parameters: "
                              f"{', '.join(allowed)}")
        out[name][param] = _parse_value(value.strip())
    return out


def _plain(text: str) -> str:
    """A docstring as a terminal shows it: ``code`` and :role:`~a.b.Name` markup as plain words."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def _list_rules() -> str:
    """Every built-in rule with its whole description and parameters (nothing cut)."""
    blocks = []
    for name, cls in BUILTIN_RULES.items():
        params = []
        for pname, p in inspect.signature(cls.__init__).parameters.items():
            if pname in ("self", "base_trial", "actions", "name"):
                continue
            params.append(pname if p.default is inspect.Parameter.empty else f"{pname}={p.default!r}")
        marker = "  (needs parameters; not run by default)" if name in NEEDS_PARAMETERS else ""
        description = textwrap.indent(_plain(inspect.cleandoc(cls.__doc__ or "")), "    ")
        blocks.append(f"{name}{marker}\n{description}\n    parameters: {', '.join(params) or '-'}\n"
                      f"    reads: {cls.reads_what}")
    return "\n\n".join(blocks)


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
        from ...storage import remote

        # A URL (s3://...) is opened as it is; a local path is made absolute.
        run_dir = (args.run_dir.strip() if remote.is_url(args.run_dir.strip())
                   else os.path.abspath(os.path.expanduser(args.run_dir)))
        if args.start_step < 0 or (args.end_step is not None and args.end_step <= args.start_step):
            raise _UsageError(f"--start-step {args.start_step} / --end-step {args.end_step}: need "
                              "0 <= start < end")
        if args.idle_timeout is not None and args.idle_timeout < 0:
            raise _UsageError("--idle-timeout must be >= 0")
        if not args.poll_interval > 0:
            raise _UsageError("--poll-interval must be > 0")
        if args.report is not None and remote.is_url(args.report):
            raise _UsageError(f"--report {args.report}: reports are written to a local directory (they are "
                              "rewritten as the rules run); give a path, then copy it where you want it")
        if args.report is not None and os.path.isfile(args.report):
            raise _UsageError(f"--report {args.report}: is a file; give a directory for the reports")
        names = _rule_names(args.rules) if args.rules is not None else None
        params = _params(args.param, names)
    except _UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from ..trials import create_trial

    try:
        # Following waits for the directory and its first files; otherwise what is not a run
        # now is an error at once.
        wait = float("inf") if args.follow and args.idle_timeout is None else (
            args.idle_timeout if args.follow else 0.0)
        trial = create_trial(run_dir, wait_timeout=wait)
    except RunNotFound as exc:
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (SMDebugError, OSError) as exc:
        print(f"smdebug-rules: cannot read {run_dir}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except (ImportError, ValueError) as exc:  # a URL whose filesystem is not installed, an unknown scheme
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    skipped: Dict[str, str] = {}
    if names is None:
        names, skipped, contents = choose_rules(trial)
        saved = ", ".join(sorted(contents.saved)) or "none"
        print(f"{contents.framework} run, collections with saved tensors: {saved}; running {len(names)} of the "
              f"default rules" + (f", skipping {len(skipped)}:" if skipped else ""))
        for name, reason in skipped.items():
            print(f"  skipped {name}: {reason}")
        if not names:
            print("smdebug-rules: no default rule has anything to read in this run; name rules with --rules",
                  file=sys.stderr)
            return EXIT_OK
    try:
        rules = [make_rule(name, trial, **params.get(name, {})) for name in names]
    except (ConfigError, ValueError, TypeError) as exc:
        parser.print_usage(sys.stderr)
        print(f"smdebug-rules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    emit = _writer(show_progress)
    announced: set = set()

    def on_fire(rule, step, message):
        if not args.verbose:
            if not args.follow or rule.rule_name in announced:
                return  # the summary says it; following, the first firing is news
            announced.add(rule.rule_name)
        mode, mode_step = trial.mode_modestep(step) if step >= 0 else (None, None)
        where = f"step {step}" + (f" ({mode.name} {mode_step})" if mode is not None else "")
        more = "" if args.verbose else " (later firings: in the summary)"
        emit(f"{where}: {rule.rule_name}: {message}{more}")

    report_dir = os.path.abspath(args.report) if args.report else None
    report_paths = {id(r): (os.path.join(report_dir, f"{r.rule_name}.json") if report_dir else None) for r in rules}
    status = EXIT_OK
    try:
        run_rules(rules, args.start_step, args.end_step, actions=[StopTraining()] if args.stop_training else None,
                  report_paths=report_paths, follow=args.follow, poll_interval=args.poll_interval,
                  idle_timeout=args.idle_timeout, on_fire=on_fire, progress=show_progress)
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
        print(f"{rule.rule_name:<{width}}  {summary_line(rule, report)}")
        culprit = culprit_line(report)
        if culprit:
            print(f"{'':<{width}}  culprit: {culprit}")
        if args.verbose:
            for text in report["notices"] + report["errors"]:
                print(f"{'':<{width}}    {text}")
    if report_dir:
        try:
            os.makedirs(report_dir, exist_ok=True)
            with open(os.path.join(report_dir, "summary.json"), "w") as fh:
                json.dump({"run": run_dir, "rules": reports, "skipped": skipped}, fh, indent=1)
            print(f"reports: {report_dir}")
        except OSError as exc:
            print(f"smdebug-rules: cannot write --report {args.report}: {exc.strerror or exc}", file=sys.stderr)
            status = status or EXIT_USAGE
    if status:
        return status
    return EXIT_FIRED if any(r["triggered"] for r in reports.values()) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
