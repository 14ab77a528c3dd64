// sparse_attention, stage 2 of 3, subgroup variant (SPEC §7): the partial pass of
// sparse_attention.wgsl for adapters whose subgroups have one fixed size SG, reading the pool
// in 16-byte words: W = 1 channel quad a load for f32, 2 for 16-bit T; element by element
// (W = 1) where rows do not start on whole words (VEC = 0). The pass itself, and what it
// shares with sparse_attention_sg_w32.wgsl, is in common/attention_sg.wgsl.

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl
//#include common/attention_sg.wgsl

// log2 of the elements of T in a 16-byte word.
fn word_log2() -> u32 {
    return select(3u, 2u, T_KIND == 0u);
}

// Quads c/4 … c/4 + W − 1 of the pool row starting at element i (contract in
// common/attention_sg.wgsl).
fn ld_word(i: u32, c: u32, e: u32) -> mat4x4<f32> {
    let j = word_at(i, c, e);
    var m = mat4x4<f32>();
    if (VEC != 0u && T_KIND == 0u) {
        m[0] = bitcast<vec4<f32>>(pool[j >> word_log2()]);
    } else if (VEC != 0u) {
        let w = pool[j >> word_log2()];
        m[0] = lo4(w);
        m[1] = hi4(w);
    } else {
        m[0] = vec4<f32>(ld_el(j), ld_el(j + 1u), ld_el(j + 2u), ld_el(j + 3u));
    }
    return live_quads(m, c, e);
}

// Words kw and vw of the K and V rows and those 128 bytes (8 words) on, or the rows' last
// words kw + kl and vw + vl if shorter; nothing where rows are read element by element.
fn touch(kw: u32, vw: u32, kl: u32, vl: u32) -> u32 {
    if (VEC == 0u) {
        return 0u;
    }
    return pool[kw].x | pool[kw + min(8u, kl)].x | pool[vw].x | pool[vw + min(8u, vl)].x;
}
