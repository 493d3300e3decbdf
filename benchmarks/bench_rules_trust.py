"""Can the built-in rules be trusted? Their confusion table over the rules corpus.

The corpus (``tests/support/rules_corpus.py``) holds small real training runs, healthy and
broken, each labelled with the rules meant to catch it. For every run this prints the default
``smdebug rules`` verdict (exit status and the rules that fired), then per rule: the broken runs
meant for it that it caught, and its false alarms on healthy runs.

Build the runs with each framework's environment first (XGBoost and Keras runs need theirs),
then evaluate them from any environment (the rules need only smdebug):

    python tests/support/rules_corpus.py --out /tmp/corpus         # in the pytorch env
    python tests/support/rules_corpus.py --out /tmp/corpus         # in the xgboost env, the tensorflow env
    python benchmarks/bench_rules_trust.py /tmp/corpus [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "support"))

import rules_corpus
from smdebug.analysis.rules.builtin import BUILTIN_RULES as BUILTIN


def default_verdict(run_dir: str) -> Tuple[int, List[str], str]:
    """``smdebug rules RUN`` (the default rules): exit status, the rules that fired, its output."""
    status, output = rules_corpus.default_rules(run_dir)
    fired = [line.split()[0] for line in output.splitlines() if "  FIRED at " in line]
    return status, fired, output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="directory of built corpus runs")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("smdebug").setLevel(logging.ERROR)
    runs = sorted(d for d in os.listdir(args.corpus)
                  if os.path.exists(os.path.join(args.corpus, d, rules_corpus.LABEL_FILE)))
    if not runs:
        print(f"no corpus runs in {args.corpus} (build them with tests/support/rules_corpus.py)")
        return 2
    caught: Dict[str, List[str]] = {}
    missed: Dict[str, List[str]] = {}
    false_alarms: Dict[str, List[str]] = {}
    rows = []
    start = time.perf_counter()
    for name in runs:
        run_dir = os.path.join(args.corpus, name)
        label = rules_corpus.read_label(run_dir)
        status, fired, _ = default_verdict(run_dir)
        rows.append((name, "healthy" if label.healthy else "broken", status, ", ".join(fired) or "-",
                     ", ".join(label.rules) or "-"))
        if label.healthy:
            for rule in fired:
                false_alarms.setdefault(rule, []).append(name)
        for rule in label.rules:
            hit = rule in fired or (rule in BUILTIN and rules_corpus.evaluate(run_dir, rule).triggered > 0)
            (caught if hit else missed).setdefault(rule, []).append(name)
    elapsed = time.perf_counter() - start
    healthy = sum(1 for r in rows if r[1] == "healthy")
    broken = len(rows) - healthy
    rules = sorted(set(caught) | set(missed) | set(false_alarms))

    def table(header, body):
        if args.markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
            for row in body:
                print("| " + " | ".join(str(c) for c in row) + " |")
        else:
            widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
            for row in [header, *body]:
                print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        print()

    print(f"{len(rows)} runs ({healthy} healthy, {broken} broken), evaluated in {elapsed:.1f} s\n")
    table(("run", "kind", "exit", "default rules that fired", "meant to catch it"), rows)
    body = []
    for rule in rules:
        meant = len(caught.get(rule, [])) + len(missed.get(rule, []))
        body.append((rule, f"{len(caught.get(rule, []))}/{meant}" if meant else "-",
                     ", ".join(missed.get(rule, [])) or "-",
                     f"{len(false_alarms.get(rule, []))}/{healthy}", ", ".join(false_alarms.get(rule, [])) or "-"))
    table(("rule", "broken caught", "missed", "false alarms on healthy", "on"), body)
    bad_healthy = [r[0] for r in rows if r[1] == "healthy" and r[2] != 0]
    silent_broken = [r[0] for r in rows if r[1] == "broken" and r[2] == 0]
    print(f"default verdict: exit 0 on {healthy - len(bad_healthy)}/{healthy} healthy runs, exit 1 on "
          f"{broken - len(silent_broken)}/{broken} broken runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
