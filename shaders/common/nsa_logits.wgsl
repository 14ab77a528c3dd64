// The end of nsa_compress_attention's logits stage (SPEC §8.1), shared by the portable kernel
// (nsa_compress_attention.wgsl) and its subgroup variant (…_sg.wgsl): each invocation's 16
// tokens' dot products (a0 … a15, token j0 + 64·t in a_t) become logits in the scratch, and
// the workgroup's max and sum of exp per head its split's statistics. The including shader
// declares the `scratch` binding.

const DC: u32 = 128u;  // the portable kernel's query channels staged at a time; 2·WG merge slots

// Portable kernel: qs[c][h / 4][h % 4] = q of chunk head h, channel c. Both: the merge below.
var<workgroup> qs: array<mat4x4<f32>, DC>;

// Channels c … c + 3 (query q0 … q3, keys k) added to accumulator a, in channel order.
fn acc4(a: mat4x4<f32>, q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>, q3: mat4x4<f32>,
        k: vec4<f32>) -> mat4x4<f32> {
    return a + q0 * k.x + q1 * k.y + q2 * k.z + q3 * k.w;
}

fn mmax(a: mat4x4<f32>, b: mat4x4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]));
}
fn mexp(a: mat4x4<f32>, m: mat4x4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(exp(a[0] - m[0]), exp(a[1] - m[1]), exp(a[2] - m[2]), exp(a[3] - m[3]));
}

// Logits of token j (if visible) for the chunk's nq quads, at quad `at` of the logits.
fn store_x(x: mat4x4<f32>, j: u32, vis: u32, at: u32, nq: u32) {
    if (j < vis) {
        let t = at + j * quads();
        scratch[t] = x[0];
        if (nq > 1u) { scratch[t + 1u] = x[1]; }
        if (nq > 2u) { scratch[t + 2u] = x[2]; }
        if (nq > 3u) { scratch[t + 3u] = x[3]; }
    }
}

// The work of logits workgroup id: query row r, KV head kv, head chunk hc, split s1 of ns1
// (tokens lo … lo + P.split1 − 1 of the vis visible ones), batch b, the chunk's first query head h0
// and its nh heads; skip for a workgroup past the grid's work or a row with nothing to do (a
// flag raised, padding, or no visible token in the split). Workgroup-uniform control flow only
// (row_facts).
// The KV head varies fastest with id, then the split: llvmpipe hands each of its threads a
// contiguous run of workgroup ids, so each thread reads whole K rows of its own token range
// rather than one head's slice of every row (the f32 logits stage 7.6 -> 7.0 ms, median of
// eight alternating runs). A GPU runs the workgroups together either way.
struct LogitsWork {
    r: u32,
    kv: u32,
    hc: u32,
    s1: u32,
    ns1: u32,
    lo: u32,
    vis: u32,
    b: u32,
    h0: u32,
    nh: u32,
    skip: bool,
}

fn logits_work(id: u32, lid: u32) -> LogitsWork {
    let g = group_size();
    let nhc = head_chunks();
    let ns1 = splits1();
    if (id >= P.rows * P.n2 * nhc * ns1) {
        return LogitsWork(0u, 0u, 0u, 0u, ns1, 0u, 0u, 0u, 0u, 0u, true);
    }
    let kv = id % P.n2;
    let s1 = (id / P.n2) % ns1;
    let hc = (id / (P.n2 * ns1)) % nhc;
    let r = id / (P.n2 * ns1 * nhc);
    let lo = s1 * P.split1;
    let fx = row_facts(r, lid, lo, lo + P.split1, false);
    let vis = fx[INFO_VIS];
    let skip = fx[INFO_FLAGS] != 0u || fx[INFO_PAD] != 0u || lo >= vis;
    return LogitsWork(r, kv, hc, s1, ns1, lo, vis, fx[INFO_B], kv * g + hc * HC,
                      min(HC, g - hc * HC), skip);
}

// Element offset of the K row (KV head kv, batch b) of token j; a token past vis takes the
// last visible row.
fn key_row(b: u32, kv: u32, j: u32, vis: u32) -> u32 {
    return cache_row(b, min(j, vis - 1u)) * P.n2 * P.dqk + kv * P.dqk;
}

// key_row of an invocation's 16 tokens j0 + 64·t.
fn key_rows16(b: u32, kv: u32, j0: u32, vis: u32) -> array<u32, 16> {
    return array<u32, 16>(
        key_row(b, kv, j0, vis), key_row(b, kv, j0 + 64u, vis),
        key_row(b, kv, j0 + 128u, vis), key_row(b, kv, j0 + 192u, vis),
        key_row(b, kv, j0 + 256u, vis), key_row(b, kv, j0 + 320u, vis),
        key_row(b, kv, j0 + 384u, vis), key_row(b, kv, j0 + 448u, vis),
        key_row(b, kv, j0 + 512u, vis), key_row(b, kv, j0 + 576u, vis),
        key_row(b, kv, j0 + 640u, vis), key_row(b, kv, j0 + 704u, vis),
        key_row(b, kv, j0 + 768u, vis), key_row(b, kv, j0 + 832u, vis),
        key_row(b, kv, j0 + 896u, vis), key_row(b, kv, j0 + 960u, vis));
}

