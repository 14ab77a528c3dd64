//! The demo run, independent of the browser: a synthetic Qwen3.8-Flash-Next indexer layer
//! (Hi = 4, Di = 128, Dr = 64, r = 4, page 128) over a ragged batch — one prefill chunk per
//! sequence, then decode steps — on the GPU through `QsaIndexer::step`, each step checked
//! against `QsaIndexer::step_cpu`. Decode steps also run the main attention (H = 24, Hkv = 2,
//! E = 256) over the selection in the same submission (`step_with_attention`), checked
//! against the CPU attention over the GPU's own selection. The result is JSON: timings per
//! step and stage, the checks, and the block scores with the selected blocks of every query
//! row for a heat map.

use crate::report::{checker_rejects_a_perturbed_selection, score_tol, Heat, Tally};
use crate::synth::{Synth, DI, HI};
use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::indexer::{AttentionConfig, IndexerConfig, QsaIndexer};
use qsa_wgpu::testing::{attention_tol, Rng};
use qsa_wgpu::{DType, Result, Tensor};
use serde_json::{json, Map, Value};

/// The stages timed in every step, in order.
pub const STAGES: &[&str] = &[
    "append",
    "indexer",
    "readback",
    "cpu_reference",
    "check",
    "attention_check",
];

/// What to run; every field has a default small enough for a software adapter.
#[derive(Clone, Debug)]
pub struct Options {
    /// Prefill tokens of each sequence, all in one ragged step.
    pub prefill: Vec<usize>,
    /// Decode steps after the prefill (one token per sequence each).
    pub decode: usize,
    /// Blocks selected per query row (the model selects 512; a short prompt needs fewer).
    pub k: usize,
    pub dtype: DType,
    pub seed: u64,
    /// Run the attention stage in the decode steps.
    pub attention: bool,
}

impl Options {
    /// Reads `{"prefill": [300, 193], "decode": 4, "k": 16, "dtype": "f32", "seed": 7,
    /// "attention": true}`; missing fields take those defaults.
    pub fn parse(text: &str) -> std::result::Result<Options, String> {
        let v: Value = if text.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(text).map_err(|e| format!("options: {e}"))?
        };
        let uint = |name: &str, default: u64| -> std::result::Result<u64, String> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .ok_or_else(|| format!("options: {name} must be a non-negative integer")),
            }
        };
        let prefill = match v.get("prefill") {
            None | Some(Value::Null) => vec![300, 193],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or("options: prefill must be a list of token counts")?,
            Some(_) => return Err("options: prefill must be a list of token counts".into()),
        };
        let dtype = match v.get("dtype").and_then(Value::as_str) {
            None => DType::F32,
            Some(s) => DType::parse(s)
                .filter(|d| d.is_float())
                .ok_or_else(|| format!("options: dtype {s:?} is not f32, f16 or bf16"))?,
        };
        let o = Options {
            prefill,
            decode: uint("decode", 4)? as usize,
            k: uint("k", 16)? as usize,
            dtype,
            seed: uint("seed", 7)?,
            attention: match v.get("attention") {
                None | Some(Value::Null) => true,
                Some(x) => x
                    .as_bool()
                    .ok_or("options: attention must be true or false")?,
            },
        };
        if o.prefill.is_empty() || o.prefill.len() > 8 || o.k == 0 {
            return Err("options: 1 to 8 sequences and k >= 1 are needed".into());
        }
        Ok(o)
    }
}

