// nsa_compress_attention (SPEC §8.1), stage 2 of 3, the GPU-shaped kernel: the outputs of
// nsa_compress_attention_values.wgsl (psum, and each stage-2 part's Σ round_T(P_j)·V_j in the
// partial scratch) from a workgroup per part rather than per split. One workgroup of WG = 64
// invocations per (query row r, KV head, split of P.split2 tokens, part of the split: the
// split's tokens cut into parts_per_split() runs of consecutive tokens); the chunks of 16
// query heads are taken one after another. Per chunk:
//   1. each head's softmax max and sum over all visible tokens, merged from stage 1's splits;
//   2. a tile of WG tokens at a time: invocation lid computes P of token lid for the chunk's
//      heads (the group's sum of P to psum), round_T(P) and the token's V row into workgroup
//      memory;
//   3. invocation lid accumulates channels lid, lid + 64, lid + 128 and lid + 192 of the
//      current block of 256 channels over the tile's tokens (16 heads each, in a mat4x4), so
//      that the workgroup reads each V row in consecutive words and each P from workgroup
//      memory. A Dv past 256 takes its blocks one after another, steps 2 and 3 again for each
//      (psum only in the first).
// nsa-decode on a GPU is then 128 workgroups (4 KV heads × 4 splits of 2048 × 8 parts) where
// the portable kernel has 16, each of whose invocations holds 256 accumulators. Chosen where
// the context asks for it (`Capabilities::gpu_nsa`), with its logits stage
// (nsa_compress_attention_gpu.wgsl).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T
@group(0) @binding(5) var<storage, read> value4: array<vec4<u32>>;  // the same or a dummy (not read here)
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

const VB: u32 = 256u;  // channels per block: four per invocation

fn ld_v(i: u32) -> f32 { return t_load(value[t_word(i)], i); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let g = group_size();
    let nparts = parts_per_split();
    if (id >= P.rows * P.n2 * splits2() * nparts) {
        return;
    }
    let part = id % nparts;
    let w = values_work(id / nparts, lid);
    if (w.skip) {
        return;
    }
    let rk = w.rk;
    // This part's tokens t_lo … t_hi − 1 (the last parts may be short or empty; an empty
    // part still writes its zeros, which stage 3 adds).
    let n = w.hi - w.lo;
    let per = (n + nparts - 1u) / nparts;
    let t_lo = w.lo + min(part * per, n);
    let t_hi = w.lo + min(part * per + per, n);
    let last = P.dv - 1u;
    let at = partial_at(rk) + (w.s2 * nparts + part) * P.dv * quads();

    for (var hc = 0u; hc < head_chunks(); hc++) {
        let nq = min(4u, quads() - hc * 4u);
        // 1. Softmax max and sum of each head of the chunk.
        let st = chunk_stats(lid, rk, hc, nq, w.ns1);
        for (var c0 = 0u; c0 < P.dv; c0 += VB) {
            let ch = c0 + lid;
            var a0 = mat4x4<f32>();
            var a1 = mat4x4<f32>();
            var a2 = mat4x4<f32>();
            var a3 = mat4x4<f32>();
            for (var t0 = t_lo; t0 < t_hi; t0 += WG) {
                let nt = min(WG, t_hi - t0);
                workgroupBarrier();
                // 2. Probabilities of the tile's tokens (psum in the first block only).
                tile_probs(lid, t0, nt, rk, w.kv, w.b, hc, nq, g, st, c0 == 0u);
                workgroupBarrier();
                // 3. round_T(P)·V over the tile, channel by channel (channels past Dv read the
                // row's last one and are dropped).
                for (var jj = 0u; jj < nt; jj++) {
                    let p = tile_p(jj);
                    let vb = vrow[jj];
                    a0 += p * ld_v(vb + min(ch, last));
                    if (c0 + 64u < P.dv) {
                        a1 += p * ld_v(vb + min(ch + 64u, last));
                    }
                    if (c0 + 128u < P.dv) {
                        a2 += p * ld_v(vb + min(ch + 128u, last));
                    }
                    if (c0 + 192u < P.dv) {
                        a3 += p * ld_v(vb + min(ch + 192u, last));
                    }
                }
            }
            // This part's sums of the block's channels, for each head of the chunk.
            store_part(a0, ch, at + hc * 4u, nq);
            store_part(a1, ch + 64u, at + hc * 4u, nq);
            store_part(a2, ch + 128u, at + hc * 4u, nq);
            store_part(a3, ch + 192u, at + hc * 4u, nq);
        }
        workgroupBarrier();
    }
}
