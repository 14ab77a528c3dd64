// qsa_prepare_query's parameters and the row setup of its kernels (qsa_prepare_query.wgsl,
// qsa_prepare_query_vec.wgsl, and qsa_compress_query.wgsl, which runs the word kernel in the
// indexer's compress dispatch). The including shader declares the bindings: `U.q` (the params),
// `positions` (i32) and `flags`.

const QWG: u32 = 64u;  // invocations per workgroup

struct QsaPrepareQueryParams {
    t: u32,          // rows
    hi: u32,         // heads
    di: u32,         // channels
    dr: u32,         // rotary channels
    rope_mode: u32,  // 0 none, 1 cos/sin tables, 2 freqs_cis + positions
    norm_on: u32,
    freq_rows: u32,  // rows of freqs_cis
    _pad0: u32,
    eps: f32,
    offset: f32,
    _pad1: u32,
    _pad2: u32,
}

// The row (t, h) of invocation lid of workgroup gid: (r = t · Hi + h, t, its freqs_cis row, 1),
// or 0 in w past the rows and for a position outside freqs_cis (flagged), which is left
// unwritten.
fn query_row(gid: u32, lid: u32) -> vec4<u32> {
    let r = gid * QWG + lid;
    if (r >= U.q.t * U.q.hi) {
        return vec4<u32>(0u);
    }
    let t = r / U.q.hi;
    var pos = 0u;
    if (U.q.rope_mode == 2u) {
        let p = positions[t];
        if (p < 0 || u32(p) >= U.q.freq_rows) {
            atomicOr(&flags, FLAG_ROPE_ROW);
            return vec4<u32>(r, t, 0u, 0u);
        }
        pos = u32(p);
    }
    return vec4<u32>(r, t, pos, 1u);
}
