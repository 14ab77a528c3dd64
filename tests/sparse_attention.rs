//! sparse_attention: GPU against the CPU reference for f32/f16/bf16 — Qwen3.8-Flash-Next's GQA
//! shape at the full 2051-token width, MHA, Hs > 1 splitting KV groups, groups that take several
//! passes, odd E and W, ragged batches mixing prefill and decode rows, multi-layer strided pools
//! with shuffled pages whose unused memory is garbage; sinks; empty rows; a hand-checked case;
//! values narrower or wider than keys (`v_head_dim`, NSA's Dqk = 192 / Dv = 128).
//! Through the device entry points: token-list splits and their boundaries, a pool in shards of
//! whole pages (tokens spread over them, a bad page flagged), sinks merged after the splits,
//! head chunks and channel blocks, values of their own width over shards and splits. Where the
//! adapter has fixed-size subgroups (lavapipe) the partial pass is the subgroup variant; a
//! second context with subgroups disabled runs the tiled pass on the same problems.

mod util;

use qsa_wgpu::gpu::{Context, GpuTensor, Readback};
use qsa_wgpu::ops::sparse_attention::{
    cpu, dispatch_attention, encode_attention, encode_attention_sharded, gpu, heads_per_pass,
    pack_seqs, params_kv, plan_attention, route_subgroup_pass, scratch_buffer, subgroup_rows_full,
    subgroup_slots, subgroup_words, validate, AttentionBuffers, AttentionPlan,
    ShardedAttentionBuffers, SparseAttentionAttrs, SparseAttentionInputs, SparseAttentionParams,
    PASS_SHARDS, ROUTE, ROUTE_SG, SG_QUADS, SUBGROUP_PASS, SUBGROUP_PASS_W32,
};
use qsa_wgpu::paged::{PagedPool, PoolLayout};
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};
use std::sync::Arc;

/// Geometry of one problem.
#[derive(Clone, Copy, Debug)]
struct Shape {
    h: usize,
    hkv: usize,
    hs: usize,
    e: usize,
    w: usize,
    page: usize,
    layers: usize,
    layer: usize,
    /// Pages `stride_mul` packed pages apart.
    stride_mul: usize,
    /// Value channels Ev; the pool's head_dim is max(E, Ev), the rest of each row garbage.
    ev: usize,
}

impl Shape {
    /// Channels of a pool row per head.
    fn dp(&self) -> usize {
        self.e.max(self.ev)
    }
}

fn shape(h: usize, hkv: usize, hs: usize, e: usize, w: usize) -> Shape {
    Shape {
        h,
        hkv,
        hs,
        e,
        w,
        page: 16,
        layers: 1,
        layer: 0,
        stride_mul: 1,
        ev: e,
    }
}

/// Logical content of a call: queries, each sequence's K and V rows, token lists, sinks.
struct Data {
    seqs: Vec<(usize, usize)>,
    q: Vec<f32>,
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    tokens: Vec<i32>,
    counts: Vec<i32>,
    sinks: Option<Vec<f32>>,
}

/// `seqs` holds (cached, new rows) per sequence. Each (row, group) gathers a random subset of
/// 0 ..= p in random order (often the full W); the slots past its count hold junk.
fn data(rng: &mut Rng, s: &Shape, seqs: &[(usize, usize)], sinks: bool) -> Data {
    let rows: usize = seqs.iter().map(|x| x.1).sum();
    let width = s.hkv * s.dp();
    let kv = seqs
        .iter()
        .map(|&(c, r)| (rng.normals((c + r) * width), rng.normals((c + r) * width)))
        .collect();
    let mut tokens = vec![0i32; rows * s.hs * s.w];
    let mut counts = vec![0i32; rows * s.hs];
    let mut t = 0;
    for &(c, r) in seqs {
        for p in c..c + r {
            for g in 0..s.hs {
                let most = s.w.min(p + 1);
                let cnt = if rng.below(2) == 0 {
                    most
                } else {
                    rng.below(most + 1)
                };
                let perm = rng.permutation(p + 1);
                let row = &mut tokens[(t * s.hs + g) * s.w..][..s.w];
                for (j, slot) in row.iter_mut().enumerate() {
                    *slot = if j < cnt {
                        perm[j] as i32
                    } else {
                        [-1, i32::MAX, (p + 1 + rng.below(99)) as i32][rng.below(3)]
                    };
                }
                counts[t * s.hs + g] = cnt as i32;
            }
            t += 1;
        }
    }
    let sinks = sinks.then(|| {
        let mut v: Vec<f32> = (0..s.h).map(|_| 2.0 * rng.normal()).collect();
        v[0] = f32::NEG_INFINITY;
        v
    });
    Data {
        seqs: seqs.to_vec(),
        q: rng.normals(rows * s.h * s.e),
        kv,
        tokens,
        counts,
        sinks,
    }
}

/// One call's tensors.
struct Problem {
    query: Tensor,
    pool: Tensor,
    table: Tensor,
    offsets: Tensor,
    cache: Tensor,
    tokens: Tensor,
    counts: Tensor,
    sinks: Option<Tensor>,
    attrs: SparseAttentionAttrs,
}

impl Problem {
    fn inputs(&self) -> SparseAttentionInputs<'_> {
        SparseAttentionInputs {
            query: &self.query,
            kv_blocks: &self.pool,
            page_table: &self.table,
            row_offsets: &self.offsets,
            cache_lengths: &self.cache,
            token_indices: &self.tokens,
            token_count: &self.counts,
            sinks: self.sinks.as_ref(),
        }
    }
}

/// Lays `d` out in a garbage-filled pool whose pages are handed out in `order` (a permutation
/// of `pages(s, d)`), `s.stride_mul` packed pages apart.
fn problem(rng: &mut Rng, dt: DType, s: &Shape, d: &Data, order: Vec<u32>) -> Problem {
    problem_in(rng, dt, s, d, order, None)
}

