"""The ``smdebug`` command: look at a run from the shell.

    smdebug ls RUN                              modes, steps, workers, collections, tensors
    smdebug show RUN TENSOR [--step N] [--mode M]
    smdebug plot RUN [TENSOR...] [--regex R] -o curves.png [--reduction l2] [--hist --step N]
    smdebug export RUN -o values.csv|values.parquet [--tensor T] [--regex R] [--mode M]
    smdebug export RUN --format parquet -o DIR   partitioned by worker and mode (DuckDB, Polars, Spark)
    smdebug compare RUN_A RUN_B [RUN...] [--diverge [--rtol R --atol A]] [-o overlay.png]
    smdebug report RUN [-o report.html] [--reduction l2] [--smooth W] [--no-rules] [--rules-budget S]
    smdebug rules RUN ...                       the built-in rules (also ``smdebug-rules``)
    smdebug --version

Progress bars appear on a terminal for long reads, nothing otherwise. Exit status: 0 fine,
2 usage error, 3 the run or what was asked for cannot be read (rules: see ``smdebug rules -h``;
compare --diverge: 1 when the runs diverge, as ``diff``).
pandas is not needed (CSV export writes the table itself) except by compare; plots need
matplotlib, parquet needs pyarrow: each says how to install it when missing.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
from typing import List, Optional

EXIT_OK, EXIT_USAGE, EXIT_UNREADABLE = 0, 2, 3
_SHOWN_TENSORS = 200


class _Failure(Exception):
    """A message for stderr and an exit status."""

    def __init__(self, message: str, status: int = EXIT_UNREADABLE):
        super().__init__(message)
        self.status = status


def _parser() -> argparse.ArgumentParser:
    from .._version import __version__
    from .heatmaps import MAX_LINES
    from .report import RULES_BUDGET_S

    parser = argparse.ArgumentParser(prog="smdebug", description="Look at runs saved by smdebug hooks.",
                                     epilog="Exit status: 0 fine, 2 usage error, 3 the run or the data asked for "
                                            "cannot be read.")
    parser.add_argument("--version", action="version", version=f"smdebug-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def run_arg(p):
        p.add_argument("run", help="the run directory (the hook's out_dir)")
        p.add_argument("--wait", type=float, default=0.0, metavar="S",
                       help="seconds to wait for a run that has not written its collections file yet (default 0)")

    p = sub.add_parser("ls", help="what a run holds: modes, steps, workers, collections, tensors")
    run_arg(p)
    p.add_argument("--no-shapes", action="store_true", help="do not read a value of each tensor for its shape")

    p = sub.add_parser("show", help="a tensor's value and saved reductions at a step")
    run_arg(p)
    p.add_argument("tensor")
    p.add_argument("--step", type=int, help="the step (default: the tensor's last saved step)")
    p.add_argument("--mode", help="TRAIN, EVAL, PREDICT (steps are then that mode's own numbers)")
    p.add_argument("--worker", help="whose value (default: the first worker that saved it)")

    p = sub.add_parser("plot", help="tensors over the steps (or a histogram) to a PNG file")
    run_arg(p)
    p.add_argument("tensors", nargs="*", metavar="TENSOR",
                   help="a tensor name, or NAME@REDUCTION for one of its saved reductions (loss gradient/fc@l2)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png")
    p.add_argument("--regex", action="append",
                   help="also the tensors whose name matches (repeatable): --regex 'gradient/.*weight'")
    p.add_argument("--collection", action="append", help="also the tensors of a collection (repeatable)")
    p.add_argument("--reduction", action="append",
                   help="plot this reduction (l2, max, abs_mean...) instead of the values: saved, or computed from "
                        "saved full values; repeatable")
    p.add_argument("--mode", action="append", help="only this mode (repeatable; default: all)")
    p.add_argument("--x", choices=("step", "mode_step"), default="step",
                   help="x axis: global steps (default) or each mode's own steps")
    p.add_argument("--logy", action="store_true", help="logarithmic y axis (colour scale of a heatmap)")
    p.add_argument("--smooth", type=float, default=0.0, metavar="W",
                   help="exponential moving average weight in [0, 1) drawn over the saved values (default 0: none)")
    p.add_argument("--heatmap", action="store_true",
                   help=f"a heatmap (rows: tensors) even for few series; automatic past {MAX_LINES} series")
    p.add_argument("--hist", action="store_true", help="a histogram of the value at --step instead (one tensor)")
    p.add_argument("--step", type=int, help="with --hist: the step (default: the last saved value)")
    p.add_argument("--bins", type=_positive_int, default=50, help="with --hist: how many bins (default 50)")

    p = sub.add_parser("export", help="scalars and saved reductions as a long table (CSV or parquet), or to W&B/MLflow")
    run_arg(p)
    p.add_argument("-o", "--output", metavar="FILE.csv|FILE.parquet|DIR",
                   help="the file (its suffix says the format), or with --format parquet a new or empty directory")
    p.add_argument("--format", choices=("csv", "parquet"),
                   help="parquet: a directory of Parquet files partitioned by worker and mode "
                        "(worker=W/mode=M/part-0.parquet), a group of workers at a time; csv: one CSV file")
    p.add_argument("--tensor", action="append", help="a tensor name (repeatable; default: all tensors)")
    p.add_argument("--regex", action="append", help="tensors whose name matches (repeatable)")
    p.add_argument("--collection", action="append", help="tensors of a collection (repeatable)")
    p.add_argument("--mode", action="append", help="only this mode (repeatable)")
    p.add_argument("--to", choices=("wandb", "mlflow"), help="send to a W&B or MLflow run instead of a file (each "
                   "tool's own settings: WANDB_PROJECT, WANDB_MODE...; MLFLOW_TRACKING_URI...)")
    p.add_argument("--max-points", type=_positive_int, default=1000, help="with --to: points per series at most; "
                   "a longer one keeps each bin's minimum and maximum (default 1000)")
    p.add_argument("--worker", help="with --to: the worker whose values are sent (default worker_0)")

    _compare_parser(sub, run_arg)

    p = sub.add_parser("convert", help="a run in the other layout: the run store or smdebug 1.0.34's files")
    p.add_argument("run", help="the run directory to convert")
    p.add_argument("--to", required=True, choices=["1.0.34", "store"],
                   help="1.0.34: the events/ and index/ files smdebug 1.0.34 reads; store: the run store")
    p.add_argument("-o", "--output", required=True, help="a new directory for the converted run")

    p = sub.add_parser("report", help="one self-contained HTML file showing the whole run")
    run_arg(p)
    p.add_argument("-o", "--output", default="report.html", metavar="FILE.html",
                   help="where to write it (default report.html)")
    p.add_argument("--reduction", default="l2",
                   help="what the per-layer heatmaps show: l2 (default), abs_max, mean... (saved, or computed "
                        "from saved full values)")
    p.add_argument("--smooth", type=float, default=0.6, metavar="W",
                   help="curves: exponential moving average weight in [0, 1) (default 0.6; 0: none)")
    p.add_argument("--no-rules", action="store_true", help="do not run the default rules (no findings)")
    p.add_argument("--rules-budget", type=float, default=None, metavar="S",
                   help=f"seconds the rules may take (default {RULES_BUDGET_S:g}; 0: every step, however long)")

    p = sub.add_parser("rules", help="run the built-in rules (the smdebug-rules command)", add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _open(args):
    from .trials import create_trial

    return create_trial(args.run, wait_timeout=args.wait)


def _table(headers: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _steps_span(steps: List[int]) -> str:
    return f"{len(steps)} ({steps[0]}..{steps[-1]})" if steps else "0"


def _saved_kinds(entry) -> str:
    """What a tensor has saved, from the run's catalog (no value read): values, reductions, shapes."""
    kinds = ["values"] if entry.has_value else []
    if entry.reductions:
        kinds.append("reductions " + ",".join(sorted(entry.reductions)))
    if "shape" in entry.kinds:
        kinds.append("shapes")
    return "; ".join(kinds)


