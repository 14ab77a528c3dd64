// expand_route (SPEC §6): token indices for attention. One invocation per slot s ≤ k of row
// (t, g), writing its r entries s·r … s·r + r − 1 (clipped to the row width k·r + r − 1): the
// positions of selected block s while s < count, the tail vis(p)·r … p in slot s = count, −1
// after. (One invocation per block rather than per entry: a quarter of the loads and
// divisions for r = 4.) Selected blocks outside 0 … vis(p) − 1 and counts outside 0 … k are
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
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 64u + gid.x;
    let slots = P.k + 1u;
    if (i >= P.t * P.hs * slots) {
        return;
    }
    let row = i / slots;   // t · Hs + g
    let s = i % slots;
    let base = row * P.width + s * P.r;
    let n = min(P.r, P.width - s * P.r);  // entries of this slot
    let t = row / P.hs;
    let p = positions[t];
    let cnt = block_count[row];
    if (p < 0 || cnt < 0 || u32(cnt) > P.k) {
        if (s == 0u) {
            atomicOr(&flags, FLAG_TOKEN);
            token_count[row] = 0;
        }
        for (var j = 0u; j < n; j++) { token_indices[base + j] = -1; }
        return;
    }
    let pu = u32(p);
    let vis = (pu + 1u) / P.r;
    let tail = (pu + 1u) % P.r;
    let c = u32(cnt);
    if (s == 0u) {
        token_count[row] = i32(c * P.r + tail);
    }
    if (s < c) {
        let blk = block_indices[row * P.k + s];
        let ok = blk >= 0 && u32(blk) < vis;
        if (!ok) { atomicOr(&flags, FLAG_TOKEN); }
        let first = blk * i32(P.r);
        for (var j = 0u; j < n; j++) {
            token_indices[base + j] = select(-1, first + i32(j), ok);
        }
    } else {
        // Slot `count` holds the tail (then −1); later slots hold −1.
        let m = select(0u, tail, s == c);
        let first = i32(vis * P.r);
        for (var j = 0u; j < n; j++) {
            token_indices[base + j] = select(-1, first + i32(j), j < m);
        }
    }
}
