//! \file cuda_emu.cpp
//! The CPU emulator of cuda_emu.hpp: fibers per CUDA thread, barriers and warp collectives,
//! guard pages, faults and kernel launches. ldmatrix / mma.sync: cuda_emu_mma.cpp; the CUDA
//! runtime API and the state the files share (errors, shared memory): cuda_emu_runtime.cpp (the
//! emulated device has sm_90 limits); the x86-64 context switch: cuda_emu_switch.cpp.
#include "cuda_emu.hpp"
#include "emu_state.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace gm_emu {
using namespace internal;

uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim{1, 1, 1};
dim3 g_grid_dim{1, 1, 1};

// The shared state of emu_state.hpp (errors, shared memory) is defined in cuda_emu_runtime.cpp.
namespace {

// ---- fibers --------------------------------------------------------------------------------------
constexpr std::size_t k_stack_bytes = 256 * 1024;

// Context switch. On x86-64 a hand-written one (callee-saved registers, MXCSR and the x87 control
// word; no signal mask, which is what makes swapcontext cost a system call per switch); elsewhere
// ucontext.
#if defined(__x86_64__) && !defined(GM_EMU_UCONTEXT)
#define GM_EMU_FAST_SWITCH 1
}  // namespace
}  // namespace gm_emu
extern "C" void gm_emu_switch(void** save_sp, void* new_sp);  // cuda_emu_switch.cpp
namespace gm_emu {
namespace {
#endif

struct fiber {
#if GM_EMU_FAST_SWITCH
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  region stack;
  uint3 tid{0, 0, 0};
  int warp = 0, lane = 0;
  enum state_t { ready, wait_block, wait_warp, done } state = ready;
  std::uint64_t wait_gen = 0;
  // cp.async: copies not yet written to shared memory, each tagged with its group (groups
  // [0, committed) are committed; a copy tagged `committed` belongs to the open group)
  struct async_copy {
    void* dst;
    unsigned char bytes[16];
    std::uint64_t group;
  };
  std::vector<async_copy> copies;
  std::uint64_t committed = 0;
};

//! Writes f's pending cp.async copies of groups < `upto` to shared memory, in issue order.
void retire_copies(fiber& f, std::uint64_t upto) {
  std::size_t keep = 0;
  for (std::size_t i = 0; i < f.copies.size(); ++i) {
    if (f.copies[i].group < upto) std::memcpy(f.copies[i].dst, f.copies[i].bytes, 16);
    else f.copies[keep++] = f.copies[i];
  }
  f.copies.resize(keep);
}

struct warp_state {
  int lanes = 32;     // lanes of this warp in the CTA (the last warp may be partial)
  int arrived = 0;
  int exited = 0;
  int kind = 0;
  unsigned mask = 0;
  std::uint64_t gen = 0;
  alignas(16) unsigned char slots[2][32][slot_bytes];
};

struct block_state {
  int threads = 0;
  int arrived = 0;
  int exited = 0;
  int kind = 0;
  std::uint64_t gen = 0;
  int count[2] = {0, 0};
};

#if GM_EMU_FAST_SWITCH
void* g_sched_sp = nullptr;
#else
ucontext_t g_sched;
#endif
std::vector<fiber> g_fibers;
std::vector<warp_state> g_warps;
block_state g_block;
fiber* g_cur = nullptr;
const std::function<void()>* g_body = nullptr;
bool g_block_faulted = false;

schedule g_schedule = schedule::forward;
std::mt19937_64 g_rng{0};


void fiber_entry() {
  try {
    (*g_body)();
  } catch (...) {
    g_fault = "exception escaped a kernel";
    g_block_faulted = true;
  }
  fiber* f = g_cur;
  retire_copies(*f, ~std::uint64_t(0));  // a thread's copies complete even after it exits
  f->state = fiber::done;
  warp_state& w = g_warps[static_cast<std::size_t>(f->warp)];
  ++w.exited;
  ++g_block.exited;
  if (!g_block_faulted && w.arrived > 0) {
    g_fault = "thread exited while lanes of its warp wait at a warp collective (divergent collective)";
    g_block_faulted = true;
  }
  if (!g_block_faulted && g_block.arrived > 0) {
    g_fault = "thread exited while other threads wait at __syncthreads (barrier in divergent code)";
    g_block_faulted = true;
  }
#if GM_EMU_FAST_SWITCH
  gm_emu_switch(&f->sp, g_sched_sp);
  std::abort();  // a finished fiber is never resumed
#else
  swapcontext(&f->ctx, &g_sched);
#endif
}

void yield_to_scheduler() {
#if GM_EMU_FAST_SWITCH
  gm_emu_switch(&g_cur->sp, g_sched_sp);
#else
  swapcontext(&g_cur->ctx, &g_sched);
#endif
}

void resume(fiber& f) {
#if GM_EMU_FAST_SWITCH
  gm_emu_switch(&g_sched_sp, f.sp);
#else
  swapcontext(&g_sched, &f.ctx);
#endif
}

//! Prepares `f` to start in fiber_entry on its own stack.
void prepare(fiber& f) {
#if GM_EMU_FAST_SWITCH
  // Frame popped by the first gm_emu_switch into the fiber: [mxcsr | fpu cw][r15 r14 r13 r12 rbx
  // rbp][return address = fiber_entry][dummy]; the return-address slot is 16-byte aligned, so
  // fiber_entry starts with rsp = 8 (mod 16), as after a call.
  auto top = reinterpret_cast<std::uintptr_t>(f.stack.user) + k_stack_bytes;
  top &= ~static_cast<std::uintptr_t>(15);
  auto* slot = reinterpret_cast<std::uint64_t*>(top) - 2;  // [0] = return address, [1] = dummy
  slot[0] = reinterpret_cast<std::uint64_t>(&fiber_entry);
  slot[1] = 0;
  std::uint64_t* frame = slot - 7;
  std::uint32_t csr[2];
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[1]));
  csr[1] &= 0xffffu;
  std::memcpy(frame, csr, 8);
  for (int i = 1; i < 7; ++i) frame[i] = 0;
  f.sp = frame;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.user;
  f.ctx.uc_stack.ss_size = k_stack_bytes;
  f.ctx.uc_link = &g_sched;
  makecontext(&f.ctx, fiber_entry, 0);
#endif
}