def _cmd_ls(args) -> int:
    from ..exceptions import ShapeUnavailableForStep

    trial = _open(args)
    info = trial.summary()
    print(f"run       {info['path']}")
    print(f"state     {'ended' if info['ended'] else 'not ended (training, or stopped without an end marker)'}")
    print(f"workers   {', '.join(info['workers']) or 'none'}")
    for mode, (count, first, last) in info["modes"].items():
        print(f"{mode:<9} {count} steps ({first}..{last})" if count else f"{mode:<9} 0 steps")
    print(f"collections  {', '.join(info['collections']) or 'none'}")
    budget = trial.overhead_budget()
    if budget is not None:  # the saved steps of expensive collections followed the hook's measured cost
        print(f"overhead budget  {budget['text']}")
    for worker, marker in sorted(trial.flight_recorder_triggers().items()):  # docs/flight_recorder.md
        origin = marker.get("first_nonfinite") or {}
        where = f"; first non-finite: {origin.get('phase')} of {origin.get('module')}" if origin else ""
        print(f"flight recorder ({worker}): {marker.get('trigger')} at step {marker.get('global_step')} "
              f"({marker.get('reason')}); wrote steps {marker.get('steps_written')}{where}")
    names = trial.tensor_names(show_incomplete_steps=True)
    catalog = trial.catalog()
    print(f"tensors   {len(names)}")
    rows = []
    for name in names[:_SHOWN_TENSORS]:
        tensor = trial.tensor(name)
        steps = tensor.steps(show_incomplete_steps=True)
        shape = ""
        if not args.no_shapes and steps:
            try:
                shape = str(tuple(tensor.shape(steps[-1])))
            except ShapeUnavailableForStep:  # only reductions saved: no value, no shape
                shape = "-"
            except Exception as exc:  # noqa: BLE001 - a listing goes on past one unreadable value
                shape = f"? ({type(exc).__name__})"
        rows.append([name, _steps_span(steps), shape, _saved_kinds(catalog[name])])
    if rows:
        print(_table(["tensor", "steps", "shape", "saved"], rows))
    if len(names) > _SHOWN_TENSORS:
        print(f"... and {len(names) - _SHOWN_TENSORS} more (smdebug export lists every value)")
    return EXIT_OK


