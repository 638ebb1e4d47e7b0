# qforge build. `make` builds the library, the CLI and the tests; `make test` runs the suite;
# `make asan` builds and runs it again under AddressSanitizer + UBSan; `make fuzz` builds the
# libFuzzer harnesses (clang). Every .c under src/ is part of libqforge; every tests/test_*.c is
# one test binary; every tools/*.c is part of the CLI; every bench/*.c with a main is a benchmark.

CC       ?= cc
BUILD    ?= build
PREFIX   ?= /usr/local
VERSION  := 0.1.0
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wformat=2 -Wvla -Wno-format-truncation -Wno-format-nonliteral
CSTD     := -std=c11 -D_GNU_SOURCE
OPT      ?= -O2 -g
SANFLAGS ?=
CPPFLAGS := -Iinclude -Isrc -DQF_VERSION='"$(VERSION)"'
# -fvisibility=hidden: libqforge.so exports only what include/qforge/ marks QF_API (qforge/api.h).
CFLAGS   := $(CSTD) $(WARN) $(OPT) $(SANFLAGS) -fPIC -fvisibility=hidden -pthread
LDLIBS   := -lpcre2-8 -lcbor -lcrypto -lcurl -ljansson -lxxhash -ldl -lpthread -lm
LDFLAGS  := $(SANFLAGS) -pthread
# OpenBLAS is not linked: src/kernels/blas.c loads it on first use (dlopen, libc), so that it
# starts no threads of its own and an address-space limit is an error, not a hang.

