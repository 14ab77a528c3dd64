// nsa_compress_attention (SPEC §8.1), stage 1 of 3, subgroup variant reading K from a texture
// copy: the kernel of nsa_compress_attention_sg.wgsl (same work split and outputs, bit for
// bit) whose K rows are texel fetches of a gpu::WordTexture of the K buffer, two 16-byte
// texels per 32-byte word of a row. Chosen where the caller passes that copy
// (NsaAttnBuffers::key_tex) and the context reads texture copies (Capabilities::textures).
// On llvmpipe a storage load is a loop over the SIMD lanes, which on a host without AVX-512
// moves each lane's value into the result through the stack; a texel fetch is one vector
// gather (docs/perf.md, nsa-decode).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_logits.wgsl
//#include common/nsa_logits_sg.wgsl
//#include common/texel.wgsl

@group(0) @binding(4) var<storage, read> query4: array<vec4<u32>>;  // [R, N1, Dqk] T, 16 bytes a load
@group(0) @binding(5) var key_tex: texture_2d<u32>;                 // [num_blocks, page, N2·Dqk] T, in 16-byte texels
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl

fn key_word(i: u32) -> vec4<u32> {
    return textureLoad(key_tex, texel(i), 0);
}

// Channels c … c + 7 of an f32 K row at element rb: two 16-byte texels.
fn f32_key8(rb: u32, c: u32) -> array<vec4<f32>, 2> {
    let e = (rb + c) / 4u;
    return live2(c, bitcast<vec4<f32>>(key_word(e)), bitcast<vec4<f32>>(key_word(e + 1u)));
}

// Channels c … c + 15 of a 16-bit K row at element rb: two 16-byte texels.
fn half_key16(rb: u32, c: u32) -> array<vec4<f32>, 4> {
    let e = (rb + c) / 8u;
    let w0 = key_word(e);
    let w1 = key_word(e + 1u);
    return live4(c, lo4(w0), hi4(w0), lo4(w1), hi4(w1));
}
