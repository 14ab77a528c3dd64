// nsa_compress_attention (SPEC §8.1), stage 1 of 3, subgroup variant with 32-byte loads: the
// kernel of nsa_compress_attention_sg.wgsl (same bindings, work split and outputs, bit for bit)
// whose K rows are read as 32-byte `vec4<u64>` words, half as many loads as 16-byte ones.
// Chosen where the device has 64-bit integers in shaders and K rows start on 32-byte
// boundaries (Dqk·sizeof(T) a multiple of 32). On llvmpipe the key loads are the larger part
// of this stage (docs/perf.md), each a loop over the SIMD lanes per component.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_logits.wgsl
//#include common/nsa_logits_sg.wgsl
//#include common/wide.wgsl

@group(0) @binding(4) var<storage, read> query4: array<vec4<u32>>;  // [R, N1, Dqk] T, 16 bytes a load
@group(0) @binding(5) var<storage, read> key: array<u32>;           // [num_blocks, page, N2·Dqk] T (unused here)
@group(0) @binding(6) var<storage, read> key8: array<vec4<u64>>;    // the same, 32 bytes a load
@group(0) @binding(7) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl

// Channels c … c + 7 of an f32 K row at element rb: one 32-byte word.
fn f32_key8(rb: u32, c: u32) -> array<vec4<f32>, 2> {
    let a = words(key8[(rb + c) / 8u]);
    return live2(c, bitcast<vec4<f32>>(a[0]), bitcast<vec4<f32>>(a[1]));
}

// Channels c … c + 15 of a 16-bit K row at element rb: one 32-byte word.
fn half_key16(rb: u32, c: u32) -> array<vec4<f32>, 4> {
    let a = words(key8[(rb + c) / 16u]);
    return live4(c, lo4(a[0]), hi4(a[0]), lo4(a[1]), hi4(a[1]));
}
