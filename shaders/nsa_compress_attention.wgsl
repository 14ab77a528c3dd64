// nsa_compress_attention (SPEC §8.1), stage 1 of 3: the logits. One workgroup per (query row
// r, KV head, chunk of 16 query heads, split of P.split1 = 1024 compressed tokens). Invocation lid
// owns the 16 tokens lo + lid + 64·t of the split and keeps their 16 heads' dot products in
// 16 mat4x4 accumulators (column h / 4, row h % 4), so each K row is read once for all the
// chunk's heads and each query value staged in workgroup memory serves 16 tokens. The query
// chunk is staged DC channels at a time (bf16: as bf16 pairs, exact in half the loads). Where
// the K rows allow it (BY16) the keys are read 16 bytes at a time through a second binding of
// the same buffer.
//
// llvmpipe (lavapipe's CPU driver) runs every storage and workgroup-memory access as a loop
// over the SIMD lanes, and keeps arrays indexed in a loop in memory: hence 16-byte loads,
// whole mat4x4 loads of the staged query, and accumulators in named variables.
//
// Output: x_j = scale · q_h·K_j of the visible tokens (j < vis) into the logits scratch, and
// the split's max and sum of exp per head into the stats scratch (merged by stage 2). Tokens
// past vis are computed on the row of the last visible token and dropped.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_logits.wgsl
//#include common/nsa_logits_stage.wgsl

@group(0) @binding(4) var<storage, read> query: array<u32>;       // [R, N1, Dqk] T
@group(0) @binding(5) var<storage, read> key: array<u32>;         // [num_blocks, page, N2·Dqk] T
@group(0) @binding(6) var<storage, read> key4: array<vec4<u32>>;  // the same, 16 bytes a load (or a dummy)
@group(0) @binding(7) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl

