// nsa_compress_attention (SPEC §8.1), first stage: compressed attention and the aggregated
// selection scores. One workgroup per (query row r, KV head n2); the G = N1/N2 query heads of
// the group are taken one after another:
//   1. stage q_h in workgroup memory; pass 1 over the visible compressed tokens j < vis
//      (vis: all c_b, or under the causal mask those with j·d + l − 1 <= p) keeps a running
//      (max, sum) per invocation, merged by a tree reduction;
//   2. pass 2 recomputes x_j, P_j = exp(x_j − max) / sum, adds P_j to psum[j] (the group's sum
//      of probabilities; invocation lid owns the j ≡ lid (mod WG), so no races) and multiplies
//      round_T(P_j) by V_j, a tile of 128 tokens at a time, four output channels per invocation.
// Then the selection scores from psum by Ascend's mapping, with S' = l'/d, N' = l/d:
//   agg[o] = Σ_{m<S'} Σ_{n<N'} psum[S'(o+1) − m − n] = Σ_u mult(u) · psum[S'(o+1) − u],
//   mult(u) = #{(m, n): m + n = u} = min(u, S'−1, N'−1, S'+N'−2−u) + 1,
// terms outside 0 … vis − 1 being 0; blocks 0, nsel−2, nsel−1 get +inf; o >= nsel gets −inf so
// the block_topk stage that follows ignores it. BSND padding rows get a zero output and an
// all −inf score row (so −1 indices). Lengths and block-table entries are device data: the row
// is skipped and flagged when one is out of range, and nothing is read out of bounds.

//#include common/dtype.wgsl
//#include common/flags.wgsl

