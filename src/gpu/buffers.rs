//! Device buffers holding tensors, and the one readback helper that owns `map_async` + poll.
//! The core is async; [`Readback::blocking`] wraps it for native callers.

use super::Context;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use wgpu::util::DeviceExt;

/// A tensor living in a storage buffer. f16/bf16 elements are packed two per `u32` word, as on
/// the host; the buffer is padded to a multiple of 16 bytes (and never smaller than 16), so a
/// shader may read it in `vec4<u32>` words.
pub struct GpuTensor {
    pub buffer: wgpu::Buffer,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// Every buffer the library makes can be bound, copied from and copied to.
pub const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

fn padded(bytes: usize) -> u64 {
    (bytes.div_ceil(16) * 16).max(16) as u64
}

impl GpuTensor {
    /// A view of the first `shape` elements of this tensor's buffer (the buffer is shared).
    pub fn view(&self, shape: &[usize]) -> GpuTensor {
        GpuTensor {
            buffer: self.buffer.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
        }
    }

    /// Queues a write of `bytes` (padded to whole words) at the start of the buffer; nothing
    /// for an empty slice. The write lands before the next submission.
    pub fn write(&self, ctx: &Context, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if bytes.len().is_multiple_of(4) {
            ctx.queue.write_buffer(&self.buffer, 0, bytes);
        } else {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().div_ceil(4) * 4, 0);
            ctx.queue.write_buffer(&self.buffer, 0, &v);
        }
    }

    /// Logical size in bytes (without padding).
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }

    /// Uploads a host tensor.
    pub fn upload(ctx: &Context, label: &str, t: &Tensor) -> Result<GpuTensor> {
        ctx.check_binding_size("upload", label, t.data.len() as u64)?;
        let mut data = t.data.clone();
        data.resize(padded(data.len()) as usize, 0);
        let buffer = ctx
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &data,
                usage: USAGE,
            });
        Ok(GpuTensor {
            buffer,
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
    }

    /// A new buffer for a tensor of `shape`, every byte set to `fill` (a sentinel such as
    /// 0xFF, which reads as NaN for every float type, so a missed write cannot pass as zero).
    pub fn filled(
        ctx: &Context,
        label: &str,
        dtype: DType,
        shape: &[usize],
        fill: u8,
    ) -> Result<GpuTensor> {
        let n: usize = shape.iter().product::<usize>() * dtype.size();
        ctx.check_binding_size("alloc", label, n as u64)?;
        // wgpu zero-initialises new buffers: only another fill needs a host image.
        let buffer = if fill == 0 {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: padded(n),
                usage: USAGE,
                mapped_at_creation: false,
            })
        } else {
            ctx.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: &vec![fill; padded(n) as usize],
                    usage: USAGE,
                })
        };
        Ok(GpuTensor {
            buffer,
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// Reads the tensor back (async core).
    pub async fn read(&self, ctx: &Context) -> Result<Tensor> {
        let bytes = Readback::new(ctx, &[(&self.buffer, self.bytes())])
            .await_all(ctx)
            .await?;
        Tensor::from_bytes(self.dtype, &self.shape, bytes.into_iter().next().unwrap())
    }
}

/// Copies several buffers into staging buffers in one submission and maps them together.
pub struct Readback {
    staging: Vec<(wgpu::Buffer, u64)>,
    submission: wgpu::SubmissionIndex,
}

impl Readback {
    /// Records and submits the copies of `(buffer, bytes)` pairs.
    pub fn new(ctx: &Context, sources: &[(&wgpu::Buffer, u64)]) -> Readback {
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("qsa.readback"),
            });
        let staging = sources
            .iter()
            .map(|(src, bytes)| {
                let size = padded(*bytes as usize);
                let dst = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("qsa.staging"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                enc.copy_buffer_to_buffer(src, 0, &dst, 0, size.min(src.size()));
                (dst, *bytes)
            })
            .collect();
        let submission = ctx.queue.submit([enc.finish()]);
        Readback {
            staging,
            submission,
        }
    }

    /// Maps every staging buffer and returns their bytes, in order.
    pub async fn await_all(self, ctx: &Context) -> Result<Vec<Vec<u8>>> {
        let mut rxs = Vec::new();
        for (buf, _) in &self.staging {
            let (tx, rx) = futures::channel::oneshot::channel();
            buf.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            rxs.push(rx);
        }
        ctx.wait_for(Some(self.submission.clone()))?;
        let mut out = Vec::new();
        for ((buf, bytes), rx) in self.staging.iter().zip(rxs) {
            rx.await
                .map_err(|_| Error::Gpu("readback: map callback dropped".into()))?
                .map_err(|e| Error::Gpu(format!("readback: {e}")))?;
            let view = buf
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("readback: {e}")))?;
            out.push(view[..*bytes as usize].to_vec());
            drop(view);
            buf.unmap();
        }
        Ok(out)
    }

    /// Blocking wrapper for native callers.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn blocking(self, ctx: &Context) -> Result<Vec<Vec<u8>>> {
        pollster::block_on(self.await_all(ctx))
    }
}
