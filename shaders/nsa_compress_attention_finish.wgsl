// nsa_compress_attention (SPEC §8.1), stage 3 of 3: outputs and selection scores. One
// workgroup per (query row, KV head). Its invocations take (channel, quad of heads) pairs and
// add up stage 2's parts of the splits that hold visible tokens, in part order, into out
// (rounded to T once). Then they map the group's summed probabilities onto the selection
// blocks by Ascend's mapping, with S' = l'/d, N' = l/d:
//   agg[o] = Σ_{m<S'} Σ_{n<N'} psum[S'(o+1) − m − n] = Σ_u mult(u) · psum[S'(o+1) − u],
//   mult(u) = #{(m, n): m + n = u} = min(u, S'−1, N'−1, S'+N'−2−u) + 1,
// terms outside 0 … vis − 1 being 0; blocks 0, nsel−2, nsel−1 get +inf; o >= nsel gets −inf so
// the block_topk stage that follows ignores it. BSND padding rows get a zero output and an
// all −inf score row (so −1 indices). A row whose lengths or any block-table entry (visible
// token or not, as stages 1 and 2 only check the entries they read) are out of range is
// skipped: nothing written, a flag raised.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl

@group(0) @binding(4) var<storage, read> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(5) var<storage, read> psum: array<f32>;                // [R·N2, c_max] f32
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>;  // [R, N1, Dv] T
@group(0) @binding(7) var<storage, read_write> scores: array<f32>;       // [R·N2, W] f32

fn st_out(i: u32, v: f32) {
    atomicAnd(&out[t_word(i)], t_keep(i));
    atomicOr(&out[t_word(i)], t_bits(v, i));
}

fn mult(u: u32, sp: u32, np: u32) -> f32 {
    return f32(min(min(u, sp - 1u), min(np - 1u, sp + np - 2u - u)) + 1u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wg.y * nwg.x + wg.x;  // (query row, KV head)
    if (row >= P.rows * P.n2) {
        return;
    }
    let r = row / P.n2;
    let fx = row_facts(r, lid, 0u, 0u, true);
    if (fx[INFO_FLAGS] != 0u) {
        return;
    }
    // Parts of the splits with visible tokens (none on padding rows: a zero output).
    var nparts = 0u;
    if (fx[INFO_PAD] == 0u) {
        nparts = (fx[INFO_VIS] + P.split2 - 1u) / P.split2 * parts_per_split();
    }
    let g = group_size();
    let nq = quads();
    let at = partial_at(row);
    let o0 = (row * g) * P.dv;  // out of head 0 of the group
    // Whole words where they can be: f32, or two neighbouring channels of 16-bit T when Dv is
    // even (each word then belongs to one invocation: a plain atomicStore, where the halves
    // of a word written by two invocations each take an atomicAnd and an atomicOr, which
    // llvmpipe runs lane by lane).
    let pairs = T_KIND != 0u && P.dv % 2u == 0u;
    let per = select(1u, 2u, pairs);
    for (var i = lid; i < P.dv / per * nq; i += WG) {
        let ch = i / nq * per;
        let q = i % nq;
        var acc = vec4<f32>(0.0);
        var acc1 = vec4<f32>(0.0);
        for (var p = 0u; p < nparts; p++) {
            let e = at + p * P.dv * nq + ch * nq + q;
            acc += scratch[e];
            if (pairs) {
                acc1 += scratch[e + nq];
            }
        }
        for (var x = 0u; x < 4u; x++) {
            let h = 4u * q + x;
            if (h < g) {
                let e = o0 + h * P.dv + ch;
                if (T_KIND == 0u) {
                    atomicStore(&out[e], bitcast<u32>(acc[x]));
                } else if (pairs) {
                    atomicStore(&out[e >> 1u], t_bits(acc[x], 0u) | t_bits(acc1[x], 1u));
                } else {
                    st_out(e, acc[x]);
                }
            }
        }
    }
    let score_row = row * P.w;
    if (fx[INFO_PAD] != 0u) {
        for (var o = lid; o < P.w; o += WG) {
            scores[score_row + o] = neg_inf();
        }
        return;
    }
    let vis = fx[INFO_VIS];
    let nsel = fx[INFO_NSEL];
    let ps_row = row * P.c_max;
    let sp = P.lsel / P.d;
    let np = P.l / P.d;
    for (var o = lid; o < P.w; o += WG) {
        var v = neg_inf();
        if (o < nsel) {
            if (o == 0u || o + 2u >= nsel) {
                v = pos_inf();
            } else {
                let a = sp * (o + 1u);
                var acc = 0.0;
                for (var u = 0u; u + 1u < sp + np && u <= a; u++) {
                    let j = a - u;
                    if (j < vis) {
                        acc += mult(u, sp, np) * psum[ps_row + j];
                    }
                }
                v = acc;
            }
        }
        scores[score_row + o] = v;
    }
}
