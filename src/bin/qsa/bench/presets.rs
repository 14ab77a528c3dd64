//! The presets of the PyTorch peer, set up and timed. QSA presets run `QsaIndexer` steps (the
//! cached context is compressed once by a keys-only step; every timed step appends the new
//! tokens' keys, runs, and is rolled back with `truncate`, so each run does the same work);
//! `nsa-decode` runs `nsa_compress_attention` over device-resident buffers; the attention
//! preset runs `sparse_attention` over a 128K-token paged pool, in shards of whole pages that
//! each fit one storage binding.

use super::{Measure, Stage};
use qsa_wgpu::gpu::{ClockHold, Context, GpuTensor, Timer};
use qsa_wgpu::indexer::{IndexerConfig, QsaIndexer};
use qsa_wgpu::ops::common::{flag_word, read_checked, Bound, Dispatch};
use qsa_wgpu::ops::nsa_compress_attention::{
    dispatch_nsa_compress_attention, texture_copies, validate as nsa_validate, Layout,
    NsaAttnTensors, NsaCompressAttentionAttrs, NsaCompressAttentionInputs,
};
use qsa_wgpu::ops::sparse_attention::{
    dispatch_attention, pack_seqs, params as attn_params, plan_attention, scratch_buffer,
    AttentionGeometry, ShardedAttentionBuffers,
};
use qsa_wgpu::paged::PoolLayout;
use qsa_wgpu::testing::Rng;
use qsa_wgpu::{DType, Error, Result, Tensor};
use std::time::Instant;

const WARMUP: usize = 2;
/// Clock hold (`ClockHold`) before the first run of a pass and before each later one, ms.
const HOLD_FIRST_MS: f64 = 300.0;
const HOLD_RUN_MS: f64 = 5.0;

/// Bytes of host memory [`Evictor`] writes before each run: several times any last-level
/// cache it should empty.
pub const EVICT_BYTES: usize = 128 << 20;

/// `--evict-caches`: host memory written, a word per 64-byte line, before each run (outside
/// the timed span), so that the run finds none of its data in the host CPU's caches. On a CPU
/// adapter (lavapipe) those are the device's caches: a step then runs as it does after other
/// work has used the caches, which is how this bench reproduces the slow runs of a shared
/// machine (docs/perf.md). On a GPU it leaves the device's caches as they are.
pub struct Evictor(std::cell::RefCell<Vec<u64>>);

impl Evictor {
    pub fn new() -> Self {
        Evictor(std::cell::RefCell::new(vec![0; EVICT_BYTES / 8]))
    }

    fn run(&self) {
        let mut v = self.0.borrow_mut();
        let x = v[0].wrapping_add(1);
        for w in v.iter_mut().step_by(8) {
            *w = x;
        }
        std::hint::black_box(&*v);
    }
}

/// Before run `run` of a pass, and before anything of that run is recorded or uploaded: the
/// clock hold, if the bench holds clocks, then the cache eviction, if asked for.
fn before_run(j: &Job, run: usize) -> Result<()> {
    if let Some(h) = j.hold {
        h.run_for(j.ctx, if run == 0 { HOLD_FIRST_MS } else { HOLD_RUN_MS })?;
    }
    if let Some(e) = j.evict {
        e.run();
    }
    Ok(())
}

/// Progress on stderr: runs are long on software adapters. `what`: the wall-clock runs or the
/// timestamped ones.
fn progress(preset: &str, what: &str, run: usize, runs: usize) {
    if run == 0 {
        eprint!("    {preset}, {what}: {WARMUP} warm-up + {runs} runs ");
    }
    eprint!(".");
    if run + 1 == WARMUP + runs {
        eprintln!();
    }
}

/// Median and min of a list of milliseconds.
fn stats(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s[s.len() / 2], s[0])
}

