"""Self-test: the checker itself must reject wrong answers. It needs no qsa binary.

For seeded random cases of every operator, the oracle's own outputs (written to a file and read
back, as the library's would be) must pass compare.py, and each of these wrong answers must
fail:

- one float value moved a few ulps beyond its tolerance;
- one copied value (which must be exact) moved by one ulp;
- in f16/bf16, one value one ulp away from round_T(exact) where the exact value is clear of a
  rounding midpoint (a double rounding);
- two entries of an index output swapped (for NSA topk: two blocks that are not a near-tie);
- a missing output, a wrong type, a wrong shape.

The verdict on bad input must reject a call that succeeded, one that failed but wrote an
output, and one whose message leaves out the operator, the input or the value.
"""
import os

import numpy as np

import compare
import gen
import oracle
import st
from harness import Result, Run, judge_rejection, mentions

CASES_PER_OP = 6
SEED = 7919


def first(mask):
    """The index of the first True element of mask, or None."""
    hits = np.argwhere(mask)
    return tuple(hits[0]) if len(hits) else None


def wrong_answers(ref, aux):
    """Yields (kind, description, got): ref with one deliberate error each."""
    for name, (dtype, want) in ref.items():
        if want.size == 0:
            continue
        written = compare.written_mask(want, aux)

        def changed(index, value):
            have = want.copy()
            have[index] = value
            return dict(ref, **{name: (dtype, have)})

        if dtype in st.FLOAT_TYPES:
            tol = compare.allowed_error(name, dtype, want, aux)
            finite = written & np.isfinite(want) & (np.abs(want) < 1e30)
            exact = aux.get('exact:' + name, np.zeros(want.shape, dtype=bool))
            i = first(finite & ~exact)
            if i is not None:
                step = tol[i] + 4 * st.ulp(dtype, want[i])
                yield 'beyond tolerance', '%s%s + %.3g' % (name, list(i), step), \
                    changed(i, st.round_to(dtype, want[i] + step))
            i = first(finite & exact)
            if i is not None:
                yield 'copy off by one ulp', '%s%s' % (name, list(i)), \
                    changed(i, st.round_to(dtype, want[i] + st.ulp(dtype, want[i])))
            i = first(finite & ~exact & compare.clear_of_midpoint(name, dtype, want, aux))
            if i is not None:
                yield 'rounded twice', '%s%s one ulp off' % (name, list(i)), \
                    changed(i, st.round_to(dtype, want[i] - st.ulp(dtype, want[i])))
        else:
            swap = find_swap(want, written, aux.get('scores:' + name))
            if swap is not None:
                row, a, b = swap
                have = want.copy()
                have[row + (a,)], have[row + (b,)] = want[row + (b,)], want[row + (a,)]
                kind = 'ranked swap' if 'scores:' + name in aux else 'index swap'
                yield kind, '%s%s slots %d, %d' % (name, list(row), a, b), \
                    dict(ref, **{name: (dtype, have)})
            elif first(written) is not None:
                i = first(written)
                yield 'index changed', '%s%s + 1' % (name, list(i)), changed(i, want[i] + 1)
        yield 'missing output', name, {k: v for k, v in ref.items() if k != name}
        other = {'F32': 'F16', 'F16': 'BF16', 'BF16': 'F32', 'I32': 'U32'}[dtype]
        yield 'wrong type', '%s as %s' % (name, other), dict(ref, **{name: (other, want)})
        wider = np.zeros(want.shape[:-1] + (want.shape[-1] + 1,), dtype=want.dtype)
        yield 'wrong shape', '%s %s' % (name, wider.shape), dict(ref, **{name: (dtype, wider)})


def find_swap(want, written, scores):
    """(row, a, b): two slots of a written row whose swap makes a wrong answer (for a ranked
    output, blocks that are not a near-tie), or None."""
    for row in np.ndindex(want.shape[:-1]):
        if not written[row + (0,)]:
            continue
        values = want[row]
        for a in range(len(values)):
            for b in range(a + 1, len(values)):
                if values[a] == values[b]:
                    continue
                if scores is not None and min(values[a], values[b]) >= 0 and \
                        compare.is_near_tie(scores[row][values[a]], scores[row][values[b]]):
                    continue
                return row, a, b
    return None


def check_operator(op, workdir, counts):
    problems = []
    for index in range(CASES_PER_OP):
        label = '%s case %d' % (op, index)
        path = os.path.join(workdir, 'selftest_%s_%d.safetensors' % (op, index))
        st.save(path, *gen.GENERATORS[op](gen.case_rng(SEED, op, index)))
        ref, aux = oracle.run(*st.load(path))
        out = path.replace('.safetensors', '.out.safetensors')
        st.save(out, ref)
        found, _ = compare.compare(ref, aux, st.load(out)[0])
        if found:
            problems.append('%s: the oracle\'s own outputs fail: %s' % (label, found[0]))
        for kind, what, got in wrong_answers(ref, aux):
            counts[kind] = counts.get(kind, 0) + 1
            if not compare.compare(ref, aux, got)[0]:
                problems.append('%s: %s accepted (%s)' % (label, kind, what))
    return Result('self-test ' + op, problems)


def check_rejection_verdict():
    """judge_rejection on made-up runs of a bad block_topk case (k = 0)."""
    message = 'qsa: error: block_topk: attribute `k`: must be >= 1, got 0'
    expect = ('block_topk', ('k',), '0')
    problems = []
    if judge_rejection(Run(1, message, None), *expect):
        problems.append('a right rejection was not accepted')
    wrong = {
        'a call that succeeded': Run(0, 'block_topk: wrote 2 tensors', 'out.safetensors'),
        'a rejection that wrote an output': Run(1, message, 'out.safetensors'),
        'a message without the operator': Run(1, 'qsa: error: attribute `k`: got 0', None),
        'a message naming another input': Run(1, 'qsa: error: block_topk: input `scores`: 0',
                                              None),
        'a message without the value': Run(1, 'qsa: error: block_topk: attribute `k`: bad', None),
        'a timeout': Run(None, 'timed out', None),
    }
    for what, run in wrong.items():
        if not judge_rejection(run, *expect):
            problems.append('%s was accepted' % what)
    if mentions('block_topk', 'k') or mentions('got 12', '2') or mentions('got 2.5', '2'):
        problems.append('a name or value is found inside a longer token')
    return Result('self-test bad-input verdict', problems)


def run(workdir):
    """All self-test results; the last one checks that every kind of wrong answer was tried."""
    counts = {}
    results = [check_operator(op, workdir, counts) for op in gen.GENERATORS]
    results.append(check_rejection_verdict())
    kinds = ('beyond tolerance', 'copy off by one ulp', 'rounded twice', 'index swap',
             'ranked swap', 'missing output', 'wrong type', 'wrong shape')
    missing = [k for k in kinds if not counts.get(k)]
    results.append(Result('self-test coverage (%s)' % ', '.join(
        '%d %s' % (counts.get(k, 0), k) for k in kinds),
        ['no wrong answer of kind %r was tried' % k for k in missing]))
    return results
