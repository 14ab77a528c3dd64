"""Bad input (SPEC §0, §9 and each operator's errors): every case must be rejected.

Each case starts from a valid base case of one operator (run first, as a valid case, so that a
rejection can only come from the change) and breaks one rule. The call must exit non-zero,
write no output, and name the operator, the input or attribute at fault and the offending
value. Where the library's check fires on a related input (an odd `rotary_dim` is reported on
`freqs_cis`, whose width it must equal), the case lists both names.
"""
import dataclasses
from typing import Callable, Optional, Tuple

import numpy as np

import st
from gen import J, rnd
from harness import Result, check_valid, judge_rejection


@dataclasses.dataclass
class BadCase:
    name: str
    base: str
    mutate: Callable  # edits (tensors, meta) of the base case in place
    names: Tuple[str, ...]  # the message must name one of them
    value: Optional[str]  # the offending value the message must show
    writer: Callable = st.save  # how the case file is written
    op_named: bool = True  # False for files that cannot be parsed (no operator known)


def base(kind):
    """A valid case of one operator: (tensors, meta)."""
    rng = np.random.default_rng(11)
    T = 'F32'
    if kind == 'qsa_prepare':
        ang = rng.uniform(-3, 3, (2, 3, 4))
        return {'raw_index_keys': (T, rnd(rng, T, (2, 3, 8))),
                'past_block_index_keys': (T, rnd(rng, T, (2, 1, 8))),
                'key_length': ('I32', np.array([9, 6])),
                'rope_cos': (T, np.cos(ang)), 'rope_sin': (T, np.sin(ang)),
                'k_norm_weight': (T, rnd(rng, T, (8,))),
                'past_incomplete_raw_keys': (T, rnd(rng, T, (2, 3, 8))),
                'past_incomplete_rope': (T, rnd(rng, T, (2, 8)))}, \
            {'op': kind, 'key_block_size': J(4)}
    if kind == 'qsa_compress_paged':
        return {'kv_blocks': (T, rnd(rng, T, (6, 2, 2, 4, 1, 8))),
                'page_table': ('U32', np.array([[3, 1, 5], [2, 4, 0]])),
                'cache_lengths': ('U32', np.array([5, 0])),
                'key_counts': ('I32', np.array([12, 3])),
                'gamma': (T, rnd(rng, T, (8,))), 'freqs_cis': (T, rnd(rng, T, (16, 4))),
                'block_keys': (T, rnd(rng, T, (6, 8)))}, \
            {'op': kind, 'ratio': J(4), 'rotary_dim': J(4), 'layer_idx': J(1)}
    if kind == 'qsa_prepare_query':
        return {'index_query_raw': (T, rnd(rng, T, (3, 2, 8))),
                'q_norm_weight': (T, rnd(rng, T, (8,))),
                'freqs_cis': (T, rnd(rng, T, (10, 4))),
                'positions': ('I32', np.array([0, 4, 9]))}, {'op': kind, 'rotary_dim': J(4)}
    if kind == 'qsa_prepare_query/cos-sin':
        return {'index_query_raw': (T, rnd(rng, T, (3, 2, 8))),
                'rope_cos': (T, rnd(rng, T, (3, 4))),
                'rope_sin': (T, rnd(rng, T, (3, 4)))}, {'op': 'qsa_prepare_query'}
    if kind == 'block_score':
        return {'index_query': (T, rnd(rng, T, (4, 4, 8))),
                'block_keys': (T, rnd(rng, T, (6, 8))),
                'row_offsets': ('U32', np.array([0, 3, 4])),
                'cache_lengths': ('U32', np.array([5, 9])),
                'key_counts': ('I32', np.array([8, 10])),
                'index_weights': ('F32', rnd(rng, 'F32', (4, 4)))}, \
            {'op': kind, 'ratio': J(4), 'num_selection_heads': J(2)}
    if kind == 'block_topk':
        return {'scores': ('F32', rnd(rng, 'F32', (2, 2, 6)))}, {'op': kind, 'k': J(3)}
    if kind == 'expand_route':
        return {'block_indices': ('I32', np.array([[[1, 0, -1]], [[0, -1, -1]]])),
                'block_count': ('I32', np.array([[2], [1]])),
                'positions': ('I32', np.array([9, 5]))}, {'op': kind, 'ratio': J(4)}
    if kind == 'sparse_attention':
        return {'query': (T, rnd(rng, T, (2, 4, 8))),
                'kv_blocks': (T, rnd(rng, T, (3, 2, 2, 4, 2, 8))),
                'page_table': ('U32', np.array([[2, 0]])),
                'row_offsets': ('U32', np.array([0, 2])),
                'cache_lengths': ('U32', np.array([6])),
                'token_indices': ('I32', np.array([[[0, 3, 6, -1]], [[7, 1, 2, 5]]])),
                'token_count': ('I32', np.array([[3], [4]])),
                'sinks': ('F32', rnd(rng, 'F32', (4,)))}, {'op': kind, 'layer_idx': J(1)}
    if kind in ('nsa_compress_attention', 'nsa_compress_attention/BSND'):
        bsnd = kind.endswith('BSND')
        return {'query': (T, rnd(rng, T, (2, 3, 4, 8) if bsnd else (3, 4, 8))),
                'key': (T, rnd(rng, T, (4, 4, 16))), 'value': (T, rnd(rng, T, (4, 4, 8))),
                'block_table': ('I32', np.array([[0, 1], [2, 3]])),
                'actual_q_len': ('I32', np.array([2, 1])),
                'actual_cmp_kv_len': ('I32', np.array([7, 5])),
                'actual_sel_kv_len': ('I32', np.array([40, 30]))}, \
            {'op': 'nsa_compress_attention', 'num_heads': J(4), 'num_kv_heads': J(2),
             'compress_block_size': J(8), 'compress_stride': J(4), 'select_block_size': J(16),
             'select_block_count': J(2), 'layout': J('BSND' if bsnd else 'TND'),
             'causal_mask': J(True)}
    if kind == 'nsa_compress':
        return {'input': (T, rnd(rng, T, (10, 2, 3))), 'weight': (T, rnd(rng, T, (4, 2))),
                'seq_lens': ('I32', np.array([7, 3]))}, {'op': kind, 'l': J(4), 'd': J(2)}
    raise KeyError(kind)


