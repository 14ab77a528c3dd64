// The bindings and loads shared by the two partial passes of sparse_attention (the tiled
// sparse_attention.wgsl and its subgroup variant sparse_attention_sg.wgsl), which read the
// same buffers and write the same records (layouts in common/attention.wgsl).

// 1 when every query row starts on an even element, so a 16-bit channel quad is two whole
// words.
override ALIGN2: u32 = 0u;
// 1 when every K and V row starts on a whole vec4 of the pool (Dp and the pool offsets are
// multiples of 4 elements for f32, 8 for f16/bf16): channel quads are then read as (parts of)
// whole vec4s. 0: element by element.
override VEC: u32 = 0u;

@group(0) @binding(0) var<uniform> P: SparseAttentionParams;
@group(0) @binding(1) var<storage, read> query: array<u32>;           // [T, H, E] T
@group(0) @binding(2) var<storage, read> pool: array<vec4<u32>>;      // one shard: [shard_pages, 2, layers, page_size, Hkv, Dp] T, pages page_stride apart
@group(0) @binding(3) var<storage, read> routes: array<u32>;          // [rows, Hs, shards + 1 + W] u32 (stage 1)
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>; // [rows, H, splits, phases, Ev4 + cblocks] partial results

// Element j of the pool.
fn ld_el(j: u32) -> f32 {
    let w = t_word(j);
    return t_load(pool[w >> 2u][w & 3u], j);
}

// Channels c … c + 3 of the query row starting at element i; channels >= e read as 0 (and a
// quad wholly past e reads channel 0 instead, never beyond the row).
fn ld_q(i: u32, c: u32, e: u32) -> vec4<f32> {
    let j = i + select(0u, c, c < e);
    var v = vec4<f32>();
    if (T_KIND != 0u && ALIGN2 != 0u) {
        let w0 = query[j >> 1u];
        let w1 = query[(j >> 1u) + 1u];
        v = vec4<f32>(t_load(w0, 0u), t_load(w0, 1u), t_load(w1, 0u), t_load(w1, 1u));
    } else {
        v = vec4<f32>(t_load(query[t_word(j)], j), t_load(query[t_word(j + 1u)], j + 1u),
                      t_load(query[t_word(j + 2u)], j + 2u), t_load(query[t_word(j + 3u)], j + 3u));
    }
    return select(vec4<f32>(0.0), v, vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(e));
}

// First vec4 of the partial record of head j of the workgroup's heads (heads past hc repeat
// the last one); `base` is the record of head 0, `step` the records between two heads.
fn rec(base: u32, step: u32, j: u32, hc: u32, rs: u32) -> u32 {
    return (base + min(j, hc - 1u) * step) * rs;
}

// Quad c of the records of heads 4q … 4q + 3 as the columns of a matrix (heads past hc
// repeat the last one).
fn get_acc(base: u32, step: u32, q: u32, hc: u32, rs: u32, c: u32) -> mat4x4<f32> {
    return mat4x4<f32>(part[rec(base, step, 4u * q, hc, rs) + c],
                       part[rec(base, step, 4u * q + 1u, hc, rs) + c],
                       part[rec(base, step, 4u * q + 2u, hc, rs) + c],
                       part[rec(base, step, 4u * q + 3u, hc, rs) + c]);
}
// Stores quad c of the records of heads 4q … 4q + 3 (those below hc) from the columns of a.
fn put_acc(base: u32, step: u32, q: u32, hc: u32, rs: u32, c: u32, a: mat4x4<f32>) {
    let j = 4u * q;
    if (j < hc) { part[rec(base, step, j, hc, rs) + c] = a[0]; }
    if (j + 1u < hc) { part[rec(base, step, j + 1u, hc, rs) + c] = a[1]; }
    if (j + 2u < hc) { part[rec(base, step, j + 2u, hc, rs) + c] = a[2]; }
    if (j + 3u < hc) { part[rec(base, step, j + 3u, hc, rs) + c] = a[3]; }
}
// The (m, l) entries of four heads as record quads (columns), and back.
fn ml_rec(m: vec4<f32>, l: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(vec4<f32>(m.x, l.x, 0.0, 0.0), vec4<f32>(m.y, l.y, 0.0, 0.0),
                       vec4<f32>(m.z, l.z, 0.0, 0.0), vec4<f32>(m.w, l.w, 0.0, 0.0));
}
fn ml_m(r: mat4x4<f32>) -> vec4<f32> {
    return vec4<f32>(r[0].x, r[1].x, r[2].x, r[3].x);
}
fn ml_l(r: mat4x4<f32>) -> vec4<f32> {
    return vec4<f32>(r[0].y, r[1].y, r[2].y, r[3].y);
}

// The entries of split `split` in shard k's part of row list `list` (stage 1 checked every
// entry): (index of the first in `routes`, how many).
fn split_range_of(list: u32, split: u32, k: u32) -> vec2<u32> {
    let lo = routes[list + k];
    let count = routes[list + k + 1u] - lo;
    let a = min(split * P.split_len, count);
    return vec2<u32>(list + P.shards + 1u + lo + a, min(count - a, P.split_len));
}
// split_range_of the dispatch's shard P.shard.
fn split_range(list: u32, split: u32) -> vec2<u32> {
    return split_range_of(list, split, P.shard);
}

// Four heads' accumulators (columns) rescaled per head.
fn rescale(a: mat4x4<f32>, s: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(a[0] * s.x, a[1] * s.y, a[2] * s.z, a[3] * s.w);
}

// Four heads' accumulators plus the V quad v weighted per head.
fn axpy(a: mat4x4<f32>, w: vec4<f32>, v: vec4<f32>) -> mat4x4<f32> {
    return a + mat4x4<f32>(v * w.x, v * w.y, v * w.z, v * w.w);
}
