/*
 * The W4A8 launch policy (w4a8_plan.h), moved here from the GPU dispatcher so
 * that the CPU build tests it: the same decisions for the same inputs, the
 * only device facts it needs (SM count, vendor, compute capability, which
 * kernels exist, the streaming kernel's occupancy) come in the device
 * description. docs/gpu.md has the measurements the constants come from.
 */
#include "w4a8_plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GROUP 128u          /* RAD_GROUP of numerics_gpu.h */
#define TILE_N 16u          /* RAD_TILE_N */
#define TILE_BYTES 1024u    /* RAD_TILE_BYTES */
#define SCALE_BYTES 32u     /* RAD_SCALE_BYTES */
#define WGMMA_BN 128u       /* weight rows per wgmma block (w4a8_wgmma.hip WG_BN) */

static uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

size_t radiance__w4a8_weight_bytes(uint32_t n, uint32_t k)
{
	return (size_t)ceil_div(n, TILE_N) * (k / GROUP) * TILE_BYTES;
}

size_t radiance__w4a8_scale_bytes(uint32_t n, uint32_t k)
{
	return (size_t)ceil_div(n, TILE_N) * (k / GROUP) * SCALE_BYTES;
}

size_t radiance__w4a8_counters_needed(uint32_t n)
{
	return ceil_div(n, TILE_N);
}

size_t radiance__w4a8_partials_bytes(uint32_t max_decode_rows, uint32_t max_n)
{
	(void)max_decode_rows;
	return (size_t)RADIANCE_W4A8_SPLIT_ROWS * max_n * sizeof(float);
}

static int is_cuda(const struct radiance__gpu_device *dev) { return strcmp(dev->vendor, "cuda") == 0; }

const char *radiance__w4a8_path_name(enum radiance__w4a8_path path)
{
	switch (path) {
	case RADIANCE_W4A8_AUTO: return "auto";
	case RADIANCE_W4A8_DECODE: return "decode";
	case RADIANCE_W4A8_TILED: return "tiled";
	case RADIANCE_W4A8_WGMMA: return "wgmma";
	case RADIANCE_W4A8_PORTABLE: return "portable";
	case RADIANCE_W4A8_WGMMA_EXACT: return "wgmma-exact";
	}
	return "?";
}

char *radiance__w4a8_plan_format(char *buf, size_t len, const struct radiance__w4a8_plan *p)
{
	const char *name = radiance__w4a8_path_name(p->path);
	if (p->path == RADIANCE_W4A8_DECODE && p->ntw)
		snprintf(buf, len, "gemv t%u n%u c%u q%u s%u%s", p->tok, p->ntw, p->cg, p->stages, p->split,
			 p->wk == 2 ? " w2" : p->wk == 4 ? " w4" : "");
	else if (p->path == RADIANCE_W4A8_DECODE || p->path == RADIANCE_W4A8_TILED)
		snprintf(buf, len, "%s t%u wk%u s%u", name, p->tok, p->wk, p->split);
	else if (p->path == RADIANCE_W4A8_WGMMA)
		snprintf(buf, len, "wgmma t%u", p->tok);
	else if (p->path == RADIANCE_W4A8_WGMMA_EXACT)
		snprintf(buf, len, "wgmma-exact t%u s%u", p->tok, p->split);
	else
		snprintf(buf, len, "%s", name);
	return buf;
}

/*
 * Split-K policy of the matrix-core kernel, per shape and m. Time is
 * modelled as the bytes that must move over the parallelism the grid gets:
 *   weights  N*K/2 (+ scales), read once;
 *   activations re-read from L2 by every block column: m*K*ntiles/WN, at
 *     about 0.4 of a DRAM byte (L2 serves ~2.5x HBM on Hopper) -- this is
 *     why WK (which shrinks WN) is not free for m >= 16;
 *   split-K partials written and read back: 2*S*m*N*4, so a split that fills
 *     the GPU for a narrow layer is pure extra traffic for a wide one, and
 *     grows with m;
 *   parallelism: warps / (16 per SM), quantised in waves.
 */