# the base cases, by operator (two variants of qsa_prepare_query and nsa_compress_attention)
PREP = 'qsa_prepare'
PAGED = 'qsa_compress_paged'
QUERY = 'qsa_prepare_query'
QUERY_CS = 'qsa_prepare_query/cos-sin'
SCORE = 'block_score'
TOPK = 'block_topk'
ROUTE = 'expand_route'
ATTN = 'sparse_attention'
NSA = 'nsa_compress_attention'
NSA_BSND = 'nsa_compress_attention/BSND'
NSA_COMP = 'nsa_compress'
BASES = (PREP, PAGED, QUERY, QUERY_CS, SCORE, TOPK, ROUTE, ATTN, NSA, NSA_BSND, NSA_COMP)


# ---------------------------------------------------------------- mutations
def set_input(name, dtype, values):
    def mutate(t, m):
        t[name] = (dtype, np.asarray(values))
    return mutate


def set_attr(name, text):
    """Sets attribute `name` to the JSON text `text`; None removes it."""
    def mutate(t, m):
        if text is None:
            m.pop(name, None)
        else:
            m[name] = text
    return mutate


def drop(name):
    def mutate(t, m):
        del t[name]
    return mutate


def retype(name, dtype):
    """Stores input `name` as dtype, values unchanged."""
    def mutate(t, m):
        t[name] = (dtype, t[name][1])
    return mutate


def both(*mutations):
    def mutate(t, m):
        for f in mutations:
            f(t, m)
    return mutate


def keep(t, m):
    """No change (the fault is in how the file is written)."""


# ---------------------------------------------------------------- file writers
def edited_header(edit):
    def writer(path, t, m):
        st.save(path, t, m, edit_header=edit)
    return writer


def truncated(path, t, m):
    st.save(path, t, m)
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:-10])


def foreign_type(name, dtype, np_dtype):
    """Writes input `name` well-formed but as a type the contract does not support."""
    def writer(path, t, m):
        values = np.ascontiguousarray(t[name][1], dtype=np_dtype)
        rest = {k: v for k, v in t.items() if k != name}
        st.save(path, rest, m, raw={name: (dtype, values.shape, values.tobytes())})
    return writer


def set_header(tensor, field, value):
    def edit(header):
        header[tensor][field] = value
    return edit


def metadata_number(header):
    header['__metadata__']['k'] = 3  # metadata values must be strings


CASES = []


