// One-off H200 experiment: is a cudaMemcpyAsync whose host range spans two
// separately registered pieces still asynchronous (pinned), and can a
// kernel read across pieces through the device pointer?
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__global__ void spin(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
__global__ void sum(const unsigned char *p, size_t n, unsigned long long *out) {
	unsigned long long s = 0;
	for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += p[i];
	atomicAdd(out, s);
}
// one copy, or (pieces) one per piece it touches
static void copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t st, const unsigned char *h, size_t piece) {
	const unsigned char *hp = (const unsigned char *)(kind == cudaMemcpyHostToDevice ? src : dst);
	for (size_t done = 0; done < n;) {
		size_t c = n - done;
		if (piece) { size_t o = (size_t)(hp - h) + done; if (c > piece - o % piece) c = piece - o % piece; }
		CK(cudaMemcpyAsync((char *)dst + done, (const char *)src + done, c, kind, st));
		done += c;
	}
}
int main(void) {
	const size_t len = 64u << 20, piece = 4u << 20, off = (2u << 20) + 4096, n = 32u << 20;
	int canuse = 0; CK(cudaDeviceGetAttribute(&canuse, cudaDevAttrCanUseHostPointerForRegisteredMem, 0));
	printf("CanUseHostPointerForRegisteredMem %d\n", canuse);
	unsigned char *dev; CK(cudaMalloc(&dev, len));
	unsigned long long *dsum; CK(cudaMalloc(&dsum, 8));
	cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	for (int mode = 0; mode < 3; mode++) {   // 0 whole, 1 pieces, 2 unregistered
		unsigned char *h = (unsigned char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		for (size_t i = 0; i < len; i++) h[i] = (unsigned char)(i * 131 + 7 + mode);
		double t0 = now(), treg;
		void *d0 = NULL; int contiguous = 1;
		if (mode == 0) { CK(cudaHostRegister(h, len, cudaHostRegisterMapped | cudaHostRegisterPortable)); CK(cudaHostGetDevicePointer(&d0, h, 0)); }
		if (mode == 1) for (size_t o = 0; o < len; o += piece) {
			CK(cudaHostRegister(h + o, piece, cudaHostRegisterMapped | cudaHostRegisterPortable));
			void *d; CK(cudaHostGetDevicePointer(&d, h + o, 0));
			if (o == 0) d0 = d; else if ((char *)d != (char *)d0 + o) contiguous = 0;
		}
		treg = now() - t0;
		// H2D after a 20 ms kernel: an async call returns at once
		spin<<<1, 1, 0, st>>>(40000000LL);
		t0 = now(); copy(dev, h + off, n, cudaMemcpyHostToDevice, st, h, mode == 1 ? piece : 0); double th2d = now() - t0;
		t0 = now(); CK(cudaStreamSynchronize(st)); double tsync = now() - t0;
		spin<<<1, 1, 0, st>>>(40000000LL);
		memset(h + off, 0, n);
		t0 = now(); copy(h + off, dev, n, cudaMemcpyDeviceToHost, st, h, mode == 1 ? piece : 0); double td2h = now() - t0;
		CK(cudaStreamSynchronize(st));
		size_t bad = 0; for (size_t i = 0; i < n; i++) if (h[off + i] != (unsigned char)((off + i) * 131 + 7 + mode)) bad++;
		unsigned long long ref = 0; for (size_t i = 0; i < n; i++) ref += h[off + i];
		unsigned long long got = 0;
		if (mode < 2) {
			CK(cudaMemset(dsum, 0, 8));
			sum<<<264, 256, 0, st>>>((const unsigned char *)d0 + off, n, dsum);
			CK(cudaStreamSynchronize(st)); CK(cudaMemcpy(&got, dsum, 8, cudaMemcpyDeviceToHost));
		}
		t0 = now();
		if (mode == 0) CK(cudaHostUnregister(h));
		if (mode == 1) for (size_t o = 0; o < len; o += piece) CK(cudaHostUnregister(h + o));
		double tunreg = now() - t0;
		printf("mode %s: register %.2f ms, d0==h %d, contiguous %d; H2D call %.3f ms (sync after %.3f ms), D2H call %.3f ms; "
		       "copy errors %zu; zero-copy sum %s; unregister %.2f ms\n",
		       mode == 0 ? "whole" : mode == 1 ? "pieces" : "pageable", treg * 1e3, d0 == (void *)h, contiguous,
		       th2d * 1e3, tsync * 1e3, td2h * 1e3, bad, mode < 2 ? (got == ref ? "ok" : "WRONG") : "-", tunreg * 1e3);
		munmap(h, len);
	}
	return 0;
}
