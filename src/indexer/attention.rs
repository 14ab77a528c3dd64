//! The optional attention stage of a step: the main paged KV pool (same pages as the index
//! keys; on the device in shards of whole pages when it exceeds one storage binding), the
//! attention queries, the output and the scratch of partial results, and `sparse_attention`
//! recorded after the top-k (which writes the token route) so one submission runs compress →
//! query → score → top-k → attention.

use super::{IndexerConfig, QsaIndexer, OP};
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor};
use crate::ops::sparse_attention::{params, scratch_buffer, worst_step_scratch, AttentionGeometry};
use crate::paged::PoolLayout;
use crate::tensor::{DType, Tensor};

/// Geometry of the attention that consumes the selection.
#[derive(Clone, Debug)]
pub struct AttentionConfig {
    /// Query heads H (Qwen3.8-Flash-Next: 24).
    pub h: usize,
    /// KV heads Hkv (2).
    pub hkv: usize,
    /// Head dim E (256).
    pub e: usize,
    /// `None`: 1 / sqrt(E).
    pub scale: Option<f32>,
    /// Per-head sink logits `[H]`, if the model has them.
    pub sinks: Option<Vec<f32>>,
}

impl AttentionConfig {
    /// Qwen3.8-Flash-Next's main attention: H = 24, Hkv = 2, E = 256, no sinks.
    pub fn qwen() -> Self {
        AttentionConfig {
            h: 24,
            hkv: 2,
            e: 256,
            scale: None,
            sinks: None,
        }
    }
}

/// The main KV pool (host mirror and device copy) and the stage's device buffers.
pub(super) struct KvCache {
    pub(super) cfg: AttentionConfig,
    pub(super) layout: PoolLayout,
    pub(super) host: Tensor,
    /// The pool on the device in shards of `shard_pages` whole pages (page p in shard
    /// p / shard_pages), each within one storage binding.
    pub(super) gpu: Vec<GpuTensor>,
    pub(super) shard_pages: usize,
    /// Scratch of the attention's partial results and routed token lists, sized for a step of
    /// `max_step_tokens` rows.
    pub(super) partials: wgpu::Buffer,
    pub(super) routes: wgpu::Buffer,
    /// Tokens of K/V each slot holds.
    pub(super) lens: Vec<usize>,
    pub(super) query: GpuTensor, // [max_step_tokens, H, E] T
    pub(super) out: GpuTensor,   // [max_step_tokens, H, E] T
    pub(super) seqs: GpuTensor,  // row_offsets | cache_lengths | page table, u32
    pub(super) sinks: Option<GpuTensor>,
}

impl KvCache {
    pub(super) fn new(
        ctx: &Context,
        c: &IndexerConfig,
        a: &AttentionConfig,
        num_pages: usize,
        max_pages: usize,
    ) -> Result<Self> {
        let (dt, page_size, max_seqs, rows) = (c.dtype, c.page_size, c.max_seqs, c.max_step_tokens);
        let bad = |name: &str, msg: String| Err(Error::input(OP, name, msg));
        if a.h == 0 || a.hkv == 0 || !a.h.is_multiple_of(a.hkv) || a.e == 0 || a.e > 2048 {
            return bad(
                "attention",
                format!(
                    "need Hkv | H and 0 < E <= 2048; got H {}, Hkv {}, E {}",
                    a.h, a.hkv, a.e
                ),
            );
        }
        if !(page_size * a.hkv * a.e * dt.size()).is_multiple_of(4) {
            return bad(
                "attention",
                "a K or V plane of one page must hold whole 32-bit words".into(),
            );
        }
        if let Some(s) = &a.sinks {
            if s.len() != a.h {
                return bad(
                    "attention.sinks",
                    format!("{} values for H = {}", s.len(), a.h),
                );
            }
        }
        let layout = PoolLayout::packed(num_pages, 1, page_size, a.hkv, a.e);
        let host = Tensor::zeros(dt, &[layout.required_elems()]);
        let f = |name: &str, dt: DType, shape: &[usize]| {
            GpuTensor::filled(ctx, &format!("qsa.indexer.{name}"), dt, shape, 0)
        };
        let page_bytes = (layout.page_elems() * dt.size()) as u64;
        let shard_pages = ctx.shard_pages(
            OP,
            "kv pool page",
            page_bytes,
            num_pages,
            c.pool_shard_pages,
        )?;
        let mut gpu = Vec::new();
        for lo in (0..num_pages).step_by(shard_pages) {
            let pages = shard_pages.min(num_pages - lo);
            gpu.push(f("kv_pool", dt, &[pages * layout.page_elems()])?);
        }
        // Scratch for the worst step: few rows split many ways, or max_step_tokens rows.
        let (partials, routes) = worst_step_scratch(ctx, rows, shard_pages, |t| {
            params(&AttentionGeometry {
                t,
                n: max_seqs,
                h: a.h,
                hs: c.hs,
                w: c.route_width(),
                layout,
                layer_idx: 0,
                max_pages,
                scale: a.scale,
                has_sinks: a.sinks.is_some(),
            })
        })?;
        Ok(KvCache {
            gpu,
            shard_pages,
            partials: scratch_buffer(ctx, "qsa.indexer.attention_partials", partials),
            routes: scratch_buffer(ctx, "qsa.indexer.attention_routes", routes),
            query: f("attention_query", dt, &[rows, a.h, a.e])?,
            out: f("attention_out", dt, &[rows, a.h, a.e])?,
            seqs: f(
                "attention_seqs",
                DType::U32,
                &[2 * max_seqs + 1 + max_seqs * max_pages],
            )?,
            sinks: match &a.sinks {
                Some(s) => Some(GpuTensor::upload(
                    ctx,
                    "qsa.indexer.sinks",
                    &Tensor::from_f32(DType::F32, &[a.h], s),
                )?),
                None => None,
            },
            cfg: a.clone(),
            layout,
            host,
            lens: Vec::new(),
        })
    }

