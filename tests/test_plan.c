/*
 * The W4A8 launch planner (kernels/w4a8_plan.c) on the CPU, against plans
 * that were chosen on real hardware or follow by hand from the documented
 * policy:
 *   - the 27B shapes at M = 1..2048 on an H200 give the plans the H200 run
 *     of bench/results/w4a8-2026-11-30.csv printed (its "plan" column), from
 *     an occupancy model of the streaming kernel built from its sm_90a
 *     register counts (nvcc -Xptxas -v) and shared-memory size;
 *   - fast prefill picks wgmma and its 96-token tile where 128 leaves SMs idle;
 *   - MiniLM shapes (384x384, 1536x384, 384x1536), worked out from the
 *     policy's rules in the comments below;
 *   - sm_89 (no streaming kernel, no wgmma), no fp8 (portable), gfx1201
 *     (16-token WMMA tiles), forced paths and splits, the decode overrides;
 *   - invariants over a grid: a split never exceeds the partials or
 *     split * m <= RADIANCE_W4A8_SPLIT_ROWS, a global split leaves every
 *     warp >= 4 groups, and the plan's code order is its path's;
 *   - edge cases: K not a multiple of the group, zero m/n/k (-EINVAL), N of
 *     one output.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "w4a8_plan.h"

/* Registers per thread of each streaming-kernel instance, in the order of
 * RADIANCE_W4A8_GEMV_INSTANCES, as ptxas reported them for sm_90a (nvcc
 * 13.0, kernels/w4a8_gemv.hip; tools/gpu-compile-check.sh prints them). */
static const unsigned gemv_regs[RADIANCE_W4A8_GEMV_NINST] = {71, 68, 70, 90, 92, 112, 102, 104, 106, 120, 122, 150, 190, 252};
static const unsigned gemv_ntw[RADIANCE_W4A8_GEMV_NINST] = {1, 1, 1, 2, 2, 4, 1, 1, 1, 2, 2, 1, 2, 1};
static const unsigned gemv_cg[RADIANCE_W4A8_GEMV_NINST] = {1, 2, 4, 1, 2, 1, 1, 2, 4, 1, 2, 2, 2, 2};

/* sm_90 occupancy as the CUDA occupancy calculator computes it: registers
 * in units of 256 per warp, 65536 per SM; 228 KiB shared memory per SM, 1 KiB
 * reserved per block, 227 KiB at most per block; 16 blocks of 128 threads. */
static int h200_gemv_blocks(unsigned inst, uint32_t stages)
{
	const unsigned warp_regs = (gemv_regs[inst] * 32 + 255) / 256 * 256;
	const unsigned by_regs = 65536 / warp_regs / RADIANCE_W4A8_GEMV_WARPS;
	/* w4a8_gemv.hip: barriers, then each warp's ring of slots of ntw x cg
	 * (1 KiB weights + 32 B scales) */
	const unsigned smem = RADIANCE_W4A8_GEMV_WARPS * RADIANCE_W4A8_GEMV_MAX_STAGES * 8 +
			      RADIANCE_W4A8_GEMV_WARPS * stages * gemv_ntw[inst] * gemv_cg[inst] * 1056;
	if (smem > 227 * 1024)
		return 0;
	const unsigned by_smem = 228 * 1024 / (smem + 1024);
	unsigned b = by_regs < by_smem ? by_regs : by_smem;
	return (int)(b < 16 ? b : 16);
}

static struct radiance__gpu_device h200(void)
{
	struct radiance__gpu_device d = {0};
	snprintf(d.name, sizeof d.name, "NVIDIA H200");
	snprintf(d.vendor, sizeof d.vendor, "cuda");
	d.sm_count = 132;
	d.cc_major = 9;
	d.fp8_mma = 1;
	d.wgmma = 1;
	d.gemv_blocks = h200_gemv_blocks;
	return d;
}

/* The backend's scratch for max_n (kernels/gpu_layer.hip sizes it so). */
static float partials_mem[1];
static uint32_t counters_mem[1];
static struct radiance__w4a8_args args(uint32_t m, uint32_t n, uint32_t k)
{
	struct radiance__w4a8_args a = {
		.m = m, .n = n, .k = k,
		.w = (const void *)(uintptr_t)0x10000, .sc = (const void *)(uintptr_t)0x20000,
		.partials = partials_mem, .partials_bytes = radiance__w4a8_partials_bytes(64, 65536),
		.counters = counters_mem, .counters_n = radiance__w4a8_counters_needed(65536),
		.max_decode_rows = 64,
	};
	return a;
}

