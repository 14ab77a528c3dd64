//! The GPU step: device buffers sized once from the configuration, refilled by queue writes
//! each step, and the stages recorded into one encoder through a
//! [`BindCache`](crate::ops::common::BindCache), so that after the first step no pipeline and
//! no bind group is built. The selected attention is `sparse_attention`'s plan (route, partial
//! pass, combine) over the raw pool as one shard, through scratch buffers the step owns. The
//! outputs stay on the GPU as views, valid until the next step.

use super::plan::{attention_geometry, StepPlan};
use super::stages::*;
use super::{NsaConfig, NsaSelector, OP};
use crate::error::Result;
use crate::gpu::{Context, GpuTensor};
use crate::ops::common::read_checked;
use crate::ops::nsa_compress_attention::{
    dispatch_nsa_compress_attention, nsel, scratch_words, NsaAttnBuffers,
    NsaCompressAttentionParams,
};
use crate::ops::sparse_attention::{
    pack_seqs, params_kv, record_attention, scratch_buffer, worst_step_scratch,
    ShardedAttentionBuffers,
};
use crate::ops::TensorMap;
use crate::paged::PoolLayout;
use crate::tensor::{DType, Tensor};

/// The step's device buffers, allocated once (R = `max_step_rows`, S = `max_seqs`).
pub(super) struct StepBuffers {
    comp_seqs: GpuTensor, // [3S + 1 + S·max_pages] u32: compress stage's win_off, first_win, raw_len, page table
    cmp_table: GpuTensor, // [S, max_cmp_blocks] i32: the compressed caches' block table
    lens: GpuTensor,      // [4S + 1] u32: q_len, cmp_kv_len, sel_kv_len, q_start
    attn_seqs: GpuTensor, // [2S + 1 + S·max_pages] u32: row_offsets, cache_lengths, page table
    positions: GpuTensor, // [R] i32
    query: GpuTensor,     // [R, N1, Dqk] T
    cmp_out: GpuTensor,   // [R, N1, Dv] T
    topk: GpuTensor,      // [R, N2, k] i32
    psum: GpuTensor,      // [R·N2, max_cmp] f32 scratch
    scores: GpuTensor,    // [R·N2, max_nsel] f32 scratch
    count: GpuTensor,     // [R·N2] i32 scratch
    cmp_scratch: GpuTensor, // compressed attention's stages: scratch_words at the maxima, f32
    token_indices: GpuTensor, // [R, N2, k·l'] i32
    token_count: GpuTensor, // [R, N2] i32
    out: GpuTensor,       // [R, N1, Dv] T
    flags: GpuTensor,     // [1] u32
    partials: wgpu::Buffer, // selected attention's partial results (scratch)
    routes: wgpu::Buffer, // selected attention's routed token lists (scratch)
}

/// f32 words of the compressed attention's scratch for the worst step: `max_step_rows` rows
/// over `max_cmp` compressed tokens (the scratch grows with both; a smaller step uses a prefix).
fn cmp_scratch_words(c: &NsaConfig) -> u64 {
    let prm = NsaCompressAttentionParams {
        rows: c.max_step_rows as u32,
        n1: c.n1 as u32,
        n2: c.n2 as u32,
        dqk: c.dqk as u32,
        dv: c.dv as u32,
        c_max: c.max_cmp().max(1) as u32,
        ..Default::default()
    };
    scratch_words(&prm).max(1)
}

