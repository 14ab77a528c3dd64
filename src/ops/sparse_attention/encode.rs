//! Recording a `sparse_attention` call: the device buffers it binds (the main pool in one
//! buffer, or in shards of whole pages), the plan of its dispatches (per chunk of rows: the
//! routing of the token lists to the shards, the partial pass over each shard, the combine;
//! through two scratch buffers, routes and partial results), and the entry points for
//! orchestrators.

use super::dispatch::*;
use super::OP;
use crate::error::{Error, Result};
use crate::gpu::{Context, PipelineKey};
use crate::ops::common::{encode, Dispatch};
use crate::tensor::DType;

/// The routing stage's shader (and pipeline label).
pub const ROUTE: &str = "sparse_attention_route";
/// The routing stage's subgroup variant (`sparse_attention_route_sg.wgsl`): the same routes
/// and flags from one 8-lane subgroup per (row, group), without workgroup memory or barriers.
pub const ROUTE_SG: &str = "sparse_attention_route_sg";
/// Most pool shards the routing variant takes (its shard counts are two vec4 per lane).
pub const ROUTE_SG_MAX_SHARDS: u32 = 8;

/// Whether the routing stage runs its subgroup variant: where subgroups are exactly 8 lanes
/// (lavapipe), the pool has at most [`ROUTE_SG_MAX_SHARDS`] shards and the variant's loops
/// stay within llvmpipe's budget ([`route_sg_loop_iterations`]; the generic kernel takes
/// longer lists in fewer, wider chunks). On lavapipe it took the attention preset's route from
/// 0.16–0.25 ms to 0.09–0.17 ms (alternating runs): the generic kernel's three barriers per
/// chunk of 64 entries are coroutine switches between its eight SIMD vectors there.
pub fn route_subgroup_pass(subgroup_size: Option<u32>, p: &SparseAttentionParams) -> bool {
    subgroup_size == Some(8)
        && p.shards <= ROUTE_SG_MAX_SHARDS
        && route_sg_loop_iterations(p) <= LLVMPIPE_LOOP_BUDGET
}

/// Loop iterations one invocation of the routing variant runs at most: the row lookup, pass 1
/// over the list in chunks of 8, pass 2 with its 3-step scan per chunk.
pub fn route_sg_loop_iterations(p: &SparseAttentionParams) -> u64 {
    let chunks = (p.w as u64).div_ceil(8);
    let lookup = 64 - (p.n as u64).leading_zeros() as u64 + 2;
    lookup + (chunks + 1) + (chunks + 1) + chunks * 4
}
/// The partial pass's subgroup variant (shader and pipeline label).
pub const SUBGROUP_PASS: &str = "sparse_attention_sg";
/// The subgroup variant reading the pool in 32-byte words (`sparse_attention_sg_w32.wgsl`),
/// where the context has [`Capabilities::wide_loads`](crate::gpu::Capabilities::wide_loads)
/// and every pool row starts on a 32-byte boundary ([`subgroup_words`]).
pub const SUBGROUP_PASS_W32: &str = "sparse_attention_sg_w32";
/// The combine stage's shader (and pipeline label).
pub const COMBINE: &str = "sparse_attention_combine";
/// Most pool shards one call takes (`MAX_SHARDS` in the routing shader).
pub const MAX_SHARDS: usize = 64;
/// Most pool shards one dispatch of the subgroup pass binds and takes in turn (its `PS`):
/// bindings 2, 5, 6, 7 of `sparse_attention_sg.wgsl` (7 storage buffers in all, within
/// WebGPU's default 8), 5 … 8 of the 32-byte variant. The tiled pass takes one a dispatch.
pub const PASS_SHARDS: usize = 4;

/// Pool shards each partial-pass dispatch of `p` takes: up to [`PASS_SHARDS`] for the subgroup
/// pass (`p.sg != 0`), which carries its state in registers from one to the next instead of
/// storing and reloading its records, and saves a dispatch per shard; 1 for the tiled pass.
pub fn pass_shards(p: &SparseAttentionParams) -> usize {
    if p.sg != 0 {
        (p.shards as usize).clamp(1, PASS_SHARDS)
    } else {
        1
    }
}

