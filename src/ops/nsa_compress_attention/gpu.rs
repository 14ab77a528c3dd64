//! The GPU path of `nsa_compress_attention`: four dispatches recorded into one encoder — the
//! logits (`shaders/nsa_compress_attention.wgsl`), the probabilities times the values
//! (`…_values.wgsl`), the outputs and selection scores (`…_finish.wgsl`), then the
//! `block_topk` selection over the `[rows · N2, W]` scores (whose order is exactly SPEC §0's).
//! The first three share `shaders/common/nsa_attention.wgsl`, which also lays out the scratch.
//! [`dispatch_nsa_compress_attention`] describes the four for a caller that records them
//! through a `BindCache` (the NSA selector); [`encode_nsa_compress_attention`] records them
//! directly.

use super::{validate, NsaCompressAttentionAttrs, NsaCompressAttentionInputs};
use super::{NsaCompressAttentionOutputs, Plan, MAX_DQK, MAX_DV, OP};
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey, WordTexture};
use crate::ops::block_topk::{self, BlockTopkParams};
use crate::ops::common::*;
use crate::ops::sparse_attention::{LLVMPIPE_LOOP_BUDGET, LLVMPIPE_LOOP_LIMIT};
use crate::tensor::{DType, Tensor};

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NsaCompressAttentionParams {
    /// Query rows R: T (TND) or B·S (BSND).
    pub rows: u32,
    pub batches: u32,
    /// S of BSND; 0 selects TND.
    pub seq: u32,
    pub n1: u32,
    pub n2: u32,
    pub dqk: u32,
    pub dv: u32,
    /// Compressed tokens per cache block.
    pub page: u32,
    pub num_blocks: u32,
    /// Columns of `block_table`.
    pub max_blocks: u32,
    pub l: u32,
    pub d: u32,
    pub lsel: u32,
    pub k: u32,
    /// Largest c_b: row stride of the probability scratch.
    pub c_max: u32,
    /// Largest nsel: row width of the selection scores.
    pub w: u32,
    pub causal: u32,
    pub scale: f32,
    /// Compressed tokens per stage-2 (values) workgroup: one of [`SPLITS2`]. [`Plan::params`]
    /// sets the GPU default, [`NsaCompressAttentionParams::for_adapter`] the adapter's choice.
    pub split2: u32,
    /// Compressed tokens per stage-1 (logits) workgroup: [`SPLIT1`] for the portable and
    /// subgroup kernels, [`SPLIT1_GPU`] for the GPU-shaped ones ([`split1_for`]).
    pub split1: u32,
}

/// Stage names of the four dispatches, for `BindCache::record` and GPU timing: the logits,
/// the probabilities times the values, the outputs and selection scores, the top-k.
pub const STAGES: [&str; 4] = [
    "compress_logits",
    "compress_values",
    "compress_finish",
    "select_topk",
];

impl NsaCompressAttentionParams {
    /// The parameters of the selection stage: the top-k of the `[rows · N2, W]` scores.
    pub fn topk_params(&self) -> BlockTopkParams {
        BlockTopkParams {
            rows: self.rows * self.n2,
            w: self.w,
            k: self.k,
            ..Default::default()
        }
    }
}

impl Plan {
    /// The shader's parameters for this call.
    pub fn params(&self) -> NsaCompressAttentionParams {
        NsaCompressAttentionParams {
            rows: self.rows as u32,
            batches: self.batches as u32,
            seq: self.seq as u32,
            n1: self.n1 as u32,
            n2: self.n2 as u32,
            dqk: self.dqk as u32,
            dv: self.dv as u32,
            page: self.page as u32,
            num_blocks: self.num_blocks as u32,
            max_blocks: self.max_blocks as u32,
            l: self.l as u32,
            d: self.d as u32,
            lsel: self.lsel as u32,
            k: self.k as u32,
            c_max: self.c_max as u32,
            w: self.w as u32,
            causal: self.causal as u32,
            scale: self.scale,
            split2: SPLIT2 as u32,
            split1: SPLIT1,
        }
    }
}

/// Tokens per stage-1 workgroup of the portable and subgroup logits kernels (64 invocations ×
/// 16 tokens; `P.split1` in `shaders/common/nsa_attention.wgsl`).
pub const SPLIT1: u32 = 1024;
/// Tokens per stage-1 workgroup of the GPU-shaped logits kernel (`GWG` invocations, one token
/// each, in `shaders/nsa_compress_attention_gpu.wgsl`); the scratch is sized for it.
pub const SPLIT1_GPU: u32 = 256;
/// The stage-2 splits a call may use ([`NsaCompressAttentionParams::split2`]), smallest first.
pub const SPLITS2: [u32; 3] = [2048, 4096, 8192];
/// Tokens per stage-2 workgroup on a GPU, and the smallest split: the scratch is sized for it
/// (a larger split has fewer output parts).
const SPLIT2: u64 = SPLITS2[0] as u64;

