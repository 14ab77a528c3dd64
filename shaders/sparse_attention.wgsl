// sparse_attention, stage 2 of 3 (SPEC §7): partial GQA attention of query heads over a range
// of the tokens their selection group gathered that lie in one shard of the main paged KV pool.
// Stage 1 (sparse_attention_route.wgsl) has resolved the token lists into per-shard row lists;
// stage 3 (sparse_attention_combine.wgsl) merges the partials, adds the sink and rounds.
// Queries and keys have E channels, values Ev (a pool row has Dp = max(E, Ev) channels per head;
// common/attention.wgsl): scores read the first E channels of a K row, the V step the first Ev
// of a V row, and the partial results hold Ev channels.
//
// Work split (flash-decoding): one workgroup per (row t, KV head kh, part, split s). A part is a
// segment (the heads of kh's group that share one selection group, so one token list) cut into
// head chunks of at most hc heads, times a channel block of the V step (Ev > 512 only; each
// block repeats the scores). Split s takes entries s · split_len … (s + 1) · split_len − 1 of
// the bound shard's row list and writes partial results (layout in common/attention.wgsl). A
// pool larger than one binding is split into shards of whole pages, one dispatch each; the
// dispatch of shard k > 0 continues the partials the previous one left.
//
// The workgroup takes its rows in tiles of up to 256:
//   1. invocation j scores tile rows j, j + 64, j + 128, j + 192: z = scale · q_h · K for every
//      head of the chunk, four heads per mat4x4 product; each query quad read from `sh` serves
//      four rows (workgroup-memory reads dominate on llvmpipe);
//   2. the running maximum of each head: the invocation's four rows first, then one atomicMax
//      per head over order-preserving bit patterns; sums and accumulators are rescaled;
//   3. in rounds of 32 rows, the rows' owners store their weights e^{z − m}, then invocation
//      (f, i) adds Σ_j w_hj · V_j for channel quads 2i, 2i + 1 of every head over the round's
//      rows of phase f (rows f, f + phases, …), keeping its own sum l per head.
// llvmpipe (Mesa's CPU driver) runs 8 invocations per SIMD vector: every memory access is a loop
// over the lanes, both sides of a branch run, a small loop is not unrolled, a private array
// indexed by a variable lives in memory. So heads and rows go in fixed registers (vec4 scores,
// mat4x4 accumulators, selected by the override HQ), and each memory read feeds many
// multiply-adds. llvmpipe also ends every loop of an invocation after 65535 iterations in total;
// the host sizes split_len so a workgroup stays well inside that.

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl

// Head quads per workgroup: scores, maxima, sums and accumulators of up to 4 · HQ heads.
override HQ: u32 = 3u;

const TK: u32 = 64u;          // invocations
const TILE: u32 = 256u;       // rows per tile: four per invocation in step 1
const RT: u32 = 32u;          // rows per round of step 3
const SHV: u32 = 864u;        // vec4s of `sh`; the host keeps hc · E8 + RT · HQ <= SHV

// Queries [hc, E8] (E8: E4 rounded up to even, zero-padded) at 0, then a round's weights
// [RT, HQ] at hc · E8.
var<workgroup> sh: array<vec4<f32>, SHV>;
// Shard offsets (page, row, KV head; no plane) of the tile's tokens.
var<workgroup> rows: array<u32, TILE>;
// Running maximum of each head as order-preserving bits.
var<workgroup> m_bits: array<atomic<u32>, 16>;
// The split's range in the shard's row list.
var<workgroup> range: vec2<u32>;

