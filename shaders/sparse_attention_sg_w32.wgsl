// sparse_attention, stage 2 of 3, subgroup variant with 32-byte loads (SPEC §7): the pass of
// sparse_attention_sg.wgsl (common/attention_sg.wgsl) whose K and V rows are read as
// `vec4<u64>` words, W = 2 channel quads a load for f32 and 4 for 16-bit T, half as many loads
// as 16-byte words. Chosen where the device has 64-bit integers in shaders and every pool row
// starts on a 32-byte boundary (Dp and the page stride multiples of 32 bytes). Bindings 5 … 8
// are the pass's PS pool shards (slots 0 … 3; slots past PS repeat a bound shard) seen as
// 32-byte words; binding 2 (read by nothing here) is slot 0's shard again.

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl
//#include common/attention_sg.wgsl
//#include common/wide.wgsl

@group(0) @binding(5) var<storage, read> pool8: array<vec4<u64>>;   // slot 0's shard
@group(0) @binding(6) var<storage, read> pool8_1: array<vec4<u64>>; // slot 1's shard
@group(0) @binding(7) var<storage, read> pool8_2: array<vec4<u64>>; // slot 2's shard
@group(0) @binding(8) var<storage, read> pool8_3: array<vec4<u64>>; // slot 3's shard

// log2 of the elements of T in a 32-byte word.
fn word_log2() -> u32 {
    return select(4u, 3u, T_KIND == 0u);
}

// Word j of slot s's shard (s is a constant in each expansion of
// common/attention_sg_shard.wgsl, so the choice folds away).
fn word8(s: u32, j: u32) -> vec4<u64> {
    if (PS == 1u || s == 0u) {
        return pool8[j];
    }
    var w = vec4<u64>();
    switch s {
        case 1u: { w = pool8_1[j]; }
        case 2u: { w = pool8_2[j]; }
        default: { w = pool8_3[j]; }
    }
    return w;
}

// Quads c/4 … c/4 + W − 1 of the row starting at element i of slot s's shard (contract in
// common/attention_sg.wgsl).
fn ld_word(s: u32, i: u32, c: u32, e: u32) -> mat4x4<f32> {
    let w = words(word8(s, word_at(i, c, e) >> word_log2()));
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

// Words kw and vw of slot s's K and V rows and those 128 bytes (4 words) on, or the rows' last
// words kw + kl and vw + vl if shorter.
fn touch(s: u32, kw: u32, vw: u32, kl: u32, vl: u32) -> u32 {
    return u32(word8(s, kw).x | word8(s, kw + min(4u, kl)).x | word8(s, vw).x | word8(s, vw + min(4u, vl)).x);
}
