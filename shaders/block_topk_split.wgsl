// block_topk (SPEC §5) for a few wide rows on a GPU: each row's work spread over many
// workgroups, where the `wide` kernel (block_topk.wgsl) runs one workgroup per row, one
// multiprocessor of the device, through a chain of passes over the row. Two dispatches over
// the same bindings plus a scratch buffer, with the `wide` kernel's outputs bit for bit:
//
// `wide_part`, P = ⌈W / PART_W⌉ workgroups per row. Each finds the row's sampled threshold T
//   (step 1 of block_topk.wgsl: every part repeats it, which costs less than a dispatch), and
//   with T found compacts the keys >= T of its PART_W columns, in column order, into its part
//   of the scratch, and stores how many. Without T (fewer candidates sampled than its rank)
//   it stores 0.
// `wide_merge`, Q workgroups per row. The counts' prefix gives each part's first position;
//   when the row kept between k and MAX_K keys (the condition under which `wide` keeps T),
//   every workgroup loads the kept keys into workgroup memory in column order, as `wide`'s
//   compaction would have left them, and ranks an eighth of the owners (steps 4 and 5 as
//   in `wide`); workgroup 0 also writes the padding, the count and the route's tail.
//   Otherwise (no T, too few or too many keys kept) workgroup 0 runs the whole `wide` kernel
//   on the row and the others leave.
//
// Scratch (binding 8, u32 words, rows = P.rows): keys at [row · W + c], where part j's keys
// start at c = j · PART_W; their columns at [rows · W + row · W + c]; the counts at
// [2 · rows · W + row · P + j].

//#include common/block_topk.wgsl

@group(0) @binding(8) var<storage, read_write> cand: array<u32>;

const PART_W: u32 = 1024u;  // columns per part: 4 per invocation
const Q: u32 = 8u;          // merge workgroups per row

fn parts() -> u32 {
    return (P.w + PART_W - 1u) / PART_W;
}

// (row, workgroup within the row) of workgroup wg, for n workgroups per row.
fn row_and_index(wg: vec3<u32>, nwg: vec3<u32>, n: u32) -> vec2<u32> {
    let id = wg.y * nwg.x + wg.x;
    return vec2<u32>(id / n, id % n);
}

// The scratch word of the column kept at word `at` (a key's word).
fn col_word(at: u32) -> u32 {
    return P.rows * P.w + at;
}

// The scratch word of part j's count in row `row` (of np parts).
fn count_word(row: u32, np: u32, j: u32) -> u32 {
    return 2u * P.rows * P.w + row * np + j;
}

@compute @workgroup_size(256)
fn wide_part(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let np = parts();
    let rj = row_and_index(wg, nwg, np);
    let row = rj.x;
    let j = rj.y;
    if (row >= P.rows) {
        return;
    }
    let base = row * P.w;
    if (lid == 0u) {
        thr_s = 0u;
    }
    sample_threshold(base, lid);
    let t = workgroupUniformLoad(&thr_s);
    if (t == 0u) {
        if (lid == 0u) {
            cand[count_word(row, np, j)] = 0u;
        }
        return;
    }
    // Columns c0 .. c0 + 3 of the part: a vec4 where rows start on one.
    let c0 = j * PART_W + 4u * lid;
    var keys = vec4<u32>(0u);
    if ((P.w & 3u) == 0u) {
        if (c0 < P.w) {
            let v = scores[(base + c0) >> 2u];
            keys = vec4<u32>(key_of(v.x), key_of(v.y), key_of(v.z), key_of(v.w));
        }
    } else {
        for (var i = 0u; i < 4u; i++) {
            if (c0 + i < P.w) {
                keys[i] = key_of(score_bits(base + c0 + i));
            }
        }
    }
    // Key 0 (−inf, not a candidate, and the columns past W) is below every T >= 1.
    let kept4 = keys >= vec4<u32>(t);
    let mine = u32(kept4.x) + u32(kept4.y) + u32(kept4.z) + u32(kept4.w);
    scan_counts(lid, mine);
    var pos = base + j * PART_W + sfx[lid] + part[lid >> 4u];
    for (var i = 0u; i < 4u; i++) {
        if (kept4[i]) {
            cand[pos] = keys[i];
            cand[col_word(pos)] = c0 + i;
            pos += 1u;
        }
    }
    if (lid == 0u) {
        cand[count_word(row, np, j)] = kept;
    }
}

@compute @workgroup_size(256)
fn wide_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let np = parts();
    let rq = row_and_index(wg, nwg, Q);
    let row = rq.x;
    let q = rq.y;
    if (row >= P.rows) {
        return;
    }
    // The parts' counts, scanned: part j's first position is sfx[j] + part[j >> 4]; `kept`
    // is the row's total. This also clears `scol`.
    var mine = 0u;
    if (lid < np) {
        mine = cand[count_word(row, np, lid)];
    }
    scan_counts(lid, mine);
    let total = workgroupUniformLoad(&kept);
    if (total < P.k || total > MAX_K) {
        if (q == 0u) {
            wide_select(row, lid);
            rank_write(row, lid);
        }
        return;
    }
    // Load the kept keys in column order: position p lies in the last part whose first
    // position is <= p (a binary search over at most 64 parts).
    let base = row * P.w;
    for (var p = lid; p < total; p += WG) {
        var lo = 0u;
        var hi = np;  // first position of part lo <= p < first position of part hi
        loop {
            if (hi - lo <= 1u) {
                break;
            }
            let mid = (lo + hi) / 2u;
            if (sfx[mid] + part[mid >> 4u] <= p) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let at = base + lo * PART_W + (p - sfx[lo] - part[lo >> 4u]);
        put_entry(p, cand[at], cand[col_word(at)]);
    }
    workgroupBarrier();
    let m = rank_begin(lid);
    // This workgroup's owners of eight positions each: its Q-th of the ⌈m / 8⌉ there are.
    let per = ((m + 7u) / 8u + Q - 1u) / Q;
    let o = q * per + lid;
    let rt = route_of(P.out_base + row);
    if (lid < per) {
        let r = owner_ranks(8u * o, m);
        rank_place_at(row, 8u * o, m, r.a, r.b, rt);
    }
    if (q == 0u) {
        rank_tail(row, lid, m, WG, rt);
    }
}