/// The stage-2 split for `prm` on this adapter. A GPU keeps 2048 tokens per workgroup, which
/// fills its multiprocessors. A CPU adapter (lavapipe, SwiftShader) runs a workgroup on one
/// thread: there the largest split that still leaves a workgroup per core wins, since the
/// finishing stage then merges fewer output parts (at nsa-decode's 8192 tokens on 2 cores,
/// 8192 instead of 2048 took the finishing stage from 0.74 to 0.33 ms on lavapipe). On
/// llvmpipe a split must also keep the loops within its budget ([`loop_iterations`]).
pub fn split2_for(ctx: &Context, prm: &NsaCompressAttentionParams) -> u32 {
    if ctx.info.device_type != wgpu::DeviceType::Cpu {
        return SPLIT2 as u32;
    }
    let cores = crate::gpu::cpu_cores() as u64;
    let rows = prm.rows as u64 * prm.n2 as u64;
    SPLITS2
        .into_iter()
        .rev()
        .find(|&s| {
            let p = NsaCompressAttentionParams { split2: s, ..*prm };
            rows * (prm.c_max as u64).div_ceil(s as u64) >= cores && !over_loop_budget(ctx, &p)
        })
        .unwrap_or(SPLIT2 as u32)
}

/// Whether `p` would run past llvmpipe's loop budget on this adapter ([`loop_iterations`]).
fn over_loop_budget(ctx: &Context, p: &NsaCompressAttentionParams) -> bool {
    ctx.caps.llvmpipe && loop_iterations(p) > LLVMPIPE_LOOP_BUDGET
}

/// The stage-1 split the logits kernels chosen on `ctx` take: [`SPLIT1_GPU`] where the
/// context runs the GPU-shaped kernels
/// ([`Capabilities::gpu_nsa`](crate::gpu::Capabilities::gpu_nsa)), else [`SPLIT1`].
pub fn split1_for(ctx: &Context) -> u32 {
    if ctx.caps.gpu_nsa {
        SPLIT1_GPU
    } else {
        SPLIT1
    }
}

impl NsaCompressAttentionParams {
    /// These parameters with the splits this adapter's kernels take: the stage-1 split of
    /// [`split1_for`], then the stage-2 split [`split2_for`] chooses.
    pub fn for_adapter(self, ctx: &Context) -> Self {
        let p = NsaCompressAttentionParams {
            split1: split1_for(ctx),
            ..self
        };
        NsaCompressAttentionParams {
            split2: split2_for(ctx, &p),
            ..p
        }
    }
}
/// Output channels per stage-2 invocation (`CT`), and that stage's workgroup size (`WG`).
const CHANNELS: u64 = 16;
const WG: u64 = 64;

/// Parts of each stage-2 split (`parts_per_split()` in the WGSL): the workgroup's WG
/// invocations over ⌈Dv / CHANNELS⌉ channel tiles.
fn parts_per_split(dv: u64) -> u64 {
    WG / dv.div_ceil(CHANNELS).max(1)
}

/// f32 words of the scratch buffer the stages pass their results through, read 4 heads at a
/// time (layout in `shaders/common/nsa_attention.wgsl`). With Q = ceil(G / 4) head quads: the
/// logits `[R·N2, c_max, Q]`, the softmax statistics of each stage-1 split
/// `[R·N2, ceil(G / 16), ceil(c_max / split1), 2, 4]` and the output parts of each stage-2 split
/// `[R·N2, ceil(c_max / split2) · (WG / ceil(Dv / CHANNELS)), Dv, Q]`, each entry 4 words, sized
/// here for the smallest splits ([`SPLIT1_GPU`], `SPLIT2`), which have the most statistics and
/// parts, so that one scratch serves every kernel.
pub fn scratch_words(prm: &NsaCompressAttentionParams) -> u64 {
    let (c, dv) = (prm.c_max as u64, prm.dv as u64);
    let g = (prm.n1 / prm.n2.max(1)) as u64;
    let q = g.div_ceil(4);
    let parts = c.div_ceil(SPLIT2) * parts_per_split(dv);
    let stats = g.div_ceil(16) * c.div_ceil(SPLIT1_GPU as u64) * 8;
    let per_kv_head = c * q + stats + parts * dv * q;
    4 * prm.rows as u64 * prm.n2 as u64 * per_kv_head
}

