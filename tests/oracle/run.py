#!/usr/bin/env python3
"""The oracle check of the qsa library (see README.md): the one entry point.

usage: python3 tests/oracle/run.py [--qsa PATH] [--backend vulkan|gl] [--cpu] [--gpu-nsa]
                                   [--seed N] [--per-op N] [--keep DIR] [--self-test]

Groups, in order: the self-test of the checker, random cases of each operator, edge cases,
large geometries and bad input. One line per group, the details of every failure, and a
summary line; the exit status is 0 only if every check passed.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback

import bad
import edge
import gen
import large
import selftest
from harness import Qsa, Result, check_valid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_QSA = os.path.join(ROOT, 'target', 'release', 'qsa')
DEFAULT_SEED = 2024
DEFAULT_PER_OP = 40


def guarded(name, produce):
    """Yields the results of produce(); an exception becomes a failed result."""
    try:
        yield from produce()
    except Exception:  # a crash of the checker or an unreadable output is a failure too
        yield Result(name, ['exception:\n' + traceback.format_exc(limit=-4).rstrip()])


class Report:
    """Prints one line per group and the details of each failure; counts the checks."""

    def __init__(self):
        self.checks = 0
        self.failed = 0

    def group(self, label, results):
        start = time.time()
        results = list(results)
        failures = [r for r in results if r.problems]
        self.checks += len(results)
        self.failed += len(failures)
        line = '%-30s %4d checks in %3.0f s, %s' % (
            label, len(results), time.time() - start,
            '%d FAILED' % len(failures) if failures else 'passed')
        worst = max((r.worst for r in results), default=0.0)
        if worst > 0:
            line += ', worst error %.2f of tolerance' % worst
        swaps = sum(r.tie_swaps for r in results)
        if swaps:
            line += ', %d near-tie swaps accepted' % swaps
        print(line)
        for r in failures:
            print('  FAIL %s' % r.name)
            for problem in r.problems:
                print('       ' + problem.replace('\n', '\n       '))
        sys.stdout.flush()


def random_cases(qsa, op, seed, per_op):
    for index in range(per_op):
        name = '%s_%03d' % (op, index)
        yield from guarded(name, lambda: [check_valid(
            qsa, name, *gen.GENERATORS[op](gen.case_rng(seed, op, index)))])


def checks_of(qsa, checks):
    for fn in checks:
        yield from guarded(fn.__name__, lambda: fn(qsa))


def bad_input(qsa):
    yield from guarded('bad input bases', lambda: bad.check_bases(qsa))
    for case in bad.CASES:
        yield from guarded(case.name, lambda: [bad.check_case(qsa, case)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--qsa', default=DEFAULT_QSA,
                    help='the qsa binary (default: target/release/qsa of this repository)')
    ap.add_argument('--backend', choices=('vulkan', 'gl'),
                    help='passed as `qsa --backend B run ...` (default: qsa chooses)')
    ap.add_argument('--cpu', action='store_true', help='run the CPU reference, not the GPU')
    ap.add_argument('--gpu-nsa', action='store_true',
                    help='passed as `qsa run ... --gpu-nsa`: nsa_compress_attention on its '
                         'GPU-shaped kernels')
    ap.add_argument('--seed', type=int, default=DEFAULT_SEED, help='seed of the random cases')
    ap.add_argument('--per-op', type=int, default=DEFAULT_PER_OP,
                    help='random cases per operator (default %d)' % DEFAULT_PER_OP)
    ap.add_argument('--keep', metavar='DIR',
                    help='write cases and outputs to DIR and keep them (default: a temporary '
                         'directory, removed at the end)')
    ap.add_argument('--self-test', action='store_true',
                    help='only check that the checker rejects wrong answers (no qsa needed)')
    args = ap.parse_args()

    start = time.time()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        workdir = args.keep
    else:
        workdir = tempfile.mkdtemp(prefix='qsa-oracle-')
    report = Report()
    try:
        report.group('self-test', guarded('self-test', lambda: selftest.run(workdir)))
        if not args.self_test:
            if not os.access(args.qsa, os.X_OK):
                report.group('qsa binary', [Result(args.qsa, [
                    'not an executable: build it with `cargo build --release`, or give --qsa'])])
            else:
                qsa = Qsa(os.path.abspath(args.qsa), args.backend, args.cpu, workdir,
                          args.gpu_nsa)
                for op in gen.GENERATORS:
                    report.group('random ' + op, random_cases(qsa, op, args.seed, args.per_op))
                report.group('edge', checks_of(qsa, edge.CHECKS))
                report.group('large', checks_of(qsa, large.CHECKS))
                report.group('bad input', bad_input(qsa))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    if args.self_test:
        mode = 'self-test only'
    else:
        mode = '%s%s, seed %d, %d per operator' % (
            'cpu' if args.cpu else (args.backend or 'default backend'),
            ', GPU-shaped NSA' if args.gpu_nsa else '', args.seed, args.per_op)
    verdict = 'FAIL: %d of %d checks failed' % (report.failed, report.checks) if report.failed \
        else 'PASS: %d checks passed' % report.checks
    print('%s (%s, %.0f s)' % (verdict, mode, time.time() - start))
    return 1 if report.failed else 0


if __name__ == '__main__':
    sys.exit(main())
