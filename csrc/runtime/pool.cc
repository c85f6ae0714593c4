#include "pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

namespace zoi {
namespace {

void futex_wait(std::atomic<int>* addr, int expected) {
  syscall(SYS_futex, reinterpret_cast<int*>(addr), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<int>* addr) {
  syscall(SYS_futex, reinterpret_cast<int*>(addr), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Spin (with pause) up to kSpin rounds while *addr == v, then sleep on the futex.
constexpr int kSpin = 20000;  // ~ 100-200 us of spinning before sleeping

void wait_while_equal(std::atomic<int>* addr, int v, std::atomic<int>* sleepers) {
  for (int i = 0; i < kSpin; ++i) {
    if (addr->load(std::memory_order_acquire) != v) return;
    _mm_pause();
  }
  while (addr->load(std::memory_order_acquire) == v) {
    sleepers->fetch_add(1, std::memory_order_seq_cst);
    if (addr->load(std::memory_order_seq_cst) == v) futex_wait(addr, v);
    sleepers->fetch_sub(1, std::memory_order_seq_cst);
  }
}

void wake(std::atomic<int>* addr, std::atomic<int>* sleepers) {
  if (sleepers->load(std::memory_order_seq_cst) > 0) futex_wake_all(addr);
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

}  // namespace

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool([] {
    const char* env = std::getenv("ZOI_NUM_THREADS");
    int n = env && *env ? std::atoi(env) : 0;
    if (n <= 0) n = static_cast<int>(allowed_cpus().size());
    return n;
  }());
  return pool;
}

ThreadPool::ThreadPool(int nthreads) : n_(nthreads < 1 ? 1 : nthreads) {
  cpus_ = allowed_cpus();
  for (int t = 1; t < n_; ++t) threads_.emplace_back([this, t] { worker(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> g(run_mutex_);
    stop_ = true;
    job_gen_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&job_gen_);
  }
  for (auto& th : threads_) th.join();
}

void ThreadPool::worker(int tid) {
  if (!cpus_.empty()) {  // pin worker t to the t-th allowed CPU (the caller, thread 0, is not pinned)
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus_[tid % cpus_.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  int seen = 0;
  for (;;) {
    wait_while_equal(&job_gen_, seen, &sleepers_);
    seen = job_gen_.load(std::memory_order_acquire);
    if (stop_) return;
    // every worker acknowledges every job (so none can lag into the next one); only
    // threads below the job's width run it
    if (tid < job_nt_) fn_(ctx_, tid, job_nt_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) wake(&pending_, &sleepers_);
  }
}

void ThreadPool::run(Fn fn, void* ctx, int nt) {
  if (nt > n_) nt = n_;
  if (nt < 1) nt = 1;
  std::lock_guard<std::mutex> g(run_mutex_);
  if (nt == 1) {
    job_nt_ = 1;
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  job_nt_ = nt;
  bar_count_.store(0, std::memory_order_relaxed);
  pending_.store(n_ - 1, std::memory_order_relaxed);
  job_gen_.fetch_add(1, std::memory_order_seq_cst);
  wake(&job_gen_, &sleepers_);
  fn(ctx, 0, nt);
  for (;;) {
    int p = pending_.load(std::memory_order_acquire);
    if (p == 0) break;
    wait_while_equal(&pending_, p, &sleepers_);
  }
}

void ThreadPool::barrier() {
  const int nt = job_nt_;
  if (nt <= 1) return;
  const int ph = bar_phase_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    bar_count_.store(0, std::memory_order_relaxed);
    bar_phase_.fetch_add(1, std::memory_order_seq_cst);
    wake(&bar_phase_, &sleepers_);
  } else {
    wait_while_equal(&bar_phase_, ph, &sleepers_);
  }
}

}  // namespace zoi