/// Query channels the logits stage stages at a time (`DC` in the WGSL), and its head chunk
/// (`HC`).
const DC: u64 = 128;
const HC: u64 = 16;
/// Tokens per stage-2 tile (`TILE` in `…_values.wgsl`).
const TILE: u64 = 128;
/// V channels per block of the GPU-shaped values kernel (`VB` in `…_values_gpu.wgsl`).
const VB: u64 = 256;

/// Loop iterations one invocation runs at most in the worst of the three attention stages,
/// as llvmpipe counts them (a loop of n iterations costs n + 1, nested loops once per entry).
/// The splits bound the logits and values stages' per-invocation work (`split1`, `split2`
/// tokens per workgroup; the GPU-shaped logits kernel's loops are those of the portable one
/// with fewer staging rounds and a shorter merge) except for the values stage's merge of the
/// stage-1 statistics, ⌈c_max / split1⌉ per head chunk (four times over in the subgroup
/// variant); the finishing
/// stage sums ⌈c_max / split2⌉ · (WG / ⌈Dv / CT⌉) output parts for each of its
/// ⌈Dv · ⌈G/4⌉ / WG⌉ outputs, scores its share of the W selection blocks and checks the row's
/// ⌈c_max / page⌉ block-table columns. A model from
/// the shaders' loop structure (an upper bound), not a measurement: at the paper's G = 16,
/// Dqk = 192, Dv = 128, l = 32, d = 16, l' = 64 it passes the budget only past about 808K
/// compressed tokens at page 1 (1.02M at page 128), the finishing stage's loops setting it.
pub fn loop_iterations(p: &NsaCompressAttentionParams) -> u64 {
    let g = (p.n1 / p.n2.max(1)) as u64;
    let (c, dqk, dv) = (p.c_max as u64, p.dqk as u64, p.dv as u64);
    let page = p.page.max(1) as u64;
    // row_info's binary search over the batches, and row_facts' check of the columns.
    let search = 64 - (p.batches as u64).leading_zeros() as u64 + 2;
    let cols = |tokens: u64| tokens.div_ceil(page).div_ceil(WG) + 1;
    let logits = search
        + cols(SPLIT1 as u64)
        + dqk.div_ceil(DC) * (HC * DC / WG + 1 + DC + 1 + 1)
        + 1
        + WG
        + 1;
    let split2 = (p.split2 as u64).max(SPLIT2);
    let tiles = split2 / TILE;
    // The stage-1 split (unset: the smaller, with more statistics to merge).
    let split1 = if p.split1 == 0 { SPLIT1_GPU } else { p.split1 } as u64;
    let nparts = parts_per_split(dv);
    // Per head chunk: the portable kernel's merge of the stage-1 statistics and its tiles; the
    // subgroup variant's merge in every invocation (4 quads) and its part's batches of 8
    // tokens (a part is an eighth of the split), each with the touch of the next batch's V
    // rows (a word per 64 bytes: at most ⌈Dv / 16⌉); the GPU-shaped kernel's merge and, per
    // block of VB channels, its part's tiles of WG tokens.
    let ns1 = c.div_ceil(split1);
    let portable = ns1 + 1 + tiles * (TILE / WG + 1 + TILE + 1) + 1;
    let subgroup = 4 * (ns1 + 1) + (split2 / 64 + 1) * (8 + 1 + dv.div_ceil(16) + 1) + 1;
    let part_tiles = split2.div_ceil(nparts.max(1)).div_ceil(WG);
    let gpu = ns1 + 1 + dv.div_ceil(VB) * (part_tiles * (2 + 1 + WG + 1) + 1 + 1) + 1;
    let values = search + cols(split2) + g.div_ceil(HC) * (portable.max(subgroup).max(gpu) + 1) + 1;
    let parts = c.div_ceil(split2) * nparts;
    let blocks = ((p.lsel + p.l) / p.d.max(1)) as u64;
    let finish = search
        + cols(c)
        + (dv * g.div_ceil(4)).div_ceil(WG) * (parts + 1)
        + 1
        + (p.w as u64).div_ceil(WG) * (blocks + 1)
        + 1
        + 1;
    logits.max(values).max(finish)
}