/// The measured runs of a preset: wall ms, the process's CPU ms over each wall (empty where
/// the OS does not say) and each run's stage times.
#[derive(Default)]
struct Runs {
    walls: Vec<f64>,
    cpus: Vec<f64>,
    stages: Vec<Vec<(&'static str, f64)>>,
}

impl Runs {
    /// Keeps a run past the warm-up.
    fn push(&mut self, wall: f64, cpu: Option<f64>, stages: Vec<(&'static str, f64)>) {
        self.walls.push(wall);
        self.cpus.extend(cpu);
        self.stages.push(stages);
    }
}

/// The CPU time this process has used so far, ms, over all its threads: on a CPU adapter
/// (lavapipe) the device's workers are among them, so a step's share is the work the device
/// did for it, whatever the host's other tenants did to its wall time. None where the OS
/// does not say (only Linux is asked here).
fn process_cpu_ms() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec, which `t` is.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
        (rc == 0).then_some(t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The wall time and the process's CPU time of one timed span, ms.
struct Span(Instant, Option<f64>);

impl Span {
    fn start() -> Span {
        Span(Instant::now(), process_cpu_ms())
    }

    /// Wall ms, and CPU ms where both ends could be read.
    fn end(&self) -> (f64, Option<f64>) {
        let wall = self.0.elapsed().as_secs_f64() * 1e3;
        let cpu = self.1.zip(process_cpu_ms()).map(|(a, b)| b - a);
        (wall, cpu)
    }
}

/// Times an operator recorded by `record` into a fresh encoder per run, two warm-up runs then
/// `runs` measured ones, twice: without timestamps for the wall times (submission to device
/// idle, as a caller runs it: timestamp queries cost lavapipe ~0.2 ms a step), then, when the
/// adapter has them, with the stages' timestamp spans for their GPU times.
fn timed_runs(
    j: &Job,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<&mut Timer>) -> Result<()>,
) -> Result<Runs> {
    let mut runs = timed_pass(j, None, &mut record)?;
    runs.stages = match Timer::new(j.ctx, 64) {
        Some(t) => timed_pass(j, Some(t), &mut record)?.stages,
        None => Vec::new(),
    };
    Ok(runs)
}

/// One pass of [`timed_runs`], with `timer` or without.
fn timed_pass(
    j: &Job,
    mut timer: Option<Timer>,
    record: &mut impl FnMut(&mut wgpu::CommandEncoder, Option<&mut Timer>) -> Result<()>,
) -> Result<Runs> {
    let Job {
        ctx, preset, runs, ..
    } = *j;
    let what = if timer.is_some() { "stages" } else { "wall" };
    let mut out = Runs::default();
    for run in 0..WARMUP + runs {
        progress(preset, what, run, runs);
        before_run(j, run)?;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        if let Some(t) = &mut timer {
            t.clear();
        }
        record(&mut enc, timer.as_mut())?;
        if let Some(t) = &timer {
            t.resolve(&mut enc);
        }
        let span = Span::start();
        pollster::block_on(ctx.submit(preset, enc))?;
        ctx.wait()?;
        let (wall, cpu) = span.end();
        let st = match &timer {
            Some(t) => pollster::block_on(t.read(ctx))?,
            None => Vec::new(),
        };
        if run >= WARMUP {
            out.push(wall, cpu, st);
        }
    }
    Ok(out)
}

/// Dispatches bound once, before the runs, each with its stage name.
type BoundStages<'a> = Vec<(&'static str, Bound, Dispatch<'a>)>;

fn bind_stages<'a>(
    ctx: &Context,
    stages: impl IntoIterator<Item = (&'static str, Dispatch<'a>)>,
) -> Result<BoundStages<'a>> {
    stages
        .into_iter()
        .map(|(name, d)| Ok((name, pollster::block_on(Bound::new(ctx, &d))?, d)))
        .collect()
}

/// Records the bound dispatches, each inside a timer span of its stage (summed with the
/// stage's others).
fn record_spanned(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    mut timer: Option<&mut Timer>,
    stages: &BoundStages<'_>,
) {
    for (name, bound, d) in stages {
        if let Some(t) = timer.as_deref_mut() {
            t.begin_span(enc, name);
        }
        bound.record(ctx, enc, d.params, d.groups, None);
        if let Some(t) = timer.as_deref_mut() {
            t.end_span(enc);
        }
    }
}

/// Builds the measure from the runs.
fn finish(preset: &str, dt: DType, runs: &Runs, bytes: u64, flops: u64) -> Measure {
    let Runs {
        walls,
        cpus,
        stages,
    } = runs;
    let (wall_median_ms, wall_min_ms) = stats(walls);
    let mut out: Vec<Stage> = Vec::new();
    if let Some(first) = stages.first().filter(|s| !s.is_empty()) {
        for (i, (name, _)) in first.iter().enumerate() {
            let v: Vec<f64> = stages
                .iter()
                .filter_map(|s| s.get(i).map(|x| x.1))
                .collect();
            out.push(Stage {
                name: name.to_string(),
                gpu_ms: stats(&v).0,
            });
        }
    }
    let mut m = Measure::new(
        (preset, &dt.to_string()),
        out,
        (wall_median_ms, wall_min_ms),
        bytes,
        flops,
    );
    m.cpu_ms = (!cpus.is_empty()).then(|| stats(cpus).0);
    m
}

