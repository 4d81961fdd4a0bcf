//! Thin wrappers over the PTX instructions the kernels use. Everything warp- or CTA-collective
//! is marked so in its doc; callers keep those on uniform control flow.
//!
//! Collective instructions are never `pure` asm: rustc does not mark inline asm `convergent`, and
//! a pure asm may be sunk into the branch that uses its result, where only some lanes reach it (a
//! `shfl.sync` sunk that way hung the mask kernel). Side-effecting asm is never moved across
//! control flow; the PTX link step additionally marks these call sites `convergent` for the
//! passes it runs.
use core::arch::{asm, global_asm, nvptx};

// The dynamic shared memory every kernel carves its tiles from (size set at launch). 1024-byte
// aligned: wgmma reads tiles in the 128-byte swizzle, whose pattern repeats every 1024 bytes.
global_asm!(".extern .shared .align 1024 .b8 dmattn_smem[];");

#[inline(always)]
pub fn thread_idx() -> u32 {
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// The thread index read afresh where called: the compiler neither hoists it nor what is
/// computed from it out of a loop (values a long loop would otherwise hold in registers
/// throughout, or spill).
#[inline(always)]
pub fn thread_idx_here() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {0}, %tid.x;", out(reg32) r, options(nostack)) };
    r
}

#[inline(always)]
pub fn block_idx() -> (u32, u32, u32) {
    unsafe { (nvptx::_block_idx_x() as u32, nvptx::_block_idx_y() as u32, nvptx::_block_idx_z() as u32) }
}

#[inline(always)]
pub fn grid_dim_x() -> u32 {
    unsafe { nvptx::_grid_dim_x() as u32 }
}

#[inline(always)]
pub fn grid_dim_y() -> u32 {
    unsafe { nvptx::_grid_dim_y() as u32 }
}

#[inline(always)]
pub fn grid_dim_z() -> u32 {
    unsafe { nvptx::_grid_dim_z() as u32 }
}

/// CTA-wide barrier (collective).
#[inline(always)]
pub fn sync_threads() {
    unsafe { nvptx::_syncthreads() }
}

/// Shared-window (32-bit) address of the dynamic shared memory.
#[inline(always)]
pub fn smem_base() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {0}, dmattn_smem;", out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// Copies the kernel parameters `p` to shared memory at `dst` (8-byte aligned, room for a `T`),
/// lets thread 0 `adjust` the copy (given the parameters and the copy's address: it rewrites
/// fields with shared-memory stores, after the copy's), and returns it (collective: every
/// thread calls it; it ends with a barrier), its reads `ld.shared` ([`smem_ref`]) or, where
/// `generic`, generic loads ([`smem_ref_generic`]). Loads from the copy stay where the code reads them:
/// LLVM hoists loads of the parameters themselves, and the arithmetic on them, out of a kernel's
/// main loop and holds dozens of registers across it, but cannot move a load past the loop's
/// barriers and shared-memory stores.
#[inline(always)]
pub unsafe fn params_in_smem<T: Copy>(p: &T, dst: u32, tid: u32, generic: bool, adjust: impl FnOnce(&T, u32)) -> &'static T {
    const { assert!(size_of::<T>() % 8 == 0 && align_of::<T>() <= 8) };
    if tid == 0 {
        let src = p as *const T as *const u64;
        // Constant offsets: the loads stay `ld.param` (a run-time index would copy the parameters
        // to local memory first).
        for i in 0..size_of::<T>() / 8 {
            unsafe { asm!("st.shared.b64 [{0}], {1};", in(reg32) dst + 8 * i as u32, in(reg64) src.add(i).read(), options(nostack)) };
        }
        adjust(p, dst);
    }
    sync_threads();
    unsafe { smem_ref_reads(dst, generic) }
}

/// The `T` at shared address `at` (a copy [`params_in_smem`] made). A main loop calls this on
/// an [`opaque`] address to re-derive the reference instead of holding it across the loop. The
/// PTX link step rewrites this asm into the address-space cast it stands for, so that reads
/// through the reference compile to `ld.shared`, not generic loads (`ptx-builder`'s
/// `shared_casts_visible`).
#[inline(always)]
pub unsafe fn smem_ref<T>(at: u32) -> &'static T {
    let generic: u64;
    unsafe { asm!("cvta.shared.u64 {0}, {1};", out(reg64) generic, in(reg64) at as u64, options(pure, nomem, nostack)) };
    unsafe { &*(generic as *const T) }
}

