//! The GPU step: device buffers sized once from the configuration (`max_step_tokens` rows),
//! refilled by queue writes each step, and the stages recorded into one encoder through a
//! [`BindCache`](crate::ops::common::BindCache), so that after the first step no pipeline and
//! no bind group is built (unless the score matrix needs more row chunks than ever before).

use super::{QsaIndexer, OP};
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey, WordTexture};
use crate::ops::block_score::{
    dispatch_score_tiled, rows_per_chunk, BlockScoreParams, ScoreBuffers, Tiling,
};
use crate::ops::block_topk::{
    dispatch_topk, dispatch_topk_split, split_applies, split_scratch, wide, BlockTopkParams,
    TopkRoute, SPLIT_MAX_ROWS,
};
use crate::ops::common::{read_checked, Dispatch};
use crate::ops::qsa_compress_paged::{dispatch_compress, CompressBuffers, QsaCompressParams};
use crate::ops::qsa_prepare_query::{
    dispatch_query, dispatch_query_with, shader as query_shader, QsaPrepareQueryParams,
    QueryBuffers, SHADER_VEC,
};
use crate::ops::sparse_attention::{
    pack_seqs, params as attention_params, record_attention, AttentionGeometry,
    ShardedAttentionBuffers,
};
use crate::ops::TensorMap;
use crate::tensor::{DType, Tensor};

use super::IndexerConfig;

/// The first bind-cache slot of the split top-k's dispatches (chunk c takes `SPLIT_SLOTS + c`).
const SPLIT_SLOTS: usize = 1 << 20;

/// The shader of the step's compress and query preparation in one dispatch.
const SHADER_FUSED_PREPARE: &str = "qsa_compress_query";

/// The most (row, head) pairs of index queries a step prepares in its compress dispatch: one
/// workgroup of the query kernel, which is what a decode step has (16 rows at Hi = 4). More
/// go to their own dispatch: in the fused shader llvmpipe runs the query's workgroups at
/// about half their speed (the kernel holds the compress's barriers, so llvmpipe compiles
/// all of it as a coroutine), which cost an 8K prefill 9 ms (docs/perf.md), while the
/// dispatch it saves is worth ~0.02-0.05 ms.
pub const FUSED_QUERY_PAIRS: usize = 64;

/// The params of [`SHADER_FUSED_PREPARE`]: the compress dispatch's, then the query
/// preparation's (the shader's `FusedUniform`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct FusedPrepareParams {
    c: QsaCompressParams,
    q: QsaPrepareQueryParams,
}

/// The compress of `p.c` (one pool shard) and the word kernel of the query preparation of
/// `p.q` in one dispatch: the compress workgroups first, then the query's, 64 (row, head)
/// pairs each. Only where [`crate::gpu::Capabilities::fused_prepare`] and the word kernel
/// applies ([`query_shader`] gives [`SHADER_VEC`]). The buffers are the two dispatches', in
/// their order, the query's flag word being the compress's (the shader binds it once; the
/// step passes the same buffer to both).
fn dispatch_compress_query<'a>(
    ctx: &'a Context,
    dt: DType,
    p: &'a FusedPrepareParams,
    cb: &'a CompressBuffers<'a>,
    qb: &'a QueryBuffers<'a>,
) -> Result<Dispatch<'a>> {
    let compress = dispatch_compress(ctx, dt, &p.c, cb)?;
    let query = dispatch_query_with(ctx, SHADER_VEC, dt, &p.q, qb)?;
    let (flags, query_buffers) = query.buffers.split_last().expect("the query's flag word");
    debug_assert!(std::ptr::eq(*flags, cb.flags));
    Ok(Dispatch {
        key: PipelineKey::new(SHADER_FUSED_PREPARE, "main").with("T_KIND", dt.shader_kind()),
        params: bytemuck::bytes_of(p),
        buffers: compress
            .buffers
            .into_iter()
            .chain(query_buffers.iter().copied())
            .collect(),
        textures: vec![],
        groups: compress.groups + query.groups,
    })
}