static void plan_split(const struct radiance__gpu_device *dev, uint32_t m, uint32_t n, uint32_t k, uint32_t tok,
		       uint32_t tokblocks, int allow_split, uint32_t force_split, uint32_t *wk_out,
		       uint32_t *split_out)
{
	const uint32_t ntiles = ceil_div(n, TILE_N), G = k / GROUP;
	/* resident warps per SM: 3 blocks of 8 for the 8-token tile on
	 * NVIDIA (64 KiB ring + < 85 registers), else 2 */
	const double per_sm = is_cuda(dev) && tok <= 8 ? 24.0 : 16.0;
	const double want = (double)(dev->sm_count > 0 ? dev->sm_count : 1) * per_sm;
	const double wbytes = (double)n * k * 0.515625;
	double best = 1e300;
	uint32_t best_wk = 1, best_s = 1;
	for (uint32_t wk = 1; wk <= 8; wk *= 2) {
		const uint32_t wn = RADIANCE_W4A8_GEMM_WARPS / wk;
		const uint32_t smax = allow_split ? 32u : 1u;
		for (uint32_t s = 1; s <= smax; s++) {
			if (force_split && s != force_split)
				continue;
			if (s > 1 && (uint64_t)s * m > RADIANCE_W4A8_SPLIT_ROWS)
				break;
			/* at least one full batch (4 groups) per warp unless forced */
			if (wk * s > G || (wk * s > 1 && G / (wk * s) < 4 && !force_split))
				continue;
			const double blocks = (double)ceil_div(ntiles, wn) * s * tokblocks;
			const double warps = blocks * RADIANCE_W4A8_GEMM_WARPS;
			const double waves = ceil(warps / want);
			const double eff = warps / (waves * want);
			/* idle warps of a block (ntiles not a multiple of wn) still cost slots */
			const double useful = (double)ntiles * wk * s * tokblocks / warps;
			const double act = 0.4 * (double)m * k * ntiles / wn;
			const double part = s > 1 ? 2.0 * s * m * (double)n * 4.0 : 0.0;
			/* every warp pays a start (first load latency) and an end
			 * (reduction, epilogue): about 2 KiB of streaming time */
			const double fixed = warps * 2048.0;
			const double cost = (wbytes + act + part + fixed) / (eff * useful);
			if (cost < best * 0.999) {
				best = cost;
				best_wk = wk;
				best_s = s;
			}
		}
	}
	*wk_out = best_wk;
	*split_out = best_s;
}

static const struct {
	uint32_t tok, ntw, cg;
} gemv_insts[] = {
#define GV_ROW(T, N, C) {T, N, C},
	RADIANCE_W4A8_GEMV_INSTANCES(GV_ROW)
#undef GV_ROW
};
_Static_assert(sizeof gemv_insts / sizeof gemv_insts[0] == RADIANCE_W4A8_GEMV_NINST,
	       "RADIANCE_W4A8_GEMV_NINST");

static int gemv_find(uint32_t tok, uint32_t ntw, uint32_t cg)
{
	for (unsigned i = 0; i < RADIANCE_W4A8_GEMV_NINST; i++)
		if (gemv_insts[i].tok == tok && gemv_insts[i].ntw == ntw && gemv_insts[i].cg == cg)
			return (int)i;
	return -1;
}

static int gemv_usable(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
		       const struct radiance__w4a8_settings *st)
{
	/* m <= 16 by default (8 or 16 tokens a launch); 32 and 64 tokens only
	 * when forced (decode_kernel 2), to be measured against the cp.async-ring
	 * and f16 wgmma kernels that take m = 17..64 (bench_w4a8's band columns) */
	if (!dev->gemv_blocks || st->decode_kernel == 1 || a->m > (st->decode_kernel == 2 ? 64u : 16u) ||
	    !is_cuda(dev) || dev->cc_major < 9)
		return 0;
	/* bulk copies need 16-byte aligned sources */
	return (((uintptr_t)a->w | (uintptr_t)a->sc) & 15u) == 0;
}

