// The subgroup variant of nsa_compress_attention's values stage (SPEC §8.1): its entry point,
// shared by nsa_compress_attention_values_sg.wgsl (V rows read in 16-byte words) and
// nsa_compress_attention_values_sg_w32.wgsl (32-byte words), which declare the bindings and
// supply `v_row(vb, cb)` (the 16-byte one from common/nsa_values_rows16.wgsl): channels cb … cb + 15 of the V row at element vb as four quads, a quad past
// Dv reading the row's last one (its channels are dropped), and `touch_v(e)`, the 32-bit word
// holding element e (the touches of the next batch's rows). nsa_compress_attention_values_sg_tex.wgsl
// supplies both from a texture copy of V. What the entry point does is
// described at the top of nsa_compress_attention_values_sg.wgsl.

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

    // This part's tokens t_lo … t_hi − 1: whole batches of 8 (the last part may be short or
    // empty).
    let n = w.hi - w.lo;
    let per = (n + nparts * 8u - 1u) / (nparts * 8u) * 8u;
    let t_lo = w.lo + min(part * per, n);
    let t_hi = w.lo + min(part * per + per, n);
    let ps_row = rk * P.c_max;

    var tk = 0u;  // the touched words (kept only so that the loads stay)
    for (var hc = 0u; hc < head_chunks(); hc++) {
        let nq = min(4u, quads() - hc * 4u);
        // 1. Softmax max and sum of each head of the chunk.
        let st = chunk_stats_local(rk, hc, nq, w.ns1);
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
        for (var j0 = t_lo; j0 < t_hi; j0 += 8u) {
            // 2. Lane sl's token j: P of the chunk's heads (0 past the group), the group's sum
            // of P into psum (added over the chunks), round_T(P) and its V row offset. Lanes
            // past the part read its last token and write nothing.
            let j = min(j0 + sl, t_hi - 1u);
            let p = token_probs(rk, j, hc, nq, g, st);
            if (j0 + sl < t_hi) {
                add_psum(ps_row + j, hc, p);
            }
            let pl = mat4x4<f32>(t_round4(p[0]), t_round4(p[1]), t_round4(p[2]), t_round4(p[3]));
            let vl = (cache_row(w.b, j) * P.n2 + w.kv) * P.dv;
            // Lane sl touches the V row of the next batch's token sl (a word per 64 bytes),
            // so that the next batch's cache misses overlap this batch's work.
            let vn = (cache_row(w.b, min(j0 + 8u + sl, t_hi - 1u)) * P.n2 + w.kv) * P.dv;
            for (var c = 0u; c < P.dv; c += select(32u, 16u, T_KIND == 0u)) {
                tk |= touch_v(vn + c);
            }
            // 3. round_T(P)·V, token by token: each token's P and row offset go to every lane
            // by subgroupShuffle. Channel groups past Dv read the row's last group and are
            // dropped.
            for (var k = 0u; k < min(8u, t_hi - j0); k++) {
                let pk = mat4x4<f32>(subgroupShuffle(pl[0], k), subgroupShuffle(pl[1], k),
                                     subgroupShuffle(pl[2], k), subgroupShuffle(pl[3], k));
                let vb = subgroupShuffle(vl, k);
                let v = v_row(vb, cb);
                a0 += pk * v[0].x;
                a1 += pk * v[0].y;
                a2 += pk * v[0].z;
                a3 += pk * v[0].w;
                a4 += pk * v[1].x;
                a5 += pk * v[1].y;
                a6 += pk * v[1].z;
                a7 += pk * v[1].w;
                a8 += pk * v[2].x;
                a9 += pk * v[2].y;
                a10 += pk * v[2].z;
                a11 += pk * v[2].w;
                a12 += pk * v[3].x;
                a13 += pk * v[3].y;
                a14 += pk * v[3].z;
                a15 += pk * v[3].w;
            }
        }
        // This invocation's part of the split, for each head of the chunk.
        store_parts(rk, s2, nparts, part, hc, cb, nq, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10,
                    a11, a12, a13, a14, a15);
    }
    if (tk == 0x7fc00001u && t_hi == t_lo) {
        psum[ps_row] = 0.0;  // never: with no token nothing was touched
    }
}
