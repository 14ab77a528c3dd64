//! `nsa_compress` (SPEC §8.2, Ascend aclnnNsaCompress): the compressed NSA cache. Each window
//! of l raw tokens, taken every d tokens inside one sequence of a TND batch, becomes one row
//! `Σ_t weight[t, n] · input[i·d + t, n, :]`. Shader: `shaders/nsa_compress.wgsl`.

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey};
use crate::tensor::{DType, Tensor};

pub const OP: &str = "nsa_compress";

/// Attributes of `nsa_compress`.
#[derive(Clone, Debug)]
pub struct NsaCompressAttrs {
    /// Window length l (= rows of `weight`).
    pub l: usize,
    /// Stride d between window starts (≥ 1; may exceed l).
    pub d: usize,
}

impl NsaCompressAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let l = attr_int_in(OP, a, "l", None, 1, 1 << 20)?;
        // d > l is allowed: SPEC §8.2's window count holds for any d (the tokens between
        // windows are then in none).
        let d = attr_int_in(OP, a, "d", None, 1, 1 << 20)?;
        Ok(NsaCompressAttrs {
            l: l as usize,
            d: d as usize,
        })
    }
}

/// Inputs of `nsa_compress`.
pub struct NsaCompressInputs<'a> {
    pub input: &'a Tensor,
    pub weight: &'a Tensor,
    pub seq_lens: &'a Tensor,
}

impl<'a> NsaCompressInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(NsaCompressInputs {
            input: req(OP, m, "input")?,
            weight: req(OP, m, "weight")?,
            seq_lens: req(OP, m, "seq_lens")?,
        })
    }
}

/// Windows of a sequence of `len` tokens: `max(0, (len − l) / d + 1)`.
pub fn windows(len: usize, l: usize, d: usize) -> usize {
    if len < l {
        0
    } else {
        (len - l) / d + 1
    }
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub t: usize,
    pub n: usize,
    pub dim: usize,
    /// First row of each sequence, then T: `[B + 1]`.
    pub row_offsets: Vec<u32>,
    /// First output window of each sequence, then the total: `[B + 1]`.
    pub win_offsets: Vec<u32>,
}

impl Plan {
    /// Output windows of the whole batch.
    pub fn windows(&self) -> usize {
        *self.win_offsets.last().unwrap() as usize
    }

    /// The shader's parameters for this call.
    pub fn params(&self, a: &NsaCompressAttrs) -> NsaCompressParams {
        let total = (self.windows() * self.n * self.dim) as u32;
        let per_word = if self.dt == DType::F32 { 1 } else { 2 };
        NsaCompressParams {
            words: total.div_ceil(per_word),
            total,
            n: self.n as u32,
            dim: self.dim as u32,
            l: a.l as u32,
            d: a.d as u32,
            batches: (self.row_offsets.len() - 1) as u32,
            t: self.t as u32,
        }
    }

    /// The `[2, B + 1]` offsets buffer of the shader: row offsets, then window offsets.
    pub fn offsets(&self) -> Vec<u32> {
        self.row_offsets
            .iter()
            .chain(&self.win_offsets)
            .copied()
            .collect()
    }
}

/// Every host-checkable rule of SPEC §8.2.
pub fn validate(x: &NsaCompressInputs, a: &NsaCompressAttrs) -> Result<Plan> {
    let dt = float_type(OP, "input", x.input)?;
    let &[t, n, dim] = rank(OP, "input", x.input, 3)? else {
        unreachable!()
    };
    if n == 0 || dim == 0 {
        return Err(Error::input(
            OP,
            "input",
            format!("zero-sized axis in shape {:?}", x.input.shape),
        ));
    }
    float_of(OP, "weight", x.weight, dt)?;
    shape_is(OP, "weight", x.weight, &[a.l, n])?;
    rank(OP, "seq_lens", x.seq_lens, 1)?;
    let lens = uints(OP, "seq_lens", x.seq_lens)?;
    let total: u64 = lens.iter().map(|&v| v as u64).sum();
    if total != t as u64 {
        return Err(Error::input(
            OP,
            "seq_lens",
            format!("sum to {total}, input has T = {t} rows"),
        ));
    }
    let mut row_offsets = vec![0u32];
    let mut win_offsets = vec![0u32];
    for &len in &lens {
        row_offsets.push(row_offsets.last().unwrap() + len);
        let w = windows(len as usize, a.l, a.d) as u32;
        win_offsets.push(win_offsets.last().unwrap() + w);
    }
    let out_elems = *win_offsets.last().unwrap() as u64 * (n * dim) as u64;
    if out_elems > u32::MAX as u64 / 4 {
        return Err(Error::input(
            OP,
            "seq_lens",
            format!("{out_elems} output elements exceed the 2^30 the shader indexes"),
        ));
    }
    Ok(Plan {
        dt,
        t,
        n,
        dim,
        row_offsets,
        win_offsets,
    })
}

