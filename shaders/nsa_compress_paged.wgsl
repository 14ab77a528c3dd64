// nsa_compress_paged: the NSA selector's compress stage. nsa_compress (SPEC §8.2) over raw
// tokens read from the paged raw KV pool, written straight into the paged compressed cache of
// nsa_compress_attention (§8.1). Window i of sequence b covers its positions i·d … i·d + l − 1;
// the windows a step completes are first_win[b] … first_win[b] + (win_off[b+1] − win_off[b]) − 1,
// packed batch after batch as rows win_off[b] … of the step. Compressed token i is
//   cache[table[b, i / P], i mod P, n, c] = Σ_{t<l} weight[t, n] · raw[b, i·d + t, n, c]
// (f32 accumulation in t order, one rounding to T), c < width, where raw[b, p, n, :] is the
// first `width` channels of row p mod page_size, head n, of page page_table[b, p / page_size],
// at `plane_off` in the page (plane K or V). One invocation per output word (one f32, or two
// f16/bf16 elements of one row: the host keeps N·width even), so no two invocations share a
// word. Lengths, offsets, page and block tables are device data: a word whose window reads
// past its sequence, or whose page or block is out of range, is not written and raises a flag.

//#include common/dtype.wgsl
//#include common/flags.wgsl

struct NsaCompressPagedParams {
    words: u32,          // output words of this dispatch
    total: u32,          // output elements = new windows · N · width
    batches: u32,        // B
    heads: u32,          // KV heads N
    width: u32,          // channels compressed (Dqk for K, Dv for V)
    head_dim: u32,       // channels of a pool row per head (>= width)
    plane_off: u32,      // elements from a page's start to row 0 of the plane read
    page_size: u32,
    page_stride: u32,    // elements from one page to the next
    num_pages: u32,
    max_pages: u32,      // columns of the page table
    l: u32,              // window length
    d: u32,              // stride
    cmp_page: u32,       // compressed tokens per cache block P
    cmp_blocks: u32,     // blocks in the compressed cache
    max_cmp_blocks: u32, // columns of the block table
}

@group(0) @binding(0) var<uniform> P: NsaCompressPagedParams;
@group(0) @binding(1) var<storage, read> pool: array<u32>;   // [num_pages, 2, 1, page_size, N, head_dim] T
@group(0) @binding(2) var<storage, read> weight: array<u32>; // [l, N] T
@group(0) @binding(3) var<storage, read> seqs: array<u32>;   // [B+1 | B | B | B·max_pages] u32: win_off, first_win, raw_len, page_table
@group(0) @binding(4) var<storage, read> table: array<u32>;  // [B, max_cmp_blocks] i32: the cache's block table
@group(0) @binding(5) var<storage, read_write> cache: array<u32>; // [cmp_blocks, P, N·width] T
@group(0) @binding(6) var<storage, read_write> flags: atomic<u32>;

const NO_WORD: u32 = 0xffffffffu;

fn ld_pool(i: u32) -> f32 { return t_load(pool[t_word(i)], i); }
fn ld_w(i: u32) -> f32 { return t_load(weight[t_word(i)], i); }
fn win_off(b: u32) -> u32 { return seqs[b]; }
fn first_win(b: u32) -> u32 { return seqs[P.batches + 1u + b]; }
fn raw_len(b: u32) -> u32 { return seqs[2u * P.batches + 1u + b]; }
fn page_of(b: u32, col: u32) -> u32 { return seqs[3u * P.batches + 1u + b * P.max_pages + col]; }

// Batch of output window row w: the last b with win_off(b) <= w.
fn batch_of(w: u32) -> u32 {
    var lo = 0u;
    var hi = P.batches;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (win_off(mid) <= w) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// Element `e` of the step's output space and, when `two`, element e + 1 (e even: both lie in
// one window row, N·width being even): their values (x, y) and the cache index of e (z), or
// NO_WORD in z, flagged, when a length, page or block is out of range. The window's checks and
// each tap's page lookup serve both; each value is still summed in tap order.
fn elements(e: u32, two: bool) -> vec3<u32> {
    let row = P.heads * P.width;
    let w = e / row;
    let rem = e % row;
    let n = rem / P.width;
    let c = rem % P.width;
    let n1 = (rem + 1u) / P.width;
    let c1 = (rem + 1u) % P.width;
    let b = batch_of(w);
    if (P.batches == 0u || w < win_off(b) || w >= win_off(b + 1u)) {
        atomicOr(&flags, FLAG_NSA_LENGTHS);
        return vec3<u32>(0u, 0u, NO_WORD);
    }
    let i = first_win(b) + (w - win_off(b));
    let start = i * P.d;
    if (start + P.l > raw_len(b)) {
        atomicOr(&flags, FLAG_NSA_LENGTHS);
        return vec3<u32>(0u, 0u, NO_WORD);
    }
    let col = i / P.cmp_page;
    if (col >= P.max_cmp_blocks) {
        atomicOr(&flags, FLAG_PAGE_SLOT);
        return vec3<u32>(0u, 0u, NO_WORD);
    }
    let blk = table[b * P.max_cmp_blocks + col];
    if (blk >= P.cmp_blocks) {
        atomicOr(&flags, FLAG_PAGE);
        return vec3<u32>(0u, 0u, NO_WORD);
    }
    var acc = 0.0;
    var acc1 = 0.0;
    for (var t = 0u; t < P.l; t++) {
        let pos = start + t;
        let pc = pos / P.page_size;
        if (pc >= P.max_pages) {
            atomicOr(&flags, FLAG_PAGE_SLOT);
            return vec3<u32>(0u, 0u, NO_WORD);
        }
        let page = page_of(b, pc);
        if (page >= P.num_pages) {
            atomicOr(&flags, FLAG_PAGE);
            return vec3<u32>(0u, 0u, NO_WORD);
        }
        let at = page * P.page_stride + P.plane_off + (pos % P.page_size) * P.heads * P.head_dim;
        acc += ld_w(t * P.heads + n) * ld_pool(at + n * P.head_dim + c);
        if (two) {
            acc1 += ld_w(t * P.heads + n1) * ld_pool(at + n1 * P.head_dim + c1);
        }
    }
    let dst = (blk * P.cmp_page + i % P.cmp_page) * row + rem;
    return vec3<u32>(bitcast<u32>(acc), bitcast<u32>(acc1), dst);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let word = (wg.y * nwg.x + wg.x) * 64u + lid;
    if (word >= P.words) {
        return;
    }
    if (T_KIND == 0u) {
        let v = elements(word, false);
        if (v.z != NO_WORD) {
            cache[v.z] = v.x;
        }
        return;
    }
    // Elements 2·word and 2·word + 1 share one cache word.
    let e = 2u * word;
    let two = e + 1u < P.total;
    let v = elements(e, two);
    if (v.z == NO_WORD) {
        return;
    }
    var bits = t_bits(bitcast<f32>(v.x), v.z);
    if (two) {
        bits |= t_bits(bitcast<f32>(v.y), v.z + 1u);
    }
    cache[t_word(v.z)] = bits;
}
