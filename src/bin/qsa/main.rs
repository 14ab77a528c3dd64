//! The `qsa` command line: `info` (adapter and limits), `run` (replay a case file), `demo`
//! (the main job: a synthetic Qwen3.8-Flash-Next indexer layer checked against the CPU),
//! `bench` (the PyTorch peer's presets, timed).

mod bench;
mod demo;
mod demo_nsa;

use clap::{Parser, Subcommand};
use qsa_wgpu::case::{serialize, Case};
use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::ops::{self, Exec};
use qsa_wgpu::{Error, Result};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "qsa",
    version,
    about = "Sparse-attention indexers (QSA, DSA, NSA) on any GPU through wgpu"
)]
struct Cli {
    /// Backends to use: vulkan, gl, metal, dx12 (comma-separated); default: WGPU_BACKEND or all.
    /// `qsa run` also takes `cpu`, the CPU reference (as its --cpu).
    #[arg(long, global = true)]
    backend: Option<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the adapter, backend, driver, features and the limits that matter.
    Info,
    /// Run one case file (SPEC §9) and write its outputs as safetensors.
    Run {
        /// The case file.
        case: String,
        /// Where to write the outputs.
        #[arg(short, long)]
        output: String,
        /// Use the CPU reference instead of the GPU.
        #[arg(long)]
        cpu: bool,
        /// Run nsa_compress_attention's logits and values stages as their GPU-shaped kernels
        /// (ContextOptions::gpu_nsa; off by default).
        #[arg(long, conflicts_with = "cpu")]
        gpu_nsa: bool,
    },
    /// The main job: a synthetic indexer layer, every step checked against the CPU (default).
    Demo(demo::DemoArgs),
    /// Time the PyTorch peer's presets on the GPU (and, with --peer, the peer itself).
    Bench(bench::BenchArgs),
}

/// The default context on `backend`, or with the GPU-shaped NSA kernels (`qsa run --gpu-nsa`).
fn context(backend: &Option<String>, gpu_nsa: bool) -> Result<std::sync::Arc<Context>> {
    Context::new_blocking(&ContextOptions {
        backends: backend.clone(),
        gpu_nsa,
        ..Default::default()
    })
}

fn info(backend: &Option<String>) -> Result<()> {
    let ctx = context(backend, false)?;
    let i = &ctx.info;
    println!("adapter      {}", i.name);
    println!("backend      {:?}", i.backend);
    println!("device type  {:?}", i.device_type);
    println!("driver       {} {}", i.driver, i.driver_info);
    println!(
        "features     shader-f16 {}  subgroups {} (size {}..={}{})  timestamps {}  int64 {}",
        ctx.caps.shader_f16,
        ctx.caps.subgroups,
        i.subgroup_min_size,
        i.subgroup_max_size,
        if ctx.caps.subgroup_size.is_some() {
            ", subgroup variants on"
        } else {
            ""
        },
        ctx.caps.timestamps,
        ctx.adapter
            .features()
            .contains(wgpu::Features::SHADER_INT64),
    );
    let on = |b: bool| if b { "on" } else { "off" };
    println!(
        "loads        textures {}  32-byte words {}  split top-k {}  GPU-shaped NSA {}",
        on(ctx.caps.textures),
        on(ctx.caps.wide_loads),
        on(ctx.caps.split_topk),
        on(ctx.caps.gpu_nsa)
    );
    println!(
        "dispatches   compress+query fused {}  one-row score tiles {}",
        on(ctx.caps.fused_prepare),
        on(ctx.caps.one_row_scores)
    );
    if ctx.caps.llvmpipe {
        println!("workers      llvmpipe: {}", ctx.pinning.describe());
    }
    let l = &ctx.limits;
    println!(
        "limits       max_storage_buffer_binding_size {}",
        l.max_storage_buffer_binding_size
    );
    println!("             max_buffer_size {}", l.max_buffer_size);
    println!(
        "             max_storage_buffers_per_shader_stage {}",
        l.max_storage_buffers_per_shader_stage
    );
    println!(
        "             max_compute_workgroup_storage_size {}",
        l.max_compute_workgroup_storage_size
    );
    println!(
        "             max_compute_invocations_per_workgroup {}",
        l.max_compute_invocations_per_workgroup
    );
    println!(
        "             max_compute_workgroups_per_dimension {}",
        l.max_compute_workgroups_per_dimension
    );
    println!("operators    {}", ops::names());
    Ok(())
}

fn run_case(
    backend: &Option<String>,
    case: &str,
    output: &str,
    cpu: bool,
    gpu_nsa: bool,
) -> Result<()> {
    let c = Case::read(case)?;
    // `--backend cpu` is the CPU reference too, as a user of the other backends would write it.
    let named_cpu = backend
        .as_deref()
        .is_some_and(|b| b.trim().eq_ignore_ascii_case("cpu"));
    if named_cpu && gpu_nsa {
        return Err(Error::Adapter(
            "--gpu-nsa runs GPU kernels; it cannot be used with --backend cpu".into(),
        ));
    }
    let ctx = if cpu || named_cpu {
        None
    } else {
        Some(context(backend, gpu_nsa)?)
    };
    let exec = match &ctx {
        Some(ctx) => Exec::Gpu(ctx),
        None => Exec::Cpu,
    };
    let out = ops::run_blocking(&c.op, &c.inputs, &c.attrs, exec)?;
    let bytes = serialize(&out, None)?;
    // Write beside the target, then rename: a failed write leaves no partial output file.
    // Errors name the output asked for (not the temporary beside it) and the operator.
    let tmp = format!("{output}.partial");
    let failed = |source| Error::Io {
        path: format!("{} outputs to {output}", c.op),
        source,
    };
    std::fs::write(&tmp, &bytes).map_err(failed)?;
    std::fs::rename(&tmp, output).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        failed(source)
    })?;
    eprintln!("{}: wrote {} tensors to {output}", c.op, out.len());
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Some(Cmd::Info) => info(&cli.backend),
        Some(Cmd::Run {
            case,
            output,
            cpu,
            gpu_nsa,
        }) => run_case(&cli.backend, &case, &output, cpu, gpu_nsa),
        Some(Cmd::Demo(args)) => demo::run(&cli.backend, &args),
        Some(Cmd::Bench(args)) => bench::run(&cli.backend, &args),
        None => demo::run(&cli.backend, &demo::DemoArgs::default()),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qsa: error: {e}");
            ExitCode::FAILURE
        }
    }
}
