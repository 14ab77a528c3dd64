//! What `qsa bench` prints: the table, the JSON object, the SVG chart, and the peer's run.

use super::{Measure, Stage};
use qsa_wgpu::gpu::{Context, Roofline};
use qsa_wgpu::{Error, Result};
use std::fmt::Write as _;

/// Runs the PyTorch peer script for `preset`; returns its median ms (None when it printed
/// none for the preset).
pub fn run_peer(python: &str, script: &str, preset: &str, runs: usize) -> Result<Option<f64>> {
    let out = std::process::Command::new(python)
        .arg(script)
        .arg("--json")
        .arg("--runs")
        .arg(runs.to_string())
        .arg("--preset")
        .arg(preset)
        .output()
        .map_err(|source| Error::Io {
            path: format!("{python} {script}"),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::attr(
            "bench",
            "peer",
            format!(
                "`{python} {script}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let mut median = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            Error::attr(
                "bench",
                "peer",
                format!("`{python} {script}` printed {line:?}: {e}"),
            )
        })?;
        if v["preset"].as_str() == Some(preset) {
            median = median.or(v["median_ms"].as_f64());
        }
    }
    Ok(median)
}

/// The peer's runtime as `python` reports it ("torch 2.15.0, 2 threads"), or `None` where it
/// cannot say (then the peer's own run reports what is wrong). Recorded with the figures: the
/// peer's speed depends on its torch release as much as on the machine.
pub fn peer_runtime(python: &str) -> Option<String> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import torch; print(f'torch {torch.__version__}, {torch.get_num_threads()} threads')",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && text.starts_with("torch ")).then_some(text)
}

/// What a bench run was, beside its figures: printed over the table and recorded in the JSON.
pub struct RunInfo<'a> {
    /// The host CPU (host_cpu).
    pub host: Option<&'a str>,
    /// The peer's runtime (peer_runtime).
    pub peer: Option<&'a str>,
    /// Whether the clock hold ran.
    pub clock_hold: bool,
    /// Whether the host's caches were evicted before each run.
    pub evict_caches: bool,
}

/// The host CPU, where the OS describes it (Linux's /proc/cpuinfo), with the cores this
/// process may use: recorded with the figures because on a CPU adapter such as lavapipe the
/// host's make moves them as much as the kernels do (docs/perf.md, "The same bench on an Intel
/// Xeon machine"), and the adapter's name does not say which CPU it runs on.
pub fn host_cpu() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    describe_cpu(&text, qsa_wgpu::gpu::cpu_cores())
}

/// "MODEL NAME (family F, model M), N cores" (N = `cores`, left out when 0) from the text of
/// /proc/cpuinfo (its first processor's fields; family and model where it gives them, as x86
/// does), or None where it names no model.
fn describe_cpu(cpuinfo: &str, cores: usize) -> Option<String> {
    let field = |key: &str| {
        cpuinfo.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let name = field("model name").filter(|n| !n.is_empty())?;
    let mut s = name;
    if let (Some(f), Some(m)) = (field("cpu family"), field("model")) {
        let _ = write!(s, " (family {f}, model {m})");
    }
    match cores {
        0 => {}
        1 => s.push_str(", 1 core"),
        n => {
            let _ = write!(s, ", {n} cores");
        }
    }
    Some(s)
}

pub fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// Which kernel variants the context allows (subgroups, texture copies, 32-byte loads, the
/// split top-k, the GPU-shaped NSA kernels, one-row score tiles, compress and query
/// preparation in one dispatch) and how many CPU-adapter workers it bound to cores.
fn variants(ctx: &Context) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "subgroups {}, textures {}, 32-byte loads {}, split top-k {}, GPU-shaped NSA {}, \
         one-row score tiles {}, fused compress+query {}, workers bound to cores {}",
        ctx.caps
            .subgroup_size
            .map_or("off".to_string(), |n| format!("{n} lanes")),
        on(ctx.caps.textures),
        on(ctx.caps.wide_loads),
        on(ctx.caps.split_topk),
        on(ctx.caps.gpu_nsa),
        on(ctx.caps.one_row_scores),
        on(ctx.caps.fused_prepare),
        ctx.pinning.bound
    )
}

