//! `sparse_attention` (SPEC §7): GQA attention of each query head over the tokens its
//! selection group gathered (`expand_route`'s output), read from the main paged KV pool, with
//! an optional per-head sink; values may have another width than keys (`v_head_dim` Ev, for
//! NSA's Dqk = 192, Dv = 128). This module holds the attributes, inputs, host validation and
//! CPU reference; its `dispatch` part how a call is cut into workgroups and the shaders'
//! parameters ([`params_kv`]); its `encode` part the buffers, the plan of dispatches
//! ([`plan_attention`]) and [`encode_attention`], which records a call over device buffers for
//! orchestrators. Shaders: `shaders/sparse_attention_route.wgsl` (token
//! lists routed to pool shards), `shaders/sparse_attention.wgsl` (partial results per
//! token-list split) and `shaders/sparse_attention_combine.wgsl` (their merge).

mod dispatch;
mod encode;

pub use dispatch::*;
pub use encode::*;

use super::block_score::ragged;
use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor};
use crate::paged::PoolLayout;
use crate::tensor::{DType, Tensor};

pub const OP: &str = "sparse_attention";

/// Attributes of `sparse_attention`.
#[derive(Clone, Debug)]
pub struct SparseAttentionAttrs {
    /// `None`: 1 / sqrt(E).
    pub scale: Option<f32>,
    pub layer_idx: usize,
    /// `None`: the packed page size.
    pub page_stride: Option<i64>,
    /// Ev, the channels of values and of the output. `None`: E, and the pool's `head_dim` must
    /// be E. Given: the pool's `head_dim` must be max(E, Ev); K is read from the first E
    /// channels of a row, V from the first Ev.
    pub v_head_dim: Option<usize>,
}

impl SparseAttentionAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let scale = attr_opt_f32(OP, a, "scale")?;
        let layer = attr_int(OP, a, "layer_idx", Some(0))?;
        if layer < 0 {
            return Err(Error::attr(
                OP,
                "layer_idx",
                format!("must be >= 0, got {layer}"),
            ));
        }
        let page_stride = attr_opt_int(OP, a, "page_stride")?;
        let v_head_dim = match attr_opt_usize(OP, a, "v_head_dim")? {
            Some(0) => return Err(Error::attr(OP, "v_head_dim", "must be >= 1, got 0")),
            v => v,
        };
        Ok(SparseAttentionAttrs {
            scale,
            layer_idx: layer as usize,
            page_stride,
            v_head_dim,
        })
    }
}

/// Inputs of `sparse_attention`.
pub struct SparseAttentionInputs<'a> {
    pub query: &'a Tensor,
    pub kv_blocks: &'a Tensor,
    pub page_table: &'a Tensor,
    pub row_offsets: &'a Tensor,
    pub cache_lengths: &'a Tensor,
    pub token_indices: &'a Tensor,
    pub token_count: &'a Tensor,
    pub sinks: Option<&'a Tensor>,
}

impl<'a> SparseAttentionInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(SparseAttentionInputs {
            query: req(OP, m, "query")?,
            kv_blocks: req(OP, m, "kv_blocks")?,
            page_table: req(OP, m, "page_table")?,
            row_offsets: req(OP, m, "row_offsets")?,
            cache_lengths: req(OP, m, "cache_lengths")?,
            token_indices: req(OP, m, "token_indices")?,
            token_count: req(OP, m, "token_count")?,
            sinks: opt(m, "sinks"),
        })
    }
}

/// The checked geometry and host copies of one call.
pub struct Plan {
    pub dt: DType,
    pub geo: AttentionGeometry,
    /// Query and key channels E.
    pub e: usize,
    /// Value and output channels Ev.
    pub ev: usize,
    pub offsets: Vec<u32>,
    pub cache: Vec<u32>,
    pub table: Vec<u32>,
    pub tokens: Vec<i64>,
    pub counts: Vec<i64>,
    pub sinks: Option<Vec<f32>>,
}

impl Plan {
    /// Sequence and position of row `t`.
    pub fn locate(&self, t: usize) -> (usize, usize) {
        let n = self.offsets.partition_point(|&o| o as usize <= t) - 1;
        (n, self.cache[n] as usize + t - self.offsets[n] as usize)
    }
}

