// The subgroup variant of nsa_compress_attention's logits stage (SPEC §8.1): its entry point
// and query handling, shared by nsa_compress_attention_sg.wgsl (K rows read in 16-byte words)
// and nsa_compress_attention_sg_w32.wgsl (32-byte words), which declare the bindings and the
// K row loads: `f32_key8(rb, c)`, channels c … c + 7 of an f32 K row at element rb as two
// quads, and `half_key16(rb, c)`, channels c … c + 15 of a 16-bit one as four, each quad zero
// from Dqk on (live2, live4). What the kernel does is described at the top of
// nsa_compress_attention_sg.wgsl.

// Query channels per chunk: one 32-byte word of a K row, 8 f32 or 16 16-bit channels. Each
// visit of a row then reads one word, and the chunk's queries (8 or 16 mat4x4 per lane) stay a
// small part of the core's L1 with the 16 rows' words: with 32-channel chunks (128 bytes of an
// f32 row per visit, 16 KiB of queries per SIMD vector) the f32 stage took 6.9–7.1 ms against
// 5.5 on lavapipe (docs/perf.md, nsa-decode).
fn query_chunk_len() -> u32 {
    return select(16u, 8u, T_KIND == 0u);
}

// Channels 4s … 4s + 3 of the chunk for the 16 heads: m[4s + i][h / 4][h % 4] (f32 uses the
// first 8).
struct Chunk {
    m: array<mat4x4<f32>, 16>,
}

// The current chunk's queries (load_chunk), read by acc8.
var<private> qc: Chunk;

// Four channels of head sl (a) and of head sl + 8 (b) in every lane → for each of the four
// channels, the mat4x4 of all 16 heads (column h / 4, row h % 4).
fn spread(a: vec4<f32>, b: vec4<f32>) -> array<mat4x4<f32>, 4> {
    let v0 = subgroupBroadcast(a, 0u);
    let v1 = subgroupBroadcast(a, 1u);
    let v2 = subgroupBroadcast(a, 2u);
    let v3 = subgroupBroadcast(a, 3u);
    let v4 = subgroupBroadcast(a, 4u);
    let v5 = subgroupBroadcast(a, 5u);
    let v6 = subgroupBroadcast(a, 6u);
    let v7 = subgroupBroadcast(a, 7u);
    let v8 = subgroupBroadcast(b, 0u);
    let v9 = subgroupBroadcast(b, 1u);
    let v10 = subgroupBroadcast(b, 2u);
    let v11 = subgroupBroadcast(b, 3u);
    let v12 = subgroupBroadcast(b, 4u);
    let v13 = subgroupBroadcast(b, 5u);
    let v14 = subgroupBroadcast(b, 6u);
    let v15 = subgroupBroadcast(b, 7u);
    return array<mat4x4<f32>, 4>(
        mat4x4<f32>(vec4<f32>(v0.x, v1.x, v2.x, v3.x), vec4<f32>(v4.x, v5.x, v6.x, v7.x),
                    vec4<f32>(v8.x, v9.x, v10.x, v11.x), vec4<f32>(v12.x, v13.x, v14.x, v15.x)),
        mat4x4<f32>(vec4<f32>(v0.y, v1.y, v2.y, v3.y), vec4<f32>(v4.y, v5.y, v6.y, v7.y),
                    vec4<f32>(v8.y, v9.y, v10.y, v11.y), vec4<f32>(v12.y, v13.y, v14.y, v15.y)),
        mat4x4<f32>(vec4<f32>(v0.z, v1.z, v2.z, v3.z), vec4<f32>(v4.z, v5.z, v6.z, v7.z),
                    vec4<f32>(v8.z, v9.z, v10.z, v11.z), vec4<f32>(v12.z, v13.z, v14.z, v15.z)),
        mat4x4<f32>(vec4<f32>(v0.w, v1.w, v2.w, v3.w), vec4<f32>(v4.w, v5.w, v6.w, v7.w),
                    vec4<f32>(v8.w, v9.w, v10.w, v11.w), vec4<f32>(v12.w, v13.w, v14.w, v15.w)));
}

// Query channels c … c + 7 of element offset e's row (e + c on a 16-byte boundary for 16-bit
// T; f32 takes two words), as two quads; zero past Dqk or for a head past the chunk's.
fn q8(e: u32, c: u32, live: bool) -> array<vec4<f32>, 2> {
    var lo = vec4<f32>();
    var hi = vec4<f32>();
    if (live && c < P.dqk) {
        if (T_KIND == 0u) {
            lo = bitcast<vec4<f32>>(query4[(e + c) / 4u]);
            if (c + 4u < P.dqk) {
                hi = bitcast<vec4<f32>>(query4[(e + c) / 4u + 1u]);
            }
        } else {
            let w = query4[(e + c) / 8u];
            lo = lo4(w);
            hi = hi4(w);
        }
    }
    return array<vec4<f32>, 2>(lo, hi);
}

