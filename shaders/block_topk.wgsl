// block_topk (SPEC §5): the k best candidate columns of each score row, by descending score,
// ties to the lower column, NaN below every number; -inf columns are not candidates.
// One workgroup per row (t, g); no full sort of the row.
//
// 1. Keys. Each score's bits map to an order-preserving u32 key: -inf -> 0 (not a candidate),
//    NaN -> 1, numbers -> 0x00800000 ..= 0xff800000 (sign-flip trick, -0 folded onto +0).
//    Only bits are compared, so denormals order as on the host. Appending the 16-bit
//    `0xffff - column` makes a 48-bit composite key that is distinct per column and whose
//    descending order is exactly the contract's order.
// 2. Radix select. Up to six passes over the row, one 8-bit digit of the composite each, most
//    significant first: a 256-bin histogram (workgroup atomics) of the keys that share the
//    digits chosen so far, a suffix sum, and the digit where the k-th best falls. The search
//    stops as soon as the bucket holds exactly as many keys as are still wanted; keys are
//    distinct, so it always stops by the sixth pass. The first pass also counts candidates;
//    with at most k of them (or W <= k, found without a pass) every candidate is kept.
// 3. Collect the n = min(k, candidates) keys at or above the threshold (any order), then sort
//    them (key desc, column asc) with a bitonic network in workgroup memory: keys in `skey`,
//    columns as u16 pairs in `sidx` (12 KiB for 2048 entries). Each invocation owns whole
//    `sidx` words during a stage, so packed halves never race.
// 4. Write the n columns, then -1, and the count.

//#include common/dtype.wgsl

struct BlockTopkParams {
    rows: u32,  // T · Hs
    w: u32,     // columns per row (<= 65536)
    k: u32,     // slots per row (1 ..= MAX_K)
    out_base: u32, // output row of scores row 0 (the orchestrator scores in row chunks)
}

@group(0) @binding(0) var<uniform> P: BlockTopkParams;
@group(0) @binding(1) var<storage, read> scores: array<u32>;             // [T, Hs, W] f32 bits
@group(0) @binding(2) var<storage, read_write> block_indices: array<i32>; // [T, Hs, k] i32
@group(0) @binding(3) var<storage, read_write> block_count: array<i32>;   // [T, Hs] i32

const WG: u32 = 256u;
const MAX_K: u32 = 2048u;

var<workgroup> hist: array<atomic<u32>, WG>;  // one bin per digit value
var<workgroup> sfx: array<u32, WG>;           // suffix sums of hist
var<workgroup> skey: array<u32, MAX_K>;       // selected keys (column, while collecting)
var<workgroup> sidx: array<u32, MAX_K / 2u>;  // selected columns, two u16 per word
var<workgroup> thr_hi: u32;                   // threshold digits chosen so far (key part)
var<workgroup> thr_lo: u32;                   // ... (column part)
var<workgroup> mask_hi: u32;                  // which bits of the key part are chosen
var<workgroup> mask_lo: u32;
var<workgroup> rem: u32;                      // keys still wanted from the current bucket
var<workgroup> done: u32;
var<workgroup> nsel: u32;                     // n = min(k, candidates)
var<workgroup> cursor: atomic<u32>;

// Order-preserving key of score bits b; 0 = not a candidate.
fn key_of(b: u32) -> u32 {
    if (b == 0xff800000u) {
        return 0u;
    }
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 1u;
    }
    if (a == 0u) {
        return 0x80000000u;
    }
    if (b != a) {
        return ~b;
    }
    return b | 0x80000000u;
}

// 8-bit digit `level` of the composite (key, lo), most significant first.
fn digit(level: u32, key: u32, lo: u32) -> u32 {
    if (level < 4u) {
        return (key >> (24u - 8u * level)) & 0xffu;
    }
    return (lo >> (8u - 8u * (level - 4u))) & 0xffu;
}

// (key, lo) masked to the chosen digits is at or above the threshold.
fn at_or_above(key: u32, lo: u32, th: u32, tl: u32, mh: u32, ml: u32) -> bool {
    let kh = key & mh;
    return kh > th || (kh == th && (lo & ml) >= tl);
}

