// A compile bomb: constant expressions that take the compiler minutes to evaluate (24 nested loops
// of a million steps each, evaluated at compile time).
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
constexpr unsigned long long churn(unsigned long long n, unsigned long long seed) {
    unsigned long long x = seed;
    for (unsigned long long i = 0; i < n; ++i)
        for (unsigned long long j = 0; j < n; ++j) x = x * 6364136223846793005ull + (i ^ j);
    return x;
}
constexpr unsigned long long SALT0 = churn(1000, 0);
constexpr unsigned long long SALT1 = churn(1000, 1);
constexpr unsigned long long SALT2 = churn(1000, 2);
constexpr unsigned long long SALT3 = churn(1000, 3);
constexpr unsigned long long SALT4 = churn(1000, 4);
constexpr unsigned long long SALT5 = churn(1000, 5);
constexpr unsigned long long SALT6 = churn(1000, 6);
constexpr unsigned long long SALT7 = churn(1000, 7);
constexpr unsigned long long SALT8 = churn(1000, 8);
constexpr unsigned long long SALT9 = churn(1000, 9);
constexpr unsigned long long SALT10 = churn(1000, 10);
constexpr unsigned long long SALT11 = churn(1000, 11);
constexpr unsigned long long SALT12 = churn(1000, 12);
constexpr unsigned long long SALT13 = churn(1000, 13);
constexpr unsigned long long SALT14 = churn(1000, 14);
constexpr unsigned long long SALT15 = churn(1000, 15);
constexpr unsigned long long SALT16 = churn(1000, 16);
constexpr unsigned long long SALT17 = churn(1000, 17);
constexpr unsigned long long SALT18 = churn(1000, 18);
constexpr unsigned long long SALT19 = churn(1000, 19);
constexpr unsigned long long SALT20 = churn(1000, 20);
constexpr unsigned long long SALT21 = churn(1000, 21);
constexpr unsigned long long SALT22 = churn(1000, 22);
constexpr unsigned long long SALT23 = churn(1000, 23);
constexpr unsigned long long SALT = SALT0 ^ SALT1 ^ SALT2 ^ SALT3 ^ SALT4 ^ SALT5 ^ SALT6 ^ SALT7 ^ SALT8 ^ SALT9 ^ SALT10 ^ SALT11 ^ SALT12 ^ SALT13 ^ SALT14 ^ SALT15 ^ SALT16 ^ SALT17 ^ SALT18 ^ SALT19 ^ SALT20 ^ SALT21 ^ SALT22 ^ SALT23;

__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f) + 0.0f * (float)(SALT & 1);
}
