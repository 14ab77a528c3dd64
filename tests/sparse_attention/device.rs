//! sparse_attention tests: a problem's call through the device entry points
//! (`encode_attention`, `encode_attention_sharded`) with what a run changes (`Run`: pool
//! shards, split length, an edited `seqs` image, the context), its uploaded buffers and
//! the pool in shards.
#![allow(dead_code)]

use super::problem::{Data, Problem, Shape};
use qsa_wgpu::gpu::{Context, GpuTensor, Readback};
use qsa_wgpu::ops::sparse_attention::{
    encode_attention, encode_attention_sharded, pack_seqs, params_kv, plan_attention,
    scratch_buffer, validate, AttentionBuffers, AttentionPlan, ShardedAttentionBuffers,
    SparseAttentionParams,
};
use qsa_wgpu::paged::PoolLayout;
use qsa_wgpu::testing::Rng;
use qsa_wgpu::{DType, Tensor};
use std::sync::Arc;

/// What one device run changes from the problem's own call.
#[derive(Default)]
pub struct Run {
    /// Pool shards of this many pages (`None`: one buffer).
    pub shard_pages: Option<usize>,
    /// Splits of this many list entries (`None`: the planned ones).
    pub split_len: Option<u32>,
    /// An edit of the `seqs` image (device data past the host checks).
    pub seqs: Option<fn(&mut Vec<u32>)>,
    /// The context (`None`: `crate::util::ctx()`).
    pub ctx: Option<Arc<Context>>,
}

impl Run {
    /// The problem's own call, then the same call over a pool in shards of `shard_pages` pages
    /// with its token lists split every 256 entries.
    pub fn plain_and_split(shard_pages: usize) -> [Run; 2] {
        [
            Run::default(),
            Run {
                split_len: Some(256),
                shard_pages: Some(shard_pages),
                ..Default::default()
            },
        ]
    }
}

/// A problem's call on the device: its uploaded inputs (the `seqs` image edited by `run.seqs`;
/// the token lists and counts `lists` where given, device data past the host checks), its
/// output (0xff bytes) and flag word, and the uniform block (`run.split_len` applied).
pub struct Uploaded {
    pub dt: DType,
    pub layout: PoolLayout,
    pub shape: Vec<usize>,
    pub prm: SparseAttentionParams,
    pub query: GpuTensor,
    pub seqs: GpuTensor,
    pub tokens: GpuTensor,
    pub counts: GpuTensor,
    pub sinks: Option<GpuTensor>,
    pub out: GpuTensor,
    pub flags: GpuTensor,
}

impl Uploaded {
    /// The call's buffers over `pool` in one buffer.
    pub fn buffers<'a>(&'a self, pool: &'a wgpu::Buffer) -> AttentionBuffers<'a> {
        AttentionBuffers {
            query: &self.query.buffer,
            pool,
            seqs: &self.seqs.buffer,
            token_indices: &self.tokens.buffer,
            token_count: &self.counts.buffer,
            sinks: self.sinks.as_ref().map(|s| &s.buffer),
            out: &self.out.buffer,
            flags: &self.flags.buffer,
        }
    }
}

pub fn upload(
    ctx: &Context,
    p: &Problem,
    run: &Run,
    lists: Option<(&Tensor, &Tensor)>,
) -> Uploaded {
    let x = p.inputs();
    let plan = validate(&x, &p.attrs).unwrap();
    let mut prm: SparseAttentionParams = params_kv(&plan.geo, plan.e, plan.ev).unwrap();
    if let Some(len) = run.split_len {
        prm.split_len = len;
        prm.splits = prm.w.div_ceil(len).max(1);
    }
    let mut seqs = pack_seqs(&plan.offsets, &plan.cache, &plan.table)
        .to_i64()
        .iter()
        .map(|&v| v as u32)
        .collect::<Vec<u32>>();
    if let Some(edit) = run.seqs {
        edit(&mut seqs);
    }
    let up = |t: &Tensor| GpuTensor::upload(ctx, "test", t).unwrap();
    let (tokens, counts) = lists.unwrap_or((x.token_indices, x.token_count));
    let shape = vec![plan.geo.t, plan.geo.h, plan.ev];
    Uploaded {
        dt: plan.dt,
        layout: plan.geo.layout,
        out: GpuTensor::filled(ctx, "out", plan.dt, &shape, 0xff).unwrap(),
        shape,
        prm,
        query: up(x.query),
        seqs: up(&Tensor::from_u32(&[seqs.len()], &seqs)),
        tokens: up(tokens),
        counts: up(counts),
        sinks: x.sinks.map(up),
        flags: up(&Tensor::from_u32(&[1], &[0])),
    }
}