    /// The pool as the rank-6 tensor `sparse_attention` takes.
    pub(super) fn tensor(&self) -> Tensor {
        let l = self.layout;
        let mut t = self.host.clone();
        t.shape = vec![l.num_pages, 2, 1, l.page_size, l.num_kv_heads, l.head_dim];
        t
    }
}

impl QsaIndexer {
    /// Appends the main attention's K and V rows (`[count, Hkv, E]` each, as f32) of sequence
    /// `slot`'s next tokens. Their index keys must be appended first: those allocate the pages
    /// the two pools share.
    pub fn append_kv(&mut self, slot: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let Some(kv) = self.kv.as_mut() else {
            return Err(Error::input(
                OP,
                "kv",
                "the layer was configured without attention".to_string(),
            ));
        };
        let (hkv, e) = (kv.cfg.hkv, kv.cfg.e);
        let w = hkv * e;
        if k.len() != v.len() || !k.len().is_multiple_of(w) {
            return Err(Error::input(
                OP,
                "kv",
                format!(
                    "K has {} and V {} values; each must be rows of Hkv·E = {w}",
                    k.len(),
                    v.len()
                ),
            ));
        }
        let count = k.len() / w;
        kv.lens.resize(self.pool.tables.len(), 0);
        let start = kv.lens[slot];
        let keys = self.pool.lengths.get(slot).copied().unwrap_or(0);
        if !matches!(self.pool.tables.get(slot), Some(Some(_))) || start + count > keys {
            return Err(Error::input(
                OP,
                "kv",
                format!(
                    "slot {slot} holds index keys of {keys} tokens; K/V of {start} + {count} cannot go past them"
                ),
            ));
        }
        let table = self.pool.tables[slot].as_deref().unwrap();
        let (ps, es, dt) = (kv.layout.page_size, kv.host.dtype.size(), kv.host.dtype);
        let sp = kv.shard_pages;
        let mut t = start;
        while t < start + count {
            let run = (ps - t % ps).min(start + count - t);
            let page = table[t / ps] as usize;
            // Pages start on whole words (checked in `new`), so the widened run stays in it.
            let shard_start = kv.layout.offset(page / sp * sp, 0, 0, 0, 0) * es;
            for (plane, src) in [(0, k), (1, v)] {
                let rows = &src[(t - start) * w..(t - start + run) * w];
                let off = kv.layout.offset(page, plane, 0, t % ps, 0) * es;
                let bytes = Tensor::from_f32(dt, &[rows.len()], rows).data;
                kv.host.data[off..off + bytes.len()].copy_from_slice(&bytes);
                let (lo, hi) = (off / 4 * 4, (off + bytes.len()).div_ceil(4) * 4);
                self.ctx.queue.write_buffer(
                    &kv.gpu[page / sp].buffer,
                    (lo - shard_start) as u64,
                    &kv.host.data[lo..hi],
                );
            }
            t += run;
        }
        kv.lens[slot] = start + count;
        Ok(())
    }

    /// Checks that every slot's K/V covers its index keys (the attention stage reads K/V at
    /// every position a query may select).
    pub(super) fn check_kv_complete(&self) -> Result<()> {
        let kv = self.kv.as_ref().expect("attention configured");
        for (s, &len) in self.pool.lengths.iter().enumerate() {
            let have = kv.lens.get(s).copied().unwrap_or(0);
            if self.is_live(s) && have != len {
                return Err(Error::input(
                    OP,
                    "kv",
                    format!("slot {s} has index keys of {len} tokens but K/V of {have}"),
                ));
            }
        }
        Ok(())
    }

    /// Shortens the K/V of `slot` with its index keys (truncate) or drops them (free).
    pub(super) fn kv_truncate(&mut self, slot: usize, len: usize) {
        if let Some(kv) = self.kv.as_mut() {
            if let Some(l) = kv.lens.get_mut(slot) {
                *l = (*l).min(len);
            }
        }
    }
}