/// The step's device buffers, allocated once.
pub(super) struct StepBuffers {
    table: GpuTensor,  // [max_seqs, max_pages] u32
    lens: GpuTensor,   // [2, max_seqs] u32: cache lengths, then key counts
    offs: GpuTensor,   // [max_seqs + 1] u32
    pos: GpuTensor,    // [max_step_tokens] i32
    q_raw: GpuTensor,  // [max_step_tokens, Hi, Di] T
    q: GpuTensor,      // [max_step_tokens, Hi, Di] T
    scores: GpuTensor, // [chunk_rows, Hs, max_blocks] f32, one row chunk at a time
    chunk_rows: usize,
    block_indices: GpuTensor, // [max_step_tokens, Hs, k] i32
    block_count: GpuTensor,   // [max_step_tokens, Hs] i32
    token_indices: GpuTensor, // [max_step_tokens, Hs, k·r + r − 1] i32
    token_count: GpuTensor,   // [max_step_tokens, Hs] i32
    flags: GpuTensor,         // [1] u32
    /// The split top-k's scratch, for up to `SPLIT_MAX_ROWS` rows of a chunk, where the
    /// context splits wide rows ([`Capabilities::split_topk`](crate::gpu::Capabilities)).
    split: Option<GpuTensor>,
}

impl StepBuffers {
    /// A texture copy of the prepared index queries, or `None` when the adapter's textures
    /// cannot hold them.
    pub(super) fn query_texture(&self, ctx: &Context) -> Option<WordTexture> {
        WordTexture::new(ctx, "qsa.indexer.index_query", self.q.buffer.size())
    }

    pub(super) fn new(ctx: &Context, c: &IndexerConfig, max_pages: usize) -> Result<Self> {
        let rows = c.max_step_tokens;
        let mb = c.max_blocks();
        let mut chunk_rows = rows_per_chunk(ctx, c.hs, mb)?.min(rows);
        if let Some(cap) = c.score_chunk_rows {
            chunk_rows = chunk_rows.min(cap);
        }
        let buf = |name: &str, dt: DType, shape: &[usize]| {
            GpuTensor::filled(ctx, &format!("qsa.indexer.{name}"), dt, shape, 0)
        };
        Ok(StepBuffers {
            table: buf("page_table", DType::U32, &[c.max_seqs, max_pages])?,
            lens: buf("lens", DType::U32, &[2, c.max_seqs])?,
            offs: buf("row_offsets", DType::U32, &[c.max_seqs + 1])?,
            pos: buf("positions", DType::I32, &[rows])?,
            q_raw: buf("index_query_raw", c.dtype, &[rows, c.hi, c.di])?,
            q: buf("index_query", c.dtype, &[rows, c.hi, c.di])?,
            scores: buf("scores", DType::F32, &[chunk_rows, c.hs, mb])?,
            chunk_rows,
            block_indices: buf("block_indices", DType::I32, &[rows, c.hs, c.k])?,
            block_count: buf("block_count", DType::I32, &[rows, c.hs])?,
            token_indices: buf("token_indices", DType::I32, &[rows, c.hs, c.route_width()])?,
            token_count: buf("token_count", DType::I32, &[rows, c.hs])?,
            flags: buf("flags", DType::U32, &[1])?,
            // Only where a step's rows can be few enough (a chunk holds whole tokens of Hs rows).
            split: match ctx.caps.split_topk
                && wide(mb as u32, c.k as u32)
                && c.hs <= SPLIT_MAX_ROWS as usize
            {
                true => {
                    let rows = (chunk_rows * c.hs).min(SPLIT_MAX_ROWS as usize) as u32;
                    Some(split_scratch(
                        ctx,
                        "qsa.indexer.topk_split",
                        rows,
                        mb as u32,
                    )?)
                }
                false => None,
            },
        })
    }
}