/// Device buffers of one `nsa_compress_attention` call. Shapes use R query rows (T, or B·S).
pub struct NsaAttnBuffers<'a> {
    /// `[R, N1, Dqk]` T.
    pub query: &'a wgpu::Buffer,
    /// `[num_blocks, page, N2·Dqk]` T.
    pub key: &'a wgpu::Buffer,
    /// `[num_blocks, page, N2·Dv]` T.
    pub value: &'a wgpu::Buffer,
    /// `[B, max_blocks]` i32.
    pub block_table: &'a wgpu::Buffer,
    /// `[4·B + 1]` u32 ([`Plan::lens`]): q_len, cmp_kv_len, sel_kv_len, then the first row of
    /// each batch and R (TND; any values for BSND).
    pub lens: &'a wgpu::Buffer,
    /// `[R, N1, Dv]` T.
    pub out: &'a wgpu::Buffer,
    /// `[R, N2, k]` i32.
    pub topk: &'a wgpu::Buffer,
    /// Scratch `[R·N2, c_max]` f32: the group's summed probabilities.
    pub psum: &'a wgpu::Buffer,
    /// `[R·N2, W]` f32: the aggregated selection scores the top-k ranks (+inf forced, −inf
    /// past nsel); scratch unless the caller wants them.
    pub scores: &'a wgpu::Buffer,
    /// Scratch `[R·N2]` i32: the selection count of each row.
    pub count: &'a wgpu::Buffer,
    /// Scratch f32 of at least [`scratch_words`] words: logits, softmax statistics and
    /// output parts, passed between the stages.
    pub scratch: &'a wgpu::Buffer,
    /// The flag word (`shaders/common/flags.wgsl`).
    pub flags: &'a wgpu::Buffer,
    /// A texture copy of `key` ([`WordTexture`], kept equal to it by the caller), which the
    /// logits stage's subgroup variant then reads instead of the buffer where the context
    /// reads texture copies ([`Capabilities::textures`](crate::gpu::Capabilities::textures)):
    /// [`LOGITS_SG_TEX`].
    pub key_tex: Option<&'a WordTexture>,
    /// The same for `value` and the values stage ([`VALUES_SG_TEX`]).
    pub value_tex: Option<&'a WordTexture>,
}

impl<'a> NsaAttnBuffers<'a> {
    /// These buffers with texture copies of K and V (see [`NsaAttnBuffers::key_tex`]).
    pub fn with_textures(
        self,
        key_tex: Option<&'a WordTexture>,
        value_tex: Option<&'a WordTexture>,
    ) -> Self {
        NsaAttnBuffers {
            key_tex,
            value_tex,
            ..self
        }
    }
}

/// The device tensors one call writes (out, topk) and works in (psum, scores, count,
/// scratch), sized from its [`Plan`]: what [`gpu`] and a caller that keeps the inputs on the
/// device allocate alike.
pub struct NsaAttnTensors {
    pub out: GpuTensor,
    pub topk: GpuTensor,
    pub psum: GpuTensor,
    pub scores: GpuTensor,
    pub count: GpuTensor,
    pub scratch: GpuTensor,
}

impl NsaAttnTensors {
    /// Allocates them, each checked against the binding limit first. `sentinels`: out and
    /// scores start as NaN in every float type and topk as 0x7f7f7f7f (not -1), so that a
    /// test sees any element left unwritten; otherwise all start as zeros.
    pub fn new(ctx: &Context, p: &Plan, sentinels: bool) -> Result<Self> {
        let alloc = |name: &str, dt: DType, shape: &[usize], fill: u8| {
            let bytes = (shape.iter().product::<usize>() * dt.size()) as u64;
            ctx.check_binding_size(OP, name, bytes)?;
            GpuTensor::filled(ctx, &format!("qsa.{OP}.{name}"), dt, shape, fill)
        };
        let s = |fill: u8| if sentinels { fill } else { 0 };
        let rows = p.rows * p.n2;
        let words = scratch_words(&p.params()) as usize;
        Ok(NsaAttnTensors {
            out: alloc("out", p.dt, &p.out_shape(), s(0xff))?,
            topk: alloc("topk", DType::I32, &p.topk_shape(), s(0x7f))?,
            psum: alloc("psum", DType::F32, &[rows, p.c_max], 0)?,
            scores: alloc("scores", DType::F32, &[rows, p.w], s(0xff))?,
            count: alloc("count", DType::I32, &[rows], 0)?,
            scratch: alloc("scratch", DType::F32, &[words], 0)?,
        })
    }

    /// The call's buffers: these tensors with the given inputs and flag word.
    pub fn buffers<'a>(
        &'a self,
        query: &'a wgpu::Buffer,
        key: &'a wgpu::Buffer,
        value: &'a wgpu::Buffer,
        block_table: &'a wgpu::Buffer,
        lens: &'a wgpu::Buffer,
        flags: &'a wgpu::Buffer,
    ) -> NsaAttnBuffers<'a> {
        NsaAttnBuffers {
            query,
            key,
            value,
            block_table,
            lens,
            out: &self.out.buffer,
            topk: &self.topk.buffer,
            psum: &self.psum.buffer,
            scores: &self.scores.buffer,
            count: &self.count.buffer,
            scratch: &self.scratch.buffer,
            flags,
            key_tex: None,
            value_tex: None,
        }
    }
}

