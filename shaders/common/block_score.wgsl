// The block_score kernels (see block_score.wgsl), whatever holds the block keys.

//#include common/dtype.wgsl
//#include common/word16.wgsl
//#include common/flags.wgsl

// 1: every row starts on a 16-byte word; 0: element loads.
override VEC: u32 = 1u;

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
// Bindings 1 and 2, the queries [T, Hi, Di] T and the block keys [N·max_blocks, Di] T, are
// declared by the including file with query_word(i) and key_word(i), their i-th 16-byte words.
@group(0) @binding(3) var<storage, read> row_offsets: array<u32>; // [N+1] u32
@group(0) @binding(4) var<storage, read> lens: array<u32>;        // [2, N]: cache_lengths, key_counts
@group(0) @binding(5) var<storage, read> weights: array<f32>;     // [T, Hi] f32
@group(0) @binding(6) var<storage, read_write> scores: array<f32>; // [rows, Hs, W] f32
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

const TR: u32 = 24u;         // row_tiles: rows per workgroup (and per invocation)
const BI: u32 = 16u;         // blocks per invocation
const TB: u32 = 1024u;       // blocks per workgroup: 64 invocations · BI

// A chunk is one 16-byte word of a row (common/word16.wgsl): queries and keys split alike, so
// the dot product of two chunks is lo·lo + hi·hi.

// Chunks per row.
fn chunks_per_row() -> u32 {
    return (P.di + chunk_len() - 1u) / chunk_len();
}

// Word i of the queries (keys = false) or of the block keys (keys = true). Every call passes
// a constant, so compilers keep one side.
fn word(i: u32, keys: bool) -> vec4<u32> {
    if (keys) {
        return key_word(i);
    }
    return query_word(i);
}

// One element of a query or key row: channel ch of the row starting at element off (0 past
// Di).
fn elem(off: u32, ch: u32, keys: bool) -> f32 {
    let i = off + min(ch, P.di - 1u);
    let w = t_word(i);
    return select(0.0, t_load(word(w >> 2u, keys)[w & 3u], i), ch < P.di);
}

// Chunk c of the query or key row starting at element off. VEC = 0 gathers the chunk's
// channels one by one, in the same split.
fn row_chunk(off: u32, c: u32, keys: bool) -> Chunk {
    if (VEC == 0u) {
        let ch = c * chunk_len();
        if (T_KIND == 0u) {
            return Chunk(vec4<f32>(elem(off, ch, keys), elem(off, ch + 1u, keys),
                                   elem(off, ch + 2u, keys), elem(off, ch + 3u, keys)),
                         vec4<f32>(0.0));
        }
        return Chunk(
            vec4<f32>(elem(off, ch, keys), elem(off, ch + 2u, keys), elem(off, ch + 4u, keys),
                      elem(off, ch + 6u, keys)),
            vec4<f32>(elem(off, ch + 1u, keys), elem(off, ch + 3u, keys),
                      elem(off, ch + 5u, keys), elem(off, ch + 7u, keys)),
        );
    }
    return word_chunk(word(off / chunk_len() + c, keys));
}

// Chunk c of the query row or the key row at element off.
fn q_chunk(off: u32, c: u32) -> Chunk {
    return row_chunk(off, c, false);
}

fn k_chunk(off: u32, c: u32) -> Chunk {
    return row_chunk(off, c, true);
}

// Four query rows' chunks as matrices whose product with a key chunk gives the four partial
// dot products.
struct Quad {
    lo: mat4x4<f32>,
    hi: mat4x4<f32>,
}

fn quad(o: vec4<u32>, c: u32) -> Quad {
    return quad_of(q_chunk(o.x, c), q_chunk(o.y, c), q_chunk(o.z, c), q_chunk(o.w, c));
}

fn quad_of(a: Chunk, b: Chunk, d: Chunk, e: Chunk) -> Quad {
    return Quad(transpose(mat4x4<f32>(a.lo, b.lo, d.lo, e.lo)),
                transpose(mat4x4<f32>(a.hi, b.hi, d.hi, e.hi)));
}

