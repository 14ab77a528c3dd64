// Steps 1 and 2 of nsa_compress_attention's values stage (SPEC §8.1), shared by the portable
// kernel (nsa_compress_attention_values.wgsl) and its subgroup variant (…_values_sg.wgsl),
// which differ only in step 3 (their V row loads are in common/nsa_values_rows16.wgsl and
// the wide variant's file). The including shader declares the `scratch` and `psum` bindings.

const TILE: u32 = 128u;  // tokens per tile

var<workgroup> pt: array<mat4x4<f32>, TILE>;  // round_T(P) of the tile's tokens, by head
// bf16 (exact in half the loads): pb[2jj + h / 8][(h % 8) / 2] holds heads h, h + 1 (h even).
var<workgroup> pb: array<vec4<u32>, 2u * TILE>;
var<workgroup> vrow: array<u32, TILE>;        // element offset of each token's V row
var<workgroup> hstat: array<vec4<f32>, 8>;    // each head's max (quads 0 … 3), then sum

// The work of values workgroup id: query row r and KV head kv (rk = r·N2 + kv), split s2
// (tokens lo … hi − 1 of the vis visible ones), batch b, the ns1 stage-1 splits that hold
// visible tokens; skip for a row with nothing to do (a flag raised, padding, or no visible
// token in the split). KV heads vary fastest: workgroups that run together read the same
// cache rows. Workgroup-uniform control flow only (row_facts).
struct ValuesWork {
    kv: u32,
    s2: u32,
    r: u32,
    rk: u32,
    lo: u32,
    hi: u32,
    vis: u32,
    b: u32,
    ns1: u32,
    skip: bool,
}

fn values_work(id: u32, lid: u32) -> ValuesWork {
    let ns2 = splits2();
    let kv = id % P.n2;
    let s2 = (id / P.n2) % ns2;
    let r = id / (P.n2 * ns2);
    let lo = s2 * P.split2;
    let fx = row_facts(r, lid, lo, lo + P.split2, false);
    let vis = fx[INFO_VIS];
    let skip = fx[INFO_FLAGS] != 0u || fx[INFO_PAD] != 0u || lo >= vis;
    return ValuesWork(kv, s2, r, r * P.n2 + kv, lo, min(lo + P.split2, vis), vis, fx[INFO_B],
                      (vis + P.split1 - 1u) / P.split1, skip);
}

// bf16 bits of a quad, packed in pairs.
fn bf16_pairs(v: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(f32_to_bf16_bits(v.x) | (f32_to_bf16_bits(v.y) << 16u),
                     f32_to_bf16_bits(v.z) | (f32_to_bf16_bits(v.w) << 16u));
}

fn t_round4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(t_round(v.x), t_round(v.y), t_round(v.z), t_round(v.w));
}

// acc + v.x + v.y + v.z + v.w, in that order.
fn add4(acc: f32, v: vec4<f32>) -> f32 {
    return acc + v.x + v.y + v.z + v.w;
}

// Probabilities of quad i of the chunk from its heads' max m and sum l (zero past the group's
// heads).
fn probs(x: vec4<f32>, m: vec4<f32>, l: vec4<f32>, i: u32, h0: u32, g: u32) -> vec4<f32> {
    let p = exp(x - m) / l;
    let h = vec4<u32>(h0 + 4u * i) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), p, h < vec4<u32>(g));
}

// The softmax max and sum of head quad i of chunk hc of (query row, KV head) rk, merged from
// the ns1 stage-1 splits in split order; (0, 1) for a quad past the chunk's nq.
fn quad_stats(rk: u32, hc: u32, i: u32, nq: u32, ns1: u32) -> array<vec4<f32>, 2> {
    var ms = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(1.0));
    if (i < nq) {
        ms[1] = vec4<f32>(0.0);
        // Before the loop: splits1() divides by P.split1 (on llvmpipe eight scalar divisions).
        let st0 = stats_at(rk) + hc * splits1() * 8u + i;
        for (var s = 0u; s < ns1; s++) {
            let st = st0 + s * 8u;
            ms = merge4(ms[0], ms[1], scratch[st], scratch[st + 4u]);
        }
    }
    return ms;
}

// Step 1: the softmax max (quads 0 … 3) and sum (4 … 7) of each head of chunk hc of (query
// row, KV head) rk, merged by invocations 0 … 3, then handed to every invocation in registers
// (a workgroup read in the token loop is a loop over the lanes on llvmpipe). Workgroup-uniform
// control flow only (a barrier).
fn chunk_stats(lid: u32, rk: u32, hc: u32, nq: u32, ns1: u32) -> array<vec4<f32>, 8> {
    if (lid < 4u) {
        let ms = quad_stats(rk, hc, lid, nq, ns1);
        hstat[lid] = ms[0];
        hstat[4u + lid] = ms[1];
    }
    workgroupBarrier();
    return array<vec4<f32>, 8>(hstat[0], hstat[1], hstat[2], hstat[3], hstat[4], hstat[5],
                               hstat[6], hstat[7]);
}

// chunk_stats without workgroup memory or a barrier: every invocation merges the four quads
// itself (the same merges in the same order, so the same values). For a kernel whose token loop
// must stay free of barriers: on llvmpipe a barrier in a loop makes the shader's state live
// across a coroutine suspension, so LLVM keeps it in memory, the lane loops of the loads
// included.
fn chunk_stats_local(rk: u32, hc: u32, nq: u32, ns1: u32) -> array<vec4<f32>, 8> {
    let q0 = quad_stats(rk, hc, 0u, nq, ns1);
    let q1 = quad_stats(rk, hc, 1u, nq, ns1);
    let q2 = quad_stats(rk, hc, 2u, nq, ns1);
    let q3 = quad_stats(rk, hc, 3u, nq, ns1);
    return array<vec4<f32>, 8>(q0[0], q1[0], q2[0], q3[0], q0[1], q1[1], q2[1], q3[1]);
}

