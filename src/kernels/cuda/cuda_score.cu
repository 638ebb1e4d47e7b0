/* cuda_score.cu: PPL scoring on the device. */
#include "kernels/cuda/cuda_common.cuh"

/* ---- PPL scoring: -log softmax(logits[r])[target[r]], one block per row, as ppl.c's
 * log_softmax_tok: f32 max, sum of expf(l - max) accumulated in double ---- */
__global__ void k_nll(const float *logits, int V, const int32_t *tgt, double *nll) {
    const float *l = logits + (size_t)blockIdx.x * V;
    __shared__ float smx[32];
    __shared__ double ssum[32];
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) smx[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = smx[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) mx = fmaxf(mx, smx[w]);
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)expf(l[i] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) ssum[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) t += ssum[w];
        nll[blockIdx.x] = -((double)(l[tgt[blockIdx.x]] - mx) - log(t));
    }
}


void launch_nll(const float *logits, int n_rows, int V, const int32_t *tgt, double *nll, cudaStream_t s) {
    k_nll<<<n_rows, 1024, 0, s>>>(logits, V, tgt, nll);
}
