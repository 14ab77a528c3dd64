//! nsa_compress: the CPU reference against a hand-computed batch (windows never cross
//! sequences, short sequences give none), the GPU against the CPU for every storage type over
//! ragged batches with odd widths (f16/bf16 words straddling rows), and the device-side check
//! of inconsistent offsets.

mod util;

use qsa_wgpu::ops::common::{flag_word, read_checked};
use qsa_wgpu::ops::nsa_compress::{
    cpu, encode_nsa_compress, gpu, windows, NsaCompressAttrs, NsaCompressBuffers, NsaCompressInputs,
};
use qsa_wgpu::testing::{compare, Rng, Tol};
use qsa_wgpu::{gpu::GpuTensor, DType, Error, Tensor};

fn tol(dt: DType) -> Tol {
    qsa_wgpu::testing::weighted_sum_tol(dt)
}

#[test]
fn hand_checked_windows() {
    // Two sequences of 5 and 2 tokens, N = 1, D = 2, l = 3, d = 2: sequence 0 has windows at
    // tokens 0..3 and 2..5, sequence 1 (2 < l tokens) none. Token t holds (t, 10·t).
    let input: Vec<f32> = (0..7).flat_map(|t| [t as f32, 10.0 * t as f32]).collect();
    let input = Tensor::from_f32(DType::F32, &[7, 1, 2], &input);
    let weight = Tensor::from_f32(DType::F32, &[3, 1], &[1.0, 0.5, -1.0]);
    let seq_lens = Tensor::from_i32(&[2], &[5, 2]);
    let x = NsaCompressInputs {
        input: &input,
        weight: &weight,
        seq_lens: &seq_lens,
    };
    let a = NsaCompressAttrs { l: 3, d: 2 };
    // Window 0: 0 + 0.5·1 − 2 = −1.5; window 1: 2 + 0.5·3 − 4 = −0.5 (×10 in channel 1).
    let want = vec![-1.5, -15.0, -0.5, -5.0];
    cpu_and_gpu_give(&x, &a, &want);
    assert_eq!(cpu(&x, &a).unwrap().shape, vec![2, 1, 2]);
    // Putting the short sequence first moves the windows but never mixes the sequences.
    let swapped: Vec<f32> = (0..7)
        .map(|t| (t + 5) % 7)
        .flat_map(|t| [t as f32, 10.0 * t as f32])
        .collect();
    let input = Tensor::from_f32(DType::F32, &[7, 1, 2], &swapped);
    let seq_lens = Tensor::from_i32(&[2], &[2, 5]);
    let x = NsaCompressInputs {
        input: &input,
        weight: &weight,
        seq_lens: &seq_lens,
    };
    assert_eq!(cpu(&x, &a).unwrap().to_f32(), want);
    assert_eq!(windows(5, 3, 2), 2);
    assert_eq!(windows(3, 3, 2), 1);
    assert_eq!(windows(2, 3, 2), 0);

    // A stride longer than the window (SPEC §8.2 counts windows the same way): 7 tokens,
    // l = 2, d = 3 give windows at tokens 0..2 and 3..5; tokens 2, 5 and 6 are in none.
    let input: Vec<f32> = (0..7).flat_map(|t| [t as f32, 10.0 * t as f32]).collect();
    let input = Tensor::from_f32(DType::F32, &[7, 1, 2], &input);
    let weight = Tensor::from_f32(DType::F32, &[2, 1], &[1.0, -2.0]);
    let seq_lens = Tensor::from_i32(&[1], &[7]);
    let x = NsaCompressInputs {
        input: &input,
        weight: &weight,
        seq_lens: &seq_lens,
    };
    // Window 0: 0 − 2·1 = −2; window 1: 3 − 2·4 = −5 (×10 in channel 1).
    assert_eq!(windows(7, 2, 3), 2);
    cpu_and_gpu_give(
        &x,
        &NsaCompressAttrs { l: 2, d: 3 },
        &[-2.0, -20.0, -5.0, -50.0],
    );
}