/// [`problem`] whose pool garbage (every element no sequence wrote) is `fill` where given,
/// random otherwise.
fn problem_in(
    rng: &mut Rng,
    dt: DType,
    s: &Shape,
    d: &Data,
    order: Vec<u32>,
    fill: Option<f32>,
) -> Problem {
    let np = order.len();
    let layout = PoolLayout::packed(np, s.layers, s.page, s.hkv, s.dp());
    let mut pool = PagedPool::new(layout, dt, order);
    let n = layout.required_elems();
    pool.data = match fill {
        Some(v) => Tensor::from_f32(dt, &[n], &vec![v; n]),
        None => rng.tensor(dt, &[n]),
    };
    let mut ids = Vec::new();
    for (k, v) in &d.kv {
        let id = pool.add_sequence();
        pool.append(id, 0, s.layer, k).unwrap();
        pool.append(id, 1, s.layer, v).unwrap();
        pool.commit(id, k.len() / (s.hkv * s.dp()));
        ids.push(id);
    }
    let max_pages = d
        .seqs
        .iter()
        .map(|x| (x.0 + x.1).div_ceil(s.page))
        .max()
        .unwrap()
        + 1;
    let pe = layout.page_elems();
    let mut pool_t = pool.tensor();
    if s.stride_mul > 1 {
        let mut strided = rng.tensor(dt, &[np * s.stride_mul * pe]);
        let es = dt.size();
        for i in 0..np {
            let dst = i * s.stride_mul * pe * es;
            strided.data[dst..dst + pe * es]
                .copy_from_slice(&pool_t.data[i * pe * es..][..pe * es]);
        }
        strided.shape = vec![np * s.stride_mul, 2, s.layers, s.page, s.hkv, s.dp()];
        pool_t = strided;
    }
    let rows: usize = d.seqs.iter().map(|x| x.1).sum();
    let mut offs = vec![0u32];
    for x in &d.seqs {
        offs.push(offs.last().unwrap() + x.1 as u32);
    }
    let cache: Vec<u32> = d.seqs.iter().map(|x| x.0 as u32).collect();
    Problem {
        query: Tensor::from_f32(dt, &[rows, s.h, s.e], &d.q),
        pool: pool_t,
        table: pool.page_table(&ids, max_pages, 0xdead_beef),
        offsets: Tensor::from_u32(&[offs.len()], &offs),
        cache: Tensor::from_u32(&[cache.len()], &cache),
        tokens: Tensor::from_i32(&[rows, s.hs, s.w], &d.tokens),
        counts: Tensor::from_i32(&[rows, s.hs], &d.counts),
        sinks: d
            .sinks
            .as_ref()
            .map(|v| Tensor::from_f32(DType::F32, &[s.h], v)),
        attrs: SparseAttentionAttrs {
            scale: None,
            layer_idx: s.layer,
            page_stride: (s.stride_mul > 1).then_some((s.stride_mul * pe) as i64),
            v_head_dim: (s.ev != s.e).then_some(s.ev),
        },
    }
}

fn pages(s: &Shape, d: &Data) -> usize {
    d.seqs
        .iter()
        .map(|x| (x.0 + x.1).div_ceil(s.page))
        .sum::<usize>()
        + 3
}

/// Builds a problem with shuffled pages and checks GPU against CPU.
fn check(rng: &mut Rng, dt: DType, s: &Shape, seqs: &[(usize, usize)], sinks: bool) {
    let d = data(rng, s, seqs, sinks);
    let order = rng.permutation(pages(s, &d));
    let p = problem(rng, dt, s, &d, order);
    let want = cpu(&p.inputs(), &p.attrs).unwrap();
    let got = pollster::block_on(gpu(&util::ctx(), &p.inputs(), &p.attrs)).unwrap();
    compare(&got, &want, attention_tol(dt))
        .unwrap_or_else(|e| panic!("{dt} {s:?} seqs={seqs:?} sinks={sinks}: {e}"));
}

#[test]
fn qwen_gqa_full_width() {
    // H = 24, Hkv = 2, E = 256, Hs = 1, W = k·r + r − 1 = 2051: decode rows past 2051 tokens
    // (the list is full), a prefill chunk from 0, a two-row chunk deep into a sequence.
    let mut rng = Rng::new(71);
    assert_eq!(heads_per_pass(256), 12, "a Qwen group must take one pass");
    let s = shape(24, 2, 1, 256, 2051);
    for (dt, sinks) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::F16, true),
        (DType::BF16, false),
    ] {
        check(&mut rng, dt, &s, &[(2100, 1), (0, 5), (3000, 2)], sinks);
    }
}

#[test]
fn shapes_gpu_matches_cpu() {
    let mut rng = Rng::new(5);
    let dts = [DType::F32, DType::F16, DType::BF16];
    let mut shapes = vec![
        shape(8, 8, 1, 64, 130),   // MHA
        shape(24, 2, 3, 128, 67),  // Hs = 3: each KV group meets two selection groups
        shape(16, 4, 2, 72, 35),   // selection group of two KV heads, E not a multiple of 64
        shape(12, 3, 2, 66, 9),    // KV head 1 straddles both selection groups; E % 4 = 2
        shape(64, 1, 4, 256, 100), // 16 heads per segment: passes of 12 + 4
        shape(64, 2, 1, 128, 77),  // 32 heads per segment: passes of 16 + 16
        shape(4, 2, 2, 3, 5),      // tiny E
        shape(6, 2, 1, 520, 40),   // three channel quads per invocation, a 3-head pass
        shape(10, 1, 2, 300, 50),  // passes of 5 heads: a padded head quad
    ];
    shapes.push(Shape {
        layers: 3,
        layer: 2,
        stride_mul: 2,
        page: 7,
        ..shape(6, 2, 3, 40, 70)
    });
    for (i, s) in shapes.iter().enumerate() {
        for (j, dt) in dts.iter().enumerate() {
            let seqs = [
                (rng.below(300), 1),
                (0, 17),
                (50 + rng.below(200), 4),
                (31, 0),
                (rng.below(90), 1),
            ];
            check(&mut rng, *dt, s, &seqs, (i + j) % 2 == 0);
        }
    }
}

#[test]
fn shuffled_pages_give_identical_output() {
    let ctx = util::ctx();
    let mut rng = Rng::new(9);
    let s = shape(12, 2, 2, 64, 90);
    let d = data(&mut rng, &s, &[(70, 3), (0, 20), (200, 1)], true);
    let n = pages(&s, &d);
    let a = problem(&mut rng, DType::BF16, &s, &d, (0..n as u32).collect());
    let order = rng.permutation(n);
    let b = problem(&mut rng, DType::BF16, &s, &d, order);
    assert_ne!(a.table, b.table);
    let ga = pollster::block_on(gpu(&ctx, &a.inputs(), &a.attrs)).unwrap();
    let gb = pollster::block_on(gpu(&ctx, &b.inputs(), &b.attrs)).unwrap();
    assert_eq!(ga, gb, "page order changed the GPU result");
    let (ca, cb) = (
        cpu(&a.inputs(), &a.attrs).unwrap(),
        cpu(&b.inputs(), &b.attrs).unwrap(),
    );
    assert_eq!(ca, cb, "page order changed the CPU result");
    compare(&ga, &ca, attention_tol(DType::BF16)).unwrap();
}