/// [`smem_ref`] or, where `generic`, [`smem_ref_generic`].
#[inline(always)]
pub unsafe fn smem_ref_reads<T>(at: u32, generic: bool) -> &'static T {
    unsafe { if generic { smem_ref_generic(at) } else { smem_ref(at) } }
}

/// [`smem_ref`] whose reads stay generic loads: the PTX comment in its asm keeps the link step
/// from rewriting it. For a kernel at the register limit, where `ld.shared` reads spilled.
#[inline(always)]
pub unsafe fn smem_ref_generic<T>(at: u32) -> &'static T {
    let generic: u64;
    unsafe { asm!("cvta.shared.u64 {0}, {1}; // generic reads", out(reg64) generic, in(reg64) at as u64, options(pure, nomem, nostack)) };
    unsafe { &*(generic as *const T) }
}

/// Asynchronous 16-byte global→shared copy; bytes of the 16 past `src_bytes` are zero-filled, so
/// `src_bytes == 0` writes zeros without reading. `src` must be a valid, 16-byte aligned address.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: u64, src_bytes: u32) {
    unsafe {
        asm!("cp.async.cg.shared.global [{0}], [{1}], 16, {2};",
            in(reg32) dst, in(reg64) src, in(reg32) src_bytes, options(nostack))
    };
}

/// Asynchronous 4-byte global→shared copy, zero-filling past `src_bytes` (as [`cp_async_16`]).
#[inline(always)]
pub unsafe fn cp_async_4(dst: u32, src: u64, src_bytes: u32) {
    unsafe {
        asm!("cp.async.ca.shared.global [{0}], [{1}], 4, {2};",
            in(reg32) dst, in(reg64) src, in(reg32) src_bytes, options(nostack))
    };
}

/// Asynchronous 8-byte global→shared copy, zero-filling past `src_bytes` (as [`cp_async_16`]).
#[inline(always)]
pub unsafe fn cp_async_8(dst: u32, src: u64, src_bytes: u32) {
    unsafe {
        asm!("cp.async.ca.shared.global [{0}], [{1}], 8, {2};",
            in(reg32) dst, in(reg64) src, in(reg32) src_bytes, options(nostack))
    };
}

/// Orders this thread's earlier shared-memory writes (stores and landed `cp.async` copies)
/// before later reads through the async proxy (wgmma operands); a barrier must follow before
/// other threads' wgmma read them.
#[inline(always)]
pub fn fence_proxy_async() {
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// Before a warpgroup's first `wgmma` of a product: orders the accumulator registers' earlier
/// writes (and shared-memory accesses) before the asynchronous MMAs (warpgroup-collective).
#[inline(always)]
pub fn wgmma_fence() {
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// Accumulator registers for a `wgmma` group that overwrites them (its first step with scale-d
/// 0): defined by empty asm, not zeroed. Zeros written by `mov`s between the group's
/// `wgmma.fence` and its first `wgmma` (where the compiler puts them) make ptxas inject a
/// warpgroup arrive there, and where that lands on a path it cannot prove uniform it
/// serialises every `wgmma` of the kernel (C7520).
#[inline(always)]
pub fn wgmma_scratch<const NT: usize>() -> [[f32; 4]; NT] {
    core::array::from_fn(|_| {
        let (a, b, c, d): (f32, f32, f32, f32);
        // Not `pure`: identical asm would be merged into one register for every element.
        unsafe { asm!("// scratch {0} {1} {2} {3}", out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, options(nomem, nostack)) };
        [a, b, c, d]
    })
}

/// Closes the warpgroup's wgmma issued since the last commit into a group that
/// [`crate::elem::wgmma_wait`] can wait for (warpgroup-collective).
#[inline(always)]
pub fn wgmma_commit() {
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// Sets up the `mbarrier` at shared address `at` for `count` arrivals a phase. One thread
/// initialises; a CTA barrier must follow before any thread uses it.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn mbarrier_init(at: u32, count: u32) {
    unsafe { asm!("mbarrier.init.shared::cta.b64 [{0}], {1};", in(reg32) at, in(reg32) count, options(nostack)) };
}

/// Makes the initialising thread's `mbarrier.init`s visible to the async proxy (the bulk copy
/// engine completes bytes on them), before the CTA barrier that publishes them.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn fence_barrier_init() {
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// This thread's arrival on the `mbarrier` at `at`, with release semantics: its earlier memory
/// accesses are visible to the threads that see the phase complete.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn mbarrier_arrive(at: u32) {
    unsafe { asm!("mbarrier.arrive.shared::cta.b64 _, [{0}];", in(reg32) at, options(nostack)) };
}

/// Waits (acquire) until the phase of parity `parity` of the `mbarrier` at `at` has completed.
/// A fresh barrier is in phase 0, and the phase before it (parity 1) counts as complete.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn mbarrier_wait(at: u32, parity: u32) {
    loop {
        // `try_wait` itself suspends the thread for a while before answering no.
        let done: u32;
        unsafe {
            asm!("{{ .reg .pred d; mbarrier.try_wait.parity.shared::cta.b64 d, [{1}], {2}; selp.u32 {0}, 1, 0, d; }}",
                out(reg32) done, in(reg32) at, in(reg32) parity, options(nostack))
        };
        if done != 0 {
            return;
        }
    }
}