/// Device buffers of one call over a pool in one buffer. Float buffers hold the call's type T
/// (f16/bf16 packed two per word), integer buffers i32/u32 words.
pub struct AttentionBuffers<'a> {
    /// `[T, H, E]` T.
    pub query: &'a wgpu::Buffer,
    /// The main pool, `[num_pages, 2, layers, page_size, Hkv, Dp]` T (Dp = max(E, Ev)), pages
    /// `page_stride` apart.
    pub pool: &'a wgpu::Buffer,
    /// [`pack_seqs`]: row_offsets, cache_lengths, page table.
    pub seqs: &'a wgpu::Buffer,
    /// `[T, Hs, W]` i32.
    pub token_indices: &'a wgpu::Buffer,
    /// `[T, Hs]` i32.
    pub token_count: &'a wgpu::Buffer,
    /// `[H]` f32, or `None` (then `params.has_sinks` must be 0).
    pub sinks: Option<&'a wgpu::Buffer>,
    /// `[T, H, Ev]` T, every element written.
    pub out: &'a wgpu::Buffer,
    /// The flag word (`shaders/common/flags.wgsl`); read with `read_checked`.
    pub flags: &'a wgpu::Buffer,
}

impl<'a> AttentionBuffers<'a> {
    /// The same call as one shard of `num_pages` pages, with `partials` and `routes` as its
    /// scratch.
    pub fn sharded(
        &self,
        num_pages: usize,
        partials: &'a wgpu::Buffer,
        routes: &'a wgpu::Buffer,
    ) -> ShardedAttentionBuffers<'a> {
        ShardedAttentionBuffers {
            query: self.query,
            pool: vec![self.pool],
            shard_pages: num_pages.max(1),
            seqs: self.seqs,
            token_indices: self.token_indices,
            token_count: self.token_count,
            sinks: self.sinks,
            out: self.out,
            flags: self.flags,
            partials,
            routes,
        }
    }
}

/// Device buffers of one call whose pool is split into shards of whole pages, each within one
/// storage binding: page p lives in `pool[p / shard_pages]` at local page `p % shard_pages`
/// (local pages `page_stride` apart, laid out as in the whole pool). The other buffers are
/// those of [`AttentionBuffers`].
pub struct ShardedAttentionBuffers<'a> {
    pub query: &'a wgpu::Buffer,
    /// `ceil(num_pages / shard_pages)` buffers; the last may hold fewer pages.
    pub pool: Vec<&'a wgpu::Buffer>,
    pub shard_pages: usize,
    pub seqs: &'a wgpu::Buffer,
    pub token_indices: &'a wgpu::Buffer,
    pub token_count: &'a wgpu::Buffer,
    pub sinks: Option<&'a wgpu::Buffer>,
    pub out: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
    /// Scratch of the partial results: at least the plan's `partials_bytes`.
    pub partials: &'a wgpu::Buffer,
    /// Scratch of the routed token lists: at least the plan's `routes_bytes`.
    pub routes: &'a wgpu::Buffer,
}

/// One dispatch of a plan.
#[derive(Clone, Copy, Debug)]
pub struct AttentionStep {
    /// [`ROUTE`], `"sparse_attention"` (the partial pass over one shard) or [`COMBINE`].
    pub shader: &'static str,
    /// The first pool shard a partial pass reads ([`pass_shards`] from there; 0 for the
    /// others).
    pub shard: usize,
    /// Its index among the plan's steps of the same shader (a `BindCache` slot).
    pub slot: usize,
    pub params: SparseAttentionParams,
}

