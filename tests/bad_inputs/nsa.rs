//! The host-checkable rules of SPEC §8 (nsa_compress_attention, nsa_compress), through the
//! same `expect_err` as the QSA rules: CPU and GPU alike, before any dispatch.

use super::{expect_err, f, util, Edit};
use qsa_wgpu::ops::{run_blocking, AttrMap, Exec, TensorMap};
use qsa_wgpu::{DType, Tensor};
use serde_json::json;

/// A valid TND call: B = 2, q_len (2, 1), N1 = 4, N2 = 2, Dqk = 8, Dv = 6, cache blocks of 4,
/// c = (9, 6) so nsel = (3, 2), k = 2, causal. The unused table entry −5 is never read.
fn attention() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("query".into(), f(&[3, 4, 8]));
    m.insert("key".into(), f(&[4, 4, 16]));
    m.insert("value".into(), f(&[4, 4, 12]));
    let table = Tensor::from_i32(&[2, 3], &[0, 1, 2, 3, 0, -5]);
    m.insert("block_table".into(), table);
    m.insert("actual_q_len".into(), Tensor::from_i32(&[2], &[2, 1]));
    m.insert("actual_cmp_kv_len".into(), Tensor::from_i32(&[2], &[9, 6]));
    m.insert(
        "actual_sel_kv_len".into(),
        Tensor::from_i32(&[2], &[160, 112]),
    );
    let a = [
        ("num_heads", json!(4)),
        ("num_kv_heads", json!(2)),
        ("compress_block_size", json!(32)),
        ("compress_stride", json!(16)),
        ("select_block_size", json!(64)),
        ("select_block_count", json!(2)),
        ("causal_mask", json!(true)),
        ("layout", json!("TND")),
    ];
    (m, a.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// A valid call: sequences of 5 and 2 tokens, N = 2, D = 4, l = 3, d = 2.
fn compress() -> (TensorMap, AttrMap) {
    let mut m = TensorMap::new();
    m.insert("input".into(), f(&[7, 2, 4]));
    m.insert("weight".into(), f(&[3, 2]));
    m.insert("seq_lens".into(), Tensor::from_i32(&[2], &[5, 2]));
    let a = AttrMap::from([("l".to_string(), json!(3)), ("d".to_string(), json!(2))]);
    (m, a)
}

fn ins(name: &'static str, t: Tensor) -> Edit {
    Box::new(move |m, _| {
        m.insert(name.into(), t.clone());
    })
}

fn set(name: &'static str, v: serde_json::Value) -> Edit {
    Box::new(move |_, a| {
        a.insert(name.into(), v.clone());
    })
}

fn i32s(v: &[i32]) -> Tensor {
    Tensor::from_i32(&[v.len()], v)
}

#[test]
fn valid_nsa_calls_pass() {
    let ctx = util::ctx();
    for (op, (m, a)) in [
        ("nsa_compress_attention", attention()),
        ("nsa_compress", compress()),
    ] {
        let cpu = run_blocking(op, &m, &a, Exec::Cpu).unwrap();
        assert_eq!(cpu, run_blocking(op, &m, &a, Exec::Gpu(&ctx)).unwrap());
    }
}

#[test]
fn nsa_compress_attention_rules() {
    let op = "nsa_compress_attention";
    let drop_sel: Edit = Box::new(|m, _| {
        m.remove("actual_sel_kv_len");
    });
    let bsnd = |q: &[usize]| -> Edit {
        let q = f(q);
        Box::new(move |m, a| {
            a.insert("layout".into(), json!("BSND"));
            m.insert("query".into(), q.clone());
        })
    };
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            set("select_block_count", json!(3)),
            vec!["select_block_count", "nsel = 2", "batch 1"],
        ),
        (
            set("select_block_count", json!(0)),
            vec!["select_block_count", "must be >= 1", "0"],
        ),
        (
            set("select_block_count", json!(99_999_999_999i64)),
            vec!["select_block_count", "at most", "99999999999"],
        ),
        (
            Box::new(|_, a| {
                a.remove("select_block_count");
            }),
            vec!["select_block_count", "missing"],
        ),
        (set("layout", json!("NTD")), vec!["layout", "NTD"]),
        (set("layout", json!("BSND")), vec!["query", "rank"]),
        (
            set("compress_stride", json!(5)),
            vec!["compress_stride", "5"],
        ),
        (
            set("select_block_size", json!(16)),
            vec!["select_block_size", "16"],
        ),
        (
            set("select_block_size", json!(40)),
            vec!["select_block_size", "40"],
        ),
        (set("num_kv_heads", json!(3)), vec!["key", "N2 = 3"]),
        (set("num_heads", json!(5)), vec!["num_heads", "5"]),
        (set("causal_mask", json!("yes")), vec!["causal_mask"]),
        (set("scale", json!("x")), vec!["scale"]),
        (
            ins("actual_q_len", i32s(&[2, 2])),
            vec!["actual_q_len", "4"],
        ),
        (
            ins("actual_q_len", i32s(&[3])),
            vec!["actual_q_len", "[2]", "actual_cmp_kv_len has B = 2"],
        ),
        (
            ins("actual_q_len", i32s(&[0, 3])),
            vec!["actual_q_len", "0"],
        ),
        (
            ins("actual_cmp_kv_len", i32s(&[0, 6])),
            vec!["actual_cmp_kv_len", "0"],
        ),
        (
            ins("actual_cmp_kv_len", i32s(&[13, 6])),
            vec!["block_table", "4 columns"],
        ),
        (
            ins(
                "block_table",
                Tensor::from_i32(&[2, 3], &[0, 1, 4, 3, 0, 0]),
            ),
            vec!["block_table", "block 4"],
        ),
        (
            ins(
                "block_table",
                Tensor::from_i32(&[2, 3], &[0, -1, 2, 3, 0, 0]),
            ),
            vec!["block_table", "-1"],
        ),
        (
            ins("block_table", Tensor::from_i32(&[3, 3], &[0; 9])),
            vec!["block_table", "3 rows"],
        ),
        (drop_sel, vec!["actual_sel_kv_len", "missing"]),
        (
            ins("actual_sel_kv_len", i32s(&[160, 0])),
            vec!["actual_sel_kv_len", "0"],
        ),
        (ins("value", f(&[4, 5, 12])), vec!["value", "[4, 5, 12]"]),
        (
            ins("value", Tensor::zeros(DType::F16, &[4, 4, 12])),
            vec!["value", "f16"],
        ),
        (ins("value", f(&[4, 4, 13])), vec!["value", "13"]),
        (ins("query", f(&[3, 4, 600])), vec!["query", "600"]),
        (
            Box::new(|m, a| {
                a.remove("num_kv_heads");
                m.insert("key".into(), f(&[4, 4, 12]));
            }),
            vec!["key", "12"],
        ),
        (
            Box::new(|m, a| {
                a.remove("num_heads");
                m.insert("query".into(), f(&[3, 3, 8]));
            }),
            vec!["num_kv_heads", "does not divide"],
        ),
        (bsnd(&[3, 2, 4, 8]), vec!["query", "3 batches"]),
        (bsnd(&[2, 1, 4, 8]), vec!["actual_q_len", "exceeds S = 1"]),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = attention();
        edit(&mut m, &mut a);
        eprintln!("{op} rule {i}");
        expect_err(op, &m, &a, needles);
    }
}