static void expect(const struct radiance__gpu_device *d, const struct radiance__w4a8_args *a, const char *want)
{
	struct radiance__w4a8_plan p;
	char got[64];
	assert_int_equal(radiance__w4a8_plan(d, a, &p), 0);
	radiance__w4a8_plan_format(got, sizeof got, &p);
	if (strcmp(got, want) != 0)
		fail_msg("%s %ux%u m=%u: planned '%s', expected '%s'", d->name, a->n, a->k, a->m, got, want);
}

/* The H200 plans: decode as bench/results/w4a8-2026-12-04-h200-wk.md's sweep
 * found best (or within 5% of it: 34816x5120 at m = 1..8, w2 with 2 tiles a
 * warp against w1 with 1), the band and prefill as w4a8-2026-12-03-h200-exact */
static const struct {
	uint32_t n, k, m;
	const char *plan;
} h200_plans[] = {
	{16384, 5120, 1, "gemv t8 n2 c2 q2 s1 w4"},   {16384, 5120, 4, "gemv t8 n2 c2 q2 s1 w4"},
	{16384, 5120, 8, "gemv t8 n2 c2 q2 s1 w4"},   {16384, 5120, 16, "gemv t16 n2 c2 q2 s1 w4"},
	{16384, 5120, 32, "decode t32 wk1 s2"},    {16384, 5120, 64, "wgmma-exact t64 s1"},
	{16384, 5120, 256, "wgmma-exact t128 s1"},    {16384, 5120, 2048, "wgmma-exact t128 s1"},
	{14336, 5120, 1, "gemv t8 n1 c2 q2 s1 w4"},   {14336, 5120, 4, "gemv t8 n1 c2 q2 s1 w4"},
	{14336, 5120, 8, "gemv t8 n1 c2 q2 s1 w4"},   {14336, 5120, 16, "gemv t16 n2 c2 q2 s1 w4"},
	{14336, 5120, 32, "decode t32 wk1 s2"},    {14336, 5120, 64, "wgmma-exact t64 s1"},
	{14336, 5120, 256, "wgmma-exact t128 s1"},    {14336, 5120, 2048, "wgmma-exact t128 s1"},
	{5120, 6144, 1, "gemv t8 n1 c2 q2 s1 w4"},    {5120, 6144, 4, "gemv t8 n1 c2 q2 s1 w4"},
	{5120, 6144, 8, "gemv t8 n1 c2 q2 s1 w4"},    {5120, 6144, 16, "gemv t16 n1 c2 q2 s1 w4"},
	{5120, 6144, 32, "decode t32 wk2 s3"},     {5120, 6144, 64, "wgmma-exact t64 s3"},
	{5120, 6144, 256, "wgmma-exact t128 s1"},     {5120, 6144, 2048, "wgmma-exact t128 s1"},
	{34816, 5120, 1, "gemv t8 n2 c2 q2 s1 w2"},   {34816, 5120, 4, "gemv t8 n2 c2 q2 s1 w2"},
	{34816, 5120, 8, "gemv t8 n2 c2 q2 s1 w2"},   {34816, 5120, 16, "gemv t16 n2 c2 q2 s1"},
	{34816, 5120, 32, "decode t32 wk1 s3"},    {34816, 5120, 64, "wgmma-exact t64 s1"},
	{34816, 5120, 256, "wgmma-exact t128 s1"},    {34816, 5120, 2048, "wgmma-exact t128 s1"},
	{5120, 17408, 1, "gemv t8 n1 c2 q2 s2 w4"},   {5120, 17408, 4, "gemv t8 n1 c2 q2 s2 w4"},
	{5120, 17408, 8, "gemv t8 n1 c2 q2 s2 w4"},   {5120, 17408, 16, "gemv t16 n1 c2 q2 s1 w4"},
	{5120, 17408, 32, "decode t32 wk1 s6"},    {5120, 17408, 64, "wgmma-exact t64 s3"},
	{5120, 17408, 256, "wgmma-exact t128 s1"},    {5120, 17408, 2048, "wgmma-exact t128 s1"},
};

static void h200_27b_shapes(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	for (size_t i = 0; i < sizeof h200_plans / sizeof h200_plans[0]; i++) {
		struct radiance__w4a8_args a = args(h200_plans[i].m, h200_plans[i].n, h200_plans[i].k);
		expect(&d, &a, h200_plans[i].plan);
	}
}

/* prefill = fast: wgmma above the decode band, 96-token tiles where the
 * 128-token grid (ceil(m/128) x ceil(n/128) blocks) is under one block per
 * SM and the 96-token one is larger; decode unchanged */