def reject(name, kind, mutate, names, value=None, **kw):
    """Declares a case; names: the input or attribute to be named ('a|b': either)."""
    CASES.append(BadCase(name, kind, mutate, tuple(names.split('|')) if names else (),
                         None if value is None else str(value), **kw))


z = np.zeros  # the values of a reshaped input do not matter: its shape is the fault

# ---------------------------------------------------------------- case files, attributes
reject('unknown_op', TOPK, set_attr('op', 'block_topkk'), '', 'block_topkk', op_named=False)
reject('missing_op', TOPK, set_attr('op', None), 'op', op_named=False)
reject('attr_malformed_json', TOPK, set_attr('k', '4x'), 'k', '4x')
reject('attr_string_for_int', TOPK, set_attr('k', '"4"'), 'k')
reject('attr_fractional_int', TOPK, set_attr('k', '2.5'), 'k', '2.5')
reject('attr_bool_for_int', TOPK, set_attr('k', 'true'), 'k')
reject('attr_string_for_float', ATTN, set_attr('scale', '"0.5"'), 'scale')
reject('attr_number_for_string', NSA, set_attr('layout', '1'), 'layout')
reject('attr_2_for_bool', NSA, set_attr('causal_mask', '2'), 'causal_mask', 2)
reject('attr_string_for_bool', NSA, set_attr('causal_mask', '"yes"'),
       'causal_mask', 'yes')
reject('attr_required_missing', TOPK, set_attr('k', None), 'k')
reject('attr_required_null', TOPK, set_attr('k', 'null'), 'k')
reject('attr_unknown', TOPK, set_attr('kk', '3'), 'kk')
reject('input_required_missing', TOPK, drop('scores'), 'scores')
reject('input_unknown', TOPK, set_input('scorez', 'F32', z(3)), 'scorez')
reject('file_type_f64', TOPK, keep, 'scores', 'F64',
       writer=foreign_type('scores', 'F64', '<f8'))
reject('file_type_i64', PREP, keep, 'key_length', 'I64',
       writer=foreign_type('key_length', 'I64', '<i8'))
reject('file_size_mismatch', TOPK, keep, 'scores', op_named=False,
       writer=edited_header(set_header('scores', 'dtype', 'F64')))
reject('file_offsets_out_of_range', TOPK, keep, 'scores', op_named=False,
       writer=edited_header(set_header('scores', 'data_offsets', [0, 9999])))
reject('file_truncated', TOPK, keep, '', op_named=False, writer=truncated)
reject('file_metadata_not_string', TOPK, keep, '', op_named=False,
       writer=edited_header(metadata_number))

# ---------------------------------------------------------------- block_topk
reject('topk_k_zero', TOPK, set_attr('k', '0'), 'k', 0)
reject('topk_k_negative', TOPK, set_attr('k', '-2'), 'k', -2)
reject('topk_budget_below_ratio', TOPK, both(set_attr('k', None),
       set_attr('token_budget', '3'), set_attr('ratio', '4')), 'token_budget', 3)
reject('topk_scores_f16', TOPK, retype('scores', 'F16'), 'scores', 'F16')
reject('topk_scores_2d', TOPK, set_input('scores', 'F32', z((2, 6))), 'scores')

# ---------------------------------------------------------------- qsa_prepare
reject('prep_key_length_len', PREP, set_input('key_length', 'I32', [9, 6, 7]), 'key_length')
reject('prep_past_negative', PREP, set_input('key_length', 'I32', [9, 2]), 'key_length', 2)
reject('prep_key_length_huge', PREP, set_input('key_length', 'I32', [2 ** 31 - 1, 6]),
       'key_length|past_block_index_keys')
reject('prep_rope_cos_only', PREP, drop('rope_sin'), 'rope_sin')
reject('prep_rope_shape_mismatch', PREP, set_input('rope_sin', 'F32', z((2, 3, 6))), 'rope_sin')
reject('prep_rope_dr_odd', PREP, both(set_input('rope_cos', 'F32', z((2, 3, 3))),
       set_input('rope_sin', 'F32', z((2, 3, 3))),
       set_input('past_incomplete_rope', 'F32', z((2, 6)))), 'rope_cos', 3)
reject('prep_rope_dr_gt_di', PREP, both(set_input('rope_cos', 'F32', z((2, 3, 10))),
       set_input('rope_sin', 'F32', z((2, 3, 10))),
       set_input('past_incomplete_rope', 'F32', z((2, 20)))), 'rope_cos', 10)
