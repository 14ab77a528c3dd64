// block_topk (SPEC §5), subgroup variants (chosen where subgroups are 8 lanes). The keys,
// the order and steps 1 to 5 are those of `block_topk.wgsl` (shared part in
// common/block_topk.wgsl), except:
//
// Entry `row_sg`, short rows (W <= SHORT_W = 2112, as in prefill and NSA's selection): one row
// per workgroup of 8 invocations, i.e. per subgroup (the host picks it only where subgroups
// are exactly 8 lanes). Lane l takes the columns [l · chunk, (l + 1) · chunk) (chunk a
// multiple of 4, at most 264), loads their keys once into a private array and reads that in
// every later pass. Every sum over the lanes is a `subgroupShuffleXor` butterfly that leaves
// it in every lane, so every lane takes the same decisions, with no workgroup memory and no
// barrier until the compaction.
// 2'. Refinement instead of the radix select. The threshold is a whole key T (columns
//     ignored) with at least min(k, candidates) keys >= T. Invariant: the k-th best key lies
//     in [lo, hi], at first the row's smallest and largest candidate keys ([1, +inf's key]
//     when there is none; from all keys' range, round 0 mostly split off empty parts of 32
//     binades each). Each round counts, for 16 thresholds lo + j · step
//     (step = (hi - lo) / 16 + 1), the keys at or above each one: vector compares into 16-bit
//     fields, summed over the subgroup. The last threshold with at least k keys at or above it
//     becomes lo, the next one minus one hi. It stops once the keys >= lo exceed k by at most
//     SLACK (the ranking drops the ranks >= k and orders ties by column), when the range is one
//     key, or after REFINE_ROUNDS (4 bits per round: the range is one key by then). With at
//     most k candidates (round 0's count at its first threshold, the smallest candidate) every
//     candidate is kept. Every key of such a row fits the ranking (W <= SLOTS), so any lo the
//     refinement ends with is exact.
// 3'. Compaction by buckets: the winners' range [lo, top] is cut into 16 buckets
//     [u_j, u_{j+1}), u_j = lo + j · bstep; one counting pass (as a round's) gives each lane
//     its keys at or above each u_j, and `subgroupShuffleUp` scans of those give the lanes
//     before it and the totals. Entries go bucket by bucket from the top one, and within a
//     bucket in column order (lanes hold consecutive columns): an entry's position is its
//     bucket's start, plus that bucket's entries in the lanes before, plus the lane's entries
//     of the bucket placed so far.
// 4'. The ranking (`rank_counts`) by owner blocks of 64 positions, lane l owning 8 of each.
//     Every entry of a bucket above a block's buckets comes before each of its entries and
//     none below does, so a block compares only the quads of its own buckets (from the quad
//     of its first bucket's start to that of its last one's end) and adds the entries before
//     them, instead of comparing against every winner. The lanes read 8 quads of keys at once and `subgroupShuffle` hands each to all, where every owner read
//     every quad itself. Entry `wide_sg` ranks the same way (`rank_sg`: one block per
//     invocation of 256, all quads) after the wide rows' steps 1 to 3.
//
// Why (lavapipe, docs/perf.md): llvmpipe runs a workgroup's invocations 8 at a time on one
// thread, switching between them at every barrier; a read of workgroup memory at an address
// that differs by lane, and a `subgroupAdd`, are each a loop over the 8 lanes; a shuffle is
// one vector permute. Prefill-8k top-k: 0.87 s with the radix select (its passes ~0.53 s);
// 0.48 s with the refinement, scan and ranking above in workgroups of 256 (the counts summed
// through one store per subgroup and barriers); ~0.46 s starting from the row's own range;
// 0.25 s with one row per subgroup (the ranking ~0.13 s of it); 0.19 s with the buckets
// (ranking ~0.06 s); ~0.16 s with the keys in a private array. The refinement summed
// through workgroup memory (portable, no subgroups) measured no faster than the radix select
// (0.85 s), so the portable kernel keeps the radix select.

