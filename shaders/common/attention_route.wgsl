// The part of sparse_attention's routing stage (stage 1 of 3) that its two kernels share:
// sparse_attention_route.wgsl (described there; workgroups of 64) and its subgroup variant
// sparse_attention_route_sg.wgsl. The bindings, the row lookup and the resolution of one list
// entry to its pool shard and offset there.

// 1 when the page size and the pages per shard are powers of two: the divisions by them are
// shifts (on llvmpipe an integer division of a vector is eight scalar ones).
override POW2: u32 = 0u;

const NO_ROW: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> P: SparseAttentionParams;
@group(0) @binding(1) var<storage, read> seqs: array<u32>;           // [N+1 | N | N·max_pages] u32: row_offsets, cache_lengths, page_table
@group(0) @binding(2) var<storage, read> token_indices: array<i32>;  // [T, Hs, W] i32
@group(0) @binding(3) var<storage, read> token_count: array<i32>;    // [T, Hs] i32
@group(0) @binding(4) var<storage, read_write> routes: array<u32>;   // [rows, Hs, shards + 1 + W] u32
@group(0) @binding(5) var<storage, read_write> flags: atomic<u32>;

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

// x / d and x % d for d = the page size or the pages per shard.
fn div_by(x: u32, d: u32) -> u32 {
    if (POW2 != 0u) {
        return x >> countTrailingZeros(d);
    }
    return x / d;
}
fn rem_by(x: u32, d: u32) -> u32 {
    if (POW2 != 0u) {
        return x & (d - 1u);
    }
    return x % d;
}

// (shard, offset in the shard) of token `tok` of sequence n, or (NO_ROW, 0) — flagged when
// `flag` — when the token lies outside 0 ..= p or its page-table column or page is out of range.
fn resolve(n: u32, p: u32, tok: i32, flag: bool) -> vec2<u32> {
    var f = 0u;
    var r = vec2<u32>(NO_ROW, 0u);
    if (tok < 0 || u32(tok) > p) {
        f = FLAG_TOKEN;
    } else {
        let pos = u32(tok);
        let col = div_by(pos, P.page_size);
        if (col >= P.max_pages) {
            f = FLAG_PAGE_SLOT;
        } else {
            let page = seqs[2u * P.n + 1u + n * P.max_pages + col];
            if (page >= P.num_pages) {
                f = FLAG_PAGE;
            } else {
                r = vec2<u32>(div_by(page, P.shard_pages), rem_by(page, P.shard_pages) * P.page_stride
                              + rem_by(pos, P.page_size) * P.hkv * pool_dim());
            }
        }
    }
    if (flag && f != 0u) {
        atomicOr(&flags, f);
    }
    return r;
}

// The list of workgroup `id`: (row rr of the chunk, selection group g, query row t).
fn list_of(id: u32) -> vec3<u32> {
    let rr = id / P.hs;
    return vec3<u32>(rr, id % P.hs, P.row_base + rr);
}

// The (sequence n, position p, token count) of list (t, g), each 0 when the row is unusable
// (a flag raised when `flag`): a row outside its sequence's rows, or a count out of 0 ..= W
// (then clamped).
fn route_info(t: u32, g: u32, flag: bool) -> vec3<u32> {
    let n = seq_of(t);
    let start = seqs[n];
    if (t < start || t >= seqs[n + 1u]) {
        if (flag) {
            atomicOr(&flags, FLAG_LENGTHS);
        }
        return vec3<u32>(0u);
    }
    var cnt = token_count[t * P.hs + g];
    if (cnt < 0 || u32(cnt) > P.w) {
        if (flag) {
            atomicOr(&flags, FLAG_COUNT);
        }
        cnt = clamp(cnt, 0, i32(P.w));
    }
    return vec3<u32>(n, seqs[P.n + 1u + n] + (t - start), u32(cnt));
}