std::string where() {
  char b[160];
  std::snprintf(b, sizeof b, " [block (%u,%u,%u) thread (%u,%u,%u)]", g_block_idx.x, g_block_idx.y, g_block_idx.z,
                g_cur ? g_cur->tid.x : 0u, g_cur ? g_cur->tid.y : 0u, g_cur ? g_cur->tid.z : 0u);
  return b;
}

const char* kind_name(int k) {
  switch (k) {
    case k_syncwarp: return "__syncwarp";
    case k_shfl: return "a shuffle";
    case k_vote: return "a vote";
    case k_reduce: return "a warp reduction";
    case k_ldmatrix: return "ldmatrix";
    case k_mma: return "mma.sync";
  }
  return "?";
}

// ---- SIGSEGV: accesses that hit a guard page -----------------------------------------------------
void on_segv(int, siginfo_t* si, void*) {
  const char* a = static_cast<const char*>(si->si_addr);
  char msg[512];
  int n = std::snprintf(msg, sizeof msg, "\ngm_emu: invalid memory access at %p", static_cast<const void*>(a));
  const std::size_t pg = page_size();
  auto describe = [&](const region& r) {
    if (r.map == nullptr || a < r.map || a >= r.map + r.map_bytes) return false;
    if (a < r.user)
      n += std::snprintf(msg + n, sizeof msg - n, ": %td bytes before a %s of %zu bytes", r.user - a, r.what, r.bytes);
    else
      n += std::snprintf(msg + n, sizeof msg - n, ": %td bytes past the end of a %s of %zu bytes", a - (r.user + r.bytes),
                         r.what, r.bytes);
    return true;
  };
  bool found = describe(g_smem);
  for (const auto& kv : g_regions)
    if (!found) found = describe(kv.second);
  for (const fiber& f : g_fibers)
    if (!found && f.stack.map && a >= f.stack.map && a < f.stack.map + pg) {
      n += std::snprintf(msg + n, sizeof msg - n, ": stack overflow of an emulated thread");
      found = true;
    }
  if (g_cur != nullptr)
    n += std::snprintf(msg + n, sizeof msg - n, " in block (%u,%u,%u) thread (%u,%u,%u)", g_block_idx.x, g_block_idx.y,
                       g_block_idx.z, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z);
  n += std::snprintf(msg + n, sizeof msg - n, " (like compute-sanitizer memcheck: an out-of-bounds access)\n");
  (void)!write(2, msg, static_cast<std::size_t>(n));
  _exit(86);
}

//! Installs the guard-page handler for the duration of a launch (and restores the previous
//! handlers after it, e.g. a test framework's crash reporter).
struct segv_scope {
  struct sigaction old_segv {}, old_bus {};
  segv_scope() {
    static std::vector<char> alt(1 << 16);
    static bool alt_done = false;
    if (!alt_done) {
      stack_t ss{};
      ss.ss_sp = alt.data();
      ss.ss_size = alt.size();
      sigaltstack(&ss, nullptr);
      alt_done = true;
    }
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  }
  ~segv_scope() {
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
  }
  segv_scope(const segv_scope&) = delete;
  segv_scope& operator=(const segv_scope&) = delete;
};

