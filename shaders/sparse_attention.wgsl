// sparse_attention (SPEC §7): GQA attention of each query head over the tokens its selection
// group gathered, read from the main paged KV pool, with an optional per-head sink. Queries and
// keys have E channels, values and the output Ev (E = Ev unless the pool holds an NSA / MLA
// style cache with Dqk != Dv); a pool row has Dp = max(E, Ev) channels per head, K in the first
// E of plane K and V in the first Ev of plane V.
//
// One workgroup per (row t, KV head kh, part): part j is the j-th selection group that meets
// KV head kh's query heads, so the workgroup's heads h0 … h1 − 1 share one KV head *and* one
// token list (with Hs > 1 the heads of one KV group may belong to different selection groups).
// The heads are taken HC at a time, one pass each (HC = 12 at E = 256: one pass covers a
// Qwen3.8-Flash-Next group). A pass walks the token list in tiles of TK = 64 tokens with an
// online softmax in f32:
//   1. invocation j resolves token j of the tile through the page table — every step checked;
//      a bad value is flagged and the token skipped, never read — and, loading each quad of
//      its K row once, accumulates z[h, j] = scale · q_h · K_j for the pass's heads four at a
//      time (the queries sit in `sh`);
//   2. invocation h folds the tile into head h's running max m and sum l and turns z[h, ·]
//      into the weights e^{z − m};
//   3. invocation i owns channel quads i, i + TK, … of every head of the pass: it rescales its
//      accumulators by e^{m_old − m_new} and adds Σ_j p[h, j] · V_j, loading each V quad once.
// Finally out = acc · e^{m − M} / (l · e^{m − M} + [sink] e^{sink − M}) with M = max(m, sink);
// an empty list gives 0. Workgroup memory stays within WebGPU's default 16 KiB. Loops do four
// heads or four channels per iteration: llvmpipe stops every loop of an invocation after 65535
// iterations in total, so fewer, fatter iterations keep Qwen's full width well inside it.

//#include common/dtype.wgsl
//#include common/flags.wgsl

const TK: u32 = 64u;          // tokens per tile = invocations per workgroup
const SH: u32 = 4000u;        // f32 words of `sh`; the host picks HC with HC · (E4 + TK + 3) <= SH
const ACC: u32 = 16u;         // vec4 accumulators per invocation; the host keeps HC · nq <= ACC
const NO_ROW: u32 = 0xffffffffu;
const LOW: f32 = -3.0e38;     // "no score yet": below every real score, and finite