def _cmd_show(args) -> int:
    import numpy as np

    from ..modes import ModeKeys
    from ..reduction_config import reduction_label as label

    trial = _open(args)
    tensor = trial.tensor(args.tensor)
    mode = ModeKeys.parse(args.mode) if args.mode else ModeKeys.GLOBAL
    step = args.step
    if step is None:
        steps = tensor.steps(mode=mode)
        if not steps:
            raise _Failure(f"tensor {args.tensor!r} has no steps in mode {mode.name}")
        step = steps[-1]
    elif step not in tensor.steps(mode=mode):
        tensor.value(step, mode=mode, worker=args.worker)  # raises the reader's error: which steps it has
    g = trial.global_step(mode, step)
    m, ms = trial.mode_modestep(g)
    print(f"{tensor.name} at global step {g} ({m.name} step {ms}), workers {', '.join(tensor.workers(g))}")
    try:
        value = tensor.value(step, mode=mode, worker=args.worker)
    except Exception as exc:  # noqa: BLE001 - no value saved: reductions may still be there
        print(f"value: none ({type(exc).__name__}: {exc})")
    else:
        print(f"dtype {value.dtype}, shape {tuple(value.shape)}")
        with np.printoptions(threshold=200, edgeitems=4, linewidth=100):
            print(value)
    reductions = tensor.reduction_values(step, mode=mode, worker=args.worker)
    if reductions:
        print("saved reductions:")
        print(_table(["reduction", "value"], [[label(*k), f"{float(v):.8g}"]
                                              for k, v in sorted(reductions.items(), key=lambda kv: label(*kv[0]))]))
    return EXIT_OK


