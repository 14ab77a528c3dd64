//! Every host-checkable rule of SPEC §1–§3, §7 and §8 gets a typed error that names the operator,
//! the input or attribute, and the value — on the CPU and the GPU path alike, before any
//! dispatch. The NSA rules are in `bad_inputs/nsa.rs`.

#[path = "bad_inputs/nsa.rs"]
mod nsa;
mod util;

use qsa_wgpu::ops::{run_blocking, AttrMap, Exec, TensorMap};
use qsa_wgpu::{DType, Tensor};
use serde_json::json;

/// One change that makes a valid call invalid.
type Edit = Box<dyn Fn(&mut TensorMap, &mut AttrMap)>;

fn f(shape: &[usize]) -> Tensor {
    Tensor::zeros(DType::F32, shape)
}

/// A valid qsa_prepare call: N = 2, L = 3, Di = 8, Dr = 4, r = 4, key_length 7.
fn prepare() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("raw_index_keys".into(), f(&[2, 3, 8]));
    m.insert("past_block_index_keys".into(), f(&[2, 1, 8]));
    m.insert("key_length".into(), Tensor::from_i32(&[2], &[7, 7]));
    m.insert("rope_cos".into(), f(&[2, 3, 4]));
    m.insert("rope_sin".into(), f(&[2, 3, 4]));
    m.insert("k_norm_weight".into(), f(&[8]));
    m.insert("past_incomplete_raw_keys".into(), f(&[2, 3, 8]));
    m.insert("past_incomplete_rope".into(), f(&[2, 8]));
    (m, AttrMap::from([("key_block_size".to_string(), json!(4))]))
}

/// A valid qsa_compress_paged call: one sequence of 8 keys in a 2-page pool of page 4.
fn compress() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("kv_blocks".into(), f(&[2, 2, 1, 4, 1, 8]));
    m.insert("page_table".into(), Tensor::from_u32(&[1, 2], &[1, 0]));
    m.insert("cache_lengths".into(), Tensor::from_u32(&[1], &[0]));
    m.insert("key_counts".into(), Tensor::from_i32(&[1], &[8]));
    m.insert("gamma".into(), f(&[8]));
    m.insert("freqs_cis".into(), f(&[8, 4]));
    m.insert("block_keys".into(), f(&[2, 8]));
    (
        m,
        AttrMap::from([
            ("ratio".to_string(), json!(4)),
            ("rotary_dim".to_string(), json!(4)),
        ]),
    )
}

/// A valid qsa_prepare_query call.
fn query() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("index_query_raw".into(), f(&[3, 2, 8]));
    m.insert("q_norm_weight".into(), f(&[8]));
    m.insert("freqs_cis".into(), f(&[10, 4]));
    m.insert("positions".into(), Tensor::from_i32(&[3], &[0, 5, 9]));
    (m, AttrMap::new())
}

/// A valid sparse_attention call: one sequence of 7 tokens, 5 cached, 2 new rows; H = 2,
/// Hkv = 1, E = 8, pages of 4 (table [2, 0] into a 3-page pool), W = 4, sinks.
fn attention() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("query".into(), f(&[2, 2, 8]));
    m.insert("kv_blocks".into(), f(&[3, 2, 1, 4, 1, 8]));
    m.insert("page_table".into(), Tensor::from_u32(&[1, 2], &[2, 0]));
    m.insert("row_offsets".into(), Tensor::from_u32(&[2], &[0, 2]));
    m.insert("cache_lengths".into(), Tensor::from_u32(&[1], &[5]));
    m.insert(
        "token_indices".into(),
        Tensor::from_i32(&[2, 1, 4], &[5, 0, 3, -1, 6, 1, 2, 4]),
    );
    m.insert("token_count".into(), Tensor::from_i32(&[2, 1], &[3, 4]));
    m.insert("sinks".into(), f(&[2]));
    (m, AttrMap::new())
}

/// Runs `op` on CPU and GPU; both must fail with a message holding every `needle`.
fn expect_err(op: &str, m: &TensorMap, a: &AttrMap, needles: &[&str]) {
    let ctx = util::ctx();
    for exec in [Exec::Cpu, Exec::Gpu(&ctx)] {
        let e = run_blocking(op, m, a, exec)
            .expect_err("bad input must be rejected")
            .to_string();
        for n in needles {
            assert!(e.contains(n), "error {e:?} should mention {n:?}");
        }
        assert!(e.contains(op), "error {e:?} should name the operator");
    }
}