impl StepBuffers {
    /// The buffers of a layer whose raw pool has `layout`.
    pub(super) fn new(ctx: &Context, c: &NsaConfig, layout: PoolLayout) -> Result<Self> {
        let (r, s, mp) = (c.max_step_rows, c.max_seqs, c.max_pages());
        let buf = |name: &str, dt: DType, shape: &[usize]| {
            GpuTensor::filled(ctx, &format!("qsa.nsa.{name}"), dt, shape, 0)
        };
        // The selected attention's scratch for the worst step: few rows split many ways, or
        // max_step_rows rows (rows beyond what fits would be taken in chunks).
        let (partials, routes) = worst_step_scratch(ctx, r, layout.num_pages, |t| {
            params_kv(&attention_geometry(c, layout, t, s), c.dqk, c.dv)
        })?;
        Ok(StepBuffers {
            partials: scratch_buffer(ctx, "qsa.nsa.attention_partials", partials),
            routes: scratch_buffer(ctx, "qsa.nsa.attention_routes", routes),
            comp_seqs: buf("comp_seqs", DType::U32, &[3 * s + 1 + s * mp])?,
            cmp_table: buf("cmp_table", DType::I32, &[s, c.max_cmp_blocks()])?,
            lens: buf("lens", DType::U32, &[4 * s + 1])?,
            attn_seqs: buf("attn_seqs", DType::U32, &[2 * s + 1 + s * mp])?,
            positions: buf("positions", DType::I32, &[r])?,
            query: buf("query", c.dtype, &[r, c.n1, c.dqk])?,
            cmp_out: buf("cmp_out", c.dtype, &[r, c.n1, c.dv])?,
            topk: buf("topk", DType::I32, &[r, c.n2, c.k])?,
            psum: buf("psum", DType::F32, &[r * c.n2, c.max_cmp().max(1)])?,
            scores: buf("scores", DType::F32, &[r * c.n2, c.max_nsel()])?,
            count: buf("count", DType::I32, &[r * c.n2])?,
            cmp_scratch: buf("cmp_scratch", DType::F32, &[cmp_scratch_words(c) as usize])?,
            token_indices: buf("token_indices", DType::I32, &[r, c.n2, c.route_width()])?,
            token_count: buf("token_count", DType::I32, &[r, c.n2])?,
            out: buf("out", c.dtype, &[r, c.n1, c.dv])?,
            flags: buf("flags", DType::U32, &[1])?,
        })
    }
}

/// The outputs of one step, on the device: views of the layer's buffers, valid until the next
/// step overwrites them. [`StepOutputs::read`] brings them back.
pub struct StepOutputs {
    /// `[T, N1, Dv]` T: the selected branch, NSA's selected attention.
    pub out: GpuTensor,
    /// `[T, N1, Dv]` T: the compressed branch (nsa_compress_attention's `out`).
    pub cmp_out: GpuTensor,
    /// `[T, N2, k]` i32: the selected l'-token blocks of each KV head.
    pub topk: GpuTensor,
    /// `[T, N2, k·l']` i32: their tokens, clipped to each query's position, then −1.
    pub token_indices: GpuTensor,
    /// `[T, N2]` i32.
    pub token_count: GpuTensor,
    flags: GpuTensor,
}

/// Names of the outputs, in [`StepOutputs::read`]'s map.
pub const OUTPUTS: [&str; 5] = ["out", "cmp_out", "topk", "token_indices", "token_count"];

impl StepOutputs {
    /// Reads the five outputs back (and turns device flags into an error).
    pub async fn read(&self, ctx: &Context) -> Result<TensorMap> {
        let outputs = [
            &self.out,
            &self.cmp_out,
            &self.topk,
            &self.token_indices,
            &self.token_count,
        ];
        let got = read_checked(ctx, OP, &outputs, &self.flags).await?;
        Ok(OUTPUTS.iter().map(|n| n.to_string()).zip(got).collect())
    }
}

impl NsaSelector {
    /// Records and submits one step. `new_tokens` holds one count per slot (each 0 … 16); the
    /// K/V rows of those tokens must already be appended, and every new token is a query row
    /// of `query [T, N1, Dqk]` (slots in order). Each sequence with new tokens needs c ≥ 1
    /// compressed tokens and nsel ≥ k selection blocks after them.
    pub async fn step(&mut self, new_tokens: &[usize], query: &Tensor) -> Result<StepOutputs> {
        self.record(new_tokens, Some(query)).await
    }

    /// Compresses the windows the appended tokens complete, attending nothing: for tokens
    /// whose queries need no NSA output here (a prefill computed elsewhere, a restored
    /// context), in any number. Returns once submitted; a later step or read waits for it.
    pub async fn extend(&mut self, new_tokens: &[usize]) -> Result<()> {
        self.record(new_tokens, None).await.map(|_| ())
    }

