// sparse_attention, stage 1 of 3: routes each token list to the pool shards. Every counted
// entry of a (row, selection group) list is resolved through the page table — every step
// checked; a bad value is flagged and the entry dropped, never read — into its shard k =
// page / shard_pages and its offset in that shard (page % shard_pages, row, without the KV
// head, layer and plane, which stage 2 adds). The kept entries are written grouped by shard,
// in list order within a shard, after the shards' start offsets (layout in
// common/attention.wgsl), so the partial pass over one shard reads only its own rows.
//
// One workgroup per (row, group). Pass 1 counts each shard's entries, chunk by chunk (lane j:
// entry j of the chunk); a prefix gives the starts; pass 2 resolves again and places each
// entry at its shard's cursor plus the number of same-shard entries before it in the chunk
// (a 64-bit mask per shard, two sets used alternately so a chunk never waits for the clearing
// of the previous one).

//#include common/flags.wgsl
//#include common/attention.wgsl

// 1 when the page size and the pages per shard are powers of two: the divisions by them are
// shifts (on llvmpipe an integer division of a vector is eight scalar ones).
override POW2: u32 = 0u;

const TK: u32 = 64u;
const MAX_SHARDS: u32 = 64u;
const NO_ROW: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> P: SparseAttentionParams;
@group(0) @binding(1) var<storage, read> seqs: array<u32>;           // [N+1 | N | N·max_pages] u32: row_offsets, cache_lengths, page_table
@group(0) @binding(2) var<storage, read> token_indices: array<i32>;  // [T, Hs, W] i32
@group(0) @binding(3) var<storage, read> token_count: array<i32>;    // [T, Hs] i32
@group(0) @binding(4) var<storage, read_write> routes: array<u32>;   // [rows, Hs, shards + 1 + W] u32
@group(0) @binding(5) var<storage, read_write> flags: atomic<u32>;

// Per shard: entries counted (pass 1), then the next free slot (pass 2).
var<workgroup> cursor: array<atomic<u32>, MAX_SHARDS>;
// Two sets of [shard][2 words]: which lanes of the chunk hold an entry of that shard.
var<workgroup> bits: array<atomic<u32>, 256>;
// The row's sequence, position and token count (0 when the row is unusable).
var<workgroup> row_info: vec4<u32>;

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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows * P.hs) {
        return;
    }
    let rr = id / P.hs;
    let g = id % P.hs;
    let t = P.row_base + rr;
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
    for (var i = lid; i < MAX_SHARDS; i += TK) {
        atomicStore(&cursor[i], 0u);
    }
    for (var i = lid; i < 4u * MAX_SHARDS; i += TK) {
        atomicStore(&bits[i], 0u);
    }
    let info = workgroupUniformLoad(&row_info);
    let n = info.x;
    let p = info.y;
    let cnt = info.z;
    let list = (t * P.hs + g) * P.w;
    let out = (rr * P.hs + g) * (P.shards + 1u + P.w);

    // Pass 1: each shard's count.
    for (var c = 0u; c < cnt; c += TK) {
        if (c + lid < cnt) {
            let r = resolve(n, p, token_indices[list + c + lid], true);
            if (r.x != NO_ROW) {
                atomicAdd(&cursor[r.x], 1u);
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        var start = 0u;
        for (var k = 0u; k < P.shards; k++) {
            let c = atomicLoad(&cursor[k]);
            routes[out + k] = start;
            atomicStore(&cursor[k], start);
            start += c;
        }
        routes[out + P.shards] = start;
    }
    workgroupBarrier();

    // Pass 2: place each kept entry.
    var half = 0u;
    for (var c = 0u; c < cnt; c += TK) {
        var r = vec2<u32>(NO_ROW, 0u);
        if (c + lid < cnt) {
            r = resolve(n, p, token_indices[list + c + lid], false);
        }
        let mask = half + 2u * min(r.x, MAX_SHARDS - 1u);
        if (r.x != NO_ROW) {
            atomicOr(&bits[mask + lid / 32u], 1u << (lid % 32u));
        }
        workgroupBarrier();
        var first = false;
        var total = 0u;
        if (r.x != NO_ROW) {
            let b0 = atomicLoad(&bits[mask]);
            let b1 = atomicLoad(&bits[mask + 1u]);
            var before = countOneBits(b0 & ((1u << (lid % 32u)) - 1u));
            if (lid >= 32u) {
                before = countOneBits(b0) + countOneBits(b1 & ((1u << (lid - 32u)) - 1u));
            }
            routes[out + P.shards + 1u + atomicLoad(&cursor[r.x]) + before] = r.y;
            first = before == 0u;
            total = countOneBits(b0) + countOneBits(b1);
        }
        workgroupBarrier();
        // The shard's first entry of the chunk moves its cursor and clears its mask (the next
        // chunk uses the other set).
        if (first) {
            atomicAdd(&cursor[r.x], total);
            atomicStore(&bits[mask], 0u);
            atomicStore(&bits[mask + 1u], 0u);
        }
        half = 2u * MAX_SHARDS - half;
    }
}
