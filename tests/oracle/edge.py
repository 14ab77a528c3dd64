"""Hand-built valid cases: the edges of each operator, and properties a random case rarely meets.

- NaN or garbage in data the contract says is unused (rows past a count, invisible blocks,
  the other plane or layer of a pool, unreferenced pages) must not reach any output;
- the §1 invariant: a sequence fed in one call, in chunks or token by token gives the same
  bits;
- copied values keep their exact bits (NaN, -0.0, subnormals, infinities);
- top-k order with ties, NaN, ±inf and ±0.0; wide rows; k beyond the row;
- attention with large logits and sinks, NSA geometries (nsel of 1 and 2, hidden tokens,
  16 query tokens), default epsilon and scales;
- the choices docs/operators.md records where the contract is silent (integer inputs in either
  integer type, JSON forms of attribute values, page-table entries no position reaches, ...).

Each check is a generator: given a harness.Qsa, it yields one harness.Result per case.
"""
import numpy as np

import bad
import st
from gen import J, freqs_table, rnd, rope_pair, rope_state
from harness import Result, check_valid, failure

CHECKS = []
INF = np.inf
NAN = np.nan
# values whose bits a copy must keep, per type (the third is a subnormal of the type)
SPECIAL = {'F32': [NAN, -0.0, 1e-40, INF], 'F16': [NAN, -0.0, 3e-7, INF],
           'BF16': [-NAN, -0.0, 1e-40, -INF]}


def check(fn):
    CHECKS.append(fn)
    return fn


def topk(scores, **attrs):
    return {'scores': ('F32', np.array(scores, dtype=np.float64))}, \
        dict({'op': 'block_topk'}, **{k: J(v) for k, v in attrs.items()})


# ---------------------------------------------------------------- block_topk (§5)
@check
def topk_edges(qsa):
    yield check_valid(qsa, 'topk_token_budget',
                      *topk([[[0.5, 2.0, -INF, 1.0, 3.0, 0.1]]], token_budget=8, ratio=4))
    yield check_valid(qsa, 'topk_all_nan_or_masked_k_gt_w',
                      *topk([[[NAN, NAN, -INF, NAN]], [[-INF] * 4]], k=6))
    yield check_valid(qsa, 'topk_signed_zero_inf_nan',
                      *topk([[[-0.0, 0.0, -0.0, INF, INF, -1e-45, 1e-45, NAN, 0.0]]], k=9))
    rng = np.random.default_rng(7)
    yield check_valid(qsa, 'topk_k_far_beyond_w', *topk(rng.standard_normal((1, 1, 5)), k=600))
    s = rng.integers(-5, 5, (2, 2, 3000)).astype(np.float64)
    s[s == -5] = -INF
    s[s == 4] = NAN
    yield check_valid(qsa, 'topk_wide_rows_of_ties', *topk(s, k=700))
    # Rows wider than 65536 columns (DSA's r = 1 over a long context): ties across the whole
    # row, NaN and -inf, the best columns at both ends.
    s = rng.integers(-3, 4, (2, 1, 70001)).astype(np.float64)
    s[s == -3] = -INF
    s[s == 2] = NAN
    s[0, 0, -5:] = 9.0
    s[1, 0, :3] = 9.0
    yield check_valid(qsa, 'topk_rows_past_65536_columns', *topk(s, k=300))


# ---------------------------------------------------------------- qsa_prepare (§1)
@check
def prepare_unused_rows_hold_nan(qsa):
    """Past-incomplete rows beyond past mod r and past blocks beyond past/r are not read."""
    rng = np.random.default_rng(8)
    for T in ('F32', 'BF16'):
        N, L, Di, r = 2, 3, 8, 4
        past = np.array([5, 2])
        PI = np.full((N, r - 1, Di), NAN)
        PI[0, :1] = rnd(rng, T, (1, Di))
        PI[1, :2] = rnd(rng, T, (2, Di))
        PB = np.full((N, 3, Di), NAN)
        PB[0, :1] = rnd(rng, T, (1, Di))
        cos, sin = rope_pair(rng, T, (N, L, 4))
        t = {'raw_index_keys': (T, rnd(rng, T, (N, L, Di))), 'past_block_index_keys': (T, PB),
             'key_length': ('I32', past + L), 'rope_cos': cos, 'rope_sin': sin,
             'k_norm_weight': (T, rnd(rng, T, (Di,))), 'past_incomplete_raw_keys': (T, PI),
             'past_incomplete_rope': rope_state(rng, T, N, 4)}
        yield check_valid(qsa, 'prepare_nan_unused_' + T, t,
                          {'op': 'qsa_prepare', 'key_block_size': J(4), 'norm_weight_offset': J(1)})


