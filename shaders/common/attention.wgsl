// The uniform block shared by the three stages of sparse_attention (the routing of token lists
// in sparse_attention_route.wgsl, the partial pass in sparse_attention.wgsl, the merge in
// sparse_attention_combine.wgsl), and the layouts of the scratch that passes between them.
//
// The routes of one (row, selection group): record (r · Hs + g) of `routes`, shards + 1 + W
// u32s: the start of each shard's rows, then the total kept, then the kept rows grouped by
// shard, in list order within a shard; a row is its offset in the shard without KV head,
// layer and plane: (page % shard_pages) · page_stride + (position % page_size) · Hkv · E.
//
// A partial result covers one (row, query head, split, phase): record
// ((r · H + h) · splits + s) · phases + f of `part` (r = row − row_base), E4 + 1 vec4s: the
// head's un-normalised accumulator Σ_j e^{z_j − m} V_j over the split's tokens of phase f (the
// V step deals a split's tokens to `phases` groups of invocations) as E4 = ceil(E / 4) channel
// quads, then (m, l, 0, 0) with m the split's running maximum of the scores and
// l = Σ_j e^{z_j − m} over the same tokens. An empty one holds m = LOW, l = 0, acc = 0.

struct SparseAttentionParams {
    t: u32,           // query rows of the whole call
    n: u32,           // sequences
    h: u32,           // query heads
    hkv: u32,         // KV heads
    hs: u32,          // selection groups
    e: u32,           // head dim
    w: u32,           // token slots per (row, group)
    hc: u32,          // query heads per workgroup (at most 4 · HQ)
    segs: u32,        // selection groups that can meet one KV group
    chunks: u32,      // head chunks per (KV head, selection group) segment
    cblocks: u32,     // channel blocks of the V step: (64 / phases) · 2 quads each
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
    _pad0: u32,
}

const LOW: f32 = -3.0e38;     // "no score yet": below every real score, and finite