// The one multiply-accumulate of the operator, acc + the 4 dots of q with k: both tilings
// go through it.
fn mac(acc: vec4<f32>, q: Quad, k: Chunk) -> vec4<f32> {
    if (T_KIND == 0u) {
        return acc + q.lo * k.lo;
    }
    return (acc + q.lo * k.lo) + q.hi * k.hi;
}

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

// (sequence, visible blocks) of row t; a row outside its sequence sees nothing and is flagged.
fn locate(t: u32) -> vec2<u32> {
    let n = seq_of(t);
    let start = row_offsets[n];
    let end = row_offsets[n + 1u];
    if (t < start || t >= end) {
        atomicOr(&flags, FLAG_LENGTHS);
        return vec2<u32>(n, 0u);
    }
    let p = lens[n] + (t - start);
    var kc = lens[n] + (end - start);
    if (P.has_counts != 0u) {
        kc = lens[P.n + n];
    }
    return vec2<u32>(n, min(min((p + 1u) / P.r, kc / P.r), P.max_blocks));
}

// −inf from bits held in a variable: a constant expression must not evaluate to an infinity
// (browsers reject it at shader creation; naga allows it).
fn neg_inf() -> f32 {
    var b = 0xff800000u;
    return bitcast<f32>(b);
}

fn weight(t: u32, h: u32) -> f32 {
    if (P.has_weights != 0u) {
        return weights[t * P.hi + h];
    }
    return 1.0;
}

// First block of invocation `lane` in block tile `bt`; its others follow every 8.
fn first_block(bt: u32, lane: u32) -> u32 {
    return bt * TB + (lane / 8u) * (8u * BI) + lane % 8u;
}

// Element offsets of the key rows of 4 of an invocation's blocks (b, b+8, b+16, b+24) in
// sequence n, clamped into the sequence's rows.
fn key_rows(n: u32, b: u32) -> vec4<u32> {
    let w = P.max_blocks;
    return (n * w + min(vec4<u32>(b) + vec4<u32>(0u, 8u, 16u, 24u), vec4<u32>(w - 1u))) * P.di;
}

// Chunks of an invocation's 16 blocks (key rows from key_rows at b, b+32, b+64, b+96).
fn keys16(k0: vec4<u32>, k1: vec4<u32>, k2: vec4<u32>, k3: vec4<u32>, c: u32) -> array<Chunk, 16> {
    return array<Chunk, 16>(
        k_chunk(k0.x, c), k_chunk(k0.y, c), k_chunk(k0.z, c), k_chunk(k0.w, c),
        k_chunk(k1.x, c), k_chunk(k1.y, c), k_chunk(k1.z, c), k_chunk(k1.w, c),
        k_chunk(k2.x, c), k_chunk(k2.y, c), k_chunk(k2.z, c), k_chunk(k2.w, c),
        k_chunk(k3.x, c), k_chunk(k3.y, c), k_chunk(k3.z, c), k_chunk(k3.w, c),
    );
}

// ---- row_tiles: 24 rows × 16 blocks per invocation ----------------------------------------
// Private arrays are only ever indexed by constants (after inlining), so that compilers keep
// them in registers; per-row values travel as vec4s of 4 rows.

// acc[16m + j] holds, for block j, the dots of rows 4m … 4m+3.
fn mac_rows(acc: ptr<function, array<vec4<f32>, 96>>, m: u32, q: Quad, k: array<Chunk, 16>) {
    let s = m * BI;
    (*acc)[s] = mac((*acc)[s], q, k[0]);
    (*acc)[s + 1u] = mac((*acc)[s + 1u], q, k[1]);
    (*acc)[s + 2u] = mac((*acc)[s + 2u], q, k[2]);
    (*acc)[s + 3u] = mac((*acc)[s + 3u], q, k[3]);
    (*acc)[s + 4u] = mac((*acc)[s + 4u], q, k[4]);
    (*acc)[s + 5u] = mac((*acc)[s + 5u], q, k[5]);
    (*acc)[s + 6u] = mac((*acc)[s + 6u], q, k[6]);
    (*acc)[s + 7u] = mac((*acc)[s + 7u], q, k[7]);
    (*acc)[s + 8u] = mac((*acc)[s + 8u], q, k[8]);
    (*acc)[s + 9u] = mac((*acc)[s + 9u], q, k[9]);
    (*acc)[s + 10u] = mac((*acc)[s + 10u], q, k[10]);
    (*acc)[s + 11u] = mac((*acc)[s + 11u], q, k[11]);
    (*acc)[s + 12u] = mac((*acc)[s + 12u], q, k[12]);
    (*acc)[s + 13u] = mac((*acc)[s + 13u], q, k[13]);
    (*acc)[s + 14u] = mac((*acc)[s + 14u], q, k[14]);
    (*acc)[s + 15u] = mac((*acc)[s + 15u], q, k[15]);
}

