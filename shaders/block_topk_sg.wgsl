// block_topk (SPEC §5), subgroup variants (chosen where subgroups are 8 lanes). The keys,
// the order and steps 1 to 5 are those of `block_topk.wgsl` (shared part in
// common/block_topk.wgsl), except:
//
// Entry `main`, short rows (W <= 2048, as in prefill): each invocation of the row's workgroup
// of 256 holds its (at most 8) columns' keys in registers; its columns are chunk
// sub · ssz + lane, the order the scan below gives positions, so position order is column
// order whatever the invocations' layout in subgroups.
// 2'. Refinement instead of the radix select. The threshold is a whole key T (columns
//     ignored) with at least min(k, candidates) keys >= T. Invariant: the k-th best key lies
//     in [lo, hi], at first the row's smallest and largest candidate keys (found by
//     shuffles and one store per subgroup; [1, +inf's key] when there is no candidate:
//     starting from all keys' range, round 0 mostly split off 15 empty parts, 32 binades
//     each). Each round counts, for 16 thresholds
//     lo + j · step (step = (hi - lo) / 16 + 1), the keys at or above each one: compares in
//     registers into 16-bit fields, summed over the subgroup by a `subgroupShuffleXor`
//     butterfly, one store per subgroup, and subgroup 0 sums the subgroups' counts. The last
//     threshold with at least k keys at or above it becomes lo, the next one minus one hi. It
//     stops once the keys >= lo exceed k by at most SLACK (the ranking drops the ranks >= k and
//     orders ties by column), when the range is one key, or after REFINE_ROUNDS (4 bits per
//     round: the range is one key by then). With at most k candidates (round 0's count at
//     its first threshold, the smallest candidate) every candidate is kept. Every key of such a row fits the ranking
//     (W <= MAX_K), so any lo the refinement ends with is exact.
// 3'. The compaction's exclusive scan by `subgroupShuffleUp` within subgroups and one store
//     per subgroup, not through `sfx` in 16 groups of 16.
// 4'. The ranking (`rank_sg`, also entry `wide_sg` after the wide rows' steps 1 to 3): the
//     lanes of a subgroup read ssz quads of keys at once and `subgroupShuffle` hands each to
//     all, where every owner read every quad itself.
//
// Why (lavapipe, docs/perf.md): a read of workgroup memory at an address that differs by lane,
// and a `subgroupAdd`, are each a loop over the 8 lanes; a shuffle is one vector permute. The
// radix select's passes took ~0.53 s of the 8192-row prefill's 0.87 s top-k; with 2' (1.6
// rounds per row on average) top-k took 0.62 s, with the shuffles of 2', 3' and 4' 0.48 s.
// The refinement summed through workgroup memory (portable, no subgroups) measured no faster
// than the radix select (0.85 s), so the portable kernel keeps the radix select.

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

// The first position of an invocation's `mine` winners in (subgroup, lane) order: a
// Hillis-Steele scan of shuffles within the subgroup, then the totals of the subgroups before
// it (one store per subgroup). Clears `scol` and sets `kept` and `nsel` as `scan_counts` does.
fn scan_sg(lid: u32, mine: u32, sub: u32, nsub: u32, sl: u32, ssz: u32) -> u32 {
    clear_cols(lid);
    var inc = mine;
    for (var d = 1u; d < ssz; d <<= 1u) {
        let t = subgroupShuffleUp(inc, d);
        inc += select(0u, t, sl >= d);
    }
    if (sl == ssz - 1u) {
        sfx[sub] = inc;  // the subgroup's total
    }
    workgroupBarrier();
    var before = vec4<u32>(0u);  // x: totals of the subgroups before this one; y: all
    for (var g = sl; g < nsub; g += ssz) {
        let t = sfx[g];
        before += vec4<u32>(select(0u, t, g < sub), t, 0u, 0u);
    }
    before = subgroup_sum(before, ssz);
    if (lid == 0u) {
        kept = before.y;
        nsel = min(before.y, MAX_K);
    }
    workgroupBarrier();
    return before.x + inc - mine;
}

