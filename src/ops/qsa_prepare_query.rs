//! `qsa_prepare_query` (SPEC §3): index queries, each head RMS-normed and rotated exactly as
//! a block key, at the query's own position. Shader: `shaders/qsa_prepare_query.wgsl`.

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey};
use crate::tensor::{DType, Tensor};

pub const OP: &str = "qsa_prepare_query";

/// Attributes of `qsa_prepare_query`.
#[derive(Clone, Debug)]
pub struct QsaPrepareQueryAttrs {
    pub epsilon: f32,
    pub norm_weight_offset: f32,
    /// `None`: taken from the rope tables' width.
    pub rotary_dim: Option<usize>,
}

impl QsaPrepareQueryAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let epsilon = attr_epsilon(OP, a)?;
        let rotary_dim = attr_opt_usize(OP, a, "rotary_dim")?;
        Ok(QsaPrepareQueryAttrs {
            epsilon,
            norm_weight_offset: attr_f32(OP, a, "norm_weight_offset", 0.0)?,
            rotary_dim,
        })
    }
}

/// Inputs of `qsa_prepare_query`.
pub struct QsaPrepareQueryInputs<'a> {
    pub index_query_raw: &'a Tensor,
    pub q_norm_weight: Option<&'a Tensor>,
    pub rope_cos: Option<&'a Tensor>,
    pub rope_sin: Option<&'a Tensor>,
    pub freqs_cis: Option<&'a Tensor>,
    pub positions: Option<&'a Tensor>,
}

impl<'a> QsaPrepareQueryInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(QsaPrepareQueryInputs {
            index_query_raw: req(OP, m, "index_query_raw")?,
            q_norm_weight: opt(m, "q_norm_weight"),
            rope_cos: opt(m, "rope_cos"),
            rope_sin: opt(m, "rope_sin"),
            freqs_cis: opt(m, "freqs_cis"),
            positions: opt(m, "positions"),
        })
    }
}

/// Where the rotation comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Rope {
    None,
    /// Per-row, per-channel cos/sin tables.
    Tables,
    /// `freqs_cis` rows at these positions.
    Freqs(Vec<u32>),
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub t: usize,
    pub hi: usize,
    pub di: usize,
    pub dr: usize,
    pub rope: Rope,
    pub freq_rows: usize,
}

/// Every host-checkable rule of SPEC §3.
pub fn validate(x: &QsaPrepareQueryInputs, a: &QsaPrepareQueryAttrs) -> Result<Plan> {
    let dt = float_type(OP, "index_query_raw", x.index_query_raw)?;
    let &[t, hi, di] = rank(OP, "index_query_raw", x.index_query_raw, 3)? else {
        unreachable!()
    };
    check_di(OP, "index_query_raw", di)?;
    if let Some(w) = x.q_norm_weight {
        float_of(OP, "q_norm_weight", w, dt)?;
        shape_is(OP, "q_norm_weight", w, &[di])?;
    }
    let tables = x.rope_cos.is_some() || x.rope_sin.is_some();
    let freqs = x.freqs_cis.is_some() || x.positions.is_some();
    if tables && freqs {
        return Err(Error::input(
            OP,
            "freqs_cis",
            "give rope_cos/rope_sin or freqs_cis/positions, not both",
        ));
    }
    let check_width = |name: &str, w: usize| -> Result<usize> {
        let dr = a.rotary_dim.unwrap_or(w);
        if dr != w {
            return Err(Error::input(
                OP,
                name,
                format!("has {w} columns, rotary_dim is {dr}"),
            ));
        }
        check_dr(OP, name, dr, di)?;
        Ok(dr)
    };
    let mut freq_rows = 0;
    let (dr, rope) = if tables {
        let c = x
            .rope_cos
            .ok_or_else(|| Error::input(OP, "rope_cos", "rope_sin is given, rope_cos is not"))?;
        let s = x
            .rope_sin
            .ok_or_else(|| Error::input(OP, "rope_sin", "rope_cos is given, rope_sin is not"))?;
        float_of(OP, "rope_cos", c, dt)?;
        float_of(OP, "rope_sin", s, dt)?;
        let &[ct, w] = rank(OP, "rope_cos", c, 2)? else {
            unreachable!()
        };
        if ct != t {
            return Err(Error::input(
                OP,
                "rope_cos",
                format!("has {ct} rows for T = {t}"),
            ));
        }
        shape_is(OP, "rope_sin", s, &c.shape)?;
        (check_width("rope_cos", w)?, Rope::Tables)
    } else if freqs {
        let f = x
            .freqs_cis
            .ok_or_else(|| Error::input(OP, "freqs_cis", "positions is given, freqs_cis is not"))?;
        let p = x
            .positions
            .ok_or_else(|| Error::input(OP, "positions", "freqs_cis is given, positions is not"))?;
        float_of(OP, "freqs_cis", f, dt)?;
        let &[rows, w] = rank(OP, "freqs_cis", f, 2)? else {
            unreachable!()
        };
        shape_is(OP, "positions", p, &[t])?;
        let pos = ints(OP, "positions", p)?;
        let mut out = Vec::with_capacity(t);
        for (i, &v) in pos.iter().enumerate() {
            if v < 0 || v as usize >= rows {
                return Err(Error::input(
                    OP,
                    "positions",
                    format!("row {i}: position {v} outside freqs_cis rows 0..{rows}"),
                ));
            }
            out.push(v as u32);
        }
        freq_rows = rows;
        (check_width("freqs_cis", w)?, Rope::Freqs(out))
    } else {
        (0, Rope::None)
    };
    Ok(Plan {
        dt,
        t,
        hi,
        di,
        dr,
        rope,
        freq_rows,
    })
}

