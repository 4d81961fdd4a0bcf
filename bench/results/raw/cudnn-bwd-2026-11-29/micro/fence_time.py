# Times the proxy fence after n in-flight global reductions (k_time in fence.ptx), via the driver API.
import ctypes, sys, statistics, struct
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise SystemExit(f"{what}: CUresult {r}")
ck(cu.cuInit(0), "init"); dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "set")
mod = ctypes.c_void_p(); ck(cu.cuModuleLoad(ctypes.byref(mod), sys.argv[1].encode()), "module")
fn = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"k_time"), "fn")
blocks, threads = 264, 256
gbytes = 64 * 65536 + 4096; obytes = blocks * threads * 8
g = ctypes.c_uint64(); o = ctypes.c_uint64()
ck(cu.cuMemAlloc_v2(ctypes.byref(g), gbytes), "alloc g"); ck(cu.cuMemAlloc_v2(ctypes.byref(o), obytes), "alloc o")
ck(cu.cuMemsetD8_v2(g, 0, gbytes), "memset")
for mode in (0, 1):
    for n in (0, 1, 8, 16, 32):
        vals = []
        for rep in range(5):
            a_g = ctypes.c_uint64(g.value); a_o = ctypes.c_uint64(o.value); a_n = ctypes.c_uint32(n); a_m = ctypes.c_uint32(mode)
            args = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (a_g, a_o, a_n, a_m)])
            ck(cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, None, args, None), "launch"); ck(cu.cuCtxSynchronize(), "sync")
            buf = ctypes.create_string_buffer(obytes); ck(cu.cuMemcpyDtoH_v2(buf, o, obytes), "copy")
            vals += list(struct.unpack(f"{blocks*threads}Q", buf.raw))[::32]
        vals.sort()
        print(f"{'fence' if mode == 0 else 'none ':5s} after {n:2d} reductions a lane: median {statistics.median(vals):7.0f} cycles, p10 {vals[len(vals)//10]:7d}, p90 {vals[9*len(vals)//10]:7d}")