/*
 * Streaming decode policy, fitted to the H200 sweeps (bench_w4a8 --sweep,
 * docs/gpu.md "Warps splitting K"). Time is a DRAM-bound term plus what the
 * warps cannot hide: a warp computes each slot it receives before it asks
 * for the next, so the kernel wants many warps, and a global split-K costs
 * its partials round trip and a serial tail (~2 us). So parallelism comes
 * first from wk warps of a block splitting K (partials added in shared
 * memory), then from a global split only while each warp keeps at least
 * GV_SPLIT_GROUPS groups (GV_MIN_GROUPS where the blocks do not cover the
 * SMs, or at wk = 1): the largest wk (4, 2, 1), with 1 n-tile per warp
 * (else 2), whose blocks fit one wave; 2 groups per slot, 2 slots. The
 * settings' decode overrides (and args.split) replace any of these.
 */
#define GV_DEF_CG 2u
#define GV_DEF_STAGES 2u
#define GV_MAX_SPLIT 8u
#define GV_MIN_GROUPS 4u      /* groups per warp, at least (else a smaller wk) */
#define GV_SPLIT_GROUPS 16u   /* groups per warp a global split must leave */
static void plan_gemv(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
		      const struct radiance__w4a8_settings *ovr, struct radiance__w4a8_plan *plan)
{
	const uint32_t m = a->m, ntiles = ceil_div(a->n, TILE_N), G = a->k / GROUP;
	const uint32_t tok = m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
	const int allow = a->partials && a->counters && a->counters_n >= radiance__w4a8_counters_needed(a->n);
	const uint32_t sms = dev->sm_count > 0 ? (uint32_t)dev->sm_count : 1u;
	uint32_t st = ovr->decode_stages ? ovr->decode_stages : GV_DEF_STAGES;
	st = st < 1 ? 1 : st > RADIANCE_W4A8_GEMV_MAX_STAGES ? RADIANCE_W4A8_GEMV_MAX_STAGES : st;
	const uint32_t cg = ovr->decode_cg ? ovr->decode_cg : GV_DEF_CG;
	/* (wk, instance): the overrides', else the first in (wk 4, 2, 1) x
	 * (ntw 1, 2) whose blocks fit one wave, else the last tried */
	uint32_t wk_max = ovr->decode_wk ? ovr->decode_wk : 4u;
	wk_max = wk_max >= 4 ? 4u : wk_max >= 2 ? 2u : 1u;
	while (wk_max > 1 && G / wk_max < (ovr->decode_wk ? 1u : GV_MIN_GROUPS))
		wk_max /= 2;
	const uint32_t wk_min = ovr->decode_wk ? wk_max : 1u;
	int inst = -1, fits = 0;
	uint32_t wk = 1;
	uint64_t cap = 0;
	for (uint32_t w = wk_max; w >= wk_min && !fits; w /= 2)
		for (uint32_t ntw = 1; ntw <= 2 && !fits; ntw *= 2) {
			const uint32_t n = ovr->decode_ntw ? ovr->decode_ntw : ntw;
			const int i = gemv_find(tok, n, cg);
			if (i < 0)
				continue;
			const int bps = dev->gemv_blocks((unsigned)i, st);
			if (bps <= 0)
				continue;
			inst = i;   /* the last that exists, if none fits */
			wk = w;
			cap = (uint64_t)bps * sms;
			fits = ceil_div(ntiles, RADIANCE_W4A8_GEMV_WARPS / w * n) <= cap;
		}
	if (inst < 0) {   /* no instance for the overrides, or none fits its ring */
		inst = gemv_find(tok, 1, 2);
		st = GV_DEF_STAGES;
		cap = (uint64_t)sms;
		wk = wk_min;
	}
	const uint32_t cols = ceil_div(ntiles, RADIANCE_W4A8_GEMV_WARPS / wk * gemv_insts[inst].ntw);
	uint32_t S = 1;
	if (allow && a->split) {
		S = a->split;
	} else if (allow) {
		const double wbytes = (double)a->n * a->k * 0.515625;
		S = (uint32_t)(cap / cols);
		S = S > GV_MAX_SPLIT ? GV_MAX_SPLIT : S;
		/* down to GV_MIN_GROUPS a warp where the blocks do not cover
		 * the SMs or no warps split K (the policy before wk, fitted to
		 * its own sweep) */
		const uint32_t per = cols < sms || wk == 1 ? GV_MIN_GROUPS : GV_SPLIT_GROUPS;
		S = S > G / (per * wk) ? G / (per * wk) : S;
		S = S > RADIANCE_W4A8_SPLIT_ROWS / m ? RADIANCE_W4A8_SPLIT_ROWS / m : S;
		const uint32_t spart = (uint32_t)(0.2 * wbytes / (8.0 * m * a->n));
		S = S > spart ? spart : S;
		S = S < 1 ? 1 : S;
	}
	if (S > 1 && (size_t)S * m * a->n * sizeof(float) > a->partials_bytes)
		S = (uint32_t)(a->partials_bytes / ((size_t)m * a->n * sizeof(float)));
	S = S < 1 ? 1 : S;
	/* every warp's part of every split's K range non-empty */
	while (wk > 1 && (uint64_t)wk * S > G)
		wk /= 2;
	/* warps splitting K add their partials through their rings (64
	 * tokens with 1-slot rings need a second slot) */
	while (wk > 1 && st < RADIANCE_W4A8_GEMV_MAX_STAGES &&
	       !RADIANCE_W4A8_GEMV_RING_HOLDS_PARTIALS(gemv_insts[inst].ntw, gemv_insts[inst].cg, tok, st))
		st++;
	plan->tok = tok;
	plan->wk = wk;
	plan->ntw = gemv_insts[inst].ntw;
	plan->cg = gemv_insts[inst].cg;
	plan->stages = st;
	plan->split = S;
}