/// The table on stdout: one line per preset and type, then its stages.
pub fn table(ctx: &Context, roof: &Roofline, run: &RunInfo, all: &[Measure]) {
    println!("adapter: {}", ctx.describe());
    if let Some(h) = run.host {
        println!("host: {h}");
    }
    if let Some(p) = run.peer {
        println!("peer: {p}");
    }
    println!("clock hold: {}", if run.clock_hold { "on" } else { "off" });
    if run.evict_caches {
        println!(
            "caches: evicted before each run ({} MiB of host memory written)",
            super::presets::EVICT_BYTES >> 20
        );
    }
    println!("kernels: {}", variants(ctx));
    println!(
        "rooflines: copy {:.2} GB/s (read + write), read {:.2} GB/s (texture {}), f32 multiply-add {:.1} GFLOP/s",
        roof.copy_gbs,
        roof.read_gbs,
        opt(roof.texture_read_gbs, 2),
        roof.fma_gflops
    );
    println!(
        "{:<27} {:<5} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:>6} {:>9} {:>10} {:>7}",
        "preset",
        "type",
        "gpu ms",
        "wall med",
        "wall min",
        "cpu ms",
        "MB read",
        "GB/s",
        "GFLOP/s",
        "%copy",
        "floor ms",
        "peer ms",
        "ratio"
    );
    for m in all {
        if let Some(n) = &m.note {
            println!("{:<27} {:<5} not run: {n}", m.preset, m.dtype);
            continue;
        }
        println!(
            "{:<27} {:<5} {:>10} {:>10.3} {:>10.3} {:>9} {:>9.2} {:>8.2} {:>9.2} {:>6.1} {:>9.3} {:>10} {:>7}",
            m.preset,
            m.dtype,
            opt(m.gpu_ms, 3),
            m.wall_median_ms,
            m.wall_min_ms,
            opt(m.cpu_ms, 3),
            m.bytes as f64 / 1e6,
            m.gbs,
            m.gflops,
            m.copy_pct,
            m.floor_ms,
            opt(m.peer_median_ms, 3),
            opt(m.ratio, 2)
        );
        for s in &m.stages {
            println!("{:<27} {:<5} {:>10.3}   {}", "", "", s.gpu_ms, s.name);
        }
    }
}

/// One JSON object: the adapter, its rooflines and every measure.
pub fn json(ctx: &Context, roof: &Roofline, run: &RunInfo, all: &[Measure]) -> Result<()> {
    let ms: Vec<serde_json::Value> = all
        .iter()
        .map(|m| {
            serde_json::json!({
                "preset": m.preset,
                "dtype": m.dtype,
                "stages": m.stages.iter().map(|s| serde_json::json!({"name": s.name, "gpu_ms": s.gpu_ms})).collect::<Vec<_>>(),
                "gpu_ms": m.gpu_ms,
                "wall_median_ms": if m.note.is_some() { None } else { Some(m.wall_median_ms) },
                "wall_min_ms": if m.note.is_some() { None } else { Some(m.wall_min_ms) },
                "cpu_ms": if m.note.is_some() { None } else { m.cpu_ms },
                "bytes": m.bytes,
                "flops": m.flops,
                "gbs": m.gbs,
                "gflops": m.gflops,
                "copy_pct": m.copy_pct,
                "floor_ms": m.floor_ms,
                "peer_median_ms": m.peer_median_ms,
                "ratio": m.ratio,
                "note": m.note,
            })
        })
        .collect();
    let v = serde_json::json!({
        "adapter": ctx.describe(),
        "host": run.host,
        "backend": format!("{:?}", ctx.info.backend),
        "timestamps": ctx.caps.timestamps,
        "clock_hold": run.clock_hold,
        "evict_caches": run.evict_caches,
        "peer_runtime": run.peer,
        "subgroup_size": ctx.caps.subgroup_size,
        "textures": ctx.caps.textures,
        "wide_loads": ctx.caps.wide_loads,
        "split_topk": ctx.caps.split_topk,
        "gpu_nsa": ctx.caps.gpu_nsa,
        "one_row_scores": ctx.caps.one_row_scores,
        "fused_prepare": ctx.caps.fused_prepare,
        "pinned_workers": ctx.pinning.bound,
        "llvmpipe_workers": ctx.pinning.workers,
        "affinity_cores": ctx.pinning.cores,
        "copy_gbs": roof.copy_gbs,
        "read_gbs": roof.read_gbs,
        "texture_read_gbs": roof.texture_read_gbs,
        "fma_gflops": roof.fma_gflops,
        "results": ms,
    });
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
    Ok(())
}

