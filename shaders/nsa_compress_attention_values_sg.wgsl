// nsa_compress_attention (SPEC §8.1), stage 2 of 3, subgroup variant: probabilities and values
// as nsa_compress_attention_values.wgsl, for adapters whose subgroups are 8 lanes, where V rows
// start on 16-byte boundaries and Dv takes 8 channel tiles (113 ≤ Dv ≤ 128, as NSA's 128).
// Same bindings, work split, scratch records and psum; steps 1 and 2 are the same.
//
// Step 3 differs in who reads what. Subgroup u takes part u of the tile (parts = subgroups =
// 8) and lane sl its channel tile (CT = 16 channels), so all lanes of a subgroup work on the
// same token. The portable kernel has every invocation read each token's probabilities and V
// row offset from workgroup memory; on llvmpipe each such read is a loop over the lanes, and
// there were more of them than V loads. Here the lanes read eight tokens' probabilities and
// offsets at once, one token each, and subgroupShuffle (a single vector permute on llvmpipe)
// hands each token's to every lane in turn.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T (read through value4 here)
@group(0) @binding(5) var<storage, read> value4: array<vec4<u32>>;  // the same, 16 bytes a load (or a dummy)
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

const TILE: u32 = 128u;

// As in nsa_compress_attention_values.wgsl; this variant runs only where it is 1 (V read 16
// bytes at a time through value4).
override BY16: u32 = 1u;

