# graphd build. Everything lands in $(BUILD)/; `make help` lists the targets.

BUILD    ?= build
PREFIX   ?= /usr/local
DESTDIR  ?=
CC       ?= gcc
CXX      ?= g++
PYTHON   ?= /usr/bin/python3
# debian: Debian's libtorch-dev (CPU). python: the libtorch inside $(PYTHON)'s torch package.
TORCH    ?= debian
SAN      ?=
V        ?= 0
ifeq ($(V),0)
Q    := @
say   = @printf '  %-6s %s\n' $(1) $(2);
else
Q    :=
say   =
endif

VERSION  := $(shell cat VERSION 2>/dev/null || echo 0.0.0)

DEB_PKGS := build-essential pkg-config libgrpc-dev libprotobuf-c-dev protobuf-c-compiler \
            libuv1-dev libcmocka-dev libze-dev libtorch-dev python3-torch python3-pytest \
            libsystemd-dev libjansson-dev libinih-dev libssl-dev libseccomp-dev openssl clang-format cppcheck clang-tidy procps
PC_PKGS  := grpc libprotobuf-c libuv jansson inih libsystemd libcrypto libseccomp

PC_CFLAGS = $(shell pkg-config --cflags $(PC_PKGS) 2>/dev/null)
PC_LIBS   = $(shell pkg-config --libs $(PC_PKGS) 2>/dev/null)

ifeq ($(TORCH),python)
TORCH_DIR    := $(shell $(PYTHON) -c 'import os,torch;print(os.path.dirname(torch.__file__))' 2>/dev/null)
TORCH_CFLAGS := -isystem $(TORCH_DIR)/include -isystem $(TORCH_DIR)/include/torch/csrc/api/include
TORCH_LIBS   := -L$(TORCH_DIR)/lib -Wl,-rpath,$(TORCH_DIR)/lib -ltorch -ltorch_cpu -lc10
# CUDA family (graph_runtime/family_cuda.cpp): when that torch has CUDA and its ATen/cuda headers.
# The CUDA runtime is the one the torch wheel carries (nvidia/cu13 beside the torch package).
TORCH_CUDA   := $(shell $(PYTHON) -c 'import os,torch;d=os.path.dirname(torch.__file__);print("yes" if torch.version.cuda and os.path.isdir(d+"/include/ATen/cuda") else "")' 2>/dev/null)
ifneq ($(TORCH_CUDA),)
CUDA_PY_DIR  := $(abspath $(TORCH_DIR)/../nvidia/cu13)
CUDA_INC     := $(firstword $(dir $(wildcard /usr/local/cuda/include/cuda_runtime_api.h $(CUDA_PY_DIR)/include/cuda_runtime_api.h)))
TORCH_CFLAGS += -DGR_HAVE_CUDA $(if $(CUDA_INC),-isystem $(CUDA_INC))
TORCH_LIBS   += -ltorch_cuda -lc10_cuda -L$(CUDA_PY_DIR)/lib -Wl,-rpath,$(CUDA_PY_DIR)/lib -l:libcudart.so.13
endif
else
TORCH_CFLAGS := -isystem /usr/include/torch/csrc/api/include
TORCH_LIBS   := -ltorch -ltorch_cpu -lc10
endif

ifneq ($(SAN),)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

INCLUDES := -I$(BUILD)/gen -Iproto -Ipool_manager -Igraph_runtime -Idaemon -Iclient/c
WARN     := -Wall -Wextra -Werror
CFLAGS   ?= -O2 -g
CXXFLAGS ?= -O2 -g
ALL_CFLAGS   = -std=c11 $(WARN) -Wstrict-prototypes -D_GNU_SOURCE -fPIC -MMD -MP \
               -DGRAPHD_VERSION='"$(VERSION)"' $(INCLUDES) $(PC_CFLAGS) $(SANFLAGS) $(CFLAGS)
ALL_CXXFLAGS = -std=c++17 $(WARN) -fPIC -MMD -MP $(INCLUDES) $(TORCH_CFLAGS) $(SANFLAGS) $(CXXFLAGS)
LDLIBS_ALL   = $(PC_LIBS) -lpthread -lm -ldl
LDFLAGS_ALL  = $(SANFLAGS) -Wl,--as-needed $(LDFLAGS)