/// The CPU reference and the GPU both give exactly `want`.
fn cpu_and_gpu_give(x: &NsaCompressInputs, a: &NsaCompressAttrs, want: &[f32]) {
    assert_eq!(cpu(x, a).unwrap().to_f32(), want);
    let got = pollster::block_on(gpu(&util::ctx(), x, a)).unwrap();
    assert_eq!(got.to_f32(), want);
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(82);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (l, d, n, dim) in [
            (32, 16, 2, 64),
            (16, 16, 3, 33),
            (7, 3, 1, 5),
            (4, 1, 2, 17),
            (3, 5, 2, 9),
        ] {
            let b = 1 + rng.below(4);
            let lens: Vec<i32> = (0..b)
                .map(|_| [0, l - 1, l, l + 1, 3 * l + 5][rng.below(5)] as i32)
                .collect();
            let t: i32 = lens.iter().sum();
            let input = rng.tensor(dt, &[t as usize, n, dim]);
            let weight = rng.tensor(dt, &[l, n]);
            let seq_lens = Tensor::from_i32(&[b], &lens);
            let x = NsaCompressInputs {
                input: &input,
                weight: &weight,
                seq_lens: &seq_lens,
            };
            let a = NsaCompressAttrs { l, d };
            let want = cpu(&x, &a).unwrap();
            let got = pollster::block_on(gpu(&ctx, &x, &a)).unwrap();
            compare(&got, &want, tol(dt))
                .unwrap_or_else(|e| panic!("{dt} l={l} d={d} n={n} D={dim} lens={lens:?}: {e}"));
            cases += 1;
        }
    }
    assert_eq!(cases, 15);
}

#[test]
fn paper_geometry_bf16() {
    // l = 32, d = 16, N = 4 KV heads, D = 192, about three thousand raw tokens in 3 sequences.
    let mut rng = Rng::new(5);
    let lens = [1500, 31, 1617];
    let input = rng.tensor(DType::BF16, &[3148, 4, 192]);
    let weight = rng.tensor(DType::BF16, &[32, 4]);
    let seq_lens = Tensor::from_i32(&[3], &lens);
    let x = NsaCompressInputs {
        input: &input,
        weight: &weight,
        seq_lens: &seq_lens,
    };
    let a = NsaCompressAttrs { l: 32, d: 16 };
    let want = cpu(&x, &a).unwrap();
    assert_eq!(want.shape, vec![92 + 100, 4, 192]);
    let got = pollster::block_on(gpu(&util::ctx(), &x, &a)).unwrap();
    compare(&got, &want, tol(DType::BF16)).unwrap();
}

#[test]
fn inconsistent_device_offsets_raise_a_flag() {
    // The encode API reads offsets from a device buffer: a window that would run past its
    // sequence is written as 0 and flagged, never read out of bounds.
    let ctx = util::ctx();
    let mut rng = Rng::new(9);
    let input = rng.tensor(DType::F16, &[10, 1, 4]);
    let weight = rng.tensor(DType::F16, &[4, 1]);
    let seq_lens = Tensor::from_i32(&[1], &[10]);
    let x = NsaCompressInputs {
        input: &input,
        weight: &weight,
        seq_lens: &seq_lens,
    };
    let a = NsaCompressAttrs { l: 4, d: 2 };
    let plan = qsa_wgpu::ops::nsa_compress::validate(&x, &a).unwrap();
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let (inp, w) = (up(&input), up(&weight));
    let out = GpuTensor::filled(&ctx, "out", DType::F16, &[plan.windows(), 1, 4], 0xff).unwrap();
    for (offs, ok) in [(plan.offsets(), true), (vec![0, 7, 0, 4], false)] {
        let offsets = up(&Tensor::from_u32(&[4], &offs));
        let flags = flag_word(&ctx).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let bufs = NsaCompressBuffers {
            input: &inp.buffer,
            weight: &w.buffer,
            offsets: &offsets.buffer,
            out: &out.buffer,
            flags: &flags.buffer,
        };
        pollster::block_on(encode_nsa_compress(
            &ctx,
            &mut enc,
            DType::F16,
            &plan.params(&a),
            &bufs,
        ))
        .unwrap();
        pollster::block_on(ctx.submit("test", enc)).unwrap();
        let got = pollster::block_on(read_checked(&ctx, "nsa_compress", &[&out], &flags));
        match (ok, got) {
            (true, Ok(g)) => compare(&g[0], &cpu(&x, &a).unwrap(), tol(DType::F16)).unwrap(),
            (false, Err(Error::Device { msg, .. })) => assert!(msg.contains("NSA"), "{msg}"),
            (_, other) => panic!("offsets {offs:?}: unexpected {other:?}"),
        }
    }
}
