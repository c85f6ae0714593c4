// Persistent thread pool shared by every engine of the process: one thread per core
// (ZOI_NUM_THREADS overrides), workers pinned with pthread_setaffinity_np, the calling
// thread takes part as thread 0. Jobs and barriers spin first, then sleep on a futex.
// Nothing here allocates after construction.
#pragma once
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace zoi {

class ThreadPool {
 public:
  using Fn = void (*)(void* ctx, int tid, int nt);

  static ThreadPool& instance();  // created on first use
  explicit ThreadPool(int nthreads);
  ~ThreadPool();

  int size() const { return n_; }
  // Runs fn(ctx, tid, nt) on threads 0..nt-1 (nt <= size(); the caller is thread 0) and
  // returns when all are done. Concurrent callers are serialised.
  void run(Fn fn, void* ctx, int nt);
  // Barrier among the nt threads of the running job; call from inside fn only.
  void barrier();
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  void worker(int tid);

  int n_;
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;
  std::mutex run_mutex_;
  alignas(64) std::atomic<int> job_gen_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> bar_count_{0};
  alignas(64) std::atomic<int> bar_phase_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int job_nt_ = 1;
  bool stop_ = false;
};

}  // namespace zoi
