// nsa_compress_attention (SPEC §8.1), stage 2 of 3: probabilities and values. One workgroup
// per (query row r, KV head, split of S2 compressed tokens); the chunks of 16 query heads are
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

// Accumulated values of channel ch (if it exists) for the chunk's nq quads.
fn store_part(a: mat4x4<f32>, ch: u32, at: u32, nq: u32) {
    if (ch < P.dv) {
        let t = at + ch * quads();
        scratch[t] = a[0];
        if (nq > 1u) { scratch[t + 1u] = a[1]; }
        if (nq > 2u) { scratch[t + 2u] = a[2]; }
        if (nq > 3u) { scratch[t + 3u] = a[3]; }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let g = group_size();
    let ns2 = splits2();
    if (id >= P.rows * P.n2 * ns2) {
        return;
    }
    // KV heads vary fastest: workgroups that run together read the same cache rows.
    let kv = id % P.n2;
    let s2 = (id / P.n2) % ns2;
    let r = id / (P.n2 * ns2);
    let rk = r * P.n2 + kv;  // (query row, KV head)
    let lo = s2 * S2;
    let fx = row_facts(r, lid, lo, lo + S2, false);
    let vis = fx[INFO_VIS];
    if (fx[INFO_FLAGS] != 0u || fx[INFO_PAD] != 0u || lo >= vis) {
        return;
    }
    let b = fx[INFO_B];
    let hi = min(lo + S2, vis);
    let ns1 = (vis + S1 - 1u) / S1;  // stage-1 splits that hold visible tokens
    let tiles = channel_tiles();
    let nparts = parts_per_split();
    let part = lid / tiles;
    let cb = (lid % tiles) * CT;  // first channel of this invocation

    for (var hc = 0u; hc < head_chunks(); hc++) {
        let nq = min(4u, quads() - hc * 4u);
        // 1. Softmax max and sum of each head of the chunk.
        let st = chunk_stats(lid, rk, hc, nq, ns1);
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
        for (var t0 = lo; t0 < hi; t0 += TILE) {
            let nt = min(TILE, hi - t0);
            workgroupBarrier();
            // 2. Probabilities of the tile's tokens.
            tile_probs(lid, t0, nt, rk, kv, b, hc, nq, g, st);
            workgroupBarrier();
            // 3. round_T(P)·V over this invocation's part of the tile. Channel groups past Dv
            // read the row's last group and are dropped.
            if (part < nparts) {
                let per = (TILE + nparts - 1u) / nparts;
                for (var jj = part * per; jj < min(nt, part * per + per); jj++) {
                    let p = tile_p(jj);
                    let vb = vrow[jj];
                    var v0 = vec4<f32>();
                    var v1 = vec4<f32>();
                    var v2 = vec4<f32>();
                    var v3 = vec4<f32>();
                    if (BY16 == 1u && T_KIND == 0u) {
                        let last = P.dv - 4u;
                        v0 = bitcast<vec4<f32>>(value4[(vb + min(cb, last)) / 4u]);
                        v1 = bitcast<vec4<f32>>(value4[(vb + min(cb + 4u, last)) / 4u]);
                        v2 = bitcast<vec4<f32>>(value4[(vb + min(cb + 8u, last)) / 4u]);
                        v3 = bitcast<vec4<f32>>(value4[(vb + min(cb + 12u, last)) / 4u]);
                    } else if (BY16 == 1u) {
                        let last = P.dv - 8u;
                        let w0 = value4[(vb + min(cb, last)) / 8u];
                        v0 = lo4(w0);
                        v1 = hi4(w0);
                        let w1 = value4[(vb + min(cb + 8u, last)) / 8u];
                        v2 = lo4(w1);
                        v3 = hi4(w1);
                    } else {
                        v0 = ld_v4(vb, cb);
                        v1 = ld_v4(vb, cb + 4u);
                        v2 = ld_v4(vb, cb + 8u);
                        v3 = ld_v4(vb, cb + 12u);
                    }
                    a0 += p * v0.x;
                    a1 += p * v0.y;
                    a2 += p * v0.z;
                    a3 += p * v0.w;
                    a4 += p * v1.x;
                    a5 += p * v1.y;
                    a6 += p * v1.z;
                    a7 += p * v1.w;
                    a8 += p * v2.x;
                    a9 += p * v2.y;
                    a10 += p * v2.z;
                    a11 += p * v2.w;
                    a12 += p * v3.x;
                    a13 += p * v3.y;
                    a14 += p * v3.z;
                    a15 += p * v3.w;
                }
            }
        }
        // This invocation's part of the split, for each head of the chunk.
        if (part < nparts) {
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