reject('prep_norm_weight_len', PREP, set_input('k_norm_weight', 'F32', z(7)), 'k_norm_weight', 7)
reject('prep_past_incomplete_shape', PREP,
       set_input('past_incomplete_raw_keys', 'F32', z((2, 4, 8))),
       'past_incomplete_raw_keys')
reject('prep_past_incomplete_rope_missing', PREP, drop('past_incomplete_rope'),
       'past_incomplete_rope')
reject('prep_past_incomplete_rope_shape', PREP, set_input('past_incomplete_rope', 'F32', z((2, 4))),
       'past_incomplete_rope')
# with L = 0, rope_cos/sin [N, 0, Dr] are zero-element, i.e. absent (§0): rope is off
reject('prep_L0_rope_state_without_rope', PREP, both(
       set_input('raw_index_keys', 'F32', z((2, 0, 8))), set_input('key_length', 'I32', [6, 3]),
       set_input('rope_cos', 'F32', z((2, 0, 4))), set_input('rope_sin', 'F32', z((2, 0, 4)))),
       'past_incomplete_rope')
reject('prep_r1', PREP, set_attr('key_block_size', '1'), 'key_block_size', 1)
reject('prep_r_missing', PREP, set_attr('key_block_size', None), 'key_block_size')
# key_length 9 with L = 3: past 6, one past block to copy, but Bp = 0
reject('prep_past_blocks_too_few', PREP, set_input('past_block_index_keys', 'F32', z((2, 0, 8))),
       'past_block_index_keys')
reject('prep_dtype_mix', PREP, retype('past_block_index_keys', 'F16'), 'past_block_index_keys')
reject('prep_di_mismatch', PREP, set_input('past_block_index_keys', 'F32', z((2, 1, 6))),
       'past_block_index_keys')
reject('prep_eps_negative', PREP, set_attr('epsilon', '-1'), 'epsilon', -1)
reject('prep_raw_keys_2d', PREP, set_input('raw_index_keys', 'F32', z((2, 8))), 'raw_index_keys')

# ---------------------------------------------------------------- qsa_compress_paged
reject('cp_kc_lt_cl', PAGED, set_input('key_counts', 'I32', [4, 3]), 'key_counts', 4)
reject('cp_kc_over_max_blocks', PAGED, set_input('key_counts', 'I32', [16, 3]), 'key_counts', 16)
reject('cp_page_out_of_range', PAGED, set_input('page_table', 'U32', [[3, 6, 5], [2, 4, 0]]),
       'page_table', 6)
# block 2 starts at position 8: freqs_cis needs row 8
reject('cp_freqs_too_short', PAGED, set_input('freqs_cis', 'F32', z((8, 4))), 'freqs_cis', 8)
# page_stride = 2·packed over 6 packed pages: page 5 lies beyond the pool
reject('cp_pool_too_small_for_stride', PAGED, set_attr('page_stride', J(2 * 2 * 2 * 4 * 8)),
       'page_stride|page_table|kv_blocks')
reject('cp_stride_below_packed', PAGED, set_attr('page_stride', J(8)), 'page_stride', 8)
reject('cp_layer_out_of_range', PAGED, set_attr('layer_idx', '2'), 'layer_idx', 2)
reject('cp_ratio1', PAGED, set_attr('ratio', '1'), 'ratio', 1)
reject('cp_mode_unknown', PAGED, set_attr('mode', J('partial')), 'mode', 'partial')
reject('cp_block_keys_rows', PAGED, set_input('block_keys', 'F32', z((7, 8))), 'block_keys', 7)
reject('cp_block_keys_di', PAGED, set_input('block_keys', 'F32', z((6, 4))), 'block_keys')
reject('cp_kv_heads_2', PAGED, set_input('kv_blocks', 'F32', z((6, 2, 2, 4, 2, 8))), 'kv_blocks')
reject('cp_rotary_odd', PAGED, set_attr('rotary_dim', '3'), 'rotary_dim', 3)
reject('cp_rotary_gt_di', PAGED, both(set_attr('rotary_dim', '10'),
       set_input('freqs_cis', 'F32', z((16, 10)))), 'rotary_dim|freqs_cis', 10)