/// Every host-checkable rule of SPEC §7, page-table entries of the gathered tokens included.
pub fn validate(x: &SparseAttentionInputs, a: &SparseAttentionAttrs) -> Result<Plan> {
    let dt = float_type(OP, "query", x.query)?;
    let &[t, h, e] = rank(OP, "query", x.query, 3)? else {
        unreachable!()
    };
    if h == 0 {
        return Err(Error::input(OP, "query", "has no heads (H = 0)"));
    }
    check_di(OP, "query", e)?;
    float_of(OP, "kv_blocks", x.kv_blocks, dt)?;
    let layout = PoolLayout::from_tensor(OP, "kv_blocks", x.kv_blocks, a.page_stride, false)?;
    let hkv = layout.num_kv_heads;
    let ev = a.v_head_dim.unwrap_or(e);
    check_di(OP, "v_head_dim", ev)?;
    match a.v_head_dim {
        None if layout.head_dim != e => {
            return Err(Error::input(
                OP,
                "kv_blocks",
                format!(
                    "head_dim {} differs from the query's E = {e}",
                    layout.head_dim
                ),
            ))
        }
        Some(_) if layout.head_dim != e.max(ev) => {
            return Err(Error::input(
                OP,
                "kv_blocks",
                format!(
                    "head_dim {} must be max(E = {e}, v_head_dim = {ev})",
                    layout.head_dim
                ),
            ))
        }
        _ => {}
    }
    if h % hkv != 0 {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("num_kv_heads {hkv} does not divide the query's H = {h}"),
        ));
    }
    if a.layer_idx >= layout.num_layers {
        return Err(Error::attr(
            OP,
            "layer_idx",
            format!("{} >= num_layers {}", a.layer_idx, layout.num_layers),
        ));
    }
    let (offsets, cache) = ragged(OP, x.row_offsets, x.cache_lengths, t)?;
    let n = cache.len();
    let &[tn, max_pages] = rank(OP, "page_table", x.page_table, 2)? else {
        unreachable!()
    };
    if tn != n {
        return Err(Error::input(
            OP,
            "page_table",
            format!("has {tn} rows for {n} sequences"),
        ));
    }
    let table = page_entries(OP, x.page_table)?;
    let &[tt, hs, w] = rank(OP, "token_indices", x.token_indices, 3)? else {
        unreachable!()
    };
    if tt != t || hs == 0 || h % hs != 0 {
        return Err(Error::input(
            OP,
            "token_indices",
            format!(
                "shape {:?} must be [T = {t}, Hs, W] with Hs dividing H = {h}",
                x.token_indices.shape
            ),
        ));
    }
    let tokens = ints(OP, "token_indices", x.token_indices)?;
    shape_is(OP, "token_count", x.token_count, &[t, hs])?;
    let counts = ints(OP, "token_count", x.token_count)?;
    let mut plan = Plan {
        dt,
        e,
        ev,
        geo: AttentionGeometry {
            t,
            n,
            h,
            hs,
            w,
            layout,
            layer_idx: a.layer_idx,
            max_pages,
            scale: a.scale,
            has_sinks: x.sinks.is_some(),
        },
        offsets,
        cache,
        table,
        tokens,
        counts,
        sinks: None,
    };
    for row in 0..t {
        let (seq, p) = plan.locate(row);
        for g in 0..hs {
            let c = plan.counts[row * hs + g];
            if c < 0 || c as usize > w {
                return Err(Error::input(
                    OP,
                    "token_count",
                    format!("row {row}, group {g}: count {c} outside 0..={w}"),
                ));
            }
            for j in 0..c as usize {
                let tok = plan.tokens[(row * hs + g) * w + j];
                if tok < 0 || tok as usize > p {
                    return Err(Error::input(
                        OP,
                        "token_indices",
                        format!("row {row}, group {g}, slot {j}: token {tok} is outside 0..={p}, the query's position"),
                    ));
                }
                let col = tok as usize / layout.page_size;
                if col >= max_pages {
                    return Err(Error::input(
                        OP,
                        "page_table",
                        format!("sequence {seq}: position {tok} needs page column {col}, the table has {max_pages}"),
                    ));
                }
                let at = (seq * max_pages + col, seq, col);
                check_page(OP, x.page_table, &plan.table, at, layout.num_pages)?;
            }
        }
    }
    if let Some(s) = x.sinks {
        if s.dtype != DType::F32 {
            return Err(Error::input(
                OP,
                "sinks",
                format!("dtype {} must be f32", s.dtype),
            ));
        }
        shape_is(OP, "sinks", s, &[h])?;
        let v = s.to_f32();
        if let Some((i, b)) = v
            .iter()
            .enumerate()
            .find(|(_, b)| b.is_nan() || **b == f32::INFINITY)
        {
            return Err(Error::input(
                OP,
                "sinks",
                format!("element {i} is {b}; a sink is finite or -inf"),
            ));
        }
        plan.sinks = Some(v);
    }
    params_kv(&plan.geo, e, ev)?;
    Ok(plan)
}