/// The selections of one step, on the device: views of the layer's output buffers, valid
/// until the next step overwrites them. [`StepOutputs::read`] brings them back.
pub struct StepOutputs {
    /// `[T, Hs, max_blocks]` f32, −inf past each row's visible blocks (what top-k chose
    /// from); kept only when the step's scores fit one row chunk (`None` otherwise).
    pub scores: Option<GpuTensor>,
    /// `[T, Hs, k]` i32.
    pub block_indices: GpuTensor,
    /// `[T, Hs]` i32.
    pub block_count: GpuTensor,
    /// `[T, Hs, k·r + r − 1]` i32.
    pub token_indices: GpuTensor,
    /// `[T, Hs]` i32.
    pub token_count: GpuTensor,
    /// `[T, H, E]` of the layer's type: the attention output, after
    /// [`QsaIndexer::step_with_attention`].
    pub out: Option<GpuTensor>,
    flags: GpuTensor,
}

impl StepOutputs {
    /// Reads the outputs back (and turns device flags into an error): the four of the
    /// selection, and `out` when the step ran attention.
    pub async fn read(&self, ctx: &Context) -> Result<TensorMap> {
        let mut outputs = vec![
            &self.block_indices,
            &self.block_count,
            &self.token_indices,
            &self.token_count,
        ];
        let mut names = vec![
            "block_indices",
            "block_count",
            "token_indices",
            "token_count",
        ];
        if let Some(o) = &self.out {
            outputs.push(o);
            names.push("out");
        }
        let got = read_checked(ctx, OP, &outputs, &self.flags).await?;
        Ok(names.iter().map(|n| n.to_string()).zip(got).collect())
    }
}

impl QsaIndexer {
    /// Records and submits one step. `new_tokens` holds one count per slot; the keys of those
    /// rows must already be appended. `index_query_raw` is `[T, Hi, Di]` over the new rows,
    /// slots in order.
    pub async fn step(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
    ) -> Result<StepOutputs> {
        self.record(new_tokens, Some(index_query_raw), None).await
    }

    /// A step that also runs the main attention over the selection, in the same submission:
    /// `query` is `[T, H, E]` (the attention queries of the new rows, already rotated as the
    /// model does). The layer must be configured with [`IndexerConfig::attention`] and every
    /// sequence's K/V appended ([`QsaIndexer::append_kv`]) up to its index keys.
    pub async fn step_with_attention(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
        query: &Tensor,
    ) -> Result<StepOutputs> {
        self.record(new_tokens, Some(index_query_raw), Some(query))
            .await
    }

    /// Compresses the blocks the appended keys complete, selecting nothing: a step for tokens
    /// whose queries need no selection (a restored context, a prefill computed elsewhere).
    /// Returns once submitted; a later step or read waits for it.
    pub async fn extend(&mut self, new_tokens: &[usize]) -> Result<()> {
        self.record(new_tokens, None, None).await.map(|_| ())
    }

