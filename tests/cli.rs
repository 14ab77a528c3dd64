//! `qsa run` on case files: GPU and CPU outputs agree (NSA's compressed attention also on its
//! GPU-shaped kernels, `--gpu-nsa`), and a bad case exits non-zero with a message on stderr and
//! writes no output file; `--backend cpu` is `--cpu`.

mod util;

use qsa_wgpu::case::{read_tensors, Case};
use qsa_wgpu::ops::{AttrMap, TensorMap};
use qsa_wgpu::testing::{compare, transform_tol, Rng, ScratchDir};
use qsa_wgpu::{DType, Tensor};
use serde_json::json;
use std::path::Path;
use std::process::Command;

fn qsa(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qsa"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `qsa run case -o out`, with `--cpu` when `cpu`.
fn run_case(case: &Path, out: &Path, cpu: bool) -> (bool, String) {
    let mut args = vec!["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()];
    if cpu {
        args.push("--cpu");
    }
    qsa(&args)
}

fn prepare_case(dt: DType) -> Case {
    let mut rng = Rng::new(4);
    let mut m = TensorMap::new();
    m.insert("raw_index_keys".into(), rng.tensor(dt, &[2, 9, 40]));
    m.insert("past_block_index_keys".into(), rng.tensor(dt, &[2, 3, 40]));
    m.insert("key_length".into(), Tensor::from_i32(&[2], &[13, 21]));
    m.insert("rope_cos".into(), rng.tensor(dt, &[2, 9, 16]));
    m.insert("rope_sin".into(), rng.tensor(dt, &[2, 9, 16]));
    m.insert("k_norm_weight".into(), rng.tensor(dt, &[40]));
    m.insert(
        "past_incomplete_raw_keys".into(),
        rng.tensor(dt, &[2, 3, 40]),
    );
    m.insert("past_incomplete_rope".into(), rng.tensor(dt, &[2, 32]));
    let attrs = AttrMap::from([
        ("key_block_size".to_string(), json!(4)),
        ("epsilon".to_string(), json!(1e-6)),
        ("norm_weight_offset".to_string(), json!(1)),
    ]);
    Case {
        op: "qsa_prepare".into(),
        attrs,
        inputs: m,
    }
}

#[test]
fn run_case_gpu_and_cpu_agree() {
    let dir = ScratchDir::new("cli");
    for dt in [DType::F32, DType::BF16] {
        let case = dir.file(&format!("prepare-{dt}.safetensors"));
        std::fs::write(&case, prepare_case(dt).to_bytes().unwrap()).unwrap();
        let (g, c) = (
            dir.file(&format!("gpu-{dt}.safetensors")),
            dir.file(&format!("cpu-{dt}.safetensors")),
        );
        let (ok, err) = run_case(&case, &g, false);
        assert!(ok, "{err}");
        let (ok, err) = run_case(&case, &c, true);
        assert!(ok, "{err}");
        let g = read_tensors(&std::fs::read(g).unwrap()).unwrap();
        let c = read_tensors(&std::fs::read(c).unwrap()).unwrap();
        let names: Vec<&String> = g.keys().collect();
        assert_eq!(
            names,
            ["block_index_keys", "incomplete_raw_keys", "incomplete_rope"]
        );
        assert_eq!(g["block_index_keys"].shape, vec![2, 5, 40]);
        for k in g.keys() {
            compare(&g[k], &c[k], transform_tol(dt)).unwrap_or_else(|e| panic!("{k}: {e}"));
        }
    }
}

/// `qsa run --backend cpu` (any case) is the CPU reference, as `--cpu` is: the same bytes, and
/// no adapter asked for (a backend this machine lacks fails, `cpu` does not); it refuses
/// `--gpu-nsa`, writing nothing.
#[test]
fn backend_cpu_is_the_cpu_reference() {
    let dir = ScratchDir::new("cli-backend-cpu");
    let case = dir.file("prepare.safetensors");
    std::fs::write(&case, prepare_case(DType::F32).to_bytes().unwrap()).unwrap();
    let s = case.to_str().unwrap();
    let want = dir.file("flag.safetensors");
    let (ok, err) = run_case(&case, &want, true);
    assert!(ok, "{err}");
    let want = std::fs::read(want).unwrap();
    for name in ["cpu", "CPU"] {
        let out = dir.file(&format!("backend-{name}.safetensors"));
        let (ok, err) = qsa(&["run", s, "-o", out.to_str().unwrap(), "--backend", name]);
        assert!(ok, "--backend {name}: {err}");
        assert!(std::fs::read(&out).unwrap() == want, "--backend {name}");
    }
    let out = dir.file("dx12.safetensors");
    let (ok, err) = qsa(&["run", s, "-o", out.to_str().unwrap(), "--backend", "dx12"]);
    assert!(!ok && !out.exists(), "no DX12 adapter here: {err}");
    let out = dir.file("gpu-nsa.safetensors");
    let o = out.to_str().unwrap();
    let (ok, err) = qsa(&["run", s, "-o", o, "--backend", "cpu", "--gpu-nsa"]);
    assert!(!ok && err.contains("--gpu-nsa") && !out.exists(), "{err}");
}

/// `qsa run --gpu-nsa` runs nsa_compress_attention on its GPU-shaped kernels (the output
/// within tolerance of the CPU's, the selection the CPU's), and refuses `--cpu` with it.
#[test]
fn run_case_on_the_gpu_shaped_nsa_kernels() {
    use qsa_wgpu::ops::nsa_compress_attention::Layout;
    use util::nsa::{out_tol, Geo, Problem};
    let dir = ScratchDir::new("cli-nsa");
    let mut rng = Rng::new(0x6b);
    let geo = Geo {
        dt: DType::BF16,
        layout: Layout::Tnd,
        n1: 32,
        n2: 2,
        dqk: 64,
        dv: 48,
        page: 16,
        l: 32,
        d: 16,
        lsel: 64,
        k: 4,
        causal: true,
    };
    let cmp = [300, 90];
    let sel: Vec<usize> = cmp.iter().map(|&c| (c - 1) * 16 + 32 + 3).collect();
    let p = Problem::new(&mut rng, geo.clone(), &[2, 1], &cmp, &sel);
    let mut m = TensorMap::new();
    for (name, t) in [
        ("query", &p.query),
        ("key", &p.key),
        ("value", &p.value),
        ("block_table", &p.block_table),
        ("actual_q_len", &p.q_len_t),
        ("actual_cmp_kv_len", &p.cmp_t),
        ("actual_sel_kv_len", &p.sel_t),
    ] {
        m.insert(name.into(), t.clone());
    }
    let attrs = AttrMap::from([
        ("num_heads".to_string(), json!(geo.n1)),
        ("num_kv_heads".to_string(), json!(geo.n2)),
        ("compress_block_size".to_string(), json!(geo.l)),
        ("compress_stride".to_string(), json!(geo.d)),
        ("select_block_size".to_string(), json!(geo.lsel)),
        ("select_block_count".to_string(), json!(geo.k)),
        ("causal_mask".to_string(), json!(true)),
    ]);
    let case = Case {
        op: "nsa_compress_attention".into(),
        attrs,
        inputs: m,
    };
    let path = dir.file("nsa.safetensors");
    std::fs::write(&path, case.to_bytes().unwrap()).unwrap();
    let (g, c) = (dir.file("gpu.safetensors"), dir.file("cpu.safetensors"));
    let (s, gs, cs) = (
        path.to_str().unwrap(),
        g.to_str().unwrap(),
        c.to_str().unwrap(),
    );
    let (ok, err) = qsa(&["run", s, "-o", gs, "--gpu-nsa"]);
    assert!(ok, "{err}");
    let (ok, err) = qsa(&["run", s, "-o", cs, "--cpu"]);
    assert!(ok, "{err}");
    let g = read_tensors(&std::fs::read(&g).unwrap()).unwrap();
    let c = read_tensors(&std::fs::read(&c).unwrap()).unwrap();
    compare(&g["out"], &c["out"], out_tol(geo.dt)).unwrap();
    assert_eq!(g["topk"], c["topk"]);
    let (ok, err) = qsa(&["run", s, "-o", gs, "--gpu-nsa", "--cpu"]);
    assert!(!ok && err.contains("--cpu"), "{err}");
}

/// A `format` entry (added by some safetensors writers) and a tensor under an output's name
/// (expected results carried along) do not stop a case from running.
#[test]
fn format_entry_and_expected_outputs_are_ignored() {
    let dir = ScratchDir::new("cli");
    let c = prepare_case(DType::F32);
    let mut md = std::collections::HashMap::new();
    md.insert("op".to_string(), "qsa_prepare".to_string());
    md.insert("format".to_string(), "pt".to_string());
    for (k, v) in &c.attrs {
        md.insert(k.clone(), v.to_string());
    }
    let mut inputs = c.inputs.clone();
    inputs.insert(
        "block_index_keys".into(),
        Tensor::from_f32(DType::F32, &[1], &[0.0]),
    );
    let bytes = qsa_wgpu::case::serialize(&inputs, Some(md)).unwrap();
    let case = dir.file("format.safetensors");
    let out = dir.file("format-out.safetensors");
    std::fs::write(&case, bytes).unwrap();
    let want = dir.file("format-want.safetensors");
    let plain = dir.file("format-plain.safetensors");
    std::fs::write(&plain, c.to_bytes().unwrap()).unwrap();
    for (src, dst) in [(&case, &out), (&plain, &want)] {
        let (ok, err) = run_case(src, dst, true);
        assert!(ok, "{err}");
    }
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&want).unwrap());
}