#[test]
fn valid_calls_pass() {
    let ctx = util::ctx();
    for (op, (m, a)) in [
        ("qsa_prepare", prepare()),
        ("qsa_compress_paged", compress()),
        ("qsa_prepare_query", query()),
        ("sparse_attention", attention()),
    ] {
        run_blocking(op, &m, &a, Exec::Cpu).unwrap();
        run_blocking(op, &m, &a, Exec::Gpu(&ctx)).unwrap();
    }
}

#[test]
fn unused_page_table_entries_may_be_negative() {
    // A column no position reaches may hold -1 (a common filler) in an i32 table: the result
    // is the same as with a valid page there, on the CPU and the GPU. A used negative entry is
    // an error naming it as given.
    let ctx = util::ctx();
    for (op, (mut m, a), filler, used) in [
        ("qsa_compress_paged", compress(), [1, 0, -1], [-1, 0]),
        ("sparse_attention", attention(), [2, 0, -1], [-7, 0]),
    ] {
        let mut outs = Vec::new();
        for row in [filler, [filler[0], filler[1], 0]] {
            m.insert("page_table".into(), Tensor::from_i32(&[1, 3], &row));
            for exec in [Exec::Cpu, Exec::Gpu(&ctx)] {
                outs.push(run_blocking(op, &m, &a, exec).unwrap());
            }
        }
        assert!(
            outs.iter().all(|o| o == &outs[0]),
            "{op}: the unused filler changed a result"
        );
        m.insert("page_table".into(), Tensor::from_i32(&[1, 2], &used));
        let negative = format!("page {} is negative", used[0]);
        expect_err(op, &m, &a, &["page_table", "column 0", &negative]);
    }
}

#[test]
fn qsa_prepare_rules() {
    let op = "qsa_prepare";
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|m, _| {
                m.remove("raw_index_keys");
            }),
            vec!["raw_index_keys", "missing"],
        ),
        (
            Box::new(|m, _| {
                m.remove("past_incomplete_raw_keys");
            }),
            vec!["past_incomplete_raw_keys"],
        ),
        (
            Box::new(|_, a| {
                a.remove("key_block_size");
            }),
            vec!["key_block_size", "missing"],
        ),
        (
            Box::new(|_, a| {
                a.insert("key_block_size".into(), json!(1));
            }),
            vec!["key_block_size", "1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("epsilon".into(), json!(-1.0));
            }),
            vec!["epsilon", "-1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("epsilon".into(), json!("x"));
            }),
            vec!["epsilon"],
        ),
        (
            Box::new(|m, _| {
                m.insert("raw_index_keys".into(), f(&[2, 3]));
            }),
            vec!["raw_index_keys", "rank"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "raw_index_keys".into(),
                    Tensor::zeros(DType::I32, &[2, 3, 8]),
                );
            }),
            vec!["raw_index_keys", "i32"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "past_block_index_keys".into(),
                    Tensor::zeros(DType::F16, &[2, 1, 8]),
                );
            }),
            vec!["past_block_index_keys", "f16"],
        ),
        (
            Box::new(|m, _| {
                m.insert("past_block_index_keys".into(), f(&[2, 1, 9]));
            }),
            vec!["past_block_index_keys", "9"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_length".into(), Tensor::from_i32(&[2], &[7, 2]));
            }),
            vec!["key_length", "2"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_length".into(), Tensor::from_i32(&[3], &[7, 7, 7]));
            }),
            vec!["key_length", "[3]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_length".into(), f(&[2]));
            }),
            vec!["key_length", "f32"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_length".into(), Tensor::from_i32(&[2], &[7, 12]));
            }),
            vec!["past_block_index_keys", "Bp = 1"],
        ),
        (
            Box::new(|m, _| {
                m.remove("rope_sin");
            }),
            vec!["rope_sin"],
        ),
        (
            Box::new(|m, _| {
                m.insert("rope_cos".into(), f(&[2, 3, 3]));
                m.insert("rope_sin".into(), f(&[2, 3, 3]));
            }),
            vec!["rope_cos", "3"],
        ),
        (
            Box::new(|m, _| {
                m.insert("rope_cos".into(), f(&[2, 3, 10]));
                m.insert("rope_sin".into(), f(&[2, 3, 10]));
            }),
            vec!["rope_cos", "10"],
        ),
        (
            Box::new(|m, _| {
                m.insert("rope_sin".into(), f(&[2, 3, 2]));
            }),
            vec!["rope_sin"],
        ),
        (
            Box::new(|m, _| {
                m.remove("past_incomplete_rope");
            }),
            vec!["past_incomplete_rope"],
        ),
        (
            Box::new(|m, _| {
                m.remove("rope_cos");
                m.remove("rope_sin");
            }),
            vec!["past_incomplete_rope"],
        ),
        (
            Box::new(|m, _| {
                m.insert("past_incomplete_rope".into(), f(&[2, 4]));
            }),
            vec!["past_incomplete_rope", "[2, 4]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("k_norm_weight".into(), f(&[7]));
            }),
            vec!["k_norm_weight", "[7]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("past_incomplete_raw_keys".into(), f(&[2, 4, 8]));
            }),
            vec!["past_incomplete_raw_keys", "[2, 4, 8]"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = prepare();
        edit(&mut m, &mut a);
        eprintln!("qsa_prepare rule {i}");
        expect_err(op, &m, &a, needles);
    }
}