static void h200_fast_prefill(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	const struct radiance__w4a8_settings fast = {.prefill = RADIANCE_PREFILL_FAST};
	struct radiance__w4a8_args a = args(256, 5120, 17408);
	a.settings = &fast;
	expect(&d, &a, "wgmma t96");            /* 2 x 40 = 80 < 132 blocks; 3 x 40 = 120 */
	a = args(256, 16384, 5120);
	a.settings = &fast;
	expect(&d, &a, "wgmma t128");           /* 2 x 128 = 256 blocks fill the GPU */
	a = args(2048, 5120, 6144);
	a.settings = &fast;
	expect(&d, &a, "wgmma t128");
	a = args(65, 5120, 6144);
	a.settings = &fast;
	expect(&d, &a, "wgmma t128");           /* 1 x 40 blocks either way */
	a = args(16, 5120, 6144);
	a.settings = &fast;
	expect(&d, &a, "gemv t16 n1 c2 q2 s1 w4");
	struct radiance__w4a8_plan p;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.order, RADIANCE_CODES_NATURAL);
	a = args(300, 5120, 6144);
	a.settings = &fast;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_WGMMA);
	assert_int_equal(p.order, RADIANCE_CODES_WGMMA);
	/* the tile setting overrides the policy both ways */
	const struct radiance__w4a8_settings t128 = {.prefill = RADIANCE_PREFILL_FAST, .wgmma_tile = 128};
	const struct radiance__w4a8_settings t96 = {.prefill = RADIANCE_PREFILL_FAST, .wgmma_tile = 96};
	a = args(256, 5120, 17408);
	a.settings = &t128;
	expect(&d, &a, "wgmma t128");
	a = args(2048, 16384, 5120);
	a.settings = &t96;
	expect(&d, &a, "wgmma t96");
	/* exact (the planner's default) is the f16 wgmma kernel above m = 64,
	 * in the codes' WGMMA order, 128 tokens a block whatever the tile
	 * setting; the tiled f16 HMMA kernel below that (a band edge moved by
	 * max_decode_rows) and wherever wgmma is not built, also when either
	 * wgmma path is forced there */
	a = args(256, 5120, 17408);
	expect(&d, &a, "wgmma-exact t128 s1");
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.order, RADIANCE_CODES_WGMMA);
	a = args(2048, 16384, 5120);
	const struct radiance__w4a8_settings x96 = {.prefill = RADIANCE_PREFILL_EXACT, .wgmma_tile = 96};
	a.settings = &x96;
	expect(&d, &a, "wgmma-exact t128 s1");
	a = args(65, 5120, 6144);
	expect(&d, &a, "wgmma-exact t128 s3");   /* one token block: split-K */
	a = args(40, 5120, 6144);
	a.max_decode_rows = 32;
	expect(&d, &a, "wgmma-exact t64 s3");
	a.settings = &fast;
	expect(&d, &a, "wgmma-exact t64 s3");   /* fp8 wgmma only above m = 64 */
	a = args(20, 5120, 6144);
	a.max_decode_rows = 16;
	expect(&d, &a, "tiled t32 wk2 s3");      /* m <= 32 past the band: the tiled kernel */
	a.settings = &fast;
	expect(&d, &a, "tiled t32 wk2 s3");      /* fast or not (fp8 wgmma is slower there) */
	a = args(256, 5120, 17408);
	struct radiance__gpu_device nowg = d;
	nowg.wgmma = 0;
	expect(&nowg, &a, "tiled t64 wk1 s1");
	a.settings = &fast;
	expect(&nowg, &a, "tiled t64 wk1 s1");
	a.path = RADIANCE_W4A8_WGMMA;
	expect(&nowg, &a, "tiled t64 wk1 s1");
	a.path = RADIANCE_W4A8_WGMMA_EXACT;
	expect(&nowg, &a, "tiled t64 wk1 s1");
	expect(&d, &a, "wgmma-exact t128 s1");   /* forced: whatever prefill says */
	/* forced into the band, one token block: K split over 3 blocks so that
	 * 40 columns of 128 rows fill 120 of the 132 SMs; 128 columns do not
	 * split; the partials cap the split (S m n fp32 <= partials_bytes);
	 * a forced split is taken as it is, up to G; no split without the
	 * scratch */
	static const struct {
		uint32_t m, n, k;
		const char *plan;
	} forced[] = {
		{64, 5120, 6144, "wgmma-exact t64 s3"},
		{17, 5120, 17408, "wgmma-exact t64 s3"},
		{64, 16384, 5120, "wgmma-exact t64 s1"},
	};
	for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
		a = args(forced[i].m, forced[i].n, forced[i].k);
		a.path = RADIANCE_W4A8_WGMMA_EXACT;
		expect(&d, &a, forced[i].plan);
	}
	a = args(100, 5120, 17408);
	a.partials_bytes = radiance__w4a8_partials_bytes(64, 5120);
	expect(&d, &a, "wgmma-exact t128 s2");
	a.split = 7;
	expect(&d, &a, "wgmma-exact t128 s2");
	a.partials_bytes = radiance__w4a8_partials_bytes(64, 65536);
	expect(&d, &a, "wgmma-exact t128 s7");
	a = args(64, 200, 640);
	a.path = RADIANCE_W4A8_WGMMA_EXACT;
	a.split = 9;
	expect(&d, &a, "wgmma-exact t64 s5");
	a.partials = NULL;
	expect(&d, &a, "wgmma-exact t64 s1");
}

