"""Random valid cases, one generator per operator (SPEC.md sections 1-8).

Each generator takes a numpy Generator and returns (tensors, meta): tensors maps an input name
to (dtype, values) as st.save takes it, meta holds `op` and the attributes as JSON text. The
draws cover the optional inputs (absent, present, zero-element), the attribute defaults, all
three float types and the edge cases of each operator (ragged batches, empty rows, ties, NaN,
masked rows, r = 1, GQA, causal masking, ...).
"""
import json
import math

import numpy as np

from st import FLOAT_TYPES, round_to


def J(value):
    """An attribute value as the JSON text a case file holds."""
    return json.dumps(value)


def rnd(rng, dtype, shape, scale=1.0):
    """Normal random values, exact in dtype."""
    return round_to(dtype, rng.standard_normal(shape) * scale)


def pick(rng, choices):
    return choices[int(rng.integers(len(choices)))]


def angles(rng, shape):
    return rng.uniform(-math.pi, math.pi, shape)


def rope_pair(rng, dtype, shape):
    """rope_cos and rope_sin of random angles, as (dtype, values) pairs (§1, §3)."""
    ang = angles(rng, shape)
    return (dtype, round_to(dtype, np.cos(ang))), (dtype, round_to(dtype, np.sin(ang)))


def rope_state(rng, dtype, n, dr):
    """past_incomplete_rope [n, 2·Dr] (cos ‖ sin) of random angles, as a (dtype, values) pair."""
    ang = angles(rng, (n, dr))
    return dtype, round_to(dtype, np.concatenate([np.cos(ang), np.sin(ang)], 1))


