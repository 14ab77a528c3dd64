//! Texture copies of buffers: on llvmpipe a texel fetch is a vector gather where a storage
//! load is a loop over the SIMD lanes (docs/perf.md), so kernels that stream read-only data
//! can read it from such a copy; the indexer's scoring does, and `qsa bench` measures the
//! texture read roofline with one.

use super::Context;

/// Texels per row of a [`WordTexture`] (the 8192 = 1 << 13 of the shaders that read one).
pub const TEX_WIDTH: u32 = 8192;

/// A copy of a buffer in a 2-D `Rgba32Uint` texture: its 16-byte words, row after row of
/// [`TEX_WIDTH`] texels (what `block_score_tex.wgsl` reads). The owner keeps it equal to the
/// buffer (where read) by [`WordTexture::copy_words`] after writes to the buffer.
pub struct WordTexture {
    pub texture: wgpu::Texture,
    pub view: wgpu::TextureView,
    /// 16-byte words of the buffer mirrored.
    words: u64,
}

impl WordTexture {
    /// A zeroed texture for a buffer of `bytes` (a multiple of 16), or `None` when it would
    /// exceed the adapter's texture height.
    pub fn new(ctx: &Context, label: &str, bytes: u64) -> Option<WordTexture> {
        let words = bytes / 16;
        let rows = words.div_ceil(TEX_WIDTH as u64).max(1);
        let max = ctx.limits.max_texture_dimension_2d as u64;
        if TEX_WIDTH as u64 > max || rows > max {
            return None;
        }
        let texture = ctx.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d {
                width: TEX_WIDTH,
                height: rows as u32,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        let view = texture.create_view(&Default::default());
        Some(WordTexture {
            texture,
            view,
            words,
        })
    }

    /// 16-byte words of the buffer mirrored.
    pub fn words(&self) -> u64 {
        self.words
    }

    /// Records copies of `buffer`'s words `lo .. hi` (16-byte words, clamped to the mirrored
    /// size) into the texture: a partial first row, whole rows, a partial last row.
    pub fn copy_words(
        &self,
        enc: &mut wgpu::CommandEncoder,
        buffer: &wgpu::Buffer,
        lo: u64,
        hi: u64,
    ) {
        let (w, hi) = (TEX_WIDTH as u64, hi.min(self.words));
        let mut at = lo;
        while at < hi {
            let (row, col) = (at / w, at % w);
            // Within the first row, or whole rows from a row start.
            let (width, rows) = if col != 0 || hi - at < w {
                ((w - col).min(hi - at), 1)
            } else {
                (w, (hi - at) / w)
            };
            enc.copy_buffer_to_texture(
                wgpu::TexelCopyBufferInfo {
                    buffer,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset: at * 16,
                        bytes_per_row: Some((w * 16) as u32),
                        rows_per_image: None,
                    },
                },
                wgpu::TexelCopyTextureInfo {
                    texture: &self.texture,
                    mip_level: 0,
                    origin: wgpu::Origin3d {
                        x: col as u32,
                        y: row as u32,
                        z: 0,
                    },
                    aspect: wgpu::TextureAspect::All,
                },
                wgpu::Extent3d {
                    width: width as u32,
                    height: rows as u32,
                    depth_or_array_layers: 1,
                },
            );
            at += width * rows;
        }
    }
}
