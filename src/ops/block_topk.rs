//! `block_topk` (SPEC §5): the k best candidate blocks of each score row, in the top-k order of
//! SPEC §0, then -1, and their count. Shader: `shaders/block_topk.wgsl` (radix select of the
//! threshold, then a column-ordered compaction and a rank-by-counting of the at most k selected
//! entries, one workgroup per row).

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey, Readback};
use crate::tensor::{DType, Tensor};
use std::cmp::Ordering;

pub const OP: &str = "block_topk";

/// Largest ratio of the fused token route ([`TopkRoute`]): its loops run up to 8 · r
/// iterations per owned winner within llvmpipe's per-invocation budget (docs/operators.md,
/// block_topk).
pub const MAX_ROUTE_RATIO: usize = 64;

/// Largest k: the shader ranks the selection in workgroup memory (`MAX_K` in the WGSL).
pub const MAX_K: usize = 2048;
/// Largest row width of one selection: the shader keys ties by a 16-bit column index. Wider
/// rows are selected in chunks ([`block_topk_chunks`](super::block_topk_chunks)) by [`gpu`];
/// [`dispatch_topk`] refuses them.
pub const MAX_W: usize = 65536;

/// Whether rows of width `w` are wide for the shader (entry point `wide`, else `main`): they take a sampled threshold
/// first and mark their winners in bit masks, as in decode over a long context, where a radix
/// pass over every column costs more than ranking ~2.5 k sampled winners.
pub fn wide(w: u32, k: u32) -> bool {
    w >= 16 * k && w >= 2048 && k <= 512
}

/// The subgroup variants (`block_topk_sg.wgsl`): entry `row_sg` for short rows, `wide_sg` for
/// wide ones.
pub const SHADER_SG: &str = "block_topk_sg";

/// Rows at most this wide are short: `row_sg` takes each in one subgroup of 8 lanes (at most
/// 264 columns per lane, in a private array) and every column fits the ranking's slots
/// (`SLOTS` in the WGSL, 2112: `MAX_K` and 64 more). 2112 rather than 2048 so that NSA's
/// selection rows at 8192 compressed tokens (W = 2049) take it too: on lavapipe their
/// top-k took 0.41–0.59 ms in `wide_sg` and 0.12–0.15 ms here.
pub const SHORT_W: u32 = 2112;

/// The shader and entry point for rows of width `w` and `k` slots on an adapter with
/// `subgroup_size`. Where subgroups are 8 lanes (the size the variants are tested at,
/// lavapipe's), a short row runs in one subgroup (`row_sg`: a workgroup of 8), which finds
/// the threshold by counting instead of the radix select's workgroup histograms, and short
/// and wide rows rank their winners with keys handed on by shuffles; wide rows take the
/// sampled threshold (`wide`, `wide_sg`); the rest `main`. One subgroup per row suits many
/// rows (prefill); a GPU with 8-lane subgroups and a few short rows would leave most of
/// itself idle, but stays exact.
pub fn pipeline(w: u32, k: u32, subgroup_size: Option<u32>) -> (&'static str, &'static str) {
    let sg = subgroup_size == Some(8);
    if w <= SHORT_W && sg {
        (SHADER_SG, "row_sg")
    } else if wide(w, k) && sg {
        (SHADER_SG, "wide_sg")
    } else if wide(w, k) {
        (OP, "wide")
    } else {
        (OP, "main")
    }
}

/// The split kernels (`block_topk_split.wgsl`, entries `wide_part` and `wide_merge`): a few
/// wide rows, each spread over many workgroups, for GPUs, where `wide` runs each row in one
/// workgroup on one multiprocessor (on the H200 that was 62–65 % of the decode step's GPU
/// time). Outputs bit for bit `wide`'s.
pub const SHADER_SPLIT: &str = "block_topk_split";
/// Columns per `wide_part` workgroup (`PART_W` in the WGSL).
pub const PART_W: u32 = 1024;
/// `wide_merge` workgroups per row (`Q` in the WGSL).
pub const MERGE_GROUPS: u32 = 8;
/// The most rows one split selection takes: with more, one workgroup per row already spreads
/// over the device, and the scratch grows with the rows.
pub const SPLIT_MAX_ROWS: u32 = 64;

/// Whether [`dispatch_topk_split`] takes this selection on this context: split top-k on
/// ([`Capabilities::split_topk`](crate::gpu::Capabilities)), wide rows, at most
/// [`SPLIT_MAX_ROWS`] of them.
pub fn split_applies(ctx: &Context, p: &BlockTopkParams) -> bool {
    ctx.caps.split_topk && wide(p.w, p.k) && p.rows <= SPLIT_MAX_ROWS
}