//#include common/block_topk.wgsl

const REFINE_ROUNDS: u32 = 10u;  // 32 bits, 4 per round: the range is one key by then

// The keys of columns c .. c + 3 of row `base`, 0 from c1 on; one vec4 load when rows start
// on a vec4 (v4).
fn keys4(base: u32, c: u32, c1: u32, v4: bool) -> vec4<u32> {
    let last = max(P.rows * P.w, 1u) - 1u;  // loads stay in the buffer; the keys are masked
    let n = vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u);
    var b = vec4<u32>(0u);
    if (v4) {
        b = scores[min(base + c, last) >> 2u];
    } else {
        b = vec4<u32>(score_bits(min(base + n.x, last)), score_bits(min(base + n.y, last)),
                      score_bits(min(base + n.z, last)), score_bits(min(base + n.w, last)));
    }
    let k = vec4<u32>(key_of(b.x), key_of(b.y), key_of(b.z), key_of(b.w));
    return select(vec4<u32>(0u), k, n < vec4<u32>(c1));
}

// 16-bit counts of the keys x at or above the thresholds ta (low halves) and tb (high).
fn count2(x: vec4<u32>, ta: vec4<u32>, tb: vec4<u32>) -> vec4<u32> {
    let zero = vec4<u32>(0u);
    let lo = vec4<u32>(1u);
    let hi = vec4<u32>(0x10000u);
    return select(zero, lo, vec4<u32>(x.x) >= ta) + select(zero, hi, vec4<u32>(x.x) >= tb)
        + select(zero, lo, vec4<u32>(x.y) >= ta) + select(zero, hi, vec4<u32>(x.y) >= tb)
        + select(zero, lo, vec4<u32>(x.z) >= ta) + select(zero, hi, vec4<u32>(x.z) >= tb)
        + select(zero, lo, vec4<u32>(x.w) >= ta) + select(zero, hi, vec4<u32>(x.w) >= tb);
}

// The sum over the subgroup (ssz lanes, a power of two), in every lane: a butterfly of
// `subgroupShuffleXor`s, each one vector permute on llvmpipe, where `subgroupAdd` is a loop
// over the lanes through memory (~3 × slower for a vec4 of 8 lanes).
fn subgroup_sum(v: vec4<u32>, ssz: u32) -> vec4<u32> {
    var s = v;
    for (var m = 1u; m < ssz; m <<= 1u) {
        s += subgroupShuffleXor(s, m);
    }
    return s;
}

// (largest x, smallest y) over the subgroup, in every lane: a butterfly of shuffles.
fn subgroup_extent(v: vec2<u32>, ssz: u32) -> vec2<u32> {
    var e = v;
    for (var m = 1u; m < ssz; m <<= 1u) {
        let o = subgroupShuffleXor(e, m);
        e = vec2<u32>(max(e.x, o.x), min(e.y, o.y));
    }
    return e;
}

// Steps 4 and 5 of entry `wide_sg`: invocation lid owns positions 8 lid .. 8 lid + 7.
fn rank_sg(id: u32, lid: u32, sl: u32, ssz: u32) {
    let m = rank_begin(lid);
    let r = rank_counts(lid, sl, ssz, m, vec2<u32>(0u, (m + 3u) >> 2u));
    rank_end(id, lid, m, r[0], r[1]);
}

