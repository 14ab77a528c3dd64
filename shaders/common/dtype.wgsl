// Storage of the activation type T. Every T tensor is bound as an array of u32 words:
// f32 one element per word; f16 and bf16 two per word, element i in word i >> 1, the low
// half when i is even (the little-endian host layout). Loads widen exactly to f32; stores
// round to nearest-even in software, so every backend rounds the same way and f16 needs no
// shader-f16 feature. Output arrays are atomic<u32> so that two invocations writing the two
// halves of one word never race: each clears and sets only its own half.

// 0 = f32, 1 = f16, 2 = bf16.
override T_KIND: u32 = 0u;

fn t_word(i: u32) -> u32 {
    if (T_KIND == 0u) {
        return i;
    }
    return i >> 1u;
}

fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // zero or subnormal: m * 2^-24, exact in f32
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn f32_to_f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (ax >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (ax < 0x38800000u) {
        // below the smallest normal: round |v| * 2^24 to an integer, ties to even
        let e = ax >> 23u;
        if (e < 102u) {
            return sign;
        }
        let mant = (ax & 0x7fffffu) | 0x800000u;
        let s = 126u - e;
        var q = mant >> s;
        let rem = mant & ((1u << s) - 1u);
        let half = 1u << (s - 1u);
        if (rem > half || (rem == half && (q & 1u) == 1u)) {
            q = q + 1u;
        }
        return sign | q;
    }
    let r = ax + 0xfffu + ((ax >> 13u) & 1u);
    return sign | ((r - 0x38000000u) >> 13u);
}

fn f32_to_bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return ((x >> 16u) & 0x8000u) | 0x7fc0u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

// Element i of T, given the word that holds it.
fn t_load(word: u32, i: u32) -> f32 {
    if (T_KIND == 0u) {
        return bitcast<f32>(word);
    }
    let h = (word >> (16u * (i & 1u))) & 0xffffu;
    if (T_KIND == 1u) {
        return f16_bits_to_f32(h);
    }
    return bitcast<f32>(h << 16u);
}

// Channels 0 … 3 and 4 … 7 of a 16-byte word of 16-bit T.
fn lo4(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(t_load(w.x, 0u), t_load(w.x, 1u), t_load(w.y, 0u), t_load(w.y, 1u));
}
fn hi4(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(t_load(w.z, 0u), t_load(w.z, 1u), t_load(w.w, 0u), t_load(w.w, 1u));
}

// Mask that keeps the other half of element i's word (0 for f32: the whole word is ours).
fn t_keep(i: u32) -> u32 {
    if (T_KIND == 0u) {
        return 0u;
    }
    if ((i & 1u) == 0u) {
        return 0xffff0000u;
    }
    return 0x0000ffffu;
}

// v rounded to T, placed at element i's position in its word.
fn t_bits(v: f32, i: u32) -> u32 {
    if (T_KIND == 0u) {
        return bitcast<u32>(v);
    }
    var h = f32_to_bf16_bits(v);
    if (T_KIND == 1u) {
        h = f32_to_f16_bits(v);
    }
    return h << (16u * (i & 1u));
}

// Four f16 values (in the low 16 bits of each lane) widened exactly, as f16_bits_to_f32.
fn f16x4_bits_to_f32(h: vec4<u32>) -> vec4<f32> {
    let sign = (h & vec4<u32>(0x8000u)) << vec4<u32>(16u);
    let e = (h >> vec4<u32>(10u)) & vec4<u32>(0x1fu);
    let m = h & vec4<u32>(0x3ffu);
    let sub = bitcast<vec4<u32>>(vec4<f32>(m) * 5.9604644775390625e-8) | sign;
    let special = sign | vec4<u32>(0x7f800000u) | (m << vec4<u32>(13u));
    let normal = sign | ((e + vec4<u32>(112u)) << vec4<u32>(23u)) | (m << vec4<u32>(13u));
    let bits = select(select(normal, special, e == vec4<u32>(31u)), sub, e == vec4<u32>(0u));
    return bitcast<vec4<f32>>(bits);
}

// For f16/bf16 read four words at a time: the elements in the low halves (the even ones) and
// in the high halves (the odd ones), widened exactly.
fn t_low4(w: vec4<u32>) -> vec4<f32> {
    if (T_KIND == 1u) {
        return f16x4_bits_to_f32(w & vec4<u32>(0xffffu));
    }
    return bitcast<vec4<f32>>(w << vec4<u32>(16u));
}

fn t_high4(w: vec4<u32>) -> vec4<f32> {
    if (T_KIND == 1u) {
        return f16x4_bits_to_f32(w >> vec4<u32>(16u));
    }
    return bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
}