impl AttentionStep {
    /// Its stage among `names` = [route, partial pass, combine].
    pub fn stage(&self, names: [&'static str; 3]) -> &'static str {
        match self.shader {
            ROUTE => names[0],
            COMBINE => names[2],
            _ => names[1],
        }
    }
}

/// The dispatches of one call, in recording order: for each chunk of rows, the routing, the
/// partial pass over every shard ([`pass_shards`] a dispatch, each continuing the previous
/// one's partials), the combine.
#[derive(Clone, Debug)]
pub struct AttentionPlan {
    pub steps: Vec<AttentionStep>,
    pub shard_pages: usize,
    /// Scratch bytes the partial results of one row chunk take.
    pub partials_bytes: u64,
    /// Scratch bytes the routed token lists of one row chunk take.
    pub routes_bytes: u64,
}

/// Bytes of one partial result: Ev4 channel quads and an (m, l) per channel block, in f32
/// vec4s.
fn record_bytes(p: &SparseAttentionParams) -> u64 {
    ((p.v_dim() as u64).div_ceil(4) + p.cblocks.max(1) as u64) * 16
}

/// Plans a call from its uniform block ([`params`]) for a pool in shards of `shard_pages`
/// pages, with scratch buffers of `partials_cap` and `routes_cap` bytes. On a CPU adapter
/// splits are rounded to whole tiles ([`TILE`] entries; [`params`] picks 64-entry units, right
/// for GPUs); rows are taken in chunks whose scratch fits (and splits are cut back when one
/// row's partials do not).
pub fn plan_attention(
    ctx: &Context,
    prm: &SparseAttentionParams,
    shard_pages: usize,
    partials_cap: u64,
    routes_cap: u64,
) -> Result<AttentionPlan> {
    let mut p = *prm;
    // Whether the caller kept the splits `params` chose (else they are the caller's).
    let default_splits = {
        let mut d = *prm;
        d.choose_splits(LANES);
        d.split_len == prm.split_len
    };
    let np = p.num_pages as usize;
    let shard_pages = shard_pages.max(1);
    let shards = np.div_ceil(shard_pages).max(1);
    if shards > MAX_SHARDS {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("{shards} pool shards of {shard_pages} pages; at most {MAX_SHARDS}"),
        ));
    }
    let cpu = ctx.info.device_type == wgpu::DeviceType::Cpu;
    let unit = if cpu { TILE } else { LANES };
    if !(p.split_len as usize).is_multiple_of(unit) {
        p.choose_splits(unit);
    }
    // The subgroup pass where the adapter allows: its subgroups are the records' phases, with
    // one channel block.
    if let Some(sg) = subgroup_pass(ctx.caps.subgroup_size, &p) {
        p.sg = sg;
        p.phases = subgroup_pass_invocations(cpu, sg) / sg;
        p.cblocks = 1;
        // Unless the caller chose the splits: whole 64-entry units (batches of SG entries per
        // subgroup), and on a CPU one workgroup per core, each subgroup then carrying its
        // state over many tokens.
        if default_splits {
            let target = if cpu {
                sg_target_groups_cpu()
            } else {
                TARGET_GROUPS
            };
            p.choose_splits_for(LANES, target);
        } else if p.split_len as usize > p.max_split_len() {
            // The caller's splits, cut to what the subgroup pass may loop over on llvmpipe.
            let len = p.max_split_len().max(LANES);
            p.split_len = len as u32;
            p.splits = (p.w as usize).div_ceil(len).max(1) as u32;
        }
    }
    let head_bytes = p.h as u64 * p.phases as u64 * record_bytes(&p);
    if p.splits as u64 * head_bytes > partials_cap {
        let fit = (partials_cap / head_bytes) as usize;
        let units = (p.w as usize).div_ceil(unit).max(1);
        let len = units.div_ceil(fit.max(1)) * unit;
        if fit == 0 || len > p.max_split_len() {
            return Err(Error::Limit {
                op: OP,
                input: "partials".into(),
                need: p.splits as u64 * head_bytes,
                limit_name: "scratch capacity",
                limit: partials_cap,
            });
        }
        p.split_len = len as u32;
        p.splits = units.div_ceil(len / unit) as u32;
    }
    let row_bytes = p.splits as u64 * head_bytes;
    let route_bytes = p.hs as u64 * (shards + 1 + p.w as usize) as u64 * 4;
    if route_bytes > routes_cap {
        return Err(Error::Limit {
            op: OP,
            input: "routes".into(),
            need: route_bytes,
            limit_name: "scratch capacity",
            limit: routes_cap,
        });
    }
    let t = p.t as usize;
    let chunk =
        ((partials_cap / row_bytes).min(routes_cap / route_bytes) as usize).clamp(1, t.max(1));
    p.shards = shards as u32;
    p.shard_pages = shard_pages as u32;
    let mut steps = Vec::new();
    for (c, base) in (0..t).step_by(chunk).enumerate() {
        let p = SparseAttentionParams {
            row_base: base as u32,
            rows: chunk.min(t - base) as u32,
            ..p
        };
        let step = |shader, shard: usize, slot| AttentionStep {
            shader,
            shard,
            slot,
            params: SparseAttentionParams {
                shard: shard as u32,
                ..p
            },
        };
        steps.push(step(ROUTE, 0, c));
        let ps = pass_shards(&p);
        let passes = shards.div_ceil(ps);
        for (j, k) in (0..shards).step_by(ps).enumerate() {
            steps.push(step(OP, k, c * passes + j));
        }
        steps.push(step(COMBINE, 0, c));
    }
    let rows = chunk.min(t.max(1)) as u64;
    Ok(AttentionPlan {
        steps,
        shard_pages,
        partials_bytes: (rows * row_bytes).max(16),
        routes_bytes: (rows * route_bytes).max(16),
    })
}

