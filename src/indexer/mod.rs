//! `QsaIndexer`: one layer of the QSA indexer as one submission per step. A step over a ragged
//! batch (prefill chunks and decode rows mixed) records compress (paged, incremental) →
//! prepare query → score → top-k into one command encoder ([`step`](QsaIndexer::step), in
//! `step.rs`); the top-k's last step also writes the token route of `expand_route`. The raw
//! index keys live in a device pool; a host mirror of it and of the block keys lets
//! [`QsaIndexer::step_cpu`] (in `cpu.rs`) run the same step through the CPU references.
//!
//! Sequences live in slots. A step takes one count of new tokens per slot
//! (`0 .. slot_count()`), in slot order; a freed slot, or a sequence with nothing new, gives 0.
//! Slot `n` owns block-key rows `n · max_blocks ..`; a freed slot is reused by the next
//! [`add_sequence`](QsaIndexer::add_sequence).

mod attention;
mod cpu;
mod step;

pub use attention::AttentionConfig;
pub use step::{StepOutputs, FUSED_QUERY_PAIRS};

use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, WordTexture};
use crate::ops::block_topk;
use crate::ops::common::BindCache;
use crate::paged::{PagedPool, PoolLayout};
use crate::tensor::{DType, Tensor};
use std::sync::Arc;

const OP: &str = "qsa_indexer";

/// Geometry and numerics of one indexer layer.
#[derive(Clone, Debug)]
pub struct IndexerConfig {
    pub hi: usize,
    pub di: usize,
    pub dr: usize,
    pub r: usize,
    pub k: usize,
    pub hs: usize,
    pub page_size: usize,
    pub dtype: DType,
    pub epsilon: f32,
    pub k_norm_offset: f32,
    pub q_norm_offset: f32,
    /// `None`: 1 / sqrt(Di).
    pub scale: Option<f32>,
    /// Longest sequence the layer serves (sizes the rotary table and the block keys).
    pub max_len: usize,
    /// Sequences served at once.
    pub max_seqs: usize,
    /// Most new rows (tokens of all sequences) in one step; sizes the step's device buffers.
    pub max_step_tokens: usize,
    /// Caps the rows of one score chunk. `None`: as many as one storage binding holds. The
    /// score matrix `[T, Hs, max_blocks]` f32 is computed and selected from in row chunks
    /// that reuse one scratch buffer, so it never has to exist whole.
    pub score_chunk_rows: Option<usize>,
    /// Caps the pages of one device pool shard, for the index-key pool and the main KV pool
    /// alike. `None`: as many as one storage binding holds.
    pub pool_shard_pages: Option<usize>,
    /// The main attention over the selection, run as the step's last stage by
    /// [`QsaIndexer::step_with_attention`]; `None`: the layer has no KV pool.
    pub attention: Option<AttentionConfig>,
}

impl IndexerConfig {
    /// Qwen3.8-Flash-Next's indexer: Hi = 4, Di = 128, Dr = 64, r = 4, k = 512, page 128; up to
    /// 2048 new rows per step.
    pub fn qwen(dtype: DType, max_len: usize, max_seqs: usize) -> Self {
        IndexerConfig {
            hi: 4,
            di: 128,
            dr: 64,
            r: 4,
            k: 512,
            hs: 1,
            page_size: 128,
            dtype,
            epsilon: 1e-6,
            k_norm_offset: 1.0,
            q_norm_offset: 1.0,
            scale: None,
            max_len,
            max_seqs,
            max_step_tokens: 2048.min(max_len * max_seqs),
            score_chunk_rows: None,
            pool_shard_pages: None,
            attention: None,
        }
    }

    /// Block keys one sequence can hold.
    pub fn max_blocks(&self) -> usize {
        self.max_len / self.r
    }

    /// Width of a `token_indices` row: k·r + r − 1.
    pub fn route_width(&self) -> usize {
        self.k * self.r + self.r - 1
    }

