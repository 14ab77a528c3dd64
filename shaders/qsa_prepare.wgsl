// qsa_prepare (SPEC §1): block keys from new raw index keys, dense form.
// One workgroup per (sequence n, output row b) for b < B: copies a past block key, computes
// a block completed by this call (mean of its r raw keys, RMS norm, RoPE of its first
// token), or writes zeros. Workgroup b = B of each sequence writes the incomplete-block state.

//#include common/dtype.wgsl
//#include common/rowmath.wgsl

struct QsaPrepareParams {
    n: u32,          // sequences
    l: u32,          // new tokens per sequence
    di: u32,         // channels
    r: u32,          // key_block_size
    dr: u32,         // rotary channels (0: no rope)
    bp: u32,         // rows of past_block_index_keys
    b_out: u32,      // rows of block_index_keys (max_n S_n / r)
    norm_on: u32,
    eps: f32,
    offset: f32,     // norm_weight_offset
    cos_off: u32,    // element offsets of the segments of `aux`
    sin_off: u32,
    prope_off: u32,
    w_off: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: QsaPrepareParams;
@group(0) @binding(1) var<storage, read> raw: array<u32>;          // [N, L, Di] T
@group(0) @binding(2) var<storage, read> past_blocks: array<u32>;  // [N, Bp, Di] T
@group(0) @binding(3) var<storage, read> past_inc: array<u32>;     // [N, r-1, Di] T
// T segments: rope_cos [N, L, Dr] | rope_sin [N, L, Dr] | past_incomplete_rope [N, 2·Dr] | k_norm_weight [Di]
@group(0) @binding(4) var<storage, read> aux: array<u32>;
@group(0) @binding(5) var<storage, read> key_len: array<u32>;      // [N] S_n, validated by the host
@group(0) @binding(6) var<storage, read_write> out_blocks: array<atomic<u32>>; // [N, B, Di] T
@group(0) @binding(7) var<storage, read_write> out_inc: array<atomic<u32>>;    // [N, r-1, Di] T
@group(0) @binding(8) var<storage, read_write> out_rope: array<atomic<u32>>;   // [N, 2·Dr] T

fn ld_raw(i: u32) -> f32 { return t_load(raw[t_word(i)], i); }
fn ld_past_blocks(i: u32) -> f32 { return t_load(past_blocks[t_word(i)], i); }
fn ld_past_inc(i: u32) -> f32 { return t_load(past_inc[t_word(i)], i); }
fn ld_aux(i: u32) -> f32 { return t_load(aux[t_word(i)], i); }

fn st_blocks(i: u32, v: f32) {
    atomicAnd(&out_blocks[t_word(i)], t_keep(i));
    atomicOr(&out_blocks[t_word(i)], t_bits(v, i));
}
fn st_inc(i: u32, v: f32) {
    atomicAnd(&out_inc[t_word(i)], t_keep(i));
    atomicOr(&out_inc[t_word(i)], t_bits(v, i));
}
fn st_rope(i: u32, v: f32) {
    atomicAnd(&out_rope[t_word(i)], t_keep(i));
    atomicOr(&out_rope[t_word(i)], t_bits(v, i));
}

// Raw key channel c of position pos of sequence n: from the past unfinished block when the
// token arrived in an earlier call, else from this call's new tokens.
fn raw_key(n: u32, past: u32, pos: u32, c: u32) -> f32 {
    if (pos < past) {
        let row_in_block = pos - (past / P.r) * P.r;
        return ld_past_inc((n * (P.r - 1u) + row_in_block) * P.di + c);
    }
    return ld_raw((n * P.l + (pos - past)) * P.di + c);
}

// cos (which = 0) or sin (which = 1) of channel c for the token at pos.
fn rope_cs(n: u32, past: u32, pos: u32, c: u32, which: u32) -> f32 {
    if (pos < past) {
        return ld_aux(P.prope_off + n * 2u * P.dr + which * P.dr + c);
    }
    let base = select(P.cos_off, P.sin_off, which == 1u);
    return ld_aux(base + (n * P.l + (pos - past)) * P.dr + c);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let per_seq = P.b_out + 1u;
    if (id >= P.n * per_seq) {
        return;
    }
    let n = id / per_seq;
    let b = id % per_seq;
    let s = key_len[n];
    let past = s - P.l;
    let r = P.r;

    if (b == P.b_out) {
        // incomplete-block state of sequence n
        let pend = s % r;
        let start = (s / r) * r;
        for (var i = lid; i < (r - 1u) * P.di; i += WG) {
            let j = i / P.di;
            let c = i % P.di;
            var v = 0.0;
            if (j < pend) {
                v = raw_key(n, past, start + j, c);
            }
            st_inc(n * (r - 1u) * P.di + i, v);
        }
        if (P.dr > 0u) {
            for (var i = lid; i < 2u * P.dr; i += WG) {
                var v = 0.0;
                if (pend > 0u) {
                    v = rope_cs(n, past, start, i % P.dr, i / P.dr);
                }
                st_rope(n * 2u * P.dr + i, v);
            }
        }
        return;
    }

    let dst = (n * P.b_out + b) * P.di;
    if (b < past / r) {
        for (var c = lid; c < P.di; c += WG) {
            st_blocks(dst + c, ld_past_blocks((n * P.bp + b) * P.di + c));
        }
        return;
    }
    if (b >= s / r) {
        for (var c = lid; c < P.di; c += WG) {
            st_blocks(dst + c, 0.0);
        }
        return;
    }

    // 1. mean of the r raw keys
    let first = b * r;
    for (var c = lid; c < P.di; c += WG) {
        var acc = 0.0;
        for (var j = 0u; j < r; j++) {
            acc += raw_key(n, past, first + j, c);
        }
        row[c] = acc / f32(r);
    }
    workgroupBarrier();
    // 2. RMS norm
    if (P.norm_on != 0u) {
        let inv = wg_rms_factor(lid, P.di, P.eps);
        for (var c = lid; c < P.di; c += WG) {
            row[c] = row[c] * inv * (P.offset + ld_aux(P.w_off + c));
        }
        workgroupBarrier();
    }
    // 3. RoPE of the first token, then store
    for (var c = lid; c < P.di; c += WG) {
        var v = row[c];
        if (c < P.dr) {
            v = rope_at(c, P.dr, rope_cs(n, past, first, c, 0u), rope_cs(n, past, first, c, 1u));
        }
        st_blocks(dst + c, v);
    }
}
