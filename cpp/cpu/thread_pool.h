// A small persistent thread pool for the CPU backend.
//
// A decode step issues a few hundred short parallel loops, so waking sleeping threads
// through a condition variable each time would cost more than the work. Workers spin on a
// generation counter for a short while after each job and only then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kcap {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end) over contiguous chunks covering [0, n), one chunk per thread
    // (the caller's thread takes the first). Returns when every chunk is done.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker(int index);
    void run_chunk(int index);
    void stop_workers();  // stops and joins every started worker

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_size_ = 0;
};

}  // namespace kcap