// Workgroup-uniform control flow only (barriers). Head chunk hc of (query row, KV head) rk,
// split s1 of ns1.
fn finish_logits(lid: u32, j0: u32, vis: u32, rk: u32, hc: u32, ns1: u32, s1: u32,
                 x0: mat4x4<f32>, x1: mat4x4<f32>, x2: mat4x4<f32>, x3: mat4x4<f32>,
                 x4: mat4x4<f32>, x5: mat4x4<f32>, x6: mat4x4<f32>, x7: mat4x4<f32>,
                 x8: mat4x4<f32>, x9: mat4x4<f32>, x10: mat4x4<f32>, x11: mat4x4<f32>,
                 x12: mat4x4<f32>, x13: mat4x4<f32>, x14: mat4x4<f32>, x15: mat4x4<f32>) {
    // Logits of the visible tokens, then this invocation's max and sum of exp per head.
    let a0 = x0 * P.scale;
    let a1 = x1 * P.scale;
    let a2 = x2 * P.scale;
    let a3 = x3 * P.scale;
    let a4 = x4 * P.scale;
    let a5 = x5 * P.scale;
    let a6 = x6 * P.scale;
    let a7 = x7 * P.scale;
    let a8 = x8 * P.scale;
    let a9 = x9 * P.scale;
    let a10 = x10 * P.scale;
    let a11 = x11 * P.scale;
    let a12 = x12 * P.scale;
    let a13 = x13 * P.scale;
    let a14 = x14 * P.scale;
    let a15 = x15 * P.scale;
    let at = logits_at(rk) + hc * 4u;
    let nq = min(4u, quads() - hc * 4u);
    store_x(a0, j0, vis, at, nq);
    store_x(a1, j0 + 64u, vis, at, nq);
    store_x(a2, j0 + 128u, vis, at, nq);
    store_x(a3, j0 + 192u, vis, at, nq);
    store_x(a4, j0 + 256u, vis, at, nq);
    store_x(a5, j0 + 320u, vis, at, nq);
    store_x(a6, j0 + 384u, vis, at, nq);
    store_x(a7, j0 + 448u, vis, at, nq);
    store_x(a8, j0 + 512u, vis, at, nq);
    store_x(a9, j0 + 576u, vis, at, nq);
    store_x(a10, j0 + 640u, vis, at, nq);
    store_x(a11, j0 + 704u, vis, at, nq);
    store_x(a12, j0 + 768u, vis, at, nq);
    store_x(a13, j0 + 832u, vis, at, nq);
    store_x(a14, j0 + 896u, vis, at, nq);
    store_x(a15, j0 + 960u, vis, at, nq);
    // Token 0 of the invocation is visible whenever any is; the later ones only if theirs is.
    let ni = neg_inf();
    var m = mat4x4<f32>(vec4<f32>(ni), vec4<f32>(ni), vec4<f32>(ni), vec4<f32>(ni));
    var s = mat4x4<f32>();
    if (j0 < vis) { m = a0; }
    if (j0 + 64u < vis) { m = mmax(m, a1); }
    if (j0 + 128u < vis) { m = mmax(m, a2); }
    if (j0 + 192u < vis) { m = mmax(m, a3); }
    if (j0 + 256u < vis) { m = mmax(m, a4); }
    if (j0 + 320u < vis) { m = mmax(m, a5); }
    if (j0 + 384u < vis) { m = mmax(m, a6); }
    if (j0 + 448u < vis) { m = mmax(m, a7); }
    if (j0 + 512u < vis) { m = mmax(m, a8); }
    if (j0 + 576u < vis) { m = mmax(m, a9); }
    if (j0 + 640u < vis) { m = mmax(m, a10); }
    if (j0 + 704u < vis) { m = mmax(m, a11); }
    if (j0 + 768u < vis) { m = mmax(m, a12); }
    if (j0 + 832u < vis) { m = mmax(m, a13); }
    if (j0 + 896u < vis) { m = mmax(m, a14); }
    if (j0 + 960u < vis) { m = mmax(m, a15); }
    if (j0 < vis) { s = mexp(a0, m); }
    if (j0 + 64u < vis) { s += mexp(a1, m); }
    if (j0 + 128u < vis) { s += mexp(a2, m); }
    if (j0 + 192u < vis) { s += mexp(a3, m); }
    if (j0 + 256u < vis) { s += mexp(a4, m); }
    if (j0 + 320u < vis) { s += mexp(a5, m); }
    if (j0 + 384u < vis) { s += mexp(a6, m); }
    if (j0 + 448u < vis) { s += mexp(a7, m); }
    if (j0 + 512u < vis) { s += mexp(a8, m); }
    if (j0 + 576u < vis) { s += mexp(a9, m); }
    if (j0 + 640u < vis) { s += mexp(a10, m); }
    if (j0 + 704u < vis) { s += mexp(a11, m); }
    if (j0 + 768u < vis) { s += mexp(a12, m); }
    if (j0 + 832u < vis) { s += mexp(a13, m); }
    if (j0 + 896u < vis) { s += mexp(a14, m); }
    if (j0 + 960u < vis) { s += mexp(a15, m); }

    // Merge the invocations in invocation order, one quad of heads each (the portable
    // kernel's staging slots are free now).
    workgroupBarrier();
    qs[lid] = m;
    qs[WG + lid] = s;
    workgroupBarrier();
    if (lid < 4u) {
        var ms = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
        for (var l = 0u; l < WG; l++) {
            ms = merge4(ms[0], ms[1], qs[l][lid], qs[WG + l][lid]);
        }
        let st = stats_at(rk) + (hc * ns1 + s1) * 8u + lid;
        scratch[st] = ms[0];
        scratch[st + 4u] = ms[1];
    }
}
