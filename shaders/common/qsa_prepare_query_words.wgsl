// The word kernel of qsa_prepare_query (SPEC §3; described in qsa_prepare_query_vec.wgsl),
// shared by qsa_prepare_query_vec.wgsl and qsa_compress_query.wgsl (the indexer's compress and
// query preparation in one dispatch). The including shader declares the bindings: `U.q` (the
// params), q_raw, weight, rope_a, rope_b, positions and out in 16-byte words, and flags.

//#include common/word16.wgsl

// Words are read and written as `Chunk`s (common/word16.wgsl): f32 in `lo`; f16 / bf16 the
// even elements in `lo`, the odd ones in `hi`.

fn pack(v: Chunk) -> vec4<u32> {
    if (T_KIND == 0u) {
        return bitcast<vec4<u32>>(v.lo);
    }
    return vec4<u32>(t_bits(v.lo.x, 0u) | t_bits(v.hi.x, 1u), t_bits(v.lo.y, 0u) | t_bits(v.hi.y, 1u),
                     t_bits(v.lo.z, 0u) | t_bits(v.hi.z, 1u), t_bits(v.lo.w, 0u) | t_bits(v.hi.w, 1u));
}

// ss plus the squares of the word's elements, in channel order.
fn squares(ss: f32, x: Chunk) -> f32 {
    var s = ss;
    if (T_KIND == 0u) {
        s += x.lo.x * x.lo.x;
        s += x.lo.y * x.lo.y;
        s += x.lo.z * x.lo.z;
        s += x.lo.w * x.lo.w;
        return s;
    }
    s += x.lo.x * x.lo.x;
    s += x.hi.x * x.hi.x;
    s += x.lo.y * x.lo.y;
    s += x.hi.y * x.hi.y;
    s += x.lo.z * x.lo.z;
    s += x.hi.z * x.hi.z;
    s += x.lo.w * x.lo.w;
    s += x.hi.w * x.hi.w;
    return s;
}

// Word i of the row at word src, normed: x · inv · (offset + w) per element.
fn normed(src: u32, i: u32, inv: f32) -> Chunk {
    let x = word_chunk(q_raw[src + i]);
    if (U.q.norm_on == 0u) {
        return x;
    }
    let w = word_chunk(weight[i]);
    let o = vec4<f32>(U.q.offset);
    return Chunk(x.lo * inv * (o + w.lo), x.hi * inv * (o + w.hi));
}

// freqs_cis words j and j + 1 (the interleaved cos, sin of one word's channels) as cos and sin
// in the layout of `Chunk`.
fn freq_words(j: u32) -> array<Chunk, 2> {
    let p = word_chunk(rope_a[j]);
    let q = word_chunk(rope_a[j + 1u]);
    if (T_KIND == 0u) {
        // p = (cos c, sin c, cos c+1, sin c+1), q the same for c+2, c+3
        return array<Chunk, 2>(Chunk(vec4<f32>(p.lo.x, p.lo.z, q.lo.x, q.lo.z), vec4<f32>(0.0)),
                               Chunk(vec4<f32>(p.lo.y, p.lo.w, q.lo.y, q.lo.w), vec4<f32>(0.0)));
    }
    // p.lo = cos of channels c .. c+3, p.hi their sin; q the same for c+4 .. c+7
    return array<Chunk, 2>(Chunk(vec4<f32>(p.lo.x, p.lo.z, q.lo.x, q.lo.z), vec4<f32>(p.lo.y, p.lo.w, q.lo.y, q.lo.w)),
                           Chunk(vec4<f32>(p.hi.x, p.hi.z, q.hi.x, q.hi.z), vec4<f32>(p.hi.y, p.hi.w, q.hi.y, q.hi.w)));
}

// y · c − z · s and y · c + z · s per element.
fn rot_minus(y: Chunk, z: Chunk, c: Chunk, s: Chunk) -> Chunk {
    return Chunk(y.lo * c.lo - z.lo * s.lo, y.hi * c.hi - z.hi * s.hi);
}

fn rot_plus(y: Chunk, z: Chunk, c: Chunk, s: Chunk) -> Chunk {
    return Chunk(y.lo * c.lo + z.lo * s.lo, y.hi * c.hi + z.hi * s.hi);
}

// The output row of `rq` (query_row's (r, t, pos, 1)).
fn query_words(rq: vec4<u32>) {
    let r = rq.x;  // row (t, h)
    let t = rq.y;
    let pos = rq.z;
    let n = U.q.di / chunk_len();  // words per row
    let src = r * n;
    var inv = 1.0;
    if (U.q.norm_on != 0u) {
        var ss = 0.0;
        for (var i = 0u; i < n; i++) {
            ss = squares(ss, word_chunk(q_raw[src + i]));
        }
        inv = 1.0 / sqrt(ss / f32(U.q.di) + U.q.eps);
    }
    // Rotated pairs: word i of the first half with word i + hw of the second.
    let dr = select(U.q.dr, 0u, U.q.rope_mode == 0u);
    let hw = dr / (2u * chunk_len());
    let rw = dr / chunk_len();  // words per table row
    for (var i = 0u; i < hw; i++) {
        let y = normed(src, i, inv);
        let z = normed(src, i + hw, inv);
        var cy = Chunk(vec4<f32>(0.0), vec4<f32>(0.0));
        var sy = cy;
        var cz = cy;
        var sz = cy;
        if (U.q.rope_mode == 1u) {
            cy = word_chunk(rope_a[t * rw + i]);
            sy = word_chunk(rope_b[t * rw + i]);
            cz = word_chunk(rope_a[t * rw + i + hw]);
            sz = word_chunk(rope_b[t * rw + i + hw]);
        } else {
            let f = freq_words(pos * rw + 2u * i);  // channel c and c + Dr/2 share c's pair
            cy = f[0];
            sy = f[1];
            cz = f[0];
            sz = f[1];
        }
        out[src + i] = pack(rot_minus(y, z, cy, sy));
        out[src + i + hw] = pack(rot_plus(z, y, cz, sz));
    }
    for (var i = 2u * hw; i < n; i++) {
        out[src + i] = pack(normed(src, i, inv));
    }
}
