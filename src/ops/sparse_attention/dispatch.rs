//! How a `sparse_attention` call is cut into workgroups: the shaders' constants and uniform
//! block, the geometry they derive from, the head chunks, channel blocks and token-list splits
//! (flash-decoding), and the llvmpipe loop bound that caps a split.

use super::OP;
use crate::error::{Error, Result};
use crate::ops::common::{check_di, MAX_D};
use crate::paged::PoolLayout;
use crate::tensor::Tensor;

/// Invocations per workgroup and list entries per chunk (`TK` in the WGSL).
pub const LANES: usize = 64;
/// Rows per tile (`TILE`): four per invocation in the score step.
pub const TILE: usize = 256;
/// Rows per round of the V step (`RT`).
pub const ROUND: usize = 32;
/// Channel quads per invocation in the V step.
pub const QUADS_PER_LANE: usize = 2;
/// vec4s of the partial pass's workgroup array (`SHV`): the queries of a head chunk and the
/// weights of one round.
pub const SHARED_QUADS: usize = 864;
/// Most query heads one workgroup serves (four head quads, `4 · HQ`).
pub const MAX_HEADS: usize = 16;
/// Largest head dim E (one workgroup must hold one head's query).
pub const MAX_E: usize = MAX_D;
/// Workgroups a call aims for before it splits token lists: a decode batch of few rows gets
/// enough of them to fill the device (and every core of a CPU adapter).
pub const TARGET_GROUPS: usize = 128;
/// llvmpipe (Mesa's CPU driver, behind lavapipe and its GL) ends every loop of an invocation
/// once 65535 iterations of all its loops have run; the shader would then stop early.
pub const LLVMPIPE_LOOP_LIMIT: u64 = 65535;
/// The share of [`LLVMPIPE_LOOP_LIMIT`] a workgroup may use by [`loop_iterations`]; splits are
/// sized to stay within it.
pub const LLVMPIPE_LOOP_BUDGET: u64 = 60000;

/// Query heads one workgroup serves at head dim `e`: its queries (E rounded up to 8 channels)
/// and a round of weights fit the workgroup array (12 at E = 256, a whole Qwen3.8-Flash-Next
/// group; 16 at E <= 128; 1 at E = 2048). Each gathered K and V row is loaded once per
/// workgroup for all of them. The values' width Ev does not change it (the workgroup array holds
/// queries and weights; accumulators are registers of the V step's channel quads): 15 at NSA's
/// E = 192, Ev = 128.
pub fn heads_per_pass(e: usize) -> usize {
    let e4 = e.div_ceil(8) * 2;
    (1..=MAX_HEADS)
        .rev()
        .find(|&h| h * e4 + ROUND * h.div_ceil(4) <= SHARED_QUADS)
        .unwrap_or(0)
}

/// Token phases of the V step at value width `ev`: groups of 64 / phases invocations, each
/// taking every phases-th row of a round, so that one group's two quads per invocation cover Ev
/// (up to 8 phases; Ev > 512 takes several channel blocks).
pub fn phases(ev: usize) -> usize {
    let e4 = ev.div_ceil(4);
    let mut f = 1;
    while f < 8 && (LANES / (2 * f)) * QUADS_PER_LANE >= e4 {
        f *= 2;
    }
    f
}

/// Loop iterations one invocation of the partial pass runs at most, as llvmpipe counts them (a
/// loop of n iterations costs n + 1), with a margin: the setup, then per tile of the split the
/// copy of its rows, the score loop over E's quad pairs and the rounds of the V step (whose
/// length, rows / phases, follows Ev).
pub fn loop_iterations(p: &SparseAttentionParams) -> u64 {
    let lanes = LANES as u64;
    if p.sg != 0 {
        // The subgroup pass: the query and record loops (under 800 at 16 heads and 8 quads per
        // lane), then per batch of SG tokens 2 · (SG + 1) + 1 iterations: at most 3 per token
        // of the lane's subgroup; each of the dispatch's shards may end on a part batch, and
        // costs two iterations of the shard loops.
        let subs = (p.phases as u64).max(1);
        let shards = super::encode::PASS_SHARDS as u64;
        return 800 + 3 * (p.split_len as u64).div_ceil(subs) + 1 + shards * (3 * p.sg as u64 + 5);
    }
    let e4 = (p.e as u64).div_ceil(4);
    let tiles = (p.split_len as u64).div_ceil(TILE as u64);
    let setup = (p.hc as u64 * (e4 + 1)).div_ceil(lanes) + 1 + 5 + 16;
    let rounds = (TILE / ROUND) as u64;
    let round = ROUND as u64 / p.phases.max(1) as u64 + 2;
    let tile = 1 + (TILE as u64 / lanes + 1) + (e4.div_ceil(2) + 2) + (rounds + 1) + rounds * round;
    setup + tiles * tile + 1
}