#[test]
fn empty_rows_are_zero() {
    let ctx = util::ctx();
    let mut rng = Rng::new(10);
    let s = shape(8, 2, 2, 40, 11);
    for sinks in [false, true] {
        let mut d = data(&mut rng, &s, &[(5, 2), (0, 3)], sinks);
        d.counts.iter_mut().for_each(|c| *c = 0);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, DType::F16, &s, &d, order);
        let zero = Tensor::zeros(DType::F16, &[5, 8, 40]);
        assert_eq!(cpu(&p.inputs(), &p.attrs).unwrap(), zero);
        let got = pollster::block_on(gpu(&ctx, &p.inputs(), &p.attrs)).unwrap();
        assert_eq!(got.to_f32(), zero.to_f32(), "sinks={sinks}");
    }
}

/// The fixed inputs of the by-hand cases: one sequence of two tokens (one page), one query row
/// at position 1 whose list is `tokens` (two counted, W = 3), scale 1.
struct Hand {
    table: Tensor,
    offs: Tensor,
    cache: Tensor,
    tok: Tensor,
    cnt: Tensor,
}

impl Hand {
    fn new(tokens: [i32; 3]) -> Hand {
        Hand {
            table: Tensor::from_u32(&[1, 1], &[0]),
            offs: Tensor::from_u32(&[2], &[0, 1]),
            cache: Tensor::from_u32(&[1], &[1]),
            tok: Tensor::from_i32(&[1, 1, 3], &tokens),
            cnt: Tensor::from_i32(&[1, 1], &[2]),
        }
    }

    fn inputs<'a>(
        &'a self,
        query: &'a Tensor,
        kv_blocks: &'a Tensor,
        sinks: Option<&'a Tensor>,
    ) -> SparseAttentionInputs<'a> {
        SparseAttentionInputs {
            query,
            kv_blocks,
            page_table: &self.table,
            row_offsets: &self.offs,
            cache_lengths: &self.cache,
            token_indices: &self.tok,
            token_count: &self.cnt,
            sinks,
        }
    }

    fn attrs() -> SparseAttentionAttrs {
        SparseAttentionAttrs {
            scale: Some(1.0),
            layer_idx: 0,
            page_stride: None,
            v_head_dim: None,
        }
    }
}

#[test]
fn by_hand() {
    // One head, E = 2, scale 1, tokens [1, 0] of position 1: q·K = [0, 1] for tokens 1, 0.
    // Without a sink out = (e·V0 + V1) / (e + 1); with sink 0 the denominator gains e^0 = 1.
    let q = Tensor::from_f32(DType::F32, &[1, 1, 2], &[1.0, 0.0]);
    // Pool [1 page, 2 planes, 1 layer, 2 rows, 1 head, 2]: K0 = (1, 0), K1 = (0, 5); V0 = (1, 2),
    // V1 = (3, 4).
    let pool = Tensor::from_f32(
        DType::F32,
        &[1, 2, 1, 2, 1, 2],
        &[1.0, 0.0, 0.0, 5.0, 1.0, 2.0, 3.0, 4.0],
    );
    let hand = Hand::new([1, 0, -1]);
    let sink = Tensor::from_f32(DType::F32, &[1], &[0.0]);
    let a = Hand::attrs();
    let e = std::f32::consts::E;
    for (sinks, extra) in [(None, 0.0), (Some(&sink), 1.0)] {
        let x = hand.inputs(&q, &pool, sinks);
        let den = e + 1.0 + extra;
        let want = [(e + 3.0) / den, (2.0 * e + 4.0) / den];
        let c = cpu(&x, &a).unwrap().to_f32();
        let g = pollster::block_on(gpu(&util::ctx(), &x, &a))
            .unwrap()
            .to_f32();
        for i in 0..2 {
            assert!((c[i] - want[i]).abs() < 1e-6, "cpu {c:?} want {want:?}");
            assert!((g[i] - want[i]).abs() < 1e-6, "gpu {g:?} want {want:?}");
        }
    }
}

/// What one device run changes from the problem's own call.
#[derive(Default)]
struct Run {
    /// Pool shards of this many pages (`None`: one buffer).
    shard_pages: Option<usize>,
    /// Splits of this many list entries (`None`: the planned ones).
    split_len: Option<u32>,
    /// An edit of the `seqs` image (device data past the host checks).
    seqs: Option<fn(&mut Vec<u32>)>,
    /// The context (`None`: `util::ctx()`).
    ctx: Option<Arc<Context>>,
}

/// A problem's call on the device: its uploaded inputs (the `seqs` image edited by `run.seqs`;
/// the token lists and counts `lists` where given, device data past the host checks), its
/// output (0xff bytes) and flag word, and the uniform block (`run.split_len` applied).
struct Uploaded {
    dt: DType,
    layout: PoolLayout,
    shape: Vec<usize>,
    prm: SparseAttentionParams,
    query: GpuTensor,
    seqs: GpuTensor,
    tokens: GpuTensor,
    counts: GpuTensor,
    sinks: Option<GpuTensor>,
    out: GpuTensor,
    flags: GpuTensor,
}