// Order-preserving u32 image of an f32 (for atomicMax), and back.
fn ord(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
fn unord(u: u32) -> f32 {
    return bitcast<f32>(select(~u, u & 0x7fffffffu, (u & 0x80000000u) != 0u));
}

// Channels c … c + 7 of the pool row starting at element i, as two quads (c a multiple of 8
// under VEC for 16-bit types, of 4 otherwise); channels >= e read as 0.
fn ld_pair(i: u32, c: u32, e: u32) -> mat2x4<f32> {
    let j = i + c;
    var a = vec4<f32>();
    var b = vec4<f32>();
    if (VEC != 0u && T_KIND == 0u) {
        a = bitcast<vec4<f32>>(pool[j >> 2u]);
        b = bitcast<vec4<f32>>(pool[(j >> 2u) + 1u]);
    } else if (VEC != 0u) {
        let v = pool[j >> 3u];
        a = vec4<f32>(t_load(v.x, 0u), t_load(v.x, 1u), t_load(v.y, 0u), t_load(v.y, 1u));
        b = vec4<f32>(t_load(v.z, 0u), t_load(v.z, 1u), t_load(v.w, 0u), t_load(v.w, 1u));
    } else {
        a = vec4<f32>(ld_el(j), ld_el(j + 1u), ld_el(j + 2u), ld_el(j + 3u));
        b = vec4<f32>(ld_el(j + 4u), ld_el(j + 5u), ld_el(j + 6u), ld_el(j + 7u));
    }
    let ca = vec4<u32>(c, c + 1u, c + 2u, c + 3u);
    let ve = vec4<u32>(e);
    return mat2x4<f32>(select(vec4<f32>(0.0), a, ca < ve),
                       select(vec4<f32>(0.0), b, ca + vec4<u32>(4u) < ve));
}
// The query rows of heads 4q … 4q + 3 (heads past hc repeat the last one), as vec4 indices.
fn qrows(q: u32, hc: u32, e4: u32) -> vec4<u32> {
    return min(vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(hc - 1u)) * e4;
}
fn qmat(r: vec4<u32>, c4: u32) -> mat4x4<f32> {
    return mat4x4<f32>(sh[r.x + c4], sh[r.y + c4], sh[r.z + c4], sh[r.w + c4]);
}
fn max4(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>) -> vec4<f32> {
    return max(max(a, b), max(c, d));
}
fn m_new(q: u32) -> vec4<f32> {
    return vec4<f32>(unord(atomicLoad(&m_bits[4u * q])), unord(atomicLoad(&m_bits[4u * q + 1u])),
                     unord(atomicLoad(&m_bits[4u * q + 2u])), unord(atomicLoad(&m_bits[4u * q + 3u])));
}
// The weights e^{y − n} of a row's scores y (0 for a row past the list, whose scores are LOW;
// NaN for a poisoning score: common/attention.wgsl).
fn weights(y: vec4<f32>, n: vec4<f32>, ok: bool) -> vec4<f32> {
    return select(select(vec4<f32>(0.0), exp(y - n), ok), nan4(), poisons(y));
}

fn max_into(q: u32, m: vec4<f32>) {
    atomicMax(&m_bits[4u * q], ord(m.x));
    atomicMax(&m_bits[4u * q + 1u], ord(m.y));
    atomicMax(&m_bits[4u * q + 2u], ord(m.z));
    atomicMax(&m_bits[4u * q + 3u], ord(m.w));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let pw = part_work(wg.y * nwg.x + wg.x);
    if (pw.hc == 0u) {
        return;
    }
    let rr = pw.rr;
    let t = pw.t;
    let kh = pw.kh;
    let g = pw.g;
    let split = pw.split;
    let h0 = pw.h0;
    let hc = pw.hc;
    let cb = pw.cb;

    // The split's range of the shard's row list.
    if (lid == 0u) {
        range = split_range((rr * P.hs + g) * (P.shards + 1u + P.w), split);
    }
    let e = P.e;                         // query / key channels
    let e4 = (e + 3u) / 4u;
    let e8 = e4 + (e4 & 1u);
    let ev = v_dim();                    // value channels
    let v4 = (ev + 3u) / 4u;
    let v8 = v4 + (v4 & 1u);
    let rs = v4 + P.cblocks;
    let mlq = v4 + cb;                   // this channel block's (m, l) in a record
    let wb = hc * e8;                    // the round's weights in `sh`
    let lpp = TK / P.phases;             // invocations per phase in step 3
    let ph = lid / lpp;
    let cq = (cb * lpp + lid % lpp) * 2u; // this invocation's two channel quads of Ev in step 3
    let cqa = min(cq, v4 - 1u);
    let cqb = min(cq + 1u, v4 - 1u);
    let cqv = min(cq, v8 - 2u);           // the pair read in step 3
    let nsub = P.splits * P.phases;
    let base = (rr * P.h + h0) * nsub + split * P.phases + ph;

    let rg = workgroupUniformLoad(&range);
    if (rg.y == 0u) {
        // Nothing in this shard: the first one leaves empty partials, later ones keep theirs.
        if (P.shard == 0u) {
            let zero = mat4x4<f32>();
            let none = vec4<f32>(LOW);
            for (var q = 0u; q < HQ; q++) {
                if (cq < v4) { put_acc(base, nsub, q, hc, rs, cq, zero); }
                if (cq + 1u < v4) { put_acc(base, nsub, q, hc, rs, cq + 1u, zero); }
                if (lid % lpp == 0u) {
                    put_acc(base, nsub, q, hc, rs, mlq, ml_rec(none, vec4<f32>(0.0)));
                }
            }
        }
        return;
    }
    // Queries of the chunk's heads into `sh`, zero-padded to whole quad pairs.
    for (var i = lid; i < hc * e8; i += TK) {
        sh[i] = ld_q((t * P.h + h0 + i / e8) * e, 4u * (i % e8), e);
    }
    // Running state (m per head quad; l and the accumulators a<quad><channel quad> of this
    // invocation's phase): fresh, or the previous shard's partials.
    var m0 = vec4<f32>(LOW);
    var m1 = vec4<f32>(LOW);
    var m2 = vec4<f32>(LOW);
    var m3 = vec4<f32>(LOW);
    var l0 = vec4<f32>(0.0);
    var l1 = vec4<f32>(0.0);
    var l2 = vec4<f32>(0.0);
    var l3 = vec4<f32>(0.0);
    var a00 = mat4x4<f32>();
    var a01 = mat4x4<f32>();
    var a10 = mat4x4<f32>();
    var a11 = mat4x4<f32>();
    var a20 = mat4x4<f32>();
    var a21 = mat4x4<f32>();
    var a30 = mat4x4<f32>();
    var a31 = mat4x4<f32>();
    if (P.shard != 0u) {
        for (var q = 0u; q < HQ; q++) {
            let ml = get_acc(base, nsub, q, hc, rs, mlq);
            let m = ml_m(ml);
            let l = ml_l(ml);
            let a = get_acc(base, nsub, q, hc, rs, cqa);
            let b = get_acc(base, nsub, q, hc, rs, cqb);
            if (q == 0u) { m0 = m; l0 = l; a00 = a; a01 = b; }
            if (q == 1u) { m1 = m; l1 = l; a10 = a; a11 = b; }
            if (q == 2u) { m2 = m; l2 = l; a20 = a; a21 = b; }
            if (q == 3u) { m3 = m; l3 = l; a30 = a; a31 = b; }
        }
    }
    if (lid < 16u) {
        var m = m0;
        if (lid / 4u == 1u) { m = m1; }
        if (lid / 4u == 2u) { m = m2; }
        if (lid / 4u == 3u) { m = m3; }
        atomicStore(&m_bits[lid], ord(m[lid % 4u]));
    }
    workgroupBarrier(); // the queries and m_bits are in place
    let r0 = qrows(0u, hc, e8);
    let r1 = qrows(1u, hc, e8);
    let r2 = qrows(2u, hc, e8);
    let r3 = qrows(3u, hc, e8);

    for (var base_row = 0u; base_row < rg.y; base_row += TILE) {
        let tl = min(TILE, rg.y - base_row);
        for (var j = lid; j < tl; j += TK) {
            rows[j] = routes[rg.x + base_row + j] + kh * pool_dim();
        }
        workgroupBarrier();

        // 1. Scores of rows lid + 64·s (rows past the tile repeat its last one, then read LOW).
        let last = tl - 1u;
        let k0 = rows[min(lid, last)] + P.k_off;
        let k1 = rows[min(lid + 64u, last)] + P.k_off;
        let k2 = rows[min(lid + 128u, last)] + P.k_off;
        let k3 = rows[min(lid + 192u, last)] + P.k_off;
        var z00 = vec4<f32>(0.0); var z01 = vec4<f32>(0.0); var z02 = vec4<f32>(0.0); var z03 = vec4<f32>(0.0);
        var z10 = vec4<f32>(0.0); var z11 = vec4<f32>(0.0); var z12 = vec4<f32>(0.0); var z13 = vec4<f32>(0.0);
        var z20 = vec4<f32>(0.0); var z21 = vec4<f32>(0.0); var z22 = vec4<f32>(0.0); var z23 = vec4<f32>(0.0);
        var z30 = vec4<f32>(0.0); var z31 = vec4<f32>(0.0); var z32 = vec4<f32>(0.0); var z33 = vec4<f32>(0.0);
        for (var c4 = 0u; c4 < e4; c4 += 2u) {
            // Quads c4 and c4 + 1 of the rows' keys (rows past the tile read as 0), then of
            // each head quad's queries: one pair of query matrices live at a time.
            let c = 4u * c4;
            let x0 = ld_pair(k0, c, e);
            var x1 = mat2x4<f32>();
            var x2 = mat2x4<f32>();
            var x3 = mat2x4<f32>();
            if (tl > 64u) { x1 = ld_pair(k1, c, e); }
            if (tl > 128u) { x2 = ld_pair(k2, c, e); }
            if (tl > 192u) { x3 = ld_pair(k3, c, e); }
            var q = qmat(r0, c4);
            var p = qmat(r0, c4 + 1u);
            z00 += x0[0] * q + x0[1] * p;
            z10 += x1[0] * q + x1[1] * p;
            z20 += x2[0] * q + x2[1] * p;
            z30 += x3[0] * q + x3[1] * p;
            if (HQ > 1u) {
                q = qmat(r1, c4);
                p = qmat(r1, c4 + 1u);
                z01 += x0[0] * q + x0[1] * p;
                z11 += x1[0] * q + x1[1] * p;
                z21 += x2[0] * q + x2[1] * p;
                z31 += x3[0] * q + x3[1] * p;
            }
            if (HQ > 2u) {
                q = qmat(r2, c4);
                p = qmat(r2, c4 + 1u);
                z02 += x0[0] * q + x0[1] * p;
                z12 += x1[0] * q + x1[1] * p;
                z22 += x2[0] * q + x2[1] * p;
                z32 += x3[0] * q + x3[1] * p;
            }
            if (HQ > 3u) {
                q = qmat(r3, c4);
                p = qmat(r3, c4 + 1u);
                z03 += x0[0] * q + x0[1] * p;
                z13 += x1[0] * q + x1[1] * p;
                z23 += x2[0] * q + x2[1] * p;
                z33 += x3[0] * q + x3[1] * p;
            }
        }
        let low = vec4<f32>(LOW);
        let sc = P.scale;
        let v0 = lid < tl;
        let v1 = lid + 64u < tl;
        let v2 = lid + 128u < tl;
        let v3 = lid + 192u < tl;
        z00 = select(low, z00 * sc, v0); z01 = select(low, z01 * sc, v0);
        z02 = select(low, z02 * sc, v0); z03 = select(low, z03 * sc, v0);
        z10 = select(low, z10 * sc, v1); z11 = select(low, z11 * sc, v1);
        z12 = select(low, z12 * sc, v1); z13 = select(low, z13 * sc, v1);
        z20 = select(low, z20 * sc, v2); z21 = select(low, z21 * sc, v2);
        z22 = select(low, z22 * sc, v2); z23 = select(low, z23 * sc, v2);
        z30 = select(low, z30 * sc, v3); z31 = select(low, z31 * sc, v3);
        z32 = select(low, z32 * sc, v3); z33 = select(low, z33 * sc, v3);

        // 2. Running maxima; rescaled sums and accumulators.
        max_into(0u, max4(z00, z10, z20, z30));
        if (HQ > 1u) { max_into(1u, max4(z01, z11, z21, z31)); }
        if (HQ > 2u) { max_into(2u, max4(z02, z12, z22, z32)); }
        if (HQ > 3u) { max_into(3u, max4(z03, z13, z23, z33)); }
        workgroupBarrier();
        let n0 = m_new(0u);
        var n1 = m1;
        var n2 = m2;
        var n3 = m3;
        if (HQ > 1u) { n1 = m_new(1u); }
        if (HQ > 2u) { n2 = m_new(2u); }
        if (HQ > 3u) { n3 = m_new(3u); }
        let al0 = exp(m0 - n0);
        l0 *= al0; a00 = rescale(a00, al0); a01 = rescale(a01, al0);
        if (HQ > 1u) {
            let al1 = exp(m1 - n1);
            l1 *= al1; a10 = rescale(a10, al1); a11 = rescale(a11, al1);
        }
        if (HQ > 2u) {
            let al2 = exp(m2 - n2);
            l2 *= al2; a20 = rescale(a20, al2); a21 = rescale(a21, al2);
        }
        if (HQ > 3u) {
            let al3 = exp(m3 - n3);
            l3 *= al3; a30 = rescale(a30, al3); a31 = rescale(a31, al3);
        }
        m0 = n0;
        m1 = n1;
        m2 = n2;
        m3 = n3;

        // 3. Rounds of RT rows: row j·RT + i belongs to invocation (j % 2)·RT + i, slot j / 2.
        let rounds = (tl + RT - 1u) / RT;
        for (var r = 0u; r < rounds; r++) {
            let slot = r / 2u;
            var y0 = z00; var y1 = z01; var y2 = z02; var y3 = z03;
            if (slot == 1u) { y0 = z10; y1 = z11; y2 = z12; y3 = z13; }
            if (slot == 2u) { y0 = z20; y1 = z21; y2 = z22; y3 = z23; }
            if (slot == 3u) { y0 = z30; y1 = z31; y2 = z32; y3 = z33; }
            if (lid / RT == r % 2u) {
                let ok = lid + 64u * slot < tl;
                let w = wb + (lid % RT) * HQ;
                sh[w] = weights(y0, n0, ok);
                if (HQ > 1u) { sh[w + 1u] = weights(y1, n1, ok); }
                if (HQ > 2u) { sh[w + 2u] = weights(y2, n2, ok); }
                if (HQ > 3u) { sh[w + 3u] = weights(y3, n3, ok); }
            }
            workgroupBarrier();
            let rt = min(RT, tl - r * RT);
            for (var s = ph; s < rt; s += P.phases) {
                let x = ld_pair(rows[r * RT + s] + P.v_off, 4u * cqv, ev);
                let va = x[0];
                let vb = x[1];
                let w = wb + s * HQ;
                let w0 = sh[w];
                l0 += w0; a00 = axpy(a00, w0, va); a01 = axpy(a01, w0, vb);
                if (HQ > 1u) {
                    let w1 = sh[w + 1u];
                    l1 += w1; a10 = axpy(a10, w1, va); a11 = axpy(a11, w1, vb);
                }
                if (HQ > 2u) {
                    let w2 = sh[w + 2u];
                    l2 += w2; a20 = axpy(a20, w2, va); a21 = axpy(a21, w2, vb);
                }
                if (HQ > 3u) {
                    let w3 = sh[w + 3u];
                    l3 += w3; a30 = axpy(a30, w3, va); a31 = axpy(a31, w3, vb);
                }
            }
            workgroupBarrier(); // the weights and the tile's rows are free again
        }
    }

    // The partial results of this invocation's phase: its channel quads of every head, and
    // (m, l) from the phase's first invocation, into the channel block's own copy.
    if (cq < v4) {
        put_acc(base, nsub, 0u, hc, rs, cq, a00);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, cq, a10); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, cq, a20); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, cq, a30); }
    }
    if (cq + 1u < v4) {
        put_acc(base, nsub, 0u, hc, rs, cq + 1u, a01);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, cq + 1u, a11); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, cq + 1u, a21); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, cq + 1u, a31); }
    }
    if (lid % lpp == 0u) {
        put_acc(base, nsub, 0u, hc, rs, mlq, ml_rec(m0, l0));
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, mlq, ml_rec(m1, l1)); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, mlq, ml_rec(m2, l2)); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, mlq, ml_rec(m3, l3)); }
    }
}
