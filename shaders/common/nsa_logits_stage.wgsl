// The query staging of nsa_compress_attention's portable logits kernel
// (nsa_compress_attention.wgsl) and its GPU-shaped kernel (nsa_compress_attention_gpu.wgsl):
// DC channels of the chunk's 16 query heads at a time in workgroup memory, where every
// invocation reads them (bf16 as bf16 pairs, exact in half the loads), and the element loads
// of the including shader's `query` and `key` bindings.

// bf16 (exact in half the loads): qh[2c + h / 8][(h % 8) / 2] holds q of heads h, h + 1 (h even).
var<workgroup> qh: array<vec4<u32>, 2u * DC>;

fn ld_q(i: u32) -> f32 { return t_load(query[t_word(i)], i); }
fn ld_k(i: u32) -> f32 { return t_load(key[t_word(i)], i); }
// The 16 bits of element i of a 16-bit T query.
fn q_bits(i: u32) -> u32 { return (query[i >> 1u] >> (16u * (i & 1u))) & 0xffffu; }

// The 16 heads of channel c staged as bf16 pairs.
fn q_bf16(c: u32) -> mat4x4<f32> {
    let w0 = qh[2u * c];
    let w1 = qh[2u * c + 1u];
    return mat4x4<f32>(lo4(w0), hi4(w0), lo4(w1), hi4(w1));
}

// Channels c0 … c0 + dc − 1 of the chunk's nh heads from h0 of query row r (zero past nh), by
// the workgroup's `lanes` invocations: into qh as bf16 pairs where the kernel reads K rows
// 16 bytes at a time in bf16 (by16), else into qs. Between two barriers.
fn stage_query(lid: u32, lanes: u32, r: u32, h0: u32, nh: u32, c0: u32, dc: u32, by16: bool) {
    if (by16 && T_KIND == 2u) {
        for (var i = lid; i < HC / 2u * dc; i += lanes) {
            let c = i / (HC / 2u);
            let hh = 2u * (i % (HC / 2u));
            let e = (r * P.n1 + h0 + hh) * P.dqk + c0 + c;
            var v = 0u;
            if (hh < nh) { v = q_bits(e); }
            if (hh + 1u < nh) { v |= q_bits(e + P.dqk) << 16u; }
            qh[2u * c + hh / 8u][(hh % 8u) / 2u] = v;
        }
    } else {
        for (var i = lid; i < HC * dc; i += lanes) {
            let c = i / HC;
            let hh = i % HC;
            var v = 0.0;
            if (hh < nh) {
                v = ld_q((r * P.n1 + h0 + hh) * P.dqk + c0 + c);
            }
            qs[c][hh / 4u][hh % 4u] = v;
        }
    }
}