#[test]
fn nsa_compress_rules() {
    let op = "nsa_compress";
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|m, _| {
                m.remove("input");
            }),
            vec!["input", "missing"],
        ),
        (
            Box::new(|_, a| {
                a.remove("d");
            }),
            vec!["d", "missing"],
        ),
        (set("l", json!(0)), vec!["l", "0"]),
        (set("d", json!(0)), vec!["d", "0"]),
        (set("d", json!(1 << 21)), vec!["d", "at most", "2097152"]),
        (set("l", json!(-3)), vec!["l", "must be >= 1", "-3"]),
        (ins("weight", f(&[4, 2])), vec!["weight", "[3, 2]"]),
        (
            ins("weight", Tensor::zeros(DType::BF16, &[3, 2])),
            vec!["weight", "bf16"],
        ),
        (ins("input", f(&[7, 8])), vec!["input", "rank"]),
        (ins("seq_lens", i32s(&[5, 3])), vec!["seq_lens", "8"]),
        (ins("seq_lens", i32s(&[-1, 8])), vec!["seq_lens", "-1"]),
        (ins("seq_lens", f(&[2])), vec!["seq_lens", "f32"]),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut m, mut a) = compress();
        edit(&mut m, &mut a);
        eprintln!("{op} rule {i}");
        expect_err(op, &m, &a, needles);
    }
}