/// Runs the demo on the browser's WebGPU adapter (or, natively, on the default one); `now`
/// is a clock in milliseconds.
pub async fn run(o: &Options, now: &dyn Fn() -> f64) -> Result<Value> {
    let t0 = now();
    let backends = cfg!(target_arch = "wasm32").then(|| "webgpu".to_string());
    let ctx = Context::new(&ContextOptions {
        backends,
        ..Default::default()
    })
    .await?;
    let context_ms = now() - t0;
    let n = o.prefill.len();
    let final_lens: Vec<usize> = o.prefill.iter().map(|p| p + o.decode).collect();
    let max_len = final_lens.iter().copied().max().unwrap_or(0).max(1);
    let attn = o.attention.then(AttentionConfig::qwen);
    let cfg = IndexerConfig {
        k: o.k,
        attention: attn.clone(),
        ..IndexerConfig::qwen(o.dtype, max_len, n)
    };
    let mut kv_rng = Rng::new(o.seed ^ 0xa77e);
    let pages = n * max_len.div_ceil(cfg.page_size);
    let mut rng = Rng::new(o.seed ^ 0x5eed);
    let mut norm_weight = || {
        let v: Vec<f32> = rng.normals(DI).iter().map(|x| 0.1 * x).collect();
        Tensor::from_f32(o.dtype, &[DI], &v)
    };
    let (k_norm, q_norm) = (norm_weight(), norm_weight());
    let order = rng.permutation(pages);
    let mut ix = QsaIndexer::new(ctx.clone(), cfg.clone(), k_norm, q_norm, order)?;
    for _ in 0..n {
        ix.add_sequence()?;
    }
    let mut synth = Synth::new(o.seed, &final_lens);
    let tol = score_tol(o.dtype);

    let mut plan = vec![("prefill", o.prefill.clone())];
    plan.extend((0..o.decode).map(|_| ("decode", vec![1; n])));
    let mut lens = vec![0usize; n];
    let mut tally = Tally::new(tol, cfg.r);
    let mut heat: Vec<Heat> = (0..n).map(|_| Heat::default()).collect();
    let mut steps = Vec::new();
    let mut totals = vec![0.0f64; STAGES.len()];
    let mut pipelines = 0;
    let mut last = None;
    for (i, (phase, new)) in plan.iter().enumerate() {
        let mut ms = Vec::new();
        let mut mark = now();
        let mut lap = |ms: &mut Vec<f64>| {
            let t = now();
            ms.push(t - mark);
            mark = t;
        };
        // append: the new raw keys into the paged pool, and the queries.
        let mut positions = Vec::new();
        for s in 0..n {
            ix.append_keys(s, &synth.keys(s, lens[s], new[s]))?;
            if let Some(a) = &attn {
                let w = new[s] * a.hkv * a.e;
                ix.append_kv(s, &kv_rng.normals(w), &kv_rng.normals(w))?;
            }
            positions.extend((lens[s]..lens[s] + new[s]).map(|p| p as i32));
            lens[s] += new[s];
        }
        let t: usize = new.iter().sum();
        let q = Tensor::from_f32(o.dtype, &[t, HI, DI], &synth.queries(t));
        let aq = attn
            .as_ref()
            .filter(|_| *phase == "decode")
            .map(|a| Tensor::from_f32(o.dtype, &[t, a.h, a.e], &kv_rng.normals(t * a.h * a.e)));
        lap(&mut ms);
        // indexer (+ attention): one submission; readback: wait for it and map the outputs.
        let out = match &aq {
            Some(a) => ix.step_with_attention(new, &q, a).await?,
            None => ix.step(new, &q).await?,
        };
        lap(&mut ms);
        let got = out.read(&ctx).await?;
        let got_scores = out
            .scores
            .as_ref()
            .ok_or_else(|| qsa_wgpu::Error::Gpu("the step's scores span several chunks".into()))?
            .read(&ctx)
            .await?;
        lap(&mut ms);
        if i == 0 {
            pipelines = ix.pipelines_created();
        }
        // cpu_reference, then check.
        let want = ix.step_cpu(new, &q)?;
        lap(&mut ms);
        let label = format!("{phase} step {i}");
        let summary = tally.step(&label, &got, &got_scores, &want, &positions)?;
        Heat::collect(
            &mut heat,
            *phase == "prefill",
            new,
            &positions,
            &got_scores,
            &got,
            &want,
        );
        lap(&mut ms);
        // attention_check: the CPU attention over the GPU's selection.
        if let Some(a) = &aq {
            let rows: Vec<usize> = (0..t).collect();
            let cpu = ix.attention_cpu(new, &got, a, &rows)?;
            tally.attention(&label, &got["out"], &cpu, attention_tol(o.dtype));
        }
        lap(&mut ms);

        for (tot, v) in totals.iter_mut().zip(&ms) {
            *tot += v;
        }
        let mut step =
            json!({ "phase": phase, "new_tokens": new, "rows": t, "timings_ms": stage_map(&ms) });
        step.as_object_mut()
            .unwrap()
            .extend(summary.as_object().unwrap().clone());
        steps.push(step);
        last = Some((want, t * cfg.hs));
    }
    let self_test = last
        .map(|(want, rows)| checker_rejects_a_perturbed_selection(&want, rows, tol))
        .unwrap_or((false, "no steps".into()));
    let checks = tally.checks(self_test);
    let pass = checks.iter().all(|c| c["pass"] == json!(true));
    let width = final_lens.iter().map(|l| l / cfg.r).max().unwrap_or(0);
    let adapter = match ctx.info.name.is_empty() {
        true => format!(
            "unnamed adapter ({:?}, {:?})",
            ctx.info.backend, ctx.info.device_type
        ),
        false => ctx.describe(),
    };
    Ok(json!({
        "status": if pass { "pass" } else { "fail" },
        "adapter": adapter,
        "backend": format!("{:?}", ctx.info.backend),
        "config": {
            "hi": cfg.hi, "di": cfg.di, "dr": cfg.dr, "r": cfg.r, "k": cfg.k,
            "page_size": cfg.page_size, "dtype": o.dtype.name(), "sequences": n,
            "prefill": o.prefill, "decode": o.decode, "seed": o.seed,
            "attention": attn.as_ref().map(|a| json!({"h": a.h, "hkv": a.hkv, "e": a.e, "steps": "decode"})),
        },
        "context_ms": round3(context_ms),
        "pipelines_built": pipelines,
        "stages": STAGES,
        "totals_ms": stage_map(&totals),
        "steps": steps,
        "agreement": {
            "rows": tally.rows, "exact": tally.exact, "near_tie": tally.near_tie,
            "failed": tally.failed,
        },
        "checks": checks,
        "failures": tally.failures,
        "heatmaps": heat.into_iter().enumerate().map(|(s, h)| h.to_json(s, width)).collect::<Vec<_>>(),
    }))
}

/// Milliseconds by stage name.
fn stage_map(ms: &[f64]) -> Map<String, Value> {
    STAGES
        .iter()
        .zip(ms)
        .map(|(s, v)| (s.to_string(), json!(round3(*v))))
        .collect()
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