// ---- running one CTA ----------------------------------------------------------------------------------
bool runnable(const fiber& f) {
  switch (f.state) {
    case fiber::ready: return true;
    case fiber::wait_block: return g_block.gen != f.wait_gen;
    case fiber::wait_warp: return g_warps[static_cast<std::size_t>(f.warp)].gen != f.wait_gen;
    case fiber::done: return false;
  }
  return false;
}

std::string deadlock_report() {
  int at_block = 0, at_warp = 0, finished = 0;
  for (const fiber& f : g_fibers) {
    at_block += f.state == fiber::wait_block;
    at_warp += f.state == fiber::wait_warp;
    finished += f.state == fiber::done;
  }
  char b[256];
  std::snprintf(b, sizeof b,
                "deadlock: %d threads wait at __syncthreads, %d at warp collectives, %d exited (a barrier or "
                "collective some threads never reach)",
                at_block, at_warp, finished);
  return b;
}

bool run_block(int threads) {
  g_block = block_state{};
  g_block.threads = threads;
  const int warps = (threads + 31) / 32;
  g_warps.assign(static_cast<std::size_t>(warps), warp_state{});
  for (int w = 0; w < warps; ++w) g_warps[static_cast<std::size_t>(w)].lanes = std::min(32, threads - 32 * w);
  if (g_smem.user) std::memset(g_smem.user, 0xFF, g_smem_bytes);
  g_block_faulted = false;
  for (int i = 0; i < threads; ++i) {
    fiber& f = g_fibers[static_cast<std::size_t>(i)];
    f.tid = make_uint3(static_cast<unsigned>(i) % g_block_dim.x, (static_cast<unsigned>(i) / g_block_dim.x) % g_block_dim.y,
                       static_cast<unsigned>(i) / (g_block_dim.x * g_block_dim.y));
    f.warp = i / 32;
    f.lane = i % 32;
    f.state = fiber::ready;
    f.wait_gen = 0;
    f.copies.clear();
    f.committed = 0;
    prepare(f);
  }
  std::vector<int> order(static_cast<std::size_t>(threads));
  std::iota(order.begin(), order.end(), 0);
  if (g_schedule == schedule::reverse) std::reverse(order.begin(), order.end());
  int live = threads;
  while (live > 0) {
    if (g_schedule == schedule::random) std::shuffle(order.begin(), order.end(), g_rng);
    bool progressed = false;
    for (int i : order) {
      fiber& f = g_fibers[static_cast<std::size_t>(i)];
      if (!runnable(f)) continue;
      f.state = fiber::ready;
      g_cur = &f;
      resume(f);
      g_cur = nullptr;
      progressed = true;
      if (g_block_faulted) return false;
      if (f.state == fiber::done) --live;
      if (g_schedule == schedule::greedy) break;  // from the first runnable thread again
    }
    if (live > 0 && !progressed) {
      g_fault = deadlock_report();
      return false;
    }
  }
  return true;
}

}  // namespace

// ---- public emulator API ----------------------------------------------------------------------------
void set_schedule(schedule s, std::uint64_t seed) {
  g_schedule = s;
  g_rng.seed(seed);
}
schedule get_schedule() { return g_schedule; }
std::string last_fault() { return g_fault; }
void clear_fault() {
  g_fault.clear();
  g_sticky_error = cudaSuccess;
  g_last_error = cudaSuccess;
}
std::uint64_t blocks_run() { return g_blocks_run; }

const uint3& thread_idx() {
  if (g_cur == nullptr) {
    static const uint3 zero{0, 0, 0};
    return zero;
  }
  return g_cur->tid;
}
int lane_id() { return g_cur ? g_cur->lane : 0; }

namespace {
cp_async_timing g_cp_async_timing = cp_async_timing::at_wait;
}
void set_cp_async_timing(cp_async_timing t) { g_cp_async_timing = t; }

void cp_async16(void* dst, const void* src) {
  if (g_cur == nullptr) fault("cp.async outside a kernel");
  if ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) % 16 != 0)
    fault("cp.async of 16 bytes from or to an address that is not 16-byte aligned");
  if (g_cp_async_timing == cp_async_timing::at_issue) {
    std::memcpy(dst, src, 16);
    return;
  }
  fiber::async_copy c;
  c.dst = dst;
  std::memcpy(c.bytes, src, 16);
  c.group = g_cur->committed;
  g_cur->copies.push_back(c);
}
void cp_async_commit() {
  if (g_cur) ++g_cur->committed;
}
void cp_async_wait(int n) {
  if (g_cur == nullptr) return;
  const std::uint64_t keep = static_cast<std::uint64_t>(n < 0 ? 0 : n);
  retire_copies(*g_cur, g_cur->committed > keep ? g_cur->committed - keep : 0);
}
void* dynamic_smem_ptr() { return g_smem.user; }

