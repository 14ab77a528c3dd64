//! The adapter's own rooflines, measured with `shaders/bench_copy.wgsl`, which `qsa bench`
//! reports every preset against: copy bandwidth (read + write), read bandwidth (of a storage
//! buffer, and of a texture with `shaders/bench_copy_tex.wgsl`), and f32 multiply-add
//! throughput.

use super::WordTexture;
use super::{Context, Timer};
use crate::error::Result;
use crate::gpu::PipelineKey;
use crate::ops::common::{Bound, Dispatch};
use std::time::Instant;

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BenchCopyParams {
    pub words: u32,
    pub stride: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// The three rooflines of one adapter.
#[derive(Clone, Copy, Debug)]
pub struct Roofline {
    /// Copy bandwidth, GB/s, counting bytes read plus bytes written.
    pub copy_gbs: f64,
    /// Read bandwidth, GB/s (a grid-stride sum of 16-byte words).
    pub read_gbs: f64,
    /// The same walk over the texels of a texture (what the indexer's scoring reads), GB/s;
    /// `None` when the adapter's textures cannot hold the buffer.
    pub texture_read_gbs: Option<f64>,
    /// f32 multiply-add throughput, GFLOP/s (two FLOPs per multiply-add).
    pub fma_gflops: f64,
    /// Timed by timestamp queries (else by the wall clock around submit + wait).
    pub timestamps: bool,
}

impl Roofline {
    /// The faster of the two read bandwidths, GB/s: what bounds a kernel that must read its
    /// bytes once.
    pub fn best_read_gbs(&self) -> f64 {
        self.read_gbs.max(self.texture_read_gbs.unwrap_or(0.0))
    }
}

/// Iterations per invocation of the `arith` probe (llvmpipe ends a loop after 65535).
const FMA_ITERS: u32 = 4096;
/// Workgroups of 256 invocations of the `arith` probe.
const FMA_GROUPS: u32 = 64;

/// Measures the three rooflines over `bytes` (rounded down to 16, at most one binding), each
/// the best of `runs` after a warm-up.
pub async fn roofline(ctx: &Context, bytes: u64, runs: usize) -> Result<Roofline> {
    let bytes = (bytes.min(ctx.limits.max_storage_buffer_binding_size) / 16).max(1) * 16;
    let (src, dst) = (
        probe_buffer(ctx, "qsa.bench.src", bytes),
        probe_buffer(ctx, "qsa.bench.dst", bytes),
    );
    let words = (bytes / 16) as u32;
    let groups = words.div_ceil(256).min(4096);
    let walk = BenchCopyParams {
        words,
        stride: groups * 256,
        ..Default::default()
    };
    let copy_ms = best_ms(
        ctx,
        dispatch("main", &walk, groups, vec![&src, &dst], None),
        runs,
    )
    .await?;
    // The same grid as the copy: on llvmpipe fewer, longer invocations read 3x slower (each
    // SIMD vector then walks the whole buffer at a stride of megabytes).
    let read_ms = best_ms(
        ctx,
        dispatch("load_sum", &walk, groups, vec![&src, &dst], None),
        runs,
    )
    .await?;
    let texture_read_ms = match WordTexture::new(ctx, "qsa.bench.texture", bytes) {
        Some(tex) => Some(
            best_ms(
                ctx,
                dispatch("load_tex", &walk, groups, vec![&dst], Some(&tex.view)),
                runs,
            )
            .await?,
        ),
        None => None,
    };
    let arith = BenchCopyParams {
        words: FMA_ITERS,
        ..Default::default()
    };
    let fma_ms = best_ms(
        ctx,
        dispatch("arith", &arith, FMA_GROUPS, vec![&src, &dst], None),
        runs,
    )
    .await?;
    let flops = FMA_GROUPS as f64 * 256.0 * FMA_ITERS as f64 * 128.0;
    Ok(Roofline {
        copy_gbs: 2.0 * bytes as f64 / (copy_ms * 1e-3) / 1e9,
        read_gbs: bytes as f64 / (read_ms * 1e-3) / 1e9,
        texture_read_gbs: texture_read_ms.map(|ms| bytes as f64 / (ms * 1e-3) / 1e9),
        fma_gflops: flops / (fma_ms * 1e-3) / 1e9,
        timestamps: ctx.caps.timestamps,
    })
}

/// A storage buffer of `bytes` for a probe to read or write.
fn probe_buffer(ctx: &Context, label: &str, bytes: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

/// A dispatch of a roofline probe: `bench_copy_tex` when it reads a texture, else
/// `bench_copy`.
fn dispatch<'a>(
    entry: &'static str,
    prm: &'a BenchCopyParams,
    groups: u32,
    buffers: Vec<&'a wgpu::Buffer>,
    texture: Option<&'a wgpu::TextureView>,
) -> Dispatch<'a> {
    let shader = match texture {
        Some(_) => "bench_copy_tex",
        None => "bench_copy",
    };
    Dispatch {
        key: PipelineKey::new(shader, entry),
        params: bytemuck::bytes_of(prm),
        buffers,
        textures: texture.into_iter().collect(),
        groups,
    }
}

