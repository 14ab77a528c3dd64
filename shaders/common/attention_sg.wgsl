// The partial pass of sparse_attention's subgroup variants (SPEC §7), shared by
// sparse_attention_sg.wgsl (16-byte loads) and sparse_attention_sg_w32.wgsl (32-byte loads),
// which differ only in how they read the pool. Each binds PS pool shards (the dispatch's
// shards P.shard … P.shard + PS − 1; slot s of the pass is shard P.shard + s) and supplies
//   ld_word(s, i, c, e) -> mat4x4<f32>: channel quads c/4 … c/4 + W − 1 of the row starting at
//     element i of slot s's shard as columns 0 … W − 1 (c a multiple of 4W; channels >= e read
//     as 0, and a word wholly past e reads the row's first word instead, never beyond the row);
//   word_log2() -> u32: log2 of the elements of T in one of its words;
//   touch(s, kw, vw, kl, vl) -> u32: a few words of slot s's K and V rows whose first words are
//     kw and vw and last words kw + kl and vw + vl (the first ones and those 128 bytes on),
//     whose loads start the batch's cache misses together.
//
// For adapters whose subgroups have one fixed size SG. Same bindings as sparse_attention.wgsl
// (the 32-byte variant binds the pool a second time), the same inputs (the per-shard row lists
// of sparse_attention_route.wgsl) and the same partial records (common/attention.wgsl), which
// sparse_attention_combine.wgsl merges; here the record's "phase" is the subgroup: phases =
// 64 / SG, one channel block. One dispatch takes up to PS shards in turn, carrying its state
// in registers from one to the next (the tiled pass takes one shard a dispatch).
//
// Work split: one workgroup of 64 invocations per (row t, KV head kh, part, split s), as in the
// tiled pass; its 64 / SG subgroups take the split's list entries in batches of SG consecutive
// entries (subgroup u: batches u, u + 64 / SG, …). Within a batch every lane works on the same
// token at a time: lane l holds, in registers, the queries' channel quads quad(j, l) of all
// heads of the part (QK slots j per lane) and the accumulators of the value quads quad(j, l)
// (QV slots). Per token each lane loads only its own words of the K and V rows, W quads a
// load — every element of the row once per subgroup, neighbouring lanes on neighbouring
// words — multiplies them with its registers, and one subgroup sum per head quad (sg_sum4)
// completes the dot products. No workgroup memory, no barrier. (The tiled pass reads the queries from
// workgroup memory for every four rows; on llvmpipe, where every such read is a loop over the
// lanes, that dominated its time. There every load is such a loop, per component, so the wider
// the word the fewer loops: docs/perf.md.)
//
// Online softmax per head, batch by batch: m the running maximum, l = Σ e^{z − m}, acc =
// Σ e^{z − m} V. Lane b keeps token b's scores; one subgroup maximum per head quad (sg_max4)
// gives the batch's new maximum, the state is rescaled once, each lane takes the exponentials of its own
// token (the work is spread over the lanes, not repeated), and subgroupShuffle hands each
// token's weights to every lane for its V row. A later dispatch (the pool's next PS shards)
// continues the records the previous one left.
//
// Registers are named variables (the loops over quads are written out, cut by the overrides
// QK, QV and HQ), never arrays indexed in a loop, which llvmpipe keeps in memory. Heads past the
// part's hc have zero queries and are never stored.

// Subgroup size (fixed on the adapters this variant is chosen for).
override SG: u32 = 8u;
// Head quads of the part: up to 16 heads.
override HQ: u32 = 3u;
// K channel quads per lane: ceil(ceil(E / 4) / (SG · W)) · W, 1 ..= 8.
override QK: u32 = 8u;
// V channel quads per lane: ceil(ceil(Ev / 4) / (SG · W)) · W, 1 ..= 8.
override QV: u32 = 8u;
// Channel quads per load (ld_word): 1, 2 or 4 — a word of the variant's width (16 or 32
// bytes) holds W quads of T; 1 where rows are read element by element (VEC = 0).
override W: u32 = 1u;