/// This thread's arrival on the `mbarrier` at `at`, announcing `bytes` that bulk copies will
/// complete on it (`complete_tx`): its phase completes once every arrival and every byte is in.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(at: u32, bytes: u32) {
    unsafe { asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{0}], {1};", in(reg32) at, in(reg32) bytes, options(nostack)) };
}

/// Starts a bulk tensor copy (the copy engine, sm_90) of the box at `coords` (elements,
/// innermost dimension first) of the 4-D tensor whose map is at generic address `map` into
/// shared memory at `dst` (1024-byte aligned for the 128-byte swizzle), completing its bytes on
/// the `mbarrier` at `bar`. Elements past the tensor's end arrive as zeros.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn tma_load_4d(dst: u32, map: u64, coords: [u32; 4], bar: u32) {
    unsafe {
        asm!("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{1}, {{{2}, {3}, {4}, {5}}}], [{6}];",
            in(reg32) dst, in(reg64) map, in(reg32) coords[0], in(reg32) coords[1], in(reg32) coords[2], in(reg32) coords[3],
            in(reg32) bar, options(nostack))
    };
}

/// Orders this thread's later uses of the tensor map at generic address `map` (128 bytes, in
/// global memory) after writes to it through the generic proxy that happened before (a kernel
/// earlier in the stream): the tensormap proxy may otherwise use a stale copy, such as that of
/// an earlier call's map at the same address (PTX ISA 8.3).
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub unsafe fn fence_proxy_tensormap_acquire(map: u64) {
    unsafe { asm!("fence.proxy.tensormap::generic.acquire.gpu [{0}], 128;", in(reg64) map, options(nostack)) };
}

/// Raises (`INC`) or lowers this warpgroup's per-thread register limit to `N` (sm_90a,
/// warpgroup-collective): producer warpgroups give registers to the consumers.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub fn setmaxnreg<const INC: bool, const N: u32>() {
    const { assert!(N >= 24 && N <= 256 && N % 8 == 0) };
    unsafe {
        if INC {
            asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack))
        } else {
            asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack))
        }
    }
}

/// Barrier `id` (1..16; 0 is [`sync_threads`]'s) among `threads` threads, whole warps
/// (collective for those threads).
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub fn named_barrier(id: u32, threads: u32) {
    unsafe { asm!("bar.sync {0}, {1};", in(reg32) id, in(reg32) threads, options(nostack)) };
}

/// Arrival on barrier `id` (of `threads` threads) without waiting: the threads that
/// [`named_barrier`] on it wait for this one.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub fn named_barrier_arrive(id: u32, threads: u32) {
    unsafe { asm!("bar.arrive {0}, {1};", in(reg32) id, in(reg32) threads, options(nostack)) };
}