// sum += w · max(acc, 0) for the 16 blocks of rows 4m … 4m+3 (w per row).
fn relu_rows(sum: ptr<function, array<vec4<f32>, 96>>, acc: ptr<function, array<vec4<f32>, 96>>,
             m: u32, w: vec4<f32>) {
    let s = m * BI;
    let z = vec4<f32>(0.0);
    (*sum)[s] += w * max((*acc)[s], z);
    (*sum)[s + 1u] += w * max((*acc)[s + 1u], z);
    (*sum)[s + 2u] += w * max((*acc)[s + 2u], z);
    (*sum)[s + 3u] += w * max((*acc)[s + 3u], z);
    (*sum)[s + 4u] += w * max((*acc)[s + 4u], z);
    (*sum)[s + 5u] += w * max((*acc)[s + 5u], z);
    (*sum)[s + 6u] += w * max((*acc)[s + 6u], z);
    (*sum)[s + 7u] += w * max((*acc)[s + 7u], z);
    (*sum)[s + 8u] += w * max((*acc)[s + 8u], z);
    (*sum)[s + 9u] += w * max((*acc)[s + 9u], z);
    (*sum)[s + 10u] += w * max((*acc)[s + 10u], z);
    (*sum)[s + 11u] += w * max((*acc)[s + 11u], z);
    (*sum)[s + 12u] += w * max((*acc)[s + 12u], z);
    (*sum)[s + 13u] += w * max((*acc)[s + 13u], z);
    (*sum)[s + 14u] += w * max((*acc)[s + 14u], z);
    (*sum)[s + 15u] += w * max((*acc)[s + 15u], z);
}

fn weights4(t: vec4<u32>, h: u32) -> vec4<f32> {
    return vec4<f32>(weight(t.x, h), weight(t.y, h), weight(t.z, h), weight(t.w, h));
}

// Four rows of the tile: their global rows (clamped into the chunk, so loads stay in bounds),
// sequences (P.n for rows past the chunk, which no pass takes) and visible blocks.
struct Rows4 {
    t: vec4<u32>,
    seq: vec4<u32>,
    vis: vec4<u32>,
}

fn row_info(lr: u32) -> vec3<u32> {
    let t = P.row_base + min(lr, P.rows - 1u);
    if (lr >= P.rows) {
        return vec3<u32>(t, P.n, 0u);
    }
    let sv = locate(t);
    return vec3<u32>(t, sv.x, sv.y);
}

fn rows4(lr: u32) -> Rows4 {
    let a = row_info(lr);
    let b = row_info(lr + 1u);
    let c = row_info(lr + 2u);
    let d = row_info(lr + 3u);
    return Rows4(vec4<u32>(a.x, b.x, c.x, d.x), vec4<u32>(a.y, b.y, c.y, d.y),
                 vec4<u32>(a.z, b.z, c.z, d.z));
}

// (largest visible count among the rows of sequence n, whether there is one).
fn top4(x: Rows4, n: u32) -> vec2<u32> {
    let mine = x.seq == vec4<u32>(n);
    let v = select(vec4<u32>(0u), x.vis, mine);
    return vec2<u32>(max(max(v.x, v.y), max(v.z, v.w)), u32(any(mine)));
}