/// Bytes of the split kernels' scratch for `rows` rows of width `w`: each row's kept keys and
/// their columns (at most W of each) and its parts' counts.
pub fn split_scratch_bytes(rows: u32, w: u32) -> u64 {
    rows as u64 * (2 * w as u64 + w.div_ceil(PART_W) as u64) * 4
}

/// A zeroed scratch buffer of [`split_scratch_bytes`] for `rows` rows of width `w`.
pub fn split_scratch(ctx: &Context, label: &str, rows: u32, w: u32) -> Result<GpuTensor> {
    let words = split_scratch_bytes(rows, w) / 4;
    GpuTensor::filled(ctx, label, DType::U32, &[words as usize], 0)
}

/// Attributes of `block_topk`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockTopkAttrs {
    pub k: usize,
}

impl BlockTopkAttrs {
    /// Either `k`, or OpenVINO's `token_budget` with `ratio` (k = token_budget / ratio,
    /// integer division as everywhere in the contract); not both.
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let given = |n: &str| a.get(n).is_some_and(|v| !v.is_null());
        let k = match (given("k"), given("token_budget")) {
            (true, true) => {
                return Err(Error::attr(
                    OP,
                    "token_budget",
                    "give k or token_budget (with ratio), not both",
                ));
            }
            (false, false) => {
                return Err(Error::attr(
                    OP,
                    "k",
                    "required attribute is missing (or give token_budget and ratio)",
                ));
            }
            (true, false) => {
                let k = attr_int(OP, a, "k", None)?;
                if k < 1 {
                    return Err(Error::attr(OP, "k", format!("must be >= 1, got {k}")));
                }
                k
            }
            (false, true) => {
                let budget = attr_int(OP, a, "token_budget", None)?;
                let ratio = attr_int(OP, a, "ratio", None)?;
                if ratio < 1 {
                    return Err(Error::attr(
                        OP,
                        "ratio",
                        format!("must be >= 1, got {ratio}"),
                    ));
                }
                if budget < ratio {
                    return Err(Error::attr(
                        OP,
                        "token_budget",
                        format!("{budget} / ratio {ratio} leaves no block (k must be >= 1)"),
                    ));
                }
                budget / ratio
            }
        };
        Ok(BlockTopkAttrs {
            k: usize::try_from(k).unwrap_or(usize::MAX),
        })
    }
}

/// Inputs of `block_topk`.
pub struct BlockTopkInputs<'a> {
    pub scores: &'a Tensor,
}

impl<'a> BlockTopkInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(BlockTopkInputs {
            scores: req(OP, m, "scores")?,
        })
    }
}

/// Outputs of `block_topk`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockTopkOutputs {
    /// `[T, Hs, k]` i32.
    pub block_indices: Tensor,
    /// `[T, Hs]` i32.
    pub block_count: Tensor,
}

impl BlockTopkOutputs {
    pub fn into_map(self) -> TensorMap {
        TensorMap::from([
            ("block_indices".to_string(), self.block_indices),
            ("block_count".to_string(), self.block_count),
        ])
    }
}

/// The checked geometry of one call.
pub struct Plan {
    pub t: usize,
    pub hs: usize,
    pub w: usize,
    pub k: usize,
}

impl Plan {
    /// The shader's parameters for this call.
    pub fn params(&self) -> BlockTopkParams {
        BlockTopkParams {
            rows: (self.t * self.hs) as u32,
            w: self.w as u32,
            k: self.k as u32,
            ..Default::default()
        }
    }
}

/// Every host-checkable rule of SPEC §5.
pub fn validate(x: &BlockTopkInputs, a: &BlockTopkAttrs) -> Result<Plan> {
    if x.scores.dtype != DType::F32 {
        return Err(Error::input(
            OP,
            "scores",
            format!("dtype {} must be f32", x.scores.dtype),
        ));
    }
    let &[t, hs, w] = rank(OP, "scores", x.scores, 3)? else {
        unreachable!()
    };
    if a.k == 0 || a.k > MAX_K {
        return Err(Error::attr(
            OP,
            "k",
            format!("must be in 1..={MAX_K}, got {}", a.k),
        ));
    }
    // Rows wider than one selection takes are cut into chunks (block_topk_chunks).
    super::block_topk_chunks::validate(t.saturating_mul(hs), w, a.k)?;
    // Element offsets are u32 in the shader.
    let rows = t.saturating_mul(hs);
    if rows.saturating_mul(w.max(a.k)) > u32::MAX as usize {
        return Err(Error::input(
            OP,
            "scores",
            format!(
                "{rows} rows of max(W, k) = {} exceed 2^32 elements",
                w.max(a.k)
            ),
        ));
    }
    Ok(Plan { t, hs, w, k: a.k })
}

