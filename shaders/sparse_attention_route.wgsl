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
//#include common/attention_route.wgsl

const TK: u32 = 64u;
const MAX_SHARDS: u32 = 64u;

// Per shard: entries counted (pass 1), then the next free slot (pass 2).
var<workgroup> cursor: array<atomic<u32>, MAX_SHARDS>;
// Two sets of [shard][2 words]: which lanes of the chunk hold an entry of that shard.
var<workgroup> bits: array<atomic<u32>, 256>;
// The row's sequence, position and token count (0 when the row is unusable).
var<workgroup> row_info: vec4<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows * P.hs) {
        return;
    }
    let l = list_of(id);
    let rr = l.x;
    let g = l.y;
    let t = l.z;
    if (lid == 0u) {
        row_info = vec4<u32>(route_info(t, g, true), 0u);
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
