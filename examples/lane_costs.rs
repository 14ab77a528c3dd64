//! What the building blocks of the kernels cost on this adapter: each probe is a loop of 1024
//! iterations in 64 workgroups of 64 invocations, timed on the wall clock (best of six
//! dispatches), and reported in nanoseconds per invocation and iteration. docs/perf.md quotes
//! these figures for lavapipe, where they explain the shapes of the kernels (on a GPU they
//! are mostly far below the dispatch overhead). Run with
//! `cargo run --release --example lane_costs`.

use qsa_wgpu::gpu::{Context, ContextOptions};
use std::time::Instant;

/// Invocations × iterations of every probe (the shader's 64 × 64 × N).
const LANE_ITERATIONS: f64 = 64.0 * 64.0 * 1024.0;

/// The probes, one entry point each. `fin` stores the result only under a condition the data
/// never meets, so that no work can be dropped and nothing is written.
const PROBES: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var tex: texture_2d<f32>; // as many 16-byte texels as src has words
var<workgroup> sh: array<vec4<f32>, 256>;
const N: u32 = 1024u;
// Word indices wrap within the 64 MiB buffers (a mask: a division per lane would cost more
// than some of the loads measured).
const MASK: u32 = 0x3fffffu;

fn fin(acc: vec4<f32>, gid: u32) {
    if (acc.x == 1.2345 + f32(arrayLength(&src))) { dst[gid] = acc; }
}

// A dependent chain of vec4 multiply-adds: the loop itself.
@compute @workgroup_size(64)
fn arith(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(f32(g.x));
    for (var i = 0u; i < N; i++) { acc = acc * 1.0001 + vec4<f32>(f32(i)); }
    fin(acc, g.x);
}

// 16-byte loads, each invocation walking its own 768-byte rows (a K row per lane).
@compute @workgroup_size(64)
fn load_rows(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        acc += src[((g.x + (i / 48u) * 4096u) * 48u + i % 48u) & MASK];
    }
    fin(acc, g.x);
}

// 16-byte texel fetches, the same walk over a texture of 8192-texel rows.
@compute @workgroup_size(64)
fn texture_rows(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        let w = ((g.x + (i / 48u) * 4096u) * 48u + i % 48u) & MASK;
        acc += textureLoad(tex, vec2<u32>(w & 8191u, w >> 13u), 0);
    }
    fin(acc, g.x);
}

// The same two walks over only 1024 rows (768 KiB, which the caches hold).
@compute @workgroup_size(64)
fn load_rows_cached(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        acc += src[((g.x + (i / 48u) * 4096u) & 1023u) * 48u + i % 48u];
    }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn texture_rows_cached(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        let w = ((g.x + (i / 48u) * 4096u) & 1023u) * 48u + i % 48u;
        acc += textureLoad(tex, vec2<u32>(w & 8191u, w >> 13u), 0);
    }
    fin(acc, g.x);
}

// 16-byte loads and texel fetches, each invocation streaming its own 16 KiB (the 64 MiB once
// over the 4096 invocations): the longest contiguous run per lane, for the hardware prefetchers.
@compute @workgroup_size(64)
fn load_stream(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) { acc += src[(g.x * N + i) & MASK]; }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn texture_stream(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        let w = (g.x * N + i) & MASK;
        acc += textureLoad(tex, vec2<u32>(w & 8191u, w >> 13u), 0);
    }
    fin(acc, g.x);
}

// 4-byte loads, each invocation walking its own 768-byte rows.
@compute @workgroup_size(64)
fn load_rows_4b(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        acc.x += src[((g.x + (i / 48u) * 4096u) * 48u + i % 48u) & MASK].x;
    }
    fin(acc, g.x);
}

// Two neighbouring 16-byte loads per iteration (32 bytes), own rows.
@compute @workgroup_size(64)
fn load_rows_32b(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        let w = ((g.x + (i / 24u) * 4096u) * 48u + 2u * (i % 24u)) & MASK;
        acc += src[w] + src[w + 1u];
    }
    fin(acc, g.x);
}