#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits for all of this thread's committed copies; a barrier must follow before other threads
/// read what they wrote.
#[inline(always)]
pub fn cp_async_wait_all() {
    unsafe { asm!("cp.async.wait_group 0;", options(nostack)) };
}

/// Waits for this thread's copies; with `WGMMA` also orders them before the `wgmma`s' reads
/// (the async proxy). A barrier must follow.
#[inline(always)]
pub fn copies_landed<const WGMMA: bool>() {
    cp_async_wait_all();
    if WGMMA {
        fence_proxy_async();
    }
}

/// Waits for this thread's committed copies but the newest `N` groups; a barrier must follow
/// before other threads read what they wrote.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// Four 8x8 b16 matrices from shared memory; lane `l` supplies the row address of matrix `l / 8`
/// (warp-collective).
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
            options(readonly, nostack))
    };
    [a, b, c, d]
}

/// As [`ldmatrix_x4`], each matrix transposed (warp-collective).
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
            options(readonly, nostack))
    };
    [a, b, c, d]
}

#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    unsafe { asm!("ld.shared.b32 {0}, [{1}];", out(reg32) v, in(reg32) addr, options(pure, readonly, nostack)) };
    v
}

#[inline(always)]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe { asm!("ld.shared.v2.b32 {{{0}, {1}}}, [{2}];", out(reg32) a, out(reg32) b, in(reg32) addr, options(pure, readonly, nostack)) };
    [a, b]
}

#[inline(always)]
pub unsafe fn ld_shared_u16(addr: u32) -> u32 {
    let v: u32;
    unsafe { asm!("ld.shared.u16 {0}, [{1}];", out(reg32) v, in(reg32) addr, options(pure, readonly, nostack)) };
    v
}

#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    unsafe { asm!("st.shared.b32 [{0}], {1};", in(reg32) addr, in(reg32) v, options(nostack)) };
}

#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    unsafe {
        asm!("st.shared.v4.b32 [{0}], {{{1}, {2}, {3}, {4}}};", in(reg32) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack))
    };
}

#[inline(always)]
pub unsafe fn st_shared_u64(addr: u32, v: u64) {
    unsafe { asm!("st.shared.u64 [{0}], {1};", in(reg32) addr, in(reg64) v, options(nostack)) };
}

#[inline(always)]
pub unsafe fn st_shared_v2(addr: u32, v: [u32; 2]) {
    unsafe { asm!("st.shared.v2.b32 [{0}], {{{1}, {2}}};", in(reg32) addr, in(reg32) v[0], in(reg32) v[1], options(nostack)) };
}

/// Stores four 8x8 matrices of 16-bit elements (`stmatrix`, sm_90): matrix `i` from register
/// `i` of every lane in the mma accumulator layout (lane `4 r + c` holds row `r`'s elements
/// `2 c`, `2 c + 1`), its row `r` to the address lane `8 i + r` passes.
#[inline(always)]
pub unsafe fn stmatrix_x4(addr: u32, v: [u32; 4]) {
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.shared.b16 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg32) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
}

/// Orders the warp's shared-memory accesses around it (and reconverges the warp).
#[inline(always)]
pub fn sync_warp() {
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

#[inline(always)]
pub unsafe fn st_shared_u16(addr: u32, v: u32) {
    unsafe { asm!("st.shared.u16 [{0}], {1};", in(reg32) addr, in(reg32) v, options(nostack)) };
}

#[inline(always)]
pub unsafe fn st_shared_u8(addr: u32, v: u32) {
    unsafe { asm!("st.shared.u8 [{0}], {1};", in(reg32) addr, in(reg32) v, options(nostack)) };
}

#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
            options(pure, readonly, nostack))
    };
    [a, b, c, d]
}

#[inline(always)]
pub unsafe fn st_global_v4(addr: u64, v: [u32; 4]) {
    unsafe {
        asm!("st.global.v4.b32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack))
    };
}

/// Coherent global loads and 16-bit stores, for data the kernel itself overwrites (the
/// non-coherent path must not see memory written during the kernel).
#[inline(always)]
pub unsafe fn ld_global_v4(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) addr,
            options(pure, readonly, nostack))
    };
    [a, b, c, d]
}

