# radiance: GNU make build.
#
#   make                     CPU-only daemon, client library, radiancectl
#   make check               build and run every test (installs missing Debian packages)
#   make check SAN=address,undefined   the same under sanitizers (separate build dir)
#   make check SAN=thread TESTS="..."  ThreadSanitizer, in build-tsan/
#   make demo                the main job on the CPU backend and the shipped checkpoint
#   make GPU=cuda | GPU=hip  add the GPU backend (nvcc for sm_90a / hipcc for gfx1201)
#   make install PREFIX=/usr DESTDIR=...   (SYSCONFDIR: /etc for PREFIX=/usr, else PREFIX/etc)
#   make check-build-matrix  build every documented option combination this machine can
#                            (GPU=cuda with nvcc, STATIC_DEPS=1, SAN=...): tests/build_matrix.sh
#   make check-deb           build the Debian packages, lintian, install and use them in a
#                            Debian 12 container (systemd-nspawn): tests/deb_check.sh
#
# Every directory's sources are picked up by wildcard: one file, one responsibility.

VERSION    := 0.1.0
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SBINDIR    ?= $(PREFIX)/sbin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
# autoconf's rule with the FHS exception Debian uses: /usr's configuration
# lives in /etc, any other prefix's in PREFIX/etc (/usr/local/etc, /opt/x/etc).
SYSCONFDIR ?= $(if $(filter /usr /usr/,$(PREFIX)),/etc,$(PREFIX)/etc)
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR?= $(PREFIX)/lib/tmpfiles.d

GPU ?=
SAN ?=
STATIC_DEPS ?= 0

ifeq ($(SAN),thread)
BUILD ?= build-tsan
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
else ifneq ($(SAN),)
BUILD ?= build-san
SANFLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
else ifneq ($(GPU),)
BUILD ?= build-$(GPU)
else
BUILD ?= build
endif

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
INC     := -Icommon -Iproto -Ikernels -Idaemon -Iclient -I$(BUILD)/gen
DEFS    := -D_GNU_SOURCE -DRADIANCE_VERSION=\"$(VERSION)\"
# -ffp-contract=off: the CPU reference rounds every product and sum as written
# (a fused multiply-add would change results between machines).
# -fvisibility=hidden: what a library or the daemon exports is what its
# public header marks (client/radiance.h, client/radiance_gpu.h: a
# visibility push around the declarations), nothing else.
ALLCFLAGS = -std=c11 $(WARN) $(INC) $(DEFS) -fPIC -fvisibility=hidden -ffp-contract=off $(SANFLAGS) $(CPPFLAGS) $(CFLAGS) $(GPU_DEFS)
# CPPFLAGS and LDFLAGS as a distribution passes them (dpkg-buildflags:
# _FORTIFY_SOURCE, -z relro/now); empty by default.
CPPFLAGS ?=
LDFLAGS  ?=

# Libraries found through pkg-config. STATIC_DEPS=1 links libuv, protobuf-c,
# jansson and inih statically into the executables (for hosts without them,
# such as the H200 host). libradiance.so always links the shared protobuf-c
# and jansson, the only libraries the client uses: a shared object cannot
# embed Debian's static archives, which are not built as PIC; a client on
# a host without those libraries links libradiance.a (radiance.pc --static).
PKGS := libuv libprotobuf-c jansson inih libsystemd
CLIENT_PKGS := libprotobuf-c jansson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
CLIENT_SO_LIBS := $(shell pkg-config --libs $(CLIENT_PKGS) 2>/dev/null) -lpthread
ifeq ($(STATIC_DEPS),1)
LIBDIR_SYS := $(shell pkg-config --variable=libdir libuv 2>/dev/null)
DEP_LIBS := $(LIBDIR_SYS)/libuv_a.a $(LIBDIR_SYS)/libprotobuf-c.a $(LIBDIR_SYS)/libjansson.a \
            $(LIBDIR_SYS)/libinih.a -lsystemd -lpthread -ldl -lm
else
DEP_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -lm
endif
ALLCFLAGS += $(PKG_CFLAGS)