/// The pool of `p` in shards of `sp` pages on the device (shard k holds pages k·sp … as laid out
/// in the whole pool), with the plan for them and its scratch buffers (routes readable).
pub struct Shards {
    pub sp: usize,
    pub pool: Vec<GpuTensor>,
    pub plan: AttentionPlan,
    pub partials: wgpu::Buffer,
    pub routes: wgpu::Buffer,
}

impl Shards {
    pub fn new(ctx: &Context, p: &Problem, u: &Uploaded, sp: usize) -> Self {
        let (l, es) = (u.layout, u.dt.size());
        let bytes = &p.pool.data;
        let pool = (0..l.num_pages)
            .step_by(sp)
            .map(|lo| {
                let a = lo * l.page_stride * es;
                let b = (((lo + sp).min(l.num_pages) * l.page_stride) * es).min(bytes.len());
                let t = Tensor::from_bytes(u.dt, &[(b - a) / es], bytes[a..b].to_vec()).unwrap();
                GpuTensor::upload(ctx, "test.pool", &t).unwrap()
            })
            .collect();
        let cap = ctx.limits.max_storage_buffer_binding_size;
        let plan = plan_attention(ctx, &u.prm, sp, cap, cap).unwrap();
        let routes = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("test.routes"),
            size: plan.routes_bytes.div_ceil(16) * 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Shards {
            sp,
            pool,
            partials: scratch_buffer(ctx, "test.partials", plan.partials_bytes),
            plan,
            routes,
        }
    }

    pub fn buffers<'a>(&'a self, u: &'a Uploaded) -> ShardedAttentionBuffers<'a> {
        ShardedAttentionBuffers {
            pool: self.pool.iter().map(|s| &s.buffer).collect(),
            ..u.buffers(&self.pool[0].buffer)
                .sharded(self.sp, &self.partials, &self.routes)
        }
    }
}

/// The flag word from its readback bytes.
pub fn flag_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

/// Runs `p` through `encode_attention` / `encode_attention_sharded`; returns the output and the
/// flag word.
pub fn run_device(p: &Problem, run: &Run) -> (Tensor, u32) {
    let ctx = run.ctx.clone().unwrap_or_else(crate::util::ctx);
    let u = upload(&ctx, p, run, None);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    match run.shard_pages {
        None => {
            let pool = GpuTensor::upload(&ctx, "test", &p.pool).unwrap();
            let b = u.buffers(&pool.buffer);
            pollster::block_on(encode_attention(&ctx, &mut enc, u.dt, &u.prm, &b)).unwrap();
        }
        Some(sp) => {
            let sh = Shards::new(&ctx, p, &u, sp);
            pollster::block_on(encode_attention_sharded(
                &ctx,
                &mut enc,
                u.dt,
                &u.prm,
                &sh.buffers(&u),
            ))
            .unwrap();
        }
    }
    pollster::block_on(ctx.submit("test", enc)).unwrap();
    let got = Readback::new(
        &ctx,
        &[(&u.out.buffer, u.out.bytes()), (&u.flags.buffer, 4)],
    )
    .blocking(&ctx)
    .unwrap();
    (
        Tensor::from_bytes(u.dt, &u.shape, got[0].clone()).unwrap(),
        flag_of(&got[1]),
    )
}

/// Gives row `row` of `d` (of the problem's shape `s`, at position `p`) exactly `count` tokens,
/// a random subset of 0 ..= p, and junk after them.
pub fn set_count(rng: &mut Rng, s: &Shape, d: &mut Data, row: usize, p: usize, count: usize) {
    for g in 0..s.hs {
        let perm = rng.permutation(p + 1);
        let r = &mut d.tokens[(row * s.hs + g) * s.w..][..s.w];
        for (j, slot) in r.iter_mut().enumerate() {
            *slot = if j < count { perm[j] as i32 } else { -1 };
        }
        d.counts[row * s.hs + g] = count as i32;
    }
}