#[inline(always)]
pub unsafe fn ld_global_u16(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.u16 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

#[inline(always)]
pub unsafe fn st_global_u16(addr: u64, v: u32) {
    unsafe { asm!("st.global.u16 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Read-only global loads through the non-coherent cache (inputs the kernel never writes).
#[inline(always)]
pub unsafe fn ld_global_nc_u8(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.nc.u8 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

#[inline(always)]
pub unsafe fn ld_global_nc_v4(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) addr,
            options(pure, readonly, nostack))
    };
    [a, b, c, d]
}

#[inline(always)]
pub unsafe fn ld_global_nc_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.nc.u32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

#[inline(always)]
pub unsafe fn ld_global_nc_u64(addr: u64) -> u64 {
    let v: u64;
    unsafe { asm!("ld.global.nc.u64 {0}, [{1}];", out(reg64) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

/// Orders this thread's memory accesses before and after it for the whole GPU.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// Atomic add to a global u32 (GPU scope, relaxed: pair with [`fence_acq_rel_gpu`]),
/// returning the old value.
#[inline(always)]
pub unsafe fn atom_add_gpu_u32(addr: u64, v: u32) -> u32 {
    let old: u32;
    unsafe { asm!("atom.relaxed.gpu.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) addr, in(reg32) v, options(nostack)) };
    old
}

/// Atomic OR into a shared u32.
#[inline(always)]
pub unsafe fn atom_or_shared_u32(addr: u32, v: u32) {
    unsafe { asm!("atom.shared.or.b32 _, [{0}], {1};", in(reg32) addr, in(reg32) v, options(nostack)) };
}

/// Atomic max into a shared u32.
#[inline(always)]
pub unsafe fn atom_max_shared_u32(addr: u32, v: u32) {
    unsafe { asm!("atom.shared.max.u32 _, [{0}], {1};", in(reg32) addr, in(reg32) v, options(nostack)) };
}

/// Atomic add to a shared u32, returning the old value.
#[inline(always)]
pub unsafe fn atom_add_shared_u32(addr: u32, v: u32) -> u32 {
    let old: u32;
    unsafe { asm!("atom.shared.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg32) addr, in(reg32) v, options(nostack)) };
    old
}

#[inline(always)]
pub unsafe fn ld_global_nc_u16(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.nc.u16 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

/// Block-wide sum of `x` over the `THREADS` threads (at most 1024; collective), through 33 words of
/// shared memory at `sums`: returns (exclusive prefix of this thread, total). Ends with every
/// thread past its reads.
#[inline(always)]
pub fn block_scan<const THREADS: u32>(x: u32, tid: u32, sums: u32) -> (u32, u32) {
    let warps = THREADS / 32;
    let (lane, warp) = (tid % 32, tid / 32);
    let incl = warp_scan(x, lane);
    if lane == 31 {
        unsafe { st_shared_u32(sums + 4 * warp, incl) };
    }
    sync_threads();
    if warp == 0 {
        let w = if lane < warps { unsafe { ld_shared_u32(sums + 4 * lane) } } else { 0 };
        let s = warp_scan(w, lane);
        // Each lane rewrites only the word it read; the last lane's sum is the total.
        unsafe { st_shared_u32(sums + 4 * lane, s - w) };
        if lane == 31 {
            unsafe { st_shared_u32(sums + 4 * 32, s) };
        }
    }
    sync_threads();
    let r = (unsafe { ld_shared_u32(sums + 4 * warp) } + incl - x, unsafe { ld_shared_u32(sums + 4 * 32) });
    sync_threads();
    r
}

/// Butterfly shuffle within the warp (warp-collective).
#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.bfly.b32 {0}, {1}, {2}, 0x1f, 0xffffffff;",
            out(reg32) r, in(reg32) v, in(reg32) lane_mask, options(nomem, nostack))
    };
    r
}

/// The value of lane `lane - delta` (own value for lanes below `delta`; warp-collective).
#[inline(always)]
pub fn shfl_up_u32(v: u32, delta: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.up.b32 {0}, {1}, {2}, 0, 0xffffffff;",
            out(reg32) r, in(reg32) v, in(reg32) delta, options(nomem, nostack))
    };
    r
}

/// Inclusive prefix sum of `x` over the warp, `lane` being this thread's (warp-collective).
#[inline(always)]
pub fn warp_scan(x: u32, lane: u32) -> u32 {
    // A counted loop, not an iterator over an array: the array would live in local memory.
    let mut s = x;
    let mut d = 1;
    while d < 32 {
        let y = shfl_up_u32(s, d);
        if lane >= d {
            s += y;
        }
        d *= 2;
    }
    s
}

#[inline(always)]
pub fn shfl_xor(v: f32, lane_mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), lane_mask))
}

/// Bit `i` set iff lane `i`'s `pred` is non-zero (warp-collective).
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {1}, 0; vote.sync.ballot.b32 {0}, p, 0xffffffff; }}",
            out(reg32) r, in(reg32) pred as u32, options(nomem, nostack))
    };
    r
}

