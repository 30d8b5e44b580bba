// Orders work on a stream of kevin's (cuBLAS's products) between two points of cubecl's stream
// without a host fence (policy/src/kernels.rs, `gated`). Three one-thread kernels and two words
// of device memory, `arrived` and `released`, that only grow (tickets, compared modulo 2^32):
//   cubecl's stream: kevin_gate_hold(t)  writes arrived = t, then waits for released >= t;
//   kevin's stream:  kevin_gate_wait(t)  waits for arrived >= t; the products; then
//                    kevin_gate_release(t) writes released = t.
// So the products start after every kernel cubecl's stream ran before the hold, and cubecl's
// next kernel starts after the products. A wait that polls more than `polls` times (each after
// a sleep of about GATE_SLEEP_NS; no clock is read: kevin's compiles refuse timer registers)
// gives up, writes its ticket into the error word (host memory mapped into the device: the host
// reads it without a fence) and returns, so a host that failed to enqueue its half can never
// hang the GPU.

struct GateArgs {
    unsigned long long flags;       // device address of {arrived, released}
    unsigned long long error;       // device address of the mapped error word
    unsigned long long ticket;      // this gate's ticket (low 32 bits)
    unsigned long long polls;       // how many polls a wait may take
};

#define GATE_SLEEP_NS 64

// Waits until `word` has reached `ticket`, or `polls` polls have passed (then flags the error).
__device__ __forceinline__ void gate_until(const volatile unsigned int* word, const GateArgs& a) {
    unsigned int ticket = (unsigned int)a.ticket;
    for (unsigned long long i = 0; (int)(*word - ticket) < 0; i++) {
        if (i >= a.polls) {
            *(volatile unsigned int*)a.error = ticket;
            __threadfence_system();
            break;
        }
        __nanosleep(GATE_SLEEP_NS);
    }
    __threadfence();
}

__device__ __forceinline__ void gate_set(unsigned long long flags, int which, const GateArgs& a) {
    __threadfence();
    ((volatile unsigned int*)flags)[which] = (unsigned int)a.ticket;
    __threadfence();
}

// On cubecl's stream. The three pointers are the products' operands and output: cubecl is
// handed them so that it orders them across its own streams and keeps them for this point.
extern "C" __global__ void kevin_gate_hold(const void*, const void*, const void*, GateArgs a) {
    gate_set(a.flags, 0, a);
    gate_until((const volatile unsigned int*)a.flags + 1, a);
}

extern "C" __global__ void kevin_gate_wait(GateArgs a) {
    gate_until((const volatile unsigned int*)a.flags, a);
}

extern "C" __global__ void kevin_gate_release(GateArgs a) { gate_set(a.flags, 1, a); }
