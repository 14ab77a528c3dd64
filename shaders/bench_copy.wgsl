// The adapter's own rooflines, which `qsa bench` compares every preset with:
//   main: copy bandwidth. Each invocation copies 16-byte words i, i + stride, … (a grid-stride
//     loop, so a grid within the per-dimension limit covers any buffer).
//   load_sum: read bandwidth. The same walk, summing the words; nothing is written unless the sum
//     hits a value the host never lets it reach (so the loads cannot be dropped).
//   arith: arithmetic throughput. Each invocation runs `words` iterations of 16 vec4
//     multiply-adds on four independent accumulators in registers (128 FLOPs per iteration)
//     and writes the result only under the same kind of impossible condition.

struct BenchCopyParams {
    words: u32,   // 16-byte words to copy or read; fma: iterations per invocation
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

@compute @workgroup_size(256)
fn load_sum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wg.y * nwg.x + wg.x) * 256u + lid;
    var i = first;
    var acc = vec4<u32>(0u);
    while (i < P.words) {
        acc += src[i];
        i += P.stride;
    }
    // The buffer is zeros: the sum never reaches P.stride + 1.
    if (acc.x + acc.y + acc.z + acc.w == P.stride + 1u) {
        dst[first % P.words] = acc;
    }
}

@compute @workgroup_size(256)
fn arith(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let first = (wg.y * nwg.x + wg.x) * 256u + lid;
    let x = f32(lid) * 1e-3;
    // Four accumulator quads, each advanced by four dependent steps per iteration: 16
    // multiply-adds of 4 lanes, 128 FLOPs.
    var a = vec4<f32>(x, x + 1.0, x + 2.0, x + 3.0);
    var b = a + vec4<f32>(4.0);
    var c = a + vec4<f32>(8.0);
    var d = a + vec4<f32>(12.0);
    let m = vec4<f32>(0.999);
    let k = vec4<f32>(1e-4);
    for (var it = 0u; it < P.words; it++) {
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
    }
    let s = a + b + c + d;
    // The values stay finite and positive: the sum is never -1.
    if (s.x + s.y + s.z + s.w == -1.0) {
        dst[first % arrayLength(&dst)] = bitcast<vec4<u32>>(s);
    }
}