#[test]
fn bad_cases_write_nothing() {
    let dir = ScratchDir::new("cli");
    let out = dir.file("never.safetensors");
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut c = prepare_case(DType::F32);
    c.op = "qsa_unknown".into();
    cases.push(("unknown op", c.to_bytes().unwrap(), "qsa_unknown"));
    let mut c = prepare_case(DType::F32);
    c.attrs.remove("key_block_size");
    cases.push(("missing attribute", c.to_bytes().unwrap(), "key_block_size"));
    let mut c = prepare_case(DType::F32);
    c.inputs
        .insert("key_length".into(), Tensor::from_i32(&[2], &[1, 21]));
    cases.push(("bad value", c.to_bytes().unwrap(), "key_length"));
    cases.push((
        "not safetensors",
        b"hello world, not a case".to_vec(),
        "safetensors",
    ));
    let no_op = qsa_wgpu::case::serialize(&prepare_case(DType::F32).inputs, None).unwrap();
    cases.push(("no op", no_op, "op"));
    let mut md = std::collections::HashMap::new();
    md.insert("op".to_string(), "qsa_prepare".to_string());
    md.insert("key_block_size".to_string(), "four".to_string());
    let bad_json = qsa_wgpu::case::serialize(&prepare_case(DType::F32).inputs, Some(md)).unwrap();
    cases.push((
        "attribute not JSON",
        bad_json,
        "qsa_prepare: attribute `key_block_size`",
    ));
    let mut c = prepare_case(DType::F32);
    c.attrs.insert("epsilom".into(), json!(1e-5));
    cases.push((
        "unknown attribute",
        c.to_bytes().unwrap(),
        "qsa_prepare: attribute `epsilom`",
    ));
    let mut c = prepare_case(DType::F32);
    let k = c.inputs["k_norm_weight"].clone();
    c.inputs.insert("k_norm_weights".into(), k);
    cases.push((
        "unknown input",
        c.to_bytes().unwrap(),
        "qsa_prepare: input `k_norm_weights`",
    ));
    for (what, bytes, needle) in cases {
        let case = dir.file("bad.safetensors");
        std::fs::write(&case, bytes).unwrap();
        for cpu in [false, true] {
            let _ = std::fs::remove_file(&out);
            let (ok, err) = run_case(&case, &out, cpu);
            assert!(!ok, "{what}: must fail");
            assert!(
                err.contains(needle),
                "{what}: stderr {err:?} should mention {needle:?}"
            );
            assert!(!out.exists(), "{what}: an output file was written");
        }
    }
    let (ok, err) = run_case(Path::new("/nonexistent/case.safetensors"), &out, false);
    assert!(!ok && err.contains("/nonexistent/case.safetensors") && !out.exists());
    // An output in a directory that does not exist: the message names the operator and the
    // path asked for (not the temporary file written first), and nothing is left behind.
    let case = dir.file("good.safetensors");
    std::fs::write(&case, prepare_case(DType::F32).to_bytes().unwrap()).unwrap();
    let missing = dir.file("no-such-dir");
    let out = missing.join("out.safetensors");
    let (ok, err) = run_case(&case, &out, true);
    assert!(!ok, "writing into a missing directory must fail");
    let shown = out.to_str().unwrap();
    assert!(
        err.contains("qsa_prepare")
            && err.contains(&format!("{shown}:"))
            && !err.contains(".partial"),
        "stderr {err:?} should name the operator and {shown:?} only"
    );
    assert!(!missing.exists());
}

