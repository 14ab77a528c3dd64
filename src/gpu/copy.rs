//! The adapter's copy bandwidth, measured with `shaders/bench_copy.wgsl`: the memory roofline
//! `qsa bench` reports every preset against.

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

/// Copies `bytes` (rounded down to 16) from one buffer to another `runs` times after a
/// warm-up; returns the best bandwidth in GB/s, counting bytes read plus bytes written, and
/// whether it was timed by timestamps (else by wall clock around submit + wait).
pub async fn copy_bandwidth(ctx: &Context, bytes: u64, runs: usize) -> Result<(f64, bool)> {
    let bytes = (bytes.min(ctx.limits.max_storage_buffer_binding_size) / 16).max(1) * 16;
    let make = |label: &str| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (src, dst) = (make("qsa.bench.src"), make("qsa.bench.dst"));
    let words = (bytes / 16) as u32;
    let groups = words.div_ceil(256).min(4096);
    let prm = BenchCopyParams {
        words,
        stride: groups * 256,
        ..Default::default()
    };
    let d = Dispatch {
        key: PipelineKey::new("bench_copy", "main"),
        params: bytemuck::bytes_of(&prm),
        buffers: vec![&src, &dst],
        groups,
    };
    let bound = Bound::new(ctx, &d).await?;
    let mut timer = Timer::new(ctx, 1);
    let mut best = f64::INFINITY;
    for run in 0..runs + 1 {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        if let Some(t) = &mut timer {
            t.clear();
        }
        let ts = timer.as_mut().and_then(|t| t.writes("copy"));
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
    Ok((2.0 * bytes as f64 / (best * 1e-3) / 1e9, timer.is_some()))
}