@check
def prepare_split_invariance(qsa):
    """§1: one call, chunks and token by token give the same bits (the library's own outputs
    fed back as the next call's state); the one call is also checked against the oracle."""
    rng = np.random.default_rng(9)
    N, S, Di, r, Dr = 2, 10, 8, 4, 4
    meta = {'op': 'qsa_prepare', 'key_block_size': J(r)}
    for T in st.FLOAT_TYPES:
        X = rnd(rng, T, (N, S, Di))
        cos, sin = rope_pair(rng, T, (N, S, Dr))
        w = rnd(rng, T, (Di,))
        empty = ((T, np.zeros((N, 0, Di))), (T, np.zeros((N, r - 1, Di))),
                 (T, np.zeros((N, 2 * Dr))))

        def call(lo, hi, state):
            """The tensors of the call that feeds tokens lo..hi-1 after `state`."""
            past_blocks, past_raw, past_rope = state
            return {'raw_index_keys': (T, X[:, lo:hi]), 'past_block_index_keys': past_blocks,
                    'key_length': ('I32', np.array([hi])), 'rope_cos': (T, cos[1][:, lo:hi]),
                    'rope_sin': (T, sin[1][:, lo:hi]), 'k_norm_weight': (T, w),
                    'past_incomplete_raw_keys': past_raw, 'past_incomplete_rope': past_rope}

        name = 'prepare_split_' + T
        whole = check_valid(qsa, name + '_one_call', call(0, S, empty), meta)
        yield whole
        if whole.problems:
            continue
        expected = st.load_bits(whole.output)
        splits = {'chunks': [0, 1, 3, 6, 10]}
        if T == 'F16':
            splits['token_by_token'] = list(range(S + 1))
        for split_name, bounds in splits.items():
            state = empty
            problems = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                run = qsa.run(qsa.write('%s_%s_%d' % (name, split_name, lo), call(lo, hi, state),
                                        meta))
                if run.rc != 0:
                    problems.append('call %d..%d: %s' % (lo, hi, failure(run)))
                    break
                out = st.load(run.output)[0]
                state = (out['block_index_keys'], out['incomplete_raw_keys'],
                         out['incomplete_rope'])
            if not problems:
                got = st.load_bits(run.output)
                problems = ['%s differs from the one call\'s' % k
                            for k in sorted(expected) if not np.array_equal(got[k], expected[k])]
            yield Result('%s_%s' % (name, split_name), problems)


@check
def prepare_without_new_tokens(qsa):
    """L = 0: zero-element rope_cos/sin count as absent (§0), so no incomplete_rope."""
    rng = np.random.default_rng(10)
    t = {'raw_index_keys': ('F32', np.zeros((2, 0, 4))),
         'past_block_index_keys': ('F32', rnd(rng, 'F32', (2, 2, 4))),
         'key_length': ('I32', np.array([5, 8])),
         'rope_cos': ('F32', np.zeros((2, 0, 2))), 'rope_sin': ('F32', np.zeros((2, 0, 2))),
         'past_incomplete_raw_keys': ('F32', rnd(rng, 'F32', (2, 3, 4)))}
    yield check_valid(qsa, 'prepare_L0', t, {'op': 'qsa_prepare', 'key_block_size': J(4)})