// Invocations per workgroup, a multiple of SG: 64 on GPUs; SG (one subgroup) on CPU adapters,
// where a workgroup's subgroups run one after another on one thread and each would load the
// queries and carry its records over every pool shard on its own.
override TK: u32 = 64u;

// Pool shards a dispatch binds and takes in turn, 1 … 4 (the last dispatch of a pool may have
// fewer left: min(PS, P.shards − P.shard)).
override PS: u32 = 1u;

// The channel quad that lane sl holds in its slot j (0 … 7): the lanes take words of W
// consecutive quads in turn, so a lane's slots j … j + W − 1 (j a multiple of W) come from one
// load: quads (j / W) · SG · W + sl · W + j % W.
fn quad(j: u32, sl: u32) -> u32 {
    return (j / W) * SG * W + sl * W + j % W;
}

// 1 when E and Ev are multiples of 4 · W · SG channels: every slot of every lane then holds a
// quad inside the row, and the loads need neither masks nor a clamped address.
override FULL: u32 = 0u;

// The element where the word of channels c … of the row at element i starts (a word wholly
// past e reads the row's first one instead, never beyond the row).
fn word_at(i: u32, c: u32, e: u32) -> u32 {
    if (FULL != 0u) {
        return i + c;
    }
    return i + select(0u, c, c < e);
}

// Quads 0 … 3 of m (channels c …) with channels >= e zeroed.
fn live_quads(m: mat4x4<f32>, c: u32, e: u32) -> mat4x4<f32> {
    if (FULL != 0u) {
        return m;
    }
    let k = vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u);
    let ev = vec4<u32>(e);
    return mat4x4<f32>(select(vec4<f32>(), m[0], k < ev), select(vec4<f32>(), m[1], k + 4u < ev),
                       select(vec4<f32>(), m[2], k + 8u < ev), select(vec4<f32>(), m[3], k + 12u < ev));
}

// Channel quad c of the four heads 4q … 4q + 3 of the part (zero past hc) as a matrix whose
// product with a K quad gives the four heads' partial dot products.
fn qmat(qb: u32, q: u32, hc: u32, c: u32, e: u32) -> mat4x4<f32> {
    var m = mat4x4<f32>();
    for (var i = 0u; i < 4u; i++) {
        let h = 4u * q + i;
        if (h < hc) {
            m[i] = ld_q(qb + h * e, c, e);
        }
    }
    return transpose(m);
}

// z (column x: head quad x) plus the partial dots of K quad k with the four head quads.
fn qk(z: mat4x4<f32>, k: vec4<f32>, q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>,
      q3: mat4x4<f32>) -> mat4x4<f32> {
    var r = z;
    r[0] += q0 * k;
    if (HQ > 1u) { r[1] += q1 * k; }
    if (HQ > 2u) { r[2] += q2 * k; }
    if (HQ > 3u) { r[3] += q3 * k; }
    return r;
}

// A batch of tokens' scores of four heads, one token per lane (s; LOW past the list),
// against the running (m, l): the new m, the new l, the factor that rescales the old state,
// and this lane's token's weights.
fn weigh(s: vec4<f32>, m: vec4<f32>, l: vec4<f32>) -> mat4x4<f32> {
    let mn = max(m, sg_max4(s));
    let al = exp(m - mn);
    let p = select(select(vec4<f32>(0.0), exp(s - mn), s > vec4<f32>(LOW)), nan4(), poisons(s));
    return mat4x4<f32>(mn, l * al + sg_sum4(p), al, p);
}