/// Describes the four stages, named by [`STAGES`]: the logits, the values and the finishing
/// dispatch, then the `block_topk` selection with `sel`
/// (= [`NsaCompressAttentionParams::topk_params`]). Parameters and buffer sizes (the scratch's
/// included) are checked here, before anything is recorded. Lengths and block-table entries
/// are read on the device: a row whose values are out of range is skipped and raises a flag
/// (page slot, page, or NSA lengths) instead of reading out of bounds.
pub fn dispatch_nsa_compress_attention<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a NsaCompressAttentionParams,
    sel: &'a BlockTopkParams,
    b: &NsaAttnBuffers<'a>,
) -> Result<Vec<(&'static str, Dispatch<'a>)>> {
    let bad = |what: &str, msg: String| Err(Error::input(OP, what, msg));
    if !SPLITS2.contains(&prm.split2) {
        return bad(
            "params",
            format!(
                "split2 = {} is not one of {SPLITS2:?} (NsaCompressAttentionParams::for_adapter chooses one)",
                prm.split2
            ),
        );
    }
    if prm.split1 != split1_for(ctx) {
        return bad(
            "params",
            format!(
                "split1 = {} but this context's logits kernel takes {} (NsaCompressAttentionParams::for_adapter sets it)",
                prm.split1,
                split1_for(ctx)
            ),
        );
    }
    if over_loop_budget(ctx, prm) {
        return bad(
            "actual_cmp_kv_len",
            format!(
                "{} compressed tokens with G = {} and Dqk = {} need up to {} loop iterations per invocation; llvmpipe stops loops after {LLVMPIPE_LOOP_LIMIT}",
                prm.c_max,
                prm.n1 / prm.n2.max(1),
                prm.dqk,
                loop_iterations(prm)
            ),
        );
    }
    let heads_ok = prm.n2 > 0 && prm.n1.is_multiple_of(prm.n2);
    if !heads_ok || prm.dqk as usize > MAX_DQK || prm.dv as usize > MAX_DV {
        return bad(
            "params",
            format!(
                "N1 = {}, N2 = {}, Dqk = {}, Dv = {} out of range",
                prm.n1, prm.n2, prm.dqk, prm.dv
            ),
        );
    }
    let strides_ok = prm.d > 0 && prm.l.is_multiple_of(prm.d) && prm.lsel.is_multiple_of(prm.d);
    if !strides_ok || prm.l < prm.d || prm.lsel < prm.l || prm.page == 0 {
        return bad(
            "params",
            format!(
                "l = {}, d = {}, l' = {}, page = {}",
                prm.l, prm.d, prm.lsel, prm.page
            ),
        );
    }
    let rows = prm.rows as u64 * prm.n2 as u64;
    let tsize = dt.size() as u64;
    let t_bytes = |elems: u64| (elems * tsize).div_ceil(4) * 4;
    for (name, buf, need) in [
        (
            "out",
            b.out,
            t_bytes(prm.rows as u64 * (prm.n1 * prm.dv) as u64),
        ),
        ("topk", b.topk, rows * prm.k as u64 * 4),
        ("psum", b.psum, rows * prm.c_max as u64 * 4),
        ("scores", b.scores, rows * prm.w as u64 * 4),
        ("count", b.count, rows * 4),
        ("scratch", b.scratch, scratch_words(prm) * 4),
    ] {
        ctx.check_binding_size(OP, name, need)?;
        if buf.size() < need {
            return bad(
                name,
                format!("buffer holds {} bytes, needs {need}", buf.size()),
            );
        }
    }
    if (sel.rows, sel.w, sel.k, sel.out_base) != (rows as u32, prm.w, prm.k, 0) {
        return bad(
            "params",
            format!("selection params {sel:?} do not match the attention's"),
        );
    }
    // K and V are also bound as 16-byte words where their rows start on 16-byte boundaries
    // (the shader's BY16); elsewhere a dummy takes that binding.
    let by16 = |d: u32| (d as u64 * tsize).is_multiple_of(16);
    let (k16, v16) = (by16(prm.dqk), by16(prm.dv));
    let key4 = if k16 { b.key } else { &ctx.dummy };
    let value4 = if v16 { b.value } else { &ctx.dummy };
    let g = (prm.n1 / prm.n2) as u64;
    let c = prm.c_max as u64;
    // The GPU-shaped values kernel takes a workgroup per part of each split.
    let parts = if ctx.caps.gpu_nsa {
        parts_per_split(prm.dv as u64)
    } else {
        1
    };
    let groups = [
        rows * g.div_ceil(16) * c.div_ceil(prm.split1 as u64),
        rows * c.div_ceil(prm.split2 as u64) * parts,
        rows,
    ];
    if groups.iter().any(|&n| n > u32::MAX as u64) {
        return bad(
            "params",
            format!("{groups:?} workgroups exceed the u32 range"),
        );
    }
    let common = [b.lens, b.block_table, b.flags];
    // The portable logits and values kernels are specialised by BY16; their subgroup variants
    // run only with 16-byte rows and take no such constant, in 32-byte words where they can.
    let by32 = |d: u32| ctx.caps.wide_loads && (d as u64 * tsize).is_multiple_of(32);
    // The subgroup variants read K and V from texture copies where the caller passes them
    // and the context reads such copies; each copy must hold its buffer's words.
    let copy = |name: &str,
                tex: Option<&'a WordTexture>,
                buf: &wgpu::Buffer|
     -> Result<Option<&'a wgpu::TextureView>> {
        match tex {
            Some(t) if ctx.caps.textures => {
                if t.words() * 16 < buf.size() {
                    return Err(Error::input(
                        OP,
                        name,
                        format!(
                            "texture copy holds {} bytes, the buffer {}",
                            t.words() * 16,
                            buf.size()
                        ),
                    ));
                }
                Ok(Some(&t.view))
            }
            _ => Ok(None),
        }
    };
    let (key_tex, value_tex) = (
        copy("key_tex", b.key_tex, b.key)?,
        copy("value_tex", b.value_tex, b.value)?,
    );
    type Stage<'a> = (
        &'static str,
        Option<bool>,
        Vec<&'a wgpu::Buffer>,
        Vec<&'a wgpu::TextureView>,
    );
    let logits: Stage = if ctx.caps.gpu_nsa {
        (
            LOGITS_GPU,
            Some(k16),
            vec![b.query, b.key, key4, b.scratch],
            vec![],
        )
    } else if logits_subgroup_pass(ctx.caps.subgroup_size, k16) {
        match key_tex {
            Some(t) => (LOGITS_SG_TEX, None, vec![b.query, b.scratch], vec![t]),
            None if by32(prm.dqk) => (
                LOGITS_SG_W32,
                None,
                vec![b.query, b.key, key4, b.scratch],
                vec![],
            ),
            None => (
                LOGITS_SG,
                None,
                vec![b.query, b.key, key4, b.scratch],
                vec![],
            ),
        }
    } else {
        (OP, Some(k16), vec![b.query, b.key, key4, b.scratch], vec![])
    };
    let values: Stage = if ctx.caps.gpu_nsa {
        (
            VALUES_GPU,
            None,
            vec![b.value, value4, b.scratch, b.psum],
            vec![],
        )
    } else if values_subgroup_pass(ctx.caps.subgroup_size, v16, prm.dv) {
        match value_tex {
            Some(t) => (VALUES_SG_TEX, None, vec![b.scratch, b.psum], vec![t]),
            None if by32(prm.dv) => (
                VALUES_SG_W32,
                None,
                vec![b.value, value4, b.scratch, b.psum],
                vec![],
            ),
            None => (
                VALUES_SG,
                None,
                vec![b.value, value4, b.scratch, b.psum],
                vec![],
            ),
        }
    } else {
        (
            "nsa_compress_attention_values",
            Some(v16),
            vec![b.value, value4, b.scratch, b.psum],
            vec![],
        )
    };
    let finish: Stage = (
        "nsa_compress_attention_finish",
        None,
        vec![b.scratch, b.psum, b.out, b.scores],
        vec![],
    );
    let mut out = Vec::with_capacity(STAGES.len());
    for (i, ((shader, wide, own, textures), n)) in
        [logits, values, finish].into_iter().zip(groups).enumerate()
    {
        let mut key = PipelineKey::new(shader, "main")
            .with("T_KIND", dt.shader_kind())
            .with("PAGE_POW2", prm.page.is_power_of_two() as u32);
        if let Some(w) = wide {
            key = key.with("BY16", w as u32);
        }
        let d = Dispatch {
            key,
            params: bytemuck::bytes_of(prm),
            buffers: common.iter().chain(own.iter()).copied().collect(),
            textures,
            groups: n as u32,
        };
        out.push((STAGES[i], d));
    }
    out.push((
        STAGES[3],
        block_topk::dispatch_topk(ctx, sel, b.scores, b.topk, b.count, None)?,
    ));
    Ok(out)
}

