#!/usr/bin/env python3
"""Registers per thread of every kernel of a .cu file, without a GPU: NVRTC (from pip:
nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12) compiles it to an sm_90 CUBIN, whose .nv.info
section records each kernel's count (EIATTR_REGCOUNT). With PTXAS_V=1, ptxas's own report
(registers, spills) goes to /tmp/ptxas.log.

A kernel's registers times its block's threads sets how many blocks an SM holds (65,536 registers
an SM on sm_90): at blocks of 1024, more than 32 registers halves the occupancy.

Usage: python3 scripts/kernel_registers.py src/baseline/kernels.cu [name-substring]"""
import ctypes
import glob
import os
import struct
import sys

import nvidia.cuda_nvrtc
import nvidia.cuda_runtime

EIATTR_REGCOUNT = 0x2F


def compile_cubin(source, verbose):
    """The sm_90 CUBIN of `source` and NVRTC's log."""
    lib = ctypes.CDLL(glob.glob(nvidia.cuda_nvrtc.__path__[0] + "/lib/libnvrtc.so.*")[0])
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17",
            ("-I" + nvidia.cuda_runtime.__path__[0] + "/include").encode()]
    if verbose:
        opts.append(b"--ptxas-options=-v")
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log.value.decode()


def register_counts(elf):
    """{kernel: registers} from the EIATTR_REGCOUNT entries of the ELF's .nv.info section."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, align, entsize) per section.
    secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]

    def cstr(at):
        return elf[at:elf.index(b"\0", at)].decode()

    names = secs[shstrndx][4]
    symtab = next(s for s in secs if s[1] == 2)  # SHT_SYMTAB, 24-byte entries
    strtab = secs[symtab[6]][4]
    syms = [cstr(strtab + struct.unpack_from("<I", elf, symtab[4] + i * 24)[0]) for i in range(symtab[5] // 24)]
    regs = {}
    for sec in secs:
        if cstr(names + sec[0]) != ".nv.info":
            continue
        at, end = sec[4], sec[4] + sec[5]
        while at < end:
            fmt, attr = elf[at], elf[at + 1]
            if fmt == 4:  # EIFMT_SVAL: a 16-bit size, then the value
                size, = struct.unpack_from("<H", elf, at + 2)
                if attr == EIATTR_REGCOUNT:
                    sym, count = struct.unpack_from("<II", elf, at + 4)
                    regs[syms[sym]] = count
                at += 4 + size
            else:  # EIFMT_HVAL (4 bytes), EIFMT_BVAL (3), EIFMT_NVAL (2)
                at += {3: 4, 2: 3}.get(fmt, 2)
    return regs


def main():
    verbose = bool(os.environ.get("PTXAS_V"))
    cubin, log = compile_cubin(open(sys.argv[1]).read(), verbose)
    if verbose:
        open("/tmp/ptxas.log", "w").write(log)
    wanted = sys.argv[2] if len(sys.argv) > 2 else ""
    for name, count in sorted(register_counts(cubin).items()):
        if wanted in name:
            print(f"{count:4d} {name}")


if __name__ == "__main__":
    main()
