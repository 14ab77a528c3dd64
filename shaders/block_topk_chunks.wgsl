// block_topk (SPEC §5) for rows wider than the one-workgroup kernels take (W > 65536, whose
// ties they key by a 16-bit column): the row is cut into nch chunks of wc columns (the last
// padded with -inf, which is no candidate), the usual kernel selects the k best of every chunk,
// and these two entry points join the chunks' selections:
//
// `gather`: the merged row [nch · k] of each score row holds, chunk after chunk, the scores of
//   that chunk's selection in its order (-inf for an empty slot). The k best of the whole row
//   are among them, and a second run of the usual kernel over the merged rows picks them. Its
//   ties go to the lower merged position, which is the lower column: within a chunk equal
//   scores come in column order, and chunk c's columns are all below chunk c + 1's.
// `map`: the merged positions that run selected back to columns of the row: position c·k + j is
//   column c·wc + (chunk c's j-th selection); -1 stays -1.
//
// Scores are copied as bits (u32), so NaN payloads and -0 reach the second run as they were.
// One invocation per merged entry or per output slot.

struct BlockTopkChunksParams {
    rows: u32,  // score rows T · Hs
    wc: u32,    // columns per chunk
    nch: u32,   // chunks per row
    k: u32,     // slots per selection
}

@group(0) @binding(0) var<uniform> P: BlockTopkChunksParams;
@group(0) @binding(1) var<storage, read> chunk_scores: array<u32>;         // [rows · nch, wc] f32 bits
@group(0) @binding(2) var<storage, read> chunk_indices: array<i32>;        // [rows · nch, k] i32
@group(0) @binding(3) var<storage, read_write> merged: array<u32>;         // [rows, nch · k] f32 bits
@group(0) @binding(4) var<storage, read_write> merged_indices: array<i32>; // [rows, k] i32
@group(0) @binding(5) var<storage, read_write> block_indices: array<i32>;  // [rows, k] i32

const NEG_INF: u32 = 0xff800000u;

// The column, within its chunk row `cr` (row · nch + c), of that chunk's j-th selection, or -1.
fn chunk_pick(cr: u32, j: u32) -> i32 {
    return chunk_indices[cr * P.k + j];
}

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let e = (wg.y * nwg.x + wg.x) * 256u + lid;  // row · nch · k + c · k + j
    if (e >= P.rows * P.nch * P.k) {
        return;
    }
    let cr = e / P.k;  // row · nch + c
    let ci = chunk_pick(cr, e % P.k);
    var bits = NEG_INF;
    if (ci >= 0) {
        bits = chunk_scores[cr * P.wc + min(u32(ci), P.wc - 1u)];
    }
    merged[e] = bits;
}

@compute @workgroup_size(256)
fn map(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let e = (wg.y * nwg.x + wg.x) * 256u + lid;  // row · k + slot
    if (e >= P.rows * P.k) {
        return;
    }
    let m = merged_indices[e];
    var col = -1;
    if (m >= 0) {
        let row = e / P.k;
        let c = min(u32(m) / P.k, P.nch - 1u);
        let ci = chunk_pick(row * P.nch + c, u32(m) % P.k);
        if (ci >= 0) {
            col = i32(c * P.wc + u32(ci));
        }
    }
    block_indices[e] = col;
}
