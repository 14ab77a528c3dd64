// sparse_attention, stage 3 of 3: merges the partial results (splits × phases) of each (row,
// query head) (stage 2, sparse_attention.wgsl; layout in common/attention.wgsl), adds the head's
// sink and rounds the output (Ev channels per head) once. With M the largest partial maximum (and the sink),
//   out = Σ_s e^{m_s − M} acc_s / (Σ_s e^{m_s − M} l_s + [sink] e^{sink − M}),
// and 0 when no partial saw a token (Σ_s l_s = 0), with or without a sink.
//
// One workgroup per (row, head, block of 64 channel quads of Ev); invocation i owns channel
// quad i of its block and reads each partial's quad once.

//#include common/dtype.wgsl
//#include common/attention.wgsl

// 1 when every output row starts on an even element, so a 16-bit channel quad is two whole
// words (stored without touching a neighbour's half).
override ALIGN2: u32 = 0u;

const TK: u32 = 64u;

@group(0) @binding(0) var<uniform> P: SparseAttentionParams;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;       // [rows, H, splits, phases, Ev4 + cblocks] partial results
@group(0) @binding(2) var<storage, read> sinks: array<f32>;            // [H] f32
@group(0) @binding(3) var<storage, read_write> out: array<atomic<u32>>; // [T, H, Ev] T

fn st_out(i: u32, v: f32) {
    atomicAnd(&out[t_word(i)], t_keep(i));
    atomicOr(&out[t_word(i)], t_bits(v, i));
}

// Stores channels c … c + 3 (those below e) of the output row starting at element i.
fn st_quad(i: u32, c: u32, e: u32, v: vec4<f32>) {
    let j = i + c;
    if (T_KIND == 0u) {
        atomicStore(&out[j], bitcast<u32>(v.x));
        if (c + 1u < e) { atomicStore(&out[j + 1u], bitcast<u32>(v.y)); }
        if (c + 2u < e) { atomicStore(&out[j + 2u], bitcast<u32>(v.z)); }
        if (c + 3u < e) { atomicStore(&out[j + 3u], bitcast<u32>(v.w)); }
    } else if (ALIGN2 != 0u) {
        atomicStore(&out[j >> 1u], t_bits(v.x, 0u) | t_bits(v.y, 1u));
        if (c + 2u < e) { atomicStore(&out[(j >> 1u) + 1u], t_bits(v.z, 0u) | t_bits(v.w, 1u)); }
    } else {
        st_out(j, v.x);
        if (c + 1u < e) { st_out(j + 1u, v.y); }
        if (c + 2u < e) { st_out(j + 2u, v.z); }
        if (c + 3u < e) { st_out(j + 3u, v.w); }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let e = v_dim();
    let e4 = (e + 3u) / 4u;
    let blocks = (e4 + TK - 1u) / TK;
    if (id >= P.rows * P.h * blocks) {
        return;
    }
    let rr = id / (P.h * blocks);
    let h = (id / blocks) % P.h;
    let cq = (id % blocks) * TK + lid;
    let rs = e4 + P.cblocks;
    // The (m, l) of the V step's channel block that holds this workgroup's quads (blocks of
    // 2 · 64 / phases quads, a multiple of 64).
    let ml_at = e4 + min((id % blocks) * TK / (2u * (TK / P.phases)), P.cblocks - 1u);
    let subs = P.splits * P.phases;
    let first = (rr * P.h + h) * subs;

    var top = LOW;
    var seen = 0.0;
    var poisoned = false;  // a split met a NaN or +inf score: the head is NaN
    for (var s = 0u; s < subs; s++) {
        let ml = part[(first + s) * rs + ml_at];
        top = max(top, ml.x);
        seen += ml.y;
        poisoned = poisoned || is_nan(ml.y);
    }
    var sink_w = 0.0;
    if (P.has_sinks != 0u && sinks[h] > LOW) {
        let m = max(top, sinks[h]);
        sink_w = exp(sinks[h] - m);
        top = m;
    }
    var acc = vec4<f32>(0.0);
    var den = sink_w;
    let c = min(cq, e4 - 1u);
    for (var s = 0u; s < subs; s++) {
        let r = (first + s) * rs;
        let ml = part[r + ml_at];
        let a = exp(ml.x - top);
        den += a * ml.y;
        acc += a * part[r + c];
    }
    var o = vec4<f32>(0.0);
    if (poisoned) {
        o = nan4();
    } else if (seen > 0.0) {
        o = acc / den;
    }
    if (cq < e4) {
        st_quad(((P.row_base + rr) * P.h + h) * e, 4u * cq, e, o);
    }
}
