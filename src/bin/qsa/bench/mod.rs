//! `qsa bench`: the presets of the PyTorch peer (`torch_peer.py`), same geometry and data
//! sizes, each in f32 and bf16, timed on the GPU. For every preset and stage: GPU time from
//! timestamp queries when the adapter has them, wall time per step (submission to results
//! ready on the device; median and min of N runs after two warm-ups, run without timestamps,
//! as a caller runs a step; the stage times come from N more runs with them), bytes the step
//! must read and FLOPs, achieved GB/s and GFLOP/s, the share of the adapter's own copy
//! bandwidth, and the step's floor on this adapter: its bytes at the adapter's faster read
//! bandwidth or its FLOPs at its multiply-add throughput, whichever is longer (the rooflines
//! measured in the same run). A table on stdout, `--json` for machines, `--svg` for a chart.
//! `--peer` runs the PyTorch peer in the same run, each preset just before ours, and reports
//! our time over its median.

mod presets;
mod report;

use qsa_wgpu::gpu::{roofline, ClockHold, Context, ContextOptions, Roofline};
use qsa_wgpu::{DType, Error, Result};

/// The presets, in the peer's order.
pub const PRESETS: &[&str] = &[
    "qsa-decode-128k",
    "qsa-decode-128k-b8",
    "qsa-prefill-8k",
    "nsa-decode",
    "qsa-attention-decode-128k",
];

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Presets to run (repeatable); default: all.
    #[arg(long = "preset")]
    pub presets: Vec<String>,
    /// Timed runs per preset and type, after two warm-up runs.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Storage types: f32, bf16 (repeatable); default: both.
    #[arg(long = "dtype")]
    pub dtypes: Vec<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a bar chart of stage times per preset to this SVG file.
    #[arg(long)]
    pub svg: Option<String>,
    /// Also run the PyTorch peer script (`torch_peer.py`) with the same presets and runs.
    #[arg(long)]
    pub peer: Option<String>,
    /// The Python that runs the peer.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Run the portable kernels even where the adapter has subgroups.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Read the buffers, not their texture copies: the indexer's queries and block keys, NSA's
    /// compressed K and V.
    #[arg(long)]
    pub no_textures: bool,
    /// Load 16 bytes per invocation even where the adapter has 64-bit integers (the NSA and
    /// attention subgroup variants otherwise read K and V in 32-byte words).
    #[arg(long)]
    pub no_wide_loads: bool,
    /// Leave a CPU adapter's compute workers to the scheduler instead of binding each to its
    /// own core (Linux, Mesa's llvmpipe).
    #[arg(long)]
    pub no_thread_pinning: bool,
    /// Keep the GPU's clocks up with busy work before each pass and run: auto (on unless the
    /// adapter is a CPU), on, off.
    #[arg(long, value_enum, default_value_t = ClockHoldMode::Auto)]
    pub clock_hold: ClockHoldMode,
    /// Write 128 MiB of host memory before each run, outside the timed span, so that every run
    /// starts with cold host caches (on a CPU adapter, the device's caches).
    #[arg(long)]
    pub evict_caches: bool,
    /// Spread a few wide top-k rows (the decode presets) over many workgroups (block_topk's
    /// split kernels, meant for GPUs).
    #[arg(long)]
    pub split_topk: bool,
    /// Run nsa-decode's logits and values stages as their GPU-shaped kernels (many workgroups
    /// of light invocations, meant for GPUs).
    #[arg(long)]
    pub gpu_nsa: bool,
    /// Score every row of the QSA presets in one-row tiles, prefill included (meant for GPUs).
    #[arg(long)]
    pub one_row_scores: bool,
    /// Run the QSA presets' compress and query preparation as two dispatches instead of one.
    #[arg(long)]
    pub no_fused_prepare: bool,
    /// Run nothing: draw the chart of a run recorded with `--json` (this file) to `--svg`.
    #[arg(
        long,
        value_name = "JSON",
        requires = "svg",
        conflicts_with_all = ["json", "peer", "presets", "dtypes"]
    )]
    pub redraw: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockHoldMode {
    Auto,
    On,
    Off,
}

/// One stage of a measured step.
#[derive(Clone, Debug)]
pub struct Stage {
    pub name: String,
    /// Median GPU milliseconds over the runs (timestamp queries).
    pub gpu_ms: f64,
}

