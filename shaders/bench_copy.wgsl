// bench_copy: the adapter's own copy bandwidth, the roofline `qsa bench` compares against.
// Each invocation copies 16-byte words i, i + stride, … (a grid-stride loop, so a grid within
// the per-dimension limit covers any buffer).

struct BenchCopyParams {
    words: u32,   // 16-byte words to copy
    stride: u32,  // invocations in the grid
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: BenchCopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;        // [words] 16 B
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;  // [words] 16 B

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    var i = (wg.y * nwg.x + wg.x) * 256u + lid;
    while (i < P.words) {
        dst[i] = src[i];
        i += P.stride;
    }
}