/// Lane `src`'s `v` (warp-collective).
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    let r: u32;
    unsafe { asm!("shfl.sync.idx.b32 {0}, {1}, {2}, 0x1f, 0xffffffff;", out(reg32) r, in(reg32) v, in(reg32) src, options(nomem, nostack)) };
    r
}

/// CTA barrier that also ORs `pred` over all threads (collective).
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {1}, 0; bar.red.or.pred q, 0, p; selp.u32 {0}, 1, 0, q; }}",
            out(reg32) r, in(reg32) pred as u32, options(nostack))
    };
    r != 0
}

/// CTA barrier that also ANDs `pred` over all threads (collective).
#[inline(always)]
pub fn sync_threads_and(pred: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {1}, 0; bar.red.and.pred q, 0, p; selp.u32 {0}, 1, 0, q; }}",
            out(reg32) r, in(reg32) pred as u32, options(nostack))
    };
    r != 0
}

/// 2^x (MUFU; relative error about 2^-22, exact 0 for -inf).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("ex2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// 2^x on the FMA and integer pipes instead of MUFU's, for a share of a tile's exponentials
/// where MUFU's queue is what they wait on: x rounded to j + f (f in [-1/2, 1/2]) by adding
/// 1.5 * 2^23, 2^f by a cubic (relative error 1.02e-4, monotone to an ulp, exactly 1 at 0), j
/// added to its exponent. For x below 128 (a logit less its row's LSE is at most ~0): x at or
/// below -127 (-inf included) gives exactly 0 (j = -127, f = 0: 1.0's exponent less 127), as
/// [`exp2`]'s flush to zero does from -126; between them a subnormal under 2^-126, not 2^x. A
/// NaN gives 0 (the clamp drops it), where `exp2` gives NaN. For values rounded to 16 bits
/// next (2^-9 relative), not for an f32 result.
#[inline(always)]
pub fn exp2_poly(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-127.0);
    let t = x + ROUND;
    let f = x - (t - ROUND);
    let p = fma(fma(fma(0.055_008_48, f, 0.242_210_12), f, 0.693_282_9), f, 1.0);
    f32::from_bits(p.to_bits().wrapping_add(t.to_bits() << 23))
}

/// `a * b + c`, rounded once (`core` has no `mul_add` without `std`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    unsafe { asm!("fma.rn.f32 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) c, options(pure, nomem, nostack)) };
    r
}

/// log2(x) (MUFU).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("lg2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// 1/x (MUFU).
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rcp.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `x`, hidden from the optimiser. Called at the top of a main loop on the thread index, it keeps
/// LLVM from hoisting every per-thread shared-memory address out of the loop (dozens of
/// registers held across it, then spilled); recomputing them costs one or two ALU ops each.
#[inline(always)]
pub fn opaque(x: u32) -> u32 {
    let r: u32;
    unsafe { asm!("mov.b32 {0}, {1};", out(reg32) r, in(reg32) x, options(nomem, nostack)) };
    r
}

