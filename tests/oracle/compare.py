"""Judges the outputs of one call of the library against the oracle's.

Floats: |got - ref| <= 2·ulp_T(ref) + 64·eps_f32·mag (+ 2·atol for NSA's `out`), where mag is
the oracle's sum of the magnitudes of the terms behind the value, so the allowance follows the
f32 accumulation error rather than the size of the result. Copied values and the zeros of
unused rows must be exact. NaN must meet NaN and an infinity the same infinity. In an f16 or
bf16 output, a value whose exact result lies farther from a rounding midpoint of T than that
f32 error must be exactly round_T(exact): this catches results rounded twice or too early.

Indices must be equal, except in an output whose order comes from float sums (NSA `topk`):
there two different blocks in one slot are accepted when their float64 scores are a near-tie
(an f32 sum may order them either way). Forced (+inf) blocks and exact zeros never count as
near-ties: they tie exactly, so the lower index must come first. A duplicate is never accepted.
"""
import numpy as np

from st import FLOAT_TYPES, ulp

EPS_F32 = float(np.finfo(np.float32).eps)
ACCUMULATION = 64  # f32 rounding steps allowed, in units of eps_f32 · mag
TIE_RTOL = 1e-5
TIE_ATOL = 1e-7


def allowed_error(name, dtype, want, aux):
    """The allowed |got - want| of each element of the float output `name` of type dtype."""
    mag = np.asarray(aux.get('mag:' + name, np.abs(want)))
    tol = 2 * ulp(dtype, want) + ACCUMULATION * EPS_F32 * mag
    if 'atol:' + name in aux:
        tol = tol + 2 * aux['atol:' + name]
    if 'exact:' + name in aux:
        tol = np.where(aux['exact:' + name], 0.0, tol)
    return tol


def clear_of_midpoint(name, dtype, want, aux):
    """A mask of the elements of an f16/bf16 output that must equal round_T(exact): those whose
    exact value lies farther from a rounding midpoint of T than the f32 computation's error."""
    raw = aux.get('raw:' + name)
    if raw is None or dtype == 'F32':
        return np.zeros(want.shape, dtype=bool)
    # the smaller ulp where the ulps on the two sides of the rounded value differ
    low = np.minimum(np.abs(raw), np.abs(want)) * (1 - 2.0 ** -20)
    f32_error = ACCUMULATION * EPS_F32 * np.asarray(aux.get('mag:' + name, np.abs(want)))
    if 'atol:' + name in aux:
        f32_error = f32_error + 2 * aux['atol:' + name]
    with np.errstate(invalid='ignore'):
        margin = ulp(dtype, low) / 2 - np.abs(raw - want)
        return np.isfinite(raw) & np.isfinite(want) & (margin > f32_error)


def is_near_tie(a, b):
    """Whether an f32 computation may order two blocks with float64 scores a and b either way."""
    if not (np.isfinite(a) and np.isfinite(b)) or a == b == 0.0:
        return False
    return abs(a - b) <= TIE_RTOL * max(abs(a), abs(b)) + TIE_ATOL


def written_mask(want, aux):
    """The elements of an output that the contract says are written (all, except BSND rows
    beyond q_len in NSA)."""
    if 'written' not in aux:
        return np.ones(want.shape, dtype=bool)
    written = aux['written']
    return np.broadcast_to(written.reshape(written.shape + (1,) * (want.ndim - written.ndim)),
                           want.shape)


def compare(ref, aux, got):
    """ref, got: name -> (dtype, values); aux: the oracle's aux (see oracle.py).

    Returns (problems, stats): a list of messages (empty if the outputs are right) and
    {'worst': the largest error / tolerance of a float value, 'tie_swaps': near-tie swaps}.
    """
    problems = []
    stats = {'worst': 0.0, 'tie_swaps': 0}
    if set(ref) != set(got):
        problems.append('outputs: expected %s, got %s' % (sorted(ref), sorted(got)))
    for name, (dtype, want) in ref.items():
        if name not in got:
            continue
        got_dtype, have = got[name]
        if got_dtype != dtype:
            problems.append('%s: type %s, expected %s' % (name, got_dtype, dtype))
        if have.shape != want.shape:
            problems.append('%s: shape %s, expected %s' % (name, have.shape, want.shape))
            continue
        mask = written_mask(want, aux)
        if dtype in FLOAT_TYPES:
            problems += _compare_floats(name, dtype, want, have, mask, aux, stats)
        elif 'scores:' + name in aux:
            problems += _compare_ranked(name, want, have, mask, aux['scores:' + name], stats)
        else:
            problems += _compare_ints(name, want, have, mask)
    return problems, stats


def _compare_floats(name, dtype, want, have, mask, aux, stats):
    problems = []
    tol = allowed_error(name, dtype, want, aux)
    with np.errstate(invalid='ignore'):
        err = np.abs(have - want)
        ok = (err <= tol) | (np.isinf(want) & (have == want)) | (np.isnan(want) & np.isnan(have))
    bad = ~ok & mask
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        problems.append('%s: %d of %d values out of tolerance, first at %s: got %r, expected %r'
                        ' (tolerance %.3g)' % (name, bad.sum(), bad.size, i, have[i], want[i],
                                               tol[i]))
    scaled = mask & np.isfinite(err) & (tol > 0)
    if scaled.any():
        stats['worst'] = max(stats['worst'], float(np.max(err[scaled] / tol[scaled])))
    twice = mask & ~bad & clear_of_midpoint(name, dtype, want, aux) & (have != want)
    if twice.any():
        i = tuple(np.argwhere(twice)[0])
        problems.append('%s: %d values are not round_%s(exact) though the exact value is clear of'
                        ' a rounding midpoint (rounded twice?), first at %s: got %r, expected %r'
                        ' (exact %r)' % (name, twice.sum(), dtype, i, have[i], want[i],
                                         aux['raw:' + name][i]))
    return problems


def _compare_ints(name, want, have, mask):
    diff = (have != want) & mask
    if not diff.any():
        return []
    i = tuple(np.argwhere(diff)[0])
    row = i[:-1]
    return ['%s: %d of %d values differ, first at %s: got %s, expected %s (row got %s, expected'
            ' %s)' % (name, diff.sum(), diff.size, i, have[i], want[i], have[row].tolist(),
                      want[row].tolist())]


def _compare_ranked(name, want, have, mask, scores, stats):
    diff = (have != want) & mask
    bad_rows = []
    for row in sorted({tuple(i[:-1]) for i in np.argwhere(diff)}):
        s = scores[row]
        chosen = [int(x) for x in have[row] if x >= 0]
        ok = len(set(chosen)) == len(chosen)
        for g, w in zip(have[row], want[row]):
            if g != w:
                ok = ok and 0 <= g < len(s) and 0 <= w < len(s) and is_near_tie(s[g], s[w])
        if ok:
            stats['tie_swaps'] += 1
        else:
            bad_rows.append(row)
    if not bad_rows:
        return []
    row = bad_rows[0]
    return ['%s: %d rows differ beyond near-ties, first row %s: got %s, expected %s'
            % (name, len(bad_rows), row, have[row].tolist(), want[row].tolist())]