struct SparseAttentionParams {
    t: u32,           // query rows
    n: u32,           // sequences
    h: u32,           // query heads
    hkv: u32,         // KV heads
    hs: u32,          // selection groups
    e: u32,           // query / key channels E
    w: u32,           // token slots per (row, group)
    parts: u32,       // workgroups per (row, KV head)
    hc: u32,          // heads per pass
    page_size: u32,
    page_stride: u32, // elements from one page to the next
    num_pages: u32,
    max_pages: u32,   // columns of the page table
    k_off: u32,       // elements from a page's start to row 0 of plane K at layer_idx
    v_off: u32,       // the same for plane V
    has_sinks: u32,
    scale: f32,
    ev: u32,          // value / output channels Ev (0: E)
    dp: u32,          // channels of a pool row per head (0: E)
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> P: SparseAttentionParams;
@group(0) @binding(1) var<storage, read> query: array<u32>;         // [T, H, E] T
@group(0) @binding(2) var<storage, read> pool: array<u32>;          // [num_pages, 2, layers, page_size, Hkv, Dp] T, pages page_stride apart
@group(0) @binding(3) var<storage, read> seqs: array<u32>;          // [N+1 | N | N·max_pages] u32: row_offsets, cache_lengths, page_table
@group(0) @binding(4) var<storage, read> token_indices: array<i32>; // [T, Hs, W] i32
@group(0) @binding(5) var<storage, read> token_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(6) var<storage, read> sinks: array<f32>;         // [H] f32
@group(0) @binding(7) var<storage, read_write> out: array<atomic<u32>>; // [T, H, Ev] T
@group(0) @binding(8) var<storage, read_write> flags: atomic<u32>;

// q [hc, E4] (E4 = E rounded up to a quad, zero-padded) at 0, then z / weights [hc, TK], then
// running max, sum and rescale [hc] each.
var<workgroup> sh: array<f32, SH>;
// Pool offset of each tile token's row (page, row, head; no plane), NO_ROW when skipped.
var<workgroup> kv_row: array<u32, TK>;
// The row's sequence, position and token count (0 when the row is unusable).
var<workgroup> row_info: vec4<u32>;

fn ld_q(i: u32) -> f32 { return t_load(query[t_word(i)], i); }
fn ld_kv(i: u32) -> f32 { return t_load(pool[t_word(i)], i); }
// Channels c … c + 3 of the pool row at `row`; channels >= e read as 0.
// (No loops here: llvmpipe caps the loop iterations of an invocation, see the Rust module.)
fn ld_quad(row: u32, c: u32, e: u32) -> vec4<f32> {
    let i = row + c;
    if (c + 3u < e) {
        return vec4<f32>(ld_kv(i), ld_kv(i + 1u), ld_kv(i + 2u), ld_kv(i + 3u));
    }
    var v = vec4<f32>(0.0);
    if (c < e) { v.x = ld_kv(i); }
    if (c + 1u < e) { v.y = ld_kv(i + 1u); }
    if (c + 2u < e) { v.z = ld_kv(i + 2u); }
    return v;
}
// Four consecutive q values of `sh` (rows are padded to whole quads).
fn q_quad(i: u32) -> vec4<f32> { return vec4<f32>(sh[i], sh[i + 1u], sh[i + 2u], sh[i + 3u]); }
fn st_out(i: u32, v: f32) {
    atomicAnd(&out[t_word(i)], t_keep(i));
    atomicOr(&out[t_word(i)], t_bits(v, i));
}

// Sequence of row t: the last n with row_offsets[n] <= t.
fn seq_of(t: u32) -> u32 {
    var lo = 0u;
    var hi = P.n;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (seqs[mid] <= t) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// Pool offset of token `tok` of sequence n for KV head kh, or NO_ROW (flagged) when the token
// lies outside 0 ..= p or its page-table column or page is out of range.
fn resolve(n: u32, p: u32, kh: u32, tok: i32) -> u32 {
    if (tok < 0 || u32(tok) > p) {
        atomicOr(&flags, FLAG_TOKEN);
        return NO_ROW;
    }
    let pos = u32(tok);
    let col = pos / P.page_size;
    if (col >= P.max_pages) {
        atomicOr(&flags, FLAG_PAGE_SLOT);
        return NO_ROW;
    }
    let page = seqs[2u * P.n + 1u + n * P.max_pages + col];
    if (page >= P.num_pages) {
        atomicOr(&flags, FLAG_PAGE);
        return NO_ROW;
    }
    return page * P.page_stride + ((pos % P.page_size) * P.hkv + kh) * pool_dim();
}

// Ev and Dp; a zero in the params means E (the layout before values had their own width).
fn v_dim() -> u32 { return select(P.ev, P.e, P.ev == 0u); }
fn pool_dim() -> u32 { return select(P.dp, P.e, P.dp == 0u); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.t * P.hkv * P.parts) {
        return;
    }
    let t = id / (P.hkv * P.parts);
    let kh = (id / P.parts) % P.hkv;
    let gsz = P.h / P.hkv;  // query heads per KV head
    let ssz = P.h / P.hs;   // query heads per selection group
    let g = kh * gsz / ssz + id % P.parts;
    let h0 = max(kh * gsz, g * ssz);
    let h1 = min((kh + 1u) * gsz, (g + 1u) * ssz);
    if (g >= P.hs || h0 >= h1) {
        return;
    }

    // The row's sequence, position and count are device data: checked once, then shared.
    if (lid == 0u) {
        var info = vec4<u32>(0u);
        let n = seq_of(t);
        let start = seqs[n];
        if (t < start || t >= seqs[n + 1u]) {
            atomicOr(&flags, FLAG_LENGTHS);
        } else {
            var cnt = token_count[t * P.hs + g];
            if (cnt < 0 || u32(cnt) > P.w) {
                atomicOr(&flags, FLAG_COUNT);
                cnt = clamp(cnt, 0, i32(P.w));
            }
            info = vec4<u32>(n, seqs[P.n + 1u + n] + (t - start), u32(cnt), 0u);
        }
        row_info = info;
    }
    let info = workgroupUniformLoad(&row_info);
    let n = info.x;
    let p = info.y;
    let cnt = info.z;
    let e = P.e;
    let ev = v_dim();
    let ep = (e + 3u) & ~3u;          // q rows in `sh` are zero-padded to whole quads
    let nq = (((ev + 3u) / 4u) + TK - 1u) / TK; // V channel quads per invocation in step 3
    let list = (t * P.hs + g) * P.w;

    for (var ha = h0; ha < h1; ha += P.hc) {
        let hc = min(P.hc, h1 - ha);
        let nhq = (hc + 3u) / 4u;
        let zb = hc * ep;
        let mb = zb + hc * TK;
        workgroupBarrier(); // the previous pass is done with sh
        for (var i = lid; i < hc * ep; i += TK) {
            let c = i % ep;
            var v = 0.0;
            if (c < e) { v = ld_q((t * P.h + ha + i / ep) * e + c); }
            sh[i] = v;
        }
        if (lid < hc) {
            sh[mb + lid] = LOW;
            sh[mb + hc + lid] = 0.0;
        }
        var acc = array<vec4<f32>, ACC>();
        workgroupBarrier();

        for (var base = 0u; base < cnt; base += TK) {
            let tl = min(TK, cnt - base);
            // 1. token lid of the tile: its pool row, then its scores against every head,
            //    four heads per step so that the K quad is loaded once.
            var row = NO_ROW;
            if (lid < tl) {
                row = resolve(n, p, kh, token_indices[list + base + lid]);
            }
            kv_row[lid] = row;
            var z = array<vec4<f32>, 4>();
            if (row != NO_ROW) {
                let kr = row + P.k_off;
                for (var c = 0u; c < ep; c += 4u) {
                    let k4 = ld_quad(kr, c, e);
                    for (var hq = 0u; hq < nhq; hq++) {
                        // Heads past hc (the last quad's padding) repeat head hc − 1 and are
                        // never stored: no read leaves q's rows.
                        let j = 4u * hq;
                        let last = hc - 1u;
                        z[hq] += vec4<f32>(dot(q_quad(j * ep + c), k4),
                                           dot(q_quad(min(j + 1u, last) * ep + c), k4),
                                           dot(q_quad(min(j + 2u, last) * ep + c), k4),
                                           dot(q_quad(min(j + 3u, last) * ep + c), k4));
                    }
                }
            }
            for (var j = 0u; j < hc; j++) {
                var v = LOW;
                if (row != NO_ROW) { v = P.scale * z[j / 4u][j % 4u]; }
                sh[zb + j * TK + lid] = v;
            }
            workgroupBarrier();

            // 2. head lid: new running max, weights of the tile, rescaled sum.
            if (lid < hc) {
                let zr = zb + lid * TK;
                let m_old = sh[mb + lid];
                var m = m_old;
                for (var j = 0u; j < tl; j++) {
                    if (kv_row[j] != NO_ROW) { m = max(m, sh[zr + j]); }
                }
                var alpha = 1.0;
                if (m_old != LOW) { alpha = exp(m_old - m); }
                var sum = 0.0;
                for (var j = 0u; j < tl; j++) {
                    var w = 0.0;
                    if (kv_row[j] != NO_ROW) { w = exp(sh[zr + j] - m); }
                    sh[zr + j] = w;
                    sum += w;
                }
                sh[mb + lid] = m;
                sh[mb + hc + lid] = sh[mb + hc + lid] * alpha + sum;
                sh[mb + 2u * hc + lid] = alpha;
            }
            workgroupBarrier();

            // 3. channel quads lid + k·TK of every head: rescale, then add the tile's V rows,
            //    four heads per step.
            for (var a = 0u; a < hc * nq; a++) {
                acc[a] *= sh[mb + 2u * hc + a / nq];
            }
            for (var s = 0u; s < tl; s++) {
                let r = kv_row[s];
                if (r == NO_ROW) { continue; }
                for (var k = 0u; k < nq; k++) {
                    let cq = lid + k * TK;
                    if (4u * cq >= ev) { break; }
                    let v4 = ld_quad(r + P.v_off, 4u * cq, ev);
                    for (var hq = 0u; hq < nhq; hq++) {
                        let j = 4u * hq;
                        let w = zb + j * TK + s;
                        acc[j * nq + k] += sh[w] * v4;
                        if (j + 1u < hc) { acc[(j + 1u) * nq + k] += sh[w + TK] * v4; }
                        if (j + 2u < hc) { acc[(j + 2u) * nq + k] += sh[w + 2u * TK] * v4; }
                        if (j + 3u < hc) { acc[(j + 3u) * nq + k] += sh[w + 3u * TK] * v4; }
                    }
                }
            }
            workgroupBarrier();
        }

        // Normalise with the sink, round once, store.
        for (var j = 0u; j < hc; j++) {
            let h = ha + j;
            let m = sh[mb + j];
            let l = sh[mb + hc + j];
            var factor = 0.0;
            if (l > 0.0) {
                var top = m;
                var sink_w = 0.0;
                if (P.has_sinks != 0u && sinks[h] > LOW) {
                    top = max(m, sinks[h]);
                    sink_w = exp(sinks[h] - top);
                }
                let scale_m = exp(m - top);
                factor = scale_m / (l * scale_m + sink_w);
            }
            for (var k = 0u; k < nq; k++) {
                let c = 4u * (lid + k * TK);
                let o = acc[j * nq + k] * factor;
                let dst = (t * P.h + h) * ev + c;
                if (c < ev) { st_out(dst, o.x); }
                if (c + 1u < ev) { st_out(dst + 1u, o.y); }
                if (c + 2u < ev) { st_out(dst + 2u, o.z); }
                if (c + 3u < ev) { st_out(dst + 3u, o.w); }
            }
        }
    }
}
