// expand_route (SPEC §6): token indices for attention. One workgroup per row (t, g); its
// invocations take the slots s ≤ k in turn, each writing its r entries s·r … s·r + r − 1
// (clipped to the row width k·r + r − 1): the positions of selected block s while s < count,
// the tail vis(p)·r … p in slot s = count, −1 after. (One invocation per block rather than per
// entry: a quarter of the loads.) Selected blocks outside 0 … vis(p) − 1 and counts outside 0 … k are
// device data here: they are clamped, written as −1 and flagged.

//#include common/flags.wgsl

struct ExpandRouteParams {
    t: u32,     // rows
    hs: u32,    // selection groups
    k: u32,     // selected blocks per row
    r: u32,     // ratio
    width: u32, // k·r + r − 1
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> P: ExpandRouteParams;
@group(0) @binding(1) var<storage, read> block_indices: array<i32>; // [T, Hs, k] i32
@group(0) @binding(2) var<storage, read> block_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(3) var<storage, read> positions: array<i32>;     // [T] i32
@group(0) @binding(4) var<storage, read_write> token_indices: array<i32>; // [T, Hs, width] i32
@group(0) @binding(5) var<storage, read_write> token_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(6) var<storage, read_write> flags: atomic<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wg.y * nwg.x + wg.x;  // t · Hs + g
    if (row >= P.t * P.hs) {
        return;
    }
    // The row's facts once per workgroup: llvmpipe divides lane by lane.
    let t = row / P.hs;
    let p = positions[t];
    let cnt = block_count[row];
    let bad = p < 0 || cnt < 0 || u32(cnt) > P.k;
    let pu = u32(max(p, 0));
    let vis = (pu + 1u) / P.r;
    let tail = (pu + 1u) % P.r;
    let c = select(u32(cnt), 0u, bad);
    if (lid == 0u) {
        token_count[row] = select(i32(c * P.r + tail), 0, bad);
        if (bad) {
            atomicOr(&flags, FLAG_TOKEN);
        }
    }
    for (var s = lid; s <= P.k; s += 64u) {
        let base = row * P.width + s * P.r;
        let n = min(P.r, P.width - s * P.r);  // entries of this slot
        let blk = block_indices[row * P.k + min(s, max(P.k, 1u) - 1u)];
        let ok = blk >= 0 && u32(blk) < vis;
        let selected = s < c;
        // Branch-free but for the rare flag: llvmpipe runs both sides of a branch, so one
        // store loop serves every case (entries j < m get first + j, the others -1). A
        // selected block: its r positions; slot `count`: the tail, then -1; later slots: -1.
        let first = select(i32(vis * P.r), blk * i32(P.r), selected);
        var m = select(select(0u, tail, s == c), select(0u, n, ok), selected);
        m = select(m, 0u, bad);
        if (selected && !ok) {
            atomicOr(&flags, FLAG_TOKEN);
        }
        for (var j = 0u; j < n; j++) {
            token_indices[base + j] = select(-1, first + i32(j), j < m);
        }
    }
}