// P of token j's heads in chunk hc (nq quads; 0 past the group), from the logits and the
// chunk's max and sum (st: chunk_stats).
fn token_probs(rk: u32, j: u32, hc: u32, nq: u32, g: u32, st: array<vec4<f32>, 8>)
    -> mat4x4<f32> {
    let h0 = hc * HC;
    let xa = logits_at(rk) + j * quads() + hc * 4u;
    var p = mat4x4<f32>();
    p[0] = probs(scratch[xa], st[0], st[4], 0u, h0, g);
    if (nq > 1u) { p[1] = probs(scratch[xa + 1u], st[1], st[5], 1u, h0, g); }
    if (nq > 2u) { p[2] = probs(scratch[xa + 2u], st[2], st[6], 2u, h0, g); }
    if (nq > 3u) { p[3] = probs(scratch[xa + 3u], st[3], st[7], 3u, h0, g); }
    return p;
}

// The group's sum of P (chunk hc's heads, in head order) into psum element i: stored by the
// first chunk, added by the others.
fn add_psum(i: u32, hc: u32, p: mat4x4<f32>) {
    let sum = add4(add4(add4(add4(0.0, p[0]), p[1]), p[2]), p[3]);
    if (hc == 0u) {
        psum[i] = sum;
    } else {
        psum[i] += sum;
    }
}

// Step 2 for the tokens t0 … t0 + nt − 1 of the tile (an invocation every WG): P of the
// chunk's heads (0 past the group), with `sums` the group's sum of P into psum (added over the
// chunks), round_T(P) into pt (bf16: pb) and each token's V row offset into vrow. st:
// chunk_stats.
fn tile_probs(lid: u32, t0: u32, nt: u32, rk: u32, kv: u32, b: u32, hc: u32, nq: u32,
              g: u32, st: array<vec4<f32>, 8>, sums: bool) {
    let ps_row = rk * P.c_max;
    for (var jj = lid; jj < nt; jj += WG) {
        let j = t0 + jj;
        let p = token_probs(rk, j, hc, nq, g, st);
        if (sums) {
            add_psum(ps_row + j, hc, p);
        }
        if (T_KIND == 2u) {
            pb[2u * jj] = vec4<u32>(bf16_pairs(p[0]), bf16_pairs(p[1]));
            pb[2u * jj + 1u] = vec4<u32>(bf16_pairs(p[2]), bf16_pairs(p[3]));
        } else {
            pt[jj] = mat4x4<f32>(t_round4(p[0]), t_round4(p[1]), t_round4(p[2]), t_round4(p[3]));
        }
        vrow[jj] = (cache_row(b, j) * P.n2 + kv) * P.dv;
    }
}

// Accumulated values of channel ch (if it exists) for the chunk's nq quads.
fn store_part(a: mat4x4<f32>, ch: u32, at: u32, nq: u32) {
    if (ch < P.dv) {
        let t = at + ch * quads();
        scratch[t] = a[0];
        if (nq > 1u) { scratch[t + 1u] = a[1]; }
        if (nq > 2u) { scratch[t + 2u] = a[2]; }
        if (nq > 3u) { scratch[t + 3u] = a[3]; }
    }
}

// Stage 2's part `part` of split s2 of (query row, KV head) rk for chunk hc: the
// accumulators of this invocation's channels cb … cb + 15 (a0 … a15), for each head of the
// chunk.
fn store_parts(rk: u32, s2: u32, nparts: u32, part: u32, hc: u32, cb: u32, nq: u32,
               a0: mat4x4<f32>, a1: mat4x4<f32>, a2: mat4x4<f32>, a3: mat4x4<f32>,
               a4: mat4x4<f32>, a5: mat4x4<f32>, a6: mat4x4<f32>, a7: mat4x4<f32>,
               a8: mat4x4<f32>, a9: mat4x4<f32>, a10: mat4x4<f32>, a11: mat4x4<f32>,
               a12: mat4x4<f32>, a13: mat4x4<f32>, a14: mat4x4<f32>, a15: mat4x4<f32>) {
    let at = partial_at(rk) + (s2 * nparts + part) * P.dv * quads() + hc * 4u;
    store_part(a0, cb, at, nq);
    store_part(a1, cb + 1u, at, nq);
    store_part(a2, cb + 2u, at, nq);
    store_part(a3, cb + 3u, at, nq);
    store_part(a4, cb + 4u, at, nq);
    store_part(a5, cb + 5u, at, nq);
    store_part(a6, cb + 6u, at, nq);
    store_part(a7, cb + 7u, at, nq);
    store_part(a8, cb + 8u, at, nq);
    store_part(a9, cb + 9u, at, nq);
    store_part(a10, cb + 10u, at, nq);
    store_part(a11, cb + 11u, at, nq);
    store_part(a12, cb + 12u, at, nq);
    store_part(a13, cb + 13u, at, nq);
    store_part(a14, cb + 14u, at, nq);
    store_part(a15, cb + 15u, at, nq);
}

// round_T(P) of tile token jj, as step 2 left it.
fn tile_p(jj: u32) -> mat4x4<f32> {
    if (T_KIND == 2u) {
        let w0 = pb[2u * jj];
        let w1 = pb[2u * jj + 1u];
        return mat4x4<f32>(lo4(w0), hi4(w0), lo4(w1), hi4(w1));
    }
    return pt[jj];
}