/// A preset that cannot run here (e.g. a buffer past the binding limit): reported, not fatal.
fn skipped(preset: &str, dt: DType, why: String) -> Measure {
    let runs = Runs {
        walls: vec![f64::NAN],
        ..Runs::default()
    };
    let mut m = finish(preset, dt, &runs, 0, 0);
    m.note = Some(why);
    m
}

/// One preset in one type to set up and time: `runs` timed runs after the warm-ups, each run
/// preceded by the clock hold when `hold` is given and by the cache eviction when `evict` is.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    pub ctx: &'a std::sync::Arc<Context>,
    pub preset: &'a str,
    pub dt: DType,
    pub runs: usize,
    pub hold: Option<&'a ClockHold>,
    pub evict: Option<&'a Evictor>,
}

pub fn measure(j: &Job) -> Result<Measure> {
    let (preset, dt) = (j.preset, j.dt);
    let r = match preset {
        "qsa-decode-128k" => qsa(j, (1, 131071, 1)),
        "qsa-decode-128k-b8" => qsa(j, (8, 131071, 1)),
        "qsa-prefill-8k" => qsa(j, (1, 0, 8192)),
        "nsa-decode" => nsa(j),
        "qsa-attention-decode-128k" => attention(j),
        _ => unreachable!("checked by the caller"),
    };
    match r {
        Err(e @ Error::Limit { .. }) => Ok(skipped(preset, dt, e.to_string())),
        other => other,
    }
}

/// QSA indexer step: `batch` sequences of `cached` tokens, `new` tokens each.
fn qsa(j: &Job, (batch, cached, new): (usize, usize, usize)) -> Result<Measure> {
    let Job {
        ctx,
        preset,
        dt,
        runs,
        ..
    } = *j;
    let total = cached + new;
    let mut cfg = IndexerConfig::qwen(dt, total, batch);
    cfg.max_step_tokens = batch * new;
    let pages = batch * total.div_ceil(cfg.page_size);
    let mut rng = Rng::new(11);
    let (k_norm, q_norm) = (rng.tensor(dt, &[cfg.di]), rng.tensor(dt, &[cfg.di]));
    let mut ix = QsaIndexer::new(
        ctx.clone(),
        cfg.clone(),
        k_norm,
        q_norm,
        rng.permutation(pages),
    )?;
    for s in 0..batch {
        ix.add_sequence()?;
        let mut left = cached;
        while left > 0 {
            let n = left.min(8192);
            ix.append_keys(s, &rng.normals(n * cfg.di))?;
            left -= n;
        }
    }
    if cached > 0 {
        pollster::block_on(ix.extend(&vec![cached; batch]))?;
        ctx.wait()?;
    }
    let keys: Vec<Vec<f32>> = (0..batch).map(|_| rng.normals(new * cfg.di)).collect();
    let q = rng.tensor(dt, &[batch * new, cfg.hi, cfg.di]);
    let counts = vec![new; batch];
    // As timed_runs: the wall times without timestamps, then the stage times with them.
    // None when timing is asked for and the adapter cannot time.
    let mut pass = |timing: bool| -> Result<Option<Runs>> {
        if ix.set_timing(timing) != timing {
            return Ok(None);
        }
        let what = if timing { "stages" } else { "wall" };
        let mut out = Runs::default();
        for run in 0..WARMUP + runs {
            progress(preset, what, run, runs);
            before_run(j, run)?;
            for (s, k) in keys.iter().enumerate() {
                ix.append_keys(s, k)?;
            }
            let span = Span::start();
            pollster::block_on(ix.step(&counts, &q))?;
            ctx.wait()?;
            let (wall, cpu) = span.end();
            let st = pollster::block_on(ix.stage_times())?.unwrap_or_default();
            if run >= WARMUP {
                out.push(wall, cpu, st);
            }
            for s in 0..batch {
                ix.truncate(s, cached)?;
            }
        }
        Ok(Some(out))
    };
    let mut runs = pass(false)?.unwrap_or_default();
    runs.stages = pass(true)?.map(|r| r.stages).unwrap_or_default();
    // Must-read bytes and FLOPs of one step.
    let (es, di, hi, r) = (dt.size() as u64, cfg.di as u64, cfg.hi as u64, cfg.r as u64);
    let (b, c, n) = (batch as u64, cached as u64, new as u64);
    let new_blocks = b * ((c + n) / r - c / r);
    let visible: u64 = b * (c..c + n).map(|p| (p + 1) / r).sum::<u64>();
    let blocks = b * ((c + n) / r);
    let bytes = new_blocks * r * di * es // raw keys of the new blocks
        + b * n * hi * di * es // raw index queries
        + blocks * di * es; // block keys, each read at least once
    let flops = 2 * hi * di * visible;
    Ok(finish(preset, dt, &runs, bytes, flops))
}