// Stores block b of 4 rows from chunk row lr on (those of sequence n).
fn store_rows(lr: u32, g: u32, b: u32, v: vec4<f32>, x: Rows4, n: u32) {
    let w = P.max_blocks;
    if (b >= w) {
        return;
    }
    let s = select(vec4<f32>(neg_inf()), P.scale * v, vec4<u32>(b) < x.vis);
    if (x.seq.x == n) { scores[(lr * P.hs + g) * w + b] = s.x; }
    if (x.seq.y == n) { scores[((lr + 1u) * P.hs + g) * w + b] = s.y; }
    if (x.seq.z == n) { scores[((lr + 2u) * P.hs + g) * w + b] = s.z; }
    if (x.seq.w == n) { scores[((lr + 3u) * P.hs + g) * w + b] = s.w; }
}

fn store_quad(sum: ptr<function, array<vec4<f32>, 96>>, m: u32, lr: u32, g: u32, b: u32,
              x: Rows4, n: u32) {
    let s = m * BI;
    store_rows(lr, g, b, (*sum)[s], x, n);
    store_rows(lr, g, b + 8u, (*sum)[s + 1u], x, n);
    store_rows(lr, g, b + 16u, (*sum)[s + 2u], x, n);
    store_rows(lr, g, b + 24u, (*sum)[s + 3u], x, n);
    store_rows(lr, g, b + 32u, (*sum)[s + 4u], x, n);
    store_rows(lr, g, b + 40u, (*sum)[s + 5u], x, n);
    store_rows(lr, g, b + 48u, (*sum)[s + 6u], x, n);
    store_rows(lr, g, b + 56u, (*sum)[s + 7u], x, n);
    store_rows(lr, g, b + 64u, (*sum)[s + 8u], x, n);
    store_rows(lr, g, b + 72u, (*sum)[s + 9u], x, n);
    store_rows(lr, g, b + 80u, (*sum)[s + 10u], x, n);
    store_rows(lr, g, b + 88u, (*sum)[s + 11u], x, n);
    store_rows(lr, g, b + 96u, (*sum)[s + 12u], x, n);
    store_rows(lr, g, b + 104u, (*sum)[s + 13u], x, n);
    store_rows(lr, g, b + 112u, (*sum)[s + 14u], x, n);
    store_rows(lr, g, b + 120u, (*sum)[s + 15u], x, n);
}