@check
def copies_keep_bits(qsa):
    """Copied rows keep their exact bits: qsa_prepare's past blocks and unfinished-block raw
    keys, and the rows of block_keys that qsa_compress_paged leaves as they were."""
    rng = np.random.default_rng(11)
    for T in st.FLOAT_TYPES:
        special = np.array(SPECIAL[T])
        past_blocks = rnd(rng, T, (1, 2, 4))
        past_blocks[0, 0] = special
        raw = rnd(rng, T, (1, 3, 4))
        raw[0, 2] = special
        # past 4 = two copied blocks; new tokens 4, 5 make block 2; token 6 is left unfinished
        t = {'raw_index_keys': (T, raw), 'past_block_index_keys': (T, past_blocks),
             'key_length': ('I32', np.array([7])),
             'past_incomplete_raw_keys': (T, np.zeros((1, 1, 4)))}
        yield check_valid(qsa, 'copy_prepare_' + T, t,
                          {'op': 'qsa_prepare', 'key_block_size': J(2)},
                          kept_bits=[('past_block_index_keys', (0, 0), 'block_index_keys', (0, 0)),
                                     ('raw_index_keys', (0, 2), 'incomplete_raw_keys', (0, 0))])
        block_keys = rnd(rng, T, (6, 4))
        block_keys[2] = special
        block_keys[5] = special
        # incremental: sequence 0 writes block 1 (row 1), sequence 1 block 0 (row 3)
        t = {'kv_blocks': (T, rnd(rng, T, (4, 2, 1, 2, 1, 4))),
             'page_table': ('U32', np.array([[0, 1], [2, 3]])),
             'cache_lengths': ('U32', np.array([2, 0])), 'key_counts': ('I32', np.array([4, 2])),
             'block_keys': (T, block_keys)}
        yield check_valid(qsa, 'copy_compress_paged_' + T, t,
                          {'op': 'qsa_compress_paged', 'ratio': J(2)},
                          kept_bits=[('block_keys', (i,), 'block_keys', (i,))
                                     for i in (0, 2, 4, 5)])


@check
def default_epsilon(qsa):
    """Inputs of size 1e-3 make the norm's epsilon visible: the default must be 1e-6."""
    rng = np.random.default_rng(21)
    for T in ('F32', 'BF16'):
        small = 1e-3
        yield check_valid(qsa, 'eps_default_prepare_' + T, {
            'raw_index_keys': (T, rnd(rng, T, (1, 4, 8), small)),
            'past_block_index_keys': (T, np.zeros((1, 0, 8))),
            'key_length': ('I32', np.array([4])), 'k_norm_weight': (T, rnd(rng, T, (8,))),
            'past_incomplete_raw_keys': (T, np.zeros((1, 3, 8)))},
            {'op': 'qsa_prepare', 'key_block_size': J(4)})
        yield check_valid(qsa, 'eps_default_query_' + T, {
            'index_query_raw': (T, rnd(rng, T, (2, 2, 8), small)),
            'q_norm_weight': (T, rnd(rng, T, (8,)))}, {'op': 'qsa_prepare_query'})
        yield check_valid(qsa, 'compress_paged_ratio_past_64_' + T, {
            'kv_blocks': (T, rnd(rng, T, (3, 2, 1, 64, 1, 8))),
            'page_table': ('U32', np.array([[2, 0, 1]])), 'cache_lengths': ('U32', np.array([0])),
            'key_counts': ('I32', np.array([190])), 'gamma': (T, rnd(rng, T, (8,))),
            'block_keys': (T, np.zeros((2, 8)))}, {'op': 'qsa_compress_paged', 'ratio': J(96)})
        yield check_valid(qsa, 'eps_default_compress_' + T, {
            'kv_blocks': (T, rnd(rng, T, (2, 2, 1, 4, 1, 8), small)),
            'page_table': ('U32', np.array([[1, 0]])), 'cache_lengths': ('U32', np.array([0])),
            'key_counts': ('I32', np.array([8])), 'gamma': (T, rnd(rng, T, (8,))),
            'block_keys': (T, np.zeros((2, 8)))}, {'op': 'qsa_compress_paged', 'ratio': J(4)})


# ---------------------------------------------------------------- qsa_compress_paged (§2)
@check
def compress_paged_unused_pool_holds_nan(qsa):
    """The V plane and the other layers of the pool, and unused pages, are not read."""
    rng = np.random.default_rng(12)
    for mode in ('incremental', 'full'):
        T = 'F32'
        kv = rnd(rng, T, (6, 2, 2, 4, 1, 8))
        kv[:, 1] = NAN  # V plane
        kv[:, :, 0] = NAN  # layer 0 (layer_idx = 1)
        kv[4] = NAN  # page 4 is sequence 1's, which completes no block
        t = {'kv_blocks': (T, kv), 'page_table': ('U32', np.array([[3, 1, 5, 0], [2, 4, 4, 4]])),
             'cache_lengths': ('U32', np.array([5, 0])), 'key_counts': ('I32', np.array([13, 3])),
             'gamma': (T, rnd(rng, T, (8,))), 'freqs_cis': freqs_table(rng, T, 13, 4),
             'block_keys': (T, rnd(rng, T, (8, 8)))}
        yield check_valid(qsa, 'compress_paged_nan_' + mode, t, {
            'op': 'qsa_compress_paged', 'ratio': J(4), 'rotary_dim': J(4), 'layer_idx': J(1),
            'mode': J(mode), 'norm_weight_offset': J(1)})