    fn check(&self) -> Result<()> {
        let bad = |name: &str, msg: String| Err(Error::input(OP, name, msg));
        if self.hi == 0 || self.hs == 0 || !self.hi.is_multiple_of(self.hs) {
            return bad(
                "config.hs",
                format!("Hs = {} must divide Hi = {}", self.hs, self.hi),
            );
        }
        if self.di == 0 || self.di > 2048 || self.dr > self.di || !self.dr.is_multiple_of(2) {
            return bad(
                "config.dr",
                format!(
                    "need 0 < Di <= 2048, even Dr <= Di; got Di {}, Dr {}",
                    self.di, self.dr
                ),
            );
        }
        if self.r == 0 || self.k == 0 || self.page_size == 0 || self.max_seqs == 0 {
            return bad(
                "config",
                format!(
                    "r ({}), k ({}), page_size ({}) and max_seqs ({}) must be positive",
                    self.r, self.k, self.page_size, self.max_seqs
                ),
            );
        }
        if !self.page_size.is_multiple_of(self.r)
            || !(self.page_size * self.di * self.dtype.size()).is_multiple_of(4)
        {
            return bad(
                "config.page_size",
                format!(
                    "page_size {} must be a multiple of r = {} and hold whole 32-bit words of {} keys",
                    self.page_size, self.r, self.dtype
                ),
            );
        }
        if self.r > block_topk::MAX_ROUTE_RATIO {
            return bad(
                "config.r",
                format!(
                    "r = {} exceeds {}, the largest ratio of the step's token route",
                    self.r,
                    block_topk::MAX_ROUTE_RATIO
                ),
            );
        }
        // The step selects from each score row (one column per block) in one workgroup.
        if self.max_blocks() > block_topk::MAX_W || self.k > block_topk::MAX_K {
            return bad(
                "config.max_len",
                format!(
                    "max_len / r = {} blocks per sequence (at most {}) and k = {} (at most {}): \
                     the step selects each score row in one workgroup",
                    self.max_blocks(),
                    block_topk::MAX_W,
                    self.k,
                    block_topk::MAX_K
                ),
            );
        }
        if self.max_step_tokens == 0
            || self.score_chunk_rows == Some(0)
            || self.pool_shard_pages == Some(0)
        {
            return bad(
                "config.max_step_tokens",
                "max_step_tokens, score_chunk_rows and pool_shard_pages must be positive".into(),
            );
        }
        Ok(())
    }
}

/// One indexer layer: the device pool and block keys, their host mirrors, the weights, and the
/// step's device buffers and bind groups (built once, reused every step).
pub struct QsaIndexer {
    pub cfg: IndexerConfig,
    ctx: Arc<Context>,
    pub pool: PagedPool,
    /// The raw keys on the device, K rows only (`[pages, page_size, Di]`), split in shards of
    /// `shard_pages` pages so each fits one storage binding.
    pool_gpu: Vec<GpuTensor>,
    shard_pages: usize,
    pub block_keys: Tensor,
    keys_gpu: GpuTensor,
    /// Texture copies of the step's index queries and of `keys_gpu`, which scoring reads when
    /// the context allows it ([`Capabilities::textures`](crate::gpu::Capabilities)) and
    /// the adapter's textures hold them; every step copies the queries it prepared and the
    /// block rows it compressed.
    textures: Option<[WordTexture; 2]>,
    pub k_norm: Tensor,
    pub q_norm: Tensor,
    pub freqs: Tensor,
    gamma_gpu: GpuTensor,
    q_norm_gpu: GpuTensor,
    freqs_gpu: GpuTensor,
    max_blocks: usize,
    max_pages: usize,
    bufs: step::StepBuffers,
    binds: BindCache,
    kv: Option<attention::KvCache>,
}

/// The model's rotary table: row p holds the (cos, sin) pairs of position p, base 1e7.
pub fn rotary_table(dtype: DType, positions: usize, dr: usize) -> Tensor {
    let mut v = Vec::with_capacity(positions * dr);
    for p in 0..positions {
        for i in 0..dr / 2 {
            let a = p as f64 * 1e7f64.powf(-(2.0 * i as f64) / dr as f64);
            v.push(a.cos() as f32);
            v.push(a.sin() as f32);
        }
    }
    Tensor::from_f32(dtype, &[positions, dr], &v)
}

/// Row offsets, cache lengths, positions and the page table of one step.
/// Row offsets, cache lengths, positions and the page table (`[slots, max_pages]`, row after
/// row) of one step.
type StepTensors = (Vec<u32>, Vec<u32>, Vec<i32>, Vec<u32>);