#[test]
fn info_lists_adapter_and_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_qsa"))
        .arg("info")
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("adapter")
            && s.contains("max_storage_buffer_binding_size")
            && s.contains("qsa_prepare"),
        "{s}"
    );
    // The loads the kernels take on this adapter: llvmpipe's choices on a CPU adapter.
    let ctx = util::ctx();
    let on = |b: bool| if b { "on" } else { "off" };
    let loads = format!(
        "loads        textures {}  32-byte words {}  split top-k off  GPU-shaped NSA off",
        on(ctx.caps.textures),
        on(ctx.caps.wide_loads)
    );
    assert!(s.contains(&loads), "no `{loads}` in {s}");
    let fused = format!(
        "dispatches   compress+query fused {}  one-row score tiles off",
        on(ctx.caps.fused_prepare)
    );
    assert!(s.contains(&fused), "no `{fused}` in {s}");
    // llvmpipe's workers as this process's context found them (the same machine, the same
    // counts; another process, so only the counts are compared).
    if ctx.caps.llvmpipe {
        let workers = format!("workers      llvmpipe: {}", ctx.pinning.describe());
        assert!(s.contains(&workers), "no `{workers}` in {s}");
    } else {
        assert!(!s.contains("workers "), "{s}");
    }
    if ctx.info.device_type == wgpu::DeviceType::Cpu {
        assert!(ctx.caps.textures, "a CPU adapter reads texture copies");
    }
}