/* Whether the settings ask the streaming kernel to quantize a->x itself
 * for this launch (the part of gemv_fuse that does not depend on a plan) */
static int gemv_fuse_asked(const struct radiance__w4a8_args *a, const struct radiance__w4a8_settings *st)
{
	int rows = st->decode_fuse_rows ? st->decode_fuse_rows : RADIANCE_W4A8_FUSE_ROWS;
	rows = rows > RADIANCE_W4A8_FUSE_MAX_ROWS ? RADIANCE_W4A8_FUSE_MAX_ROWS : rows;
	return a->x && rows > 0 && a->m <= (uint32_t)rows && ((uintptr_t)a->x & 15u) == 0 &&
	       (a->x_dtype == RADIANCE_DTYPE_BF16 || a->x_dtype == RADIANCE_DTYPE_FP16);
}

/* Whether the streaming kernel of `plan` quantizes a->x itself: 8-token
 * instances only, m within the settings' rows (the policy's are
 * RADIANCE_W4A8_FUSE_ROWS, 0: never), x given (bf16/fp16, 16-byte aligned),
 * every split a non-empty K range (each block makes the scales its epilogue
 * uses) whose codes fit RADIANCE_W4A8_FUSE_SMEM. The policy is off because
 * on the H200 no rule over the shapes gained in the decode step: every
 * block reads the whole row for its amax and quantizes its K range before
 * its first MMA; the layer alone gained only on 5120x6144 in every run, and
 * the step queued in sequence with just those layers fused ran 6.81 ms
 * against 6.39 (docs/gpu.md "Fused quant"). */
static uint32_t gemv_fuse(const struct radiance__w4a8_args *a, const struct radiance__w4a8_settings *st,
			  const struct radiance__w4a8_plan *plan)
{
	if (!gemv_fuse_asked(a, st) || plan->tok != 8 || plan->wk > 1)
		return 0;
	const uint32_t G = a->k / GROUP;
	if (plan->split > G)
		return 0;
	const uint32_t L = ceil_div(G, plan->split);
	return (size_t)a->m * (L * GROUP + 16) <= RADIANCE_W4A8_FUSE_SMEM;
}