    async fn record(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: Option<&Tensor>,
        attention_query: Option<&Tensor>,
    ) -> Result<StepOutputs> {
        let ctx = self.ctx.clone();
        let c = self.cfg.clone();
        let (offsets, cache, positions, table) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        // Rows that get a selection: none for a keys-only step.
        let t = if index_query_raw.is_some() {
            positions.len()
        } else {
            0
        };
        if t > c.max_step_tokens {
            return Err(Error::input(
                OP,
                "new_tokens",
                format!(
                    "{t} rows in one step > max_step_tokens {}",
                    c.max_step_tokens
                ),
            ));
        }
        if let Some(q) = index_query_raw {
            if q.shape != [t, c.hi, c.di] || q.dtype != c.dtype {
                return Err(Error::input(
                    OP,
                    "index_query_raw",
                    format!(
                        "expected [{t}, {}, {}] {}, got {:?} {}",
                        c.hi, c.di, c.dtype, q.shape, q.dtype
                    ),
                ));
            }
        }
        if let Some(q) = attention_query {
            let Some(kv) = &self.kv else {
                return Err(Error::input(
                    OP,
                    "query",
                    "the layer was configured without attention".to_string(),
                ));
            };
            let a = &kv.cfg;
            if q.shape != [t, a.h, a.e] || q.dtype != c.dtype {
                return Err(Error::input(
                    OP,
                    "query",
                    format!(
                        "expected [{t}, {}, {}] {}, got {:?} {}",
                        a.h, a.e, c.dtype, q.shape, q.dtype
                    ),
                ));
            }
            self.check_kv_complete()?;
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
        let b = &self.bufs;
        let lens: Vec<u32> = cache.iter().chain(counts.iter()).copied().collect();
        b.table.write(&ctx, bytemuck::cast_slice(&table));
        b.lens.write(&ctx, bytemuck::cast_slice(&lens));
        b.offs.write(&ctx, bytemuck::cast_slice(&offsets));
        if let Some(q) = index_query_raw {
            b.pos.write(&ctx, bytemuck::cast_slice(&positions));
            b.q_raw.write(&ctx, &q.data);
        }
        b.flags.write(&ctx, &[0; 4]);

        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("qsa.indexer.step"),
            });
        self.binds.begin();
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
            q_raw: &b.q_raw.buffer,
            weight: &self.q_norm_gpu.buffer,
            rope_a: &self.freqs_gpu.buffer,
            rope_b: &ctx.dummy,
            positions: &b.pos.buffer,
            out: &b.q.buffer,
            flags: &b.flags.buffer,
        };
        // The query preparation rides in the first shard's compress dispatch where it can and
        // is one workgroup (a decode step's rows; see FUSED_QUERY_PAIRS).
        let can_fuse = ctx.caps.fused_prepare && query_shader(c.dtype, &qp) == SHADER_VEC;
        let fuse = can_fuse && t > 0 && t * c.hi <= FUSED_QUERY_PAIRS;
        // The device pool holds K rows only: pages of page_size · Di elements.
        let page_stride = c.page_size * c.di;
        for (shard, pool) in self.pool_gpu.iter().enumerate() {
            let cp = QsaCompressParams {
                n: n as u32,
                di: c.di as u32,
                dr: c.dr as u32,
                r: c.r as u32,
                page_size: c.page_size as u32,
                k_off: 0,
                page_stride: page_stride as u32,
                num_pages: self.pool.layout.num_pages as u32,
                max_pages: self.max_pages as u32,
                max_blocks: self.max_blocks as u32,
                freq_rows: c.max_len as u32,
                span: span as u32,
                norm_on: 1,
                full: 0,
                eps: c.epsilon,
                offset: c.k_norm_offset,
                page_lo: (shard * self.shard_pages) as u32,
                shard_pages: pool.shape[0] as u32,
                _pad0: 0,
                _pad1: 0,
            };
            let cb = CompressBuffers {
                pool: &pool.buffer,
                page_table: &b.table.buffer,
                lens: &b.lens.buffer,
                gamma: Some(&self.gamma_gpu.buffer),
                freqs: Some(&self.freqs_gpu.buffer),
                block_keys: &self.keys_gpu.buffer,
                flags: &b.flags.buffer,
            };
            let fp = FusedPrepareParams { c: cp, q: qp };
            let first = shard == 0;
            let built = self.binds.created();
            if fuse && first {
                let d = dispatch_compress_query(&ctx, c.dtype, &fp, &cb, &qb)?;
                self.binds
                    .record(&ctx, &mut enc, "compress_query", 0, d)
                    .await?;
            } else {
                let d = dispatch_compress(&ctx, c.dtype, &cp, &cb)?;
                self.binds
                    .record(&ctx, &mut enc, "compress", shard, d)
                    .await?;
            }
            // Whenever one way's bind groups are built, the other's are built too, so that
            // switching between prefill chunks (two dispatches) and decode rows (one) builds
            // nothing.
            if can_fuse && first && self.binds.created() > built {
                let fused = dispatch_compress_query(&ctx, c.dtype, &fp, &cb, &qb)?;
                let compress = dispatch_compress(&ctx, c.dtype, &cp, &cb)?;
                let query = dispatch_query(&ctx, c.dtype, &qp, &qb)?;
                let binds = &mut self.binds;
                binds.prepare(&ctx, "compress_query", 0, &fused).await?;
                binds.prepare(&ctx, "compress", 0, &compress).await?;
                binds.prepare(&ctx, "query", 0, &query).await?;
            }
        }
        // The texture copy of the block keys follows the rows just compressed: blocks
        // cache / r .. count / r of each slot, in whole 16-byte words.
        if let Some([_, tex]) = &self.textures {
            let row_bytes = (c.di * c.dtype.size()) as u64;
            for i in 0..n {
                let (lo, hi) = (cache[i] as usize / c.r, counts[i] as usize / c.r);
                if hi > lo {
                    let first = (i * self.max_blocks) as u64 * row_bytes;
                    let (a, z) = (first + lo as u64 * row_bytes, first + hi as u64 * row_bytes);
                    tex.copy_words(&mut enc, &self.keys_gpu.buffer, a / 16, z.div_ceil(16));
                }
            }
        }
        if index_query_raw.is_none() {
            self.binds.submit(&ctx, OP, enc).await?;
            return Ok(self.outputs(0));
        }

        if !fuse {
            let d = dispatch_query(&ctx, c.dtype, &qp, &qb)?;
            self.binds.record(&ctx, &mut enc, "query", 0, d).await?;
        }
        if let Some([tex, _]) = &self.textures {
            let bytes = (t * c.hi * c.di * c.dtype.size()) as u64;
            tex.copy_words(&mut enc, &b.q.buffer, 0, bytes.div_ceil(16));
        }

        // Score and select in row chunks through one scratch buffer.
        let sb = ScoreBuffers {
            query: &b.q.buffer,
            keys: &self.keys_gpu.buffer,
            textures: self.textures.as_ref().map(|[q, k]| [&q.view, &k.view]),
            row_offsets: &b.offs.buffer,
            lens: &b.lens.buffer,
            weights: None,
            scores: &b.scores.buffer,
            flags: &b.flags.buffer,
        };
        let (mut base, mut chunk) = (0, 0);
        while base < t {
            let rows = b.chunk_rows.min(t - base);
            let sp = BlockScoreParams {
                t_total: t as u32,
                row_base: base as u32,
                rows: rows as u32,
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
            // Each tiling has its own pipeline, so its own slot; whenever this one's bind group
            // is built, the other one's is built too, so that switching between prefill and
            // decode builds nothing.
            let tiling = Tiling::for_context(&ctx, sp.rows, sp.n);
            let slot = |t: Tiling| 2 * chunk + (t == Tiling::OneRow) as usize;
            let built = self.binds.created();
            let d = dispatch_score_tiled(&ctx, c.dtype, &sp, &sb, tiling)?;
            self.binds
                .record(&ctx, &mut enc, "score", slot(tiling), d)
                .await?;
            if self.binds.created() > built {
                let other = dispatch_score_tiled(&ctx, c.dtype, &sp, &sb, tiling.other())?;
                self.binds
                    .prepare(&ctx, "score", slot(tiling.other()), &other)
                    .await?;
            }
            // The top-k writes the token route too (expand_route fused into its last step).
            let tp = BlockTopkParams {
                rows: (rows * c.hs) as u32,
                w: self.max_blocks as u32,
                k: c.k as u32,
                out_base: (base * c.hs) as u32,
                hs: c.hs as u32,
                r: c.r as u32,
                width: c.route_width() as u32,
                _pad: 0,
            };
            let route = TopkRoute {
                positions: &b.pos.buffer,
                token_indices: &b.token_indices.buffer,
                token_count: &b.token_count.buffer,
                flags: &b.flags.buffer,
            };
            let (bi, bc) = (&b.block_indices.buffer, &b.block_count.buffer);
            match b.split.as_ref().filter(|_| split_applies(&ctx, &tp)) {
                // A few wide rows (decode on a GPU): spread over workgroups, two dispatches,
                // in slots of their own so that chunks of many rows (prefill) keep theirs.
                Some(sc) => {
                    let sb = &sc.buffer;
                    let [part, merge] =
                        dispatch_topk_split(&ctx, &tp, &b.scores.buffer, bi, bc, Some(route), sb)?;
                    let slot = SPLIT_SLOTS + chunk;
                    let binds = &mut self.binds;
                    binds
                        .record(&ctx, &mut enc, "topk_part", slot, part)
                        .await?;
                    binds.record(&ctx, &mut enc, "topk", slot, merge).await?;
                }
                None => {
                    let d = dispatch_topk(&ctx, &tp, &b.scores.buffer, bi, bc, Some(route))?;
                    self.binds.record(&ctx, &mut enc, "topk", chunk, d).await?;
                }
            }
            base += rows;
            chunk += 1;
        }

        if let (Some(q), Some(kv)) = (attention_query, &self.kv) {
            kv.query.write(&ctx, &q.data);
            let seqs = pack_seqs(&offsets, &cache, &table);
            kv.seqs.write(&ctx, &seqs.data);
            let prm = attention_params(&AttentionGeometry {
                t,
                n,
                h: kv.cfg.h,
                hs: c.hs,
                w: c.route_width(),
                layout: kv.layout,
                layer_idx: 0,
                max_pages: self.max_pages,
                scale: kv.cfg.scale,
                has_sinks: kv.sinks.is_some(),
            })?;
            let ab = ShardedAttentionBuffers {
                query: &kv.query.buffer,
                pool: kv.gpu.iter().map(|g| &g.buffer).collect(),
                shard_pages: kv.shard_pages,
                seqs: &kv.seqs.buffer,
                token_indices: &b.token_indices.buffer,
                token_count: &b.token_count.buffer,
                sinks: kv.sinks.as_ref().map(|s| &s.buffer),
                out: &kv.out.buffer,
                flags: &b.flags.buffer,
                partials: &kv.partials,
                routes: &kv.routes,
            };
            record_attention(
                &mut self.binds,
                &ctx,
                &mut enc,
                c.dtype,
                &prm,
                &ab,
                ["attention_route", "attention", "attention_combine"],
            )
            .await?;
        }
        self.binds.submit(&ctx, OP, enc).await?;
        let mut out = self.outputs(t);
        if let (Some(_), Some(kv)) = (attention_query, &self.kv) {
            out.out = Some(kv.out.view(&[t, kv.cfg.h, kv.cfg.e]));
        }
        Ok(out)
    }

    /// Turns GPU timing of the stages on or off; returns whether the adapter can time them
    /// (it needs timestamp queries).
    pub fn set_timing(&mut self, on: bool) -> bool {
        self.binds.set_timing(&self.ctx, on, 256)
    }

    /// GPU milliseconds per stage of the last step, when timing is on: `compress`, `query`,
    /// `score`, `topk` (which also writes the token route; with the split top-k, its first
    /// dispatch is `topk_part`), and `attention_route` /
    /// `attention` / `attention_combine` after a step with attention; chunks and shards summed.
    pub async fn stage_times(&self) -> Result<Option<Vec<(&'static str, f64)>>> {
        self.binds.stage_times(&self.ctx).await
    }

    /// Views of the output buffers over `t` rows.
    fn outputs(&self, t: usize) -> StepOutputs {
        let (b, c) = (&self.bufs, &self.cfg);
        StepOutputs {
            scores: (t > 0 && t <= b.chunk_rows)
                .then(|| b.scores.view(&[t, c.hs, self.max_blocks])),
            block_indices: b.block_indices.view(&[t, c.hs, c.k]),
            block_count: b.block_count.view(&[t, c.hs]),
            token_indices: b.token_indices.view(&[t, c.hs, c.route_width()]),
            token_count: b.token_count.view(&[t, c.hs]),
            out: None,
            flags: b.flags.view(&[1]),
        }
    }
}