reject('cp_rotary_vs_freqs_width', PAGED, set_attr('rotary_dim', '2'), 'rotary_dim')
# key_counts 12 with pages of 4 needs 3 page-table columns
reject('cp_page_table_narrow', PAGED, set_input('page_table', 'U32', [[3, 1], [2, 4]]),
       'page_table')
reject('cp_gamma_len', PAGED, set_input('gamma', 'F32', z(5)), 'gamma', 5)
reject('cp_cache_lengths_len', PAGED, set_input('cache_lengths', 'U32', [5]), 'cache_lengths')
reject('cp_key_counts_missing', PAGED, drop('key_counts'), 'key_counts')

# ---------------------------------------------------------------- qsa_prepare_query
reject('pq_two_rope_sources', QUERY_CS, both(set_input('freqs_cis', 'F32', z((10, 4))),
       set_input('positions', 'I32', [0, 1, 2])), 'freqs_cis')
reject('pq_positions_out_of_range', QUERY, set_input('positions', 'I32', [0, 10, 9]), 'positions',
       10)
reject('pq_positions_negative', QUERY, set_input('positions', 'I32', [0, -1, 9]), 'positions', -1)
reject('pq_positions_len', QUERY, set_input('positions', 'I32', [0, 1]), 'positions')
reject('pq_freqs_without_positions', QUERY, drop('positions'), 'positions')
# with T = 0, positions [0] is zero-element, i.e. absent (§0)
reject('pq_T0_freqs_without_positions', QUERY, both(
       set_input('index_query_raw', 'F32', z((0, 2, 8))), set_input('positions', 'I32', z(0))),
       'positions')
reject('pq_norm_len', QUERY, set_input('q_norm_weight', 'F32', z(4)), 'q_norm_weight', 4)
reject('pq_rope_rows', QUERY_CS, both(set_input('rope_cos', 'F32', z((2, 4))),
       set_input('rope_sin', 'F32', z((2, 4)))), 'rope_cos')
reject('pq_rotary_odd', QUERY, both(set_attr('rotary_dim', '3'), set_input('freqs_cis', 'F32',
       z((10, 3)))), 'rotary_dim|freqs_cis', 3)
reject('pq_rope_sin_missing', QUERY_CS, drop('rope_sin'), 'rope_sin')
reject('pq_rope_dr_gt_di', QUERY_CS, both(set_input('rope_cos', 'F32', z((3, 10))),
       set_input('rope_sin', 'F32', z((3, 10)))), 'rope_cos', 10)

# ---------------------------------------------------------------- block_score
reject('bs_ro_first_nonzero', SCORE, set_input('row_offsets', 'U32', [1, 3, 4]), 'row_offsets', 1)
reject('bs_ro_decreasing', SCORE, set_input('row_offsets', 'U32', [0, 3, 2]), 'row_offsets')
reject('bs_ro_decreasing_inside', SCORE, both(set_input('row_offsets', 'U32', [0, 3, 2, 4]),
       set_input('cache_lengths', 'U32', [5, 9, 1]), set_input('key_counts', 'I32', [8, 10, 2]),
       set_input('block_keys', 'F32', z((9, 8)))), 'row_offsets', 2)
reject('bs_ro_last_ne_T', SCORE, set_input('row_offsets', 'U32', [0, 3, 5]), 'row_offsets', 5)
reject('bs_cl_len', SCORE, set_input('cache_lengths', 'U32', [5]), 'cache_lengths')
reject('bs_cl_negative', SCORE, set_input('cache_lengths', 'I32', [-1, 9]), 'cache_lengths', -1)
reject('bs_hs_not_dividing', SCORE, set_attr('num_selection_heads', '3'), 'num_selection_heads', 3)
reject('bs_hs_zero', SCORE, set_attr('num_selection_heads', '0'), 'num_selection_heads', 0)
reject('bs_ratio_zero', SCORE, set_attr('ratio', '0'), 'ratio', 0)
reject('bs_ratio_missing', SCORE, set_attr('ratio', None), 'ratio')
reject('bs_block_keys_rows', SCORE, set_input('block_keys', 'F32', z((7, 8))), 'block_keys', 7)
reject('bs_block_keys_di', SCORE, set_input('block_keys', 'F32', z((6, 4))), 'block_keys')
reject('bs_weights_shape', SCORE, set_input('index_weights', 'F32', z((4, 2))), 'index_weights')
reject('bs_weights_f16', SCORE, retype('index_weights', 'F16'), 'index_weights')
reject('bs_kc_len', SCORE, set_input('key_counts', 'I32', [8]), 'key_counts')
reject('bs_kc_negative', SCORE, set_input('key_counts', 'I32', [-4, 10]), 'key_counts', -4)
reject('bs_dtype_mix', SCORE, retype('block_keys', 'BF16'), 'block_keys')

