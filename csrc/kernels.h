// The kernels of simsearch._simd, one set per instruction set (namespaces scalar, avx2,
// avx512, each compiled from kernels_impl.h with its own flags). Plain structs of pointers: the
// bindings (module.cpp) check shapes and types, the kernels trust them.
#pragma once
#include <cstdint>

namespace simsearch {

// NEQ fast-scan over inverted lists (docs/kernels.md, "4-bit fast-scan").
// Block layout: items of a list in blocks of 32; block b holds n_pairs * 32 bytes of direction
// codes (byte 2j of pair p: codes of sub-quantizers 2p (low nibble) and 2p + 1 (high nibble)
// of item j; byte 2j + 1: the same for item 16 + j), then 32 norm codes in item order.
struct FastScanArgs {
  const uint8_t* blocks;       // (n_blocks, n_pairs * 32 + 32)
  int64_t n_pairs;
  const int64_t* list_blocks;  // (n_lists + 1,): list l owns blocks list_blocks[l]..[l + 1]
  int64_t n_lists;
  const int64_t* block_base;   // (n_blocks,): position of the block's item 0
  const uint8_t* block_count;  // (n_blocks,): items in the block, 1..32
  const int64_t* probes;       // (nq, n_probe) lists to scan, or nullptr: every list
  int64_t n_probe;
  const uint8_t* luts;         // (nq, 2 * n_pairs, 16) 8-bit lookup tables
  const float* lut_scale;      // (nq,) estimate = norm * (scale * sum + bias)
  const float* lut_bias;       // (nq,)
  const float* norm_codebook;  // (16,)
  int64_t k;                   // candidates kept per query
  bool ordered;                // sort each row by decreasing estimate
  int64_t* out_pos;            // (nq, k), -1 padding
  float* out_scores;           // (nq, k), -inf padding
};

// Graph search on full or 8-bit scalar-quantized vectors (docs/kernels.md, "graph search").
// An HNSW-like angular graph (hnswlib's, extracted) seeds a best-first search on the
// inner-product graph; with ``codes`` the walk scores q . (vmin + vstep * code), with
// ``qblocks`` the inner-product walk scores each node's neighbours from its block of 4-bit codes,
// and either way the best ``rerank`` of the beam are re-scored exactly on ``xb``.
struct GraphArgs {
  const float* Q;  // (nq, d)
  int64_t d;
  int64_t k, ef, angular_ef, rerank;
  int64_t n;               // items (rows of xb, codes, visited)
  const float* xb;         // (n, d) exact vectors
  const uint8_t* codes;    // (n, d) or nullptr: walk on xb
  const float* vmin;       // (d,)
  const float* vstep;      // (d,)
  const float* inv_norm;   // (n,)
  const uint8_t* live;     // (n,)
  // the angular graph: level 0, upper levels (row upper_start[u] + l - 1 for level l >= 1)
  const int32_t* a_links0; int64_t a_width0; const int32_t* a_degree0;
  const int32_t* a_upper_links; int64_t a_width1; const int32_t* a_upper_degree;
  const int64_t* a_upper_start; int64_t a_entry; int64_t a_max_level;
  // the inner-product graph
  const int32_t* links; int64_t width; const int32_t* degree;
  // the quantized graph, or qblocks nullptr: node u's neighbours' 4-bit NEQ codes in blocks
  // u * q_per_node.. of the fast-scan layout (item i of its block j is links[u][32j + i]), so
  // one expansion scores them all with the tables ``luts`` (FastScanArgs' estimate)
  const uint8_t* qblocks; int64_t q_pairs; int64_t q_per_node;
  const uint8_t* luts; const float* lut_scale; const float* lut_bias;
  const float* norm_codebook;
  int32_t* out_pos;     // (nq, k)
  float* out_scores;    // (nq, k)
  int64_t* out_ndis;    // (nq, 2): angular, inner-product distance computations
};

// Exact re-rank: the best k of each row's candidate positions by q . xb[pos] (-1 skipped).
struct RerankArgs {
  const int64_t* cand;  // (nq, r)
  int64_t r;
  const float* xb;      // (n, d)
  const float* Q;       // (nq, d)
  int64_t d, k;
  int64_t* out_pos;     // (nq, k), best first, -1 padding
  float* out_scores;    // (nq, k)
};

// Exact top-k over every row (the flat index's small batches): inner product, or with ``xsq``
// squared L2 (|q|^2 - 2 q.x + |x|^2, at least 0). Ties go to the smaller id.
struct FlatArgs {
  const float* Q;       // (nq, d)
  int64_t d;
  const float* xb;      // (n, d)
  int64_t n;
  const int64_t* ids;   // (n,)
  const float* xsq;     // (n,) squared norms of xb, or nullptr: inner product
  int64_t k;            // <= n
  int64_t* out_ids;     // (nq, k), best first
  float* out_scores;    // (nq, k)
};

// Seismic's query walk over a sparse index (docs/sparse.md, "Seismic"): the query's
// ``query_cut`` heaviest terms, heaviest first; each block of their pruned posting lists whose
// 8-bit summary bound reaches ``heap_factor`` times the k-th score so far has its documents
// scored exactly from the forward rows (each once); then every position from ``n_main`` on (the
// tail not yet in blocks). A list's summaries are kept term-major, so its blocks' bounds are
// accumulated from the entries of the query's own terms only. With compact rows the walk ranks
// by them and keeps 2k; the answers are scored exactly from the float32 rows. Ties go to the
// smaller id.
struct SeismicArgs {
  const int64_t* qp; const uint32_t* qi; const float* qv;  // queries (CSR), ascending terms < dim
  int64_t query_cut; float heap_factor;
  const int64_t* term_blocks;     // (dim + 1,): term t owns blocks term_blocks[t]..[t + 1]
  const int64_t* block_docs_ptr;  // (n_blocks + 1,)
  const int64_t* block_docs;      // positions, by block
  const float* scale;             // (n_blocks,): a summary code's weight
  const int64_t* term_comps;      // (dim + 1,): term t's list's summary terms
  const uint32_t* comps;          // ascending within a list
  const int64_t* comp_ptr;        // (n_comps + 1,): a summary term's entries
  const uint16_t* ent_block;      // the entry's block, counted from its list's first
  const uint8_t* ent_code;
  int64_t n_main, n_pos;          // positions in blocks; all positions
  const int64_t* fp; const uint32_t* fi; const float* fv;  // forward rows (CSR) by position
  const int64_t* pos_ids;         // (n_pos,)
  // or null: the rows of positions below n_main in 4 bytes an entry (the term's 16-bit code,
  // a float16 weight above it), term_code (dim,) mapping a term to its code (0xffff: none)
  const uint32_t* compact; const uint16_t* term_code;
  const uint8_t* ok;              // (n_pos,): the position may be answered
  int64_t k, dim;
  int64_t* out_ids;               // (nq, k), best first, -1 padding
  float* out_scores;              // (nq, k), -inf padding
};

#define SIMSEARCH_DECLARE(NS)                                                                \
  namespace NS {                                                                             \
  void fastscan(const FastScanArgs& a, int64_t q_lo, int64_t q_hi);                          \
  void graph_search(const GraphArgs& a, int64_t q_lo, int64_t q_hi, uint8_t* visited,       \
                    uint8_t* epoch);                                                         \
  void rerank(const RerankArgs& a, int64_t q_lo, int64_t q_hi);                             \
  void flat_topk(const FlatArgs& a, int64_t q_lo, int64_t q_hi);                             \
  void seismic_search(const SeismicArgs& a, int64_t q_lo, int64_t q_hi);                     \
  /* float tables (nq, md, 16) -> 8-bit tables, scale, bias (fastscan.quantize_luts) */      \
  void quantize_luts(const float* lut, int64_t md, int64_t n_pairs, int64_t q_lo,            \
                     int64_t q_hi, uint8_t* q8, float* scale, float* bias);                  \
  float dot(const float* a, const float* b, int64_t d);                                      \
  }

SIMSEARCH_DECLARE(scalar)
SIMSEARCH_DECLARE(avx2)
SIMSEARCH_DECLARE(avx512)

}  // namespace simsearch