/// The logits stage's subgroup variant (`nsa_compress_attention_sg.wgsl`).
pub const LOGITS_SG: &str = "nsa_compress_attention_sg";

/// The logits stage's GPU-shaped kernel (`nsa_compress_attention_gpu.wgsl`): a workgroup of
/// 256 invocations per [`SPLIT1_GPU`] tokens, one token and its 16 heads' dot products each,
/// where the portable kernel's 64 invocations take 16 tokens each. Taken with
/// [`VALUES_GPU`] where the context has
/// [`Capabilities::gpu_nsa`](crate::gpu::Capabilities::gpu_nsa).
pub const LOGITS_GPU: &str = "nsa_compress_attention_gpu";

/// The values stage's GPU-shaped kernel (`nsa_compress_attention_values_gpu.wgsl`): a
/// workgroup per part of each stage-2 split (the portable kernel's parts), its 64 invocations
/// each accumulating one channel of every 64 for the 16 heads.
pub const VALUES_GPU: &str = "nsa_compress_attention_values_gpu";

/// Whether the logits stage runs its subgroup variant: on adapters whose subgroups are all
/// 8 lanes (lavapipe at 256-bit SIMD), where K and query rows start on 16-byte boundaries
/// (`k16`: Dqk · sizeof(T) a multiple of 16). It reads the queries once per chunk of as many
/// channels as a 32-byte word of K holds (8 f32, 16 16-bit) and hands them to every lane by
/// `subgroupBroadcast`, where the portable kernel reads them from workgroup memory for every
/// four channels.
pub fn logits_subgroup_pass(size: Option<u32>, k16: bool) -> bool {
    size == Some(8) && k16
}