/// The contract's order of two candidate scores: descending, NaN after every number.
fn rank_order(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.partial_cmp(&a).unwrap(),
    }
}

/// The CPU reference: a stable sort of each row's candidates (so ties keep the lower column).
pub fn cpu(x: &BlockTopkInputs, a: &BlockTopkAttrs) -> Result<BlockTopkOutputs> {
    let p = validate(x, a)?;
    let s = x.scores.to_f32();
    let rows = p.t * p.hs;
    let mut idx = vec![-1i32; rows * p.k];
    let mut cnt = vec![0i32; rows];
    for r in 0..rows {
        let row = &s[r * p.w..][..p.w];
        let mut cand: Vec<usize> = (0..p.w).filter(|&c| row[c] != f32::NEG_INFINITY).collect();
        cand.sort_by(|&i, &j| rank_order(row[i], row[j]));
        cand.truncate(p.k);
        for (slot, &c) in cand.iter().enumerate() {
            idx[r * p.k + slot] = c as i32;
        }
        cnt[r] = cand.len() as i32;
    }
    Ok(BlockTopkOutputs {
        block_indices: Tensor::from_i32(&[p.t, p.hs, p.k], &idx),
        block_count: Tensor::from_i32(&[p.t, p.hs], &cnt),
    })
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTopkParams {
    /// T · Hs.
    pub rows: u32,
    pub w: u32,
    pub k: u32,
    /// Output row of score row 0 (scores may hold one row chunk of a larger output).
    pub out_base: u32,
    /// The fused token route ([`TopkRoute`]): selection groups per token row …
    pub hs: u32,
    /// … the ratio (0: no route) …
    pub r: u32,
    /// … and the route's row width, k · r + r − 1 (0 without a route).
    pub width: u32,
    pub _pad: u32,
}

/// The token route of `expand_route` (SPEC §6), written by the top-k's last step in the same
/// dispatch: the indexer's step, where a dispatch of its own cost lavapipe ~0.07 ms of a
/// ~1.7 ms decode step (docs/perf.md). Rows `t · Hs + g` of the selection are token row t's
/// group g; `params.hs`, `params.r` and `params.width` describe it. The outputs are those of
/// `expand_route` over the selection just made, flags included.
pub struct TopkRoute<'a> {
    /// `[T]` i32: each token row's position.
    pub positions: &'a wgpu::Buffer,
    /// `[T, Hs, k·r + r − 1]` i32.
    pub token_indices: &'a wgpu::Buffer,
    /// `[T, Hs]` i32.
    pub token_count: &'a wgpu::Buffer,
    /// The device flag word.
    pub flags: &'a wgpu::Buffer,
}