/// A horizontal bar per preset and type: its stages stacked (GPU ms; wall ms without
/// timestamps), on a log-free linear axis per bar scaled to the slowest step.
pub fn svg(path: &str, ctx: &Context, all: &[Measure]) -> Result<()> {
    write(path, &svg_text(&ctx.describe(), all))
}

fn write(path: &str, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

/// `qsa bench --redraw`: the chart of a run recorded by `--json`, from its adapter and its
/// results' stage (or wall) times.
pub fn redraw(json: &str, path: &str) -> Result<()> {
    let text = std::fs::read_to_string(json).map_err(|source| Error::Io {
        path: json.to_string(),
        source,
    })?;
    let bad = |what: &str| Error::attr("bench", "redraw", format!("{json}: {what}"));
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON ({e})")))?;
    let adapter = v["adapter"]
        .as_str()
        .ok_or_else(|| bad("no \"adapter\" string: not a `qsa bench --json` record"))?;
    let results = v["results"]
        .as_array()
        .ok_or_else(|| bad("no \"results\" list: not a `qsa bench --json` record"))?;
    let mut all = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let field = |k: &str| bad(&format!("results[{i}].{k} is missing or of the wrong type"));
        let text = |k: &str| r[k].as_str().map(str::to_string).ok_or_else(|| field(k));
        let mut stages = Vec::new();
        for st in r["stages"].as_array().ok_or_else(|| field("stages"))? {
            stages.push(Stage {
                name: st["name"]
                    .as_str()
                    .ok_or_else(|| field("stages.name"))?
                    .into(),
                gpu_ms: st["gpu_ms"]
                    .as_f64()
                    .ok_or_else(|| field("stages.gpu_ms"))?,
            });
        }
        let note = r["note"].as_str().map(str::to_string);
        let wall = r["wall_median_ms"].as_f64();
        if note.is_none() && wall.is_none() {
            return Err(field("wall_median_ms"));
        }
        let mut m = Measure::new(
            (&text("preset")?, &text("dtype")?),
            stages,
            (
                wall.unwrap_or(0.0),
                r["wall_min_ms"].as_f64().unwrap_or(0.0),
            ),
            0,
            0,
        );
        m.gpu_ms = r["gpu_ms"].as_f64();
        m.cpu_ms = r["cpu_ms"].as_f64();
        m.note = note;
        all.push(m);
    }
    write(path, &svg_text(adapter, &all))?;
    eprintln!("wrote {path}");
    Ok(())
}