/* auto and fast get the wgmma kernel where it runs, exact elsewhere and
 * whenever exact is asked */
static void prefill_choice(void **state)
{
	(void)state;
	struct radiance__gpu_device d = h200();
	assert_int_equal(radiance__w4a8_prefill_choose(&d, 0), RADIANCE_PREFILL_FAST);
	assert_int_equal(radiance__w4a8_prefill_choose(&d, 1), RADIANCE_PREFILL_EXACT);
	assert_int_equal(radiance__w4a8_prefill_choose(&d, 2), RADIANCE_PREFILL_FAST);
	d.wgmma = 0;
	for (unsigned asked = 0; asked < 3; asked++)
		assert_int_equal(radiance__w4a8_prefill_choose(&d, asked), RADIANCE_PREFILL_EXACT);
}

/* Fused quant (plan.fused): off under the policy (RADIANCE_W4A8_FUSE_ROWS
 * is 0) on every 27B shape; with decode_fuse_rows = 1 on for M = 1 wherever
 * a block's codes fit the shared-memory budget (all five shapes at one
 * row), never without x, for unaligned x, another dtype or M = 2; a larger
 * value is cut to the rows' limit of 4 and still bound by the budget and
 * the 8-token tile; -1 is never. The launch shape is the same fused or not. */
static void fused_quant(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	static uint16_t xbuf[64] __attribute__((aligned(16)));
	static const uint32_t shapes[][2] = {{16384, 5120}, {14336, 5120}, {5120, 6144}, {34816, 5120}, {5120, 17408}};
	const struct radiance__w4a8_settings one = {.decode_fuse_rows = 1}, wk1 = {.decode_wk = 1};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		struct radiance__w4a8_args a = args(1, shapes[i][0], shapes[i][1]);
		struct radiance__w4a8_plan p0, p1;
		a.x = xbuf;
		a.x_dtype = RADIANCE_DTYPE_BF16;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p0), 0);
		assert_int_equal(p0.fused, 0);                 /* the policy: off */
		assert_true(p0.wk > 1);                        /* warps splitting K */
		/* fused: the plan of one warp per K range (never wk > 1) */
		a.settings = &wk1;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p0), 0);
		a.settings = &one;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 1);
		assert_int_equal(p1.wk, 1);
		assert_int_equal(p1.split, p0.split);
		assert_int_equal(p1.ntw, p0.ntw);
		a.x = NULL;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 0);                 /* no x: the policy's plan */
		assert_true(p1.wk > 1);
		a.x = xbuf;
		a.x_dtype = RADIANCE_DTYPE_FP16;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 1);
		a.x_dtype = (enum radiance_dtype)99;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 0);
		a.x_dtype = RADIANCE_DTYPE_BF16;
		a.x = (const uint8_t *)xbuf + 2;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 0);
		a.x = xbuf;
		a.m = 2;
		assert_int_equal(radiance__w4a8_plan(&d, &a, &p1), 0);
		assert_int_equal(p1.fused, 0);
	}
	struct radiance__w4a8_settings set = {.decode_fuse_rows = 4};
	struct radiance__w4a8_args a = args(4, 34816, 5120);
	a.x = xbuf;
	a.x_dtype = RADIANCE_DTYPE_BF16;
	a.settings = &set;
	struct radiance__w4a8_plan p;
	/* split 1: 4 rows x (40 groups x 128 + 16) bytes > 8192 */
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.split, 1);
	assert_int_equal(p.fused, 0);
	a.m = 1;                                       /* 5136 bytes fit */
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.fused, 1);
	a = args(4, 16384, 5120);
	a.x = xbuf;
	a.x_dtype = RADIANCE_DTYPE_BF16;
	a.settings = &set;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);   /* s3: 4 x 1808 bytes */
	assert_int_equal(p.fused, 1);
	set.decode_fuse_rows = 8;                      /* cut to the MAX, 4 */
	a.m = 5;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.fused, 0);
	set.decode_fuse_rows = -1;
	a.m = 1;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.fused, 0);
	/* the matrix-core kernel (m = 32) never fuses */
	set.decode_fuse_rows = 4;
	a.m = 32;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.fused, 0);
}