enum radiance__w4a8_prefill radiance__w4a8_prefill_choose(const struct radiance__gpu_device *dev,
							    unsigned asked)
{
	return dev->wgmma && (asked == 0 || asked == 2) ? RADIANCE_PREFILL_FAST : RADIANCE_PREFILL_EXACT;
}

/* wgmma token tile: 96 when 128-token tiles leave SMs idle (narrow layers at
 * a few hundred tokens: 5120 x K at M = 256 ran 25% faster on the H200),
 * 128 otherwise (less unpack and L2 traffic per FLOP) */
static uint32_t wgmma_tile(const struct radiance__gpu_device *dev, uint32_t m, uint32_t n,
			   const struct radiance__w4a8_settings *st)
{
	if (st->wgmma_tile == 96 || st->wgmma_tile == 128)
		return st->wgmma_tile;
	const uint32_t nb = ceil_div(n, WGMMA_BN);
	const uint32_t b128 = ceil_div(m, 128) * nb, b96 = ceil_div(m, 96) * nb;
	return b128 < (uint32_t)dev->sm_count && b96 > b128 ? 96u : 128u;
}

/* The exact wgmma kernel: 64-token blocks up to m = 64, else 128; one token
 * block may split K over S blocks (args.split, else the policy: the largest
 * S that keeps the grid within one block per SM, at least 4 groups per
 * split) while the partials [S][m][n] fit and the counters cover the
 * 128-row columns. */
static void plan_wgmma_exact(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
			     struct radiance__w4a8_plan *plan)
{
	const uint32_t G = a->k / GROUP, nb = ceil_div(a->n, WGMMA_BN);
	const uint32_t sms = dev->sm_count > 0 ? (uint32_t)dev->sm_count : 1u;
	plan->tok = a->m <= 64 ? 64u : 128u;
	uint32_t S = 1;
	if (a->m <= plan->tok && a->partials && a->counters && a->counters_n >= nb) {
		S = a->split ? a->split : sms / nb;
		if (!a->split)
			S = S > G / 4 ? G / 4 : S;
		S = S > G ? G : S;
		if ((size_t)S * a->m * a->n * sizeof(float) > a->partials_bytes)
			S = (uint32_t)(a->partials_bytes / ((size_t)a->m * a->n * sizeof(float)));
		S = S < 1 ? 1 : S;
	}
	plan->split = S;
}