    async fn record(
        &mut self,
        new_tokens: &[usize],
        query: Option<&Tensor>,
    ) -> Result<StepOutputs> {
        let plan = match query {
            Some(q) => self.query_plan(new_tokens, q)?,
            None => self.plan(new_tokens)?,
        };
        let ctx = self.ctx.clone();
        let c = self.cfg.clone();
        let nb = plan.slots.len();
        let u32s = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
        let win = plan.win_offsets();
        let b = &self.bufs;
        let seqs = compress_seqs(
            &win,
            &u32s(&plan.first_win),
            &u32s(&plan.len),
            &plan.page_table,
        );
        b.comp_seqs.write(&ctx, bytemuck::cast_slice(&seqs));
        b.cmp_table
            .write(&ctx, bytemuck::cast_slice(&plan.cmp_table));
        b.flags.write(&ctx, &[0; 4]);
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("qsa.nsa.step"),
            });
        self.binds.begin();

        // 1. The completed windows, K then V, into the compressed caches.
        let layout = self.pool.layout;
        let per_word = if c.dtype == DType::F32 { 1 } else { 2 };
        let caches = [
            ("compress_k", 0, c.dqk, &self.w_k_gpu, &self.cmp_key_gpu),
            ("compress_v", 1, c.dv, &self.w_v_gpu, &self.cmp_value_gpu),
        ];
        for (stage, plane, width, weight, cache) in caches {
            let total = win[nb] * (c.n2 * width) as u32;
            let prm = NsaCompressPagedParams {
                words: total / per_word,
                total,
                batches: nb as u32,
                heads: c.n2 as u32,
                width: width as u32,
                head_dim: layout.head_dim as u32,
                plane_off: layout.offset(0, plane, 0, 0, 0) as u32,
                page_size: layout.page_size as u32,
                page_stride: layout.page_stride as u32,
                num_pages: layout.num_pages as u32,
                max_pages: c.max_pages() as u32,
                l: c.l as u32,
                d: c.d as u32,
                cmp_page: c.cmp_page_size as u32,
                cmp_blocks: cache.shape[0] as u32,
                max_cmp_blocks: c.max_cmp_blocks() as u32,
            };
            let bufs = CompressPagedBuffers {
                pool: &self.pool_gpu.buffer,
                weight: &weight.buffer,
                seqs: &b.comp_seqs.buffer,
                table: &b.cmp_table.buffer,
                cache: &cache.buffer,
                flags: &b.flags.buffer,
            };
            let d = dispatch_compress_paged(&ctx, c.dtype, &prm, &bufs)?;
            self.binds.record(&ctx, &mut enc, stage, 0, d).await?;
        }
        // The texture copies of the caches follow the rows just written: the new windows of
        // each entry, in runs of consecutive cache rows.
        let runs = written_rows(&plan, c.cmp_page_size, c.max_cmp_blocks());
        for (tex, cache, width) in [
            (&self.cmp_key_tex, &self.cmp_key_gpu, c.dqk),
            (&self.cmp_value_tex, &self.cmp_value_gpu, c.dv),
        ] {
            if let Some(tex) = tex {
                let row = (c.n2 * width * c.dtype.size()) as u64;
                for &(lo, hi) in &runs {
                    let (a, z) = (lo * row, hi * row);
                    tex.copy_words(&mut enc, &cache.buffer, a / 16, z.div_ceil(16));
                }
            }
        }
        let Some(query) = query else {
            self.binds.submit(&ctx, OP, enc).await?;
            return Ok(self.outputs(0));
        };

        // 2. Compressed attention and the selection.
        let t = plan.rows();
        let rows = plan.row_offsets();
        let lens: Vec<u32> = [
            &u32s(&plan.new)[..],
            &u32s(&plan.cmp),
            &u32s(&plan.len),
            &rows,
        ]
        .concat();
        b.lens.write(&ctx, bytemuck::cast_slice(&lens));
        b.query.write(&ctx, &query.data);
        b.positions
            .write(&ctx, bytemuck::cast_slice(&plan.positions));
        let table = pack_seqs(&rows, &plan.cached_lengths(), &plan.page_table);
        b.attn_seqs.write(&ctx, &table.data);
        let c_max = *plan.cmp.iter().max().unwrap();
        let prm = NsaCompressAttentionParams {
            rows: t as u32,
            batches: nb as u32,
            seq: 0,
            n1: c.n1 as u32,
            n2: c.n2 as u32,
            dqk: c.dqk as u32,
            dv: c.dv as u32,
            page: c.cmp_page_size as u32,
            num_blocks: self.cmp_key_gpu.shape[0] as u32,
            max_blocks: c.max_cmp_blocks() as u32,
            l: c.l as u32,
            d: c.d as u32,
            lsel: c.lsel as u32,
            k: c.k as u32,
            c_max: c_max as u32,
            w: nsel(c_max, c.l, c.d, c.lsel) as u32,
            causal: 1,
            scale: c.softmax_scale(),
            split2: 0,
            split1: 0,
        }
        .for_adapter(&ctx);
        let sel = prm.topk_params();
        let bufs = NsaAttnBuffers {
            query: &b.query.buffer,
            key: &self.cmp_key_gpu.buffer,
            value: &self.cmp_value_gpu.buffer,
            block_table: &b.cmp_table.buffer,
            lens: &b.lens.buffer,
            out: &b.cmp_out.buffer,
            topk: &b.topk.buffer,
            psum: &b.psum.buffer,
            scores: &b.scores.buffer,
            count: &b.count.buffer,
            scratch: &b.cmp_scratch.buffer,
            flags: &b.flags.buffer,
            key_tex: self.cmp_key_tex.as_ref(),
            value_tex: self.cmp_value_tex.as_ref(),
        };
        for (stage, d) in dispatch_nsa_compress_attention(&ctx, c.dtype, &prm, &sel, &bufs)? {
            self.binds.record(&ctx, &mut enc, stage, 0, d).await?;
        }

        // 3. The selected blocks' tokens.
        let ep = NsaSelectExpandParams {
            t: t as u32,
            hs: c.n2 as u32,
            k: c.k as u32,
            lsel: c.lsel as u32,
            width: c.route_width() as u32,
            ..Default::default()
        };
        let eb = SelectExpandBuffers {
            topk: &b.topk.buffer,
            positions: &b.positions.buffer,
            token_indices: &b.token_indices.buffer,
            token_count: &b.token_count.buffer,
            flags: &b.flags.buffer,
        };
        let d = dispatch_select_expand(&ctx, &ep, &eb)?;
        self.binds
            .record(&ctx, &mut enc, "select_expand", 0, d)
            .await?;

        // 4. Attention over them: H = N1, Hkv = Hs = N2, E = Dqk, Ev = Dv; the raw pool is one
        // shard, the scratch the step's own.
        let geo = attention_geometry(&c, self.pool.layout, t, nb);
        let ap = params_kv(&geo, c.dqk, c.dv)?;
        let np = geo.layout.num_pages;
        let ab = ShardedAttentionBuffers {
            query: &b.query.buffer,
            pool: vec![&self.pool_gpu.buffer],
            shard_pages: np,
            seqs: &b.attn_seqs.buffer,
            token_indices: &b.token_indices.buffer,
            token_count: &b.token_count.buffer,
            sinks: None,
            out: &b.out.buffer,
            flags: &b.flags.buffer,
            partials: &b.partials,
            routes: &b.routes,
        };
        record_attention(
            &mut self.binds,
            &ctx,
            &mut enc,
            c.dtype,
            &ap,
            &ab,
            ["selected_route", "selected_attention", "selected_combine"],
        )
        .await?;
        self.binds.submit(&ctx, OP, enc).await?;
        Ok(self.outputs(t))
    }

    /// Turns GPU timing of the stages on or off; returns whether the adapter can time them.
    pub fn set_timing(&mut self, on: bool) -> bool {
        self.binds.set_timing(&self.ctx, on, 64)
    }

    /// GPU milliseconds per stage of the last step, when timing is on.
    pub async fn stage_times(&self) -> Result<Option<Vec<(&'static str, f64)>>> {
        self.binds.stage_times(&self.ctx).await
    }

    /// The compressed caches as the device holds them (`[cmp_blocks, P, N2·Dqk]`,
    /// `[cmp_blocks, P, N2·Dv]`).
    pub async fn read_cmp_cache(&self) -> Result<(Tensor, Tensor)> {
        let k = self.cmp_key_gpu.read(&self.ctx).await?;
        let v = self.cmp_value_gpu.read(&self.ctx).await?;
        Ok((k, v))
    }

    /// Views of the output buffers over `t` rows.
    fn outputs(&self, t: usize) -> StepOutputs {
        let (b, c) = (&self.bufs, &self.cfg);
        StepOutputs {
            out: b.out.view(&[t, c.n1, c.dv]),
            cmp_out: b.cmp_out.view(&[t, c.n1, c.dv]),
            topk: b.topk.view(&[t, c.n2, c.k]),
            token_indices: b.token_indices.view(&[t, c.n2, c.route_width()]),
            token_count: b.token_count.view(&[t, c.n2]),
            flags: b.flags.view(&[1]),
        }
    }
}

/// The compressed-cache rows a step's windows write, as runs `[lo, hi)` of consecutive rows:
/// window j of entry b lands in row `cmp_table[b][j / page] · page + j % page`.
fn written_rows(plan: &StepPlan, page: usize, max_blocks: usize) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for b in 0..plan.slots.len() {
        for j in plan.first_win[b]..plan.cmp[b] {
            let block = plan.cmp_table[b * max_blocks + j / page] as u64;
            let row = block * page as u64 + (j % page) as u64;
            match runs.last_mut() {
                Some(last) if last.1 == row => last.1 += 1,
                _ => runs.push((row, row + 1)),
            }
        }
    }
    runs
}
