// What one dependency between two CTAs costs on Hopper, four ways (lab: the persistent
// kernel's next design step; docs/MEGAKERNEL.md "What would change the picture").
//
//   l2 flag      two blocks (other SMs) take turns through a counter in global memory:
//                thread 0 polls with ld.acquire.gpu, the other answers with st.release.gpu
//                (the megakernel's counters today)
//   l2 tile      the same, and each turn first writes a 16 x 64 fp16 tile (2 KB) to global
//                memory that the other block then reads through L2 (a GEMM tile's output
//                reaching its consumer)
//   dsmem flag   a cluster of two CTAs: each polls a flag in its own shared memory
//                (ld.acquire.cluster), the other sets it through distributed shared memory
//                (st.release.cluster on the peer's address)
//   dsmem tile   the same, and each turn first writes the 2 KB tile straight into the
//                peer's shared memory (the producer pushing its output into the consumer)
//   cluster.sync a cluster of two: barrier.cluster arrive (release) / wait (acquire)
//
// Each figure is ns per hop (one direction), from %globaltimer over `iters` round trips,
// printed as one JSON line per case. Build and run on the GPU (scripts/gpu_check.sh
// clusterhop): nvcc -O3 -std=c++17 -arch=sm_90a -o cluster_hop lab/gpu/cluster_hop.cu
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