/// NSA compressed attention + selection, paper geometry, c = 8192, one query token.
fn nsa(j: &Job) -> Result<Measure> {
    let (ctx, preset, dt) = (j.ctx, j.preset, j.dt);
    let (n1, n2, dqk, dv, c, page) = (64usize, 4usize, 192usize, 128usize, 8192usize, 128usize);
    let (l, d, lsel, k) = (32usize, 16usize, 64usize, 16usize);
    let pages = c.div_ceil(page);
    let mut rng = Rng::new(12);
    let query = rng.tensor(dt, &[1, n1, dqk]);
    let key = rng.tensor(dt, &[pages, page, n2 * dqk]);
    let value = rng.tensor(dt, &[pages, page, n2 * dv]);
    let perm: Vec<i32> = rng.permutation(pages).iter().map(|&p| p as i32).collect();
    let table = Tensor::from_i32(&[1, pages], &perm);
    let cmp = Tensor::from_i32(&[1], &[c as i32]);
    let x = NsaCompressAttentionInputs {
        query: &query,
        key: &key,
        value: &value,
        block_table: &table,
        actual_q_len: None,
        actual_cmp_kv_len: &cmp,
        actual_sel_kv_len: None,
    };
    let a = NsaCompressAttentionAttrs {
        num_heads: Some(n1),
        num_kv_heads: Some(n2),
        compress_block_size: l,
        compress_stride: d,
        select_block_size: lsel,
        select_block_count: k,
        scale: None,
        layout: Layout::Tnd,
        causal_mask: false,
    };
    let p = nsa_validate(&x, &a)?;
    let prm = p.params().for_adapter(ctx);
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, name, t);
    let (gq, gk, gv) = (up("q", &query)?, up("k", &key)?, up("v", &value)?);
    let tab = p.table_words();
    let gt = up("table", &Tensor::from_u32(&[tab.len()], &tab))?;
    let lens = p.lens();
    let gl = up("lens", &Tensor::from_u32(&[lens.len()], &lens))?;
    let t = NsaAttnTensors::new(ctx, &p, false)?;
    let flags = flag_word(ctx)?;
    let sel = prm.topk_params();
    // Texture copies of the compressed caches where the stages read them, made once as the
    // caches are uploaded once (their owner keeps them current, as the NSA selector does).
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let (kt, vt) = texture_copies(ctx, &mut enc, dt, (dqk, dv), &gk.buffer, &gv.buffer);
    ctx.queue.submit([enc.finish()]);
    let b = t
        .buffers(
            &gq.buffer,
            &gk.buffer,
            &gv.buffer,
            &gt.buffer,
            &gl.buffer,
            &flags.buffer,
        )
        .with_textures(kt.as_ref(), vt.as_ref());
    // One span per stage: logits, values, finish, top-k.
    let bound = bind_stages(
        ctx,
        dispatch_nsa_compress_attention(ctx, dt, &prm, &sel, &b)?,
    )?;
    let runs = timed_runs(j, |enc, timer| {
        record_spanned(ctx, enc, timer, &bound);
        Ok(())
    })?;
    let es = dt.size() as u64;
    let bytes = (c * n2 * (dqk + dv)) as u64 * es + (n1 * dqk) as u64 * es;
    let flops = 2 * (n1 * c * (dqk + dv)) as u64;
    Ok(finish(preset, dt, &runs, bytes, flops))
}