/// Describes the selection over device buffers: `scores [rows, w]` f32 into rows
/// `out_base ..` of `indices [.., k]` i32 and `count [..]` i32 (every slot of those rows is
/// written), and with `route` (and `params.r > 0`) the token route of those rows. For
/// orchestrators that keep the scores on the device.
pub fn dispatch_topk<'a>(
    ctx: &'a Context,
    params: &'a BlockTopkParams,
    scores: &'a wgpu::Buffer,
    indices: &'a wgpu::Buffer,
    count: &'a wgpu::Buffer,
    route: Option<TopkRoute<'a>>,
) -> Result<Dispatch<'a>> {
    let (rows, w, k) = (params.rows as u64, params.w as u64, params.k as u64);
    let out = params.out_base as u64;
    let [d0, d1, d2] = &ctx.dummy_out;
    // Each bound buffer with the bytes this call needs of it.
    let mut needs = vec![
        ("scores", scores, rows * w * 4),
        ("block_indices", indices, (out + rows) * k * 4),
        ("block_count", count, (out + rows) * 4),
    ];
    let route = match (route, params.r) {
        (None, 0) => {
            if params.width != 0 {
                return Err(Error::attr(
                    OP,
                    "width",
                    format!("{} without a route (r = 0)", params.width),
                ));
            }
            TopkRoute {
                positions: &ctx.dummy,
                token_indices: d0,
                token_count: d1,
                flags: d2,
            }
        }
        (Some(rt), r) if r > 0 => {
            let (hs, width) = (params.hs as u64, params.width as u64);
            if r as usize > MAX_ROUTE_RATIO {
                return Err(Error::attr(
                    OP,
                    "r",
                    format!("{r} exceeds {MAX_ROUTE_RATIO}"),
                ));
            }
            let want = k * r as u64 + r as u64 - 1;
            if width != want {
                return Err(Error::attr(
                    OP,
                    "width",
                    format!("{width} is not k · r + r − 1 = {want}"),
                ));
            }
            if hs == 0 || !out.is_multiple_of(hs) || !rows.is_multiple_of(hs) {
                return Err(Error::attr(
                    OP,
                    "hs",
                    format!("{hs} does not divide out_base {out} and rows {rows}"),
                ));
            }
            needs.extend([
                ("positions", rt.positions, (out + rows) / hs * 4),
                ("token_indices", rt.token_indices, (out + rows) * width * 4),
                ("token_count", rt.token_count, (out + rows) * 4),
                ("flags", rt.flags, 4),
            ]);
            rt
        }
        (Some(_), _) => {
            return Err(Error::attr(
                OP,
                "r",
                "a route needs r >= 1, got 0".to_string(),
            ));
        }
        (None, r) => {
            return Err(Error::attr(
                OP,
                "r",
                format!("{r} without the route's buffers"),
            ));
        }
    };
    if params.k == 0 || k > MAX_K as u64 {
        return Err(Error::attr(
            OP,
            "k",
            format!("must be in 1..={MAX_K}, got {k}"),
        ));
    }
    if w > MAX_W as u64 {
        return Err(Error::input(
            OP,
            "scores",
            format!("row width W = {w} exceeds {MAX_W}"),
        ));
    }
    for (name, buf, need) in needs {
        ctx.check_binding_size(OP, name, need)?;
        if buf.size() < need {
            return Err(Error::input(
                OP,
                name,
                format!("buffer holds {} bytes, {rows} rows need {need}", buf.size()),
            ));
        }
    }
    Ok(Dispatch {
        key: {
            let (shader, entry) = pipeline(params.w, params.k, ctx.caps.subgroup_size);
            PipelineKey::new(shader, entry)
        },
        params: bytemuck::bytes_of(params),
        buffers: vec![
            scores,
            indices,
            count,
            route.positions,
            route.token_indices,
            route.token_count,
            route.flags,
        ],
        textures: vec![],
        groups: params.rows,
    })
}

/// The two dispatches of the split kernels (`wide_part`, then `wide_merge`) for the selection
/// [`dispatch_topk`] describes, with `scratch` of at least [`split_scratch_bytes`]. Wide rows
/// only (`wide(w, k)`), any number of them (the scratch grows with them; [`split_applies`]
/// keeps the split to a few); the outputs are `wide`'s, bit for bit.
pub fn dispatch_topk_split<'a>(
    ctx: &'a Context,
    params: &'a BlockTopkParams,
    scores: &'a wgpu::Buffer,
    indices: &'a wgpu::Buffer,
    count: &'a wgpu::Buffer,
    route: Option<TopkRoute<'a>>,
    scratch: &'a wgpu::Buffer,
) -> Result<[Dispatch<'a>; 2]> {
    if !wide(params.w, params.k) {
        return Err(Error::attr(
            OP,
            "k",
            format!(
                "the split kernels take wide rows (W >= 16 k, W >= 2048, k <= 512), got W = {} \
                 and k = {}",
                params.w, params.k
            ),
        ));
    }
    let d = dispatch_topk(ctx, params, scores, indices, count, route)?;
    let need = split_scratch_bytes(params.rows, params.w);
    ctx.check_binding_size(OP, "split scratch", need)?;
    if scratch.size() < need {
        return Err(Error::input(
            OP,
            "split scratch",
            format!(
                "buffer holds {} bytes, {} rows of W = {} need {need}",
                scratch.size(),
                params.rows,
                params.w
            ),
        ));
    }
    let mut buffers = d.buffers;
    buffers.push(scratch);
    // The one-workgroup kernel's params and buffers, then the scratch.
    let split = |entry, groups| Dispatch {
        key: PipelineKey::new(SHADER_SPLIT, entry),
        params: d.params,
        buffers: buffers.clone(),
        textures: vec![],
        groups,
    };
    Ok([
        split("wide_part", params.rows * params.w.div_ceil(PART_W)),
        split("wide_merge", params.rows * MERGE_GROUPS),
    ])
}

