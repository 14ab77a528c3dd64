// nsa_select_expand: the NSA selector's token lists. Row (t, g) of `topk` holds k selection
// blocks of l' raw tokens (block o covers o·l' … o·l' + l' − 1); the row's token list is the
// positions of each selected block in selection order, clipped to the query's position p
// (a block may be partial or lie wholly past p: the forced last blocks of a multi-token step
// do), then −1:
//   len(o) = clamp(p + 1 − o·l', 0, l'),   token_count = Σ_s len(topk[t, g, s]).
// Entries −1 (unused slots) contribute nothing. One invocation per output slot j: it walks the
// row's k blocks and writes the token whose prefix of lengths contains j. A negative position
// or an entry below −1 is device data gone wrong: it counts as empty and raises a flag.

//#include common/flags.wgsl

struct NsaSelectExpandParams {
    t: u32,     // query rows
    hs: u32,    // selection groups (KV heads)
    k: u32,     // selected blocks per row
    lsel: u32,  // select block size l'
    width: u32, // k·l'
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> P: NsaSelectExpandParams;
@group(0) @binding(1) var<storage, read> topk: array<i32>;      // [T, Hs, k] i32
@group(0) @binding(2) var<storage, read> positions: array<i32>; // [T] i32
@group(0) @binding(3) var<storage, read_write> token_indices: array<i32>; // [T, Hs, width] i32
@group(0) @binding(4) var<storage, read_write> token_count: array<i32>;   // [T, Hs] i32
@group(0) @binding(5) var<storage, read_write> flags: atomic<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + lid;
    if (i >= P.t * P.hs * P.width) {
        return;
    }
    let row = i / P.width;  // t · Hs + g
    let j = i % P.width;
    let p = positions[row / P.hs];
    if (p < 0) {
        if (j == 0u) {
            atomicOr(&flags, FLAG_TOKEN);
            token_count[row] = 0;
        }
        token_indices[i] = -1;
        return;
    }
    let p1 = u32(p) + 1u;
    let seen = (p1 + P.lsel - 1u) / P.lsel;  // blocks o < seen hold a visible token
    var before = 0u;  // tokens of the blocks before slot s
    var v = -1;
    for (var s = 0u; s < P.k; s++) {
        let o = topk[row * P.k + s];
        if (o < -1) {
            if (j == 0u) { atomicOr(&flags, FLAG_TOKEN); }
            continue;
        }
        if (o < 0) {
            continue;
        }
        // len = clamp(p + 1 − o·l', 0, l'), without overflowing o·l'.
        var len = 0u;
        if (u32(o) < seen) {
            len = min(P.lsel, p1 - u32(o) * P.lsel);
        }
        if (v < 0 && j < before + len) {
            v = o * i32(P.lsel) + i32(j - before);
        }
        before += len;
    }
    token_indices[i] = v;
    if (j == 0u) {
        token_count[row] = i32(before);
    }
}