GEN_C := $(BUILD)/gen/graphd.pb-c.c
GEN_H := $(BUILD)/gen/graphd.pb-c.h
GEN_O := $(BUILD)/obj/gen/graphd.pb-c.o

PM_SRC     := $(wildcard pool_manager/*.c)
GR_CSRC    := $(filter-out graph_runtime/executor.c,$(wildcard graph_runtime/*.c))
GR_CXXSRC  := $(wildcard graph_runtime/*.cpp)
ifeq ($(TORCH_CUDA),)
GR_CXXSRC  := $(filter-out graph_runtime/family_cuda.cpp,$(GR_CXXSRC))
endif
GD_SRC     := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
CLI_SRC    := $(filter-out client/c/graphctl.c,$(wildcard client/c/*.c))
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
INTEG_SRC  := $(wildcard tests/integration/test_*.c)
TESTLIB_SRC:= $(wildcard tests/lib/*.c)
# bench/eacces_log.c is an LD_PRELOAD probe (bench/exec_probe.py), a shared object of its own.
BENCH_SRC  := $(filter-out bench/eacces_log.c,$(wildcard bench/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(filter %.c,$(1))) $(patsubst %.cpp,$(BUILD)/obj/%.o,$(filter %.cpp,$(1)))

LIBPM  := $(BUILD)/libpm.a
LIBGR  := $(BUILD)/libgr.a
LIBGD  := $(BUILD)/libgd.a
LIBCLI := $(BUILD)/libgraphd.a
SOCLI  := $(BUILD)/libgraphd.so
TESTLIB:= $(BUILD)/libgdtest.a

UNIT_BIN  := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
INTEG_BIN := $(patsubst tests/integration/%.c,$(BUILD)/tests/integration/%,$(INTEG_SRC))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

RT_LIBS := $(if $(GR_CXXSRC),$(TORCH_LIBS) -lstdc++)
# The Level Zero loader, for graph_runtime/ze_layer.c (libgr). --as-needed drops it from binaries
# that reference no gr_ze_ call, so it costs CPU/CUDA-only programs nothing.
ZE_LIBS := -lze_loader

# Level Zero test driver (tests/ze_driver/): the real loader loads it through ZE_ENABLE_ALT_DRIVERS;
# nothing links it and nothing installs it. _notemp lacks one table, for the loader-refusal test.
ZE_DRV     := $(BUILD)/tests/ze_driver/libze_graphd_test.so
ZE_DRV_BAD := $(BUILD)/tests/ze_driver/libze_graphd_test_notemp.so
ZE_TEST    := $(BUILD)/tests/integration/test_ze_loader

.PHONY: all deps test unit integration python-test asan demo install format lint bench clean help \
        cuda-check
all: $(BUILD)/graphd $(BUILD)/graphd-executor $(SOCLI) $(BUILD)/graphctl $(UNIT_BIN) $(INTEG_BIN) $(BENCH_BIN) \
     $(BUILD)/bench/eacces_log.so $(ZE_DRV) $(ZE_DRV_BAD) $(ZE_TEST)

help:
	@echo "make deps      install the Debian packages graphd needs (root)"
	@echo "make           build everything into $(BUILD)/"
	@echo "make test      run every test (unit, integration, python)"
	@echo "make asan      the same tests under AddressSanitizer + UBSan (build-asan/)"
	@echo "make demo      build, start a daemon on the CPU device, show it working"
	@echo "make install   install under PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)"
	@echo "make format / make lint / make bench / make clean"
	@echo "make cuda-check CUDA_HEADERS=dir   compile-check the CUDA family without a GPU (below)"

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then echo "deps: missing:$$missing; run 'make deps' as root (or apt-get install them)" >&2; exit 1; fi; \
	echo "deps: installing$$missing"; \
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing

$(GEN_C) $(GEN_H): proto/graphd.proto
	@mkdir -p $(BUILD)/gen
	$(call say,PROTOC,$<)protoc-c --c_out=$(BUILD)/gen -Iproto proto/graphd.proto

$(BUILD)/obj/%.o: %.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(call say,CXX,$<)$(CXX) $(ALL_CXXFLAGS) -c $< -o $@

$(GEN_O): $(GEN_C)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(filter-out -Werror,$(ALL_CFLAGS)) -c $< -o $@

$(LIBPM): $(call obj,$(PM_SRC))
	@rm -f $@; ar rcs $@ $^
$(LIBGR): $(call obj,$(GR_CSRC) $(GR_CXXSRC))
	@rm -f $@; ar rcs $@ $^
$(LIBGD): $(call obj,$(GD_SRC)) $(GEN_O)
	@rm -f $@; ar rcs $@ $^
$(LIBCLI): $(call obj,$(CLI_SRC)) $(GEN_O)
	@rm -f $@; ar rcs $@ $^
$(TESTLIB): $(call obj,$(TESTLIB_SRC))
	@rm -f $@; ar rcs $@ $^ $(if $^,,/dev/null 2>/dev/null || true)

$(BUILD)/graphd: $(BUILD)/obj/daemon/main.o $(LIBGD) $(LIBGR) $(LIBPM)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS_ALL) -o $@ $^ $(RT_LIBS) $(ZE_LIBS) $(LDLIBS_ALL)

# The executor process (one per tenant uid and device): a main around libgr.
$(BUILD)/graphd-executor: $(BUILD)/obj/graph_runtime/executor.o $(LIBGR)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS_ALL) -o $@ $^ $(RT_LIBS) $(ZE_LIBS) $(LDLIBS_ALL)

$(SOCLI): $(call obj,$(CLI_SRC)) $(GEN_O)
	$(call say,LINK,$@)$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libgraphd.so.0 -o $@ $^ $(LDLIBS_ALL)
	@ln -sf libgraphd.so $(BUILD)/libgraphd.so.0 # the soname graphctl and the tests load

$(BUILD)/graphctl: $(BUILD)/obj/client/c/graphctl.o $(SOCLI)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $< -L$(BUILD) -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib' -lgraphd $(LDLIBS_ALL)

# Unit tests see every module's internals; integration tests only the public client API.
$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(LIBGD) $(LIBGR) $(LIBPM) $(LIBCLI)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS_ALL) -o $@ $^ $(RT_LIBS) $(ZE_LIBS) $(LDLIBS_ALL) -lcmocka
# test_executor spawns $(BUILD)/graphd-executor; test_ze_layer loads the test driver.
$(BUILD)/tests/unit/test_executor: | $(BUILD)/graphd-executor
$(BUILD)/tests/unit/test_cgroup: | $(BUILD)/graphd-executor
$(BUILD)/tests/unit/test_ze_layer: | $(ZE_DRV)
$(BUILD)/tests/unit/test_client_xpu: | $(ZE_DRV)

$(BUILD)/tests/integration/%: $(BUILD)/obj/tests/integration/%.o $(call obj,$(TESTLIB_SRC)) $(SOCLI)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $(filter %.o,$^) -L$(BUILD) -Wl,-rpath,'$$ORIGIN/../..' -lgraphd $(LDLIBS_ALL) -lcmocka

# test_xpu maps the daemon's xpu regions itself, through the Level Zero layer (libgr's ze_layer.o),
# and runs graphd with the test driver.
$(BUILD)/tests/integration/test_xpu: $(BUILD)/obj/tests/integration/test_xpu.o $(call obj,$(TESTLIB_SRC)) $(LIBGR) $(SOCLI) | $(ZE_DRV) $(BUILD)/graphd
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS_ALL) -o $@ $(filter %.o %.a,$^) -L$(BUILD) -Wl,-rpath,'$$ORIGIN/../..' -lgraphd $(RT_LIBS) $(ZE_LIBS) $(LDLIBS_ALL) -lcmocka

# test_xpu_client runs graphd with the test driver and maps through libgraphd's xpu row alone.
$(BUILD)/tests/integration/test_xpu_client: | $(ZE_DRV) $(BUILD)/graphd

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIBGR) $(SOCLI)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS_ALL) -o $@ $(filter %.o %.a,$^) -L$(BUILD) -Wl,-rpath,'$$ORIGIN/..' -lgraphd $(RT_LIBS) $(LDLIBS_ALL)

$(BUILD)/bench/eacces_log.so: bench/eacces_log.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -Wstrict-prototypes -fPIC -shared $(CFLAGS) -o $@ $< -ldl

# Only the table getters are exported (-fvisibility=hidden), so the driver never interposes on the
# loader's own ze* symbols. The test links the loader, never the driver.
$(ZE_DRV) $(ZE_DRV_BAD): tests/ze_driver/ze_graphd_test.c tests/ze_driver/ze_graphd_test.h
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(filter-out -MMD -MP,$(ALL_CFLAGS)) -fvisibility=hidden \
	  $(if $(filter $(ZE_DRV_BAD),$@),-DGZT_OMIT_ZES_TEMPERATURE) -shared $(LDFLAGS_ALL) -o $@ $< -lpthread
$(ZE_TEST): $(BUILD)/obj/tests/ze_driver/test_ze_loader.o | $(ZE_DRV) $(ZE_DRV_BAD)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $< -lze_loader $(LDLIBS_ALL) -lcmocka

test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/run_tests.sh

asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan SAN=1 CFLAGS="-O1 -g" CXXFLAGS="-O1 -g" all
	@BUILD=build-asan PYTHON=$(PYTHON) SAN=1 tests/run_tests.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/demo.sh

bench: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) bench/run.sh

install: $(BUILD)/graphd $(BUILD)/graphd-executor $(SOCLI) $(BUILD)/graphctl
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/graphd $(DESTDIR)$(PREFIX)/sbin/graphd
	install -m 755 $(BUILD)/graphctl $(DESTDIR)$(PREFIX)/bin/graphctl
	install -m 644 $(SOCLI) $(DESTDIR)$(PREFIX)/lib/libgraphd.so.0
	ln -sf libgraphd.so.0 $(DESTDIR)$(PREFIX)/lib/libgraphd.so
	install -m 644 client/c/graphd.h proto/graphd_frame.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)/etc/graphd $(DESTDIR)/lib/systemd/system $(DESTDIR)/usr/lib/sysusers.d $(DESTDIR)/usr/lib/tmpfiles.d
	[ -e $(DESTDIR)/etc/graphd/graphd.conf ] || install -m 644 deploy/systemd/graphd.conf $(DESTDIR)/etc/graphd/graphd.conf
	sed 's|@SBINDIR@|$(PREFIX)/sbin|' deploy/systemd/graphd.service > $(DESTDIR)/lib/systemd/system/graphd.service
	install -m 644 deploy/systemd/graphd-sysusers.conf $(DESTDIR)/usr/lib/sysusers.d/graphd.conf
	install -m 644 deploy/systemd/graphd-tmpfiles.conf $(DESTDIR)/usr/lib/tmpfiles.d/graphd.conf
	$(if $(DESTDIR),,ldconfig)

C_FILES  = $(shell git ls-files '*.c' '*.h' '*.cpp' 2>/dev/null)
format:
	clang-format -i $(C_FILES)

lint: $(GEN_H)
	clang-format --dry-run --Werror $(C_FILES)
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability --inline-suppr \
	  --suppress=missingIncludeSystem -D__GNUC__ $(INCLUDES) -I$(BUILD)/gen \
	  -DPROTOBUF_C_VERSION_NUMBER=1004001 -DPROTOBUF_C_MIN_COMPILER_VERSION=1000000 \
	  $(filter %.c,$(C_FILES))
	$(if $(GR_CXXSRC),clang-tidy --quiet $(GR_CXXSRC) -- -std=c++17 $(INCLUDES) $(TORCH_CFLAGS))

# Compile-checks (-fsyntax-only) the runtime's C++ with the CUDA family on a machine whose torch has
# no CUDA: CUDA_HEADERS holds torch_include/ (a CUDA torch's include directory) and cuda_include/
# (the CUDA toolkit's, crt/ included), copied from a machine that has them. It links nothing and
# runs nothing: a GPU run is still what says the family works.
CUDA_CHECK_SRC := $(filter-out graph_runtime/family_xpu.cpp,$(wildcard graph_runtime/*.cpp))
cuda-check:
	@test -d "$(CUDA_HEADERS)/torch_include" -a -d "$(CUDA_HEADERS)/cuda_include" || \
	  { echo "cuda-check: set CUDA_HEADERS to a directory with torch_include/ and cuda_include/" >&2; exit 2; }
	@for f in $(sort $(CUDA_CHECK_SRC)); do \
	  echo "  CHECK  $$f"; \
	  $(CXX) -std=c++17 $(WARN) -fsyntax-only -DGR_HAVE_CUDA -I$(BUILD)/gen -Iproto -Ipool_manager \
	    -Igraph_runtime -isystem $(CUDA_HEADERS)/torch_include \
	    -isystem $(CUDA_HEADERS)/torch_include/torch/csrc/api/include \
	    -isystem $(CUDA_HEADERS)/cuda_include $$f || exit 1; \
	done

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