impl QsaIndexer {
    /// A layer with the given norm weights (`[Di]` each), pages handed out in `page_order`.
    pub fn new(
        ctx: Arc<Context>,
        cfg: IndexerConfig,
        k_norm: Tensor,
        q_norm: Tensor,
        page_order: Vec<u32>,
    ) -> Result<Self> {
        cfg.check()?;
        for (name, t) in [("k_norm", &k_norm), ("q_norm", &q_norm)] {
            if t.shape != [cfg.di] || t.dtype != cfg.dtype {
                return Err(Error::input(
                    OP,
                    name,
                    format!(
                        "expected [{}] {}, got {:?} {}",
                        cfg.di, cfg.dtype, t.shape, t.dtype
                    ),
                ));
            }
        }
        let pages_per_seq = cfg.max_len.div_ceil(cfg.page_size);
        let num_pages = page_order.len();
        if num_pages < pages_per_seq {
            return Err(Error::input(
                OP,
                "page_order",
                format!(
                    "{num_pages} pages cannot hold one sequence of {}",
                    cfg.max_len
                ),
            ));
        }
        let layout = PoolLayout::packed(num_pages, 1, cfg.page_size, 1, cfg.di);
        let pool = PagedPool::new(layout, cfg.dtype, page_order);
        let max_blocks = cfg.max_blocks();
        let block_keys = Tensor::zeros(cfg.dtype, &[cfg.max_seqs * max_blocks, cfg.di]);
        let freqs = rotary_table(cfg.dtype, cfg.max_len, cfg.dr);
        let page_bytes = (cfg.page_size * cfg.di * cfg.dtype.size()) as u64;
        let shard_pages =
            ctx.shard_pages(OP, "pool page", page_bytes, num_pages, cfg.pool_shard_pages)?;
        let mut pool_gpu = Vec::new();
        for lo in (0..num_pages).step_by(shard_pages) {
            let pages = shard_pages.min(num_pages - lo);
            pool_gpu.push(GpuTensor::filled(
                &ctx,
                "qsa.indexer.pool",
                cfg.dtype,
                &[pages, cfg.page_size, cfg.di],
                0,
            )?);
        }
        let up = |n: &str, t: &Tensor| GpuTensor::upload(&ctx, n, t);
        let keys_gpu = up("qsa.indexer.block_keys", &block_keys)?;
        let bufs = step::StepBuffers::new(&ctx, &cfg, pages_per_seq)?;
        let textures = match ctx.caps.textures {
            true => bufs.query_texture(&ctx).zip(WordTexture::new(
                &ctx,
                "qsa.indexer.block_keys",
                keys_gpu.buffer.size(),
            )),
            false => None,
        }
        .map(|(q, k)| [q, k]);
        Ok(QsaIndexer {
            pool_gpu,
            shard_pages,
            keys_gpu,
            textures,
            gamma_gpu: up("qsa.indexer.k_norm", &k_norm)?,
            q_norm_gpu: up("qsa.indexer.q_norm", &q_norm)?,
            freqs_gpu: up("qsa.indexer.freqs", &freqs)?,
            bufs,
            kv: match &cfg.attention {
                Some(a) => Some(attention::KvCache::new(
                    &ctx,
                    &cfg,
                    a,
                    num_pages,
                    pages_per_seq,
                )?),
                None => None,
            },
            binds: BindCache::default(),
            ctx,
            pool,
            block_keys,
            k_norm,
            q_norm,
            freqs,
            max_blocks,
            max_pages: pages_per_seq,
            cfg,
        })
    }

    /// Starts a sequence in the lowest free slot; returns the slot.
    pub fn add_sequence(&mut self) -> Result<usize> {
        self.pool.add_sequence_within(OP, self.cfg.max_seqs)
    }

    /// Ends the sequence in `slot`: its pages go back to the pool and the slot can be reused.
    pub fn free_sequence(&mut self, slot: usize) -> Result<()> {
        if !self.is_live(slot) {
            return Err(Error::input(
                OP,
                "slot",
                format!("slot {slot} holds no sequence"),
            ));
        }
        self.pool.free_sequence(slot);
        self.kv_truncate(slot, 0);
        Ok(())
    }

    /// Slots a step covers: every slot ever handed out, live or freed.
    pub fn slot_count(&self) -> usize {
        self.pool.tables.len()
    }

    /// Whether `slot` holds a live sequence.
    pub fn is_live(&self, slot: usize) -> bool {
        matches!(self.pool.tables.get(slot), Some(Some(_)))
    }

    /// Tokens sequence `slot` holds.
    pub fn len(&self, slot: usize) -> usize {
        self.pool.lengths.get(slot).copied().unwrap_or(0)
    }