/// The CPU reference: `out [windows, N, D]` T, packed in batch order.
pub fn cpu(x: &NsaCompressInputs, a: &NsaCompressAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let (inp, w) = (x.input.to_f32(), x.weight.to_f32());
    let (n, dim) = (p.n, p.dim);
    let mut out = vec![0f32; p.windows() * n * dim];
    for b in 0..p.row_offsets.len() - 1 {
        let first_row = p.row_offsets[b] as usize;
        for i in 0..(p.win_offsets[b + 1] - p.win_offsets[b]) as usize {
            let win = p.win_offsets[b] as usize + i;
            for h in 0..n {
                let dst = &mut out[(win * n + h) * dim..][..dim];
                for t in 0..a.l {
                    let wt = w[t * n + h];
                    let src = &inp[((first_row + i * a.d + t) * n + h) * dim..][..dim];
                    for (o, v) in dst.iter_mut().zip(src) {
                        *o += wt * v;
                    }
                }
            }
        }
    }
    Ok(Tensor::from_f32(p.dt, &[p.windows(), n, dim], &out))
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NsaCompressParams {
    /// Output words (one f32, or two f16/bf16, each).
    pub words: u32,
    /// Output elements: windows · N · D.
    pub total: u32,
    pub n: u32,
    pub dim: u32,
    pub l: u32,
    pub d: u32,
    pub batches: u32,
    /// Rows of `input`.
    pub t: u32,
}

/// Device buffers of one `nsa_compress` dispatch.
pub struct NsaCompressBuffers<'a> {
    /// `[T, N, D]` T.
    pub input: &'a wgpu::Buffer,
    /// `[l, N]` T.
    pub weight: &'a wgpu::Buffer,
    /// `[2, B + 1]` u32: row offsets of the sequences, then their first output windows
    /// ([`Plan::offsets`]).
    pub offsets: &'a wgpu::Buffer,
    /// `[windows, N, D]` T; every word is written.
    pub out: &'a wgpu::Buffer,
    /// The flag word (`shaders/common/flags.wgsl`).
    pub flags: &'a wgpu::Buffer,
}

/// Records one `nsa_compress` dispatch into `enc`. The offsets are device data: a window that
/// would read past its sequence or past `input` is written as 0 and raises a flag.
pub async fn encode_nsa_compress(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &NsaCompressParams,
    b: &NsaCompressBuffers<'_>,
) -> Result<()> {
    let need = prm.words as u64 * 4;
    ctx.check_binding_size(OP, "out", need)?;
    if b.out.size() < need {
        return Err(Error::input(
            OP,
            "out",
            format!(
                "buffer holds {} bytes, {} words needed",
                b.out.size(),
                prm.words
            ),
        ));
    }
    encode(
        ctx,
        enc,
        Dispatch {
            key: PipelineKey::new(OP, "main").with("T_KIND", dt.shader_kind()),
            params: bytemuck::bytes_of(prm),
            buffers: vec![b.input, b.weight, b.offsets, b.out, b.flags],
            textures: vec![],
            groups: prm.words.div_ceil(64),
        },
    )
    .await
}

/// Runs on the GPU: upload, one dispatch, checked readback.
pub async fn gpu(ctx: &Context, x: &NsaCompressInputs<'_>, a: &NsaCompressAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let input = up("input", x.input)?;
    let weight = up("weight", x.weight)?;
    let offs = p.offsets();
    let offsets = up("offsets", &Tensor::from_u32(&[offs.len()], &offs))?;
    let shape = [p.windows(), p.n, p.dim];
    let out = GpuTensor::filled(ctx, &format!("qsa.{OP}.out"), p.dt, &shape, 0xff)?;
    let flags = flag_word(ctx)?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = NsaCompressBuffers {
        input: &input.buffer,
        weight: &weight.buffer,
        offsets: &offsets.buffer,
        out: &out.buffer,
        flags: &flags.buffer,
    };
    encode_nsa_compress(ctx, &mut enc, p.dt, &p.params(a), &bufs).await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&out], &flags).await?;
    Ok(got.remove(0))
}