# ---------------------------------------------------------------- expand_route
reject('er_count_gt_k', ROUTE, set_input('block_count', 'I32', [[4], [1]]), 'block_count', 4)
reject('er_count_negative', ROUTE, set_input('block_count', 'I32', [[-1], [1]]), 'block_count', -1)
reject('er_count_shape', ROUTE, set_input('block_count', 'I32', [2, 1]), 'block_count')
reject('er_positions_len', ROUTE, set_input('positions', 'I32', [9]), 'positions')
reject('er_positions_negative', ROUTE, set_input('positions', 'I32', [9, -3]), 'positions', -3)
reject('er_positions_huge', ROUTE, set_input('positions', 'I32', [9, 2 ** 31 - 1]), 'positions')
reject('er_ratio_zero', ROUTE, set_attr('ratio', '0'), 'ratio', 0)
# p = 9, r = 4: blocks 0 and 1 are complete, block 2 is not
reject('er_block_not_visible', ROUTE,
       set_input('block_indices', 'I32', [[[2, 0, -1]], [[0, -1, -1]]]),
       'block_indices', 2)
reject('er_block_negative', ROUTE,
       set_input('block_indices', 'I32', [[[-1, 0, -1]], [[0, -1, -1]]]),
       'block_indices', -1)

# ---------------------------------------------------------------- sparse_attention
reject('sa_hkv_not_dividing_h', ATTN, set_input('query', 'F32', z((2, 3, 8))), 'query', 3)
reject('sa_hs_not_dividing_h', ATTN, both(set_input('token_indices', 'I32', z((2, 3, 4))),
       set_input('token_count', 'I32', z((2, 3)))), 'token_indices', 3)
reject('sa_count_gt_w', ATTN, set_input('token_count', 'I32', [[5], [4]]), 'token_count', 5)
reject('sa_count_negative', ATTN, set_input('token_count', 'I32', [[-1], [4]]), 'token_count', -1)
# row 0 sits at position 6
reject('sa_index_after_p', ATTN,
       set_input('token_indices', 'I32', [[[0, 3, 7, -1]], [[7, 1, 2, 5]]]),
       'token_indices', 7)
reject('sa_index_negative', ATTN,
       set_input('token_indices', 'I32', [[[0, -1, 6, -1]], [[7, 1, 2, 5]]]), 'token_indices', -1)
reject('sa_page_out_of_range', ATTN, set_input('page_table', 'U32', [[3, 0]]), 'page_table', 3)
reject('sa_page_table_narrow', ATTN, set_input('page_table', 'U32', [[2]]), 'page_table')
reject('sa_cache_length_huge', ATTN, set_input('cache_lengths', 'U32', [2 ** 32 - 1]),
       'cache_lengths')
reject('sa_layer_out_of_range', ATTN, set_attr('layer_idx', '2'), 'layer_idx', 2)
reject('sa_e_mismatch', ATTN, set_input('query', 'F32', z((2, 4, 4))), 'query')
reject('sa_sinks_shape', ATTN, set_input('sinks', 'F32', z(3)), 'sinks', 3)
reject('sa_sinks_f16', ATTN, retype('sinks', 'F16'), 'sinks')
reject('sa_T_mismatch', ATTN, set_input('row_offsets', 'U32', [0, 3]), 'row_offsets', 3)
reject('sa_dtype_mix', ATTN, retype('kv_blocks', 'F16'), 'kv_blocks')
reject('sa_kv_rank5', ATTN, set_input('kv_blocks', 'F32', z((3, 2, 2, 4, 16))), 'kv_blocks')
reject('sa_planes_not_2', ATTN, set_input('kv_blocks', 'F32', z((3, 1, 2, 4, 2, 8))), 'kv_blocks')

# ---------------------------------------------------------------- nsa_compress_attention
# batch 1: c = 5 -> cover 24 -> nsel 2
reject('nca_k_gt_nsel', NSA, set_attr('select_block_count', '3'), 'select_block_count', 3)
reject('nca_qlen_zero', NSA, set_input('actual_q_len', 'I32', [3, 0]), 'actual_q_len', 0)
reject('nca_qlen_17', NSA_BSND, both(set_input('actual_q_len', 'I32', [17, 1]),
       set_input('query', 'F32', z((2, 17, 4, 8)))), 'actual_q_len', 17)