var<workgroup> pt: array<mat4x4<f32>, TILE>;  // round_T(P) of the tile's tokens, by head
// bf16 (exact in half the loads): pb[2jj + h / 8][(h % 8) / 2] holds heads h, h + 1 (h even).
var<workgroup> pb: array<vec4<u32>, 2u * TILE>;
var<workgroup> vrow: array<u32, TILE>;        // element offset of each token's V row
var<workgroup> hstat: array<vec4<f32>, 8>;    // each head's max (quads 0 … 3), then sum

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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sub: u32, @builtin(subgroup_invocation_id) sl: u32) {
    let id = wg.y * nwg.x + wg.x;
    let g = group_size();
    let ns2 = splits2();
    if (id >= P.rows * P.n2 * ns2) {
        return;
    }
    // KV heads vary fastest: workgroups that run together read the same cache rows.
    let kv = id % P.n2;
    let s2 = (id / P.n2) % ns2;
    let r = id / (P.n2 * ns2);
    let rk = r * P.n2 + kv;  // (query row, KV head)
    let lo = s2 * S2;
    let fx = row_facts(r, lid, lo, lo + S2, false);
    let vis = fx[INFO_VIS];
    if (fx[INFO_FLAGS] != 0u || fx[INFO_PAD] != 0u || lo >= vis) {
        return;
    }
    let b = fx[INFO_B];
    let hi = min(lo + S2, vis);
    let ns1 = (vis + S1 - 1u) / S1;  // stage-1 splits that hold visible tokens
    let nparts = parts_per_split();  // 8: one per subgroup
    let part = sub;
    let cb = sl * CT;  // first channel of this invocation
    let ps_row = rk * P.c_max;

    for (var hc = 0u; hc < head_chunks(); hc++) {
        let h0 = hc * HC;  // first head of the chunk within the group
        let nq = min(4u, quads() - hc * 4u);
        // 1. Softmax max and sum of each head of the chunk, a quad per invocation.
        if (lid < 4u) {
            var ms = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(1.0));
            if (lid < nq) {
                ms[1] = vec4<f32>(0.0);
                for (var s = 0u; s < ns1; s++) {
                    let st = stats_at(rk) + (hc * splits1() + s) * 8u + lid;
                    ms = merge4(ms[0], ms[1], scratch[st], scratch[st + 4u]);
                }
            }
            hstat[lid] = ms[0];
            hstat[4u + lid] = ms[1];
        }
        // Into registers once per chunk (a workgroup read in the token loop is a loop over the
        // lanes on llvmpipe).
        workgroupBarrier();
        let m0 = hstat[0];
        let m1 = hstat[1];
        let m2 = hstat[2];
        let m3 = hstat[3];
        let l0 = hstat[4];
        let l1 = hstat[5];
        let l2 = hstat[6];
        let l3 = hstat[7];
        var a0 = mat4x4<f32>();
        var a1 = mat4x4<f32>();
        var a2 = mat4x4<f32>();
        var a3 = mat4x4<f32>();
        var a4 = mat4x4<f32>();
        var a5 = mat4x4<f32>();
        var a6 = mat4x4<f32>();
        var a7 = mat4x4<f32>();
        var a8 = mat4x4<f32>();
        var a9 = mat4x4<f32>();
        var a10 = mat4x4<f32>();
        var a11 = mat4x4<f32>();
        var a12 = mat4x4<f32>();
        var a13 = mat4x4<f32>();
        var a14 = mat4x4<f32>();
        var a15 = mat4x4<f32>();
        for (var t0 = lo; t0 < hi; t0 += TILE) {
            let nt = min(TILE, hi - t0);
            workgroupBarrier();
            // 2. Probabilities of the tile's tokens; heads past the group get 0.
            for (var jj = lid; jj < nt; jj += WG) {
                let j = t0 + jj;
                let xa = logits_at(rk) + j * quads() + hc * 4u;
                var p = mat4x4<f32>();
                p[0] = probs(scratch[xa], m0, l0, 0u, h0, g);
                if (nq > 1u) { p[1] = probs(scratch[xa + 1u], m1, l1, 1u, h0, g); }
                if (nq > 2u) { p[2] = probs(scratch[xa + 2u], m2, l2, 2u, h0, g); }
                if (nq > 3u) { p[3] = probs(scratch[xa + 3u], m3, l3, 3u, h0, g); }
                // The group's sum of P, in head order.
                let sum = add4(add4(add4(add4(0.0, p[0]), p[1]), p[2]), p[3]);
                if (hc == 0u) {
                    psum[ps_row + j] = sum;
                } else {
                    psum[ps_row + j] += sum;
                }
                if (T_KIND == 2u) {
                    pb[2u * jj] = vec4<u32>(bf16_pairs(p[0]), bf16_pairs(p[1]));
                    pb[2u * jj + 1u] = vec4<u32>(bf16_pairs(p[2]), bf16_pairs(p[3]));
                } else {
                    pt[jj] = mat4x4<f32>(t_round4(p[0]), t_round4(p[1]), t_round4(p[2]), t_round4(p[3]));
                }
                vrow[jj] = (cache_row(b, j) * P.n2 + kv) * P.dv;
            }
            workgroupBarrier();
            // 3. round_T(P)·V over this subgroup's part of the tile, eight tokens at a time:
            // lane k reads token jj0 + k's P and V row offset; each token's go to every lane
            // by subgroupShuffle. Channel groups past Dv read the row's last group and are
            // dropped.
            {
                let per = TILE / nparts;
                let end = min(nt, part * per + per);
                for (var jj0 = part * per; jj0 < end; jj0 += 8u) {
                    let mine = min(jj0 + sl, end - 1u);
                    var pl = mat4x4<f32>();
                    if (T_KIND == 2u) {
                        let w0 = pb[2u * mine];
                        let w1 = pb[2u * mine + 1u];
                        pl = mat4x4<f32>(lo4(w0), hi4(w0), lo4(w1), hi4(w1));
                    } else {
                        pl = pt[mine];
                    }
                    let vl = vrow[mine];
                    for (var k = 0u; k < min(8u, end - jj0); k++) {
                        let p = mat4x4<f32>(subgroupShuffle(pl[0], k), subgroupShuffle(pl[1], k),
                                            subgroupShuffle(pl[2], k), subgroupShuffle(pl[3], k));
                        let vb = subgroupShuffle(vl, k);
                        var v0 = vec4<f32>();
                        var v1 = vec4<f32>();
                        var v2 = vec4<f32>();
                        var v3 = vec4<f32>();
                        if (T_KIND == 0u) {
                            let last = P.dv - 4u;
                            v0 = bitcast<vec4<f32>>(value4[(vb + min(cb, last)) / 4u]);
                            v1 = bitcast<vec4<f32>>(value4[(vb + min(cb + 4u, last)) / 4u]);
                            v2 = bitcast<vec4<f32>>(value4[(vb + min(cb + 8u, last)) / 4u]);
                            v3 = bitcast<vec4<f32>>(value4[(vb + min(cb + 12u, last)) / 4u]);
                        } else {
                            let last = P.dv - 8u;
                            let w0 = value4[(vb + min(cb, last)) / 8u];
                            v0 = lo4(w0);
                            v1 = hi4(w0);
                            let w1 = value4[(vb + min(cb + 8u, last)) / 8u];
                            v2 = lo4(w1);
                            v3 = hi4(w1);
                        }
                        a0 += p * v0.x;
                        a1 += p * v0.y;
                        a2 += p * v0.z;
                        a3 += p * v0.w;
                        a4 += p * v1.x;
                        a5 += p * v1.y;
                        a6 += p * v1.z;
                        a7 += p * v1.w;
                        a8 += p * v2.x;
                        a9 += p * v2.y;
                        a10 += p * v2.z;
                        a11 += p * v2.w;
                        a12 += p * v3.x;
                        a13 += p * v3.y;
                        a14 += p * v3.z;
                        a15 += p * v3.w;
                    }
                }
            }
        }
        // This invocation's part of the split, for each head of the chunk.
        {
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
        workgroupBarrier();
    }
}