/// The logits stage's subgroup variant reading K in 32-byte words
/// (`nsa_compress_attention_sg_w32.wgsl`): where the context has
/// [`Capabilities::wide_loads`](crate::gpu::Capabilities::wide_loads) and Dqk · sizeof(T) is a
/// multiple of 32. Same results, bit for bit, with half the loads.
pub const LOGITS_SG_W32: &str = "nsa_compress_attention_sg_w32";

/// The logits stage's subgroup variant reading K from a texture copy
/// (`nsa_compress_attention_sg_tex.wgsl`): where the caller passes one
/// ([`NsaAttnBuffers::key_tex`]) and the context has
/// [`Capabilities::textures`](crate::gpu::Capabilities::textures). Same results, bit for bit;
/// each 16 bytes of a row a texel fetch, which llvmpipe makes a vector gather where a storage
/// load is a loop over the lanes (docs/perf.md, nsa-decode).
pub const LOGITS_SG_TEX: &str = "nsa_compress_attention_sg_tex";

/// The values stage's subgroup variant reading V from a texture copy
/// (`nsa_compress_attention_values_sg_tex.wgsl`), as [`LOGITS_SG_TEX`] for K.
pub const VALUES_SG_TEX: &str = "nsa_compress_attention_values_sg_tex";

/// The values stage's subgroup variant (`nsa_compress_attention_values_sg.wgsl`).
pub const VALUES_SG: &str = "nsa_compress_attention_values_sg";

/// The values stage's subgroup variant reading V in 32-byte words
/// (`nsa_compress_attention_values_sg_w32.wgsl`): where the context has
/// [`Capabilities::wide_loads`](crate::gpu::Capabilities::wide_loads) and Dv · sizeof(T) is a
/// multiple of 32.
pub const VALUES_SG_W32: &str = "nsa_compress_attention_values_sg_w32";

/// Whether the values stage runs its subgroup variant: on adapters whose subgroups are all 8
/// lanes, where V rows start on 16-byte boundaries (`v16`) and Dv takes 8 channel tiles of 16
/// (113 ≤ Dv ≤ 128), so that the 8 lanes of a subgroup cover a V row and its 8 subgroups are
/// the portable kernel's 8 parts. Its lanes read eight tokens' probabilities at once and hand
/// them on by `subgroupShuffle`, where the portable kernel has every invocation read every
/// token's from workgroup memory.
pub fn values_subgroup_pass(size: Option<u32>, v16: bool, dv: u32) -> bool {
    size == Some(8) && v16 && dv.div_ceil(16) == 8
}

/// Whether the logits (K) and values (V) stages on `ctx` read texture copies of K and V where
/// a caller passes them ([`NsaAttnBuffers::with_textures`]): where the context reads texture
/// copies ([`Capabilities::textures`](crate::gpu::Capabilities::textures)) and the stage runs
/// its subgroup variant, which has a texture form ([`LOGITS_SG_TEX`], [`VALUES_SG_TEX`]). A
/// caller keeps copies only of what would be read.
pub fn texture_stages(ctx: &Context, dt: DType, dqk: usize, dv: usize) -> (bool, bool) {
    let on = ctx.caps.textures && !ctx.caps.gpu_nsa;
    let by16 = |d: usize| (d * dt.size()).is_multiple_of(16);
    let size = ctx.caps.subgroup_size;
    (
        on && logits_subgroup_pass(size, by16(dqk)),
        on && values_subgroup_pass(size, by16(dv), dv as u32),
    )
}

