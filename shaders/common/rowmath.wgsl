// One workgroup holds one row of up to MAX_D channels in workgroup memory and applies the
// block-key / index-query transform to it: RMS norm, then split-half (NeoX) RoPE.

const WG: u32 = 64u;
const MAX_D: u32 = 2048u;

var<workgroup> row: array<f32, MAX_D>;
var<workgroup> red: array<f32, WG>;

// Σ row[c]² over c < d, returned to every invocation. Call from uniform control flow.
fn wg_sum_sq(lid: u32, d: u32) -> f32 {
    var acc = 0.0;
    for (var c = lid; c < d; c += WG) {
        acc += row[c] * row[c];
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// Scales row[c] in place by 1 / sqrt(mean(row²) + eps) · (offset + w[c]). `w` is passed per
// channel by the caller through `norm_weight(c)`, so this only computes the factor.
fn wg_rms_factor(lid: u32, d: u32, eps: f32) -> f32 {
    let ss = wg_sum_sq(lid, d);
    return 1.0 / sqrt(ss / f32(d) + eps);
}

// Channel c of the rotated row: the first `dr` channels are rotated in split halves,
// y'[i] = y[i]·c - y[i+h]·s and y'[i+h] = y[i+h]·c + y[i]·s; the rest pass through.
fn rope_at(c: u32, dr: u32, cs: f32, sn: f32) -> f32 {
    let h = dr / 2u;
    if (c < h) {
        return row[c] * cs - row[c + h] * sn;
    }
    if (c < dr) {
        return row[c] * cs + row[c - h] * sn;
    }
    return row[c];
}