/// Whether 16-bit channel quads of every row of `width` channels (queries: E, outputs: Ev)
/// are whole words.
fn align2(dt: DType, width: u32) -> u32 {
    (dt.size() == 2 && width.is_multiple_of(2)) as u32
}

/// Whether every K and V row (Dp channels per head) starts on a whole 16-byte word of the pool.
fn vec_rows(dt: DType, p: &SparseAttentionParams) -> u32 {
    rows_on(dt, p, 16) as u32
}

/// Whether every K and V row starts on a multiple of `bytes` in the pool (the pool offsets of
/// layers and planes are multiples of Dp).
fn rows_on(dt: DType, p: &SparseAttentionParams, bytes: u32) -> bool {
    let m = bytes / dt.size() as u32;
    p.pool_dim().is_multiple_of(m) && p.page_stride.is_multiple_of(m)
}

/// How the subgroup pass reads the pool with `wide_loads` (the context's
/// [`Capabilities::wide_loads`](crate::gpu::Capabilities::wide_loads)): its shader, and W, the
/// channel quads one load gives a lane — 32-byte words where the device has 64-bit integers
/// and rows start on 32 bytes (2 quads of f32, 4 of 16-bit T), else 16-byte words where rows
/// start on 16 bytes (1 or 2), else elements (1). Each lane's K and V slots come in whole words,
/// so its quads per row are rounded up to a multiple of W ([`subgroup_slots`]).
pub fn subgroup_words(
    wide_loads: bool,
    dt: DType,
    p: &SparseAttentionParams,
) -> (&'static str, u32) {
    let quad = 4 * dt.size() as u32;
    if wide_loads && rows_on(dt, p, 32) {
        (SUBGROUP_PASS_W32, 32 / quad)
    } else if rows_on(dt, p, 16) {
        (SUBGROUP_PASS, 16 / quad)
    } else {
        (SUBGROUP_PASS, 1)
    }
}

/// Whether every slot of every lane of the subgroup pass holds a quad inside the K and V rows
/// (E and Ev multiples of 4 · W · SG channels), so that its loads need no masks (`FULL`).
pub fn subgroup_rows_full(p: &SparseAttentionParams, w: u32) -> bool {
    let word = 4 * w * p.sg;
    p.e.is_multiple_of(word) && p.v_dim().is_multiple_of(word)
}

/// Slots per lane of the subgroup pass for rows of `d` channels (`QK` for E, `QV` for Ev): the
/// row's channel quads over the subgroup's `sg` lanes, in whole words of `w` quads. At most
/// [`SG_QUADS`] wherever [`subgroup_pass`] applies (d ≤ 4 · SG_QUADS · sg).
pub fn subgroup_slots(d: u32, sg: u32, w: u32) -> u32 {
    d.div_ceil(4).div_ceil(sg * w) * w
}