def _cmd_plot(args) -> int:
    try:
        import matplotlib
    except ImportError:
        raise _Failure("smdebug plot needs matplotlib, which is not installed: pip install matplotlib "
                       "(smdebug-core's 'plot' extra)",
                       EXIT_USAGE) from None
    matplotlib.use("Agg")  # files only: no display needed
    from .heatmaps import natural_sorted
    from .plots import plot_histogram, plot_tensors

    if not args.output.lower().endswith(".png"):
        raise _Failure(f"-o {args.output}: give a .png file name", EXIT_USAGE)
    if not 0 <= args.smooth < 1:
        raise _Failure(f"--smooth {args.smooth:g}: give a weight from 0 (no smoothing) to below 1", EXIT_USAGE)
    if not (args.tensors or args.regex or args.collection):
        raise _Failure("give a TENSOR, --regex or --collection to plot", EXIT_USAGE)
    trial = _open(args)
    if args.regex or args.collection:
        matched = sorted(set(trial.tensor_names(collection=args.collection) if args.collection else []) |
                         set(trial.tensor_names(regex=args.regex) if args.regex else []))
        if not matched:
            raise _Failure(f"no saved tensor matches --regex {args.regex or []} --collection {args.collection or []}; "
                           f"`smdebug ls {args.run}` lists them")
        if len(matched) > _MAX_ROWS:
            raise _Failure(f"{len(matched)} tensors match (the first: {', '.join(matched[:3])}); a heatmap of more "
                           f"than {_MAX_ROWS} rows is unreadable: narrow the --regex", EXIT_USAGE)
        if not args.hist:  # matches without a line to draw (not scalars, not that reduction) are left out
            table = trial.to_table(matched, mode=args.mode, reductions=args.reduction)
            wanted = set(args.reduction or [""])
            drawable = {t for t, r in zip(table.column("tensor"), table.column("reduction")) if r in wanted}
            left_out = [name for name in matched if name not in drawable]
            matched = [name for name in matched if name in drawable]
            if left_out:
                what = f"reduction {', '.join(sorted(wanted))}" if args.reduction else "scalar values (pass --reduction)"
                print(f"left out {len(left_out)} matching tensors without {what}: {', '.join(left_out[:5])}"
                      + (", ..." if len(left_out) > 5 else ""), file=sys.stderr)
            if not matched and not args.tensors:
                raise _Failure(f"no tensor matching --regex/--collection has {what} to plot")
        args.tensors = list(args.tensors) + natural_sorted(name for name in matched if name not in args.tensors)
    if args.hist:
        if len(args.tensors) != 1:
            raise _Failure("--hist draws one tensor; give exactly one TENSOR", EXIT_USAGE)
        modes = args.mode or ["GLOBAL"]
        if len(modes) != 1:
            raise _Failure("--hist takes at most one --mode", EXIT_USAGE)
        tensor = trial.tensor(args.tensors[0])
        step = args.step
        if step is None:
            values = tensor.steps(mode=modes[0])
            step = next((s for s in reversed(values) if _has_value(tensor, s, modes[0])), None)
            if step is None:
                raise _Failure(f"tensor {tensor.name!r} has no saved value to draw a histogram of")
        ax = plot_histogram(trial, tensor.name, step, mode=modes[0], bins=args.bins)
    else:
        items = [tuple(t.rsplit("@", 1)) if "@" in t else t for t in args.tensors]
        ax = plot_tensors(trial, items, reduction=args.reduction, mode=args.mode, x=args.x, logy=args.logy,
                          smooth=args.smooth, heatmap=args.heatmap or None)
    ax.figure.tight_layout()
    ax.figure.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")
    return EXIT_OK


#: The most tensors ``smdebug plot --regex``/``--collection`` draws on one figure (as heatmap rows).
_MAX_ROWS = 1000


def _has_value(tensor, step, mode) -> bool:
    try:
        tensor.value(step, mode=mode)
        return True
    except Exception:  # noqa: BLE001 - only reductions or a shape at that step
        return False


