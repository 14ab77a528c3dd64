// block_score (SPEC §4): scores of the visible blocks of each query row.
// One invocation per (row t, block b): for every selection group g,
//   scores[t, g, b] = scale · Σ_{h ∈ g} w[t, h] · max(0, q[t, h] · k[n·max_blocks + b])
// for b < vis = min((p + 1) / r, key_count / r, max_blocks), and −inf beyond.
// The row's sequence n is found by binary search in row_offsets; lengths are device data,
// so anything inconsistent is clamped and flagged.

//#include common/dtype.wgsl
//#include common/flags.wgsl

struct BlockScoreParams {
    t_total: u32,     // rows of index_query
    row_base: u32,    // first row of this chunk
    rows: u32,        // rows in this chunk (scores holds only these)
    n: u32,           // sequences
    hi: u32,          // index heads
    hs: u32,          // selection groups
    di: u32,          // channels
    r: u32,           // ratio
    max_blocks: u32,  // block rows per sequence = W
    has_counts: u32,  // key_counts given
    has_weights: u32, // index_weights given
    scale: f32,
}

@group(0) @binding(0) var<uniform> P: BlockScoreParams;
@group(0) @binding(1) var<storage, read> query: array<u32>;       // [T, Hi, Di] T
@group(0) @binding(2) var<storage, read> keys: array<u32>;        // [N·max_blocks, Di] T
@group(0) @binding(3) var<storage, read> row_offsets: array<u32>; // [N+1] u32
@group(0) @binding(4) var<storage, read> lens: array<u32>;        // [2, N]: cache_lengths, key_counts
@group(0) @binding(5) var<storage, read> weights: array<f32>;     // [T, Hi] f32
@group(0) @binding(6) var<storage, read_write> scores: array<f32>; // [rows, Hs, W] f32
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

fn ld_q(i: u32) -> f32 { return t_load(query[t_word(i)], i); }
fn ld_k(i: u32) -> f32 { return t_load(keys[t_word(i)], i); }

// Sequence of row t: the last n with row_offsets[n] <= t.
fn seq_of(t: u32) -> u32 {
    var lo = 0u;
    var hi = P.n;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (row_offsets[mid] <= t) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tiles = (P.max_blocks + 63u) / 64u;
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows * tiles) {
        return;
    }
    let local_row = id / tiles;
    let b = (id % tiles) * 64u + lid;
    if (b >= P.max_blocks) {
        return;
    }
    let t = P.row_base + local_row;
    let n = seq_of(t);
    let start = row_offsets[n];
    let end = row_offsets[n + 1u];
    var vis = 0u;
    if (t < start || t >= end) {
        if (b == 0u) { atomicOr(&flags, FLAG_LENGTHS); }
    } else {
        let p = lens[n] + (t - start);
        var kc = lens[n] + (end - start);
        if (P.has_counts != 0u) {
            kc = lens[P.n + n];
        }
        vis = min(min((p + 1u) / P.r, kc / P.r), P.max_blocks);
    }
    let gsize = P.hi / P.hs;
    let krow = (n * P.max_blocks + b) * P.di;
    // −inf, from bits held in a variable: a constant expression must not evaluate to an
    // infinity (browsers reject `bitcast<f32>(0xff800000u)` at shader creation; naga allows it).
    var ninf_bits = 0xff800000u;
    for (var g = 0u; g < P.hs; g++) {
        var s = bitcast<f32>(ninf_bits);
        if (b < vis) {
            var acc = 0.0;
            for (var h = g * gsize; h < (g + 1u) * gsize; h++) {
                let qrow = (t * P.hi + h) * P.di;
                var dot = 0.0;
                for (var c = 0u; c < P.di; c++) {
                    dot += ld_q(qrow + c) * ld_k(krow + c);
                }
                var w = 1.0;
                if (P.has_weights != 0u) {
                    w = weights[t * P.hi + h];
                }
                acc += w * max(0.0, dot);
            }
            s = P.scale * acc;
        }
        scores[(local_row * P.hs + g) * P.max_blocks + b] = s;
    }
}