// The sum over the subgroup, in every lane: a butterfly of `subgroupShuffleXor`s, each one
// vector permute on llvmpipe, where `subgroupAdd` is a loop over the lanes through memory.
// The steps are written out (SG <= 64, subgroup_pass), not a loop: llvmpipe counts every loop
// iteration toward its limit of 65535 per invocation, and as a loop the sums of a long split
// passed it (docs/operators.md, sparse_attention).
fn sg_sum4(v: vec4<f32>) -> vec4<f32> {
    var s = v;
    if (SG > 1u) { s += subgroupShuffleXor(s, 1u); }
    if (SG > 2u) { s += subgroupShuffleXor(s, 2u); }
    if (SG > 4u) { s += subgroupShuffleXor(s, 4u); }
    if (SG > 8u) { s += subgroupShuffleXor(s, 8u); }
    if (SG > 16u) { s += subgroupShuffleXor(s, 16u); }
    if (SG > 32u) { s += subgroupShuffleXor(s, 32u); }
    return s;
}

// The maximum over the subgroup, in every lane (a butterfly as sg_sum4).
fn sg_max4(v: vec4<f32>) -> vec4<f32> {
    var s = v;
    if (SG > 1u) { s = max(s, subgroupShuffleXor(s, 1u)); }
    if (SG > 2u) { s = max(s, subgroupShuffleXor(s, 2u)); }
    if (SG > 4u) { s = max(s, subgroupShuffleXor(s, 4u)); }
    if (SG > 8u) { s = max(s, subgroupShuffleXor(s, 8u)); }
    if (SG > 16u) { s = max(s, subgroupShuffleXor(s, 16u)); }
    if (SG > 32u) { s = max(s, subgroupShuffleXor(s, 32u)); }
    return s;
}


