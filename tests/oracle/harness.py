"""Runs the qsa binary on case files and judges its answers.

The library is driven only through its command line, `qsa [--backend B] run CASE -o OUT
[--cpu]`, one process at a time; cases and outputs are files in a work directory.
"""
import dataclasses
import os
import re
import subprocess
from typing import List, Optional

import numpy as np

import compare
import oracle
import st

TIMEOUT_S = 300


@dataclasses.dataclass
class Result:
    """The verdict on one check: no problems means it passed."""
    name: str
    problems: List[str]
    worst: float = 0.0  # largest error / tolerance of a float output
    tie_swaps: int = 0  # NSA topk rows accepted as near-tie swaps
    output: Optional[str] = None  # the output file of a valid case


@dataclasses.dataclass
class Run:
    """What one qsa process did: exit status (None: timed out), stderr, output file or None."""
    rc: Optional[int]
    stderr: str
    output: Optional[str]


class Qsa:
    """The qsa binary with the options of this session, writing its files under workdir."""

    def __init__(self, binary, backend, cpu, workdir, gpu_nsa=False):
        self.binary = binary
        self.backend = backend
        self.cpu = cpu
        self.gpu_nsa = gpu_nsa
        self.workdir = workdir

    def write(self, name, tensors, meta, writer=st.save):
        """Writes case `name` and returns its path."""
        path = os.path.join(self.workdir, name + '.safetensors')
        writer(path, tensors, meta)
        return path

    def run(self, path):
        out = path[:-len('.safetensors')] + '.out.safetensors'
        if os.path.exists(out):
            os.remove(out)
        cmd = [self.binary]
        if self.backend:
            cmd += ['--backend', self.backend]
        cmd += ['run', path, '-o', out]
        if self.cpu:
            cmd.append('--cpu')
        if self.gpu_nsa:
            cmd.append('--gpu-nsa')
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors='replace',
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Run(None, 'timed out after %d s' % TIMEOUT_S, None)
        return Run(proc.returncode, proc.stderr.strip(), out if os.path.exists(out) else None)


def failure(run):
    """A short description of a failed run."""
    if run.rc is None:
        return run.stderr
    return 'exit %d: %s' % (run.rc, run.stderr[-400:])


def check_valid(qsa, name, tensors, meta, kept_bits=()):
    """Runs a valid case and compares its outputs with the oracle's.

    kept_bits: (input, index, output, index) tuples; that part of the output must hold the
    exact bits of that part of the input (a copy keeps NaN, -0.0 and subnormals as they are).
    """
    path = qsa.write(name, tensors, meta)
    ref, aux = oracle.run(*st.load(path))  # the oracle reads exactly what the file holds
    run = qsa.run(path)
    if run.rc != 0:
        return Result(name, [failure(run)])
    if run.output is None:
        return Result(name, ['exit 0 but no output file'])
    problems, stats = compare.compare(ref, aux, st.load(run.output)[0])
    if kept_bits:
        given, have = st.load_bits(path), st.load_bits(run.output)
        for src, src_index, dst, dst_index in kept_bits:
            if dst in have and not np.array_equal(have[dst][dst_index], given[src][src_index]):
                problems.append('%s%s does not hold the bits of %s%s'
                                % (dst, list(dst_index), src, list(src_index)))
    return Result(name, problems, stats['worst'], stats['tie_swaps'], run.output)


def mentions(text, word, ignore_case=False):
    """Whether text holds word as a whole token (`k` is not found in `block_topk`, nor `2` in
    `12` or `2.5`)."""
    pattern = r'(?<![\w.])' + re.escape(word) + r'(?!\w|\.\d)'
    return re.search(pattern, text, re.IGNORECASE if ignore_case else 0) is not None


def judge_rejection(run, op, names, value):
    """The problems with the answer to a bad input (SPEC §0): the call must fail, write no
    output, and its message must name the operator `op` (None for a file that cannot be parsed,
    whose operator is unknown), one of `names` (the input or attribute at fault, or the related
    one that the check reads) and the offending `value` (None: not checked)."""
    if run.rc is None:
        return [run.stderr]
    problems = []
    if run.rc == 0:
        problems.append('accepted (exit 0)')
    if run.output is not None:
        problems.append('wrote an output file')
    if run.rc != 0:
        msg = run.stderr
        if op is not None and not mentions(msg, op):
            problems.append('message does not name the operator %s' % op)
        if names and not any(mentions(msg, n) for n in names):
            problems.append('message names none of %s' % ', '.join(names))
        if value is not None and not mentions(msg, value, ignore_case=True):
            problems.append('message does not show the value %s' % value)
        if problems:
            problems.append('message: ' + msg[-300:])
    return problems