def freqs_table(rng, dtype, rows, dr):
    """A freqs_cis table [rows, Dr] of interleaved (cos, sin) pairs (§2), as (dtype, values)."""
    ang = angles(rng, (rows, dr // 2))
    table = np.zeros((rows, dr))
    table[:, 0::2] = np.cos(ang)
    table[:, 1::2] = np.sin(ang)
    return dtype, round_to(dtype, table)


def maybe(rng, tensors, name, dtype, values, zero_shape=None, p_absent=0.3, p_zero=0.15):
    """Adds an optional input: absent, zero-element or present. True if present."""
    u = rng.random()
    if u < p_absent:
        return False
    if u < p_absent + p_zero:
        shape = zero_shape if zero_shape is not None else (0,) + tuple(values.shape[1:])
        tensors[name] = (dtype, np.zeros(shape))
        return False
    tensors[name] = (dtype, values)
    return True


def ragged(rng, n, max_rows, max_cached):
    """Rows per sequence (some may be 0), row_offsets and cache_lengths of a ragged batch."""
    rows = rng.integers(0, max_rows + 1, n)
    return rows, np.concatenate([[0], np.cumsum(rows)]), rng.integers(0, max_cached + 1, n)


def random_pages(rng, n, pages_per_seq, spare):
    """A page table [n, pages_per_seq] of distinct pages in random order, and the pool's page
    count (with `spare` pages that no sequence uses)."""
    num_pages = n * pages_per_seq + spare
    return rng.permutation(num_pages)[:n * pages_per_seq].reshape(n, pages_per_seq), num_pages


def norm_attrs(rng, meta, p_eps, eps_values, p_offset):
    """The RMS norm's attributes, each set with its probability (else left to its default)."""
    if rng.random() < p_eps:
        meta['epsilon'] = J(pick(rng, eps_values))
    if rng.random() < p_offset:
        meta['norm_weight_offset'] = J(pick(rng, [0.0, 1.0]))


# ---------------------------------------------------------------- §1
def gen_qsa_prepare(rng):
    T = pick(rng, FLOAT_TYPES)
    N = int(rng.integers(1, 4))
    L = pick(rng, [0, 1, 1, 2, 3, 5, 7])
    r = pick(rng, [2, 3, 4, 4, 5])
    Di = pick(rng, [4, 6, 8, 16])
    # with L = 0, rope_cos/sin [N, 0, Dr] are zero-element, i.e. absent (§0)
    rope = L > 0 and rng.random() < 0.6
    Dr = pick(rng, [d for d in (2, 4, 6, Di) if d <= Di]) if rope else 0
    if rng.random() < 0.3:
        past = np.full(N, int(rng.integers(0, 14)))
    else:
        past = rng.integers(0, 14, N)
    kl = past + L
    broadcast = bool(np.all(kl == kl[0]) and rng.random() < 0.6)
    Bp = int(max(past // r)) + int(rng.integers(0, 3))
    tensors = {
        'raw_index_keys': (T, rnd(rng, T, (N, L, Di))),
        'past_block_index_keys': (T, rnd(rng, T, (N, Bp, Di))),
        'key_length': ('I32', kl[:1] if broadcast else kl),
    }
    if rope and rng.random() < 0.15:
        tensors['rope_cos'] = (T, np.zeros((N, 0, Dr)))
        tensors['rope_sin'] = (T, np.zeros((N, 0, Dr)))
        rope = False
    elif rope:
        tensors['rope_cos'], tensors['rope_sin'] = rope_pair(rng, T, (N, L, Dr))
    maybe(rng, tensors, 'k_norm_weight', T, rnd(rng, T, (Di,), 0.5))
    # rows beyond past mod r are not valid: random values that must be ignored
    tensors['past_incomplete_raw_keys'] = (T, rnd(rng, T, (N, r - 1, Di)))
    if rope:
        tensors['past_incomplete_rope'] = rope_state(rng, T, N, Dr)
    meta = {'op': 'qsa_prepare', 'key_block_size': J(r)}
    norm_attrs(rng, meta, 0.7, [1e-6, 1e-5, 0.1], 0.6)
    return tensors, meta


# ---------------------------------------------------------------- §2
def gen_qsa_compress_paged(rng):
    T = pick(rng, FLOAT_TYPES)
    N = int(rng.integers(1, 4))
    r = pick(rng, [2, 3, 4, 4])
    Di = pick(rng, [4, 8, 16])
    Dr = pick(rng, [0, 2, 4, Di])
    P = pick(rng, [2, 3, 4, 8])
    NL = int(rng.integers(1, 4))
    cl = rng.integers(0, 20, N)
    kc = cl + rng.integers(0, 9, N)
    MB = max(1, int(max(kc // r)) + int(rng.integers(0, 3)))
    MP = max(1, int(max(-(-kc // P))) + int(rng.integers(0, 2)))
    pt, num_pages = random_pages(rng, N, MP, int(rng.integers(0, 3)))
    meta = {'op': 'qsa_compress_paged', 'ratio': J(r)}
    packed = 2 * NL * P * Di
    u = rng.random()
    if u < 0.2:
        meta['page_stride'] = J(packed)
    elif u < 0.4:
        # page p starts at p · 2·packed: a pool of 2·num_pages packed pages holds them
        meta['page_stride'] = J(2 * packed)
        num_pages *= 2
    tensors = {
        'kv_blocks': (T, rnd(rng, T, (num_pages, 2, NL, P, 1, Di))),
        'page_table': ('U32', pt),
        'cache_lengths': ('U32', cl),
        'key_counts': ('I32', kc),
    }
    maybe(rng, tensors, 'gamma', T, rnd(rng, T, (Di,), 0.5))
    if Dr > 0:
        rows = int(max(kc)) + int(rng.integers(0, 3)) + 1
        present = maybe(rng, tensors, 'freqs_cis', T, freqs_table(rng, T, rows, Dr)[1],
                        p_absent=0.1, p_zero=0.1)
        if present or rng.random() < 0.5:
            meta['rotary_dim'] = J(Dr)
    tensors['block_keys'] = (T, rnd(rng, T, (N * MB, Di)))
    mode = pick(rng, ['incremental', 'full', None])
    if mode:
        meta['mode'] = J(mode)
    if NL > 1 or rng.random() < 0.5:
        meta['layer_idx'] = J(int(rng.integers(0, NL)))
    norm_attrs(rng, meta, 0.5, [1e-6, 1e-3], 0.5)
    return tensors, meta


# ---------------------------------------------------------------- §3
def gen_qsa_prepare_query(rng):
    T = pick(rng, FLOAT_TYPES)
    TT = pick(rng, [0, 1, 2, 3, 5])
    Hi = pick(rng, [1, 2, 4])
    Di = pick(rng, [4, 8, 16])
    Dr = pick(rng, [2, 4, Di])
    tensors = {'index_query_raw': (T, rnd(rng, T, (TT, Hi, Di)))}
    meta = {'op': 'qsa_prepare_query'}
    maybe(rng, tensors, 'q_norm_weight', T, rnd(rng, T, (Di,), 0.5))
    u = rng.random()
    if u < 0.35:
        tensors['rope_cos'], tensors['rope_sin'] = rope_pair(rng, T, (TT, Dr))
        if rng.random() < 0.5:
            meta['rotary_dim'] = J(Dr)
    elif u < 0.75 and TT > 0:  # with T = 0, positions [0] would count as absent (§0)
        rows = int(rng.integers(1, 30))
        tensors['freqs_cis'] = freqs_table(rng, T, rows, Dr)
        tensors['positions'] = ('I32', rng.integers(0, rows, TT))
        meta['rotary_dim'] = J(Dr)
    norm_attrs(rng, meta, 0.6, [1e-6, 1e-2], 0.6)
    return tensors, meta


# ---------------------------------------------------------------- §4
def gen_block_score(rng):
    T = pick(rng, FLOAT_TYPES)
    N = int(rng.integers(1, 4))
    rows, ro, cl = ragged(rng, N, max_rows=4, max_cached=20)
    TT = int(ro[-1])
    r = pick(rng, [1, 1, 2, 3, 4])
    Hi = pick(rng, [1, 2, 4, 6])
    Hs = pick(rng, [d for d in (1, 2, 3, Hi) if Hi % d == 0])
    Di = pick(rng, [4, 8, 12])
    tensors = {}
    meta = {'op': 'block_score', 'ratio': J(r)}
    kc = cl + rows
    u = rng.random()
    if u < 0.5:
        kc = np.maximum(cl, kc - rng.integers(-3, 4, N))
        tensors['key_counts'] = ('I32', kc)
    elif u < 0.6:
        tensors['key_counts'] = ('I32', np.zeros(0))
    # max_blocks around the most blocks a row sees: sometimes fewer (clipping), sometimes more
    need = int(max(np.minimum((cl + np.maximum(rows, 1)) // r, kc // r)))
    MB = max(1, need + int(rng.integers(-2, 3)))
    tensors['index_query'] = (T, rnd(rng, T, (TT, Hi, Di)))
    tensors['block_keys'] = (T, rnd(rng, T, (N * MB, Di)))
    tensors['row_offsets'] = ('U32', ro)
    tensors['cache_lengths'] = ('U32', cl)
    maybe(rng, tensors, 'index_weights', 'F32', rnd(rng, 'F32', (TT, Hi)), zero_shape=(0, Hi))
    if Hs > 1 or rng.random() < 0.3:
        meta['num_selection_heads'] = J(Hs)
    if rng.random() < 0.4:
        meta['scale'] = J(pick(rng, [0.5, 0.125, 2.0]))
    return tensors, meta


# ---------------------------------------------------------------- §5
def gen_block_topk(rng):
    TT = pick(rng, [0, 1, 2, 3, 4])
    Hs = pick(rng, [1, 2, 3])
    W = pick(rng, [1, 2, 5, 8, 13, 40])
    if rng.random() < 0.4:
        s = rng.integers(-3, 4, (TT, Hs, W)).astype(np.float64)  # many ties
    else:
        s = rng.standard_normal((TT, Hs, W))
    m = rng.random((TT, Hs, W))
    s[m < 0.2] = -np.inf
    if rng.random() < 0.5:
        s[(m > 0.2) & (m < 0.3)] = np.nan
    if rng.random() < 0.3:
        s[(m > 0.3) & (m < 0.35)] = np.inf
    if rng.random() < 0.3:
        s[(m > 0.35) & (m < 0.45)] = -0.0
        s[(m > 0.45) & (m < 0.5)] = 0.0
    if rng.random() < 0.1 and TT > 0:
        s[0, 0, :] = -np.inf
    k = int(rng.integers(1, W + 4))
    return {'scores': ('F32', round_to('F32', s))}, {'op': 'block_topk', 'k': J(k)}


# ---------------------------------------------------------------- §6
def gen_expand_route(rng):
    TT = pick(rng, [0, 1, 2, 4])
    Hs = pick(rng, [1, 2])
    r = pick(rng, [1, 2, 3, 4])
    k = pick(rng, [1, 2, 3, 5])
    pos = rng.integers(0, 25, TT)
    BI = np.full((TT, Hs, k), -1)
    BC = np.zeros((TT, Hs), dtype=np.int64)
    for t in range(TT):
        vis = (pos[t] + 1) // r
        for g in range(Hs):
            c = int(rng.integers(0, min(k, vis) + 1))
            BI[t, g, :c] = rng.permutation(vis)[:c]
            BC[t, g] = c
    tensors = {'block_indices': ('I32', BI), 'block_count': ('I32', BC),
               'positions': ('I32', pos)}
    return tensors, {'op': 'expand_route', 'ratio': J(r)}


# ---------------------------------------------------------------- §7
def gen_sparse_attention(rng):
    T = pick(rng, FLOAT_TYPES)
    N = int(rng.integers(1, 4))
    rows, ro, cl = ragged(rng, N, max_rows=3, max_cached=14)
    TT = int(ro[-1])
    Hkv = pick(rng, [1, 2])
    H = Hkv * pick(rng, [1, 2, 3])
    Hs = pick(rng, [d for d in (1, 2, 3, H) if H % d == 0])
    E = pick(rng, [4, 8])
    P = pick(rng, [2, 4, 8])
    NL = int(rng.integers(1, 3))
    MP = max(1, int(max(-(-(cl + rows) // P))))
    pt, num_pages = random_pages(rng, N, MP, int(rng.integers(0, 2)))
    W = pick(rng, [1, 3, 6, 10])
    TI = np.full((TT, Hs, W), -1)
    TC = np.zeros((TT, Hs), dtype=np.int64)
    positions = [int(cl[n]) + i for n in range(N) for i in range(rows[n])]
    for t, p in enumerate(positions):
        for g in range(Hs):
            c = int(rng.integers(0, min(W, p + 1) + 1))
            TI[t, g, :c] = rng.permutation(p + 1)[:c]
            TC[t, g] = c
    tensors = {
        'query': (T, rnd(rng, T, (TT, H, E))),
        'kv_blocks': (T, rnd(rng, T, (num_pages, 2, NL, P, Hkv, E))),
        'page_table': ('U32', pt),
        'row_offsets': ('U32', ro),
        'cache_lengths': ('U32', cl),
        'token_indices': ('I32', TI),
        'token_count': ('I32', TC),
    }
    meta = {'op': 'sparse_attention'}
    maybe(rng, tensors, 'sinks', 'F32', rnd(rng, 'F32', (H,)))
    if rng.random() < 0.4:
        meta['scale'] = J(pick(rng, [0.25, 1.0, 0.7]))
    if NL > 1 or rng.random() < 0.3:
        meta['layer_idx'] = J(int(rng.integers(0, NL)))
    return tensors, meta


# ---------------------------------------------------------------- §8.1
def gen_nsa_compress_attention(rng):
    T = pick(rng, FLOAT_TYPES)
    B = int(rng.integers(1, 4))
    N2 = pick(rng, [1, 2])
    N1 = N2 * pick(rng, [1, 2, 3])
    Dqk = pick(rng, [4, 8])
    Dv = pick(rng, [3, 4, 8])
    d = pick(rng, [1, 2, 4, 16])
    ell = d * pick(rng, [1, 2, 3])  # the contract's l
    lp = ell + d * pick(rng, [0, 0, 1, 2])  # l': a multiple of d, >= l, not always one of l
    P = pick(rng, [2, 4, 8])
    layout = pick(rng, ['TND', 'BSND'])
    causal = bool(rng.random() < 0.5)
    cb = rng.integers(1, 20, B)
    cover = (cb - 1) * d + ell
    nsel = -(-cover // lp)
    k = int(rng.integers(1, int(min(nsel)) + 1))
    qlen = rng.integers(1, 5, B)
    if rng.random() < 0.1:
        qlen[0] = 16
    bt, num_blocks = random_pages(rng, B, int(max(-(-cb // P))) + int(rng.integers(0, 2)),
                                  int(rng.integers(0, 2)))
    if layout == 'TND':
        q = rnd(rng, T, (int(qlen.sum()), N1, Dqk))
    else:
        q = rnd(rng, T, (B, int(max(qlen)) + int(rng.integers(0, 2)), N1, Dqk))
    tensors = {
        'query': (T, q),
        'key': (T, rnd(rng, T, (num_blocks, P, N2 * Dqk), 1.5)),
        'value': (T, rnd(rng, T, (num_blocks, P, N2 * Dv))),
        'block_table': ('I32', bt),
    }
    if not (np.all(qlen == 1) and rng.random() < 0.5):
        tensors['actual_q_len'] = ('I32', qlen)
    tensors['actual_cmp_kv_len'] = ('I32', cb)
    if causal:
        # raw lengths around the cover, sometimes short enough to hide compressed tokens
        Lb = np.maximum(qlen, cover - rng.integers(-d, 2 * d + 2, B))
        if rng.random() < 0.2:
            Lb[0] = qlen[0]
        tensors['actual_sel_kv_len'] = ('I32', Lb)
    elif rng.random() < 0.3:
        tensors['actual_sel_kv_len'] = ('I32', cover + rng.integers(0, d + 1, B))
    meta = {'op': 'nsa_compress_attention', 'num_heads': J(N1), 'num_kv_heads': J(N2),
            'compress_block_size': J(ell), 'compress_stride': J(d), 'select_block_size': J(lp),
            'select_block_count': J(k), 'layout': J(layout), 'causal_mask': J(causal)}
    if rng.random() < 0.7:
        meta['scale'] = J(pick(rng, [0.5, 1.0 / math.sqrt(Dqk), 0.3]))
    return tensors, meta


# ---------------------------------------------------------------- §8.2
def gen_nsa_compress(rng):
    T = pick(rng, FLOAT_TYPES)
    B = int(rng.integers(1, 4))
    d = pick(rng, [1, 2, 3, 4])
    ell = d * pick(rng, [1, 2, 3])
    sl = rng.integers(0, 20, B)
    N = pick(rng, [1, 2, 3])
    D = pick(rng, [1, 4, 8])
    tensors = {'input': (T, rnd(rng, T, (int(sl.sum()), N, D))),
               'weight': (T, rnd(rng, T, (ell, N), 0.5)),
               'seq_lens': ('I32', sl)}
    return tensors, {'op': 'nsa_compress', 'l': J(ell), 'd': J(d)}


GENERATORS = {
    'qsa_prepare': gen_qsa_prepare,
    'qsa_compress_paged': gen_qsa_compress_paged,
    'qsa_prepare_query': gen_qsa_prepare_query,
    'block_score': gen_block_score,
    'block_topk': gen_block_topk,
    'expand_route': gen_expand_route,
    'sparse_attention': gen_sparse_attention,
    'nsa_compress_attention': gen_nsa_compress_attention,
    'nsa_compress': gen_nsa_compress,
}


def case_rng(seed, op, index):
    """The random stream of case `index` of operator `op`: the same for the same seed."""
    return np.random.default_rng([seed, sum(map(ord, op)), index])