/*
 * MiniLM-L6 (hidden 384, intermediate 1536), by the policy's rules:
 *   M=1 384x384: 24 n-tiles, 3 groups; the t8 n1 c2 q2 instance fits 7
 *     blocks per SM (70 registers), 6 block columns << 924; S = min(924/6,
 *     8, G/4 = 0) -> 1.
 *   M=1 384x1536: 12 groups: 2 warps of a block split K (4 would leave 3
 *     groups a warp, under 4), 12 block columns do not cover the 132 SMs, so
 *     a global split may go down to 4 groups a warp: 12 / (4 x 2) = 1 -> S = 1.
 *   M=32 (the matrix-core kernel, 32-token tile): 3 groups cannot give a
 *     warp 4 groups under any K split -> wk 1, s 1; 12 groups (K = 1536)
 *     allow wk*s up to 3.
 *   M=512: tiled over 8 token blocks, no global split (a launch of several
 *     token blocks has no split-K fixup); K slices within a block only as
 *     far as the groups go.
 */
static void h200_minilm(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	struct radiance__w4a8_args a = args(1, 384, 384);
	expect(&d, &a, "gemv t8 n1 c2 q2 s1");
	a = args(1, 1536, 384);
	expect(&d, &a, "gemv t8 n1 c2 q2 s1");
	a = args(1, 384, 1536);
	expect(&d, &a, "gemv t8 n1 c2 q2 s1 w2");
	a = args(32, 384, 384);
	expect(&d, &a, "decode t32 wk1 s1");
	a = args(33, 384, 384);
	expect(&d, &a, "wgmma-exact t64 s1");
	struct radiance__w4a8_plan p;
	for (int i = 0; i < 2; i++) {
		a = args(512, i ? 1536 : 384, 384);
		expect(&d, &a, "wgmma-exact t128 s1");
		struct radiance__gpu_device nowg = d;
		nowg.wgmma = 0;
		assert_int_equal(radiance__w4a8_plan(&nowg, &a, &p), 0);
		assert_int_equal(p.path, RADIANCE_W4A8_TILED);
		assert_int_equal(p.tok, 64);
		assert_int_equal(p.split, 1);
		assert_true(p.wk <= 3);
	}
	a = args(32, 384, 1536);
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
	assert_int_equal(p.tok, 32);
	assert_true(p.wk * p.split <= 3);
}