/// Describes every dispatch of `plan` over `b`, paired with its step. Buffers too small for the
/// plan are an error here, before anything is recorded; device values (lengths, tokens, pages)
/// are checked by the shader and reported through `b.flags`.
pub fn dispatch_attention<'a>(
    ctx: &'a Context,
    dt: DType,
    plan: &'a AttentionPlan,
    b: &ShardedAttentionBuffers<'a>,
) -> Result<Vec<(&'a AttentionStep, Dispatch<'a>)>> {
    let Some(first) = plan.steps.first() else {
        return Ok(Vec::new());
    };
    let prm = &first.params;
    if ctx.caps.llvmpipe {
        let (n, r) = (loop_iterations(prm), route_loop_iterations(prm));
        if n.max(r) > LLVMPIPE_LOOP_BUDGET {
            return Err(Error::input(
                OP,
                "token_indices",
                format!(
                    "W = {} (splits of {}) with E = {}, Ev = {} needs up to {} loop iterations per invocation; llvmpipe stops loops after {LLVMPIPE_LOOP_LIMIT}",
                    prm.w, prm.split_len, prm.e, prm.v_dim(), n.max(r)
                ),
            ));
        }
    }
    if !dt.is_float() || (prm.has_sinks != 0) != b.sinks.is_some() {
        return Err(Error::input(
            OP,
            "sinks",
            format!(
                "type {dt} / has_sinks {} / sinks buffer mismatch",
                prm.has_sinks
            ),
        ));
    }
    let np = prm.num_pages as u64;
    let sp = b.shard_pages.max(1) as u64;
    if b.shard_pages != plan.shard_pages || b.pool.len() as u64 != np.div_ceil(sp).max(1) {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!(
                "{} shard buffers of {} pages for {np} pages (the plan has shards of {})",
                b.pool.len(),
                b.shard_pages,
                plan.shard_pages
            ),
        ));
    }
    let es = dt.size() as u64;
    let (t, h, e, n) = (prm.t as u64, prm.h as u64, prm.e as u64, prm.n as u64);
    let (ev, dp) = (prm.v_dim() as u64, prm.pool_dim() as u64);
    if ev > dp || e > dp {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("pool rows of {dp} channels cannot hold E = {e} and Ev = {ev}"),
        ));
    }
    let rows = t * prm.hs as u64;
    let mut need = vec![
        ("query", b.query, t * h * e * es),
        ("seqs", b.seqs, (2 * n + 1 + n * prm.max_pages as u64) * 4),
        ("token_indices", b.token_indices, rows * prm.w as u64 * 4),
        ("token_count", b.token_count, rows * 4),
        ("out", b.out, t * h * ev * es),
        ("partials", b.partials, plan.partials_bytes),
        ("routes", b.routes, plan.routes_bytes),
    ];
    for (k, buf) in b.pool.iter().enumerate() {
        let pages = sp.min(np - (k as u64 * sp).min(np));
        let elems = pages.saturating_sub(1) * prm.page_stride as u64
            + prm.v_off as u64
            + prm.page_size as u64 * prm.hkv as u64 * dp;
        // The shader reads the pool in 16-byte words.
        need.push(("kv_blocks", buf, (elems * es).div_ceil(16) * 16));
    }
    if let Some(s) = b.sinks {
        need.push(("sinks", s, h * 4));
    }
    for (name, buf, bytes) in need {
        ctx.check_binding_size(OP, name, bytes)?;
        if buf.size() < bytes {
            return Err(Error::input(
                OP,
                name,
                format!("buffer holds {} bytes, the call needs {bytes}", buf.size()),
            ));
        }
    }
    let (a2q, a2o, vec) = (
        align2(dt, prm.e),
        align2(dt, prm.v_dim()),
        vec_rows(dt, prm),
    );
    let mut out = Vec::new();
    for step in &plan.steps {
        let p = &step.params;
        let d = match step.shader {
            ROUTE => Dispatch {
                key: PipelineKey::new(
                    if route_subgroup_pass(ctx.caps.subgroup_size, p) {
                        ROUTE_SG
                    } else {
                        ROUTE
                    },
                    "main",
                )
                .with(
                    "POW2",
                    (p.page_size.is_power_of_two() && p.shard_pages.is_power_of_two()) as u32,
                ),
                params: bytemuck::bytes_of(p),
                buffers: vec![b.seqs, b.token_indices, b.token_count, b.routes, b.flags],
                textures: vec![],
                groups: p.rows * p.hs,
            },
            COMBINE => Dispatch {
                key: PipelineKey::new(COMBINE, "main")
                    .with("T_KIND", dt.shader_kind())
                    .with("ALIGN2", a2o),
                params: bytemuck::bytes_of(p),
                buffers: vec![b.partials, b.sinks.unwrap_or(&ctx.dummy), b.out],
                textures: vec![],
                groups: p.combine_groups(),
            },
            _ if p.sg != 0 => {
                let (shader, w) = subgroup_words(ctx.caps.wide_loads, dt, p);
                let ps = pass_shards(p);
                // The dispatch's shards in slots 0 … 3 (slots past the pool's last shard
                // repeat it: never read).
                let last = b.pool.len() - 1;
                let slot = |j: usize| b.pool[(step.shard + j).min(last)];
                let mut buffers = vec![b.query, slot(0), b.routes, b.partials];
                let first_extra = if shader == SUBGROUP_PASS_W32 { 0 } else { 1 };
                buffers.extend((first_extra..PASS_SHARDS).map(slot));
                Dispatch {
                    key: PipelineKey::new(shader, "main")
                        .with("T_KIND", dt.shader_kind())
                        .with("SG", p.sg)
                        .with("TK", p.phases * p.sg)
                        .with("HQ", p.head_quads())
                        .with("QK", subgroup_slots(p.e, p.sg, w))
                        .with("QV", subgroup_slots(p.v_dim(), p.sg, w))
                        .with("W", w)
                        .with("FULL", subgroup_rows_full(p, w) as u32)
                        .with("PS", ps as u32)
                        .with("ALIGN2", a2q)
                        .with("VEC", vec),
                    params: bytemuck::bytes_of(p),
                    buffers,
                    textures: vec![],
                    groups: p.groups(),
                }
            }
            _ => Dispatch {
                key: PipelineKey::new(OP, "main")
                    .with("T_KIND", dt.shader_kind())
                    .with("HQ", p.head_quads())
                    .with("ALIGN2", a2q)
                    .with("VEC", vec),
                params: bytemuck::bytes_of(p),
                buffers: vec![b.query, b.pool[step.shard], b.routes, b.partials],
                textures: vec![],
                groups: p.groups(),
            },
        };
        out.push((step, d));
    }
    Ok(out)
}