#[test]
fn qsa_compress_paged_rules() {
    let op = "qsa_compress_paged";
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|m, _| {
                m.insert("key_counts".into(), Tensor::from_i32(&[1], &[3]));
                m.insert("cache_lengths".into(), Tensor::from_u32(&[1], &[4]));
            }),
            vec!["key_counts", "3 < cache_lengths 4"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_counts".into(), Tensor::from_i32(&[1], &[12]));
            }),
            vec!["key_counts", "3 blocks"],
        ),
        (
            Box::new(|m, _| {
                m.insert("page_table".into(), Tensor::from_u32(&[1, 2], &[1, 2]));
            }),
            vec!["page_table", "page 2 >= num_pages 2"],
        ),
        (
            Box::new(|m, _| {
                m.insert("page_table".into(), Tensor::from_u32(&[1, 1], &[1]));
            }),
            vec!["page_table", "column 1"],
        ),
        (
            Box::new(|m, _| {
                m.insert("freqs_cis".into(), f(&[4, 4]));
            }),
            vec!["freqs_cis", "position 4"],
        ),
        (
            Box::new(|_, a| {
                a.insert("page_stride".into(), json!(1000));
            }),
            vec!["page_table", "page 1 >= num_pages 1"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[0, 2, 1, 4, 1, 8]));
            }),
            vec!["kv_blocks", "too small"],
        ),
        (
            Box::new(|_, a| {
                a.insert("page_stride".into(), json!(10));
            }),
            vec!["kv_blocks", "page_stride 10"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[2, 2, 1, 4, 8]));
                m.insert("block_keys".into(), f(&[2, 7]));
            }),
            vec!["block_keys", "7"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[2, 3, 1, 4, 1, 8]));
            }),
            vec!["kv_blocks", "axis 1"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[2, 2, 1, 4, 2, 8]));
            }),
            vec!["kv_blocks", "one KV head"],
        ),
        (
            Box::new(|_, a| {
                a.insert("layer_idx".into(), json!(1));
            }),
            vec!["layer_idx", "1 >= num_layers 1"],
        ),
        (
            Box::new(|m, _| {
                m.insert("block_keys".into(), f(&[3, 8]));
                m.insert("key_counts".into(), Tensor::from_i32(&[2], &[0, 0]));
                m.insert("cache_lengths".into(), Tensor::from_u32(&[2], &[0, 0]));
                m.insert(
                    "page_table".into(),
                    Tensor::from_u32(&[2, 2], &[0, 0, 0, 0]),
                );
            }),
            vec!["block_keys", "3 rows"],
        ),
        (
            Box::new(|m, _| {
                m.insert("cache_lengths".into(), Tensor::from_i32(&[1], &[-1]));
            }),
            vec!["cache_lengths", "-1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("ratio".into(), json!(1));
            }),
            vec!["ratio", "1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("mode".into(), json!("sometimes"));
            }),
            vec!["mode", "sometimes"],
        ),
        (
            Box::new(|_, a| {
                a.insert("rotary_dim".into(), json!(6));
            }),
            vec!["freqs_cis", "rotary_dim is 6"],
        ),
        (
            Box::new(|m, _| {
                m.insert("gamma".into(), f(&[4]));
            }),
            vec!["gamma", "[4]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("key_counts".into(), Tensor::from_i32(&[2], &[8, 8]));
            }),
            vec!["key_counts", "[1]"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = compress();
        edit(&mut m, &mut a);
        eprintln!("qsa_compress_paged rule {i}");
        expect_err(op, &m, &a, needles);
    }
}