/* other devices: what each can run */
static void other_devices(void **state)
{
	(void)state;
	struct radiance__gpu_device ada = {.name = "sm_89", .vendor = "cuda", .sm_count = 142, .cc_major = 8,
					   .cc_minor = 9, .fp8_mma = 1};
	struct radiance__w4a8_args a = args(1, 16384, 5120);
	struct radiance__w4a8_plan p;
	assert_int_equal(radiance__w4a8_plan(&ada, &a, &p), 0);
	/* no streaming kernel below sm_90: the cp.async-ring kernel, 8-token tile */
	assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
	assert_int_equal(p.ntw, 0);
	assert_int_equal(p.tok, 8);
	const struct radiance__w4a8_settings fast = {.prefill = RADIANCE_PREFILL_FAST};
	a = args(2048, 16384, 5120);
	a.settings = &fast;
	expect(&ada, &a, "tiled t64 wk1 s1");

	struct radiance__gpu_device ampere = {.name = "sm_80", .vendor = "cuda", .sm_count = 108, .cc_major = 8};
	for (uint32_t m = 1; m <= 2048; m *= 4) {
		a = args(m, 5120, 6144);
		expect(&ampere, &a, "portable");
		a.path = RADIANCE_W4A8_DECODE;
		expect(&ampere, &a, "portable");
	}

	/* gfx1201: WMMA 16x16, so the smallest token tile is 16; no streaming
	 * kernel even with an occupancy callback (vendor hip) */
	struct radiance__gpu_device rdna = {.name = "gfx1201", .vendor = "hip", .sm_count = 64, .cc_major = 0x12,
					    .cc_minor = 1, .fp8_mma = 1, .gemv_blocks = h200_gemv_blocks};
	a = args(1, 5120, 17408);
	assert_int_equal(radiance__w4a8_plan(&rdna, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
	assert_int_equal(p.tok, 16);
	assert_int_equal(p.ntw, 0);
	a = args(17, 5120, 17408);
	assert_int_equal(radiance__w4a8_plan(&rdna, &a, &p), 0);
	assert_int_equal(p.tok, 32);
	a = args(2048, 5120, 17408);
	a.settings = &fast;
	expect(&rdna, &a, "tiled t64 wk1 s1");
}

/* the decode overrides (bench --sweep, test_gpu) and forced splits */
static void overrides(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	const struct radiance__w4a8_settings ring = {.decode_kernel = 1};
	struct radiance__w4a8_args a = args(1, 16384, 5120);
	a.settings = &ring;
	struct radiance__w4a8_plan p;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
	assert_int_equal(p.ntw, 0);
	assert_int_equal(p.tok, 8);
	const struct radiance__w4a8_settings inst = {.decode_kernel = 2, .decode_ntw = 2, .decode_cg = 1,
						     .decode_stages = 3};
	a.settings = &inst;
	a.split = 5;
	expect(&d, &a, "gemv t8 n2 c1 q3 s5 w4");
	const struct radiance__w4a8_settings inst1 = {.decode_kernel = 2, .decode_ntw = 2, .decode_cg = 1,
						      .decode_stages = 3, .decode_wk = 1};
	a.settings = &inst1;
	expect(&d, &a, "gemv t8 n2 c1 q3 s5");
	/* a forced wk is kept where no instance of its other overrides fits
	 * one wave (no 2-tile instance has 4-group slots) */
	const struct radiance__w4a8_settings w4c4 = {.decode_wk = 4, .decode_cg = 4};
	a = args(1, 34816, 5120);
	a.settings = &w4c4;
	expect(&d, &a, "gemv t8 n1 c4 q2 s1 w4");
	/* a forced wk is cut where the split leaves it less than a group a warp */
	const struct radiance__w4a8_settings w4 = {.decode_wk = 4};
	a = args(1, 200, 640);
	a.settings = &w4;
	a.split = 2;
	expect(&d, &a, "gemv t8 n1 c2 q2 s2 w2");
	a.split = 5;
	expect(&d, &a, "gemv t8 n1 c2 q2 s5");
	/* 64-token streaming launches only when forced, on the decode path
	 * (AUTO keeps the f16 wgmma kernel at m = 33..64) */
	const struct radiance__w4a8_settings k2 = {.decode_kernel = 2};
	a = args(64, 16384, 5120);
	a.settings = &k2;
	expect(&d, &a, "wgmma-exact t64 s1");
	a.path = RADIANCE_W4A8_DECODE;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.tok, 64);
	assert_int_equal(p.ntw, 1);
	/* warps splitting K add 64 tokens' partials (4 KiB a warp) through
	 * their rings: a 1-slot ring of 2-group slots (2112 B) is made 2 */
	const struct radiance__w4a8_settings k2s1 = {.decode_kernel = 2, .decode_stages = 1, .decode_wk = 4};
	a.settings = &k2s1;
	expect(&d, &a, "gemv t64 n1 c2 q2 s1 w4");
	a = args(32, 16384, 5120);
	a.settings = &k2s1;
	expect(&d, &a, "gemv t32 n2 c2 q1 s1 w4");   /* 4 KiB of 4224 B: kept */
	a = args(64, 16384, 5120);
	a.path = RADIANCE_W4A8_DECODE;
	a.settings = NULL;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.ntw, 0);   /* the cp.async-ring kernel */
	a = args(65, 16384, 5120);
	a.path = RADIANCE_W4A8_DECODE;
	a.settings = &k2;
	expect(&d, &a, "tiled t64 wk1 s1");
	/* a forced split on the matrix-core kernel, even below 4 groups a warp */
	a = args(33, 200, 640);
	a.split = 3;
	a.path = RADIANCE_W4A8_DECODE;
	expect(&d, &a, "decode t64 wk1 s3");
	/* no partials: no global split */
	a = args(1, 72, 4096);
	a.partials = NULL;
	expect(&d, &a, "gemv t8 n1 c2 q2 s1 w4");
	/* 5 blocks of 4 warps splitting K: far from covering the SMs, so a
	 * global split too, down to 4 groups a warp (32 / (4 x 4) = 2) */
	a = args(1, 72, 4096);
	expect(&d, &a, "gemv t8 n1 c2 q2 s2 w4");
	/* weights not 16-byte aligned: no bulk copies, the ring kernel */
	a.w = (const void *)(uintptr_t)0x10008;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.ntw, 0);
	/* decode forced past m = 64 is tiled (two token blocks: no global split) */
	a = args(65, 5120, 6144);
	a.path = RADIANCE_W4A8_DECODE;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_TILED);
	assert_int_equal(p.tok, 64);
	assert_int_equal(p.split, 1);
	/* max_decode_rows moves the band's edge (m = 17..32: the tiled kernel
	 * past it, the f16 wgmma kernel from m = 33 either way) */
	a = args(24, 5120, 6144);
	a.max_decode_rows = 16;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_TILED);
	assert_int_equal(p.tok, 32);
	a.max_decode_rows = 32;
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
	assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
}

