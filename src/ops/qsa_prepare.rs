//! `qsa_prepare` (SPEC §1, OpenVINO QSAPrepare): block keys from the raw index keys of new
//! tokens, dense form, carrying the unfinished block from call to call.
//! Shader: `shaders/qsa_prepare.wgsl`.

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey, Readback};
use crate::tensor::{DType, Tensor};

pub const OP: &str = "qsa_prepare";

/// Attributes of `qsa_prepare`.
#[derive(Clone, Debug)]
pub struct QsaPrepareAttrs {
    pub key_block_size: usize,
    pub epsilon: f32,
    pub norm_weight_offset: f32,
}

impl QsaPrepareAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let r = attr_int(OP, a, "key_block_size", None)?;
        if r < 2 {
            return Err(Error::attr(
                OP,
                "key_block_size",
                format!("must be >= 2, got {r}"),
            ));
        }
        if r > 1 << 20 {
            return Err(Error::attr(
                OP,
                "key_block_size",
                format!("{r} is implausibly large"),
            ));
        }
        let epsilon = attr_epsilon(OP, a)?;
        Ok(QsaPrepareAttrs {
            key_block_size: r as usize,
            epsilon,
            norm_weight_offset: attr_f32(OP, a, "norm_weight_offset", 0.0)?,
        })
    }
}

/// Inputs of `qsa_prepare`, by contract name.
pub struct QsaPrepareInputs<'a> {
    pub raw_index_keys: &'a Tensor,
    pub past_block_index_keys: &'a Tensor,
    pub key_length: &'a Tensor,
    pub rope_cos: Option<&'a Tensor>,
    pub rope_sin: Option<&'a Tensor>,
    pub k_norm_weight: Option<&'a Tensor>,
    pub past_incomplete_raw_keys: &'a Tensor,
    pub past_incomplete_rope: Option<&'a Tensor>,
}

impl<'a> QsaPrepareInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(QsaPrepareInputs {
            raw_index_keys: req(OP, m, "raw_index_keys")?,
            past_block_index_keys: req(OP, m, "past_block_index_keys")?,
            key_length: req(OP, m, "key_length")?,
            rope_cos: opt(m, "rope_cos"),
            rope_sin: opt(m, "rope_sin"),
            k_norm_weight: opt(m, "k_norm_weight"),
            past_incomplete_raw_keys: req(OP, m, "past_incomplete_raw_keys")?,
            past_incomplete_rope: opt(m, "past_incomplete_rope"),
        })
    }
}

/// Outputs of `qsa_prepare`.
#[derive(Clone, Debug, PartialEq)]
pub struct QsaPrepareOutputs {
    pub block_index_keys: Tensor,
    pub incomplete_raw_keys: Tensor,
    pub incomplete_rope: Option<Tensor>,
}

impl QsaPrepareOutputs {
    pub fn into_map(self) -> TensorMap {
        let mut m = TensorMap::new();
        m.insert("block_index_keys".into(), self.block_index_keys);
        m.insert("incomplete_raw_keys".into(), self.incomplete_raw_keys);
        if let Some(t) = self.incomplete_rope {
            m.insert("incomplete_rope".into(), t);
        }
        m
    }
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub n: usize,
    pub l: usize,
    pub di: usize,
    pub dr: usize,
    pub bp: usize,
    pub b_out: usize,
    /// key_length per sequence after broadcasting.
    pub s: Vec<u32>,
}

