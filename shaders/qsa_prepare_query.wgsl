// qsa_prepare_query (SPEC §3): each index-query head RMS-normed and rotated like a block key,
// at the query's own position. One workgroup per (row t, head h).
// rope_mode 1: rope_a = rope_cos [T, Dr], rope_b = rope_sin [T, Dr], one value per channel.
// rope_mode 2: rope_a = freqs_cis [positions, Dr] of interleaved (cos, sin) pairs, looked up at
// positions[t]; a position outside the table is clamped, skipped and flagged.

//#include common/dtype.wgsl
//#include common/rowmath.wgsl
//#include common/flags.wgsl

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
@group(0) @binding(1) var<storage, read> q_raw: array<u32>;      // [T, Hi, Di] T
@group(0) @binding(2) var<storage, read> weight: array<u32>;     // [Di] T
@group(0) @binding(3) var<storage, read> rope_a: array<u32>;     // [T, Dr] T or [positions, Dr] T
@group(0) @binding(4) var<storage, read> rope_b: array<u32>;     // [T, Dr] T
@group(0) @binding(5) var<storage, read> positions: array<i32>;  // [T] i32
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>; // [T, Hi, Di] T
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

fn ld_q(i: u32) -> f32 { return t_load(q_raw[t_word(i)], i); }
fn ld_w(i: u32) -> f32 { return t_load(weight[t_word(i)], i); }
fn ld_a(i: u32) -> f32 { return t_load(rope_a[t_word(i)], i); }
fn ld_b(i: u32) -> f32 { return t_load(rope_b[t_word(i)], i); }
fn st_out(i: u32, v: f32) {
    atomicAnd(&out[t_word(i)], t_keep(i));
    atomicOr(&out[t_word(i)], t_bits(v, i));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id >= P.t * P.hi) {
        return;
    }
    let t = id / P.hi;
    var pos = 0u;
    if (P.rope_mode == 2u) {
        let p = positions[t];
        if (p < 0 || u32(p) >= P.freq_rows) {
            if (lid == 0u) { atomicOr(&flags, FLAG_ROPE_ROW); }
            return;
        }
        pos = u32(p);
    }
    let src = id * P.di;
    for (var c = lid; c < P.di; c += WG) {
        row[c] = ld_q(src + c);
    }
    workgroupBarrier();
    if (P.norm_on != 0u) {
        let inv = wg_rms_factor(lid, P.di, P.eps);
        for (var c = lid; c < P.di; c += WG) {
            row[c] = row[c] * inv * (P.offset + ld_w(c));
        }
        workgroupBarrier();
    }
    for (var c = lid; c < P.di; c += WG) {
        var v = row[c];
        if (P.rope_mode == 1u && c < P.dr) {
            v = rope_at(c, P.dr, ld_a(t * P.dr + c), ld_b(t * P.dr + c));
        } else if (P.rope_mode == 2u && c < P.dr) {
            let f = pos * P.dr + 2u * (c % (P.dr / 2u));
            v = rope_at(c, P.dr, ld_a(f), ld_a(f + 1u));
        }
        st_out(src + c, v);
    }
}