/// One preset in one type.
#[derive(Clone, Debug)]
pub struct Measure {
    pub preset: String,
    pub dtype: String,
    pub stages: Vec<Stage>,
    /// Sum of the stage medians, when the adapter has timestamps.
    pub gpu_ms: Option<f64>,
    pub wall_median_ms: f64,
    pub wall_min_ms: f64,
    /// Median CPU time of the whole process over a run's wall span, ms (all its threads: on a
    /// CPU adapter the device's work, on a GPU the host's); None where the OS does not say.
    pub cpu_ms: Option<f64>,
    /// Bytes the step must read: keys, values, queries and raw inputs it cannot avoid
    /// (intermediates such as the score rows are not counted).
    pub bytes: u64,
    pub flops: u64,
    pub gbs: f64,
    pub gflops: f64,
    /// `gbs` as a share of the copy bandwidth, in percent.
    pub copy_pct: f64,
    /// The step's floor on this adapter, ms: bytes at the read bandwidth or FLOPs at the
    /// multiply-add throughput, whichever is longer.
    pub floor_ms: f64,
    pub peer_median_ms: Option<f64>,
    /// wall_median_ms / peer_median_ms.
    pub ratio: Option<f64>,
    pub note: Option<String>,
}

impl Measure {
    /// A step's stage medians (GPU ms) and wall times with the bytes and FLOPs it must move;
    /// the figures derived from the rooflines and the peer are filled in later (`report`).
    pub fn new(
        (preset, dtype): (&str, &str),
        stages: Vec<Stage>,
        (wall_median_ms, wall_min_ms): (f64, f64),
        bytes: u64,
        flops: u64,
    ) -> Measure {
        let gpu_ms = (!stages.is_empty()).then(|| stages.iter().map(|s| s.gpu_ms).sum());
        Measure {
            preset: preset.to_string(),
            dtype: dtype.to_string(),
            stages,
            gpu_ms,
            wall_median_ms,
            wall_min_ms,
            cpu_ms: None,
            bytes,
            flops,
            gbs: 0.0,
            gflops: 0.0,
            copy_pct: 0.0,
            floor_ms: 0.0,
            peer_median_ms: None,
            ratio: None,
            note: None,
        }
    }
}