// Step 4 with the keys handed on by shuffles: the ranks (ra, rb) of the entries at positions
// 8 lid .. 8 lid + 7 among the m of `skey` (padded to whole quads). Where every owner read
// every quad of `skey` (one loop over the lanes per read on llvmpipe), the lanes of a subgroup
// read ssz quads at once, one each, and `subgroupShuffle` gives each to all. Quads before
// every owner's in the subgroup count equal keys (ge), quads after all of them only larger
// ones (gt); the few between, which hold the owners' own quads, are shuffled the same way and
// each lane compares them as `rank_write` does. The same counts as `rank_write`, so the same
// ranks.
fn rank_counts(lid: u32, sl: u32, ssz: u32, m: u32, span: vec2<u32>) -> array<vec4<u32>, 2> {
    let p0 = 8u * lid;
    let own = p0 < m;
    let q0 = span.x;  // every entry before quad q0 comes before the owned ones ...
    let nq = span.y;  // ... and none from quad nq on
    let ka = skey[min(p0 >> 2u, SLOTS / 4u - 1u)];
    let kb = skey[min((p0 >> 2u) + 1u, SLOTS / 4u - 1u)];
    let pa = vec4<u32>(p0, p0 + 1u, p0 + 2u, p0 + 3u);
    let pb = pa + vec4<u32>(4u);
    let qo = clamp(p0 >> 2u, q0, nq);
    // The subgroup's quads before every owner's [q0, qa) and after them all [qb, nq); nothing
    // for a subgroup without owners.
    let qa = subgroupMin(select(nq, qo, own));
    let qb = min(subgroupMax(select(0u, qo + 2u, own)), nq);
    let any_own = subgroupAny(own);
    var ra = vec4<u32>(4u * q0);
    var rb = vec4<u32>(4u * q0);
    for (var b = q0; b < select(q0, qa, any_own); b += ssz) {
        let mine = skey[min(b + sl, qa - 1u)];
        for (var i = 0u; i < min(ssz, qa - b); i++) {
            let v = subgroupShuffle(mine, i);
            ra += ge4(v, ka);
            rb += ge4(v, kb);
        }
    }
    // The quads between are read as the others are, ssz at a time and shuffled to every lane:
    // read one by one, each read was a loop over the lanes for the same address.
    let qe = select(qa, qb, any_own);
    for (var b = qa; b < qe; b += ssz) {
        let mine = skey[min(b + sl, qe - 1u)];
        for (var i = 0u; i < min(ssz, qe - b); i++) {
            let v = subgroupShuffle(mine, i);
            let q = b + i;
            let before = vec4<u32>(select(0u, 1u, q < qo));
            let after = vec4<u32>(select(0u, 1u, q >= qo + 2u));
            ra += before * ge4(v, ka) + after * gt4(v, ka);
            rb += before * ge4(v, kb) + after * gt4(v, kb);
            if (q >= qo && q < qo + 2u) {
                ra += before_quad(v, q, pa, ka);
                rb += before_quad(v, q, pb, kb);
            }
        }
    }
    for (var b = qb; b < select(qb, nq, any_own); b += ssz) {
        let mine = skey[min(b + sl, nq - 1u)];
        for (var i = 0u; i < min(ssz, nq - b); i++) {
            let v = subgroupShuffle(mine, i);
            ra += gt4(v, ka);
            rb += gt4(v, kb);
        }
    }
    return array<vec4<u32>, 2>(ra, rb);
}

// Count j (0 ..= 15) of the totals: lane c of p0 holds thresholds c and c + 4, of p1 c + 8 and
// c + 12 (low and high halves).
fn total_of(p0: vec4<u32>, p1: vec4<u32>, j: u32) -> u32 {
    let w = select(p0[j & 3u], p1[j & 3u], j >= 8u);
    return (w >> (16u * ((j >> 2u) & 1u))) & 0xffffu;
}

// One round of the refinement of step 2' from its counts (s0, s1) of the keys at or above the
// thresholds lo + j · step: the last j whose count is at least `want` (j = 0, lo itself, holds
// at least `want` by the invariant) becomes the range (new lo, new hi), returned with its count.
fn refine_step(lo: u32, hi: u32, step: u32, s0: vec4<u32>, s1: vec4<u32>, want: u32) -> vec3<u32> {
    var j = 15u;
    var at = total_of(s0, s1, j);
    loop {
        if (j == 0u || at >= want) {
            break;
        }
        j--;
        at = total_of(s0, s1, j);
    }
    let t = lo + j * step;
    return vec3<u32>(t, select(hi, min(hi, t + step - 1u), j < 15u), at);
}