void fault(const std::string& why) {
  if (g_cur == nullptr) {
    std::fprintf(stderr, "gm_emu: %s (outside a kernel)\n", why.c_str());
    std::abort();
  }
  if (!g_block_faulted) g_fault = why + where();
  g_block_faulted = true;
  yield_to_scheduler();
  std::abort();  // never resumed
}

int block_sync(block_barrier kind, int pred) {
  if (g_cur == nullptr) fault("__syncthreads outside a kernel");
  block_state& b = g_block;
  if (b.exited > 0) fault("__syncthreads after some threads of the block exited (barrier in divergent code)");
  if (b.arrived == 0) b.kind = kind;
  else if (b.kind != kind) fault("threads of a block met different __syncthreads variants");
  const int par = static_cast<int>(b.gen & 1);
  b.count[par] += pred != 0;
  const std::uint64_t gen = b.gen;
  if (++b.arrived == b.threads) {
    b.arrived = 0;
    b.count[par ^ 1] = 0;
    ++b.gen;
    return b.count[par];
  }
  g_cur->state = fiber::wait_block;
  g_cur->wait_gen = gen;
  yield_to_scheduler();
  return b.count[par];
}

const unsigned char* warp_exchange(collective kind, unsigned mask, const void* in, std::size_t bytes) {
  if (g_cur == nullptr) fault("warp collective outside a kernel");
  warp_state& w = g_warps[static_cast<std::size_t>(g_cur->warp)];
  const unsigned full = w.lanes == 32 ? 0xffffffffu : ((1u << w.lanes) - 1u);
  if (mask != full)
    fault(std::string(kind_name(kind)) + " with a partial mask (the emulator supports full-warp collectives only, "
                                         "and a mask naming absent lanes is undefined)");
  if (w.exited > 0) fault(std::string(kind_name(kind)) + " after some lanes of the warp exited");
  if (w.arrived == 0) w.kind = kind;
  else if (w.kind != kind)
    fault(std::string("lanes of a warp met different collectives: ") + kind_name(w.kind) + " and " + kind_name(kind));
  const int par = static_cast<int>(w.gen & 1);
  if (bytes > 0) std::memcpy(w.slots[par][g_cur->lane], in, bytes);
  const std::uint64_t gen = w.gen;
  if (++w.arrived == w.lanes) {
    w.arrived = 0;
    ++w.gen;
  } else {
    g_cur->state = fiber::wait_warp;
    g_cur->wait_gen = gen;
    yield_to_scheduler();
  }
  return &w.slots[par][0][0];
}

// ---- launch -------------------------------------------------------------------------------------------
cudaError_t launch_impl(const void* kernel, dim3 grid, dim3 block, std::size_t smem, cudaStream_t,
                        const std::function<void()>& body) {
  if (g_sticky_error != cudaSuccess) return record(g_sticky_error);
  const std::uint64_t threads = static_cast<std::uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return record(cudaErrorInvalidConfiguration);
  int allowed = k_smem_default;
  const auto it = g_max_dyn_smem.find(kernel);
  if (it != g_max_dyn_smem.end()) allowed = std::max(allowed, it->second);
  if (smem > static_cast<std::size_t>(allowed)) return record(cudaErrorInvalidValue);
  const segv_scope guard_pages;

  if (g_fibers.size() < threads) {
    const std::size_t old = g_fibers.size();
    g_fibers.resize(threads);
    for (std::size_t i = old; i < threads; ++i) g_fibers[i].stack = make_region(k_stack_bytes, 16, "thread stack");
  }
  drop_region(g_smem);
  g_smem_bytes = smem;
  if (smem > 0) g_smem = make_region(smem, 16, "dynamic shared memory");
  g_block_dim = block;
  g_grid_dim = grid;
  g_body = &body;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = make_uint3(x, y, z);
        ++g_blocks_run;
        if (!run_block(static_cast<int>(threads))) {
          std::fprintf(stderr, "gm_emu: kernel fault: %s\n", g_fault.c_str());
          g_sticky_error = cudaErrorLaunchFailure;
          g_body = nullptr;
          return cudaSuccess;  // like a device fault: reported by the next synchronizing call
        }
      }
  g_body = nullptr;
  return cudaSuccess;
}

}  // namespace gm_emu

