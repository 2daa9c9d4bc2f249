// Differential harness: drives PyTorch's native CUDA caching allocator (libc10_cuda.so)
// over a fake CUDA runtime and prints its state in a version-independent text form.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/util/Exception.h>
#include <c10/cuda/PeerToPeerAccess.h>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

using namespace c10::cuda::CUDACachingAllocator;
namespace c10::cuda::_internal { C10_CUDA_API void setHasPrimaryContext(bool (*func)(c10::DeviceIndex)); }
static bool fakeHasPrimaryContext(c10::DeviceIndex) { return true; }
extern "C" void fake_set_events_pending(int);
extern "C" void fake_set_capturing(int);
extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t*, unsigned int, int);

static std::map<std::string, cudaStream_t> streams;
static std::map<std::string, c10::DataPtr> ptrs;
// The last address each id was given: `allocat ID BYTES @REF+OFF` asks for an address inside a block freed before.
static std::map<std::string, uintptr_t> addrs;
static const char* actname(int a) {
  static const char* n[] = {"alloc","free_requested","free_completed","segment_alloc","segment_free","segment_map","segment_unmap","snapshot","oom","annotate"};
  return (a >= 0 && a < 10) ? n[a] : "?";
}
static std::string sname(void* s) {
  for (auto& [k, v] : streams) if ((void*)v == s) return k;
  std::ostringstream o; o << s; return o.str();
}
static void print_stat_array(const char* name, const c10::CachingDeviceAllocator::StatArray& a) {
  const char* t[] = {"all", "small_pool", "large_pool"};
  for (int i = 0; i < 3; i++)
    printf("  %s.%s %ld %ld %ld %ld\n", name, t[i], (long)a[i].current, (long)a[i].peak, (long)a[i].allocated, (long)a[i].freed);
}
static void stats() {
  auto s = get()->getDeviceStats(0);
  printf("STATS\n");
  print_stat_array("allocation", s.allocation); print_stat_array("segment", s.segment);
  print_stat_array("active", s.active); print_stat_array("inactive_split", s.inactive_split);
  print_stat_array("allocated_bytes", s.allocated_bytes); print_stat_array("reserved_bytes", s.reserved_bytes);
  print_stat_array("active_bytes", s.active_bytes); print_stat_array("inactive_split_bytes", s.inactive_split_bytes);
  print_stat_array("requested_bytes", s.requested_bytes);
  printf("  oversize_allocations %ld %ld\n  oversize_segments %ld %ld\n", (long)s.oversize_allocations.current, (long)s.oversize_allocations.peak, (long)s.oversize_segments.current, (long)s.oversize_segments.peak);
  printf("  num_alloc_retries %ld num_ooms %ld num_sync_all_streams %ld num_device_alloc %ld num_device_free %ld max_split_size %ld\n",
    (long)s.num_alloc_retries, (long)s.num_ooms, (long)s.num_sync_all_streams, (long)s.num_device_alloc, (long)s.num_device_free, (long)s.max_split_size);
#if TV >= 212
  printf("  [v>=2.12] num_oom_rejections %ld\n", (long)s.num_oom_rejections);
#endif
#if TV >= 213
  for (auto& [id, arr] : s.reserved_bytes_by_private_pools) {
    char nm[64]; snprintf(nm, sizeof nm, "[v>=2.13] reserved_bytes_by_private_pools.%llu_%llu", (unsigned long long)id.first, (unsigned long long)id.second);
    print_stat_array(nm, arr);
  }
#endif
}
static void snap(bool traces) {
  auto si = get()->snapshot({0, 0}, traces);
  printf("SNAPSHOT %zu segments\n", si.segments.size());
  for (auto& seg : si.segments) {
    printf("  seg %lx total=%zu req=%zu alloc=%zu active=%zu stream=%s %s%s pool=(%llu,%llu) regctr=%d\n", (unsigned long)seg.address, seg.total_size, seg.requested_size, seg.allocated_size, seg.active_size,
      sname(seg.stream).c_str(), seg.is_large ? "large" : "small", seg.is_expandable ? " expandable" : "", (unsigned long long)seg.owner_private_pool_id.first, (unsigned long long)seg.owner_private_pool_id.second, seg.registration_counter);
    size_t off = 0;
    for (auto& b : seg.blocks) {
      printf("    blk +%zu size=%zu req=%zu %s%s gc=%d\n", off, b.size, b.requested_size, b.allocated ? "allocated" : (b.active ? "active_pending_free" : "inactive"), "", b.gc_counter);
      off += b.size;
    }
  }
  if (traces) {
    for (auto& dt : si.device_traces) {
      printf("TRACES %zu\n", dt.size());
      for (auto& te : dt) {
        printf("  %s addr=%lx size=%zu stream=%s pool=(%llu,%llu)", actname((int)te.action_), (unsigned long)te.addr_, te.size_, sname(te.stream_).c_str(), (unsigned long long)te.mempool_.first, (unsigned long long)te.mempool_.second);
        if (!te.user_metadata_.empty()) printf(" user_metadata=%s", te.user_metadata_.c_str());
#if TV >= 215
        if (!te.internal_metadata_.empty()) printf(" internal_metadata=%s", te.internal_metadata_.c_str());
#endif
        printf("\n");
      }
    }
  }
}
int main(int argc, char** argv) {
  c10::cuda::_internal::setHasPrimaryContext(&fakeHasPrimaryContext);
  c10::cuda::detail::init_p2p_access_cache(1);
  get()->init(1);
  streams["s0"] = nullptr;
  std::string line; int lineno = 0;
  while (std::getline(std::cin, line)) {
    lineno++;
    std::istringstream in(line); std::string cmd; in >> cmd;
    if (cmd.empty() || cmd[0] == '#') continue;
    try {
      if (cmd == "conf") { std::string s; std::getline(in, s); s.erase(0, s.find_first_not_of(' ')); c10::CachingAllocator::setAllocatorSettings(s); }
      else if (cmd == "fraction") { double f; in >> f; get()->setMemoryFraction(f, 0); }
      else if (cmd == "stream") { std::string n; in >> n; cudaStream_t s; cudaStreamCreateWithPriority(&s, 0, 0); streams[n] = s; }
      else if (cmd == "alloc") { std::string id, sn; size_t sz; in >> id >> sz >> sn; if (sn.empty()) sn = "s0";
        c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromExternal(streams.at(sn), 0));
        auto dp = get()->allocate(sz);
        c10::cuda::setCurrentCUDAStream(c10::cuda::getDefaultCUDAStream(0));
        printf("%d alloc %s %zu -> %lx\n", lineno, id.c_str(), sz, (unsigned long)dp.get());
        addrs[id] = (uintptr_t)dp.get(); ptrs[id] = std::move(dp); }
      else if (cmd == "free") { std::string id; in >> id; ptrs.erase(id); }
      else if (cmd == "record") { std::string id, sn; in >> id >> sn; if (!ptrs.count(id)) continue; get()->recordStream(ptrs.at(id), c10::cuda::getStreamFromExternal(streams.at(sn), 0)); }
      else if (cmd == "pending") { int v; in >> v; fake_set_events_pending(v); }
      else if (cmd == "empty") { get()->emptyCache(); }
      else if (cmd == "history") { size_t n = 1000000; in >> n; get()->recordHistory(true, nullptr, n, RecordContext::NEVER, false, {}); }
      else if (cmd == "snap") { snap(false); }
      else if (cmd == "snapt") { snap(true); }
      else if (cmd == "stats") { stats(); }
      else if (cmd == "resetpeak") { get()->resetPeakStats(0); }
      else if (cmd == "pool_create") { unsigned long long a, b; in >> a >> b; get()->createOrIncrefPool(0, {a, b}); }
      else if (cmd == "pool_begin") { unsigned long long a, b; in >> a >> b; get()->beginAllocateToPool(0, {a, b}, [](cudaStream_t) { return true; }); }
      else if (cmd == "pool_end") { unsigned long long a, b; in >> a >> b; get()->endAllocateToPool(0, {a, b}); }
      else if (cmd == "pool_release") { unsigned long long a, b; in >> a >> b; get()->releasePool(0, {a, b}); }
      else if (cmd == "pool_empty") { unsigned long long a, b; in >> a >> b; get()->emptyCache({a, b}); }
      else if (cmd == "capture_begin") {
#if TV >= 213
        get()->markCaptureBegin(0);
#endif
        fake_set_capturing(1); }
      else if (cmd == "capture_end") {
        fake_set_capturing(0);
#if TV >= 213
        get()->markCaptureEnd(0);
#endif
      }
      else if (cmd == "allocat") {
#if TV >= 213
        std::string id; size_t sz; std::string a; in >> id >> sz >> a; uintptr_t at;
        if (a[0] == '@') { auto plus = a.find('+'); at = addrs.at(a.substr(1, plus - 1)) + (plus == std::string::npos ? 0 : strtoull(a.c_str() + plus + 1, nullptr, 10)); }
        else at = strtoull(a.c_str(), nullptr, 16);
        void* addr = (void*)at;
        auto dp = get()->allocateWithAddress(sz, addr);
        printf("%d allocat %s %zu -> %lx\n", lineno, id.c_str(), sz, (unsigned long)dp.get());
        addrs[id] = (uintptr_t)dp.get(); ptrs[id] = std::move(dp);
#else
        printf("%d allocat unsupported\n", lineno);
#endif
      }
      else if (cmd == "annotate") {
#if TV >= 214
        std::string id, m; in >> id >> m; get()->annotateMemory(ptrs.at(id).get(), m);
#else
        printf("%d annotate unsupported\n", lineno);
#endif
      }
      else if (cmd == "meta") { std::string s; in >> s; get()->setUserMetadata(s); }
      else if (cmd == "echo") { std::string s; std::getline(in, s); printf("#%s\n", s.c_str()); }
      else { printf("%d unknown command %s\n", lineno, cmd.c_str()); }
    } catch (const c10::OutOfMemoryError& e) {
      std::string m = e.what_without_backtrace(); printf("%d OOM: %s\n", lineno, m.substr(0, m.find('\n')).c_str());
    } catch (const c10::Error& e) {
      std::string m = e.what_without_backtrace(); printf("%d ERROR: %s\n", lineno, m.substr(0, m.find('\n')).c_str());
    } catch (const std::exception& e) {
      printf("%d STDERROR: %s\n", lineno, e.what());
    }
    fflush(stdout);
  }
  return 0;
}
