// sparse_attention, stage 2 of 3, subgroup variant with 32-byte loads (SPEC §7): the pass of
// sparse_attention_sg.wgsl (common/attention_sg.wgsl) whose K and V rows are read as
// `vec4<u64>` words, W = 2 channel quads a load for f32 and 4 for 16-bit T, half as many loads
// as 16-byte words. Chosen where the device has 64-bit integers in shaders and every pool row
// starts on a 32-byte boundary (Dp and the page stride multiples of 32 bytes). Binding 5 is
// the pool shard of binding 2 again, seen as 32-byte words.

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl
//#include common/attention_sg.wgsl
//#include common/wide.wgsl

@group(0) @binding(5) var<storage, read> pool8: array<vec4<u64>>;  // binding 2's shard, 32 bytes a load

// log2 of the elements of T in a 32-byte word.
fn word_log2() -> u32 {
    return select(4u, 3u, T_KIND == 0u);
}

// Quads c/4 … c/4 + W − 1 of the pool row starting at element i (contract in
// common/attention_sg.wgsl).
fn ld_word(i: u32, c: u32, e: u32) -> mat4x4<f32> {
    let w = words(pool8[word_at(i, c, e) >> word_log2()]);
    var m = mat4x4<f32>();
    if (T_KIND == 0u) {
        m[0] = bitcast<vec4<f32>>(w[0]);
        m[1] = bitcast<vec4<f32>>(w[1]);
    } else {
        m[0] = lo4(w[0]);
        m[1] = hi4(w[0]);
        m[2] = lo4(w[1]);
        m[3] = hi4(w[1]);
    }
    return live_quads(m, c, e);
}

// Words kw and vw of the K and V rows and those 128 bytes (4 words) on, or the rows' last
// words kw + kl and vw + vl if shorter.
fn touch(kw: u32, vw: u32, kl: u32, vl: u32) -> u32 {
    return u32(pool8[kw].x | pool8[kw + min(4u, kl)].x | pool8[vw].x | pool8[vw + min(4u, vl)].x);
}