// 1: the K rows start on 16-byte boundaries (Dqk·sizeof(T) a multiple of 16) and key4 is
// bound to the key buffer; 0: key4 is a dummy. A specialisation constant, so that each
// pipeline holds one inner loop.
override BY16: u32 = 0u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = logits_work(wg.y * nwg.x + wg.x, lid);
    if (w.skip) {
        return;
    }
    let r = w.r;
    let kv = w.kv;
    let b = w.b;
    let h0 = w.h0;
    let nh = w.nh;

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

    for (var c0 = 0u; c0 < P.dqk; c0 += DC) {
        let dc = min(DC, P.dqk - c0);
        workgroupBarrier();
        stage_query(lid, WG, r, h0, nh, c0, dc, BY16 == 1u);
        workgroupBarrier();
        if (BY16 == 1u && T_KIND == 0u) {
            // f32: four channels per 16-byte load.
            for (var c = 0u; c < dc; c += 4u) {
                let q0 = qs[c];
                let q1 = qs[c + 1u];
                let q2 = qs[c + 2u];
                let q3 = qs[c + 3u];
                let w = (c0 + c) / 4u;
                a0 = acc4(a0, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[0] / 4u + w]));
                a1 = acc4(a1, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[1] / 4u + w]));
                a2 = acc4(a2, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[2] / 4u + w]));
                a3 = acc4(a3, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[3] / 4u + w]));
                a4 = acc4(a4, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[4] / 4u + w]));
                a5 = acc4(a5, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[5] / 4u + w]));
                a6 = acc4(a6, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[6] / 4u + w]));
                a7 = acc4(a7, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[7] / 4u + w]));
                a8 = acc4(a8, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[8] / 4u + w]));
                a9 = acc4(a9, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[9] / 4u + w]));
                a10 = acc4(a10, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[10] / 4u + w]));
                a11 = acc4(a11, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[11] / 4u + w]));
                a12 = acc4(a12, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[12] / 4u + w]));
                a13 = acc4(a13, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[13] / 4u + w]));
                a14 = acc4(a14, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[14] / 4u + w]));
                a15 = acc4(a15, q0, q1, q2, q3, bitcast<vec4<f32>>(key4[rb[15] / 4u + w]));
            }
        } else if (BY16 == 1u) {
            // f16 / bf16: eight channels per 16-byte load.
            for (var c = 0u; c < dc; c += 8u) {
                var q0 = mat4x4<f32>();
                var q1 = mat4x4<f32>();
                var q2 = mat4x4<f32>();
                var q3 = mat4x4<f32>();
                var q4 = mat4x4<f32>();
                var q5 = mat4x4<f32>();
                var q6 = mat4x4<f32>();
                var q7 = mat4x4<f32>();
                if (T_KIND == 2u) {
                    q0 = q_bf16(c);
                    q1 = q_bf16(c + 1u);
                    q2 = q_bf16(c + 2u);
                    q3 = q_bf16(c + 3u);
                    q4 = q_bf16(c + 4u);
                    q5 = q_bf16(c + 5u);
                    q6 = q_bf16(c + 6u);
                    q7 = q_bf16(c + 7u);
                } else {
                    q0 = qs[c];
                    q1 = qs[c + 1u];
                    q2 = qs[c + 2u];
                    q3 = qs[c + 3u];
                    q4 = qs[c + 4u];
                    q5 = qs[c + 5u];
                    q6 = qs[c + 6u];
                    q7 = qs[c + 7u];
                }
                let w = (c0 + c) / 8u;
                let k0 = key4[rb[0] / 8u + w];
                let k1 = key4[rb[1] / 8u + w];
                let k2 = key4[rb[2] / 8u + w];
                let k3 = key4[rb[3] / 8u + w];
                let k4 = key4[rb[4] / 8u + w];
                let k5 = key4[rb[5] / 8u + w];
                let k6 = key4[rb[6] / 8u + w];
                let k7 = key4[rb[7] / 8u + w];
                let k8 = key4[rb[8] / 8u + w];
                let k9 = key4[rb[9] / 8u + w];
                let k10 = key4[rb[10] / 8u + w];
                let k11 = key4[rb[11] / 8u + w];
                let k12 = key4[rb[12] / 8u + w];
                let k13 = key4[rb[13] / 8u + w];
                let k14 = key4[rb[14] / 8u + w];
                let k15 = key4[rb[15] / 8u + w];
                a0 = acc4(acc4(a0, q0, q1, q2, q3, lo4(k0)), q4, q5, q6, q7, hi4(k0));
                a1 = acc4(acc4(a1, q0, q1, q2, q3, lo4(k1)), q4, q5, q6, q7, hi4(k1));
                a2 = acc4(acc4(a2, q0, q1, q2, q3, lo4(k2)), q4, q5, q6, q7, hi4(k2));
                a3 = acc4(acc4(a3, q0, q1, q2, q3, lo4(k3)), q4, q5, q6, q7, hi4(k3));
                a4 = acc4(acc4(a4, q0, q1, q2, q3, lo4(k4)), q4, q5, q6, q7, hi4(k4));
                a5 = acc4(acc4(a5, q0, q1, q2, q3, lo4(k5)), q4, q5, q6, q7, hi4(k5));
                a6 = acc4(acc4(a6, q0, q1, q2, q3, lo4(k6)), q4, q5, q6, q7, hi4(k6));
                a7 = acc4(acc4(a7, q0, q1, q2, q3, lo4(k7)), q4, q5, q6, q7, hi4(k7));
                a8 = acc4(acc4(a8, q0, q1, q2, q3, lo4(k8)), q4, q5, q6, q7, hi4(k8));
                a9 = acc4(acc4(a9, q0, q1, q2, q3, lo4(k9)), q4, q5, q6, q7, hi4(k9));
                a10 = acc4(acc4(a10, q0, q1, q2, q3, lo4(k10)), q4, q5, q6, q7, hi4(k10));
                a11 = acc4(acc4(a11, q0, q1, q2, q3, lo4(k11)), q4, q5, q6, q7, hi4(k11));
                a12 = acc4(acc4(a12, q0, q1, q2, q3, lo4(k12)), q4, q5, q6, q7, hi4(k12));
                a13 = acc4(acc4(a13, q0, q1, q2, q3, lo4(k13)), q4, q5, q6, q7, hi4(k13));
                a14 = acc4(acc4(a14, q0, q1, q2, q3, lo4(k14)), q4, q5, q6, q7, hi4(k14));
                a15 = acc4(acc4(a15, q0, q1, q2, q3, lo4(k15)), q4, q5, q6, q7, hi4(k15));
            }
        } else {
            for (var c = 0u; c < dc; c++) {
                let q = qs[c];
                let e = c0 + c;
                a0 += q * ld_k(rb[0] + e);
                a1 += q * ld_k(rb[1] + e);
                a2 += q * ld_k(rb[2] + e);
                a3 += q * ld_k(rb[3] + e);
                a4 += q * ld_k(rb[4] + e);
                a5 += q * ld_k(rb[5] + e);
                a6 += q * ld_k(rb[6] + e);
                a7 += q * ld_k(rb[7] + e);
                a8 += q * ld_k(rb[8] + e);
                a9 += q * ld_k(rb[9] + e);
                a10 += q * ld_k(rb[10] + e);
                a11 += q * ld_k(rb[11] + e);
                a12 += q * ld_k(rb[12] + e);
                a13 += q * ld_k(rb[13] + e);
                a14 += q * ld_k(rb[14] + e);
                a15 += q * ld_k(rb[15] + e);
            }
        }
    }

    finish_logits(lid, j0, w.vis, r * P.n2 + kv, w.hc, w.ns1, w.s1, a0, a1, a2, a3, a4, a5,
                  a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
}
