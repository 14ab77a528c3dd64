// sparse_attention, stage 2 of 3, subgroup variant (SPEC §7): the partial pass of
// sparse_attention.wgsl for adapters whose subgroups have one fixed size SG, reading the pool
// in 16-byte words: W = 1 channel quad a load for f32, 2 for 16-bit T; element by element
// (W = 1) where rows do not start on whole words (VEC = 0). The pass itself, and what it
// shares with sparse_attention_sg_w32.wgsl, is in common/attention_sg.wgsl.

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl
//#include common/attention_sg.wgsl

// Quads c/4 … c/4 + W − 1 of the pool row starting at element i (contract in
// common/attention_sg.wgsl).
fn ld_word(i: u32, c: u32, e: u32) -> mat4x4<f32> {
    let j = word_at(i, c, e);
    var m = mat4x4<f32>();
    if (VEC != 0u && T_KIND == 0u) {
        m[0] = bitcast<vec4<f32>>(pool[j >> 2u]);
    } else if (VEC != 0u) {
        let w = pool[j >> 3u];
        m[0] = lo4(w);
        m[1] = hi4(w);
    } else {
        m[0] = vec4<f32>(ld_el(j), ld_el(j + 1u), ld_el(j + 2u), ld_el(j + 3u));
    }
    return live_quads(m, c, e);
}

// The first words of the K and V rows at rb and those 128 bytes on (the rows' last words if
// shorter).
fn touch(rb: u32) -> u32 {
    if (VEC == 0u) {
        return 0u;
    }
    let sh = select(3u, 2u, T_KIND == 0u);  // log2 of the elements per 16-byte word
    let kl = ((P.e + (1u << sh) - 1u) >> sh) - 1u;
    let vl = ((v_dim() + (1u << sh) - 1u) >> sh) - 1u;
    let kw = (rb + P.k_off) >> sh;
    let vw = (rb + P.v_off) >> sh;
    return pool[kw].x | pool[kw + min(8u, kl)].x | pool[vw].x | pool[vw + min(8u, vl)].x;
}
