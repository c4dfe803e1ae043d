//! \file cuda_emu.cpp
//! The CPU emulator of cuda_emu.hpp: fibers (ucontext) per CUDA thread, barriers and warp
//! collectives, ldmatrix / mma.sync from the PTX ISA tables, and the slice of the CUDA runtime
//! API that greenmim's kernels and GPU tests call (the emulated device has sm_90 limits).
#include "cuda_emu.hpp"

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

uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim{1, 1, 1};
dim3 g_grid_dim{1, 1, 1};

namespace {

// ---- emulated device limits (sm_90) ------------------------------------------------------------------
constexpr int k_smem_default = 48 * 1024;
constexpr int k_smem_optin = 227 * 1024;
constexpr int k_sm_count = 132;

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// ---- guarded regions: [guard page][ ... user bytes ending at a page boundary ][guard page] ----------
struct region {
  char* map = nullptr;     // mmap base
  std::size_t map_bytes = 0;
  char* user = nullptr;    // what the caller gets
  std::size_t bytes = 0;   // what the caller asked for
  const char* what = "";
};

std::map<const char*, region> g_regions;  // by user pointer (the emulator is single-threaded)

region make_region(std::size_t bytes, std::size_t align, const char* what) {
  const std::size_t pg = page_size();
  const std::size_t body = round_up(std::max<std::size_t>(bytes, 1), pg);
  region r;
  r.map_bytes = body + 2 * pg;
  void* m = mmap(nullptr, r.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return r;
  r.map = static_cast<char*>(m);
  mprotect(r.map, pg, PROT_NONE);
  mprotect(r.map + pg + body, pg, PROT_NONE);
  r.user = r.map + pg + body - round_up(std::max<std::size_t>(bytes, 1), align);
  r.bytes = bytes;
  r.what = what;
  return r;
}
void drop_region(region& r) {
  if (r.map) munmap(r.map, r.map_bytes);
  r = region{};
}

// ---- errors --------------------------------------------------------------------------------------
cudaError_t g_last_error = cudaSuccess;    // returned and cleared by cudaGetLastError
cudaError_t g_sticky_error = cudaSuccess;  // a kernel fault: every later call fails
std::string g_fault;
std::uint64_t g_blocks_run = 0;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

// ---- fibers --------------------------------------------------------------------------------------
constexpr std::size_t k_stack_bytes = 256 * 1024;

// Context switch. On x86-64 a hand-written one (callee-saved registers, MXCSR and the x87 control
// word; no signal mask, which is what makes swapcontext cost a system call per switch); elsewhere
// ucontext.
#if defined(__x86_64__) && !defined(GM_EMU_UCONTEXT)
#define GM_EMU_FAST_SWITCH 1
}  // namespace
}  // namespace gm_emu
extern "C" void gm_emu_switch(void** save_sp, void* new_sp);
asm(R"(
  .text
  .globl gm_emu_switch
  .type gm_emu_switch, @function
gm_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gm_emu_switch, .-gm_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
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
};

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
region g_smem;
std::size_t g_smem_bytes = 0;

schedule g_schedule = schedule::forward;
std::mt19937_64 g_rng{0};

std::map<const void*, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