# Files named *_avx2.c hold the AVX2/FMA/F16C kernels; they are dispatched at run time.
AVX2FLAGS := -mavx2 -mfma -mf16c
# Files named *_avx512.c hold the AVX-512 (F/BW/VL/VNNI) kernels, dispatched at run time too.
AVX512FLAGS := $(AVX2FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512vnni

LIB_SRC   := $(sort $(wildcard src/util/*.c src/format/*.c src/kernels/*.c src/kernels/cuda/*.c src/text/*.c src/engine/*.c src/eval/*.c src/forge/*.c))
TOOL_SRC  := $(sort $(wildcard tools/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TESTLIB_SRC := $(sort $(filter-out $(TEST_SRC),$(wildcard tests/*.c)))
BENCH_SRC := $(sort $(wildcard bench/*.c))

# CUDA backend: a plugin, $(BUILD)/libqforge-cuda.so, built only when nvcc is present
# (QF_NO_CUDA=1 turns it off). It alone links cudart and cuBLAS; libqforge dlopen()s it at the
# first GPU use (src/kernels/cuda/cuda_loader.c), so nothing else maps the CUDA libraries.
# CUDA_ARCH: the GPUs to build for, `native` (the GPU of this machine) or a list of sm_XY
# (default sm_90, the H200; `make CUDA_ARCH="sm_80 sm_90"` builds both).
NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA_SRC := $(sort $(wildcard src/kernels/cuda/*.cu))
CUDA_ARCH ?= sm_90
ifeq ($(CUDA_ARCH),native)
  CUDA_ARCH_FLAGS := -arch=native
else
  CUDA_ARCH_FLAGS := $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(patsubst sm_%,%,$(a)),code=$(a))
endif
ifeq ($(QF_NO_CUDA),1)
  NVCC :=
endif
ifneq ($(and $(NVCC),$(CUDA_SRC)),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
  CUDA_PLUGIN := $(BUILD)/libqforge-cuda.so
endif
CUDA_HDR := $(wildcard src/kernels/cuda/*.cuh src/kernels/cuda/*.h) src/format/quant_blocks.h src/kernels/canon.h $(wildcard include/qforge/*.h)

# Open MPI (docs/mpi.md): only when pkg-config finds ompi-c (QF_NO_MPI=1 turns it off). Only
# src/util/mpi.c sees MPI; everything else goes through qforge/mpi.h and util/par.h.
ifneq ($(QF_NO_MPI),1)
  MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
  MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null)
endif
ifneq ($(MPI_LIBS),)
  LDLIBS += $(MPI_LIBS)
$(BUILD)/obj/src/util/mpi.o: CPPFLAGS += -DQF_HAVE_MPI $(MPI_CFLAGS)
endif

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/obj/%.o)
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all lib cli tests bench test asan fuzz install clean
all: lib cli tests bench

lib: $(BUILD)/libqforge.a $(BUILD)/libqforge.so $(BUILD)/qforge.pc $(CUDA_PLUGIN)
cli: $(BUILD)/qforge
tests: $(TEST_BIN)
bench: $(BENCH_BIN)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(AVX2FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(AVX512FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 -Iinclude -Isrc $(CUDA_ARCH_FLAGS) -Werror all-warnings -Xcompiler -fPIC,-fvisibility=hidden -c $< -o $@

# the decode matvec chain experiment (bench/gpu_matvec_chain.cu, docs/gpu.md "Session 18"): a
# standalone CUDA program, built on request only (needs nvcc; not part of `all` or `bench`)
$(BUILD)/bench/gpu_matvec_chain: bench/gpu_matvec_chain.cu src/kernels/cuda/cuda_norm.cu $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 -Iinclude -Isrc $(CUDA_ARCH_FLAGS) -Werror all-warnings -o $@ $<

$(CUDA_PLUGIN): $(CUDA_OBJ)
	$(NVCC) -shared $(CUDA_ARCH_FLAGS) -o $@ $^ -L$(CUDA_HOME)/lib64 -lcublas -lcudart -Xlinker -rpath,$(CUDA_HOME)/lib64

# the loader looks for the plugin in the install folder too
$(BUILD)/obj/src/kernels/cuda/cuda_loader.o: CPPFLAGS += -DQF_PLUGIN_DIR='"$(PREFIX)/lib"'

# The commit is compiled into version.o alone, which is rebuilt whenever the commit changes.
GIT_STAMP := $(BUILD)/git-commit
$(shell mkdir -p $(BUILD) && (echo '$(GIT_COMMIT)' | cmp -s - $(GIT_STAMP) || echo '$(GIT_COMMIT)' > $(GIT_STAMP)))
$(BUILD)/obj/src/util/version.o: $(GIT_STAMP)
$(BUILD)/obj/src/util/version.o: CPPFLAGS += -DQF_GIT_COMMIT='"$(GIT_COMMIT)"'

$(BUILD)/libqforge.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libqforge.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

# pkg-config file for PREFIX (written again by `make install` for the PREFIX given there)
define QF_PC
prefix=$(1)
libdir=$${prefix}/lib
includedir=$${prefix}/include

Name: qforge
Description: LLM inference engine and certified compression forge
Version: $(VERSION)
Libs: -L$${libdir} -lqforge
Libs.private: $(LDLIBS)
Cflags: -I$${includedir}
endef
export QF_PC_TEXT = $(call QF_PC,$(PREFIX))

$(BUILD)/qforge.pc: Makefile
	@mkdir -p $(BUILD)
	@printf '%s\n' "$$QF_PC_TEXT" > $@

$(BUILD)/qforge: $(TOOL_OBJ) $(BUILD)/libqforge.a
	$(CC) $(LDFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libqforge.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TESTLIB_OBJ) $(BUILD)/libqforge.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) $(BUILD)/libqforge.a $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/libqforge.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libqforge.a $(LDLIBS)

# The suite: every test binary, then the CLI end-to-end checks; one closing line.
test: all
	@QF_BUILD=$(BUILD) tests/run.sh

asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
		SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" QF_NO_CUDA=1 test

# libFuzzer harnesses (clang): fuzz/fuzz_*.c, linked with the library sources built once into
# build-fuzz/libqforge.a with -fsanitize=fuzzer-no-link so the reader and tokenizer are
# coverage-instrumented. clang 14 rejects __builtin_cpu_supports("f16c"), so the fuzz build
# defines it away: fuzzing runs the scalar kernels, which is what it should reach anyway.
# The fuzz build is CPU-only (no -DQF_HAVE_CUDA: the harnesses link no CUDA objects).
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=build-fuzz/%)
FUZZ_CC  ?= clang
FUZZ_FLAGS := $(CSTD) $(filter-out -DQF_HAVE_CUDA,$(CPPFLAGS)) -O1 -g -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined \
	'-D__builtin_cpu_supports(x)=0'
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=build-fuzz/obj/%.o)
fuzz: $(FUZZ_BIN)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(AVX2FLAGS) -MMD -MP -c $< -o $@
# The AVX-512 kernels are never dispatched here (__builtin_cpu_supports is 0) but must link:
# compiled with their ISA flags and without sanitizers or coverage (clang 14 spends many CPU
# minutes on gemm_avx512.c under ASan + UBSan, and fuzzing cannot reach the code anyway).
build-fuzz/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CSTD) $(filter-out -DQF_HAVE_CUDA,$(CPPFLAGS)) -O1 -g '-D__builtin_cpu_supports(x)=0' \
		$(AVX512FLAGS) -MMD -MP -c $< -o $@
build-fuzz/libqforge.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
build-fuzz/%: fuzz/%.c build-fuzz/libqforge.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $< build-fuzz/libqforge.a -o $@ $(LDLIBS)

install: lib cli
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/qforge $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(BUILD)/libqforge.a $(BUILD)/libqforge.so $(DESTDIR)$(PREFIX)/lib/
	$(if $(CUDA_PLUGIN),install -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/)
	install -m 644 include/qforge/*.h $(DESTDIR)$(PREFIX)/include/qforge/
	install -m 755 $(BUILD)/qforge $(DESTDIR)$(PREFIX)/bin/
	printf '%s\n' "$$QF_PC_TEXT" > $(DESTDIR)$(PREFIX)/lib/pkgconfig/qforge.pc
	install -d $(DESTDIR)$(PREFIX)/share/qforge/corpora/kerneldoc-demo
	install -m 644 assets/corpora/kerneldoc-demo/docs.txt assets/corpora/kerneldoc-demo/SOURCES.txt $(DESTDIR)$(PREFIX)/share/qforge/corpora/kerneldoc-demo/

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
ifneq ($(filter fuzz build-fuzz/%,$(MAKECMDGOALS)),)
-include $(shell find build-fuzz/obj -name '*.d' 2>/dev/null)
endif