// Step 4 with the keys handed on by shuffles: where every owner read every quad of `skey`
// (one loop over the lanes per read on llvmpipe), the lanes of a subgroup read ssz quads at
// once, one each, and `subgroupShuffle` gives each to all. Quads before every owner's in the
// subgroup count equal keys (ge), quads after all of them only larger ones (gt); the few
// between, which hold the owners' own quads, each lane reads itself and compares as
// `rank_write` does. The same counts as `rank_write`, so the same ranks.
fn rank_sg(id: u32, lid: u32, sl: u32, ssz: u32) {
    let m = rank_begin(lid);
    let p0 = 8u * lid;
    let own = p0 < m;
    let nq = (m + 3u) >> 2u;
    let ka = skey[min(p0 >> 2u, MAX_K / 4u - 1u)];
    let kb = skey[min((p0 >> 2u) + 1u, MAX_K / 4u - 1u)];
    let pa = vec4<u32>(p0, p0 + 1u, p0 + 2u, p0 + 3u);
    let pb = pa + vec4<u32>(4u);
    let qo = min(p0 >> 2u, nq);
    // The subgroup's quads before every owner's [0, qa) and after them all [qb, nq); nothing
    // for a subgroup without owners.
    let qa = subgroupMin(select(nq, qo, own));
    let qb = min(subgroupMax(select(0u, qo + 2u, own)), nq);
    let any_own = qb > 0u;
    var ra = vec4<u32>(0u);
    var rb = vec4<u32>(0u);
    for (var b = 0u; b < select(0u, qa, any_own); b += ssz) {
        let mine = skey[min(b + sl, qa - 1u)];
        for (var i = 0u; i < min(ssz, qa - b); i++) {
            let v = subgroupShuffle(mine, i);
            ra += ge4(v, ka);
            rb += ge4(v, kb);
        }
    }
    for (var q = qa; q < select(qa, qb, any_own); q++) {
        let v = skey[q];
        let before = vec4<u32>(select(0u, 1u, q < qo));
        let after = vec4<u32>(select(0u, 1u, q >= qo + 2u));
        ra += before * ge4(v, ka) + after * gt4(v, ka);
        rb += before * ge4(v, kb) + after * gt4(v, kb);
        if (q >= qo && q < qo + 2u) {
            ra += before_quad(v, q, pa, ka);
            rb += before_quad(v, q, pb, kb);
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
    rank_end(id, lid, m, ra, rb);
}

fn hsum(v: vec4<u32>) -> u32 {
    return v.x + v.y + v.z + v.w;
}

// Count j (0 ..= 15) of the totals: lane c of p0 holds thresholds c and c + 4, of p1 c + 8 and
// c + 12 (low and high halves).
fn total_of(p0: vec4<u32>, p1: vec4<u32>, j: u32) -> u32 {
    let w = select(p0[j & 3u], p1[j & 3u], j >= 8u);
    return (w >> (16u * ((j >> 2u) & 1u))) & 0xffffu;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sub: u32,
          @builtin(num_subgroups) nsub: u32, @builtin(subgroup_invocation_id) sl: u32,
          @builtin(subgroup_size) ssz: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    let base = id * P.w;
    // Columns go by (subgroup, lane), the order of the positions `scan_sg` gives them, so that
    // position order is column order whatever the invocations' layout in subgroups.
    let v = sub * ssz + sl;
    let cr = chunk_of(v);
    let c0 = cr.x;
    let c1 = cr.y;
    let ka = keys4(base, c0, c1, cr.z != 0u);
    let kb = keys4(base, c0 + 4u, c1, cr.z != 0u);
    // Subgroup 0 sums the subgroups' counts (and extents): lane l those of subgroups l,
    // l + ssz, ...
    let first = select(nsub, sl, sub == 0u);
    // The first range: the row's smallest and largest candidate keys. Round 0 then splits the
    // candidates' own range, not all keys' (whose 16 parts hold 32 binades each).
    let none = vec4<u32>(0xffffffffu);
    let big = max(ka, kb);
    let small = min(select(none, ka, ka != vec4<u32>(0u)), select(none, kb, kb != vec4<u32>(0u)));
    let ext = subgroup_extent(vec2<u32>(max(max(big.x, big.y), max(big.z, big.w)),
                                        min(min(small.x, small.y), min(small.z, small.w))), ssz);
    if (sl == 0u) {
        skey[sub] = vec4<u32>(ext, 0u, 0u);
    }
    workgroupBarrier();
    if (sub == 0u) {
        var e = vec2<u32>(0u, 0xffffffffu);
        for (var g = first; g < nsub; g += ssz) {
            let x = skey[g].xy;
            e = vec2<u32>(max(e.x, x.x), min(e.y, x.y));
        }
        e = subgroup_extent(e, ssz);
        if (sl == 0u) {
            // lo: the k-th best key is >= lo ... and <= hi; with no candidate, [1, +inf's key].
            thr_lo = select(1u, e.y, e.x != 0u);
            thr_hi = select(0xff800000u, e.x, e.x != 0u);
            done = 0u;
        }
    }
    for (var round = 0u; round < REFINE_ROUNDS; round++) {
        if (workgroupUniformLoad(&done) != 0u) {
            break;
        }
        let lo = thr_lo;
        let step = (thr_hi - lo) / 16u + 1u;
        let t0 = vec4<u32>(lo) + vec4<u32>(0u, 1u, 2u, 3u) * step;
        let t1 = t0 + vec4<u32>(4u * step);
        let t2 = t1 + vec4<u32>(4u * step);
        let t3 = t2 + vec4<u32>(4u * step);
        let p0 = subgroup_sum(count2(ka, t0, t1) + count2(kb, t0, t1), ssz);
        let p1 = subgroup_sum(count2(ka, t2, t3) + count2(kb, t2, t3), ssz);
        if (sl == 0u) {
            skey[2u * sub] = p0;
            skey[2u * sub + 1u] = p1;
        }
        workgroupBarrier();
        var q0 = vec4<u32>(0u);
        var q1 = vec4<u32>(0u);
        for (var g = first; g < nsub; g += ssz) {
            q0 += skey[2u * g];
            q1 += skey[2u * g + 1u];
        }
        if (sub == 0u) {
            let s0 = subgroup_sum(q0, ssz);  // at most W <= 2048 per field
            let s1 = subgroup_sum(q1, ssz);
            if (sl == 0u) {
                if (round == 0u && total_of(s0, s1, 0u) <= P.k) {
                    done = 1u;  // at most k candidates (keys >= 1): all are kept
                } else {
                    // The last threshold with at least k keys at or above it (threshold 0,
                    // lo, always has).
                    var j = 15u;
                    var at = total_of(s0, s1, j);  // keys at or above threshold j
                    loop {
                        if (j == 0u || at >= P.k) {
                            break;
                        }
                        j--;
                        at = total_of(s0, s1, j);
                    }
                    let t = lo + j * step;
                    thr_lo = t;
                    if (j < 15u) {
                        thr_hi = min(thr_hi, t + step - 1u);
                    }
                    if (at - P.k <= SLACK || thr_lo == thr_hi) {
                        done = 1u;
                    }
                }
            }
        }
    }
    // T = lo: at least min(k, candidates) keys are >= T, and at most W <= MAX_K.
    let th = workgroupUniformLoad(&thr_lo);
    let zero = vec4<u32>(0u);
    let one = vec4<u32>(1u);
    let sa = select(zero, one, ka >= vec4<u32>(th));
    let sb = select(zero, one, kb >= vec4<u32>(th));
    let mine = hsum(sa + sb);
    var pos = scan_sg(lid, mine, sub, nsub, sl, ssz);
    for (var u = 0u; u < select(0u, 8u, mine != 0u); u++) {
        var x = ka[u & 3u];
        if (u >= 4u) {
            x = kb[u & 3u];
        }
        if (x >= th) {
            put_entry(pos, x, c0 + u);
            pos += 1u;
        }
    }
    rank_sg(id, lid, sl, ssz);
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
    wide_select(id, lid);
    rank_sg(id, lid, sl, ssz);
}
