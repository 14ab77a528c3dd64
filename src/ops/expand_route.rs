//! `expand_route` (SPEC §6): the token indices attention reads — the r positions of each
//! selected block, then the query's own unfinished tail. Shader: `shaders/expand_route.wgsl`.

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey};
use crate::tensor::{DType, Tensor};

pub const OP: &str = "expand_route";

/// Inputs of `expand_route`.
pub struct ExpandRouteInputs<'a> {
    pub block_indices: &'a Tensor,
    pub block_count: &'a Tensor,
    pub positions: &'a Tensor,
}

impl<'a> ExpandRouteInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(ExpandRouteInputs {
            block_indices: req(OP, m, "block_indices")?,
            block_count: req(OP, m, "block_count")?,
            positions: req(OP, m, "positions")?,
        })
    }
}

/// The ratio attribute (required, ≥ 1).
pub fn ratio_from_map(a: &AttrMap) -> Result<usize> {
    let r = attr_int_in(OP, a, "ratio", None, 1, 1 << 20)?;
    Ok(r as usize)
}

/// Outputs of `expand_route`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpandRouteOutputs {
    pub token_indices: Tensor,
    pub token_count: Tensor,
}

impl ExpandRouteOutputs {
    pub fn into_map(self) -> TensorMap {
        TensorMap::from([
            ("token_indices".to_string(), self.token_indices),
            ("token_count".to_string(), self.token_count),
        ])
    }
}

struct Plan {
    t: usize,
    hs: usize,
    k: usize,
    idx: Vec<i64>,
    cnt: Vec<i64>,
    pos: Vec<i64>,
}

/// Every host-checkable rule: shapes, counts in `0 ..= k`, positions ≥ 0, and each counted
/// block visible to its query (`0 <= b < (p + 1) / r`).
fn validate(x: &ExpandRouteInputs, r: usize) -> Result<Plan> {
    let &[t, hs, k] = rank(OP, "block_indices", x.block_indices, 3)? else {
        unreachable!()
    };
    let idx = ints(OP, "block_indices", x.block_indices)?;
    shape_is(OP, "block_count", x.block_count, &[t, hs])?;
    let cnt = ints(OP, "block_count", x.block_count)?;
    shape_is(OP, "positions", x.positions, &[t])?;
    let pos = ints(OP, "positions", x.positions)?;
    for (ti, &p) in pos.iter().enumerate() {
        if !(0..=i32::MAX as i64 / 2).contains(&p) {
            return Err(Error::input(
                OP,
                "positions",
                format!("row {ti}: position {p} is negative or too large"),
            ));
        }
        for g in 0..hs {
            let c = cnt[ti * hs + g];
            if c < 0 || c as usize > k {
                return Err(Error::input(
                    OP,
                    "block_count",
                    format!("row {ti}, group {g}: count {c} outside 0..={k}"),
                ));
            }
            let vis = (p + 1) / r as i64;
            for j in 0..c as usize {
                let b = idx[(ti * hs + g) * k + j];
                if b < 0 || b >= vis {
                    return Err(Error::input(
                        OP,
                        "block_indices",
                        format!("row {ti}, group {g}, slot {j}: block {b} is not visible at position {p} (0..{vis})"),
                    ));
                }
            }
        }
    }
    Ok(Plan {
        t,
        hs,
        k,
        idx,
        cnt,
        pos,
    })
}

/// The CPU reference.
pub fn cpu(x: &ExpandRouteInputs, r: usize) -> Result<ExpandRouteOutputs> {
    let p = validate(x, r)?;
    let width = p.k * r + r - 1;
    let mut tok = vec![-1i32; p.t * p.hs * width];
    let mut count = vec![0i32; p.t * p.hs];
    for t in 0..p.t {
        let pos = p.pos[t] as usize;
        let vis = (pos + 1) / r;
        for g in 0..p.hs {
            let row = t * p.hs + g;
            let out = &mut tok[row * width..][..width];
            let mut j = 0;
            for s in 0..p.cnt[row] as usize {
                let b = p.idx[row * p.k + s] as usize;
                for i in 0..r {
                    out[j] = (b * r + i) as i32;
                    j += 1;
                }
            }
            for q in vis * r..=pos {
                if q >= vis * r + (pos + 1) % r {
                    break;
                }
                out[j] = q as i32;
                j += 1;
            }
            count[row] = j as i32;
        }
    }
    Ok(ExpandRouteOutputs {
        token_indices: Tensor::from_i32(&[p.t, p.hs, width], &tok),
        token_count: Tensor::from_i32(&[p.t, p.hs], &count),
    })
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExpandRouteParams {
    pub t: u32,
    pub hs: u32,
    pub k: u32,
    pub r: u32,
    pub width: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// Device buffers of one expand dispatch.
pub struct ExpandBuffers<'a> {
    pub block_indices: &'a wgpu::Buffer,
    pub block_count: &'a wgpu::Buffer,
    pub positions: &'a wgpu::Buffer,
    pub token_indices: &'a wgpu::Buffer,
    pub token_count: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
}

/// Describes one expand dispatch (recorded by the `encode_` wrapper below or an orchestrator).
pub fn dispatch_expand<'a>(
    _ctx: &'a Context,
    prm: &'a ExpandRouteParams,
    b: &'a ExpandBuffers<'a>,
) -> Result<Dispatch<'a>> {
    Ok(Dispatch {
        key: PipelineKey::new(OP, "main"),
        params: bytemuck::bytes_of(prm),
        buffers: vec![
            b.block_indices,
            b.block_count,
            b.positions,
            b.token_indices,
            b.token_count,
            b.flags,
        ],
        // One workgroup per row (t, g).
        textures: vec![],
        groups: prm.t * prm.hs,
    })
}

/// Records the dispatch of [`dispatch_expand`] with a fresh bind group.
pub async fn encode_expand(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    prm: &ExpandRouteParams,
    b: &ExpandBuffers<'_>,
) -> Result<()> {
    encode(ctx, enc, dispatch_expand(ctx, prm, b)?).await
}

/// Runs on the GPU: uploads, one dispatch, readback.
pub async fn gpu(ctx: &Context, x: &ExpandRouteInputs<'_>, r: usize) -> Result<ExpandRouteOutputs> {
    let p = validate(x, r)?;
    let width = p.k * r + r - 1;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let idx = up("block_indices", x.block_indices)?;
    let cnt = up("block_count", x.block_count)?;
    let pos = up("positions", x.positions)?;
    let tok = GpuTensor::filled(
        ctx,
        "qsa.expand_route.token_indices",
        DType::I32,
        &[p.t, p.hs, width],
        0x7f,
    )?;
    let count = GpuTensor::filled(
        ctx,
        "qsa.expand_route.token_count",
        DType::I32,
        &[p.t, p.hs],
        0x7f,
    )?;
    let flags = flag_word(ctx)?;
    let prm = ExpandRouteParams {
        t: p.t as u32,
        hs: p.hs as u32,
        k: p.k as u32,
        r: r as u32,
        width: width as u32,
        ..Default::default()
    };
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = ExpandBuffers {
        block_indices: &idx.buffer,
        block_count: &cnt.buffer,
        positions: &pos.buffer,
        token_indices: &tok.buffer,
        token_count: &count.buffer,
        flags: &flags.buffer,
    };
    encode_expand(ctx, &mut enc, &prm, &bufs).await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&tok, &count], &flags).await?;
    Ok(ExpandRouteOutputs {
        token_count: got.pop().unwrap(),
        token_indices: got.pop().unwrap(),
    })
}
