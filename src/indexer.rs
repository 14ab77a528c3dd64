//! `QsaIndexer`: one layer of the QSA indexer as one submission per step. A step over a ragged
//! batch (prefill chunks and decode rows mixed) records compress (paged, incremental) →
//! prepare query → score → top-k → expand into one command encoder. The raw index keys live in
//! a device pool; a host mirror of it and of the block keys lets [`QsaIndexer::step_cpu`] run
//! the same step through the CPU references.
//!
//! Every live sequence takes part in every step, in slot order (a sequence with nothing new
//! contributes zero rows); sequence `n` owns block-key rows `n · max_blocks …`.

use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor};
use crate::ops::block_score::{encode_score, BlockScoreParams, ScoreBuffers};
use crate::ops::block_topk::{encode_topk, BlockTopkParams};
use crate::ops::common::{flag_word, read_checked};
use crate::ops::expand_route::{encode_expand, ExpandBuffers, ExpandRouteParams};
use crate::ops::qsa_compress_paged::{encode_compress, CompressBuffers, QsaCompressParams};
use crate::ops::qsa_prepare_query::{encode_query, QsaPrepareQueryParams, QueryBuffers};
use crate::ops::{self, TensorMap};
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
}

impl IndexerConfig {
    /// Qwen3.8-Flash-Next's indexer: Hi = 4, Di = 128, Dr = 64, r = 4, k = 512, page 128.
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
        }
    }
}

/// The selections of one step, on the device; [`StepOutputs::read`] brings them back.
pub struct StepOutputs {
    /// `[T, Hs, max_blocks]` f32, −inf beyond each row's visible blocks (what top-k chose from).
    pub scores: GpuTensor,
    pub block_indices: GpuTensor,
    pub block_count: GpuTensor,
    pub token_indices: GpuTensor,
    pub token_count: GpuTensor,
    flags: GpuTensor,
}

impl StepOutputs {
    /// Reads the four outputs back (and turns device flags into an error).
    pub async fn read(&self, ctx: &Context) -> Result<TensorMap> {
        let outputs = [
            &self.block_indices,
            &self.block_count,
            &self.token_indices,
            &self.token_count,
        ];
        let got = read_checked(ctx, OP, &outputs, &self.flags).await?;
        let names = [
            "block_indices",
            "block_count",
            "token_indices",
            "token_count",
        ];
        let m = names.iter().map(|n| n.to_string()).zip(got).collect();
        Ok(m)
    }
}

/// Row offsets, cache lengths, positions and the page table of one step.
type StepTensors = (Vec<u32>, Vec<u32>, Vec<i32>, Tensor);

