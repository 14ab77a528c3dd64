// block_topk (SPEC §5): the k best candidate columns of each score row, by descending score,
// ties to the lower column, NaN below every number; -inf columns are not candidates.
// One workgroup per row (t, g); no full sort of the row.
//
// 1. Keys. Each score's bits map to an order-preserving u32 key: -inf -> 0 (not a candidate),
//    NaN -> 1, numbers -> 0x00800000 ..= 0xff800000 (sign-flip trick, -0 folded onto +0).
//    Only bits are compared, so denormals order as on the host. Appending the 16-bit
//    `0xffff - column` makes a 48-bit composite key that is distinct per column and whose
//    descending order is exactly the contract's order.
//    A wide row (entry point `wide`: W >= 16 k, W >= 2048, k <= 512; decode over a long
//    context) first tries a sampled threshold: T, the key of rank r = ceil(2.5 k · 512 / W)
//    among 512 keys spread over the row (ranked by counting as in step 4). If at least k keys are >= T, all of the k
//    best are, so "key >= T" is a valid threshold: step 3 counts the keys it keeps, and with
//    between k and MAX_K of them (~2.5 k expected) step 2 is skipped. Otherwise (too few, as
//    when the sampled columns hold the largest values; too many, as with ties; or T = 0,
//    fewer than r candidates sampled) the radix select runs after all.
// 2. Radix select. Up to six passes over the row, one 8-bit digit of the composite each, most
//    significant first: a 256-bin histogram (workgroup atomics, one per run of equal digits
//    of an invocation) of the keys that share the digits chosen so far; sixteen invocations
//    sum 16 bins each and one walks down from the top to the digit where the k-th best falls
//    (no barrier-per-step scan). The search stops as soon as the bucket holds at most SLACK
//    (128) more keys than are still wanted (and at most MAX_K are selected in all): the whole
//    bucket goes on to the ranking, which drops ranks >= k. Keys are distinct, so it always
//    stops by the sixth pass. The first pass also counts candidates; with at most k of them
//    (or W <= k, found without a pass) every candidate is kept.
// 3. Compact the m keys at or above the threshold (n = min(k, candidates) <= m <= n + SLACK,
//    m <= MAX_K) in column order:
//    invocation i owns the contiguous columns [i*C, i*C + C), C = ceil(W / 256) (<= 256); it
//    counts its winners, an exclusive scan (16 groups of 16, then the group sums) gives its
//    first position, and a second pass stores keys in `skey` (vec4 words, 8 KiB for 2048) and
//    columns as u16 pairs in `scol` (atomicOr: two invocations may share a word). Wide rows
//    mark the winners in a bit mask (set_bits) while counting, and the second pass walks the set
//    bits: one iteration per winner, not per column.
// 4. Rank by counting, no sort network: invocation t owns positions 8t .. 8t+7 (keys in two
//    vec4 registers) and reads every key once, four per workgroup access; an entry's rank is
//    the number of entries before it: a larger key, or an equal key at a lower position, which
//    is a lower column (position order is column order): in the quads before the owner's an
//    equal key counts, after them only a larger one, so only the owner's own two quads compare
//    positions. O(n^2 / 8) comparisons per row, but vectorized and with no barrier; each owner
//    writes its columns of rank < n directly.
//    Loops carry per-invocation bounds (0 for idle ones): llvmpipe runs a loop for a whole
//    SIMD vector while any lane's bound allows, so idle vectors must leave at once.
// 5. Pad slots n .. k with -1 and write the count. Workgroup memory: ~14 KiB.
// Rows of a width that is a multiple of 4 start on a vec4 of `scores`: the passes of steps 2
// and 3 then read four columns per load (llvmpipe loads lane by lane). On lavapipe the decode
// row (W = 32768, k = 512) went from 1.33 ms to 0.90 ms with vec4 loads, then to ~0.5 ms with
// the sampled threshold, the winner masks and the split ranking loop.

//#include common/block_topk.wgsl

// Narrow rows (W < 16 k, as in prefill): radix select, then steps 3 to 5.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    let base = id * P.w;
    init_state(lid);
    radix_select(base, lid);

    // 3. Compact the n selected entries in column order: invocation lid owns the contiguous
    //    columns [lid * C, lid * C + C); a count, an exclusive scan, and a second pass that
    //    writes each key to its position in `skey` and its column into the u16 pairs of `scol`.
    workgroupBarrier();
    let th = thr_hi;
    let tl = thr_lo;
    let mh = mask_hi;
    let ml = mask_lo;
    // Chunks of whole vec4s when rows start on one (W a multiple of 4): vector loads.
    let cr = chunk_of(lid);
    let c0 = cr.x;
    let c1 = cr.y;
    let v4 = cr.z != 0u;
    var mine = 0u;
    if (v4) {
        for (var c = c0; c < c1; c += 4u) {
            mine += countOneBits(sel4(scores[(base + c) >> 2u], c, th, tl, mh, ml));
        }
    } else {
        for (var c = c0; c < c1; c++) {
            mine += u32(selected(key_of(score_bits(base + c)), 0xffffu - c, th, tl, mh, ml));
        }
    }
    scan_counts(lid, mine);
    var pos = sfx[lid] + part[lid >> 4u];  // the first position of this chunk
    if (mine != 0u) {
        if (v4) {
            for (var c = c0; c < c1; c += 4u) {
                let v = scores[(base + c) >> 2u];
                place(key_of(v.x), c, th, tl, mh, ml, &pos);
                place(key_of(v.y), c + 1u, th, tl, mh, ml, &pos);
                place(key_of(v.z), c + 2u, th, tl, mh, ml, &pos);
                place(key_of(v.w), c + 3u, th, tl, mh, ml, &pos);
            }
        } else {
            for (var c = c0; c < c1; c++) {
                place(key_of(score_bits(base + c)), c, th, tl, mh, ml, &pos);
            }
        }
    }
    rank_write(id, lid);
}

// Wide rows (W >= 16 k, W >= 2048, k <= 512; decode over a long context): the sampled
// threshold of step 1, the radix select only when it fails, winner masks in step 3. A separate
// entry point rather than a branch: llvmpipe runs both sides of a branch, and the unused code
// cost narrow prefill rows 10 %.
@compute @workgroup_size(256)
fn wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    wide_select(id, lid);
    rank_write(id, lid);
}