/// Every host-checkable rule of SPEC §1.
pub fn validate(x: &QsaPrepareInputs, a: &QsaPrepareAttrs) -> Result<Plan> {
    let r = a.key_block_size;
    let dt = float_type(OP, "raw_index_keys", x.raw_index_keys)?;
    let &[n, l, di] = rank(OP, "raw_index_keys", x.raw_index_keys, 3)? else {
        unreachable!()
    };
    check_di(OP, "raw_index_keys", di)?;
    float_of(OP, "past_block_index_keys", x.past_block_index_keys, dt)?;
    let &[pn, bp, pdi] = rank(OP, "past_block_index_keys", x.past_block_index_keys, 3)? else {
        unreachable!()
    };
    if pn != n || pdi != di {
        return Err(Error::input(
            OP,
            "past_block_index_keys",
            format!(
                "shape {:?} does not match [N={n}, Bp, Di={di}]",
                x.past_block_index_keys.shape
            ),
        ));
    }
    let kl = ints(OP, "key_length", x.key_length)?;
    if !(x.key_length.shape == [n] || x.key_length.shape == [1]) {
        return Err(Error::input(
            OP,
            "key_length",
            format!("expected shape [{n}] or [1], got {:?}", x.key_length.shape),
        ));
    }
    let mut s = Vec::with_capacity(n);
    for i in 0..n {
        let v = if kl.len() == 1 { kl[0] } else { kl[i] };
        if v < l as i64 {
            return Err(Error::input(
                OP,
                "key_length",
                format!("sequence {i}: key_length {v} < {l} new tokens (past would be negative)"),
            ));
        }
        if v > u32::MAX as i64 / 2 {
            return Err(Error::input(
                OP,
                "key_length",
                format!("sequence {i}: {v} is too large"),
            ));
        }
        let past = (v as usize - l) / r;
        if past > bp {
            return Err(Error::input(
                OP,
                "past_block_index_keys",
                format!("sequence {i} needs {past} past block rows, the tensor has Bp = {bp}"),
            ));
        }
        s.push(v as u32);
    }
    float_of(
        OP,
        "past_incomplete_raw_keys",
        x.past_incomplete_raw_keys,
        dt,
    )?;
    shape_is(
        OP,
        "past_incomplete_raw_keys",
        x.past_incomplete_raw_keys,
        &[n, r - 1, di],
    )?;
    let dr = match (x.rope_cos, x.rope_sin) {
        (None, None) => 0,
        (Some(c), Some(si)) => {
            float_of(OP, "rope_cos", c, dt)?;
            float_of(OP, "rope_sin", si, dt)?;
            let &[cn, cl, dr] = rank(OP, "rope_cos", c, 3)? else {
                unreachable!()
            };
            if cn != n || cl != l {
                return Err(Error::input(
                    OP,
                    "rope_cos",
                    format!("shape {:?} does not match [N={n}, L={l}, Dr]", c.shape),
                ));
            }
            check_dr(OP, "rope_cos", dr, di)?;
            shape_is(OP, "rope_sin", si, &c.shape)?;
            dr
        }
        (Some(_), None) => {
            return Err(Error::input(
                OP,
                "rope_sin",
                "rope_cos is given, rope_sin is not",
            ))
        }
        (None, Some(_)) => {
            return Err(Error::input(
                OP,
                "rope_cos",
                "rope_sin is given, rope_cos is not",
            ))
        }
    };
    match (dr > 0, x.past_incomplete_rope) {
        (true, Some(p)) => {
            float_of(OP, "past_incomplete_rope", p, dt)?;
            shape_is(OP, "past_incomplete_rope", p, &[n, 2 * dr])?;
        }
        (true, None) => {
            return Err(Error::input(
                OP,
                "past_incomplete_rope",
                "required when rope_cos/rope_sin are given",
            ))
        }
        (false, Some(_)) => {
            return Err(Error::input(
                OP,
                "past_incomplete_rope",
                "given without rope_cos/rope_sin",
            ))
        }
        (false, None) => {}
    }
    if let Some(w) = x.k_norm_weight {
        float_of(OP, "k_norm_weight", w, dt)?;
        shape_is(OP, "k_norm_weight", w, &[di])?;
    }
    let b_out = s.iter().map(|&v| v as usize / r).max().unwrap_or(0);
    Ok(Plan {
        dt,
        n,
        l,
        di,
        dr,
        bp,
        b_out,
        s,
    })
}

