// The adapter's texture read bandwidth, beside bench_copy.wgsl's rooflines:
//   load_tex: the grid-stride walk of load_sum over the 16-byte texels of a texture of
//     8192-texel rows (the layout of the indexer's block-key copy, block_score_tex.wgsl),
//     summing them; nothing is written unless the sum reaches a value the host never lets it.

struct BenchCopyParams {
    words: u32,   // texels to read
    stride: u32,  // invocations in the grid
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: BenchCopyParams;
@group(0) @binding(1) var src: texture_2d<u32>;                         // [words / 8192, 8192] 16 B
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;  // 16 B words

@compute @workgroup_size(256)
fn load_tex(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let first = (wg.y * nwg.x + wg.x) * 256u + lid;
    var i = first;
    var acc = vec4<u32>(0u);
    while (i < P.words) {
        acc += textureLoad(src, vec2<u32>(i & 8191u, i >> 13u), 0);
        i += P.stride;
    }
    // The texture is zeros: the sum never reaches P.stride + 1.
    if (acc.x + acc.y + acc.z + acc.w == P.stride + 1u) {
        dst[first % arrayLength(&dst)] = acc;
    }
}