/// The CPU reference.
pub fn cpu(x: &QsaPrepareQueryInputs, a: &QsaPrepareQueryAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let mut q = x.index_query_raw.to_f32();
    let w = x.q_norm_weight.map(|t| t.to_f32());
    let cos = x.rope_cos.map(|t| t.to_f32());
    let sin = x.rope_sin.map(|t| t.to_f32());
    let freqs = x.freqs_cis.map(|t| t.to_f32());
    let dr = p.dr;
    for t in 0..p.t {
        for h in 0..p.hi {
            let row = &mut q[(t * p.hi + h) * p.di..][..p.di];
            transform_row(
                row,
                w.as_deref(),
                a.epsilon,
                a.norm_weight_offset,
                dr,
                |c| match &p.rope {
                    Rope::Tables => (
                        cos.as_ref().unwrap()[t * dr + c],
                        sin.as_ref().unwrap()[t * dr + c],
                    ),
                    Rope::Freqs(pos) => {
                        let i = pos[t] as usize * dr + 2 * (c % (dr / 2));
                        let f = freqs.as_ref().unwrap();
                        (f[i], f[i + 1])
                    }
                    Rope::None => (1.0, 0.0),
                },
            );
        }
    }
    Ok(Tensor::from_f32(p.dt, &x.index_query_raw.shape, &q))
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QsaPrepareQueryParams {
    pub t: u32,
    pub hi: u32,
    pub di: u32,
    pub dr: u32,
    pub rope_mode: u32,
    pub norm_on: u32,
    pub freq_rows: u32,
    pub _pad0: u32,
    pub eps: f32,
    pub offset: f32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// Device buffers of one query-prep dispatch (the context's dummy buffer where unused).
pub struct QueryBuffers<'a> {
    pub q_raw: &'a wgpu::Buffer,
    pub weight: &'a wgpu::Buffer,
    pub rope_a: &'a wgpu::Buffer,
    pub rope_b: &'a wgpu::Buffer,
    pub positions: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
}

/// The word kernel (`qsa_prepare_query_vec.wgsl`): rows of whole 16-byte words and, with
/// rotation, halves of whole words. The element kernel's arithmetic in its order: the same bits
/// where the driver contracts both alike (lavapipe, llvmpipe), within a rounding step elsewhere.
pub const SHADER_VEC: &str = "qsa_prepare_query_vec";

/// The shader for a dispatch: the word kernel where rows and rotary halves are whole 16-byte
/// words (Di a multiple of 4 f32 or 8 16-bit elements, Dr of twice that), else the element one.
pub fn shader(dt: DType, prm: &QsaPrepareQueryParams) -> &'static str {
    let per_word = 16 / dt.size() as u32;
    let rope_ok = prm.rope_mode == 0 || prm.dr.is_multiple_of(2 * per_word);
    if prm.di.is_multiple_of(per_word) && rope_ok {
        SHADER_VEC
    } else {
        OP
    }
}