/// `qsa bench` over one bf16 nsa-decode run: the shortest bench, for the peer's tests.
fn short_bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qsa"));
    c.args([
        "bench",
        "--preset",
        "nsa-decode",
        "--dtype",
        "bf16",
        "--runs",
        "1",
    ]);
    c
}

#[test]
fn bench_runs_the_peer_before_each_preset() {
    let dir = ScratchDir::new("cli");
    // A stand-in peer (a shell script in the peer's command-line and JSON shape) that logs its
    // presets: `qsa bench --peer` runs it once per preset, just before our runs of that preset,
    // and divides our wall median by its median. The clock hold is on (its work runs before
    // each pass and run), and so is the cache eviction before each run.
    let script = dir.file("peer.sh");
    let log = dir.file("peer.log");
    let _ = std::fs::remove_file(&log);
    std::fs::write(
        &script,
        format!(
            "while [ $# -gt 0 ]; do\n  if [ \"$1\" = --preset ]; then\n    echo \"$2\" >> '{}'\n    echo \"{{\\\"preset\\\": \\\"$2\\\", \\\"median_ms\\\": 1000.0}}\"\n    shift\n  fi\n  shift\ndone\n",
            log.display()
        ),
    )
    .unwrap();
    // The stand-in's "python": asked for the peer's runtime (`-c …`) it names one; else it runs
    // the script with sh.
    let python = dir.file("python.sh");
    std::fs::write(
        &python,
        "#!/bin/sh\nif [ \"$1\" = -c ]; then echo 'torch 9.9.9, 2 threads'; exit 0; fi\nexec sh \"$@\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_qsa"))
        .args(["bench", "--preset", "nsa-decode", "--preset"])
        .arg("qsa-attention-decode-128k")
        .args(["--dtype", "bf16", "--runs", "1", "--json", "--python", "sh"])
        .args(["--clock-hold", "on", "--evict-caches"])
        .arg("--peer")
        .arg(&script)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls, "nsa-decode\nqsa-attention-decode-128k\n");
    // Progress: each preset's peer run comes before its own runs and after the previous one's.
    let at = |s: &str| err.find(s).unwrap_or_else(|| panic!("no {s:?} in {err}"));
    assert!(at("nsa-decode: peer") < at("nsa-decode bf16: setting up"));
    assert!(at("nsa-decode bf16: wall median") < at("qsa-attention-decode-128k: peer"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The clock hold, asked for on this CPU adapter, ran and is reported.
    assert!(err.contains("clock hold: on"), "{err}");
    assert_eq!(v["clock_hold"], serde_json::Value::Bool(true), "{v}");
    assert!(err.contains("caches: 128 MiB"), "{err}");
    assert_eq!(v["evict_caches"], serde_json::Value::Bool(true), "{v}");
    // `sh` cannot say which torch it runs: no runtime is recorded.
    assert_eq!(v["peer_runtime"], serde_json::Value::Null, "{v}");
    // The host CPU is recorded where Linux describes it, and printed with the progress.
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        if info.lines().any(|l| l.starts_with("model name")) {
            let host = v["host"]
                .as_str()
                .unwrap_or_else(|| panic!("no host in {v}"));
            assert!(host.contains(" core") && !host.starts_with(' '), "{host}");
            assert!(err.contains(&format!("host: {host}")), "{err}");
        }
    }
    // The process's CPU time per step is recorded where the OS says (Linux): on this CPU
    // adapter the device's work, so more than nothing.
    for r in v["results"].as_array().unwrap() {
        let cpu = r["cpu_ms"].as_f64();
        if cfg!(target_os = "linux") {
            assert!(cpu.is_some_and(|c| c > 0.0), "{r}");
        } else {
            assert!(cpu.is_none(), "{r}");
        }
    }
    // One that can: it is recorded, and printed with the table.
    let out = short_bench()
        .arg("--python")
        .arg(&python)
        .arg("--peer")
        .arg(&script)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("peer: torch 9.9.9, 2 threads"), "{text}");
    assert!(text.contains("wall min    cpu ms"), "{text}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["peer_median_ms"].as_f64(), Some(1000.0), "{r}");
        let ratio = r["ratio"].as_f64().unwrap();
        let wall = r["wall_median_ms"].as_f64().unwrap();
        assert!((ratio - wall / 1000.0).abs() < 1e-12, "{r}");
    }
}