def _cmd_export(args) -> int:
    from .trials.parquet import require_pyarrow

    if args.to:
        return _cmd_export_tracker(args)
    out = args.output
    if not out:
        raise _Failure("export needs -o FILE.csv|FILE.parquet|DIR, or --to wandb|mlflow", EXIT_USAGE)
    lower = out.lower()
    fmt = args.format or ("csv" if lower.endswith(".csv") else "parquet file" if lower.endswith(".parquet") else None)
    if fmt is None:
        raise _Failure(f"-o {out}: give a file name ending in .csv or .parquet, or --format parquet for a directory "
                       "partitioned by worker and mode", EXIT_USAGE)
    if fmt != "csv":
        try:
            require_pyarrow("parquet export")
        except ImportError as exc:
            raise _Failure(f"{exc} (or export to .csv)", EXIT_USAGE) from None
    from ..storage.remote import is_url

    local = not is_url(out)
    if fmt == "parquet" and local and os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise _Failure(f"-o {out}: give a new or empty directory for the partitioned Parquet files", EXIT_USAGE)
    trial = _open(args)
    names = args.tensor
    if fmt == "parquet":
        made = local and not os.path.exists(out)
        from .trials.parquet import write_partitioned

        files = write_partitioned(trial, out, names=names, regex=args.regex, collection=args.collection,
                                  mode=args.mode)
        if not files and made:
            os.rmdir(out)
        rows = sum(count for _, count in files)
    else:
        table = trial.to_table(names, regex=args.regex, collection=args.collection, mode=args.mode)
        rows = len(table)
    if not rows:
        chosen = ", ".join(names) if names else "the selected tensors"
        raise _Failure(f"nothing to export: {chosen} saved no scalar values or reductions{_mode_clause(args)} "
                       "(export writes one number a row; see a full tensor with: smdebug show RUN TENSOR --step N); "
                       f"{out} was not written", EXIT_USAGE)
    from .trials.table import COLUMNS

    if fmt == "csv":
        with open(out, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            # repr of a float is the shortest text that reads back as the same float64.
            writer.writerows((*row[:6], repr(row[6])) for row in table.rows())
    elif fmt == "parquet file":
        from .trials.parquet import write_file

        write_file(table, out)
    if fmt == "parquet":
        print(f"wrote {rows} rows to {out} in {len(files)} files (worker=W/mode=M/part-0.parquet)")
    else:
        print(f"wrote {rows} rows to {out}")
    return EXIT_OK


def _cmd_export_tracker(args) -> int:
    from .tracker_export import export_to_tracker

    try:
        sent = export_to_tracker(_open(args), args.to, names=args.tensor, regex=args.regex,
                                 collection=args.collection, mode=args.mode, worker=args.worker,
                                 max_points=args.max_points)
    except (ImportError, ValueError) as exc:
        raise _Failure(str(exc), EXIT_USAGE) from None
    print(f"sent {sent['points']} values of {sent['steps']} steps ({sent['worker']}) to {args.to}"
          + (f"; {sent['dropped']} over the series cap left out" if sent["dropped"] else ""))
    return EXIT_OK


# ---------------------------------------------------------------------- smdebug compare
EXIT_DIVERGED = 1
_SHOWN_COMPARED = 40


def _compare_parser(sub, run_arg) -> None:
    p = sub.add_parser("compare", help="the same tensors of several runs: overlaid (-o), or the first divergence",
                       description="Compare runs (the first is the reference): a table of how far each tensor "
                                   "differs, an overlay plot (-o), or with --diverge the first (step, tensor) "
                                   "where they differ beyond the tolerance (exit 1, as diff; 0 when they agree).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more run directories (hooks' out_dir)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="seconds to wait for a run that has not written its collections file yet (default 0)")
    p.add_argument("--tensor", action="append", help="a tensor name (repeatable; default: all tensors)")
    p.add_argument("--regex", action="append", help="tensors whose name matches (repeatable)")
    p.add_argument("--collection", action="append", help="tensors of a collection (repeatable)")
    p.add_argument("--mode", action="append", help="only this mode (repeatable)")
    p.add_argument("--worker", action="append",
                   help="compare this worker of each run: once for all runs, or once per RUN in order "
                        "(two ranks of one run: RUN RUN --worker worker_0 --worker worker_1)")
    p.add_argument("--diverge", action="store_true",
                   help="print the first divergence (one line starting 'first divergence: step N, tensor NAME'); "
                        "exit 1 when the runs diverge, 0 when they agree")
    p.add_argument("--rtol", type=_tolerance, default=1e-5, help="relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=_tolerance, default=1e-8, help="absolute tolerance (default 1e-8)")
    p.add_argument("--scalars-only", action="store_true",
                   help="compare scalars and saved reductions only, not saved full tensors element by element")
    p.add_argument("-o", "--output", metavar="FILE.png",
                   help="draw the runs' values over the steps, one colour per run, one panel per tensor")
    p.add_argument("--reduction", help="with -o: draw this saved reduction (l2, max...) instead of the values")


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return value


def _cmd_compare(args) -> int:
    from .trials import create_trial

    if len(args.runs) < 2:
        raise _Failure("give two or more runs to compare", EXIT_USAGE)
    if args.output:
        if not args.output.lower().endswith(".png"):
            raise _Failure(f"-o {args.output}: give a .png file name", EXIT_USAGE)
        try:
            import matplotlib
        except ImportError:
            raise _Failure("smdebug compare -o needs matplotlib, which is not installed: pip install \".[plot]\"",
                           EXIT_USAGE) from None
        matplotlib.use("Agg")  # files only: no display needed
    try:
        from .comparison import compare
        from .trials.table import require_pandas

        require_pandas("smdebug compare")
    except ImportError as exc:
        raise _Failure(str(exc), EXIT_USAGE) from None
    trials = [create_trial(run, wait_timeout=args.wait) for run in args.runs]
    workers = args.worker
    if workers is not None and len(workers) not in (1, len(trials)):
        raise _Failure(f"--worker: give it once (for every run) or once per run ({len(trials)}), "
                       f"not {len(workers)} times", EXIT_USAGE)
    result = compare(trials, args.tensor, regex=args.regex, collection=args.collection, mode=args.mode,
                     workers=None if workers is None else workers * (len(trials) // len(workers)),
                     rtol=args.rtol, atol=args.atol, full_tensors=not args.scalars_only)
    for line in result.notes():
        print(line)
    if args.output:
        from .comparison import plot_comparison

        fig = plot_comparison(result, args.tensor, reduction=args.reduction)
        fig.savefig(args.output, dpi=100)
        print(f"wrote {args.output}")
    elif not args.diverge:
        print(_compare_table(result))
    if args.diverge:
        print(result.verdict())
        if not result.compared.get("values") and not result.compared.get("tensors"):
            return EXIT_DIVERGED  # runs that share nothing do not agree
        return EXIT_DIVERGED if result.diverged else EXIT_OK
    return EXIT_OK


def _compare_table(result) -> str:
    """Per tensor and reduction: rows compared, the largest relative difference, the first
    step beyond the tolerance."""
    frame = result.frame
    common = frame[frame["relative_difference"].notna()]
    if not len(common):
        return "the runs have no scalar value or saved reduction in common (--diverge compares full tensors too)"
    rows = []
    for (tensor, reduction), part in common.groupby(["tensor", "reduction"], sort=False):
        differs = part[part["differs"]]
        rows.append([tensor, reduction or "-", str(len(part)), f"{part['relative_difference'].max():.3g}",
                     str(int(differs["step"].iloc[0])) if len(differs) else "-"])
    rows.sort(key=lambda r: (r[4] == "-", int(r[4]) if r[4] != "-" else 0))
    text = _table(["tensor", "reduction", "steps", "max rel diff", "first step beyond tol"], rows[:_SHOWN_COMPARED])
    if len(rows) > _SHOWN_COMPARED:
        text += f"\n... and {len(rows) - _SHOWN_COMPARED} more (smdebug.analysis.compare gives the whole table)"
    return text


def _cmd_convert(args) -> int:
    from ..storage.convert import convert
    from .trials.progress import progress_bar, progress_wanted

    bar = progress_bar(progress_wanted(None), None, "steps converted")
    try:
        steps = convert(args.run, args.output, args.to, progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    print(f"{steps} steps of {args.run} written to {args.output} ({args.to} layout)")
    return 0


def _cmd_report(args) -> int:
    try:
        import matplotlib  # noqa: F401 - only whether it is installed
    except ImportError:
        raise _Failure("smdebug report needs matplotlib, which is not installed: pip install matplotlib "
                       "(smdebug-core's 'plot' extra)", EXIT_USAGE) from None
    from .report import write_report
    from .trials.computed import parse_reductions

    if not args.output.lower().endswith((".html", ".htm")):
        raise _Failure(f"-o {args.output}: give a .html file name", EXIT_USAGE)
    if not 0 <= args.smooth < 1:
        raise _Failure(f"--smooth {args.smooth:g}: give a weight from 0 (no smoothing) to below 1", EXIT_USAGE)
    try:
        parse_reductions([args.reduction])
    except ValueError as exc:
        raise _Failure(f"--reduction: {exc}", EXIT_USAGE) from None
    if args.rules_budget is not None and not args.rules_budget >= 0:
        raise _Failure(f"--rules-budget {args.rules_budget:g}: give seconds, 0 for no limit", EXIT_USAGE)
    trial = _open(args)
    budget = {} if args.rules_budget is None else {"rules_budget": args.rules_budget}
    write_report(trial, args.output, reduction=args.reduction, smoothing=args.smooth, rules=not args.no_rules,
                 **budget)
    size = os.path.getsize(args.output)
    print(f"wrote {args.output} ({size / 1e6:.1f} MB)")
    return EXIT_OK


def _mode_clause(args) -> str:
    modes = getattr(args, "mode", None) or []
    modes = [modes] if isinstance(modes, str) else modes  # export's --mode is repeatable
    return f" in mode {', '.join(m.upper() for m in modes)}" if modes else ""


def _as_options(message: str) -> str:
    """The reader's hints for Python callers ("pass mode=smd.modes.TRAIN", "pass reduction=...")
    as this command's options."""
    message = message.replace("trial.tensor_names() lists them", "smdebug ls RUN lists them")
    message = re.sub(r"use trial\.tensor\('(scalar/[^']*)'\)", r"give \1", message)
    message = re.sub(r"trial\.tensor\('([^']*)'\)\.reduction_value\(step, '(\w+)'(, abs=True)?\)",
                     lambda m: f"write {m.group(1)}@{'abs_' if m.group(3) else ''}{m.group(2)}", message)
    message = message.replace("pass mode=smd.modes.GLOBAL", "leave out --mode")
    message = message.replace("(pass reduction=...)", "(add --reduction NAME, or write TENSOR@NAME)")
    return re.sub(r"pass mode=smd\.modes\.(\w+)", r"add --mode \1", message)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``smdebug``; returns the exit status."""
    try:
        status = _main(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()  # here, not at exit: a reader gone by now is handled below
        return status
    except BrokenPipeError:
        # Whoever read our output stopped early (``| head``): not an error, and nothing more to
        # print. stdout goes to devnull so that flushing it at exit raises nothing either.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is no file (a test's capture): nothing to redirect
            pass
        return EXIT_OK


def _main(argv: List[str]) -> int:
    if argv[:1] == ["rules"]:  # everything after it is the rules command's own
        from .rules.cli import main as rules_main

        return rules_main(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 for --help/--version
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from ..exceptions import SMDebugError

    command = {"ls": _cmd_ls, "show": _cmd_show, "plot": _cmd_plot, "export": _cmd_export,
               "compare": _cmd_compare, "report": _cmd_report, "convert": _cmd_convert}[args.command]
    try:
        return command(args)
    except _Failure as exc:
        print(f"smdebug {args.command}: {exc}", file=sys.stderr)
        return exc.status
    except BrokenPipeError:
        raise
    except (SMDebugError, ValueError, KeyError, OSError, NotImplementedError) as exc:
        # What the reader says is already the message: which value, what to do.
        text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        print(f"smdebug {args.command}: {_as_options(text)}", file=sys.stderr)
        return EXIT_UNREADABLE