/// Loop iterations one invocation of the routing stage runs at most: two passes over the list
/// in chunks of 64, the shard prefix, the clearing of its workgroup arrays, the row lookup.
pub fn route_loop_iterations(p: &SparseAttentionParams) -> u64 {
    2 * ((p.w as u64).div_ceil(LANES as u64) + 1) + p.shards as u64 + 1 + 2 * 5 + 34
}

/// Shape of one call; [`params`] derives the uniform block from it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionGeometry {
    /// Query rows T.
    pub t: usize,
    /// Sequences N.
    pub n: usize,
    /// Query heads H.
    pub h: usize,
    /// Selection groups Hs.
    pub hs: usize,
    /// Token slots per (row, group): the last axis W of `token_indices`.
    pub w: usize,
    /// The main pool; its `num_kv_heads` is Hkv and its `head_dim` is E ([`params`]), or
    /// max(E, Ev) ([`params_kv`]).
    pub layout: PoolLayout,
    pub layer_idx: usize,
    /// Columns of the page table.
    pub max_pages: usize,
    /// `None`: 1 / sqrt(E).
    pub scale: Option<f32>,
    pub has_sinks: bool,
}

/// Uniform parameters of both stages (`shaders/common/attention.wgsl`); layout checked against
/// the WGSL struct by a test. [`params`] gives the whole call over one pool buffer; a plan
/// ([`plan_attention`](super::plan_attention)) derives each dispatch's copy (its rows, its
/// shard).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SparseAttentionParams {
    pub t: u32,
    pub n: u32,
    pub h: u32,
    pub hkv: u32,
    pub hs: u32,
    pub e: u32,
    pub w: u32,
    /// Query heads per workgroup.
    pub hc: u32,
    /// Selection groups that can meet one KV group.
    pub segs: u32,
    /// Head chunks per (KV head, selection group) segment.
    pub chunks: u32,
    /// Channel blocks of the V step, (64 / phases) · 2 quads of Ev each.
    pub cblocks: u32,
    /// Token-list splits per (row, KV head, part).
    pub splits: u32,
    /// List entries per split, a multiple of [`TILE`].
    pub split_len: u32,
    pub page_size: u32,
    pub page_stride: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub k_off: u32,
    pub v_off: u32,
    /// The pool shard of the dispatch (0 starts the partial results, others continue them).
    pub shard: u32,
    /// Pool shards.
    pub shards: u32,
    /// Pages per shard (the last may hold fewer).
    pub shard_pages: u32,
    /// First row of the dispatch.
    pub row_base: u32,
    /// Rows of the dispatch.
    pub rows: u32,
    pub has_sinks: u32,
    pub scale: f32,
    /// Token phases of the V step ([`phases`] of Ev).
    pub phases: u32,
    /// Value and output channels Ev; 0 means E.
    pub ev: u32,
    /// Channels of one pool row per head, max(E, Ev); 0 means E.
    pub dp: u32,
    /// Subgroup size of the subgroup partial pass (`sparse_attention_sg.wgsl`; its subgroups
    /// are the records' phases); 0: the tiled pass.
    pub sg: u32,
    pub _pad1: u32,
}

impl SparseAttentionParams {
    /// Ev (E when `ev` is 0).
    pub fn v_dim(&self) -> u32 {
        if self.ev == 0 {
            self.e
        } else {
            self.ev
        }
    }

    /// Channels of a pool row per head (E when `dp` is 0).
    pub fn pool_dim(&self) -> u32 {
        if self.dp == 0 {
            self.e
        } else {
            self.dp
        }
    }

    /// Workgroups per row of the partial pass, splits aside: Hkv · segments · head chunks ·
    /// channel blocks.
    pub fn parts_per_row(&self) -> u32 {
        self.hkv * self.segs * self.chunks * self.cblocks
    }

    /// Workgroups of the partial pass: rows · parts per row · splits.
    pub fn groups(&self) -> u32 {
        self.rows * self.parts_per_row() * self.splits
    }

