"""Realistic geometries: the sizes of the models the contract names, at a few rows each.

They take the GPU paths that small cases do not: wide top-k rows (a 128k-token decode), Di =
128 rows normed in one workgroup, block scores over a thousand blocks, attention over 2051
selected tokens with E = 256, NSA at the Ascend geometry and long nsa_compress inputs.

Each check is a generator: given a harness.Qsa, it yields one harness.Result per case.
"""
import numpy as np

from edge import nsa_case
from gen import J, freqs_table, rnd, rope_pair, rope_state
from harness import check_valid

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def topk_large(qsa):
    rng = np.random.default_rng(99)
    # a decode over 128k tokens: W = 32768 blocks, k = 512, exact ties; a masked tail
    s = rng.standard_normal((2, 1, 32768))
    s[1, 0, 20000:] = -np.inf
    s[0, 0, ::7] = 0.5
    yield check_valid(qsa, 'large_topk_wide', {'scores': ('F32', s)},
                      {'op': 'block_topk', 'k': J(512)})
    # a prefill chunk: 64 rows of 700 blocks with ties, NaN and masked entries
    s = rng.integers(-50, 50, (64, 2, 700)).astype(np.float64)
    s[s < -40] = -np.inf
    s[s > 45] = np.nan
    yield check_valid(qsa, 'large_topk_rows', {'scores': ('F32', s)},
                      {'op': 'block_topk', 'k': J(100)})


@check
def qsa_indexer_large(qsa):
    """The Qwen indexer geometry: Di = 128, Dr = 64, r = 4, pages of 128 tokens."""
    rng = np.random.default_rng(100)
    N, L, Di, r, Dr = 3, 37, 128, 4, 64
    for T in ('BF16', 'F32'):
        cos, sin = rope_pair(rng, T, (N, L, Dr))
        t = {'raw_index_keys': (T, rnd(rng, T, (N, L, Di))),
             'past_block_index_keys': (T, rnd(rng, T, (N, 33, Di))),
             'key_length': ('I32', np.array([0, 9, 130]) + L), 'rope_cos': cos, 'rope_sin': sin,
             'k_norm_weight': (T, rnd(rng, T, (Di,), 0.1)),
             'past_incomplete_raw_keys': (T, rnd(rng, T, (N, r - 1, Di))),
             'past_incomplete_rope': rope_state(rng, T, N, Dr)}
        yield check_valid(qsa, 'large_prepare_' + T, t, {
            'op': 'qsa_prepare', 'key_block_size': J(r), 'norm_weight_offset': J(1)})
    T = 'BF16'
    pages = rng.permutation(12).reshape(2, 6)
    table = freqs_table(rng, T, 704, Dr)
    for mode in ('full', 'incremental'):
        t = {'kv_blocks': (T, rnd(rng, T, (12, 2, 2, 128, 1, Di))),
             'page_table': ('U32', pages), 'cache_lengths': ('U32', np.array([650, 0])),
             'key_counts': ('I32', np.array([700, 301])), 'gamma': (T, rnd(rng, T, (Di,), 0.1)),
             'freqs_cis': table, 'block_keys': (T, rnd(rng, T, (2 * 180, Di)))}
        yield check_valid(qsa, 'large_compress_paged_' + mode, t, {
            'op': 'qsa_compress_paged', 'ratio': J(r), 'rotary_dim': J(Dr), 'layer_idx': J(1),
            'mode': J(mode), 'norm_weight_offset': J(1)})
    for T in ('BF16', 'F16'):
        t = {'index_query_raw': (T, rnd(rng, T, (40, 4, Di))),
             'q_norm_weight': (T, rnd(rng, T, (Di,), 0.1)),
             'freqs_cis': freqs_table(rng, T, 500, Dr),
             'positions': ('I32', rng.integers(0, 500, 40))}
        yield check_valid(qsa, 'large_prepare_query_' + T, t, {
            'op': 'qsa_prepare_query', 'rotary_dim': J(Dr), 'norm_weight_offset': J(1)})