fn svg_text(adapter: &str, all: &[Measure]) -> String {
    // Tableau's 10 and two more: every stage of the five presets its own colour (11, and
    // `topk_part` with --split-topk).
    let colors = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f", "#bab0ac", "#1f3b5c", "#8cd17d",
    ];
    let ran: Vec<&Measure> = all.iter().filter(|m| m.note.is_none()).collect();
    let total = |m: &Measure| m.gpu_ms.unwrap_or(m.wall_median_ms);
    let parts = |m: &Measure| -> Vec<(String, f64)> {
        if m.stages.is_empty() {
            vec![("wall".into(), m.wall_median_ms)]
        } else {
            m.stages
                .iter()
                .map(|st| (st.name.clone(), st.gpu_ms))
                .collect()
        }
    };
    // The legend: each stage name once, in order of appearance, in rows that fit the width.
    let mut legend: Vec<String> = Vec::new();
    for m in &ran {
        for (name, _) in parts(m) {
            if !legend.contains(&name) {
                legend.push(name);
            }
        }
    }
    let max = ran.iter().map(|m| total(m)).fold(1e-9, f64::max);
    let (left, width, row, key_w) = (260.0, 560.0, 26.0, 130.0);
    let svg_w = left + width + 120.0;
    let per_line = (((svg_w - 10.0) / key_w) as usize).max(1);
    let key_lines = legend.len().div_ceil(per_line).max(1);
    let height = 70.0 + row * ran.len() as f64 + 20.0 * key_lines as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{svg_w}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="14">qsa bench: stage times per step ({})</text>"#,
        xml(adapter)
    );
    for (i, m) in ran.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}">{} {}</text>"#,
            y + 15.0,
            m.preset,
            m.dtype
        );
        let mut x = left;
        for (name, ms) in parts(m) {
            let c = colors[legend.iter().position(|l| *l == name).unwrap() % colors.len()];
            let w = width * ms / max;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y}" width="{w:.1}" height="{}" fill="{c}"><title>{name}: {ms:.3} ms</title></rect>"#,
                row - 6.0
            );
            x += w;
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}">{:.2} ms</text>"#,
            x + 5.0,
            y + 15.0,
            total(m)
        );
    }
    for (i, name) in legend.iter().enumerate() {
        let x = 10.0 + key_w * (i % per_line) as f64;
        let y = 50.0 + row * ran.len() as f64 + 20.0 * (i / per_line) as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{y}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            colors[i % colors.len()],
            x + 16.0,
            y + 11.0,
            xml(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::{describe_cpu, svg_text, Measure, Stage};

    #[test]
    fn host_cpu_from_cpuinfo() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
                   model\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\n\n\
                   processor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            describe_cpu(x86, 2).as_deref(),
            Some("Intel(R) Xeon(R) Processor (family 6, model 167), 2 cores")
        );
        // No family or model (as on some ARM kernels), cores unknown.
        let arm = "processor\t: 0\nmodel name\t: ARMv8 Processor rev 1 (v8l)\n";
        assert_eq!(
            describe_cpu(arm, 0).as_deref(),
            Some("ARMv8 Processor rev 1 (v8l)")
        );
        assert!(describe_cpu(x86, 1).unwrap().ends_with("167), 1 core"));
        // No model name: nothing to say.
        assert_eq!(describe_cpu("processor\t: 0\nCPU part\t: 0xd0c\n", 4), None);
        assert_eq!(describe_cpu("model name\t:\n", 4), None);
    }

    fn measure(preset: &str, stages: &[&str]) -> Measure {
        let stages = stages
            .iter()
            .map(|s| Stage {
                name: s.to_string(),
                gpu_ms: 1.0,
            })
            .collect();
        Measure::new((preset, "f32"), stages, (1.0, 1.0), 0, 0)
    }

    #[test]
    fn every_stage_has_its_own_colour_and_key() {
        let names: Vec<String> = (0..12).map(|i| format!("stage{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let all = [measure("a", &refs[..7]), measure("b", &refs[7..])];
        let text = svg_text("adapter", &all);
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("width=\"12\""))
            .collect();
        assert_eq!(keys.len(), 12);
        let colour = |l: &str| l.split("fill=\"").nth(1).unwrap()[..7].to_string();
        let mut colours: Vec<String> = keys.iter().map(|l| colour(l)).collect();
        colours.sort();
        colours.dedup();
        assert_eq!(colours.len(), 12, "two stages share a colour");
        // Two rows of keys, the chart tall enough for the second.
        let attr = |l: &str, name: &str| -> f64 {
            let v = l.split(&format!("{name}=\"")).nth(1).unwrap();
            v.split('"').next().unwrap().parse().unwrap()
        };
        let ys: Vec<f64> = keys.iter().map(|l| attr(l, "y")).collect();
        let height = attr(&text, "height");
        assert!(ys.iter().any(|&y| y > ys[0]), "one row of keys");
        assert!(
            ys.iter().all(|&y| y + 12.0 <= height),
            "a key below the chart"
        );
    }
}
