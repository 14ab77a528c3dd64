// qsa_compress_paged (SPEC §2): the work of one workgroup and its bindings 1 … 7, shared by
// qsa_compress_paged.wgsl and qsa_compress_query.wgsl (the indexer's compress and query
// preparation in one dispatch). The including shader declares the params: `U.c` at binding 0.

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

const MAX_R: u32 = 512u;  // largest ratio (MAX_RATIO on the host)
var<workgroup> row_base: array<u32, MAX_R>;  // pool offset of each token row of the block (r <= MAX_R)
var<workgroup> bad: atomic<u32>;
const NOT_MINE: u32 = 0x80000000u;  // a page of another shard: skip the block, no flag
var<workgroup> bad_all: u32;

// The work of workgroup `id` (< n · span): sequence id / span, block first + id % span.
// Workgroup-uniform control flow only (barriers).
fn compress_block(id: u32, lid: u32) {
    let n = id / U.c.span;
    let j = id % U.c.span;
    let cl = lens[n];
    let kc = lens[U.c.n + n];
    if (kc < cl) {
        if (lid == 0u) { atomicOr(&flags, FLAG_LENGTHS); }
        return;
    }
    var last = kc / U.c.r;
    if (last > U.c.max_blocks) {
        if (lid == 0u) { atomicOr(&flags, FLAG_BLOCKS); }
        last = U.c.max_blocks;
    }
    let first = select(cl / U.c.r, 0u, U.c.full != 0u);
    let b = first + j;
    if (b >= last) {
        return;
    }
    let pos0 = b * U.c.r;

    // Resolve the pool row of each token through the page table, checking every step.
    if (lid == 0u) { atomicStore(&bad, 0u); }
    workgroupBarrier();
    for (var i = lid; i < U.c.r; i += WG) {
        let pos = pos0 + i;
        let slot = pos / U.c.page_size;
        var base = 0u;
        if (slot >= U.c.max_pages) {
            atomicOr(&bad, FLAG_PAGE_SLOT);
        } else {
            let page = page_table[n * U.c.max_pages + slot];
            if (page >= U.c.num_pages) {
                atomicOr(&bad, FLAG_PAGE);
            } else if (page < U.c.page_lo || page - U.c.page_lo >= U.c.shard_pages) {
                atomicOr(&bad, NOT_MINE);
            } else {
                base = (page - U.c.page_lo) * U.c.page_stride + U.c.k_off + (pos % U.c.page_size) * U.c.di;
            }
        }
        row_base[i] = base;
    }
    if (U.c.dr > 0u && pos0 >= U.c.freq_rows) {
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
    for (var c = lid; c < U.c.di; c += WG) {
        var acc = 0.0;
        for (var t = 0u; t < U.c.r; t++) {
            acc += ld_pool(row_base[t] + c);
        }
        row[c] = acc / f32(U.c.r);
    }
    workgroupBarrier();
    // 2. RMS norm
    if (U.c.norm_on != 0u) {
        let inv = wg_rms_factor(lid, U.c.di, U.c.eps);
        for (var c = lid; c < U.c.di; c += WG) {
            row[c] = row[c] * inv * (U.c.offset + ld_gamma(c));
        }
        workgroupBarrier();
    }
    // 3. RoPE: pair i = c mod Dr/2 holds (cos, sin) at columns 2i, 2i+1 of row pos0
    let dst = (n * U.c.max_blocks + b) * U.c.di;
    for (var c = lid; c < U.c.di; c += WG) {
        var v = row[c];
        if (c < U.c.dr) {
            let pair = c % (U.c.dr / 2u);
            let f = pos0 * U.c.dr + 2u * pair;
            v = rope_at(c, U.c.dr, ld_freqs(f), ld_freqs(f + 1u));
        }
        st_keys(dst + c, v);
    }
}