// Step 1 of a wide row in one subgroup (entry `wide_sg`): the sampled threshold, from the
// sample in a private array. Lane sl holds samples sl · n … sl · n + n − 1 (n = SAMPLE / ssz:
// 16 quads at 8 lanes, the only subgroup size `wide_sg` is chosen for). The refinement of step
// 2', run until its range is one key, gives the largest key v with at least goal + 1 samples
// >= v: the key of rank `goal` (by descending key) that `wide_select` finds by ranking the
// sample in workgroup memory, hence the same threshold and the same selection. That ranking
// (sixteen SIMD vectors each reading the sample's 128 quads from workgroup memory, between two
// barriers) made the decode row's top-k ~0.025 ms slower on lavapipe (0.256 against 0.231 ms).
fn sample_threshold_sg(base: u32, sl: u32, ssz: u32) -> u32 {
    let goal = sample_goal();
    let nq = min(SAMPLE / (4u * ssz), 16u);
    var kv = array<vec4<u32>, 16>();
    for (var i = 0u; i < nq; i++) {
        let s = 4u * (sl * nq + i);
        kv[i] = vec4<u32>(sample_key(base, s), sample_key(base, s + 1u),
                          sample_key(base, s + 2u), sample_key(base, s + 3u));
    }
    var lo = 0u;           // at least goal + 1 samples are >= lo (all are >= 0)
    var hi = 0xff800000u;  // the largest key (+inf): the threshold is at most hi
    for (var round = 0u; round < REFINE_ROUNDS; round++) {
        if (lo == hi) {
            break;
        }
        let step = (hi - lo) / 16u + 1u;
        let th = thresholds16(lo, step);
        var p0 = vec4<u32>(0u);
        var p1 = vec4<u32>(0u);
        for (var i = 0u; i < nq; i++) {
            p0 += count2(kv[i], th[0], th[1]);
            p1 += count2(kv[i], th[2], th[3]);
        }
        let s0 = subgroup_sum(p0, ssz);  // at most SAMPLE per field
        let s1 = subgroup_sum(p1, ssz);
        let r = refine_step(lo, hi, step, s0, s1, goal + 1u);
        lo = r.x;
        hi = r.y;
    }
    return lo;
}

// Wide rows (`wide` of block_topk.wgsl, decode over a long context) with the subgroup ranking.
@compute @workgroup_size(256)
fn wide_sg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32,
           @builtin(subgroup_invocation_id) sl: u32, @builtin(subgroup_size) ssz: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    let base = id * P.w;
    init_state(lid);
    // Step 1 by the subgroup that holds invocation 0 (which stores the threshold after its
    // own `init_state`), the others going straight on to the barrier of step 2.
    if (subgroupMin(lid) == 0u) {
        let t = sample_threshold_sg(base, sl, ssz);
        if (lid == 0u) {
            thr_s = t;
        }
    }
    wide_compact(base, lid);
    rank_sg(id, lid, sl, ssz);
}

// The 16 thresholds lo + j · step, four per vector (j = 4i + lane of vector i), as count2 and
// total_of take them.
fn thresholds16(lo: u32, step: u32) -> array<vec4<u32>, 4> {
    let t0 = vec4<u32>(lo) + vec4<u32>(0u, 1u, 2u, 3u) * step;
    let t1 = t0 + vec4<u32>(4u * step);
    let t2 = t1 + vec4<u32>(4u * step);
    return array<vec4<u32>, 4>(t0, t1, t2, t2 + vec4<u32>(4u * step));
}

// The bucket (0 ..= 15) of a key x >= u_0: how many of u_1 .. u_15 it reaches.
fn bucket_of(x: u32, u: array<vec4<u32>, 4>) -> u32 {
    let zero = vec4<u32>(0u);
    let one = vec4<u32>(1u);
    let v = vec4<u32>(x);
    let c = select(zero, one, v >= u[0]) + select(zero, one, v >= u[1])
        + select(zero, one, v >= u[2]) + select(zero, one, v >= u[3]);
    return c.x + c.y + c.z + c.w - 1u;
}