reject('nca_cmp_zero', NSA, set_input('actual_cmp_kv_len', 'I32', [7, 0]), 'actual_cmp_kv_len', 0)
reject('nca_cmp_missing', NSA, drop('actual_cmp_kv_len'), 'actual_cmp_kv_len')
reject('nca_causal_without_sel_len', NSA, drop('actual_sel_kv_len'), 'actual_sel_kv_len')
reject('nca_causal_L_lt_qlen', NSA, set_input('actual_sel_kv_len', 'I32', [1, 30]),
       'actual_sel_kv_len', 1)
reject('nca_d_not_dividing_l', NSA, set_attr('compress_stride', '3'), 'compress_stride', 3)
reject('nca_l_lt_d', NSA,
       both(set_attr('compress_block_size', '4'), set_attr('compress_stride', '8')),
       'compress_block_size')
reject('nca_lp_lt_l', NSA, set_attr('select_block_size', '4'), 'select_block_size', 4)
reject('nca_d_not_dividing_lp', NSA, set_attr('select_block_size', '18'), 'select_block_size', 18)
reject('nca_n2_not_dividing_n1', NSA, set_attr('num_kv_heads', '3'), 'num_kv_heads|key', 3)
reject('nca_n2_not_dividing_n1_widths', NSA, both(set_attr('num_kv_heads', '3'),
       set_input('key', 'F32', z((4, 4, 24))), set_input('value', 'F32', z((4, 4, 12)))),
       'num_kv_heads', 3)
reject('nca_num_heads_vs_query', NSA, set_attr('num_heads', '2'), 'num_heads')
reject('nca_block_table_out_of_range', NSA, set_input('block_table', 'I32', [[0, 4], [2, 3]]),
       'block_table', 4)
reject('nca_block_table_negative', NSA, set_input('block_table', 'I32', [[0, -1], [2, 3]]),
       'block_table', -1)
# c = 7 with P = 4 needs 2 block-table columns
reject('nca_block_table_narrow', NSA, set_input('block_table', 'I32', [[0], [2]]), 'block_table')
reject('nca_tnd_T_mismatch', NSA, set_input('query', 'F32', z((4, 4, 8))), 'query')
reject('nca_bsnd_S_lt_qlen', NSA_BSND, set_input('query', 'F32', z((2, 1, 4, 8))),
       'query|actual_q_len')
reject('nca_layout_unknown', NSA, set_attr('layout', J('NTD')), 'layout', 'NTD')
reject('nca_key_width', NSA, set_input('key', 'F32', z((4, 4, 12))), 'key')
reject('nca_value_width', NSA, set_input('value', 'F32', z((4, 4, 7))), 'value')

# ---------------------------------------------------------------- nsa_compress
reject('nc_T_mismatch', NSA_COMP, set_input('seq_lens', 'I32', [7, 4]), 'seq_lens', 11)
reject('nc_seq_negative', NSA_COMP, set_input('seq_lens', 'I32', [12, -2]), 'seq_lens', -2)
reject('nc_weight_rows', NSA_COMP, set_input('weight', 'F32', z((3, 2))), 'weight')
reject('nc_weight_cols', NSA_COMP, set_input('weight', 'F32', z((4, 3))), 'weight')
reject('nc_l_zero', NSA_COMP, both(set_attr('l', '0'), set_input('weight', 'F32', z((0, 2)))), 'l',
       0)
reject('nc_d_zero', NSA_COMP, set_attr('d', '0'), 'd', 0)
reject('nc_l_missing', NSA_COMP, set_attr('l', None), 'l')
reject('nc_dtype_mix', NSA_COMP, retype('weight', 'BF16'), 'weight')


def check_bases(qsa):
    """Runs every base case as a valid case."""
    for kind in BASES:
        yield check_valid(qsa, 'bad_base_' + kind.replace('/', '_'), *base(kind))


def check_case(qsa, case):
    tensors, meta = base(case.base)
    op = meta['op']
    case.mutate(tensors, meta)
    run = qsa.run(qsa.write('bad_' + case.name, tensors, meta, case.writer))
    return Result(case.name, judge_rejection(run, op if case.op_named else None, case.names,
                                             case.value))