int radiance__w4a8_plan(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
			struct radiance__w4a8_plan *plan)
{
	if (a->m == 0 || a->n == 0 || a->k == 0 || a->k % GROUP)
		return -EINVAL;
	static const struct radiance__w4a8_settings defaults;
	const struct radiance__w4a8_settings *st = a->settings ? a->settings : &defaults;
	const uint32_t maxdec = a->max_decode_rows ? a->max_decode_rows : 64;
	enum radiance__w4a8_path path = a->path;
	/* Prefill is exact (f16 tensor cores, fp32 accumulation: f16 wgmma
	 * where it is built, else the f16 HMMA kernel tiled over tokens) unless
	 * the settings ask for fast: Hopper's fp8 tensor cores add each k32
	 * step's products with about 14 bits of alignment precision
	 * (truncating), not in fp32 as numerics.h defines; within the bf16
	 * floor in norm, but up to a few hundred bf16 steps on outputs near zero
	 * (docs/numerics.md "Contract"). */
	/* Where wgmma is built, the f16 wgmma kernel also takes the top of the
	 * band, m = 33..64, whatever prefill says (exact, and on the H200 1.3-2.6x
	 * faster than the decode kernel's 64-token tiles at m = 64 and faster than
	 * the fp8 wgmma kernel there; at m = 32 the decode kernel's 32-token
	 * tiles are as fast, so m <= 32 keeps them: bench/results/
	 * w4a8-2026-12-03-h200-exact.md); fp8 wgmma only above m = 64. */
	if (path == RADIANCE_W4A8_AUTO) {
		const int band = a->m <= maxdec && a->m <= 64;
		if (!dev->fp8_mma)
			path = RADIANCE_W4A8_PORTABLE;
		else if (dev->wgmma && a->m > 32 && (a->m <= 64 || st->prefill != RADIANCE_PREFILL_FAST))
			path = RADIANCE_W4A8_WGMMA_EXACT;
		else if (band)
			path = RADIANCE_W4A8_DECODE;
		else   /* m <= 32 past a lowered band edge stays exact too */
			path = dev->wgmma && st->prefill == RADIANCE_PREFILL_FAST && a->m > 64 ? RADIANCE_W4A8_WGMMA
											       : RADIANCE_W4A8_TILED;
	}
	if (path == RADIANCE_W4A8_DECODE && a->m > 64)
		path = RADIANCE_W4A8_TILED;
	const int wg = path == RADIANCE_W4A8_WGMMA || path == RADIANCE_W4A8_WGMMA_EXACT;
	if (wg && !dev->wgmma)
		path = RADIANCE_W4A8_TILED;
	if ((path == RADIANCE_W4A8_DECODE || path == RADIANCE_W4A8_TILED || path == RADIANCE_W4A8_WGMMA ||
	     path == RADIANCE_W4A8_WGMMA_EXACT) && !dev->fp8_mma)
		path = RADIANCE_W4A8_PORTABLE;
	plan->path = path;
	plan->order = path == RADIANCE_W4A8_WGMMA || path == RADIANCE_W4A8_WGMMA_EXACT ? RADIANCE_CODES_WGMMA
											 : RADIANCE_CODES_NATURAL;
	plan->tok = 0;
	plan->wk = 1;
	plan->split = 1;
	plan->ntw = 0;
	plan->stages = 0;
	plan->cg = 0;
	plan->fused = 0;
	if (path == RADIANCE_W4A8_WGMMA)
		plan->tok = wgmma_tile(dev, a->m, a->n, st);
	if (path == RADIANCE_W4A8_WGMMA_EXACT) {
		plan_wgmma_exact(dev, a, plan);
		return 0;
	}
	if (path != RADIANCE_W4A8_DECODE && path != RADIANCE_W4A8_TILED)
		return 0;
	if (path == RADIANCE_W4A8_DECODE && gemv_usable(dev, a, st)) {
		/* fused quant (never with warps splitting K) where the settings
		 * ask for it and it applies at wk = 1, else the policy */
		if (gemv_fuse_asked(a, st)) {
			struct radiance__w4a8_settings one = *st;
			one.decode_wk = 1;
			plan_gemv(dev, a, &one, plan);
			plan->fused = gemv_fuse(a, st, plan);
			if (plan->fused)
				return 0;
		}
		plan_gemv(dev, a, st, plan);
		return 0;
	}
	/* the smallest token tile that holds m (decode, and tiled m <= 64);
	 * the smallest is 8 on NVIDIA (mma m16n8), 16 on AMD (WMMA 16x16) */
	uint32_t tok = 64;
	if (a->m <= 64)
		for (tok = is_cuda(dev) ? 8u : 16u; tok < a->m; tok *= 2)
			;
	plan->tok = tok;
	const uint32_t tokblocks = ceil_div(a->m, tok);
	const int allow = tokblocks == 1 && a->partials && a->counters &&
			  a->counters_n >= radiance__w4a8_counters_needed(a->n);
	plan_split(dev, a->m, a->n, a->k, tok, tokblocks, allow, allow ? a->split : 1, &plan->wk, &plan->split);
	if (plan->split > 1 && (size_t)plan->split * a->m * a->n * sizeof(float) > a->partials_bytes)
		plan->split = 1;
	return 0;
}
