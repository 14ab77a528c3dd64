// The uniform block shared by the three stages of sparse_attention (the routing of token lists
// in sparse_attention_route.wgsl, the partial pass in sparse_attention.wgsl, the merge in
// sparse_attention_combine.wgsl), and the layouts of the scratch that passes between them.
//
// Queries and keys have E channels, values and the output Ev (E = Ev unless the pool holds an
// NSA / MLA style cache with Dqk != Dv); a pool row has Dp = max(E, Ev) channels per head, K in
// the first E of plane K and V in the first Ev of plane V.
//
// The routes of one (row, selection group): record (r · Hs + g) of `routes`, shards + 1 + W
// u32s: the start of each shard's rows, then the total kept, then the kept rows grouped by
// shard, in list order within a shard; a row is its offset in the shard without KV head,
// layer and plane: (page % shard_pages) · page_stride + (position % page_size) · Hkv · Dp.
//
// A partial result covers one (row, query head, split, phase): record
// ((r · H + h) · splits + s) · phases + f of `part` (r = row − row_base), Ev4 + cblocks vec4s:
// the head's un-normalised accumulator Σ_j e^{z_j − m} V_j over the split's tokens of phase f
// (the V step deals a split's tokens to `phases` groups of invocations) as Ev4 = ceil(Ev / 4)
// channel quads, then (m, l, 0, 0) once per channel block of the V step, with m the split's
// running maximum of the scores and l = Σ_j e^{z_j − m} over the same tokens. Every block
// computes the same (m, l); each keeps its own copy, so that the dispatch of a later pool
// shard, whose blocks run in any order, never reads a copy another block has already moved
// on. An empty one holds m = LOW, l = 0, acc = 0.

struct SparseAttentionParams {
    t: u32,           // query rows of the whole call
    n: u32,           // sequences
    h: u32,           // query heads
    hkv: u32,         // KV heads
    hs: u32,          // selection groups
    e: u32,           // query / key channels E
    w: u32,           // token slots per (row, group)
    hc: u32,          // query heads per workgroup (at most 4 · HQ)
    segs: u32,        // selection groups that can meet one KV group
    chunks: u32,      // head chunks per (KV head, selection group) segment
    cblocks: u32,     // channel blocks of the V step: (64 / phases) · 2 quads of Ev each
    splits: u32,      // token-list splits per (row, KV head, part)
    split_len: u32,   // list entries per split, a multiple of 64
    page_size: u32,
    page_stride: u32, // elements from one page to the next
    num_pages: u32,   // pages of the whole pool
    max_pages: u32,   // columns of the page table
    k_off: u32,       // elements from a page's start to row 0 of plane K at layer_idx
    v_off: u32,       // the same for plane V
    shard: u32,       // the pool shard of this dispatch (0: it starts the partial results)
    shards: u32,      // pool shards
    shard_pages: u32, // pages per shard (the last may hold fewer)
    row_base: u32,    // first row of this dispatch
    rows: u32,        // rows of this dispatch
    has_sinks: u32,
    scale: f32,
    phases: u32,      // token phases of the V step (64 / phases invocations each)
    ev: u32,          // value / output channels Ev (0: E)
    dp: u32,          // channels of a pool row per head (0: E)
    sg: u32,          // subgroup size of the subgroup partial pass (0: the tiled pass)
    _pad1: u32,
}

// Ev and Dp; a zero in the params means E (the layout before values had their own width).
fn v_dim() -> u32 { return select(P.ev, P.e, P.ev == 0u); }
fn pool_dim() -> u32 { return select(P.dp, P.e, P.dp == 0u); }

const LOW: f32 = -3.0e38;     // "no score yet": below every real score, and finite

// Non-finite scores (docs/operators.md, sparse_attention; the CPU reference does the same): a
// score that is NaN or +inf makes its head's output NaN, as e^{z − m} is NaN for it; one at or
// below LOW (−inf included) weighs 0. Decided on the bits, as WGSL promises nothing of
// comparisons with NaN: the weight of a poisoning score is NaN, which the sums carry into the
// record's l, and the combine turns a NaN l into a NaN output.
fn poisons(s: vec4<f32>) -> vec4<bool> {
    let b = bitcast<vec4<u32>>(s);
    return ((b & vec4<u32>(0x7fffffffu)) >= vec4<u32>(0x7f800000u)) & (b != vec4<u32>(0xff800000u));
}

// A quiet NaN, from bits held in a variable (a constant expression must not evaluate to one).
fn nan4() -> vec4<f32> {
    var b = 0x7fc00000u;
    return vec4<f32>(bitcast<f32>(b));
}

// Whether x is a NaN (by its bits).
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// The work of workgroup `id` of a partial pass (tiled or subgroup; one workgroup per row, KV
// head, part and split, a part being a segment's head chunk times a channel block): its row rr
// (query row t = row_base + rr), KV head kh, selection group g, channel block cb, split, and
// heads h0 … h0 + hc − 1. hc = 0: nothing to do (past the grid, or a segment this KV head
// does not meet).
struct PartWork {
    rr: u32,
    t: u32,
    kh: u32,
    g: u32,
    cb: u32,
    split: u32,
    h0: u32,
    hc: u32,
}

fn part_work(id: u32) -> PartWork {
    var w = PartWork(0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
    let parts = P.segs * P.chunks * P.cblocks;
    if (id >= P.rows * P.hkv * parts * P.splits) {
        return w;
    }
    let rr = id / (P.hkv * parts * P.splits);
    let kh = (id / (parts * P.splits)) % P.hkv;
    let part_id = (id / P.splits) % parts;
    let seg = part_id / (P.chunks * P.cblocks);
    let chunk = (part_id / P.cblocks) % P.chunks;
    let gsz = P.h / P.hkv;  // query heads per KV head
    let ssz = P.h / P.hs;   // query heads per selection group
    let g = kh * gsz / ssz + seg;
    let s1 = min((kh + 1u) * gsz, (g + 1u) * ssz);
    let h0 = max(kh * gsz, g * ssz) + chunk * P.hc;
    if (g >= P.hs || h0 >= s1) {
        return w;
    }
    w = PartWork(rr, P.row_base + rr, kh, g, part_id % P.cblocks, id % P.splits, h0,
                 min(P.hc, s1 - h0));
    return w;
}