# kernels/cpu_avx2.c is compiled for AVX2+FMA+F16C (and -O3, for its unrolled
# micro-kernels); kernels/cpu_fast.c calls it only where the CPU has them.
ifneq ($(filter x86_64 amd64,$(shell uname -m)),)
SIMD_AVX2 := -mavx2 -mfma -mf16c -O3
endif
$(BUILD)/obj/kernels/cpu_avx2.o: ALLCFLAGS += $(SIMD_AVX2)
# kernels/cpu_avx512.c: AVX-512 F/BW/VBMI/BF16 (vdpbf16ps), called only where
# the CPU has them and cpu_fast.c's known-answer check passed.
ifneq ($(filter x86_64 amd64,$(shell uname -m)),)
SIMD_AVX512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vbmi -mavx512bf16 -O3
endif
$(BUILD)/obj/kernels/cpu_avx512.o: ALLCFLAGS += $(SIMD_AVX512)
# kernels/cpu_neon.c: aarch64 Advanced SIMD (part of every AArch64 target: no
# -m flag); empty elsewhere. tests/test_cpu_neon.sh cross-builds it.
ifneq ($(filter aarch64 arm64,$(shell uname -m)),)
SIMD_NEON := -O3
endif
$(BUILD)/obj/kernels/cpu_neon.o: ALLCFLAGS += $(SIMD_NEON)

# GPU backend: kernels/*.hip built by nvcc (as CUDA) or hipcc. The kernels'
# vendor mapping is kernels/gpu_compat.h; tools/gpu-compile-check.sh is the CI
# compile check (sm_90a with nvcc, gfx1201 with Debian's clang-19).
GPU_OBJS :=
GPU_LIBS :=
GPU_DEFS :=
ifeq ($(GPU),cuda)
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) /usr/local/cuda/bin/nvcc)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# wgmma needs sm_90a; the -gencode form keeps nvcc from adding a plain sm_90 pass
CUDA_GENCODE ?= -gencode=arch=compute_90a,code=sm_90a
GPU_DEFS  := -DRADIANCE_GPU=1 -DRADIANCE_GPU_CUDA=1 -I$(CUDA_HOME)/include
# The CUDA runtime links statically (nvcc's default); cuBLAS too where the
# toolkit ships its static libraries, else the shared libcublas.so.13.
CUBLAS_LIBS := $(if $(wildcard $(CUDA_HOME)/lib64/libcublas_static.a),-lcublas_static -lcublasLt_static -lculibos,-lcublas -lcublasLt)
# -lcuda: the driver API for VMM (kernels/gpu_share.hip); linked against the
# toolkit's stub, the driver's libcuda.so.1 is what runs.
GPU_LIBS  := -L$(CUDA_HOME)/lib64 $(CUBLAS_LIBS) -lcudart_static -L$(CUDA_HOME)/lib64/stubs -lcuda -lrt -ldl -lpthread -lstdc++
GPU_CXX    = $(NVCC) -x cu -std=c++17 -O3 $(CUDA_GENCODE) -Xcompiler -fPIC -Ikernels -Idaemon -DRADIANCE_GPU_CUDA=1
else ifeq ($(GPU),hip)
HIPCC     ?= $(firstword $(wildcard /opt/rocm/bin/hipcc) hipcc)
HIP_ARCH  ?= gfx1201
ROCM_PATH ?= /opt/rocm
GPU_DEFS  := -DRADIANCE_GPU=1 -DRADIANCE_GPU_HIP=1 -D__HIP_PLATFORM_AMD__ -I$(ROCM_PATH)/include
GPU_LIBS  := -L$(ROCM_PATH)/lib -Wl,-rpath,$(ROCM_PATH)/lib -lamdhip64 -lhipblas -lstdc++
GPU_CXX    = $(HIPCC) -x hip -std=c++17 -O3 --offload-arch=$(HIP_ARCH) -fPIC -Ikernels -Idaemon
endif

PROTO_C  := $(BUILD)/gen/radiance.pb-c.c
PROTO_H  := $(BUILD)/gen/radiance.pb-c.h

