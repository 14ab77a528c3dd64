// nsa_compress_attention (SPEC §8.1), stage 2 of 3, subgroup variant: probabilities and values
// as nsa_compress_attention_values.wgsl, for adapters whose subgroups are 8 lanes, where V rows
// start on 16-byte boundaries and Dv takes 8 channel tiles (113 ≤ Dv ≤ 128, as NSA's 128).
// Same bindings, work split, scratch records and psum; steps 1 and 2 are the same.
//
// Step 3 differs in who reads what. Subgroup u takes part u of the tile (parts = subgroups =
// 8) and lane sl its channel tile (CT = 16 channels), so all lanes of a subgroup work on the
// same token. The portable kernel has every invocation read each token's probabilities and V
// row offset from workgroup memory; on llvmpipe each such read is a loop over the lanes, and
// there were more of them than V loads. Here the lanes read eight tokens' probabilities and
// offsets at once, one token each, and subgroupShuffle (a single vector permute on llvmpipe)
// hands each token's to every lane in turn.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T (read through value4 here)
@group(0) @binding(5) var<storage, read> value4: array<vec4<u32>>;  // the same, 16 bytes a load
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sub: u32, @builtin(subgroup_invocation_id) sl: u32) {
    let id = wg.y * nwg.x + wg.x;
    let g = group_size();
    if (id >= P.rows * P.n2 * splits2()) {
        return;
    }
    let w = values_work(id, lid);
    if (w.skip) {
        return;
    }
    let rk = w.rk;
    let s2 = w.s2;
    let nparts = parts_per_split();  // 8: one per subgroup
    let part = sub;
    let cb = sl * CT;  // first channel of this invocation

    for (var hc = 0u; hc < head_chunks(); hc++) {
        let nq = min(4u, quads() - hc * 4u);
        // 1. Softmax max and sum of each head of the chunk.
        let st = chunk_stats(lid, rk, hc, nq, w.ns1);
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
        for (var t0 = w.lo; t0 < w.hi; t0 += TILE) {
            let nt = min(TILE, w.hi - t0);
            workgroupBarrier();
            // 2. Probabilities of the tile's tokens.
            tile_probs(lid, t0, nt, rk, w.kv, w.b, hc, nq, g, st);
            workgroupBarrier();
            // 3. round_T(P)·V over this subgroup's part of the tile, eight tokens at a time:
            // lane k reads token jj0 + k's P and V row offset; each token's go to every lane
            // by subgroupShuffle. Channel groups past Dv read the row's last group and are
            // dropped.
            {
                let per = TILE / nparts;
                let end = min(nt, part * per + per);
                for (var jj0 = part * per; jj0 < end; jj0 += 8u) {
                    let mine = min(jj0 + sl, end - 1u);
                    let pl = tile_p(mine);
                    let vl = vrow[mine];
                    for (var k = 0u; k < min(8u, end - jj0); k++) {
                        let p = mat4x4<f32>(subgroupShuffle(pl[0], k), subgroupShuffle(pl[1], k),
                                            subgroupShuffle(pl[2], k), subgroupShuffle(pl[3], k));
                        let vb = subgroupShuffle(vl, k);
                        let v = v_row16(vb, cb);
                        a0 += p * v[0].x;
                        a1 += p * v[0].y;
                        a2 += p * v[0].z;
                        a3 += p * v[0].w;
                        a4 += p * v[1].x;
                        a5 += p * v[1].y;
                        a6 += p * v[1].z;
                        a7 += p * v[1].w;
                        a8 += p * v[2].x;
                        a9 += p * v[2].y;
                        a10 += p * v[2].z;
                        a11 += p * v[2].w;
                        a12 += p * v[3].x;
                        a13 += p * v[3].y;
                        a14 += p * v[3].z;
                        a15 += p * v[3].w;
                    }
                }
            }
        }
        // This invocation's part of the split, for each head of the chunk.
        {
            let at = partial_at(rk) + (s2 * nparts + part) * P.dv * quads() + hc * 4u;
            store_part(a0, cb, at, nq);
            store_part(a1, cb + 1u, at, nq);
            store_part(a2, cb + 2u, at, nq);
            store_part(a3, cb + 3u, at, nq);
            store_part(a4, cb + 4u, at, nq);
            store_part(a5, cb + 5u, at, nq);
            store_part(a6, cb + 6u, at, nq);
            store_part(a7, cb + 7u, at, nq);
            store_part(a8, cb + 8u, at, nq);
            store_part(a9, cb + 9u, at, nq);
            store_part(a10, cb + 10u, at, nq);
            store_part(a11, cb + 11u, at, nq);
            store_part(a12, cb + 12u, at, nq);
            store_part(a13, cb + 13u, at, nq);
            store_part(a14, cb + 14u, at, nq);
            store_part(a15, cb + 15u, at, nq);
        }
        workgroupBarrier();
    }
}