/// Texture copies of `key` and `value` for the stages [`texture_stages`] names (`None` for
/// the others, or where the adapter's textures cannot hold them), recorded into `enc`.
pub fn texture_copies(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    (dqk, dv): (usize, usize),
    key: &wgpu::Buffer,
    value: &wgpu::Buffer,
) -> (Option<WordTexture>, Option<WordTexture>) {
    let (k, v) = texture_stages(ctx, dt, dqk, dv);
    let mut copy = |on: bool, name: &str, buf: &wgpu::Buffer| {
        let tex = WordTexture::new(ctx, &format!("qsa.{OP}.{name}"), buf.size()).filter(|_| on)?;
        tex.copy_words(enc, buf, 0, tex.words());
        Some(tex)
    };
    (copy(k, "key_tex", key), copy(v, "value_tex", value))
}

/// Records the four stages of [`dispatch_nsa_compress_attention`] into `enc`, with fresh bind
/// groups.
pub async fn encode_nsa_compress_attention(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &NsaCompressAttentionParams,
    b: &NsaAttnBuffers<'_>,
) -> Result<()> {
    let sel = prm.topk_params();
    for (_, d) in dispatch_nsa_compress_attention(ctx, dt, prm, &sel, b)? {
        encode(ctx, enc, d).await?;
    }
    Ok(())
}

/// Runs on the GPU: uploads, the four stages in one submission, checked readback.
pub async fn gpu(
    ctx: &Context,
    x: &NsaCompressAttentionInputs<'_>,
    a: &NsaCompressAttentionAttrs,
) -> Result<NsaCompressAttentionOutputs> {
    gpu_with_split(ctx, x, a, None).await
}

/// [`gpu`] with the stage-2 split given (one of [`SPLITS2`]) instead of chosen for the adapter
/// (`None`): how the tests run every split on one adapter.
pub async fn gpu_with_split(
    ctx: &Context,
    x: &NsaCompressAttentionInputs<'_>,
    a: &NsaCompressAttentionAttrs,
    split2: Option<u32>,
) -> Result<NsaCompressAttentionOutputs> {
    let p = validate(x, a)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let query = up("query", x.query)?;
    let key = up("key", x.key)?;
    let value = up("value", x.value)?;
    let table = p.table_words();
    let table = up("block_table", &Tensor::from_u32(&[table.len()], &table))?;
    let lens = p.lens();
    let lens = up("lens", &Tensor::from_u32(&[lens.len()], &lens))?;
    let t = NsaAttnTensors::new(ctx, &p, true)?;
    let flags = flag_word(ctx)?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = t.buffers(
        &query.buffer,
        &key.buffer,
        &value.buffer,
        &table.buffer,
        &lens.buffer,
        &flags.buffer,
    );
    let mut prm = p.params().for_adapter(ctx);
    if let Some(split2) = split2 {
        prm.split2 = split2;
    }
    // Texture copies of K and V where the stages read them: a copy costs less than what it
    // saves on llvmpipe (docs/perf.md, nsa-decode).
    let dims = (p.dqk, p.dv);
    let (kt, vt) = texture_copies(ctx, &mut enc, p.dt, dims, &key.buffer, &value.buffer);
    let bufs = bufs.with_textures(kt.as_ref(), vt.as_ref());
    encode_nsa_compress_attention(ctx, &mut enc, p.dt, &prm, &bufs).await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&t.out, &t.topk], &flags).await?;
    let topk = got.pop().unwrap();
    Ok(NsaCompressAttentionOutputs {
        out: got.pop().unwrap(),
        topk,
    })
}

#[cfg(test)]
mod tests {
    fn constant(shader: &str, name: &str) -> u64 {
        crate::shaders::wgsl_u32(shader, name) as u64
    }

    /// The split, tile and block sizes that size the scratch buffer and model the loops are
    /// the shaders' constants.
    #[test]
    fn scratch_geometry_matches_the_shaders() {
        let values = "nsa_compress_attention_values";
        assert_eq!(constant(values, "CT"), super::CHANNELS);
        assert_eq!(constant(values, "WG"), super::WG);
        assert_eq!(constant(values, "TILE"), super::TILE);
        assert_eq!(constant(values, "HC"), super::HC);
        assert_eq!(constant("nsa_compress_attention", "DC"), super::DC);
        let gpu = super::LOGITS_GPU;
        assert_eq!(constant(gpu, "GWG"), super::SPLIT1_GPU as u64);
        assert_eq!(constant(super::VALUES_GPU, "VB"), super::VB);
        // The portable and subgroup logits kernels: 64 invocations of 16 tokens.
        assert_eq!(super::SPLIT1 as u64, super::WG * 16);
    }
}
