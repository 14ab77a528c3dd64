// block_score (SPEC §4): scores of the visible blocks of each query row. For every selection
// group g of row t (sequence n):
//   scores[t, g, b] = scale · Σ_{h ∈ g} w[t, h] · max(0, q[t, h] · k[n·max_blocks + b])
// for b < vis = min((p + 1) / r, key_count / r, max_blocks), and −inf beyond.
//
// Per head this is a small matrix product, so each invocation keeps a tile of dot products
// in registers and reuses every value it loads many times: four dots at once are the product
// of a 4×4 matrix (a chunk of 4 query rows, or of 4 heads of one row) with a chunk of one
// block key, where a chunk is one 16-byte word of the row (4 f32 or 8 f16/bf16 channels).
// Loads, not arithmetic, bound the speed (on a CPU device each lane's load is a scalar one),
// hence large tiles. A workgroup covers 1024 blocks; invocation i takes the 16 blocks
// 128·(i / 8) + i % 8 + 8j, j < 16, so 8 neighbouring invocations read 8 neighbouring keys.
// Two entry points tile the rows differently but run the same operations in the same order
// for every score, so the choice never changes a result:
//   row_tiles (prefill): a workgroup takes 24 rows; each invocation 24 rows × 16 blocks, head
//     by head. Rows of one tile may belong to several sequences (whose block keys differ): the
//     tile makes one pass per sequence present.
//   one_row (decode, a few rows per sequence): a workgroup takes one row; each invocation 16
//     blocks × 4 heads of it.
// An invocation whose blocks are all past what its rows see skips the products and writes
// −inf, so about half of a causal prefill costs nothing.
// VEC = 0 (rows that do not start on a word: Di not a multiple of 4 for f32, of 8 for
// f16/bf16) gathers each chunk element by element instead; the host then uses one_row only.
// The row's sequence comes from a binary search in row_offsets; lengths are device data, so
// anything inconsistent is clamped and flagged.
//
// This file reads the queries and block keys from storage buffers; block_score_tex.wgsl is
// the same operator reading them from textures (what the indexer binds, see docs/perf.md).

//#include common/block_score.wgsl
//#include common/block_score_queries.wgsl

@group(0) @binding(1) var<storage, read> query: array<vec4<u32>>; // [T, Hi, Di] T, in 16-byte words
@group(0) @binding(2) var<storage, read> keys: array<vec4<u32>>;  // [N·max_blocks, Di] T, in 16-byte words

fn query_word(i: u32) -> vec4<u32> {
    return query[i];
}

fn key_word(i: u32) -> vec4<u32> {
    return keys[i];
}