/// Records the dispatch of [`dispatch_topk`] with a fresh bind group.
pub async fn encode_topk(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    params: &BlockTopkParams,
    scores: &wgpu::Buffer,
    indices: &wgpu::Buffer,
    count: &wgpu::Buffer,
) -> Result<()> {
    encode(
        ctx,
        enc,
        dispatch_topk(ctx, params, scores, indices, count, None)?,
    )
    .await
}

/// Runs on the GPU: upload, one dispatch, readback.
pub async fn gpu(
    ctx: &Context,
    x: &BlockTopkInputs<'_>,
    a: &BlockTopkAttrs,
) -> Result<BlockTopkOutputs> {
    let p = validate(x, a)?;
    if p.w > MAX_W {
        return super::block_topk_chunks::gpu(ctx, x, &p).await;
    }
    let scores = GpuTensor::upload(ctx, &format!("qsa.{OP}.scores"), x.scores)?;
    // Sentinel 0x7f7f7f7f rather than 0xff..: all-ones is -1, the padding value itself, so a
    // missed padding write would pass unseen.
    let sentinel = |name: &str, shape: &[usize]| {
        GpuTensor::filled(ctx, &format!("qsa.{OP}.{name}"), DType::I32, shape, 0x7f)
    };
    let idx = sentinel("block_indices", &[p.t, p.hs, p.k])?;
    let cnt = sentinel("block_count", &[p.t, p.hs])?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let params = p.params();
    if split_applies(ctx, &params) {
        let scratch = split_scratch(ctx, &format!("qsa.{OP}.split"), params.rows, params.w)?;
        let (s, i, c) = (&scores.buffer, &idx.buffer, &cnt.buffer);
        for d in dispatch_topk_split(ctx, &params, s, i, c, None, &scratch.buffer)? {
            encode(ctx, &mut enc, d).await?;
        }
    } else {
        encode_topk(
            ctx,
            &mut enc,
            &params,
            &scores.buffer,
            &idx.buffer,
            &cnt.buffer,
        )
        .await?;
    }
    ctx.submit(OP, enc).await?;
    read_outputs(ctx, &idx, &cnt).await
}

/// Reads a selection's outputs back from the device.
pub(crate) async fn read_outputs(
    ctx: &Context,
    idx: &GpuTensor,
    cnt: &GpuTensor,
) -> Result<BlockTopkOutputs> {
    let got = Readback::new(
        ctx,
        &[(&idx.buffer, idx.bytes()), (&cnt.buffer, cnt.bytes())],
    )
    .await_all(ctx)
    .await?;
    let mut it = got.into_iter();
    Ok(BlockTopkOutputs {
        block_indices: Tensor::from_bytes(DType::I32, &idx.shape, it.next().unwrap())?,
        block_count: Tensor::from_bytes(DType::I32, &cnt.shape, it.next().unwrap())?,
    })
}

#[cfg(test)]
mod tests {
    use crate::shaders::wgsl_u32;

    /// The host sizes the split kernels' grids and scratch with the shader's own constants.
    #[test]
    fn split_constants_match_the_shader() {
        assert_eq!(wgsl_u32(super::SHADER_SPLIT, "PART_W"), super::PART_W);
        assert_eq!(wgsl_u32(super::SHADER_SPLIT, "Q"), super::MERGE_GROUPS);
        assert_eq!(
            wgsl_u32(super::SHADER_SPLIT, "MAX_K") as usize,
            super::MAX_K
        );
    }

    /// `SHORT_W` is the WGSL's `SLOTS` (every column of a short row fits the ranking), and
    /// `row_sg`'s private key array holds a lane's chunk of the widest short row.
    #[test]
    fn short_rows_fit_the_shader() {
        assert_eq!(wgsl_u32(super::SHADER_SG, "SLOTS"), super::SHORT_W);
        let src = crate::shaders::assemble(super::SHADER_SG).unwrap();
        let module = naga::front::wgsl::parse_str(&src).unwrap();
        let entry = module
            .entry_points
            .iter()
            .find(|e| e.name == "row_sg")
            .expect("no entry row_sg");
        let kv = entry
            .function
            .local_variables
            .iter()
            .find(|(_, v)| v.name.as_deref() == Some("kv"))
            .map(|(_, v)| v.ty)
            .expect("no local kv in row_sg");
        let quads = match module.types[kv].inner {
            naga::TypeInner::Array {
                size: naga::ArraySize::Constant(n),
                ..
            } => n.get(),
            ref t => panic!("kv: {t:?}"),
        };
        // Lanes of 8 take chunks of whole quads: ⌈W / 32⌉ quads each.
        assert_eq!(quads, super::SHORT_W.div_ceil(32));
    }
}