static void edge_cases(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	struct radiance__w4a8_plan p = {.tok = 12345};
	struct radiance__w4a8_args a = args(1, 5120, 200);   /* K not a multiple of 128 */
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), -EINVAL);
	assert_int_equal(p.tok, 12345);                         /* untouched */
	a = args(1, 5120, 5120 + 64);
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), -EINVAL);
	a = args(0, 5120, 5120);
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), -EINVAL);
	a = args(1, 0, 5120);
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), -EINVAL);
	a = args(1, 5120, 0);
	assert_int_equal(radiance__w4a8_plan(&d, &a, &p), -EINVAL);
	/* one output, one n-tile: K = 5120 is 40 groups, 4 warps of the one
	 * block split it, and a global split down to 4 groups a warp: 40 / (4 x
	 * 4) = 2; one warp per K range (wk 1): G/4 = 10, capped at 8, and at
	 * m = 16 by the partial traffic, 0.2 * 5120 * 0.516 / (8 * 16) = 4.1 -> 4 */
	a = args(1, 1, 5120);
	expect(&d, &a, "gemv t8 n1 c2 q2 s2 w4");
	a = args(16, 1, 5120);
	expect(&d, &a, "gemv t16 n1 c2 q2 s2 w4");
	const struct radiance__w4a8_settings one_warp = {.decode_wk = 1};
	a = args(1, 1, 5120);
	a.settings = &one_warp;
	expect(&d, &a, "gemv t8 n1 c2 q2 s8");
	a = args(16, 1, 5120);
	a.settings = &one_warp;
	expect(&d, &a, "gemv t16 n1 c2 q2 s4");
	/* one group: never split */
	a = args(1, 16, 128);
	expect(&d, &a, "gemv t8 n1 c2 q2 s1");
	a = args(64, 16, 128);
	expect(&d, &a, "wgmma-exact t64 s1");
	a.path = RADIANCE_W4A8_DECODE;
	expect(&d, &a, "decode t64 wk1 s1");
	/* the names the logs, bench and tests print */
	static const char *const names[] = {"auto", "decode", "tiled", "wgmma", "portable", "wgmma-exact"};
	for (int i = 0; i < 6; i++)
		assert_string_equal(radiance__w4a8_path_name((enum radiance__w4a8_path)i), names[i]);
	assert_string_equal(radiance__w4a8_path_name((enum radiance__w4a8_path)99), "?");
	char small[8];
	struct radiance__w4a8_plan q = {.path = RADIANCE_W4A8_DECODE, .tok = 8, .wk = 4, .split = 1, .ntw = 2,
					.stages = 2, .cg = 2};
	assert_ptr_equal(radiance__w4a8_plan_format(small, sizeof small, &q), small);
	assert_string_equal(small, "gemv t8");              /* cut, NUL-terminated */
	char full[64];
	assert_string_equal(radiance__w4a8_plan_format(full, sizeof full, &q), "gemv t8 n2 c2 q2 s1 w4");
	q.path = RADIANCE_W4A8_WGMMA;
	q.tok = 96;
	assert_string_equal(radiance__w4a8_plan_format(full, sizeof full, &q), "wgmma t96");
	q.path = RADIANCE_W4A8_PORTABLE;
	assert_string_equal(radiance__w4a8_plan_format(full, sizeof full, &q), "portable");
	/* sizes of the device arrays: 16-row tiles of 1 KiB and 32 B per group */
	assert_int_equal(radiance__w4a8_weight_bytes(17, 256), 2 * 2 * 1024);
	assert_int_equal(radiance__w4a8_scale_bytes(17, 256), 2 * 2 * 32);
	assert_int_equal(radiance__w4a8_counters_needed(17), 2);
	assert_int_equal(radiance__w4a8_partials_bytes(64, 1000), 256 * 1000 * 4);
}

/* invariants of every plan over a grid of shapes, rows and devices */
static void invariants(void **state)
{
	(void)state;
	const struct radiance__gpu_device devs[] = {
		h200(),
		{.name = "gfx1201", .vendor = "hip", .sm_count = 64, .cc_major = 0x12, .fp8_mma = 1},
	};
	static const uint32_t ns[] = {1, 16, 72, 200, 384, 1536, 5120, 14336, 34816};
	static const uint32_t ks[] = {128, 384, 640, 1536, 5120, 17408};
	static const uint32_t ms[] = {1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 256, 1000, 2048};
	size_t plans = 0;
	for (size_t di = 0; di < sizeof devs / sizeof devs[0]; di++)
		for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
			for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
				for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
					const uint32_t n = ns[ni], k = ks[ki], m = ms[mi], G = k / 128;
					struct radiance__w4a8_args a = args(m, n, k);
					a.partials_bytes = radiance__w4a8_partials_bytes(64, n);
					struct radiance__w4a8_plan p;
					assert_int_equal(radiance__w4a8_plan(&devs[di], &a, &p), 0);
					plans++;
					assert_int_equal(p.order, p.path == RADIANCE_W4A8_WGMMA_EXACT ? RADIANCE_CODES_WGMMA
												      : RADIANCE_CODES_NATURAL);
					if (m <= 32 || (m <= 64 && !devs[di].wgmma))
						assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
					else
						assert_int_equal(p.path, devs[di].wgmma ? RADIANCE_W4A8_WGMMA_EXACT
											: RADIANCE_W4A8_TILED);
					assert_true(p.split >= 1 && p.wk >= 1);
					if (p.split > 1) {
						assert_true((uint64_t)p.split * m <= RADIANCE_W4A8_SPLIT_ROWS);
						assert_true((uint64_t)p.split * m * n * 4 <= a.partials_bytes);
					}
					/* a global split leaves every warp a batch of 4 groups */
					if (p.split > 1)
						assert_true(G / (p.wk * p.split) >= 4);
					assert_true(p.wk * p.split <= G);
					if (p.ntw) {
						assert_true(m <= 16 && p.tok >= m && p.tok <= 16);
						assert_true(p.stages >= 1 && p.stages <= RADIANCE_W4A8_GEMV_MAX_STAGES);
					} else if (p.path == RADIANCE_W4A8_WGMMA_EXACT) {
						assert_int_equal(p.tok, m <= 64 ? 64 : 128);
						assert_true(p.split == 1 || m <= p.tok);
						assert_true(p.split * ((n + 127) / 128) <= 132 || p.split == 1);
					} else {
						assert_true(p.tok >= m || p.tok == 64);
						assert_true(p.tok >= (devs[di].vendor[0] == 'h' ? 16u : 8u));
					}
				}
	assert_int_equal(plans, 2 * 9 * 6 * 16);
}