/// Scores at or below this weigh 0 (the GPU passes' "no score yet", `LOW` in
/// `shaders/common/attention.wgsl`): below every score of finite inputs short of overflow.
pub const SCORE_FLOOR: f32 = -3.0e38;

/// The CPU reference: `out [T, H, Ev]`, a two-pass softmax per (row, head) in f32.
pub fn cpu(x: &SparseAttentionInputs, a: &SparseAttentionAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let g = p.geo;
    let (l, h, hs, w) = (g.layout, g.h, g.hs, g.w);
    let (e, ev, hkv) = (p.e, p.ev, l.num_kv_heads);
    let scale = g.scale.unwrap_or(1.0 / (e as f32).sqrt());
    let (q, pool) = (x.query.to_f32(), x.kv_blocks.to_f32());
    let mut out = vec![0f32; g.t * h * ev];
    for t in 0..g.t {
        let (seq, _) = p.locate(t);
        for head in 0..h {
            let (kh, sel) = (head / (h / hkv), head / (h / hs));
            let row = t * hs + sel;
            let list = &p.tokens[row * w..][..p.counts[row] as usize];
            if list.is_empty() {
                continue;
            }
            let at = |tok: i64, plane: usize| {
                let tok = tok as usize;
                let page = p.table[seq * g.max_pages + tok / l.page_size] as usize;
                l.offset(page, plane, g.layer_idx, tok % l.page_size, kh)
            };
            let qr = &q[(t * h + head) * e..][..e];
            let z: Vec<f32> = list
                .iter()
                .map(|&tok| {
                    let k = &pool[at(tok, 0)..][..e];
                    scale * qr.iter().zip(k).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect();
            let o = &mut out[(t * h + head) * ev..][..ev];
            // Non-finite scores (docs/operators.md, sparse_attention): NaN or +inf makes the
            // head NaN, as e^{z - m} is NaN for it; a score at or below SCORE_FLOOR (-inf
            // included) weighs 0, and with no score above it and no sink the head is 0, as
            // for an empty list. The GPU passes do the same.
            if z.iter().any(|z| z.is_nan() || *z == f32::INFINITY) {
                o.fill(f32::NAN);
                continue;
            }
            let live = |z: f32| z > SCORE_FLOOR;
            let sink = p.sinks.as_ref().map(|s| s[head]).filter(|&s| live(s));
            let m = z
                .iter()
                .copied()
                .filter(|&z| live(z))
                .chain(sink)
                .fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let mut den = sink.map_or(0.0, |s| (s - m).exp());
            for (&tok, &zj) in list.iter().zip(&z) {
                if !live(zj) {
                    continue;
                }
                let wgt = (zj - m).exp();
                den += wgt;
                let v = &pool[at(tok, 1)..][..ev];
                o.iter_mut().zip(v).for_each(|(o, v)| *o += wgt * v);
            }
            o.iter_mut().for_each(|o| *o /= den);
        }
    }
    Ok(Tensor::from_f32(p.dt, &[g.t, h, ev], &out))
}

/// Runs on the GPU: uploads, one dispatch, readback of `out` and the flags.
pub async fn gpu(
    ctx: &Context,
    x: &SparseAttentionInputs<'_>,
    a: &SparseAttentionAttrs,
) -> Result<Tensor> {
    let p = validate(x, a)?;
    let g = p.geo;
    let prm = params_kv(&g, p.e, p.ev)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let query = up("query", x.query)?;
    let pool = up("kv_blocks", x.kv_blocks)?;
    let seqs = up("seqs", &pack_seqs(&p.offsets, &p.cache, &p.table))?;
    let tokens = up("token_indices", x.token_indices)?;
    let counts = up("token_count", x.token_count)?;
    let sinks = x.sinks.map(|s| up("sinks", s)).transpose()?;
    let shape = [g.t, g.h, p.ev];
    let out = GpuTensor::filled(ctx, "qsa.sparse_attention.out", p.dt, &shape, 0xff)?;
    let flags = flag_word(ctx)?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = AttentionBuffers {
        query: &query.buffer,
        pool: &pool.buffer,
        seqs: &seqs.buffer,
        token_indices: &tokens.buffer,
        token_count: &counts.buffer,
        sinks: sinks.as_ref().map(|s| &s.buffer),
        out: &out.buffer,
        flags: &flags.buffer,
    };
    encode_attention(ctx, &mut enc, p.dt, &prm, &bufs).await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&out], &flags).await?;
    Ok(got.remove(0))
}