COMMON_SRC := $(wildcard common/*.c proto/*.c)
CORE_SRC   := $(wildcard kernels/*.c) $(filter-out daemon/main.c,$(wildcard daemon/*.c))
CLIENT_SRC := $(filter-out client/radiancectl.c,$(wildcard client/*.c))
TEST_SRC   := $(wildcard tests/test_*.c)
HIP_SRC    := $(wildcard kernels/*.hip)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(BUILD)/obj/gen/radiance.pb-c.o
CORE_OBJ   := $(call obj,$(CORE_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
TEST_BIN   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

# libradiance-gpu (client/radiance_gpu.h, docs/mapped.md): the kernels and
# client/gpu/, for engines that run mapped models in their own process.
GPU_CLIENT_OBJ :=
ifneq ($(GPU),)
GPU_OBJS := $(patsubst kernels/%.hip,$(BUILD)/obj/kernels/%.gpu.o,$(HIP_SRC))
# the launch planner is plain C (kernels/w4a8_plan.c): the kernels call it
GPU_CLIENT_OBJ := $(call obj,$(wildcard client/gpu/*.c) kernels/w4a8_plan.c)
LIB_GPU_A  := $(BUILD)/libradiance-gpu.a
LIB_GPU_SO := $(BUILD)/libradiance-gpu.so.0
GPU_CLIENT_TARGETS := $(LIB_GPU_A) $(LIB_GPU_SO) $(BUILD)/radiance-gpu.pc
endif

LIB_COMMON := $(BUILD)/libradiance-common.a
LIB_CORE   := $(BUILD)/libradiance-core.a
LIB_CLIENT_A  := $(BUILD)/libradiance.a
LIB_CLIENT_SO := $(BUILD)/libradiance.so.0
RADIANCED  := $(BUILD)/radianced
RADIANCECTL:= $(BUILD)/radiancectl
EXTRA_BIN  := $(patsubst %.c,$(BUILD)/%,$(wildcard bench/*.c tools/*.c examples/*.c))

# The per-GPU template units are made from the single-daemon ones
# (systemd/instance-*.sed), so the hardening is written once.
INSTALL_BIN := $(RADIANCED) $(RADIANCECTL) $(LIB_CLIENT_A) $(LIB_CLIENT_SO)
UNITS := $(BUILD)/systemd/radianced.service $(BUILD)/systemd/radianced.socket \
         $(BUILD)/systemd/radianced@.service $(BUILD)/systemd/radianced@.socket \
         $(BUILD)/systemd/radiance-metrics.service $(BUILD)/systemd/radiance-metrics.timer
.PHONY: all bin deps check demo install clean gpu-check-code
# `all` comes first: plain `make` builds the tests and examples the README runs
all: $(RADIANCED) $(RADIANCECTL) $(LIB_CLIENT_A) $(LIB_CLIENT_SO) $(BUILD)/radiance.pc $(UNITS) \
     $(TEST_BIN) $(EXTRA_BIN) $(GPU_CLIENT_TARGETS)

# what `make install` installs, without the tests (debian/rules builds this)
bin: $(INSTALL_BIN) $(BUILD)/radiance.pc $(UNITS) $(GPU_CLIENT_TARGETS)

$(PROTO_C) $(PROTO_H) &: proto/radiance.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen $<

$(BUILD)/obj/gen/radiance.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Wno-error -c $< -o $@

$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/kernels/%.gpu.o: kernels/%.hip $(wildcard kernels/*.h)
	@mkdir -p $(dir $@)
	$(GPU_CXX) -c $< -o $@

gpu-check-code:
	@sh tools/gpu-compile-check.sh

$(LIB_COMMON): $(COMMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_CORE): $(CORE_OBJ) $(GPU_OBJS)
	@rm -f $@
	ar rcs $@ $^

LINK_CORE = $(LIB_CORE) $(LIB_COMMON) $(DEP_LIBS) $(GPU_LIBS)

$(RADIANCED): $(BUILD)/obj/daemon/main.o $(LIB_CORE) $(LIB_COMMON)
	$(CC) $(SANFLAGS) $(LDFLAGS) -o $@ $< $(LINK_CORE)

# The client library exports radiance_* only: its header marks them default
# visibility, everything else is hidden, and client/libradiance.sym takes
# radiance_* by pattern (the protobuf-c names are rdw__*).
$(LIB_CLIENT_A): $(CLIENT_OBJ) $(COMMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_CLIENT_SO): $(CLIENT_OBJ) $(LIB_COMMON) client/libradiance.sym
ifeq ($(STATIC_DEPS),1)
	@echo "note: STATIC_DEPS=1: libradiance.so links the shared libprotobuf-c and libjansson (static archives are not PIC); libradiance.a carries no such dependency"
endif
	$(CC) $(SANFLAGS) $(LDFLAGS) -shared -Wl,-soname,libradiance.so.0 -Wl,--version-script=client/libradiance.sym \
		-Wl,--as-needed -o $@ $(CLIENT_OBJ) $(LIB_COMMON) $(CLIENT_SO_LIBS)
	ln -sf libradiance.so.0 $(BUILD)/libradiance.so

$(RADIANCECTL): $(BUILD)/obj/client/radiancectl.o $(LIB_CLIENT_A)
	$(CC) $(SANFLAGS) $(LDFLAGS) -o $@ $< $(LIB_CLIENT_A) $(DEP_LIBS)

# radiance.pc for PREFIX/LIBDIR/INCLUDEDIR as given to this make run: `make
# install` writes it anew (the one in $(BUILD) is for the prefix of the build).
PC_SED = sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|; s|@VERSION@|$(VERSION)|'
UNIT_SED = sed -e 's|@SBINDIR@|$(SBINDIR)|g; s|@BINDIR@|$(BINDIR)|g; s|@SYSCONFDIR@|$(SYSCONFDIR)|g'
$(BUILD)/radiance.pc: client/radiance.pc.in
	@mkdir -p $(dir $@)
	$(PC_SED) $< > $@

# The .a holds client/gpu/ and the kernels (its users link libradiance and the
# vendor runtime themselves: pkg-config --static); the .so links them in and
# exports radiance_gpu_* only.
$(LIB_GPU_A): $(GPU_CLIENT_OBJ) $(GPU_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIB_GPU_SO): $(GPU_CLIENT_OBJ) $(GPU_OBJS) $(LIB_CLIENT_SO) client/gpu/libradiance-gpu.sym
	$(CC) $(SANFLAGS) -shared -Wl,-soname,libradiance-gpu.so.0 \
		-Wl,--version-script=client/gpu/libradiance-gpu.sym -o $@ $(GPU_CLIENT_OBJ) $(GPU_OBJS) \
		-L$(BUILD) -l:libradiance.so.0 $(GPU_LIBS)
	ln -sf libradiance-gpu.so.0 $(BUILD)/libradiance-gpu.so

$(BUILD)/radiance-gpu.pc: client/gpu/radiance-gpu.pc.in
	@mkdir -p $(dir $@)
	$(PC_SED) -e 's|@GPU@|$(GPU)|' $< > $@

# Tests link everything (core, client, common) plus cmocka.
# (GPU builds: with libradiance-gpu's objects, for test_gpu_map and bench_mapped.)
$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(GPU_CLIENT_OBJ) $(LIB_CORE) $(LIB_CLIENT_A) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -o $@ $< $(GPU_CLIENT_OBJ) $(LIB_CORE) $(LIB_CLIENT_A) $(LIB_COMMON) -lcmocka $(DEP_LIBS) $(GPU_LIBS)

$(EXTRA_BIN): $(BUILD)/%: $(BUILD)/obj/%.o $(GPU_CLIENT_OBJ) $(LIB_CORE) $(LIB_CLIENT_A) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -o $@ $< $(GPU_CLIENT_OBJ) $(LIB_CORE) $(LIB_CLIENT_A) $(LIB_COMMON) $(DEP_LIBS) $(GPU_LIBS)

deps:
	@sh tools/install-deps.sh

check: deps
	$(MAKE) all
	@BUILD=$(BUILD) sh tests/run.sh

demo: deps
	$(MAKE) all
	@BUILD=$(BUILD) sh tools/demo.sh

.PHONY: units
units: $(UNITS)
$(BUILD)/systemd/radianced.service: systemd/radianced.service
	@mkdir -p $(dir $@)
	$(UNIT_SED) $< > $@
$(BUILD)/systemd/radiance-metrics.service: systemd/radiance-metrics.service
	@mkdir -p $(dir $@)
	$(UNIT_SED) $< > $@
$(BUILD)/systemd/radianced.socket $(BUILD)/systemd/radiance-metrics.timer: $(BUILD)/systemd/%: systemd/%
	@mkdir -p $(dir $@)
	cp $< $@
$(BUILD)/systemd/radianced@.service: systemd/radianced.service systemd/instance-service.sed
	@mkdir -p $(dir $@)
	sed -f systemd/instance-service.sed $< | $(UNIT_SED) > $@
$(BUILD)/systemd/radianced@.socket: systemd/radianced.socket systemd/instance-socket.sed
	@mkdir -p $(dir $@)
	sed -f systemd/instance-socket.sed $< > $@

# Installs only what it names; nothing is written outside $(DESTDIR). The
# units and radiance.pc are generated here for the directories of this run,
# so `make && make install PREFIX=/usr` installs /usr paths.
install: $(INSTALL_BIN) $(GPU_CLIENT_TARGETS)
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(SYSCONFDIR)/radiance
	install -m 0755 $(RADIANCED) $(DESTDIR)$(SBINDIR)/radianced
	install -m 0755 $(RADIANCECTL) $(DESTDIR)$(BINDIR)/radiancectl
	install -m 0644 $(LIB_CLIENT_A) $(DESTDIR)$(LIBDIR)/libradiance.a
	install -m 0644 $(LIB_CLIENT_SO) $(DESTDIR)$(LIBDIR)/libradiance.so.0
	ln -sf libradiance.so.0 $(DESTDIR)$(LIBDIR)/libradiance.so
	install -m 0644 client/radiance.h $(DESTDIR)$(INCLUDEDIR)/radiance.h
	$(PC_SED) client/radiance.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/radiance.pc
ifneq ($(GPU),)
	install -m 0644 $(LIB_GPU_A) $(DESTDIR)$(LIBDIR)/libradiance-gpu.a
	install -m 0755 $(LIB_GPU_SO) $(DESTDIR)$(LIBDIR)/libradiance-gpu.so.0
	ln -sf libradiance-gpu.so.0 $(DESTDIR)$(LIBDIR)/libradiance-gpu.so
	install -m 0644 client/radiance_gpu.h $(DESTDIR)$(INCLUDEDIR)/radiance_gpu.h
	$(PC_SED) -e 's|@GPU@|$(GPU)|' client/gpu/radiance-gpu.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/radiance-gpu.pc
endif
	$(UNIT_SED) systemd/radianced.service > $(DESTDIR)$(UNITDIR)/radianced.service
	install -m 0644 systemd/radianced.socket $(DESTDIR)$(UNITDIR)/radianced.socket
	sed -f systemd/instance-service.sed systemd/radianced.service | $(UNIT_SED) \
		> $(DESTDIR)$(UNITDIR)/radianced@.service
	sed -f systemd/instance-socket.sed systemd/radianced.socket > $(DESTDIR)$(UNITDIR)/radianced@.socket
	$(UNIT_SED) systemd/radiance-metrics.service > $(DESTDIR)$(UNITDIR)/radiance-metrics.service
	install -m 0644 systemd/radiance-metrics.timer $(DESTDIR)$(UNITDIR)/radiance-metrics.timer
	install -m 0644 systemd/radiance.sysusers $(DESTDIR)$(SYSUSERSDIR)/radiance.conf
	install -m 0644 systemd/radiance.tmpfiles $(DESTDIR)$(TMPFILESDIR)/radiance.conf
	test -e $(DESTDIR)$(SYSCONFDIR)/radiance/radianced.conf || \
		install -m 0644 systemd/radianced.conf $(DESTDIR)$(SYSCONFDIR)/radiance/radianced.conf

# Every documented option combination this machine can build
# (tests/build_matrix.sh; each in its own build directory). Takes minutes.
.PHONY: check-build-matrix check-deb
check-build-matrix: deps
	@sh tests/build_matrix.sh

# The Debian packages built, linted, installed and used in a Debian 12
# container booted with systemd-nspawn (tests/deb_check.sh; root, network).
check-deb:
	@sh tests/deb_check.sh

# Chaos at scale against one daemon (tests/chaos.py, docs/daemon.md "Chaos
# test"): CLIENTS killed clients; SECONDS overrides the well-behaved wait bound.
CLIENTS ?= 1000
.PHONY: chaos
chaos: deps
	$(MAKE) all
	@sh tools/pyenv.sh $(BUILD)/pyenv
	PYTHONPATH=python RADIANCE_BUILD=$(BUILD) RADIANCE_LIBRARY=$(BUILD)/libradiance.so.0 \
		$(BUILD)/pyenv/bin/python tests/chaos.py --clients $(CLIENTS) $(if $(SECONDS),--seconds $(SECONDS))

clean:
	rm -rf build build-*

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- fuzzing (docs/fuzzing.md) ---------------------------------------------
#   make fuzz                      libFuzzer targets, clang + ASan + UBSan:
#                                  $(BUILD)/fuzz/fuzz_<name> for tests/fuzz/fuzz_<name>.c
#   make fuzz-run FUZZ_SECONDS=30  each target that long on its corpus (FUZZ_TARGETS
#                                  picks some, FUZZ_ARGS adds libFuzzer flags)
# The same targets linked with tests/fuzz/replay.c instead of libFuzzer, with
# the normal $(CC) and $(SANFLAGS), are $(BUILD)/fuzz-replay/fuzz_<name>: built
# by `all`, they replay the seed corpora tests/fuzz/corpus/ in make check
# (tests/test_fuzz_corpus.sh).
FUZZ_CC      ?= clang-19
FUZZ_SAN     ?= address,undefined
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_RSS_MB  ?= 2048
FUZZ_ARGS    ?=
# UBSan check kinds built recoverable, so tests/fuzz/ubsan-known.supp can
# suppress known findings during fuzz-run (UBSAN_OPTIONS halt_on_error=1
# keeps every other report fatal). Empty: everything fatal, no suppression.
FUZZ_RECOVER ?= pointer-overflow,nonnull-attribute
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES   := $(patsubst tests/fuzz/%.c,%,$(FUZZ_SRC))
FUZZ_TARGETS ?= $(FUZZ_NAMES)
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_BIN     := $(addprefix $(FUZZ_DIR)/,$(FUZZ_NAMES))
FUZZ_REPLAY  := $(addprefix $(BUILD)/fuzz-replay/,$(FUZZ_NAMES))
FUZZ_LIB     := $(FUZZ_DIR)/libradiance-fuzz.a
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(COMMON_SRC) $(CORE_SRC) $(CLIENT_SRC)) \
                $(FUZZ_DIR)/obj/gen/radiance.pb-c.o
# Product code is instrumented for coverage (fuzzer-no-link) as well as the
# targets; no GPU backend: the targets use the CPU one.
FUZZ_CFLAGS   = -std=c11 $(WARN) $(INC) $(DEFS) $(PKG_CFLAGS) -g -O1 -fno-omit-frame-pointer \
                -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -fno-sanitize-recover=all \
                $(if $(FUZZ_RECOVER),-fsanitize-recover=$(FUZZ_RECOVER))

.PHONY: fuzz fuzz-deps fuzz-run
.SECONDARY: $(patsubst tests/fuzz/%.c,$(BUILD)/obj/tests/fuzz/%.o,$(FUZZ_SRC) tests/fuzz/replay.c) \
            $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/obj/tests/fuzz/%.o,$(FUZZ_SRC))
all: $(FUZZ_REPLAY)

fuzz-deps:
	@RADIANCE_DEPS_FUZZ=1 sh tools/install-deps.sh

fuzz: fuzz-deps
	$(MAKE) $(FUZZ_BIN)

$(FUZZ_DIR)/obj/gen/radiance.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Wno-error -c $< -o $@

$(FUZZ_DIR)/obj/kernels/cpu_avx2.o: FUZZ_CFLAGS += $(SIMD_AVX2)
$(FUZZ_DIR)/obj/kernels/cpu_avx512.o: FUZZ_CFLAGS += $(SIMD_AVX512)

$(FUZZ_DIR)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LIB)
	$(FUZZ_CC) -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $< $(FUZZ_LIB) $(DEP_LIBS)

$(BUILD)/fuzz-replay/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(BUILD)/obj/tests/fuzz/replay.o \
			     $(LIB_CORE) $(LIB_CLIENT_A) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -o $@ $< $(BUILD)/obj/tests/fuzz/replay.o $(LIB_CORE) $(LIB_CLIENT_A) \
		$(LIB_COMMON) $(DEP_LIBS) $(GPU_LIBS)

# New inputs go to $(FUZZ_DIR)/corpus/<target> (the seeds in tests/fuzz/corpus
# are read, never written); crashes to $(FUZZ_DIR)/artifacts/<target>/.
fuzz-run: fuzz
	@status=0; for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts/$$t; \
		dict=; [ -f tests/fuzz/$$t.dict ] && dict=-dict=tests/fuzz/$$t.dict; \
		echo "== $$t: $(FUZZ_SECONDS) s"; \
		UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=tests/fuzz/ubsan-known.supp \
		$(FUZZ_DIR)/$$t -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) \
			-rss_limit_mb=$(FUZZ_RSS_MB) -print_final_stats=1 $$dict \
			-artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ $(FUZZ_ARGS) \
			$(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t || status=1; \
	done; exit $$status

-include $(shell find $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)