/// QSA main attention: one decode row at position 131071 over its selection (512 random
/// blocks of 4 tokens; the tail is empty there, as in the peer) from a 131072-token paged
/// pool; H = 24, Hkv = 2, E = 256. The pool (256 MiB in bf16, 512 MiB in f32) lives in shards
/// of whole pages, each within one storage binding.
fn attention(j: &Job) -> Result<Measure> {
    let (ctx, preset, dt) = (j.ctx, j.preset, j.dt);
    let (h, hkv, e, total, page, r, k) = (
        24usize,
        2usize,
        256usize,
        131072usize,
        128usize,
        4usize,
        512usize,
    );
    let pages = total.div_ceil(page);
    let layout = PoolLayout::packed(pages, 1, page, hkv, e);
    let limit = ctx.binding_capacity();
    let page_elems = layout.page_elems();
    let page_bytes = (page_elems * dt.size()) as u64;
    let shard_pages = ctx.shard_pages("sparse_attention", "kv_blocks", page_bytes, pages, None)?;
    let mut rng = Rng::new(13);
    // The pool is filled in slices so the host never holds it twice.
    let mut shards = Vec::new();
    for lo in (0..pages).step_by(shard_pages) {
        let elems = shard_pages.min(pages - lo) * page_elems;
        let shard = GpuTensor::filled(ctx, "qsa.bench.kv", dt, &[elems], 0)?;
        let slice = 1 << 22;
        let mut at = 0;
        while at < elems {
            let n = slice.min(elems - at);
            let t = Tensor::from_f32(dt, &[n], &rng.normals(n));
            ctx.queue
                .write_buffer(&shard.buffer, (at * dt.size()) as u64, &t.data);
            at += n;
        }
        shards.push(shard);
    }
    let p = total - 1; // the decode row's position
    let mut blocks: Vec<u32> = rng.permutation(total / r);
    blocks.truncate(k);
    let mut tokens: Vec<i32> = blocks
        .iter()
        .flat_map(|&b| (0..r as i32).map(move |j| b as i32 * r as i32 + j))
        .collect();
    tokens.extend(((total / r) * r..=p).map(|t| t as i32)); // the tail (empty here)
    let w = k * r + r - 1;
    let count = tokens.len();
    tokens.resize(w, -1);
    let table: Vec<u32> = rng.permutation(pages);
    let seqs = pack_seqs(&[0, 1], &[p as u32], &table);
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, name, t);
    let q = up("q", &rng.tensor(dt, &[1, h, e]))?;
    let gs = up("seqs", &seqs)?;
    let ti = up("tokens", &Tensor::from_i32(&[1, 1, w], &tokens))?;
    let tc = up("count", &Tensor::from_i32(&[1, 1], &[count as i32]))?;
    let out = GpuTensor::filled(ctx, "out", dt, &[1, h, e], 0)?;
    let flags = flag_word(ctx)?;
    let prm = attn_params(&AttentionGeometry {
        t: 1,
        n: 1,
        h,
        hs: 1,
        w,
        layout,
        layer_idx: 0,
        max_pages: pages,
        scale: None,
        has_sinks: false,
    })?;
    let plan = plan_attention(ctx, &prm, shard_pages, limit, limit)?;
    let partials = scratch_buffer(ctx, "qsa.bench.partials", plan.partials_bytes);
    let routes = scratch_buffer(ctx, "qsa.bench.routes", plan.routes_bytes);
    let b = ShardedAttentionBuffers {
        query: &q.buffer,
        pool: shards.iter().map(|s| &s.buffer).collect(),
        shard_pages,
        seqs: &gs.buffer,
        token_indices: &ti.buffer,
        token_count: &tc.buffer,
        sinks: None,
        out: &out.buffer,
        flags: &flags.buffer,
        partials: &partials,
        routes: &routes,
    };
    // One span per dispatch, summed by stage: route, partial passes (one per shard), combine.
    let names = ["route", "partial", "combine"];
    let steps = dispatch_attention(ctx, dt, &plan, &b)?;
    let bound = bind_stages(ctx, steps.into_iter().map(|(st, d)| (st.stage(names), d)))?;
    let runs = timed_runs(j, |enc, timer| {
        record_spanned(ctx, enc, timer, &bound);
        Ok(())
    })?;
    // The device's flags (bad pages, tokens, counts) turn into an error here; the output itself
    // is not needed.
    pollster::block_on(read_checked(ctx, "sparse_attention", &[], &flags))?;
    let bytes = (count * 2 * hkv * e * dt.size() + h * e * dt.size()) as u64;
    let flops = (4 * h * e * count) as u64;
    Ok(finish(preset, dt, &runs, bytes, flops))
}

#[cfg(test)]
mod tests {
    use super::process_cpu_ms;

    #[test]
    fn process_cpu_time_counts_every_thread() {
        // A thread spins for 100 ms of wall time while this one waits for it: the process's
        // CPU time grows by what the spinner got, which the waiting thread cannot supply.
        let c0 = process_cpu_ms();
        if !cfg!(target_os = "linux") {
            assert!(c0.is_none());
            return;
        }
        let c0 = c0.expect("Linux gives the process's CPU time");
        let spinner = std::thread::spawn(|| {
            let t0 = std::time::Instant::now();
            let mut x = 0u64;
            while t0.elapsed().as_millis() < 100 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            x
        });
        spinner.join().unwrap();
        let used = process_cpu_ms().unwrap() - c0;
        assert!(used >= 10.0, "{used} ms");
    }
}