// The body of entry point row_tiles, which the including file declares (with the subgroup
// lane sl where it has subgroups, else 0) along with the query hooks `query_rows`,
// `query_fetch` and `query_quad` (common/block_score_queries.wgsl, or the subgroup variant's own).
fn row_tiles_body(wg: vec3<u32>, nwg: vec3<u32>, lane: u32, sl: u32) {
    let id = wg.y * nwg.x + wg.x;
    let btiles = (P.max_blocks + TB - 1u) / TB;
    if (id >= ((P.rows + TR - 1u) / TR) * btiles) {
        return;
    }
    let r0 = (id / btiles) * TR;                      // first chunk row of the tile
    let b0 = first_block(id % btiles, lane);
    let x0 = rows4(r0);
    let x1 = rows4(r0 + 4u);
    let x2 = rows4(r0 + 8u);
    let x3 = rows4(r0 + 12u);
    let x4 = rows4(r0 + 16u);
    let x5 = rows4(r0 + 20u);
    // Rows of different sequences read different block keys: one pass per sequence present
    // (rows past the chunk, whose sequence reads P.n, take none).
    let lo = min(min(min(x0.seq, x1.seq), min(x2.seq, x3.seq)), min(x4.seq, x5.seq));
    let hi = max(max(max(x0.seq, x1.seq), max(x2.seq, x3.seq)), max(x4.seq, x5.seq));
    let n_lo = min(min(lo.x, lo.y), min(lo.z, lo.w));
    let n_hi = min(max(max(hi.x, hi.y), max(hi.z, hi.w)), P.n - 1u);
    let gsize = P.hi / P.hs;
    for (var n = n_lo; n <= n_hi; n++) {
        let p0 = top4(x0, n);
        let p1 = top4(x1, n);
        let p2 = top4(x2, n);
        let p3 = top4(x3, n);
        let p4 = top4(x4, n);
        let p5 = top4(x5, n);
        if (p0.y + p1.y + p2.y + p3.y + p4.y + p5.y == 0u) {
            continue;
        }
        let top = max(max(max(p0.x, p1.x), max(p2.x, p3.x)), max(p4.x, p5.x));
        let k0 = key_rows(n, b0);
        let k1 = key_rows(n, b0 + 32u);
        let k2 = key_rows(n, b0 + 64u);
        let k3 = key_rows(n, b0 + 96u);
        let chunks = select(0u, chunks_per_row(), tile_runs(b0 < top));
        for (var g = 0u; g < P.hs; g++) {
            // Explicit zero initialisers: these are declared inside loops and must start from
            // zero on every iteration (a browser compiler was seen to keep the last values).
            var sum = array<vec4<f32>, 96>();
            for (var h = g * gsize; h < (g + 1u) * gsize; h++) {
                var acc = array<vec4<f32>, 96>();
                let o0 = (x0.t * P.hi + h) * P.di;
                let o1 = (x1.t * P.hi + h) * P.di;
                let o2 = (x2.t * P.hi + h) * P.di;
                let o3 = (x3.t * P.hi + h) * P.di;
                let o4 = (x4.t * P.hi + h) * P.di;
                let o5 = (x5.t * P.hi + h) * P.di;
                let mine = query_rows(o0, o1, o2, o3, o4, o5, sl);
                for (var c = 0u; c < chunks; c++) {
                    let k = keys16(k0, k1, k2, k3, c);
                    let f = query_fetch(mine, c);
                    mac_rows(&acc, 0u, query_quad(o0, 0u, f, c), k);
                    mac_rows(&acc, 1u, query_quad(o1, 1u, f, c), k);
                    mac_rows(&acc, 2u, query_quad(o2, 2u, f, c), k);
                    mac_rows(&acc, 3u, query_quad(o3, 3u, f, c), k);
                    mac_rows(&acc, 4u, query_quad(o4, 4u, f, c), k);
                    mac_rows(&acc, 5u, query_quad(o5, 5u, f, c), k);
                }
                relu_rows(&sum, &acc, 0u, weights4(x0.t, h));
                relu_rows(&sum, &acc, 1u, weights4(x1.t, h));
                relu_rows(&sum, &acc, 2u, weights4(x2.t, h));
                relu_rows(&sum, &acc, 3u, weights4(x3.t, h));
                relu_rows(&sum, &acc, 4u, weights4(x4.t, h));
                relu_rows(&sum, &acc, 5u, weights4(x5.t, h));
            }
            store_quad(&sum, 0u, r0, g, b0, x0, n);
            store_quad(&sum, 1u, r0 + 4u, g, b0, x1, n);
            store_quad(&sum, 2u, r0 + 8u, g, b0, x2, n);
            store_quad(&sum, 3u, r0 + 12u, g, b0, x3, n);
            store_quad(&sum, 4u, r0 + 16u, g, b0, x4, n);
            store_quad(&sum, 5u, r0 + 20u, g, b0, x5, n);
        }
    }
}

// ---- one_row: 16 blocks × 4 heads of one row per invocation -------------------------------

// sum (4 blocks) + w_x · max(acc_x, 0) for the valid heads x in order, as row_tiles adds them;
// a0 … a3 hold the 4 blocks' dots (a vec4 of 4 heads each).
fn relu_heads(sum: vec4<f32>, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
              w: vec4<f32>, valid: vec4<bool>) -> vec4<f32> {
    let z = vec4<f32>(0.0);
    let by_head = transpose(mat4x4<f32>(a0, a1, a2, a3));
    var s = sum;
    s = select(s, s + w.x * max(by_head[0], z), valid.x);
    s = select(s, s + w.y * max(by_head[1], z), valid.y);
    s = select(s, s + w.z * max(by_head[2], z), valid.z);
    s = select(s, s + w.w * max(by_head[3], z), valid.w);
    return s;
}

// Stores blocks b, b+8, b+16, b+24 of chunk row r.
fn store_blocks(r: u32, g: u32, b: u32, v: vec4<f32>, vis: u32) {
    let w = P.max_blocks;
    let row = (r * P.hs + g) * w;
    let bs = vec4<u32>(b) + vec4<u32>(0u, 8u, 16u, 24u);
    let s = select(vec4<f32>(neg_inf()), P.scale * v, bs < vec4<u32>(vis));
    if (bs.x < w) { scores[row + bs.x] = s.x; }
    if (bs.y < w) { scores[row + bs.y] = s.y; }
    if (bs.z < w) { scores[row + bs.z] = s.z; }
    if (bs.w < w) { scores[row + bs.w] = s.w; }
}

