// accrue_bench_ce_overlap: can two GPUs' gradient all-reduce run on the copy
// engines instead of the SMs, under a backward's GEMMs, without slowing them?
//
//   accrue_bench_ce_overlap [--mib M] [--bucket-mib B] [--gemms N] [--repeats R]
//                           [--progressive]
//
// One process drives GPUs 0 and 1 (peer access on). Each GPU holds M MiB of
// fp32 "gradients" (random values) and runs a chain of N bf16 GEMMs shaped as
// the 105M-parameter MLP's backward (4096 x 4096 x 2048, alternately writing
// an fp32 slot with beta = 1 and a bf16 output), and, on a second stream, an
// all-reduce of the gradients in buckets of B MiB by one of
//   nccl  ncclAllReduce per bucket (what the reducer runs today);
//   ce    per bucket, each GPU pulls the peer's copy of its own half with a
//         peer cudaMemcpyAsync (a copy engine), adds it with a small kernel,
//         and pushes the sum into the peer's half (a copy engine again): the
//         SMs run only the add;
//   ce2   the same, pipelined: the pulls on one stream, the adds and pushes
//         on a second, so the next bucket's pull runs beside this one's add;
//   nccl_sym  ncclAllReduce per bucket on gradients allocated by ncclMemAlloc
//         and registered as one symmetric window (NCCL_WIN_COLL_SYMMETRIC), so
//         NCCL may run its symmetric kernels, which load and store the peer's
//         buffer directly instead of staging through its FIFOs.
// and, to tell which traffic slows the GEMMs, three that move the buckets'
// bytes without summing across GPUs (their results are not checked):
//   local_copy  a device-to-device cudaMemcpyAsync of each bucket (a copy
//         engine and the GPU's own memory, no NVLink, no SMs);
//   local_add   scratch += bucket by a kernel of 16 blocks (NCCL's order of
//         SMs, 12 bytes an element of the GPU's own memory, no NVLink);
//   peer_copy   each GPU pulls the peer's whole bucket with a peer
//         cudaMemcpyAsync (a copy engine over NVLink, no SMs).
// With --progressive the buckets are released as a backward releases them:
// an equal share after each pair of GEMMs (the comm stream waits for an
// event there), so the all-reduce can only trail the chain, as under the
// last micro-batch's backward; without it every bucket is ready at once.
// It reports, medians of R: the GEMM chain alone, the all-reduce alone (and
// its bus bandwidth), and both together (the chain's time and the makespan),
// and checks that ce's sums equal nccl's bit for bit (fp32 a + b commutes).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CKB(x)                                                           \
  do {                                                                   \
    if ((x) != CUBLAS_STATUS_SUCCESS) {                                  \
      std::fprintf(stderr, "%s:%d %s failed\n", __FILE__, __LINE__, #x); \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)
#define CKN(x)                                                                                \
  do {                                                                                        \
    ncclResult_t r_ = (x);                                                                    \
    if (r_ != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

__global__ void fill(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = (float(h & 0xffffff) / float(0x1000000) - 0.5f) * 1e-2f;
  }
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2246822519u ^ seed * 3266489917u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(float(h & 0xffff) / 65536.f - 0.5f);
  }
}

// dst[i] += src[i], four at a time (n a multiple of 4, both 16-byte aligned).
__global__ void add_into(float4* dst, const float4* src, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 a = dst[i];
    const float4 b = src[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    dst[i] = a;
  }
}

struct Gpu {
  int dev = 0;
  cudaStream_t compute = nullptr, comm = nullptr, comm2 = nullptr;
  std::vector<cudaEvent_t> pulled;  // ce2: bucket b's pull is done
  cublasHandle_t blas = nullptr;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *out16 = nullptr;
  float* slot = nullptr;
  float* grad = nullptr;     // the gradients to all-reduce
  float* init = nullptr;     // their values before, restored each repeat
  float* scratch = nullptr;  // ce: the peer's half, pulled
  float* sym = nullptr;      // nccl_sym: gradients in a symmetric NCCL window
  ncclWindow_t window = nullptr;
  ncclComm_t nccl = nullptr;
};

constexpr int kM = 4096, kN = 4096, kK = 2048;

void gemm_chain(Gpu& g, int begin, int end) {
  const float one = 1.f, zero = 0.f;
  for (int i = begin; i < end; ++i) {
    if (i % 2 == 0) {  // a weight gradient into the fp32 slot
      CKB(cublasGemmEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, kM, kN, kK, &one, g.a, CUDA_R_16BF, kM,
                       g.b, CUDA_R_16BF, kN, &one, g.slot, CUDA_R_32F, kM, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
    } else {  // an input gradient in bf16
      CKB(cublasGemmEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kN, &one, g.a, CUDA_R_16BF, kM,
                       g.b, CUDA_R_16BF, kN, &zero, g.out16, CUDA_R_16BF, kM, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
    }
  }
}

struct Plan {
  size_t elems = 0, bucket = 0;  // floats; bucket a multiple of 8
};

int bucket_count(const Plan& p) {
  return int((p.elems + p.bucket - 1) / p.bucket);
}

// Buckets [b0, b1) of the plan.
void allreduce_nccl(std::vector<Gpu>& gs, const Plan& p, int b0, int b1) {
  for (int b = b0; b < b1; ++b) {
    const size_t off = size_t(b) * p.bucket, n = std::min(p.bucket, p.elems - off);
    CKN(ncclGroupStart());
    for (Gpu& g : gs) {
      CK(cudaSetDevice(g.dev));
      CKN(ncclAllReduce(g.grad + off, g.grad + off, n, ncclFloat, ncclSum, g.nccl, g.comm));
    }
    CKN(ncclGroupEnd());
  }
}

// Per bucket [off, off + n): GPU d owns half d. It pulls the peer's half d,
// adds it into its own, and pushes the sum into the peer's half d; the peer
// waits for that before reading it (here: the end of the all-reduce).
void allreduce_ce(std::vector<Gpu>& gs, const Plan& p, int b0, int b1, bool pipelined) {
  for (int b = b0; b < b1; ++b) {
    const size_t off = size_t(b) * p.bucket, n = std::min(p.bucket, p.elems - off);
    const size_t half = (n / 2) & ~size_t(3);
    for (int d = 0; d < 2; ++d) {
      Gpu& g = gs[d];
      Gpu& peer = gs[1 - d];
      const size_t lo = d == 0 ? 0 : half, len = d == 0 ? half : n - half;
      CK(cudaSetDevice(g.dev));
      CK(cudaMemcpyPeerAsync(g.scratch + off + lo, g.dev, peer.grad + off + lo, peer.dev,
                             len * sizeof(float), g.comm));
      cudaStream_t add_stream = g.comm;
      if (pipelined) {  // the add and the push on comm2, after the pull
        CK(cudaEventRecord(g.pulled[b], g.comm));
        CK(cudaStreamWaitEvent(g.comm2, g.pulled[b], 0));
        add_stream = g.comm2;
      }
      add_into<<<264, 512, 0, add_stream>>>(reinterpret_cast<float4*>(g.grad + off + lo),
                                            reinterpret_cast<const float4*>(g.scratch + off + lo),
                                            len / 4);
      CK(cudaGetLastError());
      // The push: GPU d's sum into the peer's half d, after GPU d's own pull
      // of that half (the same stream, or ordered by the event). The peer
      // reads its half d nowhere else.
      CK(cudaMemcpyPeerAsync(peer.grad + off + lo, peer.dev, g.grad + off + lo, g.dev,
                             len * sizeof(float), add_stream));
    }
  }
}

// Buckets [b0, b1) of local_copy, local_add or peer_copy (see the top).
void move_bytes(std::vector<Gpu>& gs, const Plan& p, int b0, int b1, const std::string& kind) {
  for (int b = b0; b < b1; ++b) {
    const size_t off = size_t(b) * p.bucket, n = std::min(p.bucket, p.elems - off);
    for (int d = 0; d < 2; ++d) {
      Gpu& g = gs[d];
      CK(cudaSetDevice(g.dev));
      if (kind == "local_copy") {
        CK(cudaMemcpyAsync(g.scratch + off, g.grad + off, n * sizeof(float),
                           cudaMemcpyDeviceToDevice, g.comm));
      } else if (kind == "local_add") {
        add_into<<<16, 512, 0, g.comm>>>(reinterpret_cast<float4*>(g.scratch + off),
                                         reinterpret_cast<const float4*>(g.grad + off), n / 4);
        CK(cudaGetLastError());
      } else {
        CK(cudaMemcpyPeerAsync(g.scratch + off, g.dev, gs[1 - d].grad + off, gs[1 - d].dev,
                               n * sizeof(float), g.comm));
      }
    }
  }
}

double ms_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 400, bucket_mib = 25;
  int gemms = 14, repeats = 7;
  bool progressive = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // A whole decimal integer in [1, 1 << 20], or exit 2 naming the option and the text.
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "accrue_bench_ce_overlap: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      const char* text = argv[++i];
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(text, &end, 10);
      if (errno != 0 || end == text || *end != '\0' || v < 1 || v > (1L << 20)) {
        std::fprintf(stderr,
                     "accrue_bench_ce_overlap: %s expects an integer in [1, %ld], got '%s'\n",
                     a.c_str(), 1L << 20, text);
        std::exit(2);
      }
      return v;
    };
    if (a == "--mib")
      mib = next();
    else if (a == "--bucket-mib")
      bucket_mib = next();
    else if (a == "--gemms")
      gemms = int(next());
    else if (a == "--repeats")
      repeats = int(next());
    else if (a == "--progressive")
      progressive = true;
    else {
      std::printf(
          "usage: accrue_bench_ce_overlap [--mib M] [--bucket-mib B] [--gemms N] "
          "[--repeats R] [--progressive]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (gemms < 2) {
    std::fprintf(stderr, "accrue_bench_ce_overlap: --gemms must be >= 2, got %d\n", gemms);
    return 2;
  }
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("accrue_bench_ce_overlap: needs 2 GPUs, found %d\n", count);
    return 0;
  }
  Plan plan;
  plan.elems = mib * (size_t(1) << 20) / sizeof(float);
  plan.bucket = bucket_mib * (size_t(1) << 20) / sizeof(float);
  const int buckets = bucket_count(plan);

  std::vector<Gpu> gs(2);
  int devs[2] = {0, 1};
  ncclComm_t comms[2];
  CKN(ncclCommInitAll(comms, 2, devs));
  for (int d = 0; d < 2; ++d) {
    Gpu& g = gs[d];
    g.dev = d;
    g.nccl = comms[d];
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithFlags(&g.compute, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&g.comm, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&g.comm2, cudaStreamNonBlocking, hi));
    g.pulled.resize(size_t(buckets));
    for (cudaEvent_t& e : g.pulled)
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CKB(cublasCreate(&g.blas));
    CKB(cublasSetStream(g.blas, g.compute));
    CK(cudaMalloc(&g.a, size_t(kM) * kN * 2));
    CK(cudaMalloc(&g.b, size_t(kN) * kK * 2));
    CK(cudaMalloc(&g.out16, size_t(kM) * kK * 2));
    CK(cudaMalloc(&g.slot, size_t(kM) * kN * 4));
    CK(cudaMalloc(&g.grad, plan.elems * 4));
    CK(cudaMalloc(&g.init, plan.elems * 4));
    CK(cudaMalloc(&g.scratch, plan.elems * 4));
    CKN(ncclMemAlloc(reinterpret_cast<void**>(&g.sym), plan.elems * 4));
    fill_bf16<<<1024, 256>>>(g.a, size_t(kM) * kN, 1 + d);
    fill_bf16<<<1024, 256>>>(g.b, size_t(kN) * kK, 3 + d);
    fill<<<1024, 256>>>(g.slot, size_t(kM) * kN, 5 + d);
    fill<<<1024, 256>>>(g.init, plan.elems, 7 + d);
    CK(cudaDeviceSynchronize());
  }
  // Window registration is collective: both communicators in one group.
  CKN(ncclGroupStart());
  for (Gpu& g : gs) {
    CK(cudaSetDevice(g.dev));
    CKN(ncclCommWindowRegister(g.nccl, g.sym, plan.elems * 4, &g.window, NCCL_WIN_COLL_SYMMETRIC));
  }
  CKN(ncclGroupEnd());
  // nccl_sym runs nccl on the window's buffer in grad's place.
  auto swap_sym = [&] {
    for (Gpu& g : gs)
      std::swap(g.grad, g.sym);
  };

  // One measurement: restore the gradients, line both GPUs' streams up, run
  // what `mode` says, return {chain ms, comm ms, makespan ms} (max over GPUs).
  struct Times {
    double chain = 0, comm = 0, span = 0;
  };
  auto measure = [&](bool chain, const char* comm) -> Times {
    std::vector<cudaEvent_t> t0(2), tc(2), tm(2);
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpyAsync(gs[d].grad, gs[d].init, plan.elems * 4, cudaMemcpyDeviceToDevice,
                         gs[d].compute));
      CK(cudaEventCreate(&t0[d]));
      CK(cudaEventCreate(&tc[d]));
      CK(cudaEventCreate(&tm[d]));
    }
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaDeviceSynchronize());
    }
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(t0[d], gs[d].compute));
      CK(cudaStreamWaitEvent(gs[d].comm, t0[d], 0));
    }
    // The chain in `stages` parts (pairs of GEMMs under --progressive), each
    // followed by the buckets it releases: an equal share, in order.
    const int stages = progressive ? gemms / 2 : 1;
    for (int st = 0; st < stages; ++st) {
      const int g0 = gemms * st / stages, g1 = gemms * (st + 1) / stages;
      const int b0 = buckets * st / stages, b1 = buckets * (st + 1) / stages;
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        if (chain) gemm_chain(gs[d], g0, g1);
        cudaEvent_t released;
        CK(cudaEventCreateWithFlags(&released, cudaEventDisableTiming));
        CK(cudaEventRecord(released, gs[d].compute));
        if (progressive) CK(cudaStreamWaitEvent(gs[d].comm, released, 0));
        CK(cudaEventDestroy(released));  // legal: destroyed once it completes
      }
      if (std::strcmp(comm, "nccl") == 0 || std::strcmp(comm, "nccl_sym") == 0)
        allreduce_nccl(gs, plan, b0, b1);
      if (std::strcmp(comm, "ce") == 0) allreduce_ce(gs, plan, b0, b1, false);
      if (std::strcmp(comm, "ce2") == 0) allreduce_ce(gs, plan, b0, b1, true);
      if (std::strcmp(comm, "local_copy") == 0 || std::strcmp(comm, "local_add") == 0 ||
          std::strcmp(comm, "peer_copy") == 0)
        move_bytes(gs, plan, b0, b1, comm);
    }
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(tc[d], gs[d].compute));
      cudaEvent_t joined;  // the comm's end: both of its streams
      CK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
      CK(cudaEventRecord(joined, gs[d].comm2));
      CK(cudaStreamWaitEvent(gs[d].comm, joined, 0));
      CK(cudaEventDestroy(joined));
      CK(cudaEventRecord(tm[d], gs[d].comm));
    }
    Times t;
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaDeviceSynchronize());
      const double c = ms_between(t0[d], tc[d]), m = ms_between(t0[d], tm[d]);
      t.chain = std::max(t.chain, c);
      t.comm = std::max(t.comm, m);
      t.span = std::max(t.span, std::max(c, m));
      CK(cudaEventDestroy(t0[d]));
      CK(cudaEventDestroy(tc[d]));
      CK(cudaEventDestroy(tm[d]));
    }
    return t;
  };
  auto run = [&](bool chain, const char* comm) {
    const bool sym = std::strcmp(comm, "nccl_sym") == 0;
    if (sym) swap_sym();
    std::vector<double> c, m, s;
    measure(chain, comm);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      const Times t = measure(chain, comm);
      c.push_back(t.chain);
      m.push_back(t.comm);
      s.push_back(t.span);
    }
    if (sym) swap_sym();
    return Times{median(c), median(m), median(s)};
  };

  // Correctness: ce's sums against nccl's, bit for bit.
  std::vector<float> ref(plan.elems), got(plan.elems);
  measure(false, "nccl");
  CK(cudaSetDevice(1));
  CK(cudaMemcpy(ref.data(), gs[1].grad, plan.elems * 4, cudaMemcpyDeviceToHost));
  size_t mismatches = 0;
  for (const char* comm : {"ce", "ce2", "nccl_sym"}) {
    const bool sym = std::strcmp(comm, "nccl_sym") == 0;
    if (sym) swap_sym();
    measure(false, comm);
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpy(got.data(), gs[d].grad, plan.elems * 4, cudaMemcpyDeviceToHost));
      mismatches += size_t(std::memcmp(got.data(), ref.data(), plan.elems * 4) != 0);
    }
    if (sym) swap_sym();
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s x 2, %zu MiB fp32 in %d buckets of %zu MiB, %d GEMMs %dx%dx%d, medians of %d%s\n",
              prop.name, mib, buckets, bucket_mib, gemms, kM, kN, kK, repeats,
              progressive ? ", buckets released along the chain" : "");
  std::printf("ce, ce2 and nccl_sym sums equal nccl's bit for bit: %s\n",
              mismatches == 0 ? "yes" : "NO");
  const Times chain = run(true, "none");
  std::printf("%-22s chain %.3f ms\n", "GEMMs alone", chain.chain);
  for (const char* comm :
       {"nccl", "nccl_sym", "ce", "ce2", "local_copy", "local_add", "peer_copy"}) {
    const Times alone = run(false, comm);
    const double busbw = double(plan.elems) * 4 / (alone.comm * 1e-3) / 1e9;  // 2 ranks: bus = alg
    const Times both = run(true, comm);
    std::printf(
        "%-10s alone %.3f ms (%.0f GB/s bus) | with GEMMs: chain %.3f ms (+%.1f%%), comm "
        "ends %.3f ms, makespan %.3f ms (GEMMs alone + %.3f)\n",
        comm, alone.comm, busbw, both.chain, 100 * (both.chain / chain.chain - 1), both.comm,
        both.span, both.span - chain.chain);
  }
  for (Gpu& g : gs) {
    CK(cudaSetDevice(g.dev));
    CKN(ncclCommWindowDeregister(g.nccl, g.window));
    CKN(ncclMemFree(g.sym));
  }
  return mismatches == 0 ? 0 : 1;
}