impl Uploaded {
    /// The call's buffers over `pool` in one buffer.
    fn buffers<'a>(&'a self, pool: &'a wgpu::Buffer) -> AttentionBuffers<'a> {
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

fn upload(ctx: &Context, p: &Problem, run: &Run, lists: Option<(&Tensor, &Tensor)>) -> Uploaded {
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
struct Shards {
    sp: usize,
    pool: Vec<GpuTensor>,
    plan: AttentionPlan,
    partials: wgpu::Buffer,
    routes: wgpu::Buffer,
}

impl Shards {
    fn new(ctx: &Context, p: &Problem, u: &Uploaded, sp: usize) -> Self {
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

    fn buffers<'a>(&'a self, u: &'a Uploaded) -> ShardedAttentionBuffers<'a> {
        ShardedAttentionBuffers {
            pool: self.pool.iter().map(|s| &s.buffer).collect(),
            ..u.buffers(&self.pool[0].buffer)
                .sharded(self.sp, &self.partials, &self.routes)
        }
    }
}

/// The flag word from its readback bytes.
fn flag_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

/// Runs `p` through `encode_attention` / `encode_attention_sharded`; returns the output and the
/// flag word.
fn run_device(p: &Problem, run: &Run) -> (Tensor, u32) {
    let ctx = run.ctx.clone().unwrap_or_else(util::ctx);
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
fn set_count(rng: &mut Rng, s: &Shape, d: &mut Data, row: usize, p: usize, count: usize) {
    for g in 0..s.hs {
        let perm = rng.permutation(p + 1);
        let r = &mut d.tokens[(row * s.hs + g) * s.w..][..s.w];
        for (j, slot) in r.iter_mut().enumerate() {
            *slot = if j < count { perm[j] as i32 } else { -1 };
        }
        d.counts[row * s.hs + g] = count as i32;
    }
}

#[test]
fn splits_and_their_boundaries() {
    // Counts on both sides of every split boundary (splits of 256 entries), 0 and 1, and W;
    // then the planned splits at Qwen's width.
    let mut rng = Rng::new(31);
    let s = shape(8, 2, 1, 64, 700);
    let counts = [0, 1, 63, 64, 255, 256, 257, 511, 512, 513, 699, 700];
    let seqs = [(800, counts.len())];
    for dt in [DType::F32, DType::BF16] {
        let mut d = data(&mut rng, &s, &seqs, dt == DType::BF16);
        for (row, &c) in counts.iter().enumerate() {
            set_count(&mut rng, &s, &mut d, row, 800 + row, c);
        }
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [Some(256), Some(512), None] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} splits of {split_len:?}: {e}"));
        }
    }
    let s = shape(24, 2, 1, 256, 2051);
    let d = data(&mut rng, &s, &[(4000, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let p = problem(&mut rng, DType::BF16, &s, &d, order);
    let (got, _) = run_device(&p, &Run::default());
    compare(
        &got,
        &cpu(&p.inputs(), &p.attrs).unwrap(),
        attention_tol(DType::BF16),
    )
    .unwrap();
}

#[test]
fn long_lists_stay_within_the_loop_limit() {
    // One split of 5000 tokens for 12 and 15 heads per KV head at E = 192 (three and four head
    // quads per lane; 15 is heads_per_pass(192)). The subgroup pass once ran its subgroup sums
    // and maxima as loops, which llvmpipe counts toward its 65535 loop iterations per
    // invocation; past about 3000 tokens at four head quads it stopped early and gave a wrong
    // output on lavapipe (the loop model counted neither). Written out, they are no loop at all.
    let mut rng = Rng::new(5000);
    assert_eq!(heads_per_pass(192), 15);
    for h in [48, 60] {
        let s = Shape {
            ev: 128,
            ..shape(h, 4, 1, 192, 5000)
        };
        let mut d = data(&mut rng, &s, &[(5000, 1)], false);
        set_count(&mut rng, &s, &mut d, 0, 5000, 5000);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, DType::F32, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [Some(5056), None] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(DType::F32))
                .unwrap_or_else(|e| panic!("H = {h}, splits of {split_len:?}: {e}"));
        }
    }
}

#[test]
fn sharded_pool_matches_one_buffer() {
    // Pages shuffled over the pool, so each row's tokens spread over the shards; up to 45
    // shards, shards that do not divide the pool, a strided multi-layer pool. Through the
    // context's partial pass, and through the subgroup pass in 16-byte words and the tiled pass
    // (each dispatch of the subgroup pass takes up to four shards, the tiled pass one).
    let narrow = util::narrow_ctx();
    let tiled = util::portable_ctx();
    let mut counts = Vec::new();
    let mut rng = Rng::new(32);
    let strided = Shape {
        layers: 2,
        layer: 1,
        stride_mul: 2,
        page: 8,
        ..shape(6, 2, 3, 40, 90)
    };
    for (dt, s) in [
        (DType::F32, shape(8, 2, 2, 64, 300)),
        (DType::F16, strided),
        (DType::BF16, shape(24, 2, 1, 256, 520)),
    ] {
        let d = data(&mut rng, &s, &[(400, 2), (0, 30), (250, 1)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        let (one, f) = run_device(&p, &Run::default());
        assert_eq!(f, 0);
        compare(&one, &want, attention_tol(dt)).unwrap();
        for sp in [2, 3, 7, 20] {
            for split_len in [None, Some(256)] {
                let run = Run {
                    shard_pages: Some(sp),
                    split_len,
                    ..Default::default()
                };
                let (got, f) = run_device(&p, &run);
                assert_eq!(f, 0, "{dt} shards of {sp}");
                compare(&got, &want, attention_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} {s:?} shards of {sp}: {e}"));
                compare(&got, &one, attention_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} shards of {sp} vs one buffer: {e}"));
            }
            for c in [&narrow, &tiled] {
                let run = Run {
                    shard_pages: Some(sp),
                    ctx: Some(c.clone()),
                    ..Default::default()
                };
                let (got, f) = run_device(&p, &run);
                let sub = c.caps.subgroup_size;
                assert_eq!(f, 0, "{dt} shards of {sp}, subgroups {sub:?}");
                compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| {
                    panic!("{dt} {s:?} shards of {sp}, subgroups {sub:?}: {e}")
                });
            }
        }
        // The partial dispatches: the subgroup pass takes the shards four at a time, the tiled
        // pass one at a time (some pools with a last dispatch of fewer than four).
        let prm = {
            let v = validate(&p.inputs(), &p.attrs).unwrap();
            params_kv(&v.geo, v.e, v.ev).unwrap()
        };
        for c in [util::ctx(), narrow.clone(), tiled.clone()] {
            for sp in [2, 3, 7, 20] {
                let plan = plan_attention(&c, &prm, sp, 1 << 26, 1 << 26).unwrap();
                let shards = (prm.num_pages as usize).div_ceil(sp);
                let starts: Vec<usize> = plan
                    .steps
                    .iter()
                    .filter(|st| st.shader == "sparse_attention")
                    .map(|st| st.shard)
                    .collect();
                let step = if plan.steps[0].params.sg != 0 {
                    PASS_SHARDS
                } else {
                    1
                };
                let want: Vec<usize> = (0..shards).step_by(step).collect();
                assert_eq!(starts, want, "{dt} shards of {sp}");
                counts.push(shards);
            }
        }
    }
    assert!(
        counts
            .iter()
            .any(|&n| n > PASS_SHARDS && n % PASS_SHARDS != 0),
        "{counts:?}"
    );
    assert!(counts.iter().any(|&n| n < PASS_SHARDS), "{counts:?}");
}

#[test]
fn sharded_pool_flags_a_bad_page() {
    let mut rng = Rng::new(33);
    let s = shape(4, 1, 1, 32, 200);
    let d = data(&mut rng, &s, &[(300, 2)], false);
    let np = pages(&s, &d);
    let order = rng.permutation(np);
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    // seqs = [row_offsets (2) | cache_lengths (1) | table]: column 0 of the table past the pool.
    let run = Run {
        shard_pages: Some(4),
        seqs: Some(|v| v[3] = 1 << 20),
        ..Default::default()
    };
    let (got, f) = run_device(&p, &run);
    assert_eq!(f, 8, "flags {f:#x}");
    assert!(
        got.to_f32().iter().all(|v| v.is_finite()),
        "an output was left unwritten"
    );
}

#[test]
fn sinks_are_merged_after_the_splits() {
    // Sinks −inf, far above and far below every score, 0, with lists over several splits,
    // an empty row and a one-token row.
    let mut rng = Rng::new(34);
    let s = shape(8, 2, 2, 48, 600);
    let mut d = data(&mut rng, &s, &[(700, 4)], true);
    d.sinks = Some(vec![
        f32::NEG_INFINITY,
        60.0,
        -60.0,
        0.0,
        3.0,
        f32::NEG_INFINITY,
        30.0,
        -2.0,
    ]);
    set_count(&mut rng, &s, &mut d, 1, 701, 0);
    set_count(&mut rng, &s, &mut d, 2, 702, 1);
    set_count(&mut rng, &s, &mut d, 3, 703, 600);
    for dt in [DType::F32, DType::F16] {
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for run in [
            Run::default(),
            Run {
                split_len: Some(256),
                shard_pages: Some(5),
                ..Default::default()
            },
        ] {
            let (got, _) = run_device(&p, &run);
            compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| panic!("{dt}: {e}"));
            // The empty row is 0 for every head, sink or not.
            let row = &got.to_f32()[8 * 48..2 * 8 * 48];
            assert!(row.iter().all(|&v| v == 0.0), "{dt}: empty row {row:?}");
        }
    }
}

#[test]
fn head_chunks_and_channel_blocks() {
    // 40 heads in one group (four chunks of ten), 20 heads per segment with Hs = 2, and
    // E = 1032 (three channel blocks of the V step), over several splits.
    let mut rng = Rng::new(35);
    for (dt, s) in [
        (DType::F32, shape(40, 1, 1, 256, 600)),
        (DType::BF16, shape(40, 1, 2, 128, 300)),
        (DType::F16, shape(6, 2, 1, 1032, 300)),
    ] {
        let d = data(&mut rng, &s, &[(620, 2), (0, 3)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [None, Some(256)] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} {s:?} splits {split_len:?}: {e}"));
        }
    }
}

#[test]
fn value_width_differs_from_key_width() {
    // NSA's selected branch (H = 64, Hkv = Hs = 4, Dqk = 192, Dv = 128: 15 heads at most per
    // workgroup, so two chunks of 8 per KV head), values wider than keys, several quads per lane on either side, and a strided
    // multi-layer pool. The channels past E in K rows and past Ev in V rows are garbage.
    let mut rng = Rng::new(192);
    assert_eq!(heads_per_pass(192), 15);
    let nsa = Shape {
        ev: 128,
        ..shape(64, 4, 4, 192, 300)
    };
    let shapes = [
        nsa,
        Shape {
            ev: 72,
            ..shape(6, 2, 3, 40, 70)
        },
        Shape {
            ev: 300,
            ..shape(8, 2, 1, 24, 33)
        },
        Shape {
            ev: 5,
            layers: 2,
            layer: 1,
            stride_mul: 2,
            page: 7,
            ..shape(12, 3, 2, 66, 19)
        },
    ];
    let dts = [DType::BF16, DType::F32, DType::F16];
    for (i, s) in shapes.iter().enumerate() {
        let dt = dts[i % 3];
        check(&mut rng, dt, s, &[(700, 1), (0, 9), (90, 4)], i % 2 == 1);
    }
    // The output has Ev channels; a pool whose head_dim is not max(E, Ev) is refused.
    let s = Shape {
        ev: 40,
        ..shape(4, 2, 2, 24, 8)
    };
    let d = data(&mut rng, &s, &[(10, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let mut p = problem(&mut rng, DType::F32, &s, &d, order);
    assert_eq!(cpu(&p.inputs(), &p.attrs).unwrap().shape, vec![2, 4, 40]);
    for bad in [Some(8), Some(32), None] {
        p.attrs.v_head_dim = bad;
        let e = cpu(&p.inputs(), &p.attrs).unwrap_err().to_string();
        assert!(e.contains("kv_blocks") && e.contains("head_dim"), "{e}");
    }
}

#[test]
fn value_width_over_shards_and_splits() {
    // Values of their own width through the device entry points: NSA's selected branch at its
    // full width W = k·l' = 1024 (H = 64, Hkv = Hs = 4, E = 192, Ev = 128: chunks of 8 heads,
    // four phases), values wider than keys with two channel blocks (Ev = 1032 > 512), odd Ev,
    // a strided multi-layer pool; pools in shards, lists in several splits.
    let mut rng = Rng::new(193);
    let shapes = [
        (
            DType::BF16,
            Shape {
                ev: 128,
                ..shape(64, 4, 4, 192, 1024)
            },
        ),
        (
            DType::F32,
            Shape {
                ev: 1032,
                ..shape(6, 2, 1, 40, 300)
            },
        ),
        (
            DType::F16,
            Shape {
                ev: 9,
                layers: 2,
                layer: 1,
                stride_mul: 2,
                page: 8,
                ..shape(12, 3, 2, 66, 290)
            },
        ),
    ];
    for (dt, s) in shapes {
        let d = data(&mut rng, &s, &[(1100, 1), (300, 2)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        assert_eq!(want.shape, vec![3, s.h, s.ev]);
        for run in [
            Run::default(),
            Run {
                shard_pages: Some(7),
                split_len: Some(256),
                ..Default::default()
            },
        ] {
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0, "{dt} {s:?}");
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} {s:?} shards {:?}: {e}", run.shard_pages));
        }
    }
}

#[test]
fn value_width_refused_by_the_device_entry_points() {
    // params_kv takes only a pool whose head_dim is max(E, Ev); a uniform block whose pool rows
    // cannot hold E or Ev channels, or a pool buffer too small for its Dp-channel rows, is
    // refused before anything is recorded.
    let ctx = util::ctx();
    let mut rng = Rng::new(194);
    let s = Shape {
        ev: 40,
        ..shape(4, 2, 2, 24, 8)
    };
    let d = data(&mut rng, &s, &[(10, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    let x = p.inputs();
    let plan = validate(&x, &p.attrs).unwrap();
    for (e, ev) in [(24, 24), (24, 32), (48, 40), (24, 48)] {
        let err = params_kv(&plan.geo, e, ev).unwrap_err().to_string();
        assert!(err.contains("head_dim"), "E = {e}, Ev = {ev}: {err}");
    }
    let prm = params_kv(&plan.geo, 24, 40).unwrap();
    assert_eq!((prm.e, prm.v_dim(), prm.pool_dim()), (24, 40, 40));
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let query = up(x.query);
    let seqs = up(&pack_seqs(&plan.offsets, &plan.cache, &plan.table));
    let (tokens, counts) = (up(x.token_indices), up(x.token_count));
    let out = GpuTensor::filled(&ctx, "out", DType::F32, &[2, 4, 40], 0).unwrap();
    let flags = up(&Tensor::from_u32(&[1], &[0]));
    let whole = up(x.kv_blocks);
    // The same pool cut to rows of E channels: too small for Dp = 40.
    let l = plan.geo.layout;
    let short = Tensor::from_bytes(
        DType::F32,
        &[l.num_pages * l.page_stride * 24 / 40],
        x.kv_blocks.data[..l.num_pages * l.page_stride * 24 / 40 * 4].to_vec(),
    )
    .unwrap();
    let short = up(&short);
    let bad_dp = SparseAttentionParams { dp: 32, ..prm };
    for (prm, pool, what) in [
        (bad_dp, &whole, "cannot hold"),
        (prm, &short, "the call needs"),
    ] {
        let b = AttentionBuffers {
            query: &query.buffer,
            pool: &pool.buffer,
            seqs: &seqs.buffer,
            token_indices: &tokens.buffer,
            token_count: &counts.buffer,
            sinks: None,
            out: &out.buffer,
            flags: &flags.buffer,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let err = pollster::block_on(encode_attention(&ctx, &mut enc, DType::F32, &prm, &b))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kv_blocks") && err.contains(what), "{err}");
    }
}

#[test]
fn subgroup_and_tiled_partial_passes_agree() {
    // The same problems through the subgroup pass (where the adapter has one subgroup size) in
    // 32-byte words (where it has 64-bit integers) and in 16-byte words, and through the tiled
    // pass (subgroups disabled): Qwen's group, 16 heads of E = 64 (four head quads, two quads
    // per lane), values narrower than keys, a padded head quad, sinks, rows on 16 but not 32
    // bytes, rows on neither, odd E.
    let ctx = util::ctx();
    let Some(size) = ctx.caps.subgroup_size else {
        eprintln!(
            "no fixed subgroup size on {}: the tiled pass only",
            ctx.describe()
        );
        return;
    };
    let tiled = util::portable_ctx();
    assert!(tiled.caps.subgroup_size.is_none());
    let narrow = util::narrow_ctx();
    assert!(!narrow.caps.wide_loads);
    let mut rng = Rng::new(0x59);
    let mut nsa = shape(32, 2, 2, 192, 90);
    nsa.ev = 128;
    // How each shape's rows are read by the subgroup pass: (shader, quads per load W) with
    // the context's loads and with 16-byte ones.
    let mut words = Vec::new();
    // And whether every lane's slots lie inside the rows (no load masks), likewise.
    let mut full = Vec::new();
    for (dt, s, sinks) in [
        (DType::F32, shape(24, 2, 1, 256, 2051), false),
        (DType::BF16, shape(24, 2, 1, 256, 600), true),
        (DType::F16, shape(16, 1, 1, 64, 300), false),
        (DType::F32, nsa, true),
        (DType::BF16, shape(12, 2, 1, 72, 130), false),
        (DType::BF16, shape(10, 1, 2, 60, 50), false),
        (DType::F32, shape(8, 8, 1, 37, 130), true),
    ] {
        let d = data(&mut rng, &s, &[(2100, 1), (0, 3), (700, 2)], sinks);
        let order = rng.permutation(pages(&s, &d));
        // NaN wherever no sequence wrote: a load past a row's live channels (the next row of
        // a sequence's last position, a page no sequence uses) would turn an output into NaN.
        let p = problem_in(&mut rng, dt, &s, &d, order, Some(f32::NAN));
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        // The subgroup context really plans the subgroup pass for this shape.
        let v = validate(&p.inputs(), &p.attrs).unwrap();
        let prm = params_kv(&v.geo, v.e, v.ev).unwrap();
        let plan = plan_attention(&ctx, &prm, prm.num_pages as usize, 1 << 26, 1 << 26).unwrap();
        assert!(
            plan.steps.iter().all(|st| st.params.sg == size),
            "{s:?}: subgroup pass not planned"
        );
        let sp = &plan.steps[0].params;
        let (wide, narrow_w) = (
            subgroup_words(ctx.caps.wide_loads, dt, sp),
            subgroup_words(false, dt, sp),
        );
        full.push((
            subgroup_rows_full(sp, wide.1),
            subgroup_rows_full(sp, narrow_w.1),
        ));
        words.push((wide, narrow_w));
        let mut outs = Vec::new();
        for c in [&ctx, &narrow, &tiled] {
            let got = pollster::block_on(gpu(c, &p.inputs(), &p.attrs)).unwrap();
            compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| {
                panic!(
                    "{dt} {s:?} sinks={sinks} subgroups={:?} wide loads={}: {e}",
                    c.caps.subgroup_size, c.caps.wide_loads
                )
            });
            outs.push(got);
        }
        // The two word widths change only the order of each dot product's terms.
        compare(&outs[0], &outs[1], attention_tol(dt))
            .unwrap_or_else(|e| panic!("{dt} {s:?}: 32-byte against 16-byte words: {e}"));
    }
    // Every way of reading rows was taken, and only the pipelines they need were built.
    let narrow_words: Vec<u32> = words.iter().map(|w| w.1 .1).collect();
    assert_eq!(
        narrow_words,
        [1, 2, 2, 1, 2, 1, 1],
        "16-byte words: W per shape"
    );
    let wide = words.iter().filter(|w| w.0 .0 == SUBGROUP_PASS_W32).count();
    assert_eq!(wide, if ctx.caps.wide_loads { 4 } else { 0 });
    // Which rows need no load masks depends on the subgroup size (a lane's slots cover
    // 4 · W · SG channels); pinned for llvmpipe's 8 lanes and NVIDIA's 32 (the H200 run).
    let narrow_full: Vec<bool> = full.iter().map(|f| f.1).collect();
    let wide_full: Vec<bool> = full.iter().map(|f| f.0).collect();
    let pinned: Option<([bool; 7], [bool; 7])> = match size {
        8 => Some((
            [true, true, true, true, false, false, false],
            [true, true, false, true, false, false, false],
        )),
        32 => Some((
            [true, true, false, false, false, false, false],
            [true, false, false, false, false, false, false],
        )),
        _ => None,
    };
    if let Some((narrow_pin, wide_pin)) = pinned {
        assert_eq!(
            narrow_full, narrow_pin,
            "{size} lanes, 16-byte words: rows full"
        );
        if ctx.caps.wide_loads {
            assert_eq!(
                wide_full, wide_pin,
                "{size} lanes, 32-byte words: rows full"
            );
        }
    }
    // At any size, some shapes take the masked loads.
    assert!(narrow_full.contains(&false));
    if ctx.caps.wide_loads {
        let wide_w: Vec<u32> = words.iter().map(|w| w.0 .1).collect();
        assert_eq!(wide_w, [2, 4, 4, 2, 2, 1, 1], "32-byte words: W per shape");
    }
    assert_eq!(ctx.cache.built(SUBGROUP_PASS_W32), ctx.caps.wide_loads);
    assert!(ctx.cache.built(SUBGROUP_PASS));
    assert!(!narrow.cache.built(SUBGROUP_PASS_W32));
    assert!(!tiled.cache.built(SUBGROUP_PASS) && !tiled.cache.built(SUBGROUP_PASS_W32));
}

#[test]
fn subgroup_slots_fit_and_cover_every_quad() {
    // The subgroup pass gives lane l's slot j the quad (j / W)·SG·W + l·W + j % W
    // (common/attention_sg.wgsl). For every row width the pass accepts (d ≤ 4·SG_QUADS·SG),
    // every subgroup size it runs at and every word width: at most SG_QUADS slots, in whole
    // words, and every quad of the row held by exactly one (lane, slot).
    for sg in [4u32, 8, 16, 32, 64] {
        for w in [1u32, 2, 4] {
            for d in 1..=4 * SG_QUADS * sg {
                let slots = subgroup_slots(d, sg, w);
                assert!(slots <= SG_QUADS, "sg {sg} w {w} d {d}: {slots} slots");
                assert_eq!(slots % w, 0, "sg {sg} w {w} d {d}: slots in whole words");
                let quads = d.div_ceil(4);
                let mut held = vec![0u32; (slots * sg) as usize];
                for l in 0..sg {
                    for j in 0..slots {
                        let q = (j / w) * sg * w + l * w + j % w;
                        held[q as usize] += 1;
                    }
                }
                assert!(
                    held.iter().all(|&n| n == 1),
                    "sg {sg} w {w} d {d}: a quad twice"
                );
                assert!(quads <= slots * sg, "sg {sg} w {w} d {d}: quads left over");
            }
        }
    }
}

/// Runs only the routing stage of `p` on `ctx`, the pool in shards of `sp` pages, with the
/// device's lists and counts replaced by `lists` (device data past the host checks) and the
/// `seqs` image edited by `edit`: the routes buffer's words and the flag word.
fn route_only(
    ctx: &Context,
    p: &Problem,
    lists: (&Tensor, &Tensor),
    sp: usize,
    edit: fn(&mut Vec<u32>),
) -> (Vec<u32>, u32) {
    let run = Run {
        seqs: Some(edit),
        ..Default::default()
    };
    let u = upload(ctx, p, &run, Some(lists));
    let sh = Shards::new(ctx, p, &u, sp);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut n = 0;
    for (step, d) in dispatch_attention(ctx, u.dt, &sh.plan, &sh.buffers(&u)).unwrap() {
        if step.shader == ROUTE {
            pollster::block_on(qsa_wgpu::ops::common::encode(ctx, &mut enc, d)).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 1, "one chunk of rows, one routing dispatch");
    pollster::block_on(ctx.submit("test", enc)).unwrap();
    let got = Readback::new(ctx, &[(&sh.routes, sh.routes.size()), (&u.flags.buffer, 4)])
        .blocking(ctx)
        .unwrap();
    let words = got[0]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (words, flag_of(&got[1]))
}

/// The routing stage's subgroup variant (8-lane subgroups, at most 8 pool shards) against the
/// generic kernel (subgroups disabled): the routes buffer word for word and the same flags, over
/// 1, 2, 4, 5 and 8 shards and 9 (which both contexts route with the generic kernel), lists with
/// bad tokens among the counted ones, counts past W and below 0, a page-table entry past the
/// pool, and rows whose lists are full, partial or empty.
#[test]
fn subgroup_and_generic_routes_agree() {
    let ctx = util::ctx();
    if ctx.caps.subgroup_size != Some(8) {
        eprintln!(
            "no 8-lane subgroups on {}: the generic route only",
            ctx.describe()
        );
        return;
    }
    let generic = util::portable_ctx();
    let mut rng = Rng::new(0x2077e);
    let s = shape(4, 1, 2, 32, 300);
    let d = data(&mut rng, &s, &[(700, 3), (0, 2), (300, 1)], false);
    let np = pages(&s, &d);
    let order = rng.permutation(np);
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    // The device's lists: row 0, group 1 full, with bad tokens among the counted ones
    // (negative, past the row's position); row 1 with a count past W, then one below 0; row 3
    // (the second sequence's first row, position 0) with nothing but its own token.
    let w = s.w;
    let (mut tokens, mut counts) = (d.tokens.clone(), d.counts.clone());
    counts[1] = w as i32;
    for (j, bad) in [(0usize, -5i32), (17, 703), (299, i32::MIN)] {
        tokens[w + j] = bad;
    }
    counts[2] = w as i32 + 7;
    counts[3] = -2;
    counts[6] = 1;
    tokens[6 * w] = 0;
    let tokens = Tensor::from_i32(&p.tokens.shape, &tokens);
    let counts = Tensor::from_i32(&p.counts.shape, &counts);
    let none: fn(&mut Vec<u32>) = |_| {};
    // seqs = [row_offsets (4) | cache_lengths (3) | table]: the first sequence's column 5 past
    // the pool.
    let bad_page: fn(&mut Vec<u32>) = |v| v[7 + 5] = 1 << 20;
    let mut variant = Vec::new();
    for (sp, edit) in [
        (np, none),
        (np.div_ceil(2), none),
        (np.div_ceil(4), bad_page),
        (np.div_ceil(5), none),
        (np.div_ceil(8), none),
        (np.div_ceil(8), bad_page),
        (np.div_ceil(9), none),
    ] {
        let shards = np.div_ceil(sp);
        let (want, wf) = route_only(&generic, &p, (&tokens, &counts), sp, edit);
        let (got, gf) = route_only(&ctx, &p, (&tokens, &counts), sp, edit);
        assert_eq!(gf, wf, "{shards} shards: flags");
        assert_ne!(
            wf, 0,
            "the lists hold bad entries: some flag must be raised"
        );
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{shards} shards: routes word {i}: got {}, want {}",
                got[i], want[i]
            );
        }
        let v = validate(&p.inputs(), &p.attrs).unwrap();
        let mut prm = params_kv(&v.geo, v.e, v.ev).unwrap();
        prm.shards = shards as u32;
        variant.push(route_subgroup_pass(ctx.caps.subgroup_size, &prm));
    }
    assert_eq!(variant, [true, true, true, true, true, true, false]);
    assert!(ctx.cache.built(ROUTE_SG) && !generic.cache.built(ROUTE_SG));
}

#[test]
fn non_finite_scores_by_hand() {
    // One head, E = 2, scale 1, the list [0, 1] (both tokens of position 1), V0 = (1, 2) and
    // V1 = (3, 4). docs/operators.md: a NaN or +inf score makes the head NaN; a score of -inf
    // weighs 0; with no finite score and no sink the head is 0 (as an empty list), with a sink
    // 0 too (nothing is weighed against it). Through the subgroup pass (where the adapter has
    // one subgroup size) and the tiled pass.
    let (nan, big) = (f32::NAN, 1.0e30);
    #[allow(clippy::type_complexity)]
    let cases: [(&str, [f32; 2], [f32; 4], Option<[f32; 2]>); 4] = [
        ("a NaN key", [1.0, 0.0], [nan, 0.0, 0.0, 5.0], None),
        ("a score of +inf", [big, 0.0], [1.0e10, 0.0, 0.0, 5.0], None),
        (
            "every score -inf",
            [big, 0.0],
            [-1.0e10, 0.0, -1.0e10, 0.0],
            Some([0.0, 0.0]),
        ),
        (
            "one score -inf",
            [big, 0.0],
            [-1.0e10, 0.0, 0.0, 5.0],
            Some([3.0, 4.0]),
        ),
    ];
    let hand = Hand::new([0, 1, -1]);
    let sink = Tensor::from_f32(DType::F32, &[1], &[0.5]);
    let a = Hand::attrs();
    let ctxs = [util::ctx(), util::portable_ctx()];
    for (what, q, k, want) in cases {
        let q = Tensor::from_f32(DType::F32, &[1, 1, 2], &q);
        let pool = Tensor::from_f32(
            DType::F32,
            &[1, 2, 1, 2, 1, 2],
            &[k[0], k[1], k[2], k[3], 1.0, 2.0, 3.0, 4.0],
        );
        for sinks in [None, Some(&sink)] {
            let x = hand.inputs(&q, &pool, sinks);
            let c = cpu(&x, &a).unwrap().to_f32();
            match want {
                None => assert!(c.iter().all(|v| v.is_nan()), "{what}: cpu {c:?}"),
                Some(w) if sinks.is_none() => assert_eq!(c, w, "{what}: cpu"),
                Some(_) => assert!(c.iter().all(|v| v.is_finite()), "{what}: cpu {c:?}"),
            }
            for ctx in &ctxs {
                let g = pollster::block_on(gpu(ctx, &x, &a)).unwrap();
                let cpu_t = cpu(&x, &a).unwrap();
                compare(&g, &cpu_t, attention_tol(DType::F32)).unwrap_or_else(|e| {
                    panic!(
                        "{what}, sink {}, subgroups {:?}: {e}",
                        sinks.is_some(),
                        ctx.caps.subgroup_size
                    )
                });
            }
        }
    }
}

#[test]
fn a_poisoning_token_in_one_split() {
    // A full decode list over several splits and pool shards, one token's key NaN in KV head
    // 0: the heads of KV head 0 are NaN, those of KV head 1 as without it; on the device the
    // NaN travels through that split's record to the combine.
    let mut rng = Rng::new(0x4e);
    let s = shape(12, 2, 1, 64, 600);
    let d = data(&mut rng, &s, &[(2100, 1)], false);
    let order = rng.permutation(pages(&s, &d));
    let mut p = problem(&mut rng, DType::F32, &s, &d, order);
    let tok = d.tokens[300] as usize;
    let layout = PoolLayout::packed(p.pool.shape[0], s.layers, s.page, s.hkv, s.dp());
    let page = p.table.to_i64()[tok / s.page] as usize;
    let at = layout.offset(page, 0, s.layer, tok % s.page, 0) + 5;
    let mut v = p.pool.to_f32();
    v[at] = f32::NAN;
    p.pool = Tensor::from_f32(DType::F32, &p.pool.shape, &v);
    let want = cpu(&p.inputs(), &p.attrs).unwrap();
    let w = want.to_f32();
    let head = |h: usize| &w[h * s.ev..][..s.ev];
    assert!((0..6).all(|h| head(h).iter().all(|x| x.is_nan())));
    assert!((6..12).all(|h| head(h).iter().all(|x| x.is_finite())));
    let runs = [
        Run::default(),
        Run {
            split_len: Some(64),
            ..Default::default()
        },
        Run {
            split_len: Some(128),
            shard_pages: Some(40),
            ..Default::default()
        },
        Run {
            split_len: Some(64),
            ctx: Some(util::portable_ctx()),
            ..Default::default()
        },
    ];
    for (i, run) in runs.iter().enumerate() {
        let (got, flags) = run_device(&p, run);
        assert_eq!(flags, 0);
        compare(&got, &want, attention_tol(DType::F32)).unwrap_or_else(|e| panic!("run {i}: {e}"));
    }
}