@check
def block_score_large(qsa):
    rng = np.random.default_rng(101)
    # two decode rows and a 30-row prefill chunk over up to 1001 blocks, Hi = 4 in 2 groups
    ro = np.array([0, 1, 2, 32])
    for T in ('BF16', 'F32'):
        t = {'index_query': (T, rnd(rng, T, (32, 4, 128))),
             'block_keys': (T, rnd(rng, T, (3 * 1001, 128))),
             'row_offsets': ('U32', ro), 'cache_lengths': ('U32', np.array([4000, 123, 300])),
             'index_weights': ('F32', rnd(rng, 'F32', (32, 4)))}
        yield check_valid(qsa, 'large_score_' + T, t, {
            'op': 'block_score', 'ratio': J(4), 'num_selection_heads': J(2)})
    # DSA: r = 1, 16 index heads
    T = 'BF16'
    t = {'index_query': (T, rnd(rng, T, (3, 16, 128))), 'block_keys': (T, rnd(rng, T, (903, 128))),
         'row_offsets': ('U32', np.array([0, 3])), 'cache_lengths': ('U32', np.array([900])),
         'index_weights': ('F32', rnd(rng, 'F32', (3, 16)))}
    yield check_valid(qsa, 'large_score_dsa', t, {'op': 'block_score', 'ratio': J(1)})


@check
def attention_large(qsa):
    """H = 24 over Hkv = 2, E = 256, 512 blocks of 4 plus the tail (2051 tokens), pages of 128."""
    rng = np.random.default_rng(102)
    k, r = 512, 4
    for T in ('BF16', 'F32'):
        TI = np.full((2, 1, k * r + r - 1), -1)
        TC = np.zeros((2, 1), dtype=np.int64)
        for row, p in enumerate((3000, 3001)):
            vis = (p + 1) // r
            tokens = [b * r + i for b in rng.permutation(vis)[:k] for i in range(r)]
            tokens += list(range(vis * r, p + 1))
            TI[row, 0, :len(tokens)] = tokens
            TC[row, 0] = len(tokens)
        t = {'query': (T, rnd(rng, T, (2, 24, 256))),
             'kv_blocks': (T, rnd(rng, T, (24, 2, 1, 128, 2, 256))),
             'page_table': ('U32', rng.permutation(24).reshape(1, 24)),
             'row_offsets': ('U32', np.array([0, 2])), 'cache_lengths': ('U32', np.array([3000])),
             'token_indices': ('I32', TI), 'token_count': ('I32', TC),
             'sinks': ('F32', rnd(rng, 'F32', (24,)))}
        yield check_valid(qsa, 'large_attention_' + T, t, {'op': 'sparse_attention'})


@check
def attention_long_list(qsa):
    """One decode row over a 4100-token list in order, 12 heads per KV head (48 over 4),
    E = 192: a long split of the subgroup pass, which once stopped early at llvmpipe's loop
    limit past about 3000 tokens at this head count."""
    rng = np.random.default_rng(103)
    n, T = 4100, 'F32'
    TI = np.full((1, 1, n), -1)
    TI[0, 0, :] = np.arange(n)
    t = {'query': (T, rnd(rng, T, (1, 48, 192))),
         'kv_blocks': (T, rnd(rng, T, (33, 2, 1, 128, 4, 192))),
         'page_table': ('U32', rng.permutation(33).reshape(1, 33)),
         'row_offsets': ('U32', np.array([0, 1])), 'cache_lengths': ('U32', np.array([n - 1])),
         'token_indices': ('I32', TI), 'token_count': ('I32', np.array([[n]]))}
    yield check_valid(qsa, 'large_attention_long_list', t, {'op': 'sparse_attention'})


@check
def nsa_large(qsa):
    """The Ascend geometry: Dqk = 192, Dv = 128, l = 32, d = 16, l' = 64, k = 16."""
    yield check_valid(qsa, 'large_nsa_tnd', *nsa_case(
        'BF16', [1, 1], [300, 97], None, 16, 4, 192, 128, 32, 16, 64, 16, 64, 'TND', False,
        seed=4))
    yield check_valid(qsa, 'large_nsa_bsnd_causal', *nsa_case(
        'F16', [4, 2], [250, 60], [4020, 980], 16, 4, 192, 128, 32, 16, 64, 16, 64, 'BSND', True,
        S=4, seed=5))
    yield check_valid(qsa, 'large_nsa_q16', *nsa_case(
        'F32', [16], [120], [1935], 8, 2, 64, 64, 32, 16, 64, 8, 32, 'TND', True, seed=6))
    rng = np.random.default_rng(103)
    T = 'BF16'
    seq_lens = np.array([1000, 33, 517])
    yield check_valid(qsa, 'large_nsa_compress', {
        'input': (T, rnd(rng, T, (int(seq_lens.sum()), 4, 192))),
        'weight': (T, rnd(rng, T, (32, 4), 0.2)), 'seq_lens': ('I32', seq_lens)},
        {'op': 'nsa_compress', 'l': J(32), 'd': J(16)})
