// Persistent spinning thread pool; see thread_pool.h for why it spins.
#include "cpu/thread_pool.h"

#include <algorithm>
#include <string>
#include <system_error>

#include "kcap/errors.h"

namespace kcap {

namespace {
// Spin iterations before a worker sleeps: long enough to bridge the gap between the
// parallel loops of one decode step, short enough not to burn a core while idle.
constexpr int kSpinIterations = 200000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    try {
        for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
    } catch (const std::system_error& e) {
        // A thread could not be created (a limit of the process or the system): the workers
        // already started are stopped and joined before the pool (their mutex and condition
        // variable) goes away, and the caller gets an error instead of a hang.
        const size_t started = workers_.size() + 1;
        stop_workers();
        throw Error("could not start CPU thread " + std::to_string(started + 1) + " of " + std::to_string(n_threads_) +
                    " (" + e.what() + "); ask for fewer threads");
    }
}

void ThreadPool::stop_workers() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::run_chunk(int index) {
    int64_t chunk = (job_size_ + n_threads_ - 1) / n_threads_;
    int64_t begin = std::min<int64_t>(job_size_, chunk * index);
    int64_t end = std::min<int64_t>(job_size_, begin + chunk);
    if (begin < end) (*job_)(begin, end);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n == 1) {
        fn(0, n);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &fn;
        job_size_ = n;
        pending_.store(n_threads_ - 1);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_chunk(0);
    while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    while (true) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) ++spins;
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_) return;
        run_chunk(index);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace kcap