/// The CPU reference.
pub fn cpu(x: &QsaPrepareInputs, a: &QsaPrepareAttrs) -> Result<QsaPrepareOutputs> {
    let p = validate(x, a)?;
    let (n, l, di, dr, r) = (p.n, p.l, p.di, p.dr, a.key_block_size);
    let raw = x.raw_index_keys.to_f32();
    let past_blocks = x.past_block_index_keys.to_f32();
    let past_inc = x.past_incomplete_raw_keys.to_f32();
    let cos = x.rope_cos.map(|t| t.to_f32());
    let sin = x.rope_sin.map(|t| t.to_f32());
    let prope = x.past_incomplete_rope.map(|t| t.to_f32());
    let w = x.k_norm_weight.map(|t| t.to_f32());
    let mut blocks = vec![0f32; n * p.b_out * di];
    let mut inc = vec![0f32; n * (r - 1) * di];
    let mut inc_rope = vec![0f32; n * 2 * dr];
    for seq in 0..n {
        let s = p.s[seq] as usize;
        let past = s - l;
        let raw_key = |pos: usize, c: usize| -> f32 {
            if pos < past {
                past_inc[(seq * (r - 1) + pos - (past / r) * r) * di + c]
            } else {
                raw[(seq * l + pos - past) * di + c]
            }
        };
        let rope_cs = |pos: usize, c: usize| -> (f32, f32) {
            if pos < past {
                let pr = prope.as_ref().unwrap();
                (pr[seq * 2 * dr + c], pr[seq * 2 * dr + dr + c])
            } else {
                let i = (seq * l + pos - past) * dr + c;
                (cos.as_ref().unwrap()[i], sin.as_ref().unwrap()[i])
            }
        };
        for b in 0..p.b_out {
            let dst = &mut blocks[(seq * p.b_out + b) * di..][..di];
            if b < past / r {
                dst.copy_from_slice(&past_blocks[(seq * p.bp + b) * di..][..di]);
            } else if b < s / r {
                for (c, v) in dst.iter_mut().enumerate() {
                    let mut acc = 0f32;
                    for j in 0..r {
                        acc += raw_key(b * r + j, c);
                    }
                    *v = acc / r as f32;
                }
                transform_row(
                    dst,
                    w.as_deref(),
                    a.epsilon,
                    a.norm_weight_offset,
                    dr,
                    |c| rope_cs(b * r, c),
                );
            }
        }
        let start = (s / r) * r;
        for j in 0..s % r {
            for c in 0..di {
                inc[(seq * (r - 1) + j) * di + c] = raw_key(start + j, c);
            }
        }
        if dr > 0 && !s.is_multiple_of(r) {
            for c in 0..dr {
                let (co, si) = rope_cs(start, c);
                inc_rope[seq * 2 * dr + c] = co;
                inc_rope[seq * 2 * dr + dr + c] = si;
            }
        }
    }
    Ok(QsaPrepareOutputs {
        block_index_keys: Tensor::from_f32(p.dt, &[n, p.b_out, di], &blocks),
        incomplete_raw_keys: Tensor::from_f32(p.dt, &[n, r - 1, di], &inc),
        incomplete_rope: (dr > 0).then(|| Tensor::from_f32(p.dt, &[n, 2 * dr], &inc_rope)),
    })
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QsaPrepareParams {
    pub n: u32,
    pub l: u32,
    pub di: u32,
    pub r: u32,
    pub dr: u32,
    pub bp: u32,
    pub b_out: u32,
    pub norm_on: u32,
    pub eps: f32,
    pub offset: f32,
    pub cos_off: u32,
    pub sin_off: u32,
    pub prope_off: u32,
    pub w_off: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// Runs on the GPU: uploads, one dispatch, readback. Outputs are sentinel-filled first.
pub async fn gpu(
    ctx: &Context,
    x: &QsaPrepareInputs<'_>,
    a: &QsaPrepareAttrs,
) -> Result<QsaPrepareOutputs> {
    let p = validate(x, a)?;
    let r = a.key_block_size;
    let (aux_bytes, offs) = pack_segments(
        p.dt,
        &[
            x.rope_cos,
            x.rope_sin,
            x.past_incomplete_rope,
            x.k_norm_weight,
        ],
    );
    let aux = Tensor::from_bytes(DType::U32, &[aux_bytes.len().div_ceil(4)], {
        let mut b = aux_bytes;
        b.resize(b.len().div_ceil(4) * 4, 0);
        b
    })?;
    let params = QsaPrepareParams {
        n: p.n as u32,
        l: p.l as u32,
        di: p.di as u32,
        r: r as u32,
        dr: p.dr as u32,
        bp: p.bp as u32,
        b_out: p.b_out as u32,
        norm_on: x.k_norm_weight.is_some() as u32,
        eps: a.epsilon,
        offset: a.norm_weight_offset,
        cos_off: offs[0],
        sin_off: offs[1],
        prope_off: offs[2],
        w_off: offs[3],
        ..Default::default()
    };
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let raw = up("raw_index_keys", x.raw_index_keys)?;
    let past_blocks = up("past_block_index_keys", x.past_block_index_keys)?;
    let past_inc = up("past_incomplete_raw_keys", x.past_incomplete_raw_keys)?;
    let aux = up("aux", &aux)?;
    let key_len = up("key_length", &Tensor::from_u32(&[p.n], &p.s))?;
    let sentinel = |name: &str, shape: &[usize]| {
        GpuTensor::filled(ctx, &format!("qsa.{OP}.{name}"), p.dt, shape, 0xff)
    };
    let out_blocks = sentinel("block_index_keys", &[p.n, p.b_out, p.di])?;
    let out_inc = sentinel("incomplete_raw_keys", &[p.n, r - 1, p.di])?;
    let out_rope = sentinel("incomplete_rope", &[p.n, 2 * p.dr])?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    encode(
        ctx,
        &mut enc,
        Dispatch {
            key: PipelineKey::new(OP, "main").with("T_KIND", p.dt.shader_kind()),
            params: bytemuck::bytes_of(&params),
            buffers: vec![
                &raw.buffer,
                &past_blocks.buffer,
                &past_inc.buffer,
                &aux.buffer,
                &key_len.buffer,
                &out_blocks.buffer,
                &out_inc.buffer,
                &out_rope.buffer,
            ],
            textures: vec![],
            groups: (p.n * (p.b_out + 1)) as u32,
        },
    )
    .await?;
    ctx.submit(OP, enc).await?;
    let got = Readback::new(
        ctx,
        &[
            (&out_blocks.buffer, out_blocks.bytes()),
            (&out_inc.buffer, out_inc.bytes()),
            (&out_rope.buffer, out_rope.bytes()),
        ],
    )
    .await_all(ctx)
    .await?;
    let mut it = got.into_iter();
    Ok(QsaPrepareOutputs {
        block_index_keys: Tensor::from_bytes(p.dt, &out_blocks.shape, it.next().unwrap())?,
        incomplete_raw_keys: Tensor::from_bytes(p.dt, &out_inc.shape, it.next().unwrap())?,
        incomplete_rope: match it.next() {
            Some(b) if p.dr > 0 => Some(Tensor::from_bytes(p.dt, &out_rope.shape, b)?),
            _ => None,
        },
    })
}
