#include "pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
// Linux: futex sleeps and CPU affinity. Other systems (macOS) or ZOI_POOL_PORTABLE (to test that
// path on Linux): sleeps poll every 50 us and no thread is pinned.
#if defined(__linux__) && !defined(ZOI_POOL_PORTABLE)
#define ZOI_POOL_LINUX 1
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#endif
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <stdexcept>
#include <string>

namespace zoi {
namespace {

std::atomic<int> g_sleepers{0};  // threads asleep in futex_wait_while (any address)

// the spin-wait hint: pause on x86, yield on aarch64 (frees the pipeline for an SMT sibling)
inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(ZOI_POOL_LINUX)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
#else
  for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) cpus.push_back(static_cast<int>(c));
#endif
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

constexpr int kIdleSpin = 20000;  // ~0.5 ms of pause between jobs before sleeping
constexpr int kJoinSpin = 20000;

}  // namespace

void futex_wait_while(std::atomic<int>* addr, int v, int spin) {
  for (int i = 0; i < spin; ++i) {
    if (addr->load(std::memory_order_acquire) != v) return;
    cpu_relax();
  }
  while (addr->load(std::memory_order_acquire) == v) {
#if defined(ZOI_POOL_LINUX)
    g_sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (addr->load(std::memory_order_seq_cst) == v)
      syscall(SYS_futex, reinterpret_cast<int*>(addr), FUTEX_WAIT_PRIVATE, v, nullptr, nullptr, 0);
    g_sleepers.fetch_sub(1, std::memory_order_seq_cst);
#else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
  }
}

void futex_wake_all(std::atomic<int>* addr) {
#if defined(ZOI_POOL_LINUX)
  if (g_sleepers.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, reinterpret_cast<int*>(addr), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)addr;  // the sleepers poll
#endif
}

namespace {
// the settings the pool starts with (configure), and the pool once started
std::mutex g_pool_mutex;
int g_pool_threads = 0;
bool g_pool_pin = true;
std::atomic<ThreadPool*> g_pool{nullptr};
}  // namespace

ThreadPool& ThreadPool::instance() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> g(g_pool_mutex);
  p = g_pool.load(std::memory_order_relaxed);
  if (!p) {
    // Never destroyed: at process exit a daemon thread may still hold run_mutex_ (or be inside a
    // job), and joining the workers then could hang the exit; exit() ends them instead.
    p = new ThreadPool(g_pool_threads > 0 ? g_pool_threads : static_cast<int>(allowed_cpus().size()), g_pool_pin);
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

void ThreadPool::configure(int nthreads, bool pin) {
  if (nthreads < 0)
    throw std::invalid_argument("num_threads must be >= 0 (0: one per CPU), got " + std::to_string(nthreads));
  std::lock_guard<std::mutex> g(g_pool_mutex);
  g_pool_threads = nthreads;
  g_pool_pin = pin;
  if (ThreadPool* p = g_pool.load(std::memory_order_acquire)) p->restart(nthreads, pin);
}

ThreadPool::ThreadPool(int nthreads, bool pin) : n_(nthreads < 1 ? 1 : nthreads), pin_(pin) {
  cpus_ = allowed_cpus();
  start_workers();
}

ThreadPool::~ThreadPool() {
  std::lock_guard<std::mutex> g(run_mutex_);
  stop_workers();
}

void ThreadPool::start_workers() {
  const int n = n_.load(std::memory_order_relaxed);
  const int seen = job_gen_.load(std::memory_order_acquire);
  for (int t = 1; t < n; ++t) {
    threads_.emplace_back([this, t, seen] { worker(t, seen); });
    if (!pin_) continue;  // CpuOptions.pin false: leave placement to the OS
#if defined(ZOI_POOL_LINUX)
    // pin worker t to the t-th allowed CPU, from here so that it holds when the constructor
    // returns (the caller, thread 0, is not pinned)
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus_[t % cpus_.size()], &set);
    pthread_setaffinity_np(threads_.back().native_handle(), sizeof(set), &set);
#endif
  }
}

void ThreadPool::stop_workers() {
  // run_mutex_ is held: no job runs, every worker waits for the next one
  stop_ = true;
  job_gen_.fetch_add(1, std::memory_order_seq_cst);
  g_sleepers.fetch_add(1);  // force the wake
  futex_wake_all(&job_gen_);
  g_sleepers.fetch_sub(1);
  for (auto& th : threads_) th.join();
  threads_.clear();
  stop_ = false;
}