/// Describes one query-prep dispatch (recorded by the `encode_` wrapper below or an orchestrator).
pub fn dispatch_query<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a QsaPrepareQueryParams,
    b: &'a QueryBuffers<'a>,
) -> Result<Dispatch<'a>> {
    dispatch_query_with(ctx, shader(dt, prm), dt, prm, b)
}

/// [`dispatch_query`] with the shader given: `OP` (the element kernel, any shape) or
/// [`SHADER_VEC`] (only where [`shader`] picks it).
pub fn dispatch_query_with<'a>(
    _ctx: &'a Context,
    shader: &'static str,
    dt: DType,
    prm: &'a QsaPrepareQueryParams,
    b: &'a QueryBuffers<'a>,
) -> Result<Dispatch<'a>> {
    Ok(Dispatch {
        key: PipelineKey::new(shader, "main").with("T_KIND", dt.shader_kind()),
        params: bytemuck::bytes_of(prm),
        buffers: vec![
            b.q_raw,
            b.weight,
            b.rope_a,
            b.rope_b,
            b.positions,
            b.out,
            b.flags,
        ],
        // One invocation per (row, head), 64 per workgroup.
        textures: vec![],
        groups: (prm.t * prm.hi).div_ceil(64),
    })
}

/// Records the dispatch of [`dispatch_query`] with a fresh bind group.
pub async fn encode_query(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &QsaPrepareQueryParams,
    b: &QueryBuffers<'_>,
) -> Result<()> {
    encode(ctx, enc, dispatch_query(ctx, dt, prm, b)?).await
}

/// Runs on the GPU: uploads, one dispatch, readback.
pub async fn gpu(
    ctx: &Context,
    x: &QsaPrepareQueryInputs<'_>,
    a: &QsaPrepareQueryAttrs,
) -> Result<Tensor> {
    gpu_with(ctx, x, a, false).await
}

/// [`gpu`], on the element kernel whatever the shape when `element` is set (the tests compare
/// the two kernels with it).
pub async fn gpu_with(
    ctx: &Context,
    x: &QsaPrepareQueryInputs<'_>,
    a: &QsaPrepareQueryAttrs,
    element: bool,
) -> Result<Tensor> {
    let p = validate(x, a)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let q = up("index_query_raw", x.index_query_raw)?;
    let w = x
        .q_norm_weight
        .map(|t| up("q_norm_weight", t))
        .transpose()?;
    let (mode, ra, rb, pos) = match &p.rope {
        Rope::None => (0, None, None, None),
        Rope::Tables => (1, x.rope_cos, x.rope_sin, None),
        Rope::Freqs(pos) => (
            2,
            x.freqs_cis,
            None,
            Some(Tensor::from_u32(&[pos.len()], pos)),
        ),
    };
    let ra = ra.map(|t| up("rope_a", t)).transpose()?;
    let rb = rb.map(|t| up("rope_b", t)).transpose()?;
    let pos = pos.map(|t| up("positions", &t)).transpose()?;
    let out = GpuTensor::filled(
        ctx,
        "qsa.qsa_prepare_query.index_query",
        p.dt,
        &x.index_query_raw.shape,
        0xff,
    )?;
    let flags = flag_word(ctx)?;
    let prm = QsaPrepareQueryParams {
        t: p.t as u32,
        hi: p.hi as u32,
        di: p.di as u32,
        dr: p.dr as u32,
        rope_mode: mode,
        norm_on: w.is_some() as u32,
        freq_rows: p.freq_rows as u32,
        eps: a.epsilon,
        offset: a.norm_weight_offset,
        ..Default::default()
    };
    let d = &ctx.dummy;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = QueryBuffers {
        q_raw: &q.buffer,
        weight: w.as_ref().map_or(d, |b| &b.buffer),
        rope_a: ra.as_ref().map_or(d, |b| &b.buffer),
        rope_b: rb.as_ref().map_or(d, |b| &b.buffer),
        positions: pos.as_ref().map_or(d, |b| &b.buffer),
        out: &out.buffer,
        flags: &flags.buffer,
    };
    let pick = if element { OP } else { shader(p.dt, &prm) };
    encode(
        ctx,
        &mut enc,
        dispatch_query_with(ctx, pick, p.dt, &prm, &bufs)?,
    )
    .await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&out], &flags).await?;
    Ok(got.remove(0))
}