/// Best milliseconds of `runs` dispatches of `d` after a warm-up.
async fn best_ms(ctx: &Context, d: Dispatch<'_>, runs: usize) -> Result<f64> {
    let entry = d.key.entry;
    let bound = Bound::new(ctx, &d).await?;
    let mut timer = Timer::new(ctx, 1);
    let mut best = f64::INFINITY;
    for run in 0..runs + 1 {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        if let Some(t) = &mut timer {
            t.clear();
        }
        let ts = timer.as_mut().and_then(|t| t.writes(entry));
        bound.record(ctx, &mut enc, d.params, d.groups, ts);
        if let Some(t) = &timer {
            t.resolve(&mut enc);
        }
        let t0 = Instant::now();
        ctx.submit("bench_copy", enc).await?;
        ctx.wait()?;
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let ms = match &timer {
            Some(t) => t.read(ctx).await?.first().map_or(wall, |s| s.1),
            None => wall,
        };
        if run > 0 && ms > 0.0 {
            best = best.min(ms);
        }
    }
    Ok(best)
}

/// Keeps a GPU's clocks up while `qsa bench` times steps that leave it mostly idle. A real
/// GPU lowers its clock within a fraction of a second of low load: on an H200 the bench's
/// decode steps (~0.1 ms of work, then the host's turn) ran at the idle 345 MHz instead of
/// 1980 MHz (docs/perf.md), which made every stage ~5× slower than in a serving loop, where
/// the model's other layers keep the GPU busy. `run_for` runs the registers-only
/// multiply-add probe (`arith`) back to back, waiting for each, for the time asked. Native
/// only: it waits on the device, which the browser cannot.
#[cfg(not(target_arch = "wasm32"))]
pub struct ClockHold {
    // The probe bound once (its bind group keeps its two small buffers alive).
    bound: Bound,
    prm: BenchCopyParams,
}

#[cfg(not(target_arch = "wasm32"))]
impl ClockHold {
    pub async fn new(ctx: &Context) -> Result<ClockHold> {
        let buffers = [
            probe_buffer(ctx, "qsa.bench.hold.src", 4096),
            probe_buffer(ctx, "qsa.bench.hold.dst", 4096),
        ];
        // The roofline's probe: ~0.15 ms at an H200's full clock, so the host waits little
        // past the time asked.
        let prm = BenchCopyParams {
            words: FMA_ITERS,
            ..Default::default()
        };
        let d = dispatch(
            "arith",
            &prm,
            FMA_GROUPS,
            vec![&buffers[0], &buffers[1]],
            None,
        );
        let bound = Bound::new(ctx, &d).await?;
        Ok(ClockHold { bound, prm })
    }

    /// Runs the probe back to back, four times the roofline's workgroups a submission, for
    /// `ms` milliseconds of wall time (at least one submission).
    pub fn run_for(&self, ctx: &Context, ms: f64) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            let prm = bytemuck::bytes_of(&self.prm);
            self.bound.record(ctx, &mut enc, prm, 4 * FMA_GROUPS, None);
            pollster::block_on(ctx.submit("bench_hold", enc))?;
            ctx.wait()?;
            if t0.elapsed().as_secs_f64() * 1e3 >= ms {
                return Ok(());
            }
        }
    }
}