@compute @workgroup_size(TK)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sub: u32, @builtin(subgroup_invocation_id) sl: u32) {
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

    // This split's entries of the row list in the dispatch's shards. None in a later
    // dispatch: the previous one's records stand as they are.
    let list = (rr * P.hs + g) * (P.shards + 1u + P.w);
    let ns = min(PS, P.shards - P.shard);
    var total = 0u;
    for (var s = 0u; s < ns; s++) {
        total += split_range_of(list, split, P.shard + s).y;
    }
    if (total == 0u && P.shard != 0u) {
        return;
    }
    let subs = TK / SG;

    let e = P.e;
    let ev = v_dim();
    let v4 = (ev + 3u) / 4u;
    let rs = v4 + 1u;                       // one channel block: Ev4 quads, then (m, l)
    let nsub = P.splits * P.phases;
    let base = (rr * P.h + h0) * nsub + split * P.phases + sub;

    // Queries in registers: q<slot j><head quad x> holds channel quad quad(j, sl), and
    // a<j><x> accumulates value quad quad(j, sl). Named variables, not arrays: llvmpipe keeps
    // an array that a loop indexes in memory and gathers it lane by lane.
    let qb = (t * P.h + h0) * e;
    var q00 = mat4x4<f32>(); var q01 = mat4x4<f32>(); var q02 = mat4x4<f32>(); var q03 = mat4x4<f32>();
    var q10 = mat4x4<f32>(); var q11 = mat4x4<f32>(); var q12 = mat4x4<f32>(); var q13 = mat4x4<f32>();
    var q20 = mat4x4<f32>(); var q21 = mat4x4<f32>(); var q22 = mat4x4<f32>(); var q23 = mat4x4<f32>();
    var q30 = mat4x4<f32>(); var q31 = mat4x4<f32>(); var q32 = mat4x4<f32>(); var q33 = mat4x4<f32>();
    var q40 = mat4x4<f32>(); var q41 = mat4x4<f32>(); var q42 = mat4x4<f32>(); var q43 = mat4x4<f32>();
    var q50 = mat4x4<f32>(); var q51 = mat4x4<f32>(); var q52 = mat4x4<f32>(); var q53 = mat4x4<f32>();
    var q60 = mat4x4<f32>(); var q61 = mat4x4<f32>(); var q62 = mat4x4<f32>(); var q63 = mat4x4<f32>();
    var q70 = mat4x4<f32>(); var q71 = mat4x4<f32>(); var q72 = mat4x4<f32>(); var q73 = mat4x4<f32>();
    var a00 = mat4x4<f32>(); var a01 = mat4x4<f32>(); var a02 = mat4x4<f32>(); var a03 = mat4x4<f32>();
    var a10 = mat4x4<f32>(); var a11 = mat4x4<f32>(); var a12 = mat4x4<f32>(); var a13 = mat4x4<f32>();
    var a20 = mat4x4<f32>(); var a21 = mat4x4<f32>(); var a22 = mat4x4<f32>(); var a23 = mat4x4<f32>();
    var a30 = mat4x4<f32>(); var a31 = mat4x4<f32>(); var a32 = mat4x4<f32>(); var a33 = mat4x4<f32>();
    var a40 = mat4x4<f32>(); var a41 = mat4x4<f32>(); var a42 = mat4x4<f32>(); var a43 = mat4x4<f32>();
    var a50 = mat4x4<f32>(); var a51 = mat4x4<f32>(); var a52 = mat4x4<f32>(); var a53 = mat4x4<f32>();
    var a60 = mat4x4<f32>(); var a61 = mat4x4<f32>(); var a62 = mat4x4<f32>(); var a63 = mat4x4<f32>();
    var a70 = mat4x4<f32>(); var a71 = mat4x4<f32>(); var a72 = mat4x4<f32>(); var a73 = mat4x4<f32>();
    if (QK > 0u) {
        let c = 4u * quad(0u, sl);
        q00 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q01 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q02 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q03 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 1u) {
        let c = 4u * quad(1u, sl);
        q10 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q11 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q12 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q13 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 2u) {
        let c = 4u * quad(2u, sl);
        q20 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q21 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q22 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q23 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 3u) {
        let c = 4u * quad(3u, sl);
        q30 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q31 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q32 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q33 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 4u) {
        let c = 4u * quad(4u, sl);
        q40 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q41 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q42 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q43 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 5u) {
        let c = 4u * quad(5u, sl);
        q50 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q51 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q52 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q53 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 6u) {
        let c = 4u * quad(6u, sl);
        q60 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q61 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q62 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q63 = qmat(qb, 3u, hc, c, e); }
    }
    if (QK > 7u) {
        let c = 4u * quad(7u, sl);
        q70 = qmat(qb, 0u, hc, c, e);
        if (HQ > 1u) { q71 = qmat(qb, 1u, hc, c, e); }
        if (HQ > 2u) { q72 = qmat(qb, 2u, hc, c, e); }
        if (HQ > 3u) { q73 = qmat(qb, 3u, hc, c, e); }
    }
    // Running state: fresh, or the previous dispatch's record.
    var m = mat4x4<f32>(vec4<f32>(LOW), vec4<f32>(LOW), vec4<f32>(LOW), vec4<f32>(LOW));
    var l = mat4x4<f32>();
    if (P.shard != 0u) {
        let ml0 = get_acc(base, nsub, 0u, hc, rs, v4);
        m[0] = ml_m(ml0); l[0] = ml_l(ml0);
        if (HQ > 1u) {
            let ml1 = get_acc(base, nsub, 1u, hc, rs, v4);
            m[1] = ml_m(ml1); l[1] = ml_l(ml1);
        }
        if (HQ > 2u) {
            let ml2 = get_acc(base, nsub, 2u, hc, rs, v4);
            m[2] = ml_m(ml2); l[2] = ml_l(ml2);
        }
        if (HQ > 3u) {
            let ml3 = get_acc(base, nsub, 3u, hc, rs, v4);
            m[3] = ml_m(ml3); l[3] = ml_l(ml3);
        }
        if (QV > 0u && quad(0u, sl) < v4) {
            let c = quad(0u, sl);
            a00 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a01 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a02 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a03 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 1u && quad(1u, sl) < v4) {
            let c = quad(1u, sl);
            a10 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a11 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a12 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a13 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 2u && quad(2u, sl) < v4) {
            let c = quad(2u, sl);
            a20 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a21 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a22 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a23 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 3u && quad(3u, sl) < v4) {
            let c = quad(3u, sl);
            a30 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a31 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a32 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a33 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 4u && quad(4u, sl) < v4) {
            let c = quad(4u, sl);
            a40 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a41 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a42 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a43 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 5u && quad(5u, sl) < v4) {
            let c = quad(5u, sl);
            a50 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a51 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a52 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a53 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 6u && quad(6u, sl) < v4) {
            let c = quad(6u, sl);
            a60 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a61 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a62 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a63 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
        if (QV > 7u && quad(7u, sl) < v4) {
            let c = quad(7u, sl);
            a70 = get_acc(base, nsub, 0u, hc, rs, c);
            if (HQ > 1u) { a71 = get_acc(base, nsub, 1u, hc, rs, c); }
            if (HQ > 2u) { a72 = get_acc(base, nsub, 2u, hc, rs, c); }
            if (HQ > 3u) { a73 = get_acc(base, nsub, 3u, hc, rs, c); }
        }
    }

    // Batches of SG consecutive entries per subgroup (subgroup u: batches u, u + 64 / SG, …).
    // 1. Each token's scores, lane by lane over the row, summed by sg_sum4; lane b keeps
    //    token b's. 2. The batch's maxima (sg_max4), one rescale of the state, and each
    //    lane's exp for its own token: the softmax work is spread over the lanes rather than
    //    repeated by each. 3. The V rows, each token's weights taken from its lane
    //    (subgroupShuffle).
    // Shard by shard (slot k: shard P.shard + k; one copy of the loop per slot, each naming
    // its binding: common/attention_sg_shard.wgsl), the state carried over in registers.
    var tk = 0u;  // the touched words (kept only so that the loads stay)
    let sh = word_log2();
    let kl = ((e + (1u << sh) - 1u) >> sh) - 1u;   // the K and V rows' last words
    let vl = ((ev + (1u << sh) - 1u) >> sh) - 1u;
    //#expand common/attention_sg_shard.wgsl SLOT=0u
    //#expand common/attention_sg_shard.wgsl SLOT=1u
    //#expand common/attention_sg_shard.wgsl SLOT=2u
    //#expand common/attention_sg_shard.wgsl SLOT=3u

    // The records of this subgroup: its lanes' channel quads of every head, and (m, l) from
    // lane 0.
    if (QV > 0u && quad(0u, sl) < v4) {
        let c = quad(0u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a00);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a01); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a02); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a03); }
    }
    if (QV > 1u && quad(1u, sl) < v4) {
        let c = quad(1u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a10);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a11); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a12); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a13); }
    }
    if (QV > 2u && quad(2u, sl) < v4) {
        let c = quad(2u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a20);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a21); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a22); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a23); }
    }
    if (QV > 3u && quad(3u, sl) < v4) {
        let c = quad(3u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a30);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a31); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a32); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a33); }
    }
    if (QV > 4u && quad(4u, sl) < v4) {
        let c = quad(4u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a40);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a41); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a42); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a43); }
    }
    if (QV > 5u && quad(5u, sl) < v4) {
        let c = quad(5u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a50);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a51); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a52); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a53); }
    }
    if (QV > 6u && quad(6u, sl) < v4) {
        let c = quad(6u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a60);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a61); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a62); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a63); }
    }
    if (QV > 7u && quad(7u, sl) < v4) {
        let c = quad(7u, sl);
        put_acc(base, nsub, 0u, hc, rs, c, a70);
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, c, a71); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, c, a72); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, c, a73); }
    }
    if (tk == 0x7fc00001u && total == 0u) {
        part[0] = vec4<f32>();  // never: with n = 0 nothing was touched
    }
    if (sl == 0u) {
        put_acc(base, nsub, 0u, hc, rs, v4, ml_rec(m[0], l[0]));
        if (HQ > 1u) { put_acc(base, nsub, 1u, hc, rs, v4, ml_rec(m[1], l[1])); }
        if (HQ > 2u) { put_acc(base, nsub, 2u, hc, rs, v4, ml_rec(m[2], l[2])); }
        if (HQ > 3u) { put_acc(base, nsub, 3u, hc, rs, v4, ml_rec(m[3], l[3])); }
    }
}
