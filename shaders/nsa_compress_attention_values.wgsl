// nsa_compress_attention (SPEC §8.1), stage 2 of 3: probabilities and values. One workgroup
// per (query row r, KV head, split of P.split2 compressed tokens); the chunks of 16 query heads are
// taken one after another. Per chunk:
//   1. each head's softmax max and sum over all visible tokens, merged from stage 1's splits;
//   2. a tile of TILE tokens at a time: P_j = exp(x_j − max) / sum for the chunk's heads (the
//      group's sum of P goes to psum, the selection scores' input), round_T(P_j) and the
//      token's V row to workgroup memory (bf16: as bf16 pairs, exact in half the loads);
//   3. invocation lid takes channel tile lid % tiles (CT = 16 channels) and part lid / tiles
//      of the tile (a run of consecutive tokens), keeping 16 mat4x4 accumulators (16 channels
//      × 16 heads), so each V row is read once for all the chunk's heads.
// Each part's Σ round_T(P_j)·V_j goes to the partial scratch; stage 3 adds the parts up.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl
//#include common/nsa_values_rows16.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T
@group(0) @binding(5) var<storage, read> value4: array<vec4<u32>>;  // the same, 16 bytes a load (or a dummy)
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

// 1: the V rows start on 16-byte boundaries (Dv·sizeof(T) a multiple of 16) and value4 is
// bound to the value buffer; 0: value4 is a dummy. A specialisation constant: one inner loop
// per pipeline.
override BY16: u32 = 0u;


fn ld_v(i: u32) -> f32 { return t_load(value[t_word(i)], i); }

// Four channels from element e on, each clamped to the row's last channel.
fn ld_v4(vb: u32, e: u32) -> vec4<f32> {
    let last = P.dv - 1u;
    return vec4<f32>(ld_v(vb + min(e, last)), ld_v(vb + min(e + 1u, last)),
                     ld_v(vb + min(e + 2u, last)), ld_v(vb + min(e + 3u, last)));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
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
    let tiles = channel_tiles();
    let nparts = parts_per_split();
    let part = lid / tiles;
    let cb = (lid % tiles) * CT;  // first channel of this invocation

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
            tile_probs(lid, t0, nt, rk, w.kv, w.b, hc, nq, g, st, true);
            workgroupBarrier();
            // 3. round_T(P)·V over this invocation's part of the tile. Channel groups past Dv
            // read the row's last group and are dropped.
            if (part < nparts) {
                let per = (TILE + nparts - 1u) / nparts;
                for (var jj = part * per; jj < min(nt, part * per + per); jj++) {
                    let p = tile_p(jj);
                    let vb = vrow[jj];
                    var v = array<vec4<f32>, 4>();
                    if (BY16 == 1u) {
                        v = v_row(vb, cb);
                    } else {
                        v = array<vec4<f32>, 4>(ld_v4(vb, cb), ld_v4(vb, cb + 4u), ld_v4(vb, cb + 8u),
                                                ld_v4(vb, cb + 12u));
                    }
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
        // This invocation's part of the split, for each head of the chunk.
        if (part < nparts) {
            store_parts(rk, s2, nparts, part, hc, cb, nq, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10,
                        a11, a12, a13, a14, a15);
        }
        workgroupBarrier();
    }
}