// 16-byte loads, neighbouring invocations on neighbouring words, 64 KiB further each time.
@compute @workgroup_size(64)
fn load_jumps(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) { acc += src[(i * 4096u + g.x) & MASK]; }
    fin(acc, g.x);
}

// 16-byte loads over 1 KiB rows picked at random (a sparse attention pass's K and V rows): the
// 8 lanes of a subgroup on one row, neighbouring lanes on neighbouring words, 8 loads a row.
@compute @workgroup_size(64)
fn load_random_rows(@builtin(global_invocation_id) g: vec3<u32>) {
    let sub = g.x / 8u;
    let lane = g.x % 8u;
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        let row = ((sub * 1024u + i / 8u) * 2654435761u) >> 16u;  // one of 65536 rows: 64 MiB
        acc += src[(row * 64u + (i % 8u) * 8u + lane) & MASK];
    }
    fin(acc, g.x);
}

// The same 16-byte word in every invocation (an address the loop computes).
@compute @workgroup_size(64)
fn load_same(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) { acc += src[i]; }
    fin(acc, g.x);
}

// The same word of workgroup memory in every invocation.
@compute @workgroup_size(64)
fn workgroup_read(@builtin(global_invocation_id) g: vec3<u32>,
                  @builtin(local_invocation_index) l: u32) {
    sh[l] = vec4<f32>(f32(l));
    workgroupBarrier();
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) { acc += sh[i & 255u]; }
    fin(acc, g.x);
}

