// block_topk's shared part (SPEC §5): bindings, workgroup state, keys, the radix select, the
// compaction's scan and the ranking. The entry points are in `block_topk.wgsl` (portable) and
// `block_topk_sg.wgsl` (short rows with subgroups); the steps are described there.

//#include common/dtype.wgsl
//#include common/flags.wgsl

struct BlockTopkParams {
    rows: u32,  // T · Hs
    w: u32,     // columns per row (<= 65536)
    k: u32,     // slots per row (1 ..= MAX_K)
    out_base: u32, // output row of scores row 0 (the orchestrator scores in row chunks)
    // The token route (expand_route, SPEC §6) written by step 5 as well, in the indexer's
    // step, where it saves a dispatch: selection groups Hs, ratio r (0: no route, the four
    // bindings below unused) and the row width k·r + r − 1.
    hs: u32,
    r: u32,
    width: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> P: BlockTopkParams;
@group(0) @binding(1) var<storage, read> scores: array<vec4<u32>>;       // [T, Hs, W] f32 bits
@group(0) @binding(2) var<storage, read_write> block_indices: array<i32>; // [T, Hs, k] i32
@group(0) @binding(3) var<storage, read_write> block_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(4) var<storage, read> positions: array<i32>;          // [T] i32 (route)
@group(0) @binding(5) var<storage, read_write> token_indices: array<i32>; // [T, Hs, width] i32
@group(0) @binding(6) var<storage, read_write> token_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

const WG: u32 = 256u;
const MAX_K: u32 = 2048u;
// Entries the ranking holds: the at most MAX_K winners of the portable and wide kernels, or
// every column of a `row_sg` row (W <= SHORT_W = 2112, which keeps NSA's 2049-wide selection
// rows at 8192 compressed tokens on that kernel).
const SLOTS: u32 = 2112u;
const SLACK: u32 = 128u;  // extra keys the select may leave to the ranking (see step 2)
const SAMPLE: u32 = 512u; // keys of a wide row sampled for a first threshold (step 1)


var<workgroup> hist: array<atomic<u32>, WG>;  // one bin per digit value
var<workgroup> sfx: array<u32, WG>;           // per-invocation counts, then their scan
var<workgroup> part: array<u32, 16>;          // sums of 16 bins or 16 counts
var<workgroup> skey: array<vec4<u32>, SLOTS / 4u>;  // selected keys, in column order (row_sg: by bucket)
var<workgroup> scol: array<atomic<u32>, SLOTS / 2u>; // their columns, two u16 per word
var<workgroup> thr_hi: u32;                   // threshold digits chosen so far (key part)
var<workgroup> thr_lo: u32;                   // ... (column part)
var<workgroup> mask_hi: u32;                  // which bits of the key part are chosen
var<workgroup> mask_lo: u32;
var<workgroup> rem: u32;                      // keys still wanted from the current bucket
var<workgroup> done: u32;
var<workgroup> nsel: u32;                     // n = min(k, candidates)
var<workgroup> thr_s: u32;                    // the sampled threshold (0: none)
var<workgroup> sampled: u32;                  // 1 while the threshold is the sampled one
var<workgroup> retry: u32;                    // the sampled threshold failed: search again
var<workgroup> kept: u32;                     // keys at or above the threshold

// Order-preserving key of score bits b; 0 = not a candidate.
fn key_of(b: u32) -> u32 {
    // Branch-free (llvmpipe runs both sides of a branch).
    let a = b & 0x7fffffffu;
    var key = select(b | 0x80000000u, ~b, b != a);
    key = select(key, 0x80000000u, a == 0u);
    key = select(key, 1u, a > 0x7f800000u);
    return select(key, 0u, b == 0xff800000u);
}

fn score_bits(j: u32) -> u32 {
    return scores[j >> 2u][j & 3u];
}

// One key of the histogram pass: counted into the run (last, run) when it matches the chosen
// digits.
fn tally(key: u32, lo: u32, th: u32, tl: u32, mh: u32, ml: u32, ksh: u32, lsh: u32, hi: bool,
         last: ptr<function, u32>, run: ptr<function, u32>) {
    if ((key != 0u) & ((key & mh) == th) & ((lo & ml) == tl)) {
        let d = select(lo >> lsh, key >> ksh, hi) & 0xffu;
        if (d != *last && *run != 0u) {
            atomicAdd(&hist[*last], *run);
            *run = 0u;
        }
        *last = d;
        *run += 1u;
    }
}

// (key, lo) masked to the chosen digits is at or above the threshold.
fn at_or_above(key: u32, lo: u32, th: u32, tl: u32, mh: u32, ml: u32) -> bool {
    let kh = key & mh;
    return kh > th || (kh == th && (lo & ml) >= tl);
}

// A candidate at or above the threshold.
fn selected(key: u32, lo: u32, th: u32, tl: u32, mh: u32, ml: u32) -> bool {
    return key != 0u && at_or_above(key, lo, th, tl, mh, ml);
}

// Stores the entry (key, column c) at position p of `skey` / `scol`.
fn put_entry(p: u32, key: u32, c: u32) {
    skey[p >> 2u][p & 3u] = key;
    atomicOr(&scol[p >> 1u], c << (16u * (p & 1u)));
}

// Stores a selected entry (key, column c) at position *pos of `skey` / `scol`.
fn place(key: u32, c: u32, th: u32, tl: u32, mh: u32, ml: u32, pos: ptr<function, u32>) {
    let p = *pos;
    if (selected(key, 0xffffu - c, th, tl, mh, ml) && p < MAX_K) {
        put_entry(p, key, c);
        *pos = p + 1u;
    }
}

// Which of the four columns c … c + 3 (scores v) are selected: bits 0 … 3.
fn sel4(v: vec4<u32>, c: u32, th: u32, tl: u32, mh: u32, ml: u32) -> u32 {
    return u32(selected(key_of(v.x), 0xffffu - c, th, tl, mh, ml))
        | (u32(selected(key_of(v.y), 0xfffeu - c, th, tl, mh, ml)) << 1u)
        | (u32(selected(key_of(v.z), 0xfffdu - c, th, tl, mh, ml)) << 2u)
        | (u32(selected(key_of(v.w), 0xfffcu - c, th, tl, mh, ml)) << 3u);
}

// Before-counts of the four entries of quad q of `skey` against keys k at positions p.
fn before_quad(v: vec4<u32>, q: u32, p: vec4<u32>, k: vec4<u32>) -> vec4<u32> {
    let j = 4u * q;
    return before4(v.x, j, p, k) + before4(v.y, j + 1u, p, k) + before4(v.z, j + 2u, p, k)
        + before4(v.w, j + 3u, p, k);
}

// Step 3's columns of invocation lid: [x, y) of the row, read as vec4s when z is 1 (rows
// start on a vec4 when W is a multiple of 4).
fn chunk_of(lid: u32) -> vec3<u32> {
    let v4 = (P.w & 3u) == 0u;
    let chunk = select((P.w + WG - 1u) / WG, ((P.w + 4u * WG - 1u) / (4u * WG)) * 4u, v4);
    let c0 = min(lid * chunk, P.w);
    return vec3<u32>(c0, min(c0 + chunk, P.w), u32(v4));
}

// Marks columns o .. o + 3 of the chunk (bits, o a multiple of 4 or bits one bit) in the
// 288-bit mask (ma, mb, mc): words 0 … 3, 4 … 7 and 8 (a `wide` chunk has at most 256 columns,
// a `row_sg` lane's at most 264).
fn set_bits(ma: ptr<function, vec4<u32>>, mb: ptr<function, vec4<u32>>, mc: ptr<function, u32>,
            o: u32, bits: u32) {
    let w = vec4<u32>(o >> 5u);
    let b = vec4<u32>(bits << (o & 31u));
    *ma |= select(vec4<u32>(0u), b, w == vec4<u32>(0u, 1u, 2u, 3u));
    *mb |= select(vec4<u32>(0u), b, w == vec4<u32>(4u, 5u, 6u, 7u));
    *mc |= select(0u, b.x, w.x == 8u);
}

// Word wi (0 ..= 8) of the 288-bit mask (ma, mb, mc).
fn mask_word(ma: vec4<u32>, mb: vec4<u32>, mc: u32, wi: u32) -> u32 {
    return select(select(mb[wi & 3u], ma[wi & 3u], wi < 4u), mc, wi == 8u);
}

// The lowest set bit of *bits (not 0), cleared.
fn pop_bit(bits: ptr<function, u32>) -> u32 {
    let b = firstTrailingBit(*bits);
    *bits &= *bits - 1u;
    return b;
}

// 1 in each lane where the entry (key kj, position j) comes before (k, p).
fn before4(kj: u32, j: u32, p: vec4<u32>, k: vec4<u32>) -> vec4<u32> {
    let tie = select(vec4<u32>(0u), vec4<u32>(1u), vec4<u32>(j) < p);
    return select(vec4<u32>(0u), vec4<u32>(1u), vec4<u32>(kj) + tie > k);
}

// Per lane of k: how many of the four keys of v are >= it / > it.
fn ge4(v: vec4<u32>, k: vec4<u32>) -> vec4<u32> {
    let one = vec4<u32>(1u);
    let zero = vec4<u32>(0u);
    return select(zero, one, vec4<u32>(v.x) >= k) + select(zero, one, vec4<u32>(v.y) >= k)
        + select(zero, one, vec4<u32>(v.z) >= k) + select(zero, one, vec4<u32>(v.w) >= k);
}
fn gt4(v: vec4<u32>, k: vec4<u32>) -> vec4<u32> {
    let one = vec4<u32>(1u);
    let zero = vec4<u32>(0u);
    return select(zero, one, vec4<u32>(v.x) > k) + select(zero, one, vec4<u32>(v.y) > k)
        + select(zero, one, vec4<u32>(v.z) > k) + select(zero, one, vec4<u32>(v.w) > k);
}

// The radix search from scratch: no digit chosen, nothing found (invocation 0).
fn clear_search() {
    thr_hi = 0u;
    thr_lo = 0u;
    mask_hi = 0u;
    mask_lo = 0u;
    done = 0u;
    rem = 0u;
}

// The shared state of a row's search: no threshold yet (or "key >= 1" when W <= k).
fn init_state(lid: u32) {
    if (lid == 0u) {
        clear_search();
        thr_s = 0u;
        sampled = 0u;
        retry = 0u;
        if (P.w <= P.k) {
            // Every candidate is kept: threshold "key >= 1", no search.
            thr_hi = 1u;
            mask_hi = 0xffffffffu;
            done = 1u;
        }
    }
}

// Step 2 (nothing once `done`).
fn radix_select(base: u32, lid: u32) {
    // Loop bounds that are 0 outside the invocations that work: llvmpipe runs a loop for a
    // whole SIMD vector while any lane's bound allows, enclosing branches notwithstanding.
    let lanes16 = select(0u, 16u, lid < 16u);
    let lane16 = select(0u, 16u, lid == 0u);
// 2. Radix select of the threshold.
    for (var level = 0u; level < 6u; level++) {
        if (workgroupUniformLoad(&done) != 0u) {
            break;
        }
        atomicStore(&hist[lid], 0u);
        let th = thr_hi;
        let tl = thr_lo;
        let mh = mask_hi;
        let ml = mask_lo;
        var want = rem;  // read before the barrier: this pass's winner rewrites it
        workgroupBarrier();
        let ksh = 24u - 8u * min(level, 3u);
        let lsh = 8u - 8u * (max(level, 4u) - 4u);
        // Runs of one digit are counted privately: one atomic per run, not per key.
        var last = 0u;
        var run = 0u;
        let hi = level < 4u;
        if ((P.w & 3u) == 0u) {
            for (var q = lid; q < P.w / 4u; q += WG) {
                let v = scores[(base >> 2u) + q];
                let c = 4u * q;
                tally(key_of(v.x), 0xffffu - c, th, tl, mh, ml, ksh, lsh, hi, &last, &run);
                tally(key_of(v.y), 0xfffeu - c, th, tl, mh, ml, ksh, lsh, hi, &last, &run);
                tally(key_of(v.z), 0xfffdu - c, th, tl, mh, ml, ksh, lsh, hi, &last, &run);
                tally(key_of(v.w), 0xfffcu - c, th, tl, mh, ml, ksh, lsh, hi, &last, &run);
            }
        } else {
            for (var c = lid; c < P.w; c += WG) {
                tally(key_of(score_bits(base + c)), 0xffffu - c, th, tl, mh, ml, ksh, lsh, hi,
                      &last, &run);
            }
        }
        if (run != 0u) {
            atomicAdd(&hist[last], run);
        }
        workgroupBarrier();
        // Sixteen partial sums of 16 bins each, then one invocation walks down from the top.
        if (lid < 16u) {
            var sum = 0u;
            for (var b = 0u; b < lanes16; b++) {
                sum += atomicLoad(&hist[16u * lid + b]);
            }
            part[lid] = sum;
        }
        workgroupBarrier();
        if (lid == 0u) {
            if (level == 0u) {
                var total = 0u;
                for (var g = 0u; g < lane16; g++) {
                    total += part[g];
                }
                want = P.k;
                if (total <= P.k) {
                    want = 0u;
                    thr_hi = 1u;
                    mask_hi = 0xffffffffu;
                    done = 1u;
                }
            }
            if (want > 0u) {
                var above = 0u;  // keys in the bins above the one searched
                var g = 15u;
                loop {
                    let v = part[g];
                    if (above + v >= want || g == 0u || lid != 0u) {
                        break;
                    }
                    above += v;
                    g--;
                }
                var b = 16u * g + 15u;
                var h = 0u;
                loop {
                    h = atomicLoad(&hist[b]);
                    if (above + h >= want || b == 16u * g || lid != 0u) {
                        break;
                    }
                    above += h;
                    b--;
                }
                let left = want - above;
                if (level < 4u) {
                    let sh = 24u - 8u * level;
                    thr_hi |= b << sh;
                    mask_hi |= 0xffu << sh;
                } else {
                    let sh = 8u - 8u * (level - 4u);
                    thr_lo |= b << sh;
                    mask_lo |= 0xffu << sh;
                }
                rem = left;
                // Stop once the bucket overshoots by at most SLACK keys: all of them are
                // compacted and ranked, and the ranks past k are dropped (exact for h == left).
                if (h - left <= SLACK && P.k - left + h <= MAX_K) {
                    done = 1u;
                }
            }
        }
    }
}

// Step 3's exclusive scan of the per-invocation counts `mine` (in place within 16 groups of
// 16, then over the group totals); clears `scol`; lid 0 stores the total in `kept` and m in
// `nsel`.
// Zeroes `scol`, into which the compaction ORs its columns.
fn clear_cols(lid: u32) {
    for (var m = lid; m < MAX_K / 2u; m += WG) {
        atomicStore(&scol[m], 0u);
    }
}

fn scan_counts(lid: u32, mine: u32) {
    let lanes16 = select(0u, 16u, lid < 16u);
    let lane16 = select(0u, 16u, lid == 0u);
    clear_cols(lid);
    sfx[lid] = mine;
    workgroupBarrier();
    if (lid < 16u) {
        var acc = 0u;
        for (var b = 0u; b < lanes16; b++) {
            let v = sfx[16u * lid + b];
            sfx[16u * lid + b] = acc;
            acc += v;
        }
        part[lid] = acc;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var acc = 0u;
        for (var g = 0u; g < lane16; g++) {
            let v = part[g];
            part[g] = acc;
            acc += v;
        }
        kept = acc;
        nsel = min(acc, MAX_K);  // m: min(k, candidates) plus at most SLACK, by construction
    }
    workgroupBarrier();
}

// Step 4's start: pads `skey` with 0 keys to whole quads after the m entries and returns m.
fn rank_begin(lid: u32) -> u32 {
    let m = workgroupUniformLoad(&nsel);
    if (lid == 0u && (m & 3u) != 0u) {
        for (var s = m; s < ((m + 3u) & ~3u) && lid == 0u; s++) {
            skey[s >> 2u][s & 3u] = 0u;  // below every candidate: never counts as before
        }
    }
    workgroupBarrier();
    return m;
}

// Step 4's end and step 5: the owner of positions p0 = 8 lid .. p0 + 7 writes the column of
// each one whose rank (ra, rb) is below n = min(k, m); padding; the count.
fn rank_end(id: u32, lid: u32, m: u32, ra: vec4<u32>, rb: vec4<u32>) {
    let rt = route_of(P.out_base + id);
    rank_place(id, lid, m, ra, rb, rt);
    rank_tail(id, lid, m, WG, rt);
}

// The route of output row g (t · Hs + group) when P.r > 0, as expand_route computes it:
// x = vis(p) = (p + 1) / r, y = (p + 1) % r (the tail's length), z = 1 when the position is
// negative (device data: the row gets no tokens and the flag). All 0 without a route.
fn route_of(g: u32) -> vec3<u32> {
    let on = P.r != 0u;
    let rr = max(P.r, 1u);
    let p = select(0, positions[g / max(P.hs, 1u)], on);
    let pu = u32(max(p, 0));
    let bad = select(0u, 1u, p < 0);
    return select(vec3<u32>(0u), vec3<u32>((pu + 1u) / rr, (pu + 1u) % rr, bad), on);
}

// The route's entries of slot s, which holds block `col` (s < count): its r positions,
// or −1 and the flag for a block outside 0 … vis(p) − 1 (the score rows make that
// impossible in the indexer; device data all the same). Nothing without a route (r = 0).
fn route_slot(g: u32, rt: vec3<u32>, s: u32, col: u32) {
    let ok = col < rt.x && rt.z == 0u;
    if (P.r != 0u && rt.z == 0u && !ok) {
        atomicOr(&flags, FLAG_TOKEN);
    }
    let first = i32(col * P.r);
    let m = select(0u, P.r, ok);
    let base = g * P.width + s * P.r;
    for (var j = 0u; j < P.r; j++) {
        token_indices[base + j] = select(-1, first + i32(j), j < m);
    }
}

// Step 5's columns: the owner of positions p0 = 8 lid .. p0 + 7 writes the column of each one
// whose rank (ra, rb) is below n = min(k, m), and with a route (rt = route_of(row)) its r
// token positions.
fn rank_place(id: u32, lid: u32, m: u32, ra: vec4<u32>, rb: vec4<u32>, rt: vec3<u32>) {
    rank_place_at(id, 8u * lid, m, ra, rb, rt);
}

// `rank_place` for the owner of positions p0 .. p0 + 7.
fn rank_place_at(id: u32, p0: u32, m: u32, ra: vec4<u32>, rb: vec4<u32>, rt: vec3<u32>) {
    let n = min(m, P.k);  // the winners: min(k, candidates)
    let g = P.out_base + id;
    let row = g * P.k;
    for (var u = 0u; u < select(0u, 8u, p0 < m); u++) {
        let s = p0 + u;
        if (s < m) {
            let col = (atomicLoad(&scol[s >> 1u]) >> (16u * (s & 1u))) & 0xffffu;
            var r = ra[u & 3u];
            if (u >= 4u) {
                r = rb[u & 3u];
            }
            if (r < n) {
                block_indices[row + r] = i32(col);
                route_slot(g, rt, r, col);
            }
        }
    }
}

// Step 5's padding and count, by `lanes` invocations (lid < lanes). With a route, its entries
// from slot n on: the tail vis(p) · r … p first, then −1 to the row's end; and its count,
// n · r + tail (0 for a negative position).
fn rank_tail(id: u32, lid: u32, m: u32, lanes: u32, rt: vec3<u32>) {
    let n = min(m, P.k);
    let g = P.out_base + id;
    let row = g * P.k;
    for (var s = n + lid; s < P.k; s += lanes) {
        block_indices[row + s] = -1;
    }
    let e0 = n * P.r;  // 0 … width without a route (r = width = 0)
    let tail = select(rt.y, 0u, rt.z != 0u);
    for (var e = e0 + lid; e < P.width; e += lanes) {
        let i = e - e0;
        token_indices[g * P.width + e] = select(-1, i32(rt.x * P.r + i), i < tail);
    }
    if (lid == 0u) {
        block_count[g] = i32(n);
        if (P.r != 0u) {
            token_count[g] = select(i32(n * P.r + tail), 0, rt.z != 0u);
            if (rt.z != 0u) {
                atomicOr(&flags, FLAG_TOKEN);
            }
        }
    }
}

// Steps 4 and 5 over the m entries of `skey` / `scol`.
fn rank_write(id: u32, lid: u32) {
    let m = rank_begin(lid);
    let r = owner_ranks(8u * lid, m);
    rank_end(id, lid, m, r.a, r.b);
}

// The ranks of the eight entries at positions p0 .. p0 + 7.
struct Ranks {
    a: vec4<u32>,
    b: vec4<u32>,
}

// 4. Rank by counting, for the owner of positions p0 .. p0 + 7 (all 0 when p0 >= m): the rank
//    of an entry is the number of entries before it (a larger key, or the same key at a lower
//    position, which is a lower column). Keys are at most 0xff800000, so `kj + 1` cannot wrap.
fn owner_ranks(p0: u32, m: u32) -> Ranks {
    var ra = vec4<u32>(0u);
    var rb = vec4<u32>(0u);
    if (p0 < m) {
        let ka = skey[p0 >> 2u];
        let kb = skey[(p0 >> 2u) + 1u];
        let pa = vec4<u32>(p0, p0 + 1u, p0 + 2u, p0 + 3u);
        let pb = pa + vec4<u32>(4u);
        // Per-invocation bounds: vectors of idle invocations leave the loops at once. Quads
        // before the owner's hold lower positions, so an equal key there comes before; in the
        // owner's two quads positions decide; after them only a larger key does.
        let nq = select(0u, (m + 3u) >> 2u, p0 < m);
        let qo = min(p0 >> 2u, nq);
        for (var q = 0u; q < qo; q++) {
            let v = skey[q];
            ra += ge4(v, ka);
            rb += ge4(v, kb);
        }
        for (var q = qo; q < min(qo + 2u, nq); q++) {
            let v = skey[q];
            ra += before_quad(v, q, pa, ka);
            rb += before_quad(v, q, pb, kb);
        }
        for (var q = qo + 2u; q < nq; q++) {
            let v = skey[q];
            ra += gt4(v, ka);
            rb += gt4(v, kb);
        }
    }
    return Ranks(ra, rb);
}

// The rank, among the SAMPLE sampled keys of a wide row, of its first threshold (step 1):
// r - 1 for r = ceil(2.5 k · SAMPLE / W), within 1 ..= SAMPLE.
fn sample_goal() -> u32 {
    return clamp((5u * P.k * SAMPLE + 2u * P.w - 1u) / (2u * P.w), 1u, SAMPLE) - 1u;
}

// Sampled key s (0 .. SAMPLE - 1) of the row starting at element base.
fn sample_key(base: u32, s: u32) -> u32 {
    return key_of(score_bits(base + s * P.w / SAMPLE));
}

// 1. The sampled threshold of the row starting at element base: the key of rank
//    `sample_goal()` among SAMPLE keys spread over the row, ranked by counting in `skey`, is
//    stored in `thr_s` (which must hold 0 before: none found).
fn sample_threshold(base: u32, lid: u32) {
    if (lid < SAMPLE / 4u) {
        let s = 4u * lid;
        skey[lid] = vec4<u32>(sample_key(base, s), sample_key(base, s + 1u),
                              sample_key(base, s + 2u), sample_key(base, s + 3u));
    }
    workgroupBarrier();
    // Rank by counting among the sample, as in step 4.
    let ka = skey[min(lid, SAMPLE / 4u - 1u)];
    let pa = vec4<u32>(4u * lid) + vec4<u32>(0u, 1u, 2u, 3u);
    var ra = vec4<u32>(0u);
    let nq = select(0u, SAMPLE / 4u, lid < SAMPLE / 4u);
    for (var q = 0u; q < nq; q++) {
        ra += before_quad(skey[q], q, pa, ka);
    }
    let goal = sample_goal();
    if (lid < SAMPLE / 4u) {
        let hit = ra == vec4<u32>(goal);
        if (hit.x) { thr_s = ka.x; }
        if (hit.y) { thr_s = ka.y; }
        if (hit.z) { thr_s = ka.z; }
        if (hit.w) { thr_s = ka.w; }
    }
}

// Steps 1 to 3 of a wide row in the portable kernel (entry point `wide`): the sampled
// threshold found by ranking the sample in workgroup memory, then `wide_compact`.
fn wide_select(id: u32, lid: u32) {
    let base = id * P.w;
    init_state(lid);
    sample_threshold(base, lid);
    wide_compact(base, lid);
}

// Steps 2 and 3 of a wide row (entry points `wide` and `wide_sg`), once step 1 has stored the
// sampled threshold in `thr_s` (0: none): the radix select when it fails, and the compaction
// with winner masks.
fn wide_compact(base: u32, lid: u32) {
    workgroupBarrier();
    if (lid == 0u && thr_s != 0u) {
        // Threshold "key >= T": the whole key compared, columns ignored.
        thr_hi = thr_s;
        mask_hi = 0xffffffffu;
        done = 1u;
        sampled = 1u;
    }

    let cr = chunk_of(lid);
    let c0 = cr.x;
    let c1 = cr.y;
    let v4 = cr.z != 0u;
    var th = 0u;
    var tl = 0u;
    var mh = 0u;
    var ml = 0u;
    var mine = 0u;
    var ma = vec4<u32>(0u);  // which columns of the chunk are selected: bits 0 .. 127
    var mb = vec4<u32>(0u);  // ... 128 .. 255
    var mc = 0u;             // (none past 255: a chunk here has at most 256 columns)
    for (var attempt = 0u; attempt < 2u; attempt++) {
        radix_select(base, lid);  // nothing when the sampled threshold stands
        workgroupBarrier();
        th = thr_hi;
        tl = thr_lo;
        mh = mask_hi;
        ml = mask_lo;
        ma = vec4<u32>(0u);
        mb = vec4<u32>(0u);
        if (v4) {
            for (var c = c0; c < c1; c += 4u) {
                set_bits(&ma, &mb, &mc, c - c0, sel4(scores[(base + c) >> 2u], c, th, tl, mh, ml));
            }
        } else {
            for (var c = c0; c < c1; c++) {
                let one = u32(selected(key_of(score_bits(base + c)), 0xffffu - c, th, tl, mh, ml));
                set_bits(&ma, &mb, &mc, c - c0, one);
            }
        }
        let pc = countOneBits(ma) + countOneBits(mb);
        mine = pc.x + pc.y + pc.z + pc.w;
        scan_counts(lid, mine);
        if (lid == 0u) {
            // A sampled threshold must keep between k and MAX_K keys; else search from scratch.
            let acc = kept;
            if (sampled != 0u && (acc < P.k || acc > MAX_K)) {
                retry = 1u;
                sampled = 0u;
                clear_search();
            } else {
                retry = 0u;
            }
        }
        if (workgroupUniformLoad(&retry) == 0u) {
            break;
        }
    }
    // Only the marked columns: one iteration per selected entry, not per column.
    var pos = sfx[lid] + part[lid >> 4u];
    let words = select(0u, (c1 - c0 + 31u) / 32u, mine != 0u);
    for (var wi = 0u; wi < words; wi++) {
        var bits = mask_word(ma, mb, mc, wi);
        loop {
            if (bits == 0u) {
                break;
            }
            let c = c0 + 32u * wi + pop_bit(&bits);
            let p = pos;
            if (p < MAX_K) {
                put_entry(p, key_of(score_bits(base + c)), c);
            }
            pos = p + 1u;
        }
    }
}