constexpr int THREADS = 128;
constexpr int TILE_HALVES = 16 * 64;  // 2 KB

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* a) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* a, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}
// generic addresses: the own CTA's shared memory, or a peer's through map_shared_rank
__device__ __forceinline__ unsigned ld_acquire_cluster(const unsigned* a) {
  unsigned v;
  asm volatile("ld.acquire.cluster.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_cluster(unsigned* a, unsigned v) {
  asm volatile("st.release.cluster.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

struct Out {
  unsigned long long ns;  // block / rank 0's loop time
  unsigned sm[2];
  float check;  // the tiles' sum (keeps the reads)
};

// ---- through L2 (two blocks of an ordinary grid)
template <bool TILE>
__global__ void l2_pingpong(unsigned* flag, half* tiles, int iters, Out* out) {
  const int b = blockIdx.x;
  half* mine = tiles + b * TILE_HALVES;
  const half* theirs = tiles + (1 - b) * TILE_HALVES;
  float acc = 0.f;
  __syncthreads();
  const unsigned long long t0 = gtime();
  for (int i = 0; i < iters; i++) {
    // my turn when the flag says 2 i + b
    if (threadIdx.x == 0)
      while (ld_acquire_gpu(flag) < 2u * i + b) {
      }
    __syncthreads();
    if (TILE) {  // read what the other wrote last turn, write mine
      for (int k = threadIdx.x; k < TILE_HALVES / 8; k += THREADS) {
        const uint4 v = __ldcg((const uint4*)theirs + k);
        acc += __half2float(((const half*)&v)[0]);
        uint4 w = v;
        ((half*)&w)[1] = __float2half((float)i);
        ((uint4*)mine)[k] = w;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) st_release_gpu(flag, 2u * i + b + 1);
  }
  const unsigned long long t1 = gtime();
  if (threadIdx.x == 0) {
    if (b == 0) out->ns = t1 - t0;
    out->sm[b] = smid();
  }
  if (threadIdx.x == 0 && b == 0) out->check = acc;
}

// ---- through distributed shared memory (a cluster of two CTAs)
template <bool TILE>
__global__ void __cluster_dims__(2, 1, 1) dsmem_pingpong(int iters, Out* out) {
  __shared__ unsigned flag;
  __shared__ __align__(16) half tile[TILE_HALVES];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned r = cluster.block_rank();
  if (threadIdx.x == 0) flag = 0;
  for (int k = threadIdx.x; k < TILE_HALVES; k += THREADS) tile[k] = __float2half(0.f);
  cluster.sync();  // both CTAs' shared memory is initialised before anyone writes into it
  unsigned* peer_flag = cluster.map_shared_rank(&flag, 1 - r);
  half* peer_tile = cluster.map_shared_rank(tile, 1 - r);
  float acc = 0.f;
  const unsigned long long t0 = gtime();
  for (int i = 0; i < iters; i++) {
    // my turn: rank 0 at i (its flag counts the peer's answers), rank 1 after rank 0's turn i
    const unsigned want = r == 0 ? (unsigned)i : (unsigned)i + 1;
    if (threadIdx.x == 0)
      while (ld_acquire_cluster(&flag) < want) {
      }
    __syncthreads();
    if (TILE) {  // read the tile the peer pushed into me, push mine into the peer
      for (int k = threadIdx.x; k < TILE_HALVES / 8; k += THREADS) {
        uint4 v = ((const uint4*)tile)[k];
        acc += __half2float(((const half*)&v)[0]);
        ((half*)&v)[1] = __float2half((float)i);
        ((uint4*)peer_tile)[k] = v;
      }
    }
    __syncthreads();  // every thread's pushes precede the release (cumulativity via bar.sync)
    if (threadIdx.x == 0) st_release_cluster(peer_flag, (unsigned)i + 1);
  }
  const unsigned long long t1 = gtime();
  if (threadIdx.x == 0) {
    if (r == 0) out->ns = t1 - t0;
    out->sm[r] = smid();
    if (r == 0) out->check = acc;
  }
  cluster.sync();  // no CTA leaves while its peer may still write into it
}

__global__ void __cluster_dims__(2, 1, 1) cluster_barrier(int iters, Out* out) {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const unsigned long long t0 = gtime();
  for (int i = 0; i < iters; i++) cluster.sync();
  const unsigned long long t1 = gtime();
  if (threadIdx.x == 0) {
    if (cluster.block_rank() == 0) out->ns = t1 - t0;
    out->sm[cluster.block_rank()] = smid();
  }
}

static int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    printf("{\"case\": \"%s\", \"error\": \"%s\"}\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 2000;
  cudaDeviceProp prop;
  if (check(cudaGetDeviceProperties(&prop, 0), "device")) return 1;
  printf("{\"gpu\": \"%s\", \"sms\": %d, \"iters\": %d}\n", prop.name, prop.multiProcessorCount,
         iters);
  unsigned* flag;
  half* tiles;
  Out* out;
  if (check(cudaMalloc(&flag, 4), "malloc") || check(cudaMalloc(&tiles, 4 * TILE_HALVES * 2), "malloc") ||
      check(cudaMallocManaged(&out, sizeof(Out)), "malloc"))
    return 1;
  cudaMemset(tiles, 0, 4 * TILE_HALVES * 2);
  struct Case {
    const char* name;
    int hops_per_iter;
    int kind;
  } cases[] = {{"l2 flag", 2, 0}, {"l2 tile", 2, 1}, {"dsmem flag", 2, 2},
               {"dsmem tile", 2, 3}, {"cluster.sync", 1, 4}};
  int rc = 0;
  for (const Case& c : cases) {
    for (int rep = 0; rep < 3; rep++) {  // the first run warms up; all three are printed
      cudaMemset(flag, 0, 4);
      *out = Out{};
      cudaDeviceSynchronize();
      switch (c.kind) {
        case 0: l2_pingpong<false><<<2, THREADS>>>(flag, tiles, iters, out); break;
        case 1: l2_pingpong<true><<<2, THREADS>>>(flag, tiles, iters, out); break;
        case 2: dsmem_pingpong<false><<<2, THREADS>>>(iters, out); break;
        case 3: dsmem_pingpong<true><<<2, THREADS>>>(iters, out); break;
        default: cluster_barrier<<<2, THREADS>>>(iters, out); break;
      }
      if (check(cudaGetLastError(), c.name) || check(cudaDeviceSynchronize(), c.name)) {
        rc = 1;
        break;
      }
      const double per = (double)out->ns / ((double)iters * c.hops_per_iter);
      printf("{\"case\": \"%s\", \"rep\": %d, \"ns_per_hop\": %.1f, \"sms\": [%u, %u], \"check\": %.1f}\n",
             c.name, rep, per, out->sm[0], out->sm[1], out->check);
    }
  }
  return rc;
}
