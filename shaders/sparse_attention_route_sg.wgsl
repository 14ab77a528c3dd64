// sparse_attention, stage 1 of 3, subgroup variant: the routes of sparse_attention_route.wgsl
// (which describes them), bit for bit, and the same flags, from one subgroup per (row, group)
// with no workgroup memory and no barrier. Chosen where subgroups are exactly 8 lanes and the
// pool has at most 8 shards (lavapipe: its 128 MiB binding limit cuts the attention preset's
// pool into 4 shards in f32 and 2 in bf16).
//
// Lane j takes entry j of each chunk of 8. A shard's entries are counted in a one-hot pair of
// vec4 per lane (shards 0 … 3, 4 … 7), summed over the subgroup once after pass 1; their
// exclusive prefix gives the shards' starts. In pass 2 an inclusive shuffle-up scan of the
// one-hots gives each entry the same-shard entries before it in the chunk, and the last
// lane's scan moves the cursors. The generic kernel does the same with workgroup atomics and
// three barriers per chunk of 64 entries, which llvmpipe runs as coroutine switches between
// the workgroup's eight SIMD vectors.

//#include common/flags.wgsl
//#include common/attention.wgsl
//#include common/attention_route.wgsl

const RL: u32 = 8u;  // invocations of the workgroup: one subgroup

// One-hot of shard k (0 … 7) in two vec4 (shards 0 … 3, 4 … 7); zeros for NO_ROW.
fn onehot(k: u32) -> array<vec4<u32>, 2> {
    let kv = vec4<u32>(k);
    return array<vec4<u32>, 2>(select(vec4<u32>(0u), vec4<u32>(1u), kv == vec4<u32>(0u, 1u, 2u, 3u)),
                               select(vec4<u32>(0u), vec4<u32>(1u), kv == vec4<u32>(4u, 5u, 6u, 7u)));
}

// Component k (0 … 7) of the pair (a, b).
fn pick(a: vec4<u32>, b: vec4<u32>, k: u32) -> u32 {
    return select(b[k & 3u], a[k & 3u], k < 4u);
}

// Exclusive prefix of the components of v, from `base` on.
fn exclusive4(v: vec4<u32>, base: u32) -> vec4<u32> {
    return vec4<u32>(base, base + v.x, base + v.x + v.y, base + v.x + v.y + v.z);
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows * P.hs) {
        return;
    }
    let l = list_of(id);
    let rr = l.x;
    let g = l.y;
    let t = l.z;
    let info = route_info(t, g, sl == 0u);
    let n = info.x;
    let p = info.y;
    let cnt = info.z;
    let list = (t * P.hs + g) * P.w;
    let out = (rr * P.hs + g) * (P.shards + 1u + P.w);

    // Pass 1: each shard's count.
    var ca = vec4<u32>(0u);
    var cb = vec4<u32>(0u);
    for (var c = 0u; c < cnt; c += RL) {
        if (c + sl < cnt) {
            let o = onehot(resolve(n, p, token_indices[list + c + sl], true).x);
            ca += o[0];
            cb += o[1];
        }
    }
    ca = subgroupAdd(ca);
    cb = subgroupAdd(cb);
    let sa = exclusive4(ca, 0u);
    let sb = exclusive4(cb, sa.w + ca.w);
    if (sl < P.shards) {
        routes[out + sl] = pick(sa, sb, sl);
    }
    if (sl == 0u) {
        routes[out + P.shards] = sb.w + cb.w;
    }

    // Pass 2: place each kept entry at its shard's cursor plus the same-shard entries before it
    // in the chunk.
    var cur_a = sa;
    var cur_b = sb;
    let base = out + P.shards + 1u;
    for (var c = 0u; c < cnt; c += RL) {
        var r = vec2<u32>(NO_ROW, 0u);
        if (c + sl < cnt) {
            r = resolve(n, p, token_indices[list + c + sl], false);
        }
        let o = onehot(r.x);
        var ia = o[0];
        var ib = o[1];
        for (var d = 1u; d < RL; d <<= 1u) {
            let ta = subgroupShuffleUp(ia, d);
            let tb = subgroupShuffleUp(ib, d);
            ia += select(vec4<u32>(0u), ta, sl >= d);
            ib += select(vec4<u32>(0u), tb, sl >= d);
        }
        if (r.x != NO_ROW) {
            routes[base + pick(cur_a, cur_b, r.x) + pick(ia - o[0], ib - o[1], r.x)] = r.y;
        }
        cur_a += subgroupShuffle(ia, RL - 1u);
        cur_b += subgroupShuffle(ib, RL - 1u);
    }
}