#[test]
fn qsa_prepare_query_rules() {
    let op = "qsa_prepare_query";
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|m, _| {
                m.insert("rope_cos".into(), f(&[3, 4]));
                m.insert("rope_sin".into(), f(&[3, 4]));
            }),
            vec!["not both"],
        ),
        (
            Box::new(|m, _| {
                m.insert("positions".into(), Tensor::from_i32(&[3], &[0, 10, 1]));
            }),
            vec!["positions", "10"],
        ),
        (
            Box::new(|m, _| {
                m.insert("positions".into(), Tensor::from_i32(&[3], &[0, -2, 1]));
            }),
            vec!["positions", "-2"],
        ),
        (
            Box::new(|m, _| {
                m.remove("positions");
            }),
            vec!["positions"],
        ),
        (
            Box::new(|m, _| {
                m.remove("freqs_cis");
                m.remove("positions");
                m.insert("rope_cos".into(), f(&[3, 4]));
            }),
            vec!["rope_sin"],
        ),
        (
            Box::new(|m, _| {
                m.remove("freqs_cis");
                m.remove("positions");
                m.insert("rope_cos".into(), f(&[2, 4]));
                m.insert("rope_sin".into(), f(&[2, 4]));
            }),
            vec!["rope_cos", "2 rows"],
        ),
        (
            Box::new(|m, _| {
                m.insert("q_norm_weight".into(), f(&[9]));
            }),
            vec!["q_norm_weight", "[9]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("index_query_raw".into(), f(&[3, 8]));
            }),
            vec!["index_query_raw", "rank"],
        ),
        (
            Box::new(|m, _| {
                m.insert("index_query_raw".into(), f(&[3, 2, 4096]));
                m.insert("q_norm_weight".into(), f(&[4096]));
            }),
            vec!["index_query_raw", "4096"],
        ),
        (
            Box::new(|m, _| {
                m.insert("freqs_cis".into(), f(&[10, 3]));
            }),
            vec!["freqs_cis", "3"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = query();
        edit(&mut m, &mut a);
        eprintln!("qsa_prepare_query rule {i}");
        expect_err(op, &m, &a, needles);
    }
}