# ---------------------------------------------------------------- block_score (§4)
@check
def score_edges(qsa):
    rng = np.random.default_rng(13)
    T = 'F32'
    block_keys = rnd(rng, T, (8, 4))
    block_keys[2:4] = NAN  # sequence 0's rows sit at positions 3, 4: with r = 2 they see 0, 1
    block_keys[4:8] = NAN  # sequence 1's row at position 0 sees nothing
    yield check_valid(qsa, 'score_nan_in_invisible_blocks', {
        'index_query': (T, rnd(rng, T, (3, 2, 4))), 'block_keys': (T, block_keys),
        'row_offsets': ('U32', np.array([0, 2, 3])), 'cache_lengths': ('U32', np.array([3, 0]))},
        {'op': 'block_score', 'ratio': J(2)})
    T = 'BF16'
    yield check_valid(qsa, 'score_dsa_clipped_by_max_blocks', {
        'index_query': (T, rnd(rng, T, (3, 4, 8))), 'block_keys': (T, rnd(rng, T, (3, 8))),
        'row_offsets': ('U32', np.array([0, 3])), 'cache_lengths': ('U32', np.array([4])),
        'index_weights': ('F32', rnd(rng, 'F32', (3, 4)))},
        {'op': 'block_score', 'ratio': J(1), 'num_selection_heads': J(4)})


# ---------------------------------------------------------------- expand_route (§6)
@check
def route_edges(qsa):
    yield check_valid(qsa, 'route_garbage_after_count', {
        'block_indices': ('I32', np.array([[[2, 0, 99, -7]], [[1, 12345, 5, 5]]])),
        'block_count': ('I32', np.array([[2], [1]])), 'positions': ('I32', np.array([13, 7]))},
        {'op': 'expand_route', 'ratio': J(4)})
    yield check_valid(qsa, 'route_r1', {
        'block_indices': ('I32', np.array([[[5, 0, -1]]])), 'block_count': ('I32', np.array([[2]])),
        'positions': ('I32', np.array([6]))}, {'op': 'expand_route', 'ratio': J(1)})


# ---------------------------------------------------------------- sparse_attention (§7)
def attention_case(rng, T, sinks=None, scale=None, unused_page_nan=False, size=1.0):
    """Two rows of one sequence (positions 6, 7), H = 4 over Hkv = 2 and Hs = 2, layer 1 of 2;
    row 0 has an entry (9999) after its count and an empty group."""
    kv = rnd(rng, T, (3, 2, 2, 4, 2, 8), size)
    if unused_page_nan:
        kv[1] = NAN  # the page table never names page 1
    t = {'query': (T, rnd(rng, T, (2, 4, 8), size)), 'kv_blocks': (T, kv),
         'page_table': ('U32', np.array([[2, 0]])), 'row_offsets': ('U32', np.array([0, 2])),
         'cache_lengths': ('U32', np.array([6])),
         'token_indices': ('I32', np.array([[[0, 3, 6, 9999], [-1, -1, -1, -1]],
                                            [[7, 1, 2, 5], [4, 3, 5, 6]]])),
         'token_count': ('I32', np.array([[3, 0], [4, 2]]))}
    if sinks is not None:
        t['sinks'] = ('F32', np.array(sinks, dtype=np.float64))
    meta = {'op': 'sparse_attention', 'layer_idx': J(1)}
    if scale is not None:
        meta['scale'] = J(scale)
    return t, meta


@check
def attention_edges(qsa):
    rng = np.random.default_rng(14)
    for T in st.FLOAT_TYPES:
        yield check_valid(qsa, 'attn_nan_unused_page_' + T,
                          *attention_case(rng, T, unused_page_nan=True))
        yield check_valid(qsa, 'attn_sinks_' + T,
                          *attention_case(rng, T, sinks=[0.5, -2.0, 30.0, -30.0]))
        yield check_valid(qsa, 'attn_large_logits_' + T,
                          *attention_case(rng, T, scale=8.0, size=3.0))
        yield check_valid(qsa, 'attn_large_sinks_' + T,
                          *attention_case(rng, T, sinks=[80.0, 80.0, -80.0, 0.0], scale=2.0))


