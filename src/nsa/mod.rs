//! `NsaSelector`: one layer of Native Sparse Attention's selection path as one submission per
//! decode step. A step over a batch of sequences (1 … 16 new tokens each, every new token a
//! query) records, in one command encoder (`step.rs`):
//!
//! 1. `compress_k`, `compress_v` — the windows the new tokens complete (window i covers
//!    positions i·d … i·d + l − 1) are compressed from the raw paged pool straight into the
//!    paged compressed K and V caches (`nsa_compress` semantics, `stages.rs`);
//! 2. `compress_logits`, `compress_values`, `compress_finish`, `select_topk` —
//!    `nsa_compress_attention` (causal, TND) over the compressed caches, through a scratch
//!    buffer the layer owns: the compressed-branch output and the k selection blocks per KV
//!    head;
//! 3. `select_expand` — the selected blocks of l' raw tokens as token lists, clipped to each
//!    query's position;
//! 4. `selected_attention` — `sparse_attention` over those tokens of the raw pool, with one
//!    selection group per KV head (query head h uses KV head and group h / G) and values of
//!    their own width Dv.
//!
//! The raw pool is one paged pool of SPEC §0's layout with `head_dim` Dp = max(Dqk, Dv): K in
//! the first Dqk channels of plane 0, V in the first Dv channels of plane 1. Host mirrors of
//! the pool and the compressed caches let [`NsaSelector::step_cpu`] (`cpu.rs`) run the same
//! step through the CPU references. Sequences live in slots, as in `QsaIndexer`.

mod check;
mod config;
mod cpu;
mod plan;
mod stages;
mod step;

pub use check::{check_step, cmp_out_tol, selection_tol, StepCheck};
pub use config::NsaConfig;
pub use stages::*;
pub use step::{StepOutputs, OUTPUTS};

use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, WordTexture};
use crate::ops::common::BindCache;
use crate::ops::nsa_compress::windows;
use crate::ops::nsa_compress_attention::texture_stages;
use crate::paged::{PagedPool, PoolLayout};
use crate::tensor::Tensor;
use plan::StepPlan;
use std::sync::Arc;

const OP: &str = "nsa_selector";

/// One NSA layer's selection path: the raw pool and compressed caches on the device and their
/// host mirrors, the compression weights, and the step's buffers and bind groups (built once).
pub struct NsaSelector {
    pub cfg: NsaConfig,
    ctx: Arc<Context>,
    /// The raw pool's host mirror (`[num_pages, 2, 1, page_size, N2, Dp]`) and page tables.
    pub pool: PagedPool,
    pool_gpu: GpuTensor,
    /// The compressed caches' host mirrors, `[cmp_blocks, P, N2·Dqk]` and `[cmp_blocks, P,
    /// N2·Dv]`, written by the CPU path ([`step_cpu`](Self::step_cpu),
    /// [`extend_cpu`](Self::extend_cpu)); the GPU path writes the device caches.
    pub cmp_key: Tensor,
    pub cmp_value: Tensor,
    cmp_key_gpu: GpuTensor,
    cmp_value_gpu: GpuTensor,
    /// Texture copies of the device caches, which the compressed attention's subgroup
    /// variants read where this context reads texture copies (`None` where they would not be
    /// read, or the adapter's textures cannot hold them); every step copies the rows its
    /// windows wrote.
    cmp_key_tex: Option<WordTexture>,
    cmp_value_tex: Option<WordTexture>,
    /// Block tables of the compressed caches, per slot (`None`: free slot).
    cmp_tables: Vec<Option<Vec<u32>>>,
    cmp_free: Vec<u32>,
    /// Compression weights `[l, N2]` for K and V.
    pub w_k: Tensor,
    pub w_v: Tensor,
    w_k_gpu: GpuTensor,
    w_v_gpu: GpuTensor,
    bufs: step::StepBuffers,
    binds: BindCache,
}

