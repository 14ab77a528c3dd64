// qsa_prepare_query's parameters, the bindings its two kernels type alike and their row setup
// (qsa_prepare_query.wgsl, qsa_prepare_query_vec.wgsl).

const WG: u32 = 64u;

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

@group(0) @binding(0) var<uniform> P: QsaPrepareQueryParams;
@group(0) @binding(5) var<storage, read> positions: array<i32>;  // [T] i32
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

// The row (t, h) of an invocation: (r = t · Hi + h, t, its freqs_cis row, 1), or 0 in w past
// the rows and for a position outside freqs_cis (flagged), which is left unwritten.
fn query_row(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> vec4<u32> {
    let r = (wg.y * nwg.x + wg.x) * WG + lid;
    if (r >= P.t * P.hi) {
        return vec4<u32>(0u);
    }
    let t = r / P.hi;
    var pos = 0u;
    if (P.rope_mode == 2u) {
        let p = positions[t];
        if (p < 0 || u32(p) >= P.freq_rows) {
            atomicOr(&flags, FLAG_ROPE_ROW);
            return vec4<u32>(r, t, 0u, 0u);
        }
        pos = u32(p);
    }
    return vec4<u32>(r, t, pos, 1u);
}