# ---------------------------------------------------------------- NSA (§8)
def nsa_case(T, qlen, cb, Lb, N1, N2, Dqk, Dv, ell, d, lp, k, P, layout, causal, scale=None,
             S=None, seed=0):
    """An nsa_compress_attention case: qlen, cb, Lb per batch (Lb None: not given); ell, d, lp
    are the contract's l, d, l'."""
    rng = np.random.default_rng(seed)
    B = len(qlen)
    per_batch = int(max(-(-np.array(cb) // P)))
    if layout == 'TND':
        q = rnd(rng, T, (sum(qlen), N1, Dqk))
    else:
        q = rnd(rng, T, (B, S or max(qlen), N1, Dqk))
    t = {'query': (T, q), 'key': (T, rnd(rng, T, (B * per_batch, P, N2 * Dqk))),
         'value': (T, rnd(rng, T, (B * per_batch, P, N2 * Dv))),
         'block_table': ('I32', rng.permutation(B * per_batch).reshape(B, per_batch)),
         'actual_q_len': ('I32', np.array(qlen)), 'actual_cmp_kv_len': ('I32', np.array(cb))}
    if Lb is not None:
        t['actual_sel_kv_len'] = ('I32', np.array(Lb))
    meta = {'op': 'nsa_compress_attention', 'num_heads': J(N1), 'num_kv_heads': J(N2),
            'compress_block_size': J(ell), 'compress_stride': J(d), 'select_block_size': J(lp),
            'select_block_count': J(k), 'layout': J(layout), 'causal_mask': J(causal)}
    if scale is not None:
        meta['scale'] = J(scale)
    return t, meta


@check
def nsa_edges(qsa):
    # c_b = 1, l' = l: one selection block
    yield check_valid(qsa, 'nsa_nsel1', *nsa_case(
        'F32', [1], [1], None, 2, 1, 4, 4, 32, 16, 32, 1, 4, 'TND', False))
    # c_b = 2, d = 16, l = l' = 32: cover 48, two selection blocks, k = 2
    yield check_valid(qsa, 'nsa_nsel2', *nsa_case(
        'F32', [2], [2], [48], 2, 1, 4, 4, 32, 16, 32, 2, 4, 'TND', True))
    # causal with a short raw length: some queries see no compressed token
    yield check_valid(qsa, 'nsa_query_sees_nothing', *nsa_case(
        'F16', [2, 1], [3, 4], [2, 20], 4, 2, 8, 4, 16, 4, 16, 2, 2, 'BSND', True, S=3))
    # 16 query tokens with d = 1: many hidden tokens
    yield check_valid(qsa, 'nsa_q16_d1', *nsa_case(
        'BF16', [16], [30], [30], 2, 1, 8, 8, 4, 1, 8, 4, 8, 'TND', True))
    yield check_valid(qsa, 'nsa_q16_d1_bsnd', *nsa_case(
        'F32', [16, 5], [30, 9], [30, 12], 4, 2, 8, 8, 4, 1, 8, 2, 8, 'BSND', True))
    # the Ascend geometry l = 32, d = 16, l' = 64 at small sizes
    yield check_valid(qsa, 'nsa_ascend_geometry', *nsa_case(
        'BF16', [1, 1], [40, 7], None, 4, 2, 16, 8, 32, 16, 64, 2, 8, 'TND', False))
    yield check_valid(qsa, 'nsa_ascend_geometry_causal', *nsa_case(
        'F16', [4, 3], [40, 7], [655, 130], 4, 2, 16, 8, 32, 16, 64, 2, 8, 'BSND', True, S=5))
    yield check_valid(qsa, 'nsa_default_scale', *nsa_case(
        'F32', [1], [9], None, 2, 1, 8, 4, 4, 2, 8, 2, 4, 'TND', False))
    # k = nsel, and l' = 3d not a multiple of l
    yield check_valid(qsa, 'nsa_k_eq_nsel', *nsa_case(
        'F32', [2], [10], None, 2, 2, 4, 4, 4, 2, 6, 4, 4, 'TND', False))
    t, meta = nsa_case('F32', [1, 1], [5, 6], None, 2, 1, 4, 4, 4, 2, 4, 2, 4, 'TND', False)
    del t['actual_q_len']
    yield check_valid(qsa, 'nsa_default_q_len', t, meta)


@check
def nsa_compress_edges(qsa):
    rng = np.random.default_rng(15)
    T = 'F32'
    X = (T, rnd(rng, T, (10, 2, 3)))
    yield check_valid(qsa, 'nsa_compress_stride_beyond_window', {
        'input': X, 'weight': (T, rnd(rng, T, (2, 2))), 'seq_lens': ('I32', np.array([7, 3]))},
        {'op': 'nsa_compress', 'l': J(2), 'd': J(3)})
    yield check_valid(qsa, 'nsa_compress_no_window', {
        'input': X, 'weight': (T, rnd(rng, T, (8, 2))), 'seq_lens': ('I32', np.array([7, 3, 0]))},
        {'op': 'nsa_compress', 'l': J(8), 'd': J(4)})
    yield check_valid(qsa, 'nsa_compress_no_tokens', {
        'input': (T, np.zeros((0, 2, 3))), 'weight': (T, rnd(rng, T, (2, 2))),
        'seq_lens': ('I32', np.array([0]))}, {'op': 'nsa_compress', 'l': J(2), 'd': J(1)})


# ---------------------------------------------------------------- documented choices
@check
def documented_choices(qsa):
    """Readings that docs/operators.md records where the contract is silent, as variants of
    the bad-input module's valid base cases."""

    def variant(kind, name, change):
        t, meta = bad.base(kind)
        change(t, meta)
        return check_valid(qsa, 'doc_' + name, t, meta)

    # integer inputs in either integer type
    yield variant('qsa_prepare', 'key_length_u32', bad.retype('key_length', 'U32'))
    yield variant('block_score', 'row_offsets_i32', bad.retype('row_offsets', 'I32'))
    yield variant('nsa_compress_attention', 'block_table_u32', bad.retype('block_table', 'U32'))
    yield variant('sparse_attention', 'page_table_i32', bad.retype('page_table', 'I32'))
    # JSON forms: an integer with a zero fraction, 0/1 for a boolean, null for the default
    yield variant('block_topk', 'k_2.0', bad.set_attr('k', '2.0'))
    yield variant('block_topk', 'k_1e0', bad.set_attr('k', '1e0'))
    yield variant('sparse_attention', 'scale_integer_text', bad.set_attr('scale', '1'))
    yield variant('nsa_compress_attention', 'causal_1', bad.set_attr('causal_mask', '1'))
    yield variant('nsa_compress_attention', 'causal_0', bad.set_attr('causal_mask', '0'))
    yield variant('nsa_compress_attention', 'causal_null', bad.set_attr('causal_mask', 'null'))
    yield variant('block_topk', 'token_budget_not_multiple', bad.both(
        bad.set_attr('k', None), bad.set_attr('token_budget', '10'), bad.set_attr('ratio', '4')))
    # metadata `format` and tensors named as outputs are ignored
    yield variant('block_topk', 'format_metadata', bad.set_attr('format', 'pt'))
    yield variant('block_topk', 'output_named_input',
                  bad.set_input('block_count', 'I32', np.zeros((2, 2))))
    # table entries that no position reaches are not checked
    yield variant('qsa_compress_paged', 'unreached_page_entries',
                  bad.set_input('page_table', 'U32', [[3, 1, 5], [2, 99, 99]]))
    yield variant('sparse_attention', 'unreached_page_entry',
                  bad.set_input('page_table', 'U32', [[2, 0, 77]]))
    yield variant('nsa_compress_attention', 'unreached_block_entries',
                  bad.set_input('block_table', 'I32', [[0, 1, 55], [2, 3, -9]]))
    # §4 lists no error for key_counts < cache_lengths: vis follows its formula
    yield variant('block_score', 'key_counts_below_cache_lengths',
                  bad.set_input('key_counts', 'I32', [4, 10]))
    # page_stride 2·packed over 5 packed pages: page 2 ends where the pool ends
    pool = rnd(np.random.default_rng(16), 'F32', (5, 2, 2, 4, 1, 8))
    yield variant('qsa_compress_paged', 'page_stride_exact_fit', bad.both(
        bad.set_input('kv_blocks', 'F32', pool), bad.set_attr('page_stride', J(2 * 2 * 2 * 4 * 8)),
        bad.set_input('page_table', 'U32', [[0, 1, 2], [2, 1, 0]])))