// a = (key a, column a) comes before b.
fn before(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

fn col_at(s: u32) -> u32 {
    return (sidx[s >> 1u] >> (16u * (s & 1u))) & 0xffffu;
}

// One bitonic task: the four entries of sidx words w0 and w1, compared in pairs (0,1),(2,3)
// when j = 1, else (0,2),(1,3); `size` sets each pair's direction.
fn bitonic_task(t: u32, j: u32, size: u32) {
    var pos: array<u32, 4>;
    if (j == 1u) {
        pos = array<u32, 4>(4u * t, 4u * t + 1u, 4u * t + 2u, 4u * t + 3u);
    } else {
        let p = 2u * t;
        let i = ((p & ~(j - 1u)) << 1u) | (p & (j - 1u));
        pos = array<u32, 4>(i, i + 1u, i + j, i + j + 1u);
    }
    let w0 = sidx[pos[0] >> 1u];
    let w1 = sidx[pos[2] >> 1u];
    var kk = array<u32, 4>(skey[pos[0]], skey[pos[1]], skey[pos[2]], skey[pos[3]]);
    var ii = array<u32, 4>(w0 & 0xffffu, w0 >> 16u, w1 & 0xffffu, w1 >> 16u);
    for (var q = 0u; q < 2u; q++) {
        var x = q * 2u;
        var y = x + 1u;
        if (j != 1u) {
            x = q;
            y = q + 2u;
        }
        let desc = (pos[x] & size) == 0u;
        let yx = before(kk[y], ii[y], kk[x], ii[x]);
        let xy = before(kk[x], ii[x], kk[y], ii[y]);
        if ((desc && yx) || (!desc && xy)) {
            let tk = kk[x];
            kk[x] = kk[y];
            kk[y] = tk;
            let ti = ii[x];
            ii[x] = ii[y];
            ii[y] = ti;
        }
    }
    for (var q = 0u; q < 4u; q++) {
        skey[pos[q]] = kk[q];
    }
    sidx[pos[0] >> 1u] = ii[0] | (ii[1] << 16u);
    sidx[pos[2] >> 1u] = ii[2] | (ii[3] << 16u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.rows) {
        return;
    }
    let base = id * P.w;
    if (lid == 0u) {
        thr_hi = 0u;
        thr_lo = 0u;
        mask_hi = 0u;
        mask_lo = 0u;
        done = 0u;
        rem = 0u;
        atomicStore(&cursor, 0u);
        if (P.w <= P.k) {
            // Every candidate is kept: threshold "key >= 1", no search.
            thr_hi = 1u;
            mask_hi = 0xffffffffu;
            done = 1u;
        }
    }

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
        for (var c = lid; c < P.w; c += WG) {
            let key = key_of(scores[base + c]);
            let lo = 0xffffu - c;
            if (key != 0u && (key & mh) == th && (lo & ml) == tl) {
                atomicAdd(&hist[digit(level, key, lo)], 1u);
            }
        }
        workgroupBarrier();
        sfx[lid] = atomicLoad(&hist[lid]);
        workgroupBarrier();
        for (var off = 1u; off < WG; off <<= 1u) {
            var v = sfx[lid];
            if (lid + off < WG) {
                v += sfx[lid + off];
            }
            workgroupBarrier();
            sfx[lid] = v;
            workgroupBarrier();
        }
        let at = sfx[lid];  // keys in bins >= lid
        var above = 0u;     // keys in bins > lid
        if (lid + 1u < WG) {
            above = sfx[lid + 1u];
        }
        if (level == 0u) {
            let total = sfx[0];
            want = P.k;
            if (total <= P.k) {
                want = 0u;
                if (lid == 0u) {
                    thr_hi = 1u;
                    mask_hi = 0xffffffffu;
                    done = 1u;
                }
            }
        }
        if (want > 0u && at >= want && above < want) {
            let left = want - above;
            if (level < 4u) {
                let sh = 24u - 8u * level;
                thr_hi |= lid << sh;
                mask_hi |= 0xffu << sh;
            } else {
                let sh = 8u - 8u * (level - 4u);
                thr_lo |= lid << sh;
                mask_lo |= 0xffu << sh;
            }
            rem = left;
            if (at - above == left) {
                done = 1u;
            }
        }
    }

    // 3. Collect the n selected columns, then turn them into (key, column) entries.
    workgroupBarrier();
    let th = thr_hi;
    let tl = thr_lo;
    let mh = mask_hi;
    let ml = mask_lo;
    for (var c = lid; c < P.w; c += WG) {
        let key = key_of(scores[base + c]);
        if (key != 0u && at_or_above(key, 0xffffu - c, th, tl, mh, ml)) {
            let s = atomicAdd(&cursor, 1u);
            if (s < MAX_K) {
                skey[s] = c;
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        nsel = min(atomicLoad(&cursor), MAX_K);  // = min(k, candidates) by construction
    }
    let n = workgroupUniformLoad(&nsel);
    var n2 = 4u;
    while (n2 < n) {
        n2 <<= 1u;
    }
    for (var m = lid; m < n2 / 2u; m += WG) {
        var col = array<u32, 2>(0xffffu, 0xffffu);
        for (var h = 0u; h < 2u; h++) {
            let s = 2u * m + h;
            var key = 0u;  // padding: after every candidate
            if (s < n) {
                col[h] = skey[s];
                key = key_of(scores[base + col[h]]);
            }
            skey[s] = key;
        }
        sidx[m] = col[0] | (col[1] << 16u);
    }
    workgroupBarrier();
    for (var size = 2u; size <= n2; size <<= 1u) {
        for (var j = size >> 1u; j > 0u; j >>= 1u) {
            for (var t = lid; t < n2 / 4u; t += WG) {
                bitonic_task(t, j, size);
            }
            workgroupBarrier();
        }
    }

    // 4. Output.
    for (var s = lid; s < P.k; s += WG) {
        var v = -1;
        if (s < n) {
            v = i32(col_at(s));
        }
        block_indices[(P.out_base + id) * P.k + s] = v;
    }
    if (lid == 0u) {
        block_count[P.out_base + id] = i32(n);
    }
}