// The bucket of position p < m, given the counts at or above each u_j (16-bit fields, as
// total_of reads them): bucket j holds positions [T_{j+1}, T_j), so it is how many of
// T_1 .. T_15 exceed p.
fn position_bucket(ta: vec4<u32>, tb: vec4<u32>, p: u32) -> u32 {
    let zero = vec4<u32>(0u);
    let one = vec4<u32>(1u);
    let v = vec4<u32>(p);
    let low = vec4<u32>(0xffffu);
    let c = select(zero, one, (ta & low) > v) + select(zero, one, (ta >> vec4<u32>(16u)) > v)
        + select(zero, one, (tb & low) > v) + select(zero, one, (tb >> vec4<u32>(16u)) > v);
    return c.x + c.y + c.z + c.w - 1u;  // T_0 = m > p
}

// The first position of bucket j: the entries of the buckets above it.
fn bucket_start(ta: vec4<u32>, tb: vec4<u32>, j: u32) -> u32 {
    return select(0u, total_of(ta, tb, j + 1u), j < 15u);
}

// Short rows, one row per subgroup: steps 1 to 5 as described at the top (2', 3', 4').
const RL: u32 = 8u;  // invocations of row_sg's workgroup

@compute @workgroup_size(8)
fn row_sg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(subgroup_invocation_id) sl: u32, @builtin(subgroup_size) ssz: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    let base = id * P.w;
    let v4 = (P.w & 3u) == 0u;
    let chunk = ((P.w + 4u * RL - 1u) / (4u * RL)) * 4u;
    let c0 = min(sl * chunk, P.w);
    let c1 = min(c0 + chunk, P.w);
    // The first range: the row's smallest and largest candidate keys.
    let none = vec4<u32>(0xffffffffu);
    var big = vec4<u32>(0u);
    var small = none;
    var kv = array<vec4<u32>, 66>();  // the lane's keys (at most 264: W <= SLOTS)
    for (var c = c0; c < c1; c += 4u) {
        let x = keys4(base, c, c1, v4);
        kv[(c - c0) >> 2u] = x;
        big = max(big, x);
        small = min(small, select(none, x, x != vec4<u32>(0u)));
    }
    let e = subgroup_extent(vec2<u32>(max(max(big.x, big.y), max(big.z, big.w)),
                                      min(min(small.x, small.y), min(small.z, small.w))), ssz);
    var lo = select(1u, e.y, e.x != 0u);
    var hi = select(0xff800000u, e.x, e.x != 0u);
    for (var round = 0u; round < REFINE_ROUNDS; round++) {
        let step = (hi - lo) / 16u + 1u;
        let th = thresholds16(lo, step);
        var p0 = vec4<u32>(0u);
        var p1 = vec4<u32>(0u);
        for (var c = c0; c < c1; c += 4u) {
            let x = kv[(c - c0) >> 2u];
            p0 += count2(x, th[0], th[1]);
            p1 += count2(x, th[2], th[3]);
        }
        let s0 = subgroup_sum(p0, ssz);  // at most W <= SLOTS per field
        let s1 = subgroup_sum(p1, ssz);
        if (round == 0u && total_of(s0, s1, 0u) <= P.k) {
            break;  // at most k candidates: all are kept
        }
        let r = refine_step(lo, hi, step, s0, s1, P.k);
        lo = r.x;
        hi = r.y;
        if (r.z - P.k <= SLACK || lo == hi) {
            break;
        }
    }
    // Compaction into 16 buckets of the winners' range [lo, top]: bucket j holds the keys in
    // [u_j, u_{j+1}) (u_j = lo + j · bstep), and the entries go bucket by bucket from the top
    // one, in column order within each (lanes hold consecutive columns). Counts at or above
    // each u_j, per lane (q) and over the lanes before it (ex) and all (all), in 16-bit fields.
    let top = max(e.x, lo);
    let u = thresholds16(lo, (top - lo) / 16u + 1u);
    var ma = vec4<u32>(0u);  // the lane's winners, a bit per column of its chunk
    var mb = vec4<u32>(0u);
    var mc = 0u;
    var qa = vec4<u32>(0u);
    var qb = vec4<u32>(0u);
    for (var c = c0; c < c1; c += 4u) {
        let x = kv[(c - c0) >> 2u];
        let b = select(vec4<u32>(0u), vec4<u32>(1u, 2u, 4u, 8u), x >= vec4<u32>(lo));
        set_bits(&ma, &mb, &mc, c - c0, b.x | b.y | b.z | b.w);
        qa += count2(x, u[0], u[1]);
        qb += count2(x, u[2], u[3]);
    }
    var ia = qa;
    var ib = qb;
    for (var d = 1u; d < ssz; d <<= 1u) {
        let ta = subgroupShuffleUp(ia, d);
        let tb = subgroupShuffleUp(ib, d);
        ia += select(vec4<u32>(0u), ta, sl >= d);
        ib += select(vec4<u32>(0u), tb, sl >= d);
    }
    let alla = subgroupShuffle(ia, ssz - 1u);
    let allb = subgroupShuffle(ib, ssz - 1u);
    let exa = ia - qa;
    let exb = ib - qb;
    let mine = total_of(qa, qb, 0u);
    let m = total_of(alla, allb, 0u);  // <= W <= SLOTS
    for (var i = sl; i < (m + 1u) / 2u; i += RL) {
        atomicStore(&scol[i], 0u);
    }
    if (sl == 0u) {
        nsel = m;
    }
    workgroupBarrier();
    var ra = vec4<u32>(0u);  // the lane's entries placed so far, per bucket
    var rb = vec4<u32>(0u);
    let words = select(0u, (c1 - c0 + 31u) / 32u, mine != 0u);
    for (var wi = 0u; wi < words; wi++) {
        var bits = mask_word(ma, mb, mc, wi);
        loop {
            if (bits == 0u) {
                break;
            }
            let c = c0 + 32u * wi + pop_bit(&bits);
            let x = kv[(c - c0) >> 2u][(c - c0) & 3u];
            let j = bucket_of(x, u);
            // Entries of the buckets above, of this bucket in the lanes before, and placed.
            let ex = total_of(exa, exb, j) - bucket_start(exa, exb, j);
            put_entry(bucket_start(alla, allb, j) + ex + total_of(ra, rb, j), x, c);
            let one = select(vec4<u32>(0u), vec4<u32>(1u << (16u * ((j >> 2u) & 1u))),
                             vec4<u32>(j & 3u) == vec4<u32>(0u, 1u, 2u, 3u));
            ra += select(vec4<u32>(0u), one, j < 8u);
            rb += select(one, vec4<u32>(0u), j < 8u);
        }
    }
    let n = rank_begin(sl);
    let nq = (n + 3u) >> 2u;
    let rt = route_of(P.out_base + id);
    // Each owner block of 64 positions compares only the quads of its buckets: entries in the
    // buckets above come before every one of its own, those below after.
    for (var ob = 0u; ob < (n + 8u * RL - 1u) / (8u * RL); ob++) {
        let first = 8u * RL * ob;
        let last = min(first + 8u * RL, n) - 1u;
        let start = bucket_start(alla, allb, position_bucket(alla, allb, first));
        let end = total_of(alla, allb, position_bucket(alla, allb, last));
        let r = rank_counts(RL * ob + sl, sl, ssz, n, vec2<u32>(start >> 2u, min((end + 3u) >> 2u, nq)));
        rank_place(id, RL * ob + sl, n, r[0], r[1], rt);
    }
    rank_tail(id, sl, n, RL, rt);
}