impl NsaSelector {
    /// A layer with compression weights `w_k`, `w_v` (`[l, N2]` each, of the layer's type);
    /// raw pages handed out in `page_order`, compressed-cache blocks in `cmp_order`.
    pub fn new(
        ctx: Arc<Context>,
        cfg: NsaConfig,
        w_k: Tensor,
        w_v: Tensor,
        page_order: Vec<u32>,
        cmp_order: Vec<u32>,
    ) -> Result<Self> {
        cfg.check()?;
        for (name, t) in [("w_k", &w_k), ("w_v", &w_v)] {
            if t.shape != [cfg.l, cfg.n2] || t.dtype != cfg.dtype {
                return Err(Error::input(
                    OP,
                    name,
                    format!(
                        "expected [{}, {}] {}, got {:?} {}",
                        cfg.l, cfg.n2, cfg.dtype, t.shape, t.dtype
                    ),
                ));
            }
        }
        for (name, have, need) in [
            ("page_order", page_order.len(), cfg.max_pages()),
            ("cmp_order", cmp_order.len(), cfg.max_cmp_blocks()),
        ] {
            if have < need {
                return Err(Error::input(
                    OP,
                    name,
                    format!(
                        "{have} pages cannot hold one sequence of {} tokens ({need})",
                        cfg.max_len
                    ),
                ));
            }
        }
        let layout = PoolLayout::packed(page_order.len(), 1, cfg.page_size, cfg.n2, cfg.pool_dim());
        let pool = PagedPool::new(layout, cfg.dtype, page_order);
        let nb = cmp_order.len();
        let cmp_key = Tensor::zeros(cfg.dtype, &[nb, cfg.cmp_page_size, cfg.n2 * cfg.dqk]);
        let cmp_value = Tensor::zeros(cfg.dtype, &[nb, cfg.cmp_page_size, cfg.n2 * cfg.dv]);
        let up = |name: &str, t: &Tensor| GpuTensor::upload(&ctx, &format!("qsa.nsa.{name}"), t);
        // The pool and the compressed caches start as zeros: allocated, not uploaded.
        let zeros = |name: &str, t: &Tensor| {
            GpuTensor::filled(&ctx, &format!("qsa.nsa.{name}"), t.dtype, &t.shape, 0)
        };
        let mut cmp_free = cmp_order;
        cmp_free.reverse();
        let cmp_key_gpu = zeros("cmp_key", &cmp_key)?;
        let cmp_value_gpu = zeros("cmp_value", &cmp_value)?;
        let (k_tex, v_tex) = texture_stages(&ctx, cfg.dtype, cfg.dqk, cfg.dv);
        let mirror = |on: bool, name: &str, g: &GpuTensor| {
            on.then(|| WordTexture::new(&ctx, &format!("qsa.nsa.{name}"), g.buffer.size()))
                .flatten()
        };
        Ok(NsaSelector {
            pool_gpu: zeros("pool", &pool.data)?,
            cmp_key_tex: mirror(k_tex, "cmp_key_tex", &cmp_key_gpu),
            cmp_value_tex: mirror(v_tex, "cmp_value_tex", &cmp_value_gpu),
            cmp_key_gpu,
            cmp_value_gpu,
            w_k_gpu: up("w_k", &w_k)?,
            w_v_gpu: up("w_v", &w_v)?,
            bufs: step::StepBuffers::new(&ctx, &cfg, layout)?,
            binds: BindCache::default(),
            ctx,
            pool,
            cmp_key,
            cmp_value,
            cmp_tables: Vec::new(),
            cmp_free,
            w_k,
            w_v,
            cfg,
        })
    }

    /// Starts a sequence in the lowest free slot; returns the slot.
    pub fn add_sequence(&mut self) -> Result<usize> {
        let s = self.pool.add_sequence_within(OP, self.cfg.max_seqs)?;
        if s == self.cmp_tables.len() {
            self.cmp_tables.push(Some(Vec::new()));
        } else {
            self.cmp_tables[s] = Some(Vec::new());
        }
        Ok(s)
    }

    /// Ends the sequence in `slot`: its raw pages and compressed blocks go back to the pools.
    pub fn free_sequence(&mut self, slot: usize) -> Result<()> {
        self.live(slot)?;
        self.pool.free_sequence(slot);
        let blocks = self.cmp_tables[slot].take().unwrap_or_default();
        self.cmp_free.extend(blocks.into_iter().rev());
        Ok(())
    }

