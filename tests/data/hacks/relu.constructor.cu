// Runs code when its module is loaded, before any check: a constructor (here it only sets a flag;
// a real attacker would read the harness's memory or patch it).
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
static volatile int armed;
__attribute__((constructor)) void kevin_early() { armed = 1; }
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = armed ? fmaxf(X[i], 0.0f) : 0.0f;
}