/// Scratch bytes (partials, routes) for the worst step of up to `rows` query rows over a pool
/// of `shard_pages`-page shards: few rows split many ways, or `rows` rows. `params(t)` gives
/// a `t`-row step's parameters.
pub fn worst_step_scratch(
    ctx: &Context,
    rows: usize,
    shard_pages: usize,
    params: impl Fn(usize) -> Result<SparseAttentionParams>,
) -> Result<(u64, u64)> {
    let cap = ctx.binding_capacity();
    let (mut partials, mut routes) = (16, 16);
    let mut t = 1;
    loop {
        let plan = plan_attention(ctx, &params(t)?, shard_pages, cap, cap)?;
        partials = plan.partials_bytes.max(partials);
        routes = plan.routes_bytes.max(routes);
        if t >= rows {
            return Ok((partials, routes));
        }
        t = (2 * t).min(rows);
    }
}

/// A scratch buffer of at least `bytes` (whole 16-byte words).
pub fn scratch_buffer(ctx: &Context, label: &str, bytes: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.div_ceil(16).max(1) * 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

/// Records a call over a pool in one buffer into `enc`, with fresh bind groups and scratch
/// buffers of its own.
pub async fn encode_attention(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &SparseAttentionParams,
    b: &AttentionBuffers<'_>,
) -> Result<()> {
    let cap = ctx.binding_capacity();
    let plan = plan_attention(ctx, prm, prm.num_pages as usize, cap, cap)?;
    let partials = scratch_buffer(ctx, "qsa.sparse_attention.partials", plan.partials_bytes);
    let routes = scratch_buffer(ctx, "qsa.sparse_attention.routes", plan.routes_bytes);
    let sb = b.sharded(prm.num_pages as usize, &partials, &routes);
    for (_, d) in dispatch_attention(ctx, dt, &plan, &sb)? {
        encode(ctx, enc, d).await?;
    }
    Ok(())
}

/// Records a call over a sharded pool into `enc`, with fresh bind groups, through the scratch
/// buffers of `b` (rows are taken in chunks when they are smaller than the call needs).
pub async fn encode_attention_sharded(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &SparseAttentionParams,
    b: &ShardedAttentionBuffers<'_>,
) -> Result<()> {
    let plan = plan_sharded(ctx, prm, b)?;
    for (_, d) in dispatch_attention(ctx, dt, &plan, b)? {
        encode(ctx, enc, d).await?;
    }
    Ok(())
}

/// The plan of `prm` over the shards and scratch buffers of `b` (each used up to one binding).
pub fn plan_sharded(
    ctx: &Context,
    prm: &SparseAttentionParams,
    b: &ShardedAttentionBuffers<'_>,
) -> Result<AttentionPlan> {
    let cap = ctx.binding_capacity();
    let (pc, rc) = (b.partials.size().min(cap), b.routes.size().min(cap));
    plan_attention(ctx, prm, b.shard_pages, pc, rc)
}

/// Records every dispatch of a call over `b` ([`plan_sharded`]) through an orchestrator's bind
/// cache, under the stage names `names` = [route, partial pass, combine] (each dispatch of the
/// partial pass is its own slot).
pub async fn record_attention(
    binds: &mut crate::ops::common::BindCache,
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &SparseAttentionParams,
    b: &ShardedAttentionBuffers<'_>,
    names: [&'static str; 3],
) -> Result<()> {
    let plan = plan_sharded(ctx, prm, b)?;
    for (step, d) in dispatch_attention(ctx, dt, &plan, b)? {
        binds
            .record(ctx, enc, step.stage(names), step.slot, d)
            .await?;
    }
    Ok(())
}
