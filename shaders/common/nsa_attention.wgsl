// Shared by the three stages of nsa_compress_attention (SPEC §8.1): the parameters, the
// bindings every stage has, the geometry of the splits and of the scratch buffer, and the
// facts of a query row that every stage decides the same way.
//
// The compressed tokens 0 … vis − 1 of a query row are cut into splits; the G = N1/N2 query
// heads of a KV head into chunks of HC = 16, held together in one mat4x4 (column h / 4, row
// h % 4), so that each compressed K and V row is read once per chunk. The scratch buffer is
// read and written 16 bytes (4 heads, a "quad") at a time; with Q = ceil(G / 4) quads:
//   logits  [R·N2, c_max, Q]                 x_j = scale · q·K_j of every visible token
//   stats   [R·N2, chunks, splits1, 2, 4]    max, then sum of exp, of each stage-1 split
//   partial [R·N2, parts, Dv, Q]             Σ round_T(P_j)·V_j over one part of a stage-2 split
// (quads of heads past G hold values that are never used).

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
    c_max: u32,       // row stride of the logits and of psum (largest c_b)
    w: u32,           // row width of scores (largest nsel)
    causal: u32,
    scale: f32,
    split2: u32,      // tokens per stage-2 workgroup: 2048, 4096 or 8192 (the host's choice)
    split1: u32,      // tokens per stage-1 workgroup: 1024 (portable and subgroup kernels:
                      // WG invocations × 16 tokens) or 256 (the GPU-shaped kernels: one each)
}

@group(0) @binding(0) var<uniform> P: NsaCompressAttentionParams;
@group(0) @binding(1) var<storage, read> lens: array<u32>;         // [4B+1]: q_len, cmp_len, sel_len [B]; q_start [B+1]
@group(0) @binding(2) var<storage, read> block_table: array<u32>;  // [B, max_blocks] i32
@group(0) @binding(3) var<storage, read_write> flags: atomic<u32>;

const WG: u32 = 64u;      // invocations of every stage's workgroup
const HC: u32 = 16u;      // query heads per chunk: one mat4x4
const CT: u32 = 16u;      // output channels per stage-2 invocation
const INFO_FLAGS: u32 = 0u;
const INFO_PAD: u32 = 1u;
const INFO_B: u32 = 2u;
const INFO_VIS: u32 = 3u;
const INFO_NSEL: u32 = 4u;
const INFO_COLS: u32 = 5u;

var<workgroup> info: array<u32, 8>;  // the row's facts, decided by invocation 0
var<workgroup> bad: atomic<u32>;

// Infinities from bits held in a variable: a constant expression must not evaluate to one
// (browsers reject it at shader creation; naga allows it).
fn neg_inf() -> f32 { var b = 0xff800000u; return bitcast<f32>(b); }
fn pos_inf() -> f32 { var b = 0x7f800000u; return bitcast<f32>(b); }

fn group_size() -> u32 { return P.n1 / P.n2; }
fn quads() -> u32 { return (group_size() + 3u) / 4u; }
fn head_chunks() -> u32 { return (group_size() + HC - 1u) / HC; }
fn splits1() -> u32 { return (P.c_max + P.split1 - 1u) / P.split1; }
fn splits2() -> u32 { return (P.c_max + P.split2 - 1u) / P.split2; }
// Stage 2 gives each invocation CT channels of one part of the split's tokens: the
// ceil(Dv / CT) channel tiles times `parts_per_split` parts fill the workgroup.
fn channel_tiles() -> u32 { return (P.dv + CT - 1u) / CT; }
fn parts_per_split() -> u32 { return WG / channel_tiles(); }
fn parts() -> u32 { return splits2() * parts_per_split(); }
// First quad of each region, and of one (query row, KV head)'s stretch of it.
fn logits_at(rk: u32) -> u32 { return rk * P.c_max * quads(); }
fn stats_at(rk: u32) -> u32 {
    return P.rows * P.n2 * P.c_max * quads() + rk * head_chunks() * splits1() * 8u;
}
fn partial_at(rk: u32) -> u32 {
    return stats_at(P.rows * P.n2) + rk * parts() * P.dv * quads();
}

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

// 1 when the page size is a power of two: a token's page and slot are a shift and a mask (on
// llvmpipe an integer division of a vector is eight scalar ones, twice per batch of tokens in
// the values stage).
override PAGE_POW2: u32 = 0u;

// Row of compressed token j of batch b in the cache (block-table entries checked beforehand).
fn cache_row(b: u32, j: u32) -> u32 {
    if (PAGE_POW2 != 0u) {
        let blk = block_table[b * P.max_blocks + (j >> countTrailingZeros(P.page))];
        return blk * P.page + (j & (P.page - 1u));
    }
    let blk = block_table[b * P.max_blocks + j / P.page];
    return blk * P.page + j % P.page;
}

// Merges running (max, sum) pairs of four heads; a sum of 0 means "no token yet".
fn merge4(ma: vec4<f32>, sa: vec4<f32>, mb: vec4<f32>, sb: vec4<f32>) -> array<vec4<f32>, 2> {
    let m = max(ma, mb);
    let s = sa * exp(ma - m) + sb * exp(mb - m);
    let a_only = sb == vec4<f32>(0.0);
    let b_only = sa == vec4<f32>(0.0);
    return array<vec4<f32>, 2>(select(select(m, mb, b_only), ma, a_only),
                               select(select(s, sb, b_only), sa, a_only));
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

// The facts of row r for the whole workgroup, after checking the block-table entries that
// this workgroup reads: those of the visible tokens lo … hi_cap − 1, or with whole_row all of
// the row's columns (every entry used must name a block of the cache). A flag is raised here
// and left in INFO_FLAGS; the caller skips the row.
fn row_facts(r: u32, lid: u32, lo: u32, hi_cap: u32, whole_row: bool) -> array<u32, 8> {
    if (lid == 0u) {
        info = row_info(r);
        atomicStore(&bad, info[INFO_FLAGS]);
    }
    let f = workgroupUniformLoad(&info);
    var c_lo = 0u;
    var c_hi = f[INFO_COLS];  // columns c_lo … c_hi − 1
    if (!whole_row) {
        let hi = min(hi_cap, f[INFO_VIS]);
        c_lo = lo / P.page;
        c_hi = select(c_lo, (hi - 1u) / P.page + 1u, lo < hi);
    }
    if (f[INFO_FLAGS] == 0u && f[INFO_PAD] == 0u) {
        let b = f[INFO_B];
        for (var col = c_lo + lid; col < c_hi; col += WG) {
            if (block_table[b * P.max_blocks + col] >= P.num_blocks) {
                atomicOr(&bad, FLAG_PAGE);
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        info[INFO_FLAGS] = atomicLoad(&bad);
        if (info[INFO_FLAGS] != 0u) {
            atomicOr(&flags, info[INFO_FLAGS]);
        }
    }
    return workgroupUniformLoad(&info);
}