    /// Workgroups of the combine: rows · H · blocks of 64 channel quads of Ev.
    pub fn combine_groups(&self) -> u32 {
        self.rows * self.h * self.v_dim().div_ceil(4).div_ceil(LANES as u32)
    }

    /// Head quads the shader keeps in registers (`HQ`).
    pub fn head_quads(&self) -> u32 {
        self.hc.div_ceil(4).max(1)
    }

    /// Sets `splits` and `split_len` in units of `unit` list entries (a multiple of 64:
    /// [`TILE`] where every invocation of a SIMD vector runs every instruction, as on a CPU
    /// adapter, so tiles should be full; 64 on a GPU): enough splits for [`TARGET_GROUPS`]
    /// workgroups, none past the llvmpipe budget.
    pub fn choose_splits(&mut self, unit: usize) {
        self.choose_splits_for(unit, TARGET_GROUPS);
    }

    /// [`Self::choose_splits`] aiming for `target` workgroups.
    pub fn choose_splits_for(&mut self, unit: usize, target: usize) {
        let units = (self.w as usize).div_ceil(unit).max(1);
        let per_row = (self.t.max(1) * self.parts_per_row().max(1)) as usize;
        let want = target.div_ceil(per_row).clamp(1, units);
        let len = units.div_ceil(want).min(self.max_split_len() / unit).max(1);
        self.split_len = (len * unit) as u32;
        self.splits = units.div_ceil(len) as u32;
    }