    /// Appends the raw index keys `[count, Di]` of sequence `seq`'s new tokens to the pool
    /// (host mirror and device), growing its page table.
    pub fn append_keys(&mut self, seq: usize, raw: &[f32]) -> Result<()> {
        let di = self.cfg.di;
        if !self.is_live(seq) {
            return Err(Error::input(
                OP,
                "slot",
                format!("slot {seq} holds no sequence"),
            ));
        }
        if !raw.len().is_multiple_of(di) {
            return Err(Error::input(
                OP,
                "raw_keys",
                format!("{} values are not whole rows of Di = {di}", raw.len()),
            ));
        }
        let count = raw.len() / di;
        let start = self.pool.lengths[seq];
        if start + count > self.cfg.max_len {
            return Err(Error::input(
                OP,
                "raw_keys",
                format!(
                    "sequence {seq} would hold {} > max_len {}",
                    start + count,
                    self.cfg.max_len
                ),
            ));
        }
        self.pool.append(seq, 0, 0, raw)?;
        self.pool.commit(seq, count);
        let es = self.cfg.dtype.size();
        let ps = self.cfg.page_size;
        let table = self.pool.tables[seq].as_deref().unwrap();
        // One write per page touched. Within a page the K rows are contiguous on the host and
        // on the device alike, and pages start on whole words (checked by the config), so a
        // 16-bit run of odd length is widened to whole words with its neighbours' (identical)
        // bytes from the host mirror.
        let mut t = start;
        while t < start + count {
            let run = (ps - t % ps).min(start + count - t);
            let page = table[t / ps] as usize;
            let host_page = self.pool.layout.offset(page, 0, 0, 0, 0) * es;
            let (a, b) = ((t % ps) * di * es, (t % ps + run) * di * es);
            let (lo, hi) = (a / 4 * 4, b.div_ceil(4) * 4);
            let dev_page = (page % self.shard_pages) * ps * di * es;
            self.ctx.queue.write_buffer(
                &self.pool_gpu[page / self.shard_pages].buffer,
                (dev_page + lo) as u64,
                &self.pool.data.data[host_page + lo..host_page + hi],
            );
            t += run;
        }
        Ok(())
    }

    /// Shortens the sequence in `slot` to its first `len` tokens (a rejected speculative draft,
    /// a rolled-back turn). Its block keys past `len / r` are recomputed as blocks complete
    /// again.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        if !self.is_live(slot) || len > self.len(slot) {
            return Err(Error::input(
                OP,
                "len",
                format!(
                    "slot {slot} holds {} tokens{}; cannot truncate to {len}",
                    self.len(slot),
                    if self.is_live(slot) {
                        ""
                    } else {
                        " (no sequence)"
                    }
                ),
            ));
        }
        self.pool.truncate(slot, len);
        self.kv_truncate(slot, len);
        Ok(())
    }

    /// Inputs of the step's operators as host tensors (shared by the GPU and CPU paths): one
    /// batch entry per slot.
    fn step_tensors(&self, new_tokens: &[usize]) -> Result<StepTensors> {
        let slots = self.slot_count();
        self.pool.check_step_counts(OP, new_tokens.len())?;
        let mut offsets = vec![0u32];
        let mut cache = Vec::new();
        let mut positions = Vec::new();
        for (s, &new) in new_tokens.iter().enumerate() {
            let len = self.pool.lengths[s];
            let c = len.checked_sub(new).ok_or_else(|| {
                Error::input(
                    OP,
                    "new_tokens",
                    format!("slot {s}: {new} new tokens but {len} appended"),
                )
            })?;
            cache.push(c as u32);
            positions.extend((c..len).map(|p| p as i32));
            offsets.push(offsets[s] + new as u32);
        }
        let all: Vec<usize> = (0..slots).collect();
        let table = self.pool.page_rows(&all, self.max_pages, 0);
        Ok((offsets, cache, positions, table))
    }

    /// Pipelines built so far by this layer's context.
    pub fn pipelines_created(&self) -> usize {
        self.ctx.cache.created()
    }

    /// Bind groups this layer has built.
    pub fn bind_groups_created(&self) -> usize {
        self.binds.created()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer whose score rows one selection cannot take is refused when it is made, not at
    /// its first step.
    #[test]
    fn score_rows_must_fit_one_selection() {
        let ok = IndexerConfig::qwen(DType::BF16, 4 * block_topk::MAX_W, 2);
        assert!(ok.check().is_ok());
        let long = IndexerConfig::qwen(DType::BF16, 4 * block_topk::MAX_W + 4, 2);
        let e = long.check().unwrap_err().to_string();
        assert!(e.contains("config.max_len") && e.contains("65537"), "{e}");
        let mut dsa = IndexerConfig::qwen(DType::BF16, 4096, 2);
        dsa.k = block_topk::MAX_K + 1;
        assert!(dsa.check().unwrap_err().to_string().contains("2049"));
        let mut coarse = IndexerConfig::qwen(DType::BF16, 4096, 2);
        (coarse.r, coarse.page_size) = (128, 128);
        assert!(coarse.check().unwrap_err().to_string().contains("config.r"));
    }
}
