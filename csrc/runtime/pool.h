// Persistent thread pool shared by every engine of the process: one thread per core
// (CpuOptions.num_threads overrides, through configure()), workers pinned with
// pthread_setaffinity_np (CpuOptions.pin), the calling thread takes part as thread 0.
// Waits spin first, then sleep on a futex.
//
// A job is joined, not assigned: a worker that wakes up late (descheduled by other load)
// and finds the job closed skips it, so the caller never waits for a thread that has not
// started. Work inside a job is shared dynamically by the caller of run() (see Engine).
// Nothing here allocates after construction.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace zoi {

// spin (pause) up to `spin` rounds while *addr == v, then sleep on the futex until it changes
void futex_wait_while(std::atomic<int>* addr, int v, int spin);
void futex_wake_all(std::atomic<int>* addr);

class ThreadPool {
 public:
  using Fn = void (*)(void* ctx, int tid, int nt);

  static ThreadPool& instance();  // created on first use, with the configure()d settings
  // The process pool's settings (zoi.backends.cpu.options, set before an engine is built):
  // nthreads 0 = one per CPU of the affinity mask; pin false leaves placement to the OS. A pool
  // already running with other settings restarts its workers with these, once its current job
  // is done (engines built before keep their thread counts, capped at the new size).
  // nthreads < 0 throws std::invalid_argument.
  static void configure(int nthreads, bool pin);
  explicit ThreadPool(int nthreads, bool pin = true);
  ~ThreadPool();

  int size() const { return n_.load(std::memory_order_relaxed); }
  bool pinned() const { return pin_; }
  // Runs fn(ctx, tid, nt) on the caller (tid 0) and on every worker tid < nt that joins in
  // time; returns when the caller's call and every joined worker's call are done.
  // Concurrent callers are serialised.
  void run(Fn fn, void* ctx, int nt);
  // Static barrier among all nt threads of the job (kernel lab only: every worker must join,
  // so run_all() must be used). Call from inside fn.
  void barrier();
  // Like run(), but waits until every worker tid < nt has joined (static partitions).
  void run_all(Fn fn, void* ctx, int nt);
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  void worker(int tid, int seen);
  void launch(Fn fn, void* ctx, int nt, bool all);
  void start_workers();  // threads 1..n_-1, pinned when pin_
  void stop_workers();   // under run_mutex_: wakes, ends and joins them
  void restart(int nthreads, bool pin);

  static constexpr uint32_t kClosed = 1u << 30;
  std::atomic<int> n_;
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;
  std::mutex run_mutex_;
  alignas(64) std::atomic<int> job_gen_{0};
  alignas(64) std::atomic<uint32_t> active_{kClosed};  // joined workers still running | kClosed
  alignas(64) std::atomic<int> left_{0};                // bumped when a joined worker leaves
  alignas(64) std::atomic<int> joined_total_{0};
  alignas(64) std::atomic<int> bar_count_{0};
  alignas(64) std::atomic<int> bar_phase_{0};
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int job_nt_ = 1;
  bool stop_ = false;
  std::atomic<bool> pin_{true};
};

}  // namespace zoi