void fiber_entry() {
  try {
    (*g_body)();
  } catch (...) {
    g_fault = "exception escaped a kernel";
    g_block_faulted = true;
  }
  fiber* f = g_cur;
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

// ---- ldmatrix / mma.sync (PTX ISA: "Warp-level matrix load instruction: ldmatrix" and "Matrix
// Fragments for mma.m16n8k16 with floating point type") ------------------------------------------
void ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans) {
  const char* smem = static_cast<const char*>(g_smem.user);
  const char* a = static_cast<const char*>(p);
  if (smem == nullptr || a < smem || a + 16 > smem + g_smem_bytes)
    fault("ldmatrix row address outside the dynamic shared memory");
  if (reinterpret_cast<std::uintptr_t>(a) % 16 != 0) fault("ldmatrix row address not 16-byte aligned");
  const unsigned char* all = warp_exchange(k_ldmatrix, 0xffffffffu, &p, sizeof(p));
  auto row_ptr = [&](int src_lane) {
    const void* q;
    std::memcpy(&q, all + static_cast<std::size_t>(src_lane) * slot_bytes, sizeof(q));
    return static_cast<const unsigned char*>(q);
  };
  const int l = lane_id();
  for (int i = 0; i < 4; ++i) {  // matrix i: rows from lanes 8i .. 8i+7
    std::uint16_t lo, hi;
    if (!trans) {  // thread l holds row l/4, columns 2(l%4), 2(l%4)+1
      const unsigned char* row = row_ptr(8 * i + l / 4);
      std::memcpy(&lo, row + 2 * (2 * (l % 4)), 2);
      std::memcpy(&hi, row + 2 * (2 * (l % 4) + 1), 2);
    } else {  // transposed: thread l holds column l/4 of rows 2(l%4), 2(l%4)+1
      std::memcpy(&lo, row_ptr(8 * i + 2 * (l % 4)) + 2 * (l / 4), 2);
      std::memcpy(&hi, row_ptr(8 * i + 2 * (l % 4) + 1) + 2 * (l / 4), 2);
    }
    r[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
  }
}

namespace {
struct mma_in {
  unsigned a[4];
  unsigned b[2];
};

float half_bits_to_float(std::uint16_t h, bool bf16) {
  if (bf16) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half x;
  std::memcpy(static_cast<void*>(&x), &h, 2);
  return __half2float(x);
}

// A (16x16, row-major): a_i holds rows g (i = 0, 2) or g+8 (i = 1, 3), columns 2t, 2t+1 (i < 2)
// or 2t+8, 2t+9 (i >= 2), with g = lane / 4, t = lane % 4; the lower column in the low half.
// B (16x8, "col"): b_0 holds rows (k) 2t, 2t+1 and b_1 rows 2t+8, 2t+9, of column n = g.
// C/D (16x8): c_0, c_1 at row g, c_2, c_3 at row g+8, columns 2t, 2t+1.
void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool bf16) {
  mma_in in;
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  const unsigned char* all = warp_exchange(k_mma, 0xffffffffu, &in, sizeof in);
  auto lane_in = [&](int l) {
    mma_in x;
    std::memcpy(&x, all + static_cast<std::size_t>(l) * slot_bytes, sizeof x);
    return x;
  };
  auto half_of = [](unsigned w, int hi) { return static_cast<std::uint16_t>(hi ? w >> 16 : w & 0xffffu); };
  auto A = [&](int row, int k) {
    const int owner = 4 * (row % 8) + (k % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half_bits_to_float(half_of(lane_in(owner).a[reg], k % 2), bf16);
  };
  auto B = [&](int k, int n) {
    const int owner = 4 * n + (k % 8) / 2;
    return half_bits_to_float(half_of(lane_in(owner).b[k >= 8 ? 1 : 0], k % 2), bf16);
  };
  const int l = lane_id(), g = l / 4, t = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double s = 0.0;  // products of 16-bit floats are exact in fp32; the sum is rounded once
    for (int k = 0; k < 16; ++k) s += static_cast<double>(A(row, k)) * static_cast<double>(B(k, col));
    d[e] = static_cast<float>(static_cast<double>(d[e]) + s);
  }
}
}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16(d, a, b0, b1, true);
}
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16(d, a, b0, b1, false);
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

// =====================================================================================================
// The CUDA runtime API, as far as greenmim's kernels and tests use it. Streams are synchronous.
// =====================================================================================================
using namespace gm_emu;

extern "C" {

cudaError_t cudaGetLastError(void) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_sticky_error != cudaSuccess ? g_sticky_error : g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaErrorLaunchFailure) return "unspecified launch failure (emulated kernel fault, see gm_emu::last_fault)";
  return cudaGetErrorName(e);
}

cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return record(cudaErrorInvalidValue);
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return record(cudaErrorInvalidValue);
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : record(cudaErrorInvalidDevice); }

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device) {
  if (v == nullptr || device != 0) return record(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = k_smem_optin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = k_smem_default; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = k_sm_count; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    default: return record(cudaErrorNotSupported);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return record(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > k_smem_optin) return record(cudaErrorInvalidValue);
    g_max_dyn_smem[func] = value;
    return cudaSuccess;
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return record(cudaErrorInvalidValue);
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  region r = make_region(bytes, 256, "cudaMalloc buffer");
  if (r.user == nullptr) return record(cudaErrorMemoryAllocation);
  std::memset(r.user, 0xFF, bytes);  // never-written memory reads as NaN / -1
  g_regions[r.user] = r;
  *p = r.user;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  const auto it = g_regions.find(static_cast<const char*>(p));
  if (it == g_regions.end()) return record(cudaErrorInvalidValue);
  drop_region(it->second);
  g_regions.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  if (bytes > 0 && p == nullptr) return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr || device != 0) return record(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "greenmim CPU emulator (sm_90 limits)");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = k_sm_count;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->totalGlobalMem = std::size_t(80) << 30;
  prop->sharedMemPerBlock = k_smem_default;
  prop->sharedMemPerBlockOptin = k_smem_optin;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

// Events: host timestamps (streams are synchronous, so an event completes when recorded).
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return record(cudaErrorInvalidValue);
  *e = reinterpret_cast<cudaEvent_t>(new std::chrono::steady_clock::time_point());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<std::chrono::steady_clock::time_point*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (e == nullptr) return record(cudaErrorInvalidValue);
  *reinterpret_cast<std::chrono::steady_clock::time_point*>(e) = std::chrono::steady_clock::now();
  return g_sticky_error;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e == nullptr ? record(cudaErrorInvalidValue) : g_sticky_error; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (ms == nullptr || a == nullptr || b == nullptr) return record(cudaErrorInvalidValue);
  const auto d = *reinterpret_cast<std::chrono::steady_clock::time_point*>(b) -
                 *reinterpret_cast<std::chrono::steady_clock::time_point*>(a);
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return g_sticky_error; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return g_sticky_error; }

}  // extern "C"
