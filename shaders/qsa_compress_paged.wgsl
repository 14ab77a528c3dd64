// qsa_compress_paged (SPEC §2): block keys from the raw index keys of a paged pool.
// One workgroup per (sequence n, j < span): block b = first_n + j with first_n = cache_len/r
// (incremental) or 0 (full), computed when b < key_count/r. Lengths and page-table entries are
// device data: anything out of range is clamped, skipped and reported in `flags`.

//#include common/dtype.wgsl
//#include common/rowmath.wgsl
//#include common/flags.wgsl

struct QsaCompressParams {
    n: u32,            // sequences
    di: u32,           // channels
    dr: u32,           // rotary channels (0: no rope)
    r: u32,            // ratio
    page_size: u32,
    k_off: u32,        // elements from a page's start to row 0 of plane K at layer_idx
    page_stride: u32,  // elements from one page to the next
    num_pages: u32,
    max_pages: u32,    // columns of page_table
    max_blocks: u32,   // rows of block_keys per sequence
    freq_rows: u32,    // rows of freqs_cis
    span: u32,         // workgroups per sequence
    norm_on: u32,
    full: u32,         // 1: mode = full
    eps: f32,
    offset: f32,
    page_lo: u32,      // `pool` holds pages page_lo .. page_lo + shard_pages only: blocks on
    shard_pages: u32,  // other pages are left to another dispatch (a pool split in shards)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: QsaCompressParams;
@group(0) @binding(1) var<storage, read> pool: array<u32>;        // [shard_pages, 2, layers, page_size, 1, Di] T
@group(0) @binding(2) var<storage, read> page_table: array<u32>;  // [N, max_pages] u32
@group(0) @binding(3) var<storage, read> lens: array<u32>;        // [2, N]: cache_lengths, key_counts
@group(0) @binding(4) var<storage, read> gamma: array<u32>;       // [Di] T
@group(0) @binding(5) var<storage, read> freqs: array<u32>;       // [positions, Dr] T, (cos, sin) pairs
@group(0) @binding(6) var<storage, read_write> block_keys: array<atomic<u32>>; // [N·max_blocks, Di] T
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

fn ld_pool(i: u32) -> f32 { return t_load(pool[t_word(i)], i); }
fn ld_gamma(i: u32) -> f32 { return t_load(gamma[t_word(i)], i); }
fn ld_freqs(i: u32) -> f32 { return t_load(freqs[t_word(i)], i); }
fn st_keys(i: u32, v: f32) {
    atomicAnd(&block_keys[t_word(i)], t_keep(i));
    atomicOr(&block_keys[t_word(i)], t_bits(v, i));
}

var<workgroup> row_base: array<u32, 64>;  // pool offset of each token row of the block (r <= 64)
var<workgroup> bad: atomic<u32>;
const NOT_MINE: u32 = 0x80000000u;  // a page of another shard: skip the block, no flag
var<workgroup> bad_all: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.n * P.span) {
        return;
    }
    let n = id / P.span;
    let j = id % P.span;
    let cl = lens[n];
    let kc = lens[P.n + n];
    if (kc < cl) {
        if (lid == 0u) { atomicOr(&flags, FLAG_LENGTHS); }
        return;
    }
    var last = kc / P.r;
    if (last > P.max_blocks) {
        if (lid == 0u) { atomicOr(&flags, FLAG_BLOCKS); }
        last = P.max_blocks;
    }
    let first = select(cl / P.r, 0u, P.full != 0u);
    let b = first + j;
    if (b >= last) {
        return;
    }
    let pos0 = b * P.r;

    // Resolve the pool row of each token through the page table, checking every step.
    if (lid == 0u) { atomicStore(&bad, 0u); }
    workgroupBarrier();
    if (lid < P.r) {
        let pos = pos0 + lid;
        let slot = pos / P.page_size;
        var base = 0u;
        if (slot >= P.max_pages) {
            atomicOr(&bad, FLAG_PAGE_SLOT);
        } else {
            let page = page_table[n * P.max_pages + slot];
            if (page >= P.num_pages) {
                atomicOr(&bad, FLAG_PAGE);
            } else if (page < P.page_lo || page - P.page_lo >= P.shard_pages) {
                atomicOr(&bad, NOT_MINE);
            } else {
                base = (page - P.page_lo) * P.page_stride + P.k_off + (pos % P.page_size) * P.di;
            }
        }
        row_base[lid] = base;
    }
    if (P.dr > 0u && pos0 >= P.freq_rows) {
        if (lid == 0u) { atomicOr(&bad, FLAG_ROPE_ROW); }
    }
    workgroupBarrier();
    if (lid == 0u) { bad_all = atomicLoad(&bad); }
    let problems = workgroupUniformLoad(&bad_all);
    if (problems != 0u) {
        if (lid == 0u && (problems & ~NOT_MINE) != 0u) { atomicOr(&flags, problems & ~NOT_MINE); }
        return;
    }

    // 1. mean of the r raw keys
    for (var c = lid; c < P.di; c += WG) {
        var acc = 0.0;
        for (var t = 0u; t < P.r; t++) {
            acc += ld_pool(row_base[t] + c);
        }
        row[c] = acc / f32(P.r);
    }
    workgroupBarrier();
    // 2. RMS norm
    if (P.norm_on != 0u) {
        let inv = wg_rms_factor(lid, P.di, P.eps);
        for (var c = lid; c < P.di; c += WG) {
            row[c] = row[c] * inv * (P.offset + ld_gamma(c));
        }
        workgroupBarrier();
    }
    // 3. RoPE: pair i = c mod Dr/2 holds (cos, sin) at columns 2i, 2i+1 of row pos0
    let dst = (n * P.max_blocks + b) * P.di;
    for (var c = lid; c < P.di; c += WG) {
        var v = row[c];
        if (c < P.dr) {
            let pair = c % (P.dr / 2u);
            let f = pos0 * P.dr + 2u * pair;
            v = rope_at(c, P.dr, ld_freqs(f), ld_freqs(f + 1u));
        }
        st_keys(dst + c, v);
    }
}