/// One indexer layer: the device pool and block keys, their host mirrors, the weights.
pub struct QsaIndexer {
    pub cfg: IndexerConfig,
    ctx: Arc<Context>,
    pub pool: PagedPool,
    pool_gpu: GpuTensor,
    pub block_keys: Tensor,
    keys_gpu: GpuTensor,
    pub k_norm: Tensor,
    pub q_norm: Tensor,
    pub freqs: Tensor,
    gamma_gpu: GpuTensor,
    q_norm_gpu: GpuTensor,
    freqs_gpu: GpuTensor,
    max_blocks: usize,
    max_pages: usize,
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

impl QsaIndexer {
    /// A layer with the given norm weights (`[Di]` each), pages handed out in `page_order`.
    pub fn new(
        ctx: Arc<Context>,
        cfg: IndexerConfig,
        k_norm: Tensor,
        q_norm: Tensor,
        page_order: Vec<u32>,
    ) -> Result<Self> {
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
        let max_blocks = cfg.max_len / cfg.r;
        let block_keys = Tensor::zeros(cfg.dtype, &[cfg.max_seqs * max_blocks, cfg.di]);
        let freqs = rotary_table(cfg.dtype, cfg.max_len, cfg.dr);
        let up = |n: &str, t: &Tensor| GpuTensor::upload(&ctx, n, t);
        Ok(QsaIndexer {
            pool_gpu: up("qsa.indexer.pool", &pool.tensor())?,
            keys_gpu: up("qsa.indexer.block_keys", &block_keys)?,
            gamma_gpu: up("qsa.indexer.k_norm", &k_norm)?,
            q_norm_gpu: up("qsa.indexer.q_norm", &q_norm)?,
            freqs_gpu: up("qsa.indexer.freqs", &freqs)?,
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

    /// Starts a sequence; returns its slot.
    pub fn add_sequence(&mut self) -> Result<usize> {
        let live = self.pool.tables.iter().filter(|t| t.is_some()).count();
        if live >= self.cfg.max_seqs {
            return Err(Error::input(
                OP,
                "sequences",
                format!("already {live} of max_seqs {}", self.cfg.max_seqs),
            ));
        }
        Ok(self.pool.add_sequence())
    }

    /// Appends the raw index keys `[count, Di]` of sequence `seq`'s new tokens to the pool
    /// (host mirror and device), growing its page table.
    pub fn append_keys(&mut self, seq: usize, raw: &[f32]) -> Result<()> {
        let di = self.cfg.di;
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
        let table = self.pool.tables[seq].clone().unwrap();
        // One write per page touched: the K rows of one page are contiguous (one layer, one
        // head). write_buffer takes 4-byte multiples, so a 16-bit run of odd length is widened
        // to whole words, copying its neighbours' (identical) bytes from the host mirror.
        let mut t = start;
        while t < start + count {
            let run = (ps - t % ps).min(start + count - t);
            let page = table[t / ps] as usize;
            let off = self.pool.layout.offset(page, 0, 0, t % ps, 0) * es;
            let (lo, hi) = (off / 4 * 4, (off + run * di * es).div_ceil(4) * 4);
            self.ctx.queue.write_buffer(
                &self.pool_gpu.buffer,
                lo as u64,
                &self.pool.data.data[lo..hi],
            );
            t += run;
        }
        Ok(())
    }

    /// Live slots in order.
    fn slots(&self) -> Vec<usize> {
        (0..self.pool.tables.len())
            .filter(|&s| self.pool.tables[s].is_some())
            .collect()
    }

    /// Inputs of the step's operators as host tensors (shared by the GPU and CPU paths).
    fn step_tensors(&self, new_tokens: &[usize]) -> Result<StepTensors> {
        let slots = self.slots();
        if new_tokens.len() != slots.len() || slots.iter().enumerate().any(|(i, &s)| s != i) {
            return Err(Error::input(OP, "new_tokens", format!("a step covers every live sequence in slot order: got {} counts for slots {slots:?}", new_tokens.len())));
        }
        let mut offsets = vec![0u32];
        let mut cache = Vec::new();
        let mut positions = Vec::new();
        for (n, &s) in slots.iter().enumerate() {
            let len = self.pool.lengths[s];
            let c = len.checked_sub(new_tokens[n]).ok_or_else(|| {
                Error::input(
                    OP,
                    "new_tokens",
                    format!(
                        "sequence {s}: {} new tokens but {len} appended",
                        new_tokens[n]
                    ),
                )
            })?;
            cache.push(c as u32);
            positions.extend((c..len).map(|p| p as i32));
            offsets.push(offsets[n] + new_tokens[n] as u32);
        }
        let table = self.pool.page_table(&slots, self.max_pages, 0);
        Ok((offsets, cache, positions, table))
    }

    /// Records and submits one step. `index_query_raw` is `[T, Hi, Di]` over the new rows,
    /// sequences in slot order; the keys of those rows must already be appended.
    pub async fn step(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
    ) -> Result<StepOutputs> {
        let ctx = self.ctx.clone();
        let c = self.cfg.clone();
        let (offsets, cache, positions, table) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        let t = positions.len();
        if index_query_raw.shape != [t, c.hi, c.di] || index_query_raw.dtype != c.dtype {
            return Err(Error::input(
                OP,
                "index_query_raw",
                format!(
                    "expected [{t}, {}, {}] {}, got {:?} {}",
                    c.hi, c.di, c.dtype, index_query_raw.shape, index_query_raw.dtype
                ),
            ));
        }
        let counts: Vec<u32> = offsets
            .windows(2)
            .zip(&cache)
            .map(|(o, c)| c + o[1] - o[0])
            .collect();
        let span = (0..n)
            .map(|i| counts[i] as usize / c.r - cache[i] as usize / c.r)
            .max()
            .unwrap_or(0);
        let up = |name: &str, t: &Tensor| GpuTensor::upload(&ctx, name, t);
        let table_g = up("qsa.indexer.page_table", &table)?;
        let lens: Vec<u32> = cache.iter().chain(counts.iter()).copied().collect();
        let lens_g = up("qsa.indexer.lens", &Tensor::from_u32(&[2 * n], &lens))?;
        let offs_g = up(
            "qsa.indexer.row_offsets",
            &Tensor::from_u32(&[n + 1], &offsets),
        )?;
        let pos_g = up("qsa.indexer.positions", &Tensor::from_i32(&[t], &positions))?;
        let q_raw = up("qsa.indexer.q_raw", index_query_raw)?;
        let q = GpuTensor::filled(
            &ctx,
            "qsa.indexer.index_query",
            c.dtype,
            &[t, c.hi, c.di],
            0xff,
        )?;
        let scores = GpuTensor::filled(
            &ctx,
            "qsa.indexer.scores",
            DType::F32,
            &[t, c.hs, self.max_blocks],
            0xff,
        )?;
        let i32s =
            |name: &str, shape: &[usize]| GpuTensor::filled(&ctx, name, DType::I32, shape, 0x7f);
        let width = c.k * c.r + c.r - 1;
        let out = StepOutputs {
            scores,
            block_indices: i32s("qsa.indexer.block_indices", &[t, c.hs, c.k])?,
            block_count: i32s("qsa.indexer.block_count", &[t, c.hs])?,
            token_indices: i32s("qsa.indexer.token_indices", &[t, c.hs, width])?,
            token_count: i32s("qsa.indexer.token_count", &[t, c.hs])?,
            flags: flag_word(&ctx)?,
        };
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("qsa.indexer.step"),
            });
        let layout = self.pool.layout;
        let cp = QsaCompressParams {
            n: n as u32,
            di: c.di as u32,
            dr: c.dr as u32,
            r: c.r as u32,
            page_size: c.page_size as u32,
            k_off: 0,
            page_stride: layout.page_stride as u32,
            num_pages: layout.num_pages as u32,
            max_pages: self.max_pages as u32,
            max_blocks: self.max_blocks as u32,
            freq_rows: c.max_len as u32,
            span: span as u32,
            norm_on: 1,
            full: 0,
            eps: c.epsilon,
            offset: c.k_norm_offset,
        };
        let cb = CompressBuffers {
            pool: &self.pool_gpu.buffer,
            page_table: &table_g.buffer,
            lens: &lens_g.buffer,
            gamma: Some(&self.gamma_gpu.buffer),
            freqs: Some(&self.freqs_gpu.buffer),
            block_keys: &self.keys_gpu.buffer,
            flags: &out.flags.buffer,
        };
        encode_compress(&ctx, &mut enc, c.dtype, &cp, &cb).await?;
        let qp = QsaPrepareQueryParams {
            t: t as u32,
            hi: c.hi as u32,
            di: c.di as u32,
            dr: c.dr as u32,
            rope_mode: 2,
            norm_on: 1,
            freq_rows: c.max_len as u32,
            eps: c.epsilon,
            offset: c.q_norm_offset,
            ..Default::default()
        };
        let qb = QueryBuffers {
            q_raw: &q_raw.buffer,
            weight: &self.q_norm_gpu.buffer,
            rope_a: &self.freqs_gpu.buffer,
            rope_b: &ctx.dummy,
            positions: &pos_g.buffer,
            out: &q.buffer,
            flags: &out.flags.buffer,
        };
        encode_query(&ctx, &mut enc, c.dtype, &qp, &qb).await?;
        let sp = BlockScoreParams {
            t_total: t as u32,
            row_base: 0,
            rows: t as u32,
            n: n as u32,
            hi: c.hi as u32,
            hs: c.hs as u32,
            di: c.di as u32,
            r: c.r as u32,
            max_blocks: self.max_blocks as u32,
            has_counts: 1,
            has_weights: 0,
            scale: c.scale.unwrap_or(1.0 / (c.di as f32).sqrt()),
        };
        ctx.check_binding_size(OP, "scores", out.scores.bytes())?;
        let sb = ScoreBuffers {
            query: &q.buffer,
            keys: &self.keys_gpu.buffer,
            row_offsets: &offs_g.buffer,
            lens: &lens_g.buffer,
            weights: None,
            scores: &out.scores.buffer,
            flags: &out.flags.buffer,
        };
        encode_score(&ctx, &mut enc, c.dtype, &sp, &sb).await?;
        let tp = BlockTopkParams {
            rows: (t * c.hs) as u32,
            w: self.max_blocks as u32,
            k: c.k as u32,
            _pad0: 0,
        };
        if t > 0 {
            encode_topk(
                &ctx,
                &mut enc,
                &tp,
                &out.scores.buffer,
                &out.block_indices.buffer,
                &out.block_count.buffer,
            )
            .await?;
        }
        let ep = ExpandRouteParams {
            t: t as u32,
            hs: c.hs as u32,
            k: c.k as u32,
            r: c.r as u32,
            width: width as u32,
            ..Default::default()
        };
        let eb = ExpandBuffers {
            block_indices: &out.block_indices.buffer,
            block_count: &out.block_count.buffer,
            positions: &pos_g.buffer,
            token_indices: &out.token_indices.buffer,
            token_count: &out.token_count.buffer,
            flags: &out.flags.buffer,
        };
        encode_expand(&ctx, &mut enc, &ep, &eb).await?;
        ctx.submit(OP, enc).await?;
        Ok(out)
    }

    /// The same step through the CPU references, composed operator by operator. Updates the
    /// host mirror of the block keys; returns the four outputs and the `scores` they chose from.
    pub fn step_cpu(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
    ) -> Result<TensorMap> {
        let c = self.cfg.clone();
        let (offsets, cache, positions, table) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        let t = positions.len();
        let counts: Vec<i32> = offsets
            .windows(2)
            .zip(&cache)
            .map(|(o, c)| (c + o[1] - o[0]) as i32)
            .collect();
        let rows_used = n * self.max_blocks;
        let mut keys = self.block_keys.clone();
        keys.shape = vec![self.cfg.max_seqs * self.max_blocks, c.di];
        let used = Tensor::from_bytes(
            c.dtype,
            &[rows_used, c.di],
            keys.data[..rows_used * c.di * c.dtype.size()].to_vec(),
        )?;
        let j = |v: serde_json::Value| v;
        let mut m = TensorMap::new();
        m.insert("kv_blocks".into(), self.pool.tensor());
        m.insert("page_table".into(), table);
        m.insert("cache_lengths".into(), Tensor::from_u32(&[n], &cache));
        m.insert("key_counts".into(), Tensor::from_i32(&[n], &counts));
        m.insert("gamma".into(), self.k_norm.clone());
        m.insert("freqs_cis".into(), self.freqs.clone());
        m.insert("block_keys".into(), used);
        let a = [
            ("ratio", j(c.r.into())),
            ("epsilon", j(c.epsilon.into())),
            ("norm_weight_offset", j(c.k_norm_offset.into())),
        ];
        let a = a.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let new_keys = ops::run_cpu("qsa_compress_paged", &m, &a)?
            .remove("block_keys")
            .unwrap();
        let nb = new_keys.data.len();
        self.block_keys.data[..nb].copy_from_slice(&new_keys.data);

        let mut m = TensorMap::new();
        m.insert("index_query_raw".into(), index_query_raw.clone());
        m.insert("q_norm_weight".into(), self.q_norm.clone());
        m.insert("freqs_cis".into(), self.freqs.clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [
            ("epsilon", j(c.epsilon.into())),
            ("norm_weight_offset", j(c.q_norm_offset.into())),
        ];
        let a = a.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let q = ops::run_cpu("qsa_prepare_query", &m, &a)?
            .remove("index_query")
            .unwrap();

        let mut m = TensorMap::new();
        m.insert("index_query".into(), q);
        m.insert("block_keys".into(), new_keys);
        m.insert("row_offsets".into(), Tensor::from_u32(&[n + 1], &offsets));
        m.insert("cache_lengths".into(), Tensor::from_u32(&[n], &cache));
        let mut a: crate::ops::AttrMap = [
            ("ratio", j(c.r.into())),
            ("num_selection_heads", j(c.hs.into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(s) = c.scale {
            a.insert("scale".into(), j(s.into()));
        }
        let scores = ops::run_cpu("block_score", &m, &a)?
            .remove("scores")
            .unwrap();
        let m = TensorMap::from([("scores".to_string(), scores.clone())]);
        let a = [("k".to_string(), j(c.k.into()))].into_iter().collect();
        let mut sel = ops::run_cpu("block_topk", &m, &a)?;
        let mut m = TensorMap::new();
        m.insert("block_indices".into(), sel["block_indices"].clone());
        m.insert("block_count".into(), sel["block_count"].clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [("ratio".to_string(), j(c.r.into()))].into_iter().collect();
        let route = ops::run_cpu("expand_route", &m, &a)?;
        sel.extend(route);
        sel.insert("scores".into(), scores);
        Ok(sel)
    }

    /// Pipelines built so far by this layer's context.
    pub fn pipelines_created(&self) -> usize {
        self.ctx.cache.created()
    }
}
