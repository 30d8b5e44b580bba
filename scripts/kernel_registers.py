#!/usr/bin/env python3
"""Registers per thread of every kernel of a .cu file, without a GPU: NVRTC (from pip:
nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12) compiles it to an sm_90 CUBIN, whose .nv.info
section records each kernel's count (EIATTR_REGCOUNT). With PTXAS_V=1, ptxas's own report
(registers, spills) goes to /tmp/ptxas.log.

A kernel's registers times its block's threads sets how many blocks an SM holds (65,536 registers
an SM on sm_90): at blocks of 1024, more than 32 registers halves the occupancy.

Usage: python3 scripts/kernel_registers.py src/baseline/kernels.cu [name-substring]"""
import ctypes, os, struct, sys, glob
import nvidia.cuda_nvrtc as m, nvidia.cuda_runtime as rt
lib = ctypes.CDLL(glob.glob(m.__path__[0] + "/lib/libnvrtc.so.*")[0])
src = open(sys.argv[1]).read().encode()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
inc = ("-I" + rt.__path__[0] + "/include").encode()
opts = [b"--gpu-architecture=sm_90", b"--std=c++17", inc] + ([b"--ptxas-options=-v"] if os.environ.get("PTXAS_V") else [])
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
if rc: print(log.value.decode()); sys.exit(1)
if os.environ.get("PTXAS_V"): open("/tmp/ptxas.log","w").write(log.value.decode())
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)); cub = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, cub)
b = cub.raw
shoff, = struct.unpack_from("<Q", b, 0x28); shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
stroff = secs[shstrndx][4]
def name(o): e = b.index(b"\0", stroff + o); return b[stroff + o:e].decode()
flt = sys.argv[2] if len(sys.argv) > 2 else ""
# symbol table: index -> name
symtab = [x for x in secs if x[1] == 2][0]
strtab = secs[symtab[6]][4]
def sname(o): e = b.index(b"\0", strtab + o); return b[strtab + o:e].decode()
syms = [sname(struct.unpack_from("<I", b, symtab[4] + i * 24)[0]) for i in range(symtab[5] // 24)]
regs = {}
for s in secs:
    if name(s[0]) == ".nv.info":
        p, end = s[4], s[4] + s[5]
        while p < end:
            fmt, attr = b[p], b[p + 1]
            if fmt == 4:
                size, = struct.unpack_from("<H", b, p + 2)
                if attr == 0x2f:
                    si, r = struct.unpack_from("<II", b, p + 4); regs[syms[si]] = r
                p += 4 + size
            elif fmt == 3: p += 4
            elif fmt == 2: p += 3
            else: p += 2
for k in sorted(regs):
    if flt in k: print(f"{regs[k]:4d} {k}")