/// `a / b` for a divisor the host guarantees non-zero (head-group sizes, split counts): no
/// division-by-zero panic branch, whose call site costs registers in the kernels' main loops.
#[inline(always)]
pub fn div(a: u32, b: u32) -> u32 {
    a.checked_div(b).unwrap_or(0)
}

/// Fire-and-forget atomic add to a global u32.
#[inline(always)]
pub unsafe fn red_add_u32(addr: u64, v: u32) {
    unsafe { asm!("red.global.add.u32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Fire-and-forget atomic OR into a global u32.
#[inline(always)]
pub unsafe fn red_or_u32(addr: u64, v: u32) {
    unsafe { asm!("red.global.or.b32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Fire-and-forget atomic max into a global i32.
#[inline(always)]
pub unsafe fn red_max_s32(addr: u64, v: i32) {
    unsafe { asm!("red.global.max.s32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Fire-and-forget atomic add to global f32, where `pred` holds (predicated, no branch).
#[inline(always)]
pub unsafe fn red_add_f32_if(pred: bool, addr: u64, v: f32) {
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {2}, 0; @p red.global.add.f32 [{0}], {1}; }}",
            in(reg64) addr, in(reg32) v, in(reg32) pred as u32, options(nostack))
    };
}

/// As [`red_add_f32_if`] for two consecutive f32 (`addr` 8-byte aligned) in one 8-byte vector
/// reduction (sm_90).
#[inline(always)]
pub unsafe fn red_add_v2_f32_if(pred: bool, addr: u64, v: [f32; 2]) {
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {3}, 0; @p red.global.add.v2.f32 [{0}], {{{1}, {2}}}; }}",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) pred as u32, options(nostack))
    };
}

/// sm_90's 16-byte vector reduction: four consecutive f32 added at `addr` (16-byte aligned).
#[inline(always)]
pub unsafe fn red_add_v4_f32(addr: u64, v: [f32; 4]) {
    unsafe {
        asm!("red.global.add.v4.f32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
}

#[inline(always)]
pub unsafe fn ld_acquire_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.acquire.gpu.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(nostack)) };
    v
}

#[inline(always)]
pub unsafe fn st_release_u32(addr: u64, v: u32) {
    unsafe { asm!("st.release.gpu.global.u32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Relaxed GPU-scope load of a global u32 (from L2: never a line an SM cached earlier).
#[inline(always)]
pub unsafe fn ld_relaxed_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.relaxed.gpu.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(nostack)) };
    v
}

/// A barrier of every CTA of a cooperative launch (all resident at once, as the launch
/// guarantees) on a u32 in global memory zeroed before the launch: the `n`-th barrier of a grid of
/// `ctas` CTAs waits for `target = n * ctas` arrivals (collective). Each CTA's accesses before it
/// (its barrier, then thread 0's fence and arrival) are visible to every CTA after it (thread 0's
/// acquire, then the barrier).
#[inline(always)]
pub unsafe fn grid_barrier(counter: u64, target: u32, tid: u32) {
    sync_threads();
    if tid == 0 {
        fence_acq_rel_gpu();
        unsafe { atom_add_gpu_u32(counter, 1) };
        while unsafe { ld_acquire_u32(counter) } < target {}
    }
    sync_threads();
}

/// A turn-based lock on a u32 in global memory: CTAs take turns in the order of the values they
/// wait for. All threads call these (collective): thread 0 spins or publishes, a barrier
/// orders the rest of the CTA's accesses after the acquire / before the release.
#[inline(always)]
pub unsafe fn wait_turn(counter: u64, turn: u32, tid: u32) {
    if tid == 0 {
        while unsafe { ld_acquire_u32(counter) } != turn {}
    }
    sync_threads();
}

#[inline(always)]
pub unsafe fn pass_turn(counter: u64, next: u32, tid: u32) {
    sync_threads();
    if tid == 0 {
        unsafe { st_release_u32(counter, next) };
    }
}

/// Warp-wide sum.
#[inline(always)]
pub fn warp_sum(mut v: f32) -> f32 {
    let mut lanes = 16;
    while lanes > 0 {
        v += shfl_xor(v, lanes);
        lanes /= 2;
    }
    v
}