// An element of a private array chosen by the loop.
@compute @workgroup_size(64)
fn private_index(@builtin(global_invocation_id) g: vec3<u32>) {
    var arr = array<vec4<f32>, 16>();
    for (var j = 0u; j < 16u; j++) { arr[j] = vec4<f32>(f32(j + g.x)); }
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) { acc = acc * 0.5 + arr[i & 15u]; }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn subgroup_add(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(f32(g.x));
    for (var i = 0u; i < N; i++) { acc = acc * 0.5 + subgroupAdd(acc); }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn subgroup_shuffle(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(f32(g.x));
    for (var i = 0u; i < N; i++) { acc = acc * 0.5 + subgroupShuffle(acc, i & 3u); }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn subgroup_shuffle_xor(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(f32(g.x));
    for (var i = 0u; i < N; i++) { acc = acc * 0.5 + subgroupShuffleXor(acc, 1u); }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn subgroup_broadcast(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(f32(g.x));
    for (var i = 0u; i < N; i++) { acc = acc * 0.5 + subgroupBroadcast(acc, 3u); }
    fin(acc, g.x);
}
"#;

/// The 32-byte loads of the NSA subgroup variants (`vec4<u64>` words, split by `words` of
/// `shaders/common/wide.wgsl`), in a module of their own: only devices with 64-bit integers in
/// shaders build it. Costs are per 32-byte load.
const PROBES64: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<vec4<u64>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
const N: u32 = 1024u;
const MASK: u32 = 0x1fffffu;  // 32-byte words of the 64 MiB buffer

fn fin(acc: vec4<f32>, gid: u32) {
    if (acc.x == 1.2345 + f32(arrayLength(&src))) { dst[gid] = acc; }
}

fn add(acc: vec4<f32>, w: vec4<u64>) -> vec4<f32> {
    let h = words(w);
    return acc + bitcast<vec4<f32>>(h[0]) + bitcast<vec4<f32>>(h[1]);
}

// 32-byte loads, each invocation walking its own 768-byte rows (as load_rows, half the loads).
@compute @workgroup_size(64)
fn load_rows_w32(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        acc = add(acc, src[((g.x + (i / 24u) * 4096u) * 24u + i % 24u) & MASK]);
    }
    fin(acc, g.x);
}

@compute @workgroup_size(64)
fn load_rows_w32_cached(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < N; i++) {
        acc = add(acc, src[((g.x + (i / 24u) * 4096u) & 1023u) * 24u + i % 24u]);
    }
    fin(acc, g.x);
}
"#;

/// (entry point, what it measures); the `subgroup_*` probes need subgroups, the `*_w32` ones
/// 64-bit integers.
const ENTRIES: &[(&str, &str)] = &[
    ("arith", "vec4 multiply-add chain (the loop)"),
    ("load_rows", "16-byte load, own row per invocation"),
    (
        "texture_rows",
        "16-byte texel fetch, own row per invocation",
    ),
    ("load_rows_cached", "16-byte load, own rows, 768 KiB in all"),
    (
        "texture_rows_cached",
        "16-byte texel fetch, own rows, 768 KiB",
    ),
    ("load_rows_w32", "32-byte load (vec4<u64>), own rows"),
    (
        "load_rows_w32_cached",
        "32-byte load (vec4<u64>), own rows, 768 KiB",
    ),
    ("load_stream", "16-byte load, own 16 KiB stream"),
    ("texture_stream", "16-byte texel fetch, own 16 KiB stream"),
    ("load_rows_4b", "4-byte load, own row per invocation"),
    ("load_rows_32b", "two neighbouring 16-byte loads, own rows"),
    ("load_jumps", "16-byte load, neighbours, 64 KiB jumps"),
    (
        "load_random_rows",
        "16-byte load, neighbours, random 1 KiB rows",
    ),
    ("load_same", "16-byte load, same address in all"),
    ("workgroup_read", "16-byte workgroup read, same in all"),
    ("private_index", "private array, index from the loop"),
    ("subgroup_add", "subgroupAdd of a vec4"),
    ("subgroup_shuffle", "subgroupShuffle of a vec4"),
    ("subgroup_shuffle_xor", "subgroupShuffleXor of a vec4"),
    ("subgroup_broadcast", "subgroupBroadcast of a vec4"),
];

fn main() -> qsa_wgpu::Result<()> {
    let ctx = Context::new_blocking(&ContextOptions::default())?;
    println!("adapter: {}", ctx.describe());
    let dev = &ctx.device;
    // Subgroup probes only where the device has subgroups (the module names them all).
    let subgroups = ctx.caps.subgroups;
    let src = if subgroups {
        PROBES.to_string()
    } else {
        PROBES
            .split("\n@compute")
            .filter(|part| !qsa_wgpu::shaders::uses_subgroups(part))
            .collect::<Vec<_>>()
            .join("\n@compute")
    };
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("lane_costs"),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let wide = ctx.caps.wide_loads;
    let module64 = wide.then(|| {
        dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("lane_costs.w32"),
            source: wgpu::ShaderSource::Wgsl(
                format!("{PROBES64}{}", include_str!("../shaders/common/wide.wgsl")).into(),
            ),
        })
    });
    let size = 64u64 << 20;
    let buffer = |label| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (src_buf, dst_buf) = (buffer("lane_costs.src"), buffer("lane_costs.dst"));
    let texture = dev.create_texture(&wgpu::TextureDescriptor {
        label: Some("lane_costs.tex"),
        size: wgpu::Extent3d {
            width: 8192,
            height: (size / 16 / 8192) as u32,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Float,
        usage: wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    });
    let view = texture.create_view(&Default::default());
    println!("{:<22} {:<42} {:>8}", "probe", "what", "ns");
    for &(entry, what) in ENTRIES {
        let w32 = entry.contains("_w32");
        if (entry.starts_with("subgroup") && !subgroups) || (w32 && !wide) {
            println!("{entry:<22} {what:<42} {:>8}", "-");
            continue;
        }
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: match (&module64, w32) {
                (Some(m), true) => m,
                _ => &module,
            },
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src_buf.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: dst_buf.as_entire_binding(),
            },
        ];
        // Only the texture probe declares the texture (layouts are the probe's own).
        if entry.starts_with("texture") {
            entries.push(wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::TextureView(&view),
            });
        }
        let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut best = f64::INFINITY;
        for _ in 0..6 {
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(64, 1, 1);
            }
            let t0 = Instant::now();
            ctx.queue.submit([enc.finish()]);
            ctx.wait()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{entry:<22} {what:<42} {:>8.2}",
            best * 1e9 / LANE_ITERATIONS
        );
    }
    Ok(())
}