    /// Slots a step covers: every slot ever handed out, live or freed.
    pub fn slot_count(&self) -> usize {
        self.pool.tables.len()
    }

    /// Raw tokens sequence `slot` holds.
    pub fn len(&self, slot: usize) -> usize {
        self.pool.lengths.get(slot).copied().unwrap_or(0)
    }

    /// Compressed tokens of sequence `slot` (complete windows).
    pub fn cmp_len(&self, slot: usize) -> usize {
        windows(self.len(slot), self.cfg.l, self.cfg.d)
    }

    /// The compressed caches' block table of `slot`.
    pub fn cmp_table(&self, slot: usize) -> &[u32] {
        self.cmp_tables
            .get(slot)
            .and_then(|t| t.as_deref())
            .unwrap_or(&[])
    }

    fn live(&self, slot: usize) -> Result<()> {
        match self.pool.tables.get(slot) {
            Some(Some(_)) => Ok(()),
            _ => Err(Error::input(
                OP,
                "slot",
                format!("slot {slot} holds no sequence"),
            )),
        }
    }

    /// Appends the raw K (`[count, N2·Dqk]`) and V (`[count, N2·Dv]`) rows of sequence `slot`'s
    /// new tokens, as f32 rounded to the layer's type, to the pool (host mirror and device);
    /// grows its page table and reserves the compressed blocks its windows will need.
    pub fn append_kv(&mut self, slot: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.live(slot)?;
        let c = &self.cfg;
        let (kw, vw) = (c.n2 * c.dqk, c.n2 * c.dv);
        let count = k.len() / kw;
        if !k.len().is_multiple_of(kw) || v.len() != count * vw {
            return Err(Error::input(
                OP,
                "kv",
                format!(
                    "{} K and {} V values are not the same count of rows of {kw} and {vw}",
                    k.len(),
                    v.len()
                ),
            ));
        }
        let start = self.pool.lengths[slot];
        if start + count > c.max_len {
            return Err(Error::input(
                OP,
                "kv",
                format!(
                    "slot {slot} would hold {} > max_len {}",
                    start + count,
                    c.max_len
                ),
            ));
        }
        let blocks = windows(start + count, c.l, c.d).div_ceil(c.cmp_page_size);
        let have = self.cmp_table(slot).len();
        if blocks > have && self.cmp_free.len() < blocks - have {
            return Err(Error::input(
                OP,
                "cmp_order",
                "out of compressed-cache blocks",
            ));
        }
        let dp = c.pool_dim();
        self.pool.append(slot, 0, 0, &pad_rows(k, c.dqk, dp))?;
        self.pool.append(slot, 1, 0, &pad_rows(v, c.dv, dp))?;
        self.pool.commit(slot, count);
        let table = self.cmp_tables[slot].as_mut().unwrap();
        while table.len() < blocks {
            table.push(self.cmp_free.pop().unwrap());
        }
        // One write per plane and page touched: rows are whole words (checked by the config).
        let (ps, es) = (c.page_size, c.dtype.size());
        let pages = self.pool.tables[slot].as_deref().unwrap();
        let row = c.n2 * dp * es;
        let mut t = start;
        while t < start + count {
            let run = (ps - t % ps).min(start + count - t);
            for plane in 0..2 {
                let at = self
                    .pool
                    .layout
                    .offset(pages[t / ps] as usize, plane, 0, t % ps, 0)
                    * es;
                self.ctx.queue.write_buffer(
                    &self.pool_gpu.buffer,
                    at as u64,
                    &self.pool.data.data[at..at + run * row],
                );
            }
            t += run;
        }
        Ok(())
    }

    /// Bind groups this layer has built.
    pub fn bind_groups_created(&self) -> usize {
        self.binds.created()
    }
}

/// Rows of per-head vectors of `width` values, each widened to `dp` with zeros.
fn pad_rows(rows: &[f32], width: usize, dp: usize) -> Vec<f32> {
    if width == dp {
        return rows.to_vec();
    }
    let mut out = vec![0f32; rows.len() / width * dp];
    for (src, dst) in rows.chunks(width).zip(out.chunks_mut(dp)) {
        dst[..width].copy_from_slice(src);
    }
    out
}