    /// Longest split (a multiple of 64 entries) within [`LLVMPIPE_LOOP_BUDGET`].
    pub fn max_split_len(&self) -> usize {
        let mut p = *self;
        let mut best = 1;
        let (mut lo, mut hi) = (1usize, 1 << 22);
        while lo <= hi {
            let mid = (lo + hi) / 2;
            p.split_len = (mid * LANES) as u32;
            if loop_iterations(&p) <= LLVMPIPE_LOOP_BUDGET {
                best = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        best * LANES
    }
}

/// Workgroups the subgroup pass aims for on a CPU adapter: one per core (llvmpipe runs a
/// workgroup on one thread and, unless `LP_NUM_THREADS` says otherwise, one thread per core), so
/// that each subgroup walks as many tokens per pool shard as it can and loads and stores its
/// state (every head's accumulators) rarely, and no core waits for another's extra workgroup.
/// On the 2-core CI machine this is 2 (one per KV head of the attention preset): its partial
/// pass took 2.96–3.49 ms against 3.37–4.31 ms with the earlier fixed 4 (f32, alternating
/// runs), and 8 was slower still.
pub fn sg_target_groups_cpu() -> usize {
    crate::gpu::cpu_cores().clamp(1, TARGET_GROUPS)
}

/// Invocations per workgroup of the subgroup pass at subgroup size `sg` (its `TK`; its
/// subgroups are the records' phases): one subgroup on a CPU adapter, where llvmpipe runs a
/// workgroup's subgroups one after another on one thread and each loads the queries and loads
/// and stores its records once per pool shard (the decode attention preset's partial pass
/// took ~0.3 ms of such setup per shard per core with 8 subgroups), else [`LANES`].
pub fn subgroup_pass_invocations(cpu: bool, sg: u32) -> u32 {
    if cpu {
        sg
    } else {
        LANES as u32
    }
}

/// Largest K or V channel quads per lane of the subgroup pass (`QK`, `QV` in its shader).
pub const SG_QUADS: u32 = 8;

/// The subgroup size the subgroup partial pass (`sparse_attention_sg.wgsl`) would run `p` at on
/// an adapter whose subgroups are all `size` lanes, if it applies: the size divides the 64
/// invocations of a workgroup, each lane holds at most [`SG_QUADS`] channel quads of a K row
/// and of a V row, and a part has at most 16 heads.
pub fn subgroup_pass(size: Option<u32>, p: &SparseAttentionParams) -> Option<u32> {
    let sg = size?;
    let fits = |d: u32| d.div_ceil(4).div_ceil(sg) <= SG_QUADS;
    ((4..=LANES as u32).contains(&sg)
        && (LANES as u32).is_multiple_of(sg)
        && fits(p.e)
        && fits(p.v_dim())
        && p.hc <= MAX_HEADS as u32)
        .then_some(sg)
}

/// The uniform block of a call over one pool buffer, with the rules the shaders rely on: Hkv
/// and Hs divide H, E ≤ [`MAX_E`], and every element index fits in u32. It picks the head
/// chunks (at most [`heads_per_pass`] heads, balanced), the channel blocks and the splits.
/// Queries, keys, values and the output all have the pool's `head_dim` channels.
pub fn params(g: &AttentionGeometry) -> Result<SparseAttentionParams> {
    params_kv(g, g.layout.head_dim, g.layout.head_dim)
}

/// [`params`] for queries and keys of `e` channels and values (and the output) of `ev`
/// channels, read from a pool whose `head_dim` is max(E, Ev): K in the first E channels of its
/// row, V in the first Ev (NSA's Dqk = 192, Dv = 128; MLA-style caches).
pub fn params_kv(g: &AttentionGeometry, e: usize, ev: usize) -> Result<SparseAttentionParams> {
    let l = g.layout;
    let (h, hkv, hs) = (g.h, l.num_kv_heads, g.hs);
    check_di(OP, "query", e)?;
    check_di(OP, "v_head_dim", ev)?;
    if e.max(ev) != l.head_dim {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("head_dim {} must be max(E = {e}, Ev = {ev})", l.head_dim),
        ));
    }
    if h == 0 || hkv == 0 || hs == 0 || h % hkv != 0 || h % hs != 0 {
        return Err(Error::input(
            OP,
            "query",
            format!("H = {h} must be a multiple of Hkv = {hkv} and of Hs = {hs}"),
        ));
    }
    let fits = |name: &str, elems: usize| -> Result<u32> {
        u32::try_from(elems)
            .map_err(|_| Error::input(OP, name, format!("{elems} elements exceed u32 addressing")))
    };
    fits("kv_blocks", l.required_elems())?;
    fits("query", g.t * h * e.max(ev))?;
    fits("token_indices", g.t * hs * g.w)?;
    fits("page_table", 2 * g.n + 1 + g.n * g.max_pages)?;
    // A segment: the heads of one KV group that share one selection group (one token list).
    let (gsz, ssz) = (h / hkv, h / hs);
    let (mut segs, mut longest) = (1, 1);
    for kh in 0..hkv {
        let (g0, g1) = (kh * gsz / ssz, ((kh + 1) * gsz - 1) / ssz);
        segs = segs.max(g1 - g0 + 1);
        for sel in g0..=g1 {
            let len = ((kh + 1) * gsz).min((sel + 1) * ssz) - (kh * gsz).max(sel * ssz);
            longest = longest.max(len);
        }
    }
    let chunks = longest.div_ceil(heads_per_pass(e));
    let mut p = SparseAttentionParams {
        t: g.t as u32,
        n: g.n as u32,
        h: h as u32,
        hkv: hkv as u32,
        hs: hs as u32,
        e: e as u32,
        w: g.w as u32,
        hc: longest.div_ceil(chunks) as u32,
        segs: segs as u32,
        chunks: chunks as u32,
        cblocks: ev.div_ceil(4).div_ceil(LANES / phases(ev) * QUADS_PER_LANE) as u32,
        page_size: l.page_size as u32,
        page_stride: l.page_stride as u32,
        num_pages: l.num_pages as u32,
        max_pages: g.max_pages as u32,
        k_off: l.offset(0, 0, g.layer_idx, 0, 0) as u32,
        v_off: l.offset(0, 1, g.layer_idx, 0, 0) as u32,
        shard: 0,
        shards: 1,
        shard_pages: l.num_pages.max(1) as u32,
        row_base: 0,
        rows: g.t as u32,
        has_sinks: g.has_sinks as u32,
        scale: g.scale.unwrap_or(1.0 / (e as f32).sqrt()),
        phases: phases(ev) as u32,
        ev: ev as u32,
        dp: l.head_dim as u32,
        ..Default::default()
    };
    p.choose_splits(LANES);
    let groups = g.t * p.parts_per_row() as usize * p.splits as usize;
    fits(
        "query",
        groups.max(g.t * h * ev.div_ceil(4).div_ceil(LANES)),
    )?;
    Ok(p)
}

/// The `seqs` buffer image: `row_offsets [N+1]`, then `cache_lengths [N]`, then the page table
/// `[N, max_pages]`, all u32.
pub fn pack_seqs(offsets: &[u32], cache: &[u32], table: &[u32]) -> Tensor {
    let v: Vec<u32> = offsets.iter().chain(cache).chain(table).copied().collect();
    Tensor::from_u32(&[v.len()], &v)
}
