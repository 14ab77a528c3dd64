// nsa_compress_attention (SPEC §8.1), stage 1 of 3, the GPU-shaped kernel: the outputs of
// nsa_compress_attention.wgsl (logits into the scratch, each split's max and sum of exp per
// head) from many more, lighter invocations. One workgroup of GWG = 256 invocations per
// (query row r, KV head, chunk of 16 query heads, split of P.split1 = GWG compressed tokens);
// invocation lid owns token lo + lid and its chunk's 16 dot products, one mat4x4 accumulator
// (column h / 4, row h % 4). The query chunk is staged DC channels at a time in workgroup
// memory, where every invocation reads the same element (a broadcast on a GPU), and K rows
// are read 16 bytes at a time where they allow it (BY16).
//
// The portable kernel's shape (64 invocations × 16 tokens, 16 accumulators each) suits
// llvmpipe, whose workgroup is one thread walking 8-lane SIMD vectors; on a GPU it leaves
// most multiprocessors idle (nsa-decode: 32 workgroups of 64) and spills its accumulators.
// Here nsa-decode is 128 workgroups of 256, each invocation holding 16 accumulators. Chosen
// where the context asks for it (`Capabilities::gpu_nsa`), with its values stage
// (nsa_compress_attention_values_gpu.wgsl).
//
// Tokens past vis are computed on the row of the last visible token and dropped. The
// workgroup's statistics are merged by a tree over the invocations (workgroup memory and
// barriers), four heads at a time.

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
// bound to the key buffer; 0: key4 is a dummy. A specialisation constant.
override BY16: u32 = 0u;

const GWG: u32 = 256u;  // invocations per workgroup, one token each: P.split1

// Slot i of the merge tree (the staging slots qs, free after the dot products): the running
// max and sum of exp of four heads.
fn slot_m(i: u32) -> vec4<f32> { return qs[i / 2u][2u * (i % 2u)]; }
fn slot_s(i: u32) -> vec4<f32> { return qs[i / 2u][2u * (i % 2u) + 1u]; }
fn set_slot(i: u32, m: vec4<f32>, s: vec4<f32>) {
    qs[i / 2u][2u * (i % 2u)] = m;
    qs[i / 2u][2u * (i % 2u) + 1u] = s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = logits_work(wg.y * nwg.x + wg.x, lid);
    if (w.skip) {
        return;
    }
    let r = w.r;
    let nh = w.nh;
    let j = w.lo + lid;  // this invocation's token
    let rb = key_row(w.b, w.kv, j, w.vis);
    var a = mat4x4<f32>();
    for (var c0 = 0u; c0 < P.dqk; c0 += DC) {
        let dc = min(DC, P.dqk - c0);
        workgroupBarrier();
        stage_query(lid, GWG, r, w.h0, nh, c0, dc, BY16 == 1u);
        workgroupBarrier();
        if (BY16 == 1u && T_KIND == 0u) {
            // f32: four channels per 16-byte load.
            for (var c = 0u; c < dc; c += 4u) {
                let k = bitcast<vec4<f32>>(key4[(rb + c0 + c) / 4u]);
                a = acc4(a, qs[c], qs[c + 1u], qs[c + 2u], qs[c + 3u], k);
            }
        } else if (BY16 == 1u) {
            // f16 / bf16: eight channels per 16-byte load.
            for (var c = 0u; c < dc; c += 8u) {
                let k = key4[(rb + c0 + c) / 8u];
                if (T_KIND == 2u) {
                    a = acc4(a, q_bf16(c), q_bf16(c + 1u), q_bf16(c + 2u), q_bf16(c + 3u), lo4(k));
                    a = acc4(a, q_bf16(c + 4u), q_bf16(c + 5u), q_bf16(c + 6u), q_bf16(c + 7u),
                             hi4(k));
                } else {
                    a = acc4(a, qs[c], qs[c + 1u], qs[c + 2u], qs[c + 3u], lo4(k));
                    a = acc4(a, qs[c + 4u], qs[c + 5u], qs[c + 6u], qs[c + 7u], hi4(k));
                }
            }
        } else {
            for (var c = 0u; c < dc; c++) {
                a += qs[c] * ld_k(rb + c0 + c);
            }
        }
    }

    // The token's logits (if visible), then its (max, sum of exp) per head: (x, exp(x − x))
    // when visible, else "no token" (−inf, 0).
    let x = a * P.scale;
    let rk = r * P.n2 + w.kv;
    let nq = min(4u, quads() - w.hc * 4u);
    store_x(x, j, w.vis, logits_at(rk) + w.hc * 4u, nq);
    let ni = neg_inf();
    var m = mat4x4<f32>(vec4<f32>(ni), vec4<f32>(ni), vec4<f32>(ni), vec4<f32>(ni));
    var s = mat4x4<f32>();
    if (j < w.vis) {
        m = x;
        s = mexp(x, x);
    }
    // Merge the GWG invocations pairwise, a quad of heads at a time: after level lv, slot i <
    // GWG >> (lv + 1) holds the merge of the 2^(lv + 1) invocations ≡ i (mod GWG >> (lv + 1)).
    let st = stats_at(rk) + (w.hc * w.ns1 + w.s1) * 8u;
    for (var q = 0u; q < 4u; q++) {
        workgroupBarrier();
        set_slot(lid, m[q], s[q]);
        for (var lv = 0u; lv < 8u; lv++) {
            let half = (GWG / 2u) >> lv;
            workgroupBarrier();
            if (lid < half) {
                let ms = merge4(slot_m(lid), slot_s(lid), slot_m(lid + half), slot_s(lid + half));
                set_slot(lid, ms[0], ms[1]);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            scratch[st + q] = slot_m(0u);
            scratch[st + 4u + q] = slot_s(0u);
        }
    }
}
