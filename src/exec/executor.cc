#include "stoker/frontend/executor.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace stoker::detail {

ExecutorStats& ExecutorStats::operator+=(const ExecutorStats& o) {
  cpu += o.cpu;
  run_delay += o.run_delay;
  lock_held += o.lock_held;
  remote_units += o.remote_units;
  remote_bytes += o.remote_bytes;
  remote_wait += o.remote_wait;
  remote_read += o.remote_read;
  remote_idle += o.remote_idle;
  resident_bytes += o.resident_bytes;
  return *this;
}

void Executors::add(std::shared_ptr<ChunkExecutor> executor) {
  MutexLock lock(mu_);
  auto list = std::make_shared<List>(*list_);
  const auto kind = executor->kind();
  // After the last of its kind or an earlier one: offers go in Kind order, then added order.
  const auto at =
      std::find_if(list->begin(), list->end(), [kind](const auto& e) { return e->kind() > kind; });
  list->insert(at, std::move(executor));
  list_ = std::move(list);
}

std::vector<std::shared_ptr<ChunkExecutor>> Executors::remove(ChunkExecutor::Kind kind) {
  std::shared_ptr<const List> old;
  List gone;
  {
    MutexLock lock(mu_);
    auto list = std::make_shared<List>();
    for (const auto& e : *list_) (e->kind() == kind ? gone : *list).push_back(e);
    old = std::exchange(list_, std::move(list));
  }
  // Each offer holds the list it took (offer()): once only this copy of the old one is left,
  // none is inside a removed executor any more.
  while (old.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  MutexLock lock(mu_);
  for (const auto& e : gone) {
    ExecutorStats s = e->stats();
    s.resident_bytes = 0;  // not a sum: the removed processes' memory is not the loader's now
    removed_ += s;
  }
  return gone;
}

std::shared_ptr<const Executors::List> Executors::list() const {
  MutexLock lock(mu_);
  return list_;
}

bool Executors::offer(const ChunkJob& job) const {
  const auto executors = list();
  return std::any_of(executors->begin(), executors->end(),
                     [&job](const auto& e) { return e->offer(job); });
}

bool Executors::empty() const { return list()->empty(); }

std::size_t Executors::limit() const {
  std::size_t sum = 0;
  for (const auto& e : *list()) sum += e->limit();
  return sum;
}

ExecutorStats Executors::stats() const {
  ExecutorStats sum;
  {
    MutexLock lock(mu_);
    sum = removed_;
  }
  for (const auto& e : *list()) sum += e->stats();
  return sum;
}

void Executors::stop() noexcept {
  for (const auto& e : *list()) e->stop();
}

}  // namespace stoker::detail