// The chunk of channels c0 … c0 + query_chunk_len() − 1 for the 16 heads of the part (zero
// past nh or Dqk), into qc.
fn load_chunk(ea: u32, eb: u32, la: bool, lb: bool, c0: u32) {
    let a0 = q8(ea, c0, la);
    let b0 = q8(eb, c0, lb);
    let s0 = spread(a0[0], b0[0]);
    let s1 = spread(a0[1], b0[1]);
    qc.m[0] = s0[0]; qc.m[1] = s0[1]; qc.m[2] = s0[2]; qc.m[3] = s0[3];
    qc.m[4] = s1[0]; qc.m[5] = s1[1]; qc.m[6] = s1[2]; qc.m[7] = s1[3];
    if (T_KIND != 0u) {
        let a1 = q8(ea, c0 + 8u, la);
        let b1 = q8(eb, c0 + 8u, lb);
        let s2 = spread(a1[0], b1[0]);
        let s3 = spread(a1[1], b1[1]);
        qc.m[8] = s2[0]; qc.m[9] = s2[1]; qc.m[10] = s2[2]; qc.m[11] = s2[3];
        qc.m[12] = s3[0]; qc.m[13] = s3[1]; qc.m[14] = s3[2]; qc.m[15] = s3[3];
    }
}

// Channels c … c + 7 as quads k0, k1, each zero where it starts at or past Dqk (the words there
// belong to the next head or row, and 0 · inf would be NaN).
fn live2(c: u32, k0: vec4<f32>, k1: vec4<f32>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(select(vec4<f32>(), k0, c < P.dqk),
                               select(vec4<f32>(), k1, c + 4u < P.dqk));
}

// Channels c … c + 15 as quads k0 … k3, each zero where it starts at or past Dqk (the words
// there belong to the next head or row, and 0 · inf would be NaN).
fn live4(c: u32, k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>, k3: vec4<f32>) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(select(vec4<f32>(), k0, c < P.dqk),
                               select(vec4<f32>(), k1, c + 4u < P.dqk),
                               select(vec4<f32>(), k2, c + 8u < P.dqk),
                               select(vec4<f32>(), k3, c + 12u < P.dqk));
}

// Channels c … c + 7 (queries q.m[i … i + 7], keys k0 and k1) added to a.
fn acc8(a: mat4x4<f32>, i: u32, k0: vec4<f32>, k1: vec4<f32>) -> mat4x4<f32> {
    let r = acc4(a, qc.m[i], qc.m[i + 1u], qc.m[i + 2u], qc.m[i + 3u], k0);
    return acc4(r, qc.m[i + 4u], qc.m[i + 5u], qc.m[i + 6u], qc.m[i + 7u], k1);
}

// One token's dot products over the chunk (K row at element rb), added to a.
fn dots(a: mat4x4<f32>, rb: u32, c0: u32) -> mat4x4<f32> {
    if (T_KIND == 0u) {
        let k = f32_key8(rb, c0);
        return acc8(a, 0u, k[0], k[1]);
    }
    let k = half_key16(rb, c0);
    let r = acc8(a, 0u, k[0], k[1]);
    return acc8(r, 8u, k[2], k[3]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_invocation_id) sl: u32) {
    let w = logits_work(wg.y * nwg.x + wg.x, lid);
    if (w.skip) {
        return;
    }
    let r = w.r;
    let kv = w.kv;
    let b = w.b;
    let h0 = w.h0;
    let nh = w.nh;
    // This lane's two query rows: heads sl and sl + 8 of the chunk.
    let ea = (r * P.n1 + h0 + min(sl, nh - 1u)) * P.dqk;
    let eb = (r * P.n1 + h0 + min(sl + 8u, nh - 1u)) * P.dqk;
    let la = sl < nh;
    let lb = sl + 8u < nh;

    let j0 = w.lo + lid;  // the invocation's tokens: j0 + 64·t, t < 16
    let rb = key_rows16(b, kv, j0, w.vis);
    var a0 = mat4x4<f32>();
    var a1 = mat4x4<f32>();
    var a2 = mat4x4<f32>();
    var a3 = mat4x4<f32>();
    var a4 = mat4x4<f32>();
    var a5 = mat4x4<f32>();
    var a6 = mat4x4<f32>();
    var a7 = mat4x4<f32>();
    var a8 = mat4x4<f32>();
    var a9 = mat4x4<f32>();
    var a10 = mat4x4<f32>();
    var a11 = mat4x4<f32>();
    var a12 = mat4x4<f32>();
    var a13 = mat4x4<f32>();
    var a14 = mat4x4<f32>();
    var a15 = mat4x4<f32>();
    let cl = query_chunk_len();
    let chunks = (P.dqk + cl - 1u) / cl;
    for (var ci = 0u; ci < chunks; ci++) {
        let c0 = ci * cl;
        load_chunk(ea, eb, la, lb, c0);
        a0 = dots(a0, rb[0], c0);
        a1 = dots(a1, rb[1], c0);
        a2 = dots(a2, rb[2], c0);
        a3 = dots(a3, rb[3], c0);
        a4 = dots(a4, rb[4], c0);
        a5 = dots(a5, rb[5], c0);
        a6 = dots(a6, rb[6], c0);
        a7 = dots(a7, rb[7], c0);
        a8 = dots(a8, rb[8], c0);
        a9 = dots(a9, rb[9], c0);
        a10 = dots(a10, rb[10], c0);
        a11 = dots(a11, rb[11], c0);
        a12 = dots(a12, rb[12], c0);
        a13 = dots(a13, rb[13], c0);
        a14 = dots(a14, rb[14], c0);
        a15 = dots(a15, rb[15], c0);
    }

    finish_logits(lid, j0, w.vis, r * P.n2 + kv, w.hc, w.ns1, w.s1, a0, a1, a2, a3, a4, a5,
                  a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
}