pub fn run(backend: &Option<String>, args: &BenchArgs) -> Result<()> {
    if let (Some(json), Some(svg)) = (&args.redraw, &args.svg) {
        return report::redraw(json, svg);
    }
    let presets: Vec<String> = if args.presets.is_empty() {
        PRESETS.iter().map(|s| s.to_string()).collect()
    } else {
        args.presets.clone()
    };
    for p in &presets {
        if !PRESETS.contains(&p.as_str()) {
            return Err(Error::attr(
                "bench",
                "preset",
                format!("{p:?} is not one of {}", PRESETS.join(", ")),
            ));
        }
    }
    let dtypes: Vec<DType> = if args.dtypes.is_empty() {
        vec![DType::F32, DType::BF16]
    } else {
        args.dtypes
            .iter()
            .map(|d| {
                DType::parse(d)
                    .filter(|d| matches!(d, DType::F32 | DType::BF16 | DType::F16))
                    .ok_or_else(|| {
                        Error::attr("bench", "dtype", format!("{d:?} is not f32, f16 or bf16"))
                    })
            })
            .collect::<Result<_>>()?
    };
    if args.runs == 0 {
        return Err(Error::attr("bench", "runs", "must be >= 1"));
    }
    let ctx = Context::new_blocking(&ContextOptions {
        backends: backend.clone(),
        disable_subgroups: args.no_subgroups,
        disable_textures: args.no_textures,
        disable_wide_loads: args.no_wide_loads,
        disable_thread_pinning: args.no_thread_pinning,
        split_topk: args.split_topk,
        gpu_nsa: args.gpu_nsa,
        one_row_scores: args.one_row_scores,
        disable_fused_prepare: args.no_fused_prepare,
    })?;
    eprintln!("qsa bench: {}", ctx.describe());
    let roof: Roofline = pollster::block_on(roofline(&ctx, 128 << 20, 5))?;
    eprintln!(
        "rooflines ({}): copy {:.2} GB/s (read + write), read {:.2} GB/s (texture {}), f32 multiply-add {:.1} GFLOP/s",
        if roof.timestamps { "timestamps" } else { "wall clock" },
        roof.copy_gbs,
        roof.read_gbs,
        report::opt(roof.texture_read_gbs, 2),
        roof.fma_gflops
    );
    // A real GPU drops to its idle clock within a fraction of a second of low load, and a
    // decode step leaves it idle most of the time: busy work before each pass and each run
    // keeps it where a serving loop keeps it. Not on CPU adapters, whose cores the steps need.
    let on = match args.clock_hold {
        ClockHoldMode::Auto => ctx.info.device_type != wgpu::DeviceType::Cpu,
        ClockHoldMode::On => true,
        ClockHoldMode::Off => false,
    };
    let hold = if on {
        Some(pollster::block_on(ClockHold::new(&ctx))?)
    } else {
        None
    };
    eprintln!(
        "clock hold: {}",
        if hold.is_some() {
            "on (multiply-add work for 300 ms before each pass, 5 ms before each run)"
        } else {
            "off"
        }
    );
    let evict = args.evict_caches.then(presets::Evictor::new);
    if evict.is_some() {
        eprintln!(
            "caches: {} MiB of host memory written before each run",
            presets::EVICT_BYTES >> 20
        );
    }
    let host = report::host_cpu();
    if let Some(h) = &host {
        eprintln!("host: {h}");
    }
    let peer_runtime = args
        .peer
        .as_ref()
        .and_then(|_| report::peer_runtime(&args.python));
    if let Some(p) = &peer_runtime {
        eprintln!("peer: {p}");
    }
    let mut all = Vec::new();
    let total = presets.len() * dtypes.len();
    for (i, p) in presets.iter().enumerate() {
        // The peer runs each preset just before ours, so that both see the machine in the same
        // state (on a shared VM its speed drifts over minutes).
        let peer = match &args.peer {
            Some(script) => {
                eprintln!(
                    "[{}/{total}] {p}: peer {} {script} ({} runs) …",
                    i * dtypes.len() + 1,
                    args.python,
                    args.runs
                );
                report::run_peer(&args.python, script, p, args.runs)?
            }
            None => None,
        };
        for (j, &dt) in dtypes.iter().enumerate() {
            eprintln!(
                "[{}/{total}] {p} {dt}: setting up …",
                i * dtypes.len() + j + 1
            );
            let mut m = presets::measure(&presets::Job {
                ctx: &ctx,
                preset: p,
                dt,
                runs: args.runs,
                hold: hold.as_ref(),
                evict: evict.as_ref(),
            })?;
            let secs = m.gpu_ms.unwrap_or(m.wall_median_ms) * 1e-3;
            m.gbs = m.bytes as f64 / secs / 1e9;
            m.gflops = m.flops as f64 / secs / 1e9;
            m.copy_pct = 100.0 * m.gbs / roof.copy_gbs;
            m.floor_ms = 1e3
                * (m.bytes as f64 / (roof.best_read_gbs() * 1e9))
                    .max(m.flops as f64 / (roof.fma_gflops * 1e9));
            if let Some(pm) = peer {
                m.peer_median_ms = Some(pm);
                m.ratio = Some(m.wall_median_ms / pm);
            }
            match &m.note {
                Some(n) => eprintln!(
                    "[{}/{total}] {p} {dt}: not run: {n}",
                    i * dtypes.len() + j + 1
                ),
                None => eprintln!(
                    "[{}/{total}] {p} {dt}: wall median {:.3} ms",
                    i * dtypes.len() + j + 1,
                    m.wall_median_ms
                ),
            }
            all.push(m);
        }
    }
    let run = report::RunInfo {
        host: host.as_deref(),
        peer: peer_runtime.as_deref(),
        clock_hold: hold.is_some(),
        evict_caches: evict.is_some(),
    };
    if args.json {
        report::json(&ctx, &roof, &run, &all)?;
    } else {
        report::table(&ctx, &roof, &run, &all);
    }
    if let Some(path) = &args.svg {
        report::svg(path, &ctx, &all)?;
        eprintln!("wrote {path}");
    }
    Ok(())
}
