// The word kernel of qsa_prepare_query (SPEC §3; described in qsa_prepare_query_vec.wgsl),
// shared by qsa_prepare_query_vec.wgsl and qsa_compress_query.wgsl (the indexer's compress and
// query preparation in one dispatch). The including shader declares the bindings: `U.q` (the
// params), q_raw, weight, rope_a, rope_b, positions and out in 16-byte words, and flags.

// The elements of one word: f32 in `a`; f16 / bf16 the even ones in `a`, the odd ones in `b`.
struct Word {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn elems() -> u32 {
    if (T_KIND == 0u) {
        return 4u;
    }
    return 8u;
}

fn unpack(w: vec4<u32>) -> Word {
    if (T_KIND == 0u) {
        return Word(bitcast<vec4<f32>>(w), vec4<f32>(0.0));
    }
    return Word(t_low4(w), t_high4(w));
}

fn pack(v: Word) -> vec4<u32> {
    if (T_KIND == 0u) {
        return bitcast<vec4<u32>>(v.a);
    }
    return vec4<u32>(t_bits(v.a.x, 0u) | t_bits(v.b.x, 1u), t_bits(v.a.y, 0u) | t_bits(v.b.y, 1u),
                     t_bits(v.a.z, 0u) | t_bits(v.b.z, 1u), t_bits(v.a.w, 0u) | t_bits(v.b.w, 1u));
}

// ss plus the squares of the word's elements, in channel order.
fn squares(ss: f32, x: Word) -> f32 {
    var s = ss;
    if (T_KIND == 0u) {
        s += x.a.x * x.a.x;
        s += x.a.y * x.a.y;
        s += x.a.z * x.a.z;
        s += x.a.w * x.a.w;
        return s;
    }
    s += x.a.x * x.a.x;
    s += x.b.x * x.b.x;
    s += x.a.y * x.a.y;
    s += x.b.y * x.b.y;
    s += x.a.z * x.a.z;
    s += x.b.z * x.b.z;
    s += x.a.w * x.a.w;
    s += x.b.w * x.b.w;
    return s;
}

// Word i of the row at word src, normed: x · inv · (offset + w) per element.
fn normed(src: u32, i: u32, inv: f32) -> Word {
    let x = unpack(q_raw[src + i]);
    if (U.q.norm_on == 0u) {
        return x;
    }
    let w = unpack(weight[i]);
    let o = vec4<f32>(U.q.offset);
    return Word(x.a * inv * (o + w.a), x.b * inv * (o + w.b));
}

// freqs_cis words j and j + 1 (the interleaved cos, sin of one word's channels) as cos and sin
// in the layout of `Word`.
fn freq_words(j: u32) -> array<Word, 2> {
    let p = unpack(rope_a[j]);
    let q = unpack(rope_a[j + 1u]);
    if (T_KIND == 0u) {
        // p = (cos c, sin c, cos c+1, sin c+1), q the same for c+2, c+3
        return array<Word, 2>(Word(vec4<f32>(p.a.x, p.a.z, q.a.x, q.a.z), vec4<f32>(0.0)),
                              Word(vec4<f32>(p.a.y, p.a.w, q.a.y, q.a.w), vec4<f32>(0.0)));
    }
    // p.a = cos of channels c .. c+3, p.b their sin; q the same for c+4 .. c+7
    return array<Word, 2>(Word(vec4<f32>(p.a.x, p.a.z, q.a.x, q.a.z), vec4<f32>(p.a.y, p.a.w, q.a.y, q.a.w)),
                          Word(vec4<f32>(p.b.x, p.b.z, q.b.x, q.b.z), vec4<f32>(p.b.y, p.b.w, q.b.y, q.b.w)));
}

// y · c − z · s and y · c + z · s per element.
fn rot_minus(y: Word, z: Word, c: Word, s: Word) -> Word {
    return Word(y.a * c.a - z.a * s.a, y.b * c.b - z.b * s.b);
}

fn rot_plus(y: Word, z: Word, c: Word, s: Word) -> Word {
    return Word(y.a * c.a + z.a * s.a, y.b * c.b + z.b * s.b);
}

// The output row of `rq` (query_row's (r, t, pos, 1)).
fn query_words(rq: vec4<u32>) {
    let r = rq.x;  // row (t, h)
    let t = rq.y;
    let pos = rq.z;
    let n = U.q.di / elems();  // words per row
    let src = r * n;
    var inv = 1.0;
    if (U.q.norm_on != 0u) {
        var ss = 0.0;
        for (var i = 0u; i < n; i++) {
            ss = squares(ss, unpack(q_raw[src + i]));
        }
        inv = 1.0 / sqrt(ss / f32(U.q.di) + U.q.eps);
    }
    // Rotated pairs: word i of the first half with word i + hw of the second.
    let dr = select(U.q.dr, 0u, U.q.rope_mode == 0u);
    let hw = dr / (2u * elems());
    let rw = dr / elems();  // words per table row
    for (var i = 0u; i < hw; i++) {
        let y = normed(src, i, inv);
        let z = normed(src, i + hw, inv);
        var cy = Word(vec4<f32>(0.0), vec4<f32>(0.0));
        var sy = cy;
        var cz = cy;
        var sz = cy;
        if (U.q.rope_mode == 1u) {
            cy = unpack(rope_a[t * rw + i]);
            sy = unpack(rope_b[t * rw + i]);
            cz = unpack(rope_a[t * rw + i + hw]);
            sz = unpack(rope_b[t * rw + i + hw]);
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