// The body of entry point one_row, declared by the including file like row_tiles.
fn one_row_body(wg: vec3<u32>, nwg: vec3<u32>, lane: u32, sl: u32) {
    let id = wg.y * nwg.x + wg.x;
    let btiles = (P.max_blocks + TB - 1u) / TB;
    if (id >= P.rows * btiles) {
        return;
    }
    let r = id / btiles;                              // chunk row
    let t = P.row_base + r;
    let b0 = first_block(id % btiles, lane);
    let sv = locate(t);
    let n = sv.x;
    let vis = sv.y;
    let k0 = key_rows(n, b0);
    let k1 = key_rows(n, b0 + 32u);
    let k2 = key_rows(n, b0 + 64u);
    let k3 = key_rows(n, b0 + 96u);
    let chunks = select(0u, chunks_per_row(), tile_runs(b0 < vis));
    let gsize = P.hi / P.hs;
    for (var g = 0u; g < P.hs; g++) {
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        var s2 = vec4<f32>(0.0);
        var s3 = vec4<f32>(0.0);
        let h_end = (g + 1u) * gsize;
        // Heads in fours; a short last four repeats its last head, whose copies are dropped.
        for (var h0 = g * gsize; h0 < h_end; h0 += 4u) {
            let hx = vec4<u32>(h0) + vec4<u32>(0u, 1u, 2u, 3u);
            let hc = min(hx, vec4<u32>(h_end - 1u));
            let o = (t * P.hi + hc) * P.di;
            // One variable per block (not an array): compilers keep these in registers.
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            var a4 = vec4<f32>(0.0);
            var a5 = vec4<f32>(0.0);
            var a6 = vec4<f32>(0.0);
            var a7 = vec4<f32>(0.0);
            var a8 = vec4<f32>(0.0);
            var a9 = vec4<f32>(0.0);
            var a10 = vec4<f32>(0.0);
            var a11 = vec4<f32>(0.0);
            var a12 = vec4<f32>(0.0);
            var a13 = vec4<f32>(0.0);
            var a14 = vec4<f32>(0.0);
            var a15 = vec4<f32>(0.0);
            for (var c = 0u; c < chunks; c++) {
                let q = head_quad(o, c, sl);
                let k = keys16(k0, k1, k2, k3, c);
                a0 = mac(a0, q, k[0]);
                a1 = mac(a1, q, k[1]);
                a2 = mac(a2, q, k[2]);
                a3 = mac(a3, q, k[3]);
                a4 = mac(a4, q, k[4]);
                a5 = mac(a5, q, k[5]);
                a6 = mac(a6, q, k[6]);
                a7 = mac(a7, q, k[7]);
                a8 = mac(a8, q, k[8]);
                a9 = mac(a9, q, k[9]);
                a10 = mac(a10, q, k[10]);
                a11 = mac(a11, q, k[11]);
                a12 = mac(a12, q, k[12]);
                a13 = mac(a13, q, k[13]);
                a14 = mac(a14, q, k[14]);
                a15 = mac(a15, q, k[15]);
            }
            let valid = hx < vec4<u32>(h_end);
            let wt = vec4<f32>(weight(t, hc.x), weight(t, hc.y), weight(t, hc.z), weight(t, hc.w));
            s0 = relu_heads(s0, a0, a1, a2, a3, wt, valid);
            s1 = relu_heads(s1, a4, a5, a6, a7, wt, valid);
            s2 = relu_heads(s2, a8, a9, a10, a11, wt, valid);
            s3 = relu_heads(s3, a12, a13, a14, a15, wt, valid);
        }
        store_blocks(r, g, b0, s0, vis);
        store_blocks(r, g, b0 + 32u, s1, vis);
        store_blocks(r, g, b0 + 64u, s2, vis);
        store_blocks(r, g, b0 + 96u, s3, vis);
    }
}