#[test]
fn sparse_attention_rules() {
    let op = "sparse_attention";
    let tokens = |v: &[i32]| Tensor::from_i32(&[2, 1, 4], v);
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|m, _| {
                m.remove("query");
            }),
            vec!["query", "missing"],
        ),
        (
            Box::new(|m, _| {
                m.remove("token_count");
            }),
            vec!["token_count", "missing"],
        ),
        (
            Box::new(|m, _| {
                m.insert("query".into(), Tensor::zeros(DType::I32, &[2, 2, 8]));
            }),
            vec!["query", "i32"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "kv_blocks".into(),
                    Tensor::zeros(DType::F16, &[3, 2, 1, 4, 1, 8]),
                );
            }),
            vec!["kv_blocks", "f16"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[3, 2, 1, 4, 1, 6]));
            }),
            vec!["kv_blocks", "head_dim 6"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[3, 2, 1, 4, 3, 8]));
            }),
            vec!["kv_blocks", "num_kv_heads 3"],
        ),
        (
            Box::new(|m, _| {
                m.insert("kv_blocks".into(), f(&[3, 2, 1, 4, 8]));
            }),
            vec!["kv_blocks", "[3, 2, 1, 4, 8]"],
        ),
        (
            Box::new(|_, a| {
                a.insert("layer_idx".into(), json!(1));
            }),
            vec!["layer_idx", "1 >= num_layers 1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("layer_idx".into(), json!(-1));
            }),
            vec!["layer_idx", "-1"],
        ),
        (
            Box::new(|_, a| {
                a.insert("page_stride".into(), json!(10));
            }),
            vec!["kv_blocks", "page_stride 10"],
        ),
        (
            Box::new(|_, a| {
                a.insert("scale".into(), json!("x"));
            }),
            vec!["scale"],
        ),
        (
            Box::new(|_, a| {
                a.insert("scale".into(), json!(1e39));
            }),
            vec!["scale", "finite in f32"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "page_table".into(),
                    Tensor::from_u32(&[2, 2], &[2, 0, 0, 0]),
                );
            }),
            vec!["page_table", "2 rows"],
        ),
        (
            Box::new(|m, _| {
                m.insert("page_table".into(), Tensor::from_u32(&[1, 2], &[2, 7]));
            }),
            vec!["page_table", "page 7 >= num_pages 3"],
        ),
        (
            Box::new(|m, _| {
                m.insert("page_table".into(), Tensor::from_u32(&[1, 1], &[2]));
            }),
            vec!["page_table", "column 1"],
        ),
        (
            Box::new(move |m, _| {
                m.insert("token_indices".into(), tokens(&[6, 0, 3, -1, 6, 1, 2, 4]));
            }),
            vec!["token_indices", "token 6", "0..=5"],
        ),
        (
            Box::new(move |m, _| {
                m.insert("token_indices".into(), tokens(&[5, 0, 3, -1, 6, -2, 2, 4]));
            }),
            vec!["token_indices", "-2"],
        ),
        (
            Box::new(|m, _| {
                m.insert("token_count".into(), Tensor::from_i32(&[2, 1], &[5, 4]));
            }),
            vec!["token_count", "count 5 outside 0..=4"],
        ),
        (
            Box::new(|m, _| {
                m.insert("token_count".into(), Tensor::from_i32(&[2, 1], &[3, -1]));
            }),
            vec!["token_count", "-1"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "token_count".into(),
                    Tensor::from_i32(&[2, 2], &[3, 3, 4, 4]),
                );
            }),
            vec!["token_count", "[2, 2]"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "token_indices".into(),
                    Tensor::from_i32(&[2, 3, 1], &[0; 6]),
                );
                m.insert("token_count".into(), Tensor::from_i32(&[2, 3], &[0; 6]));
            }),
            vec!["token_indices", "Hs dividing H = 2"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "token_indices".into(),
                    Tensor::from_i32(&[3, 1, 1], &[0; 3]),
                );
            }),
            vec!["token_indices", "T = 2"],
        ),
        (
            Box::new(|m, _| {
                m.insert("sinks".into(), f(&[3]));
            }),
            vec!["sinks", "[3]"],
        ),
        (
            Box::new(|m, _| {
                m.insert("sinks".into(), Tensor::zeros(DType::F16, &[2]));
            }),
            vec!["sinks", "f16"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "sinks".into(),
                    Tensor::from_f32(DType::F32, &[2], &[0.0, f32::NAN]),
                );
            }),
            vec!["sinks", "element 1 is NaN"],
        ),
        (
            Box::new(|m, _| {
                m.insert("row_offsets".into(), Tensor::from_u32(&[2], &[0, 1]));
            }),
            vec!["row_offsets", "must be T = 2"],
        ),
        (
            Box::new(|m, _| {
                m.insert("cache_lengths".into(), Tensor::from_i32(&[1], &[-1]));
            }),
            vec!["cache_lengths", "-1"],
        ),
        (
            Box::new(|m, _| {
                m.insert("query".into(), f(&[2, 2, 4096]));
                m.insert("kv_blocks".into(), f(&[3, 2, 1, 4, 1, 4096]));
            }),
            vec!["query", "4096"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = attention();
        edit(&mut m, &mut a);
        eprintln!("sparse_attention rule {i}");
        expect_err(op, &m, &a, needles);
    }
}

#[test]
fn unknown_operator() {
    let e = run_blocking(
        "qsa_nonsense",
        &TensorMap::new(),
        &AttrMap::new(),
        Exec::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("qsa_nonsense") && e.contains("qsa_prepare"),
        "{e}"
    );
}
