// qsa_prepare_query (SPEC §3): each index-query head RMS-normed and rotated like a block key,
// at the query's own position. One invocation per (row t, head h), channels in a loop: no
// workgroup memory and no barrier. (One workgroup per row with a barrier tree took 140 ms for
// the 32768 rows of an 8K prefill on lavapipe, nearly all of it barriers.) The sum of squares
// runs in channel order; rotated channels read their partner channel again.
// rope_mode 1: rope_a = rope_cos [T, Dr], rope_b = rope_sin [T, Dr], one value per channel.
// rope_mode 2: rope_a = freqs_cis [positions, Dr] of interleaved (cos, sin) pairs, looked up at
// positions[t]; a position outside the table is clamped, skipped and flagged.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/qsa_prepare_query.wgsl

struct QueryUniform {
    q: QsaPrepareQueryParams,
}

@group(0) @binding(0) var<uniform> U: QueryUniform;
@group(0) @binding(1) var<storage, read> q_raw: array<u32>;      // [T, Hi, Di] T
@group(0) @binding(2) var<storage, read> weight: array<u32>;     // [Di] T
@group(0) @binding(3) var<storage, read> rope_a: array<u32>;     // [T, Dr] T or [positions, Dr] T
@group(0) @binding(4) var<storage, read> rope_b: array<u32>;     // [T, Dr] T
@group(0) @binding(5) var<storage, read> positions: array<i32>; // [T] i32
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

// Channel c of the row at element src, normed: x · inv · (offset + w[c]).
fn normed(src: u32, c: u32, inv: f32) -> f32 {
    let x = ld_q(src + c);
    if (U.q.norm_on != 0u) {
        return x * inv * (U.q.offset + ld_w(c));
    }
    return x;
}

// Channel c of the output: normed, then the first dr channels rotated in split halves,
// y'[i] = y[i]·c - y[i+h]·s and y'[i+h] = y[i+h]·c + y[i]·s (SPEC §3).
fn value(src: u32, t: u32, pos: u32, c: u32, inv: f32) -> f32 {
    let y = normed(src, c, inv);
    if (U.q.rope_mode == 0u || c >= U.q.dr) {
        return y;
    }
    var cs = 0.0;
    var sn = 0.0;
    if (U.q.rope_mode == 1u) {
        cs = ld_a(t * U.q.dr + c);
        sn = ld_b(t * U.q.dr + c);
    } else {
        let f = pos * U.q.dr + 2u * (c % (U.q.dr / 2u));
        cs = ld_a(f);
        sn = ld_a(f + 1u);
    }
    let h = U.q.dr / 2u;
    if (c < h) {
        return y * cs - normed(src, c + h, inv) * sn;
    }
    return y * cs + normed(src, c - h, inv) * sn;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = query_row(wg.y * nwg.x + wg.x, lid);
    if (row.w == 0u) {
        return;
    }
    let r = row.x;  // row (t, h)
    let t = row.y;
    let pos = row.z;
    let src = r * U.q.di;
    var inv = 1.0;
    if (U.q.norm_on != 0u) {
        var ss = 0.0;
        for (var c = 0u; c < U.q.di; c++) {
            let x = ld_q(src + c);
            ss += x * x;
        }
        inv = 1.0 / sqrt(ss / f32(U.q.di) + U.q.eps);
    }
    // Channel pairs: with 16-bit types and an even Di a pair is one whole word of this row,
    // stored at once; an odd Di shares words between rows, which the atomic halves keep apart.
    for (var c = 0u; c < U.q.di; c += 2u) {
        let v0 = value(src, t, pos, c, inv);
        let two = c + 1u < U.q.di;
        let v1 = value(src, t, pos, min(c + 1u, U.q.di - 1u), inv);
        if (T_KIND == 0u) {
            atomicStore(&out[src + c], bitcast<u32>(v0));
            if (two) {
                atomicStore(&out[src + c + 1u], bitcast<u32>(v1));
            }
        } else if ((U.q.di & 1u) == 0u) {
            atomicStore(&out[t_word(src + c)], t_bits(v0, src + c) | t_bits(v1, src + c + 1u));
        } else {
            st_out(src + c, v0);
            if (two) {
                st_out(src + c + 1u, v1);
            }
        }
    }
}
