// simsearch._simd: the compiled kernels' bindings. Picks the instruction set once at import from
// what the CPU reports (AVX-512 F/BW/VL/DQ/VNNI, else AVX2 + FMA, else scalar); set_isa() forces one
// (tests compare every path on the same machine). Kernels release the GIL and split a batch of
// queries over n_threads std::threads. Shapes and types are checked here; the Python wrappers
// (simsearch._simd_kernels) build the arguments.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels.h"

namespace nb = nanobind;
using namespace simsearch;

namespace {

enum class Isa { scalar, avx2, avx512 };

bool cpu_has(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") &&
             cpu_has(Isa::avx2);
  }
  return false;
}

Isa best_isa() {
  if (cpu_has(Isa::avx512)) return Isa::avx512;
  if (cpu_has(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa g_isa = best_isa();

// one set of kernels per instruction set, indexed by Isa
struct Kernels {
  decltype(&scalar::fastscan) fastscan;
  decltype(&scalar::graph_search) graph_search;
  decltype(&scalar::rerank) rerank;
  decltype(&scalar::quantize_luts) quantize_luts;
  decltype(&scalar::flat_topk) flat_topk;
  decltype(&scalar::seismic_search) seismic_search;
};
#define SIMSEARCH_KERNELS(NS) \
  Kernels { &NS::fastscan, &NS::graph_search, &NS::rerank, &NS::quantize_luts, &NS::flat_topk, \
            &NS::seismic_search }
const Kernels kKernels[] = {SIMSEARCH_KERNELS(scalar), SIMSEARCH_KERNELS(avx2),
                            SIMSEARCH_KERNELS(avx512)};

const Kernels& kernels() { return kKernels[static_cast<int>(g_isa)]; }

const char* isa_name(Isa i) {
  return i == Isa::avx512 ? "avx512" : i == Isa::avx2 ? "avx2" : "scalar";
}

template <class T>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<T, nb::c_contig, nb::device::cpu>;

void require(bool ok, const std::string& what) {
  if (!ok) throw nb::value_error(what.c_str());
}

int resolve_threads(int n_threads, int64_t nq) {
  // asked once: glibc reads /sys for it, which cost a small batch's call several microseconds
  static const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int t = n_threads == -1 ? hw : n_threads;
  require(t >= 1 && t <= 1024, "n_threads must be -1 or in [1, 1024]");
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(t, nq)));
}

// run fn(lo, hi, worker) over [0, nq) in n contiguous blocks, the GIL released
template <class F>
void parallel_blocks(int64_t nq, int threads, F fn) {
  nb::gil_scoped_release release;
  if (threads <= 1) {
    fn(0, nq, 0);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  for (int w = 0; w < threads; ++w) {
    int64_t lo = nq * w / threads, hi = nq * (w + 1) / threads;
    pool.emplace_back([&, lo, hi, w] {
      try { fn(lo, hi, w); } catch (...) { errors[w] = std::current_exception(); }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void fastscan(In<uint8_t> blocks, In<int64_t> list_blocks, In<int64_t> block_base,
              In<uint8_t> block_count, In<int64_t> probes, In<uint8_t> luts,
              In<float> lut_scale, In<float> lut_bias, In<float> norm_codebook,
              Out<int64_t> out_pos, Out<float> out_scores, bool ordered, int n_threads) {
  require(blocks.ndim() == 2 && blocks.shape(1) >= 64 && blocks.shape(1) % 32 == 0,
          "blocks must be (n_blocks, 32 * n_pairs + 32) uint8");
  const int64_t n_blocks = blocks.shape(0), n_pairs = blocks.shape(1) / 32 - 1;
  require(list_blocks.ndim() == 1 && list_blocks.shape(0) >= 2, "list_blocks: (n_lists + 1,)");
  const int64_t n_lists = list_blocks.shape(0) - 1;
  require(list_blocks.data()[0] == 0 && list_blocks.data()[n_lists] == n_blocks,
          "list_blocks must run from 0 to n_blocks");
  for (int64_t l = 0; l < n_lists; ++l)
    require(list_blocks.data()[l] <= list_blocks.data()[l + 1], "list_blocks must not decrease");
  require(block_base.ndim() == 1 && block_base.shape(0) == static_cast<size_t>(n_blocks) &&
              block_count.ndim() == 1 && block_count.shape(0) == static_cast<size_t>(n_blocks),
          "block_base and block_count: (n_blocks,)");
  for (int64_t b = 0; b < n_blocks; ++b)
    require(block_count.data()[b] >= 1 && block_count.data()[b] <= 32, "block_count in [1, 32]");
  require(luts.ndim() == 3 && luts.shape(1) == static_cast<size_t>(2 * n_pairs) && luts.shape(2) == 16,
          "luts must be (nq, 2 * n_pairs, 16) uint8");
  const int64_t nq = luts.shape(0);
  require(lut_scale.ndim() == 1 && lut_scale.shape(0) == static_cast<size_t>(nq) &&
              lut_bias.ndim() == 1 && lut_bias.shape(0) == static_cast<size_t>(nq),
          "lut_scale and lut_bias: (nq,)");
  require(norm_codebook.ndim() == 1 && norm_codebook.shape(0) == 16, "norm_codebook: (16,)");
  require(out_pos.ndim() == 2 && out_pos.shape(0) == static_cast<size_t>(nq) &&
              out_scores.ndim() == 2 && out_scores.shape(0) == static_cast<size_t>(nq) &&
              out_pos.shape(1) == out_scores.shape(1) && out_pos.shape(1) >= 1,
          "out_pos and out_scores: (nq, k), k >= 1");
  const bool all = probes.ndim() != 2 || probes.shape(1) == 0;
  require(all || probes.shape(0) == static_cast<size_t>(nq), "probes: (nq, n_probe)");
  FastScanArgs a{blocks.data(), n_pairs, list_blocks.data(), n_lists, block_base.data(),
                 block_count.data(), all ? nullptr : probes.data(),
                 all ? 0 : static_cast<int64_t>(probes.shape(1)), luts.data(), lut_scale.data(),
                 lut_bias.data(), norm_codebook.data(), static_cast<int64_t>(out_pos.shape(1)),
                 ordered, out_pos.data(), out_scores.data()};
  const auto run = kernels().fastscan;
  parallel_blocks(nq, resolve_threads(n_threads, nq),
                  [&](int64_t lo, int64_t hi, int) { run(a, lo, hi); });
}

void quantize(In<float> lut, Out<uint8_t> q8, Out<float> scale, Out<float> bias,
              int n_threads) {
  require(lut.ndim() == 3 && lut.shape(2) == 16, "lut must be (nq, md, 16) float32");
  const int64_t nq = lut.shape(0), md = lut.shape(1);
  require(q8.ndim() == 3 && q8.shape(0) == static_cast<size_t>(nq) && q8.shape(2) == 16 &&
              q8.shape(1) >= static_cast<size_t>(md) && q8.shape(1) % 2 == 0 &&
              scale.ndim() == 1 && scale.shape(0) == static_cast<size_t>(nq) &&
              bias.ndim() == 1 && bias.shape(0) == static_cast<size_t>(nq),
          "q8 (nq, 2 * n_pairs >= md, 16), scale and bias (nq,)");
  const int64_t n_pairs = q8.shape(1) / 2;
  const auto run = kernels().quantize_luts;
  parallel_blocks(nq, resolve_threads(n_threads, nq), [&](int64_t lo, int64_t hi, int) {
    run(lut.data(), md, n_pairs, lo, hi, q8.data(), scale.data(), bias.data());
  });
}

void graph_search(In<float> Q, int64_t k, int64_t ef, int64_t angular_ef, int64_t rerank,
                  In<float> xb, In<uint8_t> codes, In<float> vmin, In<float> vstep,
                  In<float> inv_norm, In<uint8_t> live, In<int32_t> a_links0,
                  In<int32_t> a_degree0, In<int32_t> a_upper_links, In<int32_t> a_upper_degree,
                  In<int64_t> a_upper_start, int64_t a_entry, int64_t a_max_level,
                  In<int32_t> links, In<int32_t> degree, In<uint8_t> qblocks,
                  int64_t q_per_node, In<uint8_t> luts, In<float> lut_scale,
                  In<float> lut_bias, In<float> norm_codebook, Out<uint8_t> visited,
                  Out<uint8_t> epochs, Out<int32_t> out_pos, Out<float> out_scores,
                  Out<int64_t> out_ndis, int n_threads) {
  require(Q.ndim() == 2 && xb.ndim() == 2 && Q.shape(1) == xb.shape(1), "Q (nq, d), xb (n, d)");
  const int64_t nq = Q.shape(0), d = Q.shape(1), n = xb.shape(0);
  require(n >= 1, "the graph is empty");
  const bool use_codes = codes.ndim() == 2 && codes.shape(1) > 0;
  if (use_codes)
    require(codes.shape(0) == static_cast<size_t>(n) && codes.shape(1) == static_cast<size_t>(d) &&
                vmin.ndim() == 1 && vmin.shape(0) == static_cast<size_t>(d) &&
                vstep.ndim() == 1 && vstep.shape(0) == static_cast<size_t>(d),
            "codes (n, d), vmin and vstep (d,)");
  auto rows = [&](const auto& arr, size_t r) { return arr.ndim() >= 1 && arr.shape(0) >= r; };
  const size_t na = a_links0.ndim() == 2 ? a_links0.shape(0) : 0;  // nodes of the angular graph
  require(rows(inv_norm, n) && rows(live, n) && rows(degree, n) && links.ndim() == 2 &&
              rows(links, n) && na >= 1 && na <= static_cast<size_t>(n) &&
              rows(a_degree0, na) && rows(a_upper_start, na) && a_upper_links.ndim() == 2 &&
              a_upper_degree.ndim() == 1 && a_upper_degree.shape(0) == a_upper_links.shape(0),
          "graph arrays do not match the items");
  require(a_entry >= 0 && static_cast<size_t>(a_entry) < na, "entry point out of range");
  require(k >= 1 && ef >= 1 && angular_ef >= 1 && rerank >= 0, "k, ef, angular_ef >= 1");
  // the quantized graph: qblocks (n_blocks, 32 * q_pairs + 32), or no rows to walk on codes
  const bool quantized = qblocks.ndim() == 2 && qblocks.shape(0) > 0;
  int64_t q_pairs = 0;
  if (quantized) {
    require(qblocks.shape(1) >= 64 && qblocks.shape(1) % 32 == 0,
            "qblocks must be (n_blocks, 32 * n_pairs + 32) uint8");
    q_pairs = qblocks.shape(1) / 32 - 1;
    require(q_per_node >= 1 && q_per_node <= 64 &&
                static_cast<int64_t>(qblocks.shape(0)) >= n * q_per_node,
            "qblocks must hold q_per_node (1..64) blocks for each of the n items");
    require(luts.ndim() == 3 && luts.shape(0) == static_cast<size_t>(nq) &&
                luts.shape(1) == static_cast<size_t>(2 * q_pairs) && luts.shape(2) == 16,
            "luts must be (nq, 2 * n_pairs, 16) uint8");
    require(lut_scale.ndim() == 1 && lut_scale.shape(0) == static_cast<size_t>(nq) &&
                lut_bias.ndim() == 1 && lut_bias.shape(0) == static_cast<size_t>(nq),
            "lut_scale and lut_bias: (nq,)");
    require(norm_codebook.ndim() == 1 && norm_codebook.shape(0) == 16,
            "norm_codebook must be (16,)");
  }
  const int threads = resolve_threads(n_threads, nq);
  require(visited.ndim() == 2 && visited.shape(0) >= static_cast<size_t>(threads) &&
              visited.shape(1) >= static_cast<size_t>(n) && epochs.ndim() == 1 &&
              epochs.shape(0) >= static_cast<size_t>(threads),
          "visited (threads, n) and epochs (threads,)");
  require(out_pos.ndim() == 2 && out_pos.shape(0) == static_cast<size_t>(nq) &&
              out_pos.shape(1) == static_cast<size_t>(k) && out_scores.ndim() == 2 &&
              out_scores.shape(0) == static_cast<size_t>(nq) &&
              out_scores.shape(1) == static_cast<size_t>(k) && out_ndis.ndim() == 2 &&
              out_ndis.shape(0) == static_cast<size_t>(nq) && out_ndis.shape(1) == 2,
          "out_pos, out_scores (nq, k), out_ndis (nq, 2)");
  GraphArgs a{};
  a.Q = Q.data(); a.d = d; a.k = k; a.ef = ef; a.angular_ef = angular_ef; a.rerank = rerank;
  a.n = n; a.xb = xb.data(); a.codes = use_codes ? codes.data() : nullptr;
  a.vmin = use_codes ? vmin.data() : nullptr; a.vstep = use_codes ? vstep.data() : nullptr;
  a.inv_norm = inv_norm.data(); a.live = live.data();
  a.a_links0 = a_links0.data(); a.a_width0 = a_links0.shape(1); a.a_degree0 = a_degree0.data();
  a.a_upper_links = a_upper_links.data(); a.a_width1 = a_upper_links.shape(1);
  a.a_upper_degree = a_upper_degree.data(); a.a_upper_start = a_upper_start.data();
  a.a_entry = a_entry; a.a_max_level = a_max_level;
  a.links = links.data(); a.width = links.shape(1); a.degree = degree.data();
  if (quantized) {
    a.qblocks = qblocks.data(); a.q_pairs = q_pairs; a.q_per_node = q_per_node;
    a.luts = luts.data(); a.lut_scale = lut_scale.data(); a.lut_bias = lut_bias.data();
    a.norm_codebook = norm_codebook.data();
  }
  a.out_pos = out_pos.data(); a.out_scores = out_scores.data(); a.out_ndis = out_ndis.data();
  const auto run = kernels().graph_search;
  const int64_t vstride = visited.shape(1);
  parallel_blocks(nq, threads, [&](int64_t lo, int64_t hi, int w) {
    run(a, lo, hi, visited.data() + w * vstride, epochs.data() + w);
  });
}

void rerank(In<int64_t> cand, In<float> xb, In<float> Q, Out<int64_t> out_pos,
            Out<float> out_scores, int n_threads) {
  require(cand.ndim() == 2 && xb.ndim() == 2 && Q.ndim() == 2 && Q.shape(1) == xb.shape(1) &&
              cand.shape(0) == Q.shape(0),
          "cand (nq, r), xb (n, d), Q (nq, d)");
  const int64_t nq = Q.shape(0), n = xb.shape(0), r = cand.shape(1);
  for (int64_t i = 0; i < nq * r; ++i)
    require(cand.data()[i] < n, "candidate positions must be < n (or -1)");
  require(out_pos.ndim() == 2 && out_pos.shape(0) == static_cast<size_t>(nq) &&
              out_scores.ndim() == 2 && out_scores.shape(0) == static_cast<size_t>(nq) &&
              out_pos.shape(1) == out_scores.shape(1) && out_pos.shape(1) >= 1,
          "out_pos and out_scores: (nq, k), k >= 1");
  RerankArgs a{cand.data(), r, xb.data(), Q.data(), static_cast<int64_t>(Q.shape(1)),
               static_cast<int64_t>(out_pos.shape(1)), out_pos.data(), out_scores.data()};
  const auto run = kernels().rerank;
  parallel_blocks(nq, resolve_threads(n_threads, nq),
                  [&](int64_t lo, int64_t hi, int) { run(a, lo, hi); });
}

// true when no element is NaN or +-Inf (an exponent of all ones): every search and add checks
// its batch, and numpy's isfinite + all costs a small batch more than the rest of the check
bool all_finite(In<float> x) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x.data());
  const size_t n = x.size();
  auto scan = [&] {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    return !bad;
  };
  if (n < (size_t{1} << 16)) return scan();  // a query's few floats: handing the GIL over costs more
  nb::gil_scoped_release release;
  return scan();
}

// fresh (ids (nq, k) int64, scores (nq, k) float32) arrays for a kernel to fill, returned to
// Python as they are: one call a search, not another for the outputs
struct TopkOut {
  int64_t nq, k;
  int64_t* ids = new int64_t[nq * k];
  float* scores = new float[nq * k];
  nb::capsule own_ids{ids, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); }};
  nb::capsule own_scores{scores, [](void* p) noexcept { delete[] static_cast<float*>(p); }};
  nb::tuple result() const {
    const size_t shape[2] = {static_cast<size_t>(nq), static_cast<size_t>(k)};
    return nb::make_tuple(nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>(ids, 2, shape, own_ids),
                          nb::ndarray<nb::numpy, float, nb::ndim<2>>(scores, 2, shape,
                                                                     own_scores));
  }
};

// the flat index's small batches
nb::tuple flat_topk(In<float> Q, In<float> xb, In<int64_t> ids, nb::object xsq, int64_t k) {
  require(Q.ndim() == 2 && xb.ndim() == 2 && Q.shape(1) == xb.shape(1),
          "Q (nq, d) and xb (n, d) float32");
  const int64_t nq = Q.shape(0), n = xb.shape(0), d = Q.shape(1);
  require(ids.ndim() == 1 && ids.shape(0) == static_cast<size_t>(n), "ids: (n,) int64");
  require(k >= 1 && k <= n, "k must be in [1, n]");
  const float* sq = nullptr;
  In<float> xsq_arr;
  if (!xsq.is_none()) {
    xsq_arr = nb::cast<In<float>>(xsq);
    require(xsq_arr.ndim() == 1 && xsq_arr.shape(0) == static_cast<size_t>(n),
            "xsq: (n,) float32 or None");
    sq = xsq_arr.data();
  }
  TopkOut out{nq, k};
  FlatArgs a{Q.data(), d, xb.data(), n, ids.data(), sq, k, out.ids, out.scores};
  const auto run = kernels().flat_topk;
  parallel_blocks(nq, 1, [&](int64_t lo, int64_t hi, int) { run(a, lo, hi); });
  return out.result();
}


template <class T>
const T* vec(const In<T>& x, size_t n, const char* what) {
  require(x.ndim() == 1 && (n == SIZE_MAX || x.shape(0) == n), what);
  return x.data();
}

// Seismic's walk (SeismicArgs)
nb::tuple seismic_search(In<int64_t> qp, In<uint32_t> qi, In<float> qv, int64_t query_cut,
                         float heap_factor, In<int64_t> term_blocks, In<int64_t> block_docs_ptr,
                         In<int64_t> block_docs, In<float> scale, In<int64_t> term_comps,
                         In<uint32_t> comps, In<int64_t> comp_ptr, In<uint16_t> ent_block,
                         In<uint8_t> ent_code, In<uint32_t> compact, In<uint16_t> term_code,
                         int64_t n_main, In<int64_t> fp, In<uint32_t> fi, In<float> fv,
                         In<int64_t> pos_ids, In<uint8_t> ok, int64_t k, int64_t dim) {
  const size_t any = SIZE_MAX;
  require(qp.ndim() == 1 && qp.shape(0) >= 1, "qp: (nq + 1,) int64");
  const int64_t nq = qp.shape(0) - 1, n_pos = pos_ids.shape(0);
  const int64_t n_blocks = block_docs_ptr.shape(0) - 1;
  require(k >= 1 && dim >= 1 && query_cut >= 1 && 0 <= n_main && n_main <= n_pos,
          "k, dim, query_cut >= 1 and n_main in [0, n_pos]");
  const bool has_compact = compact.shape(0) > 0;
  SeismicArgs a{vec(qp, any, "qp"), vec(qi, any, "qi"), vec(qv, qi.shape(0), "qv: as qi"),
                query_cut, heap_factor,
                vec(term_blocks, dim + 1, "term_blocks: (dim + 1,)"),
                vec(block_docs_ptr, any, "block_docs_ptr"), vec(block_docs, any, "block_docs"),
                vec(scale, n_blocks, "scale: (n_blocks,)"),
                vec(term_comps, dim + 1, "term_comps: (dim + 1,)"), vec(comps, any, "comps"),
                vec(comp_ptr, comps.shape(0) + 1, "comp_ptr: (n_comps + 1,)"),
                vec(ent_block, any, "ent_block"),
                vec(ent_code, ent_block.shape(0), "ent_code: as ent_block"), n_main, n_pos,
                vec(fp, n_pos + 1, "fp: (n_pos + 1,)"), vec(fi, any, "fi"),
                vec(fv, any, "fv"), vec(pos_ids, any, "pos_ids"),
                has_compact ? compact.data() : nullptr,
                has_compact ? vec(term_code, dim, "term_code: (dim,)") : nullptr,
                vec(ok, n_pos, "ok: (n_pos,) uint8"), k, dim, nullptr, nullptr};
  require(qp.data()[nq] <= static_cast<int64_t>(qi.shape(0)) &&
              fp.data()[n_pos] <= static_cast<int64_t>(std::min(fi.shape(0), fv.shape(0))),
          "row offsets past their arrays");
  require(!has_compact || fp.data()[n_main] <= static_cast<int64_t>(compact.shape(0)),
          "compact rows shorter than the rows in blocks");
  TopkOut out{nq, k};
  a.out_ids = out.ids;
  a.out_scores = out.scores;
  const auto run = kernels().seismic_search;
  parallel_blocks(nq, 1, [&](int64_t lo, int64_t hi, int) { run(a, lo, hi); });
  return out.result();
}

}  // namespace

NB_MODULE(_simd, m) {
  m.doc() = "simsearch's compiled SIMD kernels (docs/kernels.md)";
  m.def("isa", [] { return std::string(isa_name(g_isa)); },
        "The instruction set the kernels use now: 'avx512', 'avx2' or 'scalar'.");
  m.def("supported", [] {
    std::vector<std::string> out;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
      if (cpu_has(i)) out.emplace_back(isa_name(i));
    return out;
  }, "The instruction sets this CPU can run.");
  m.def("set_isa", [](const std::string& name) {
    Isa want = name == "avx512" ? Isa::avx512 : name == "avx2" ? Isa::avx2 : Isa::scalar;
    if (name != "avx512" && name != "avx2" && name != "scalar" && name != "auto")
      throw nb::value_error(("isa must be 'auto', 'avx512', 'avx2' or 'scalar'; got '" + name + "'").c_str());
    if (name == "auto") want = best_isa();
    if (!cpu_has(want))
      throw nb::value_error(("this CPU cannot run the '" + name + "' kernels").c_str());
    std::string prev = isa_name(g_isa);
    g_isa = want;
    return prev;
  }, nb::arg("name"), "Force an instruction set ('auto' for the best); returns the previous.");
  m.def("fastscan", &fastscan, nb::arg("blocks"), nb::arg("list_blocks"), nb::arg("block_base"),
        nb::arg("block_count"), nb::arg("probes"), nb::arg("luts"), nb::arg("lut_scale"),
        nb::arg("lut_bias"), nb::arg("norm_codebook"), nb::arg("out_pos"), nb::arg("out_scores"),
        nb::arg("ordered"), nb::arg("n_threads"));
  m.def("graph_search", &graph_search);
  m.def("quantize_luts", &quantize, nb::arg("lut"), nb::arg("q8"), nb::arg("scale"),
        nb::arg("bias"), nb::arg("n_threads"));
  m.def("all_finite", &all_finite, nb::arg("x"),
        "True when no element of the float32 C-contiguous array is NaN or infinite.");
  m.def("flat_topk", &flat_topk, nb::arg("Q"), nb::arg("xb"), nb::arg("ids"), nb::arg("xsq").none(),
        nb::arg("k"),
        "The exact top-k of each query over every row (inner product, or with xsq squared "
        "L2), best first, ties to the smaller id: (ids (nq, k) int64, scores (nq, k) float32).");
  m.def("seismic_search", &seismic_search);
  m.def("rerank", &rerank, nb::arg("cand"), nb::arg("xb"), nb::arg("Q"), nb::arg("out_pos"),
        nb::arg("out_scores"), nb::arg("n_threads"));
}
