// Device-side error flags: a shader that meets a value it must not use (a page index past
// the pool, a length past a buffer) clamps the access, skips the work and sets a bit here;
// the host reads the word after the submission and turns each bit into an error.
const FLAG_LENGTHS: u32 = 1u;       // key_counts < cache_lengths
const FLAG_BLOCKS: u32 = 2u;        // key_counts / r > max_blocks
const FLAG_PAGE_SLOT: u32 = 4u;     // position needs a page-table column past max_pages
const FLAG_PAGE: u32 = 8u;          // page-table entry >= num_pages
const FLAG_ROPE_ROW: u32 = 16u;     // position >= rows of freqs_cis
const FLAG_TOKEN: u32 = 32u;        // token index outside 0 ..= position
const FLAG_NSA_LENGTHS: u32 = 64u;  // NSA length or offset inconsistent with its buffers
const FLAG_COUNT: u32 = 128u;       // token count outside 0 ..= W