/* Forced streaming launches (decode_kernel 2, path DECODE; test_gpu and the
 * bench's band columns and sweep) at m = 1..64 over many shapes and
 * overrides: the smallest token tile that holds m, and every plan one the
 * launch takes (a warp's ring holds the partials warps splitting K add). */
static void forced_streaming(void **state)
{
	(void)state;
	const struct radiance__gpu_device d = h200();
	static const uint32_t ns[] = {16, 100, 1000, 5120, 16384, 34816};
	static const uint32_t ks[] = {128, 768, 1152, 5120, 17408};
	static const uint32_t ms[] = {1, 8, 9, 16, 17, 24, 32, 33, 48, 64};
	static const uint32_t ovr[][4] = {   /* ntw, cg, stages, wk; 0: the policy's */
		{0, 0, 0, 0}, {1, 1, 1, 1}, {1, 2, 1, 4}, {2, 2, 1, 2}, {4, 1, 3, 4}, {1, 4, 8, 4}, {2, 1, 2, 0},
	};
	size_t plans = 0;
	for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
		for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
			for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
				for (size_t oi = 0; oi < sizeof ovr / sizeof ovr[0]; oi++)
					for (uint32_t split = 0; split <= 3; split += 3) {
						const uint32_t n = ns[ni], k = ks[ki], m = ms[mi], G = k / 128;
						const struct radiance__w4a8_settings st = {
							.decode_kernel = 2, .decode_ntw = ovr[oi][0], .decode_cg = ovr[oi][1],
							.decode_stages = ovr[oi][2], .decode_wk = ovr[oi][3]};
						struct radiance__w4a8_args a = args(m, n, k);
						a.partials_bytes = radiance__w4a8_partials_bytes(64, n);
						a.path = RADIANCE_W4A8_DECODE;
						a.split = split;
						a.settings = &st;
						struct radiance__w4a8_plan p;
						assert_int_equal(radiance__w4a8_plan(&d, &a, &p), 0);
						plans++;
						assert_int_equal(p.path, RADIANCE_W4A8_DECODE);
						assert_true(p.ntw >= 1);
						assert_int_equal(p.tok, m <= 8 ? 8u : m <= 16 ? 16u : m <= 32 ? 32u : 64u);
						assert_true(p.stages >= 1 && p.stages <= RADIANCE_W4A8_GEMV_MAX_STAGES);
						assert_true(p.wk == 1 || p.wk == 2 || p.wk == 4);
						/* warps splitting K each keep a part of every split
						 * (at wk 1 a forced split may leave one empty) */
						assert_true(p.wk == 1 || p.wk * p.split <= G);
						if (p.split > 1)
							assert_true((uint64_t)p.split * m * n * 4 <= a.partials_bytes);
						if (p.wk > 1)
							assert_true(p.stages * p.ntw * p.cg * 1056u >= p.ntw * (p.tok / 8) * 512u);
					}
	assert_int_equal(plans, 6 * 5 * 10 * 7 * 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(h200_27b_shapes),
		cmocka_unit_test(forced_streaming),
		cmocka_unit_test(h200_fast_prefill),
		cmocka_unit_test(prefill_choice),
		cmocka_unit_test(fused_quant),
		cmocka_unit_test(h200_minilm),
		cmocka_unit_test(other_devices),
		cmocka_unit_test(overrides),
		cmocka_unit_test(edge_cases),
		cmocka_unit_test(invariants),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