struct NsaCompressAttentionParams {
    rows: u32,        // query rows R: T (TND) or B·S (BSND)
    batches: u32,     // B
    seq: u32,         // S of BSND; 0 for TND
    n1: u32,          // query heads
    n2: u32,          // KV heads
    dqk: u32,
    dv: u32,
    page: u32,        // compressed tokens per cache block
    num_blocks: u32,  // blocks in the cache
    max_blocks: u32,  // columns of block_table
    l: u32,           // compress_block_size
    d: u32,           // compress_stride
    lsel: u32,        // select_block_size l'
    k: u32,           // select_block_count
    c_max: u32,       // row stride of psum (largest c_b)
    w: u32,           // row width of scores (largest nsel)
    causal: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: NsaCompressAttentionParams;
@group(0) @binding(1) var<storage, read> query: array<u32>;        // [R, N1, Dqk] T
@group(0) @binding(2) var<storage, read> key: array<u32>;          // [num_blocks, page, N2·Dqk] T
@group(0) @binding(3) var<storage, read> value: array<u32>;        // [num_blocks, page, N2·Dv] T
@group(0) @binding(4) var<storage, read> block_table: array<u32>;  // [B, max_blocks] i32
@group(0) @binding(5) var<storage, read> lens: array<u32>;         // [4B+1]: q_len, cmp_len, sel_len [B]; q_start [B+1]
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>; // [R, N1, Dv] T
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;   // [R·N2, c_max] f32 scratch
@group(0) @binding(8) var<storage, read_write> scores: array<f32>; // [R·N2, W] f32
@group(0) @binding(9) var<storage, read_write> flags: atomic<u32>;

const WG: u32 = 128u;
const MAX_DQK: u32 = 512u;
const CPT: u32 = 4u;  // output channels per invocation: Dv <= WG · CPT = 512
const INFO_FLAGS: u32 = 0u;
const INFO_PAD: u32 = 1u;
const INFO_B: u32 = 2u;
const INFO_VIS: u32 = 3u;
const INFO_NSEL: u32 = 4u;
const INFO_COLS: u32 = 5u;

var<workgroup> qs: array<f32, MAX_DQK>;  // the current query head
var<workgroup> pt: array<f32, WG>;       // round_T(P_j) of the current tile
var<workgroup> rmax: array<f32, WG>;     // reduction of the running max ...
var<workgroup> rsum: array<f32, WG>;     // ... and sum
var<workgroup> info: array<u32, 8>;      // the row's facts, decided by invocation 0
var<workgroup> bad: atomic<u32>;

fn ld_q(i: u32) -> f32 { return t_load(query[t_word(i)], i); }
fn ld_k(i: u32) -> f32 { return t_load(key[t_word(i)], i); }
fn ld_v(i: u32) -> f32 { return t_load(value[t_word(i)], i); }
fn st_out(i: u32, v: f32) {
    atomicAnd(&out[t_word(i)], t_keep(i));
    atomicOr(&out[t_word(i)], t_bits(v, i));
}
// Infinities from bits held in a variable: a constant expression must not evaluate to one
// (browsers reject it at shader creation; naga allows it).
fn neg_inf() -> f32 { var b = 0xff800000u; return bitcast<f32>(b); }
fn pos_inf() -> f32 { var b = 0x7f800000u; return bitcast<f32>(b); }

// v rounded to T and widened back.
fn t_round(v: f32) -> f32 {
    if (T_KIND == 1u) {
        return f16_bits_to_f32(f32_to_f16_bits(v));
    }
    if (T_KIND == 2u) {
        return bitcast<f32>(f32_to_bf16_bits(v) << 16u);
    }
    return v;
}

// Row of compressed token j of batch b in the cache (block-table entries checked beforehand).
fn cache_row(b: u32, j: u32) -> u32 {
    let blk = block_table[b * P.max_blocks + j / P.page];
    return blk * P.page + j % P.page;
}

fn logit(b: u32, kv: u32, j: u32) -> f32 {
    let base = (cache_row(b, j) * P.n2 + kv) * P.dqk;
    var dot = 0.0;
    for (var c = 0u; c < P.dqk; c++) {
        dot += qs[c] * ld_k(base + c);
    }
    return P.scale * dot;
}

// Facts of query row r (invocation 0 only): its batch, padding, visible count, nsel, the
// block-table columns it reads, and any flag its lengths raise.
fn row_info(r: u32) -> array<u32, 8> {
    var f = array<u32, 8>(0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
    let nb = P.batches;
    var b = 0u;
    var s = 0u;
    if (P.seq == 0u) {
        // TND: last b with q_start[b] <= r.
        var hi = nb;
        while (hi - b > 1u) {
            let mid = (b + hi) / 2u;
            if (lens[3u * nb + mid] <= r) { b = mid; } else { hi = mid; }
        }
        s = r - min(r, lens[3u * nb + b]);
        if (r < lens[3u * nb + b] || s >= lens[b]) {
            f[INFO_FLAGS] = FLAG_NSA_LENGTHS;
            return f;
        }
    } else {
        b = r / P.seq;
        s = r % P.seq;
        if (s >= lens[b]) {
            f[INFO_PAD] = 1u;
            return f;
        }
    }
    f[INFO_B] = b;
    let c = lens[nb + b];
    if (c == 0u || c > P.c_max) {
        f[INFO_FLAGS] = FLAG_NSA_LENGTHS;
        return f;
    }
    let cols = (c + P.page - 1u) / P.page;
    if (cols > P.max_blocks) {
        f[INFO_FLAGS] = FLAG_PAGE_SLOT;
        return f;
    }
    let nsel = ((c - 1u) * P.d + P.l + P.lsel - 1u) / P.lsel;
    if (nsel > P.w || P.k > nsel) {
        f[INFO_FLAGS] = FLAG_NSA_LENGTHS;
        return f;
    }
    var vis = c;
    if (P.causal != 0u) {
        let sel = lens[2u * nb + b];
        let q = lens[b];
        if (sel < q) {
            f[INFO_FLAGS] = FLAG_NSA_LENGTHS;
            return f;
        }
        let p1 = sel - q + s + 1u;  // p + 1
        vis = 0u;
        if (p1 >= P.l) {
            vis = min(c, (p1 - P.l) / P.d + 1u);
        }
    }
    f[INFO_VIS] = vis;
    f[INFO_NSEL] = nsel;
    f[INFO_COLS] = cols;
    return f;
}

// Merges running (max, sum) pairs; a sum of 0 means "no token yet".
fn merge(ma: f32, sa: f32, mb: f32, sb: f32) -> vec2<f32> {
    if (sb == 0.0) { return vec2<f32>(ma, sa); }
    if (sa == 0.0) { return vec2<f32>(mb, sb); }
    let m = max(ma, mb);
    return vec2<f32>(m, sa * exp(ma - m) + sb * exp(mb - m));
}

fn mult(u: u32, sp: u32, np: u32) -> f32 {
    return f32(min(min(u, sp - 1u), min(np - 1u, sp + np - 2u - u)) + 1u);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows * P.n2) {
        return;
    }
    let r = id / P.n2;
    let kv = id % P.n2;
    let g = P.n1 / P.n2;
    if (lid == 0u) {
        info = row_info(r);
        atomicStore(&bad, info[INFO_FLAGS]);
    }
    workgroupBarrier();
    // Every block-table entry the row reads must name a block of the cache.
    let b = info[INFO_B];
    for (var col = lid; col < info[INFO_COLS]; col += WG) {
        if (block_table[b * P.max_blocks + col] >= P.num_blocks) {
            atomicOr(&bad, FLAG_PAGE);
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        info[INFO_FLAGS] = atomicLoad(&bad);
    }
    let fx = workgroupUniformLoad(&info);
    if (fx[INFO_FLAGS] != 0u) {
        if (lid == 0u) { atomicOr(&flags, fx[INFO_FLAGS]); }
        return;
    }
    let score_row = id * P.w;
    if (fx[INFO_PAD] != 0u) {
        for (var i = lid; i < g * P.dv; i += WG) {
            st_out((r * P.n1 + kv * g) * P.dv + i, 0.0);
        }
        for (var o = lid; o < P.w; o += WG) {
            scores[score_row + o] = neg_inf();
        }
        return;
    }
    let vis = fx[INFO_VIS];
    let nsel = fx[INFO_NSEL];
    let ps_row = id * P.c_max;
    let tiles = (vis + WG - 1u) / WG;

    for (var hh = 0u; hh < g; hh++) {
        let h = kv * g + hh;
        for (var c = lid; c < P.dqk; c += WG) {
            qs[c] = ld_q((r * P.n1 + h) * P.dqk + c);
        }
        workgroupBarrier();
        // Pass 1: running max and sum of exp over this invocation's tokens, then merged.
        var m = 0.0;
        var s = 0.0;
        for (var j = lid; j < vis; j += WG) {
            let x = logit(b, kv, j);
            let ms = merge(m, s, x, 1.0);
            m = ms.x;
            s = ms.y;
        }
        rmax[lid] = m;
        rsum[lid] = s;
        workgroupBarrier();
        for (var half = WG / 2u; half > 0u; half >>= 1u) {
            if (lid < half) {
                let ms = merge(rmax[lid], rsum[lid], rmax[lid + half], rsum[lid + half]);
                rmax[lid] = ms.x;
                rsum[lid] = ms.y;
            }
            workgroupBarrier();
        }
        let mx = rmax[0];
        let sm = rsum[0];
        // Pass 2: probabilities, the group's sum, and the output.
        var acc = array<f32, CPT>(0.0, 0.0, 0.0, 0.0);
        for (var t = 0u; t < tiles; t++) {
            let j = t * WG + lid;
            var pj = 0.0;
            if (j < vis) {
                pj = exp(logit(b, kv, j) - mx) / sm;
                if (hh == 0u) {
                    psum[ps_row + j] = pj;
                } else {
                    psum[ps_row + j] += pj;
                }
            }
            pt[lid] = t_round(pj);
            workgroupBarrier();
            let nj = min(WG, vis - t * WG);
            for (var jj = 0u; jj < nj; jj++) {
                let base = (cache_row(b, t * WG + jj) * P.n2 + kv) * P.dv;
                let pv = pt[jj];
                for (var q = 0u; q < CPT; q++) {
                    let c = lid + q * WG;
                    if (c < P.dv) {
                        acc[q] += pv * ld_v(base + c);
                    }
                }
            }
            workgroupBarrier();
        }
        for (var q = 0u; q < CPT; q++) {
            let c = lid + q * WG;
            if (c < P.dv) {
                st_out((r * P.n1 + h) * P.dv + c, acc[q]);
            }
        }
    }

    // Selection scores of the blocks, from the group's probabilities.
    storageBarrier();
    workgroupBarrier();
    let sp = P.lsel / P.d;
    let np = P.l / P.d;
    for (var o = lid; o < P.w; o += WG) {
        var v = neg_inf();
        if (o < nsel) {
            if (o == 0u || o + 2u >= nsel) {
                v = pos_inf();
            } else {
                let a = sp * (o + 1u);
                var acc = 0.0;
                for (var u = 0u; u + 1u < sp + np && u <= a; u++) {
                    let j = a - u;
                    if (j < vis) {
                        acc += mult(u, sp, np) * psum[ps_row + j];
                    }
                }
                v = acc;
            }
        }
        scores[score_row + o] = v;
    }
}
