// expand_route (SPEC §6): token indices for attention. One invocation per output slot j of
// row (t, g): the r positions of each selected block in selection order, then the tail
// vis(p)·r … p, then −1. Selected blocks outside 0 … vis(p) − 1 and counts outside 0 … k are
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
    if (i >= P.t * P.hs * P.width) {
        return;
    }
    let row = i / P.width;   // t · Hs + g
    let j = i % P.width;
    let t = row / P.hs;
    let p = positions[t];
    var cnt = block_count[row];
    if (p < 0 || cnt < 0 || u32(cnt) > P.k) {
        atomicOr(&flags, FLAG_TOKEN);
        token_indices[i] = -1;
        if (j == 0u) { token_count[row] = 0; }
        return;
    }
    let pu = u32(p);
    let vis = (pu + 1u) / P.r;
    let tail = (pu + 1u) % P.r;
    let sel = u32(cnt) * P.r;
    if (j == 0u) {
        token_count[row] = i32(sel + tail);
    }
    var v = -1;
    if (j < sel) {
        let blk = block_indices[row * P.k + j / P.r];
        if (blk < 0 || u32(blk) >= vis) {
            atomicOr(&flags, FLAG_TOKEN);
        } else {
            v = blk * i32(P.r) + i32(j % P.r);
        }
    } else if (j < sel + tail) {
        v = i32(vis * P.r + (j - sel));
    }
    token_indices[i] = v;
}