void ThreadPool::restart(int nthreads, bool pin) {
  int n = nthreads > 0 ? nthreads : static_cast<int>(cpus_.size());
  if (n < 1) n = 1;
  std::lock_guard<std::mutex> g(run_mutex_);
  if (n == n_.load(std::memory_order_relaxed) && pin == pin_) return;
  stop_workers();
  n_.store(n, std::memory_order_relaxed);
  pin_ = pin;
  start_workers();
}

void ThreadPool::worker(int tid, int seen) {
  for (;;) {
    futex_wait_while(&job_gen_, seen, kIdleSpin);
    seen = job_gen_.load(std::memory_order_acquire);
    if (stop_) return;
    // join the job unless it is already closed (the caller finished without us)
    uint32_t s = active_.load(std::memory_order_acquire);
    bool joined = false;
    while (!(s & kClosed)) {
      if (active_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    // counted once, at the join (run_all waits for n - 1 joins): counting finished workers as
    // well as running ones, read apart, could count a worker twice and start the caller's share
    // before a late worker joined, whose share was then skipped (a closed job) and a barrier hung
    joined_total_.fetch_add(1, std::memory_order_acq_rel);
    // the job's parameters are stable while we are counted in active_
    if (job_gen_.load(std::memory_order_acquire) == seen && tid < job_nt_) fn_(ctx_, tid, job_nt_);
    active_.fetch_sub(1, std::memory_order_acq_rel);
    left_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&left_);
  }
}

void ThreadPool::launch(Fn fn, void* ctx, int nt, bool all) {
  if (nt > size()) nt = size();
  if (nt < 1) nt = 1;
  // a one-thread job runs on the caller alone and touches no pool state: no lock, so that
  // engines of one thread each (zoi serve --replicas N) run concurrently, one per caller
  if (nt == 1 && !all) {
    fn(ctx, 0, 1);
    return;
  }
  std::lock_guard<std::mutex> g(run_mutex_);
  const int n = size();  // stable under run_mutex_ (restart holds it)
  if (nt > n) nt = n;
  if (nt == 1) {
    job_nt_ = 1;
    fn(ctx, 0, 1);
    return;
  }
  // the caller is thread 0: for the job, pin it to the CPU no worker uses (else the OS may
  // run it on a worker's CPU, and the two share one core); its own mask comes back after
#if defined(ZOI_POOL_LINUX)
  cpu_set_t saved;
  bool repin = false;
  if (pin_ && pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0 && CPU_ISSET(cpus_[0], &saved) &&
      CPU_COUNT(&saved) > 1) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus_[0], &one);
    repin = pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
  }
#endif
  fn_ = fn;
  ctx_ = ctx;
  job_nt_ = nt;
  bar_count_.store(0, std::memory_order_relaxed);
  joined_total_.store(0, std::memory_order_relaxed);
  active_.store(0, std::memory_order_release);  // open
  job_gen_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&job_gen_);
  if (all) {  // static partitions: wait until every worker has joined (they all will)
    for (;;) {
      if (joined_total_.load(std::memory_order_acquire) >= n - 1) break;
      cpu_relax();
    }
  }
  fn(ctx, 0, nt);
  // close the job: no late joiner; then wait for the joined ones to leave
  uint32_t s = active_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
  while ((s & ~kClosed) != 0) {
    const int l = left_.load(std::memory_order_acquire);
    s = active_.load(std::memory_order_acquire);
    if ((s & ~kClosed) == 0) break;
    futex_wait_while(&left_, l, kJoinSpin);
    s = active_.load(std::memory_order_acquire);
  }
#if defined(ZOI_POOL_LINUX)
  if (repin) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
#endif
}

void ThreadPool::run(Fn fn, void* ctx, int nt) { launch(fn, ctx, nt, false); }
void ThreadPool::run_all(Fn fn, void* ctx, int nt) { launch(fn, ctx, nt, true); }

void ThreadPool::barrier() {
  const int nt = job_nt_;
  if (nt <= 1) return;
  const int ph = bar_phase_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    bar_count_.store(0, std::memory_order_relaxed);
    bar_phase_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&bar_phase_);
  } else {
    futex_wait_while(&bar_phase_, ph, kJoinSpin);
  }
}

}  // namespace zoi
