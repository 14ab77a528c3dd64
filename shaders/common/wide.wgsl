// 32-byte loads: a `vec4<u64>` word as the two 16-byte words it holds (little-endian: the low
// half of each 64-bit component first; u32() of a u64 keeps its low half). Only for devices
// with 64-bit integers in shaders (Capabilities::wide_loads); on llvmpipe a load is a loop over
// the SIMD lanes per component, so four 64-bit components move twice the bytes of four 32-bit
// ones for about the same cost.

fn words(w: vec4<u64>) -> array<vec4<u32>, 2> {
    return array<vec4<u32>, 2>(
        vec4<u32>(u32(w.x), u32(w.x >> 32u), u32(w.y), u32(w.y >> 32u)),
        vec4<u32>(u32(w.z), u32(w.z >> 32u), u32(w.w), u32(w.w >> 32u)));
}
