// nsa_compress (SPEC §8.2): compressed NSA tokens from the raw tokens of a TND batch.
// Window i of sequence b covers its rows i·d … i·d + l − 1 and gives output row
// win_offsets[b] + i with out[w, n, c] = Σ_{t<l} weight[t, n] · input[row0 + i·d + t, n, c]
// (f32 accumulation, one rounding to T). One invocation per output word (one f32 element or
// two f16/bf16 elements), so no two invocations share a word. The window's sequence is found
// by binary search in win_offsets; the offsets are device data, so a window that would read
// outside its sequence or the input is written as 0 and flagged.

//#include common/dtype.wgsl
//#include common/flags.wgsl

struct NsaCompressParams {
    words: u32,   // output words
    total: u32,   // output elements = windows · N · D
    n: u32,       // heads N
    dim: u32,     // channels D
    l: u32,       // window length
    d: u32,       // stride
    batches: u32, // sequences B
    t: u32,       // rows of input
}

@group(0) @binding(0) var<uniform> P: NsaCompressParams;
@group(0) @binding(1) var<storage, read> input: array<u32>;       // [T, N, D] T
@group(0) @binding(2) var<storage, read> weight: array<u32>;      // [l, N] T
@group(0) @binding(3) var<storage, read> offsets: array<u32>;     // [2, B+1] u32: row offsets, window offsets
@group(0) @binding(4) var<storage, read_write> out: array<u32>;   // [windows, N, D] T
@group(0) @binding(5) var<storage, read_write> flags: atomic<u32>;

fn ld_in(i: u32) -> f32 { return t_load(input[t_word(i)], i); }
fn ld_w(i: u32) -> f32 { return t_load(weight[t_word(i)], i); }
fn win_off(b: u32) -> u32 { return offsets[P.batches + 1u + b]; }

// Element i of the output, or 0 (and a flag) when its window is inconsistent with the offsets.
fn element(i: u32) -> f32 {
    let nd = P.n * P.dim;
    let w = i / nd;
    let h = (i % nd) / P.dim;
    let c = i % P.dim;
    // Last b with win_off(b) <= w.
    var lo = 0u;
    var hi = P.batches;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (win_off(mid) <= w) { lo = mid; } else { hi = mid; }
    }
    let b = lo;
    if (P.batches == 0u || w < win_off(b) || w >= win_off(b + 1u)) {
        atomicOr(&flags, FLAG_NSA_LENGTHS);
        return 0.0;
    }
    let start = offsets[b] + (w - win_off(b)) * P.d;
    let end = offsets[b + 1u];
    if (start + P.l > end || end > P.t) {
        atomicOr(&flags, FLAG_NSA_LENGTHS);
        return 0.0;
    }
    var acc = 0.0;
    for (var t = 0u; t < P.l; t++) {
        acc += ld_w(t * P.n + h) * ld_in(((start + t) * P.n + h) * P.dim + c);
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let word = (wg.y * nwg.x + wg.x) * 64u + lid;
    if (word >= P.words) {
        return;
    }
    if (T_KIND == 0u) {
        out[word] = bitcast<u32>(element(word));
        return;
    }
    var bits = 0u;
    for (var e = 0u; e < 2u; e++) {
        let i = 2u * word + e;
        if (i < P.total) {
            bits |= t_bits(element(i), i);
        }
    }
    out[word] = bits;
}