#[test]
fn bench_reports_a_failing_peer() {
    // A peer that fails: `qsa bench` stops with an error that names the flag, the command and
    // the peer's own message, and writes no chart.
    let dir = ScratchDir::new("failing-peer");
    let script = dir.file("peer.sh");
    std::fs::write(&script, "echo 'no torch here' >&2\nexit 3\n").unwrap();
    let svg = dir.file("chart.svg");
    let _ = std::fs::remove_file(&svg);
    let out = short_bench()
        .args(["--json", "--python", "sh", "--peer"])
        .arg(&script)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("bench: attribute `peer`"), "{err}");
    assert!(
        err.contains(&format!("`sh {}` failed", script.display())),
        "{err}"
    );
    assert!(err.contains("no torch here"), "{err}");
    assert!(!err.contains("case file"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!svg.exists());
}

#[test]
fn bench_redraws_a_recorded_run() {
    // The H200 record in docs: every preset and type gets its bar, every stage its key, and
    // the keys stay inside the chart (eleven stage names need two rows).
    let dir = ScratchDir::new("redraw");
    let svg = dir.file("h200.svg");
    let record = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench-h200.json");
    let (ok, err) = qsa(&["bench", "--redraw", record, "--svg", svg.to_str().unwrap()]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 10);
    for r in results {
        let label = format!(">{} {}<", r["preset"].as_str().unwrap(), r["dtype"]);
        let label = label.replace('"', "");
        assert!(text.contains(&label), "no bar for {label}");
        for st in r["stages"].as_array().unwrap() {
            let name = st["name"].as_str().unwrap();
            assert!(
                text.contains(&format!(">{name}</text>")),
                "no key for {name}"
            );
        }
    }
    let width: f64 = text
        .split("width=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    for key in text.lines().filter(|l| l.contains("width=\"12\"")) {
        let x: f64 = key
            .split("x=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            x + 130.0 <= width + 1e-9,
            "a key at x = {x} leaves a chart {width} wide"
        );
    }
    // Not a record: an error naming the file, and nothing written.
    let bad = dir.file("bad.svg");
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let (ok, err) = qsa(&["bench", "--redraw", readme, "--svg", bad.to_str().unwrap()]);
    assert!(
        !ok && err.contains("README.md") && err.contains("not JSON"),
        "{err}"
    );
    assert!(!bad.exists());
    let (ok, err) = qsa(&["bench", "--redraw", record]);
    assert!(!ok && err.contains("--svg"), "{err}");
}
