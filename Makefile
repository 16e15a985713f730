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
NPROC    := $(shell nproc 2>/dev/null || echo 2)

DEB_PKGS := build-essential pkg-config libgrpc-dev libprotobuf-c-dev protobuf-c-compiler \
            libuv1-dev libcmocka-dev libze-dev libtorch-dev python3-torch python3-pytest python3-yaml \
            libsystemd-dev libjansson-dev libinih-dev libssl-dev libseccomp-dev openssl clang-format cppcheck clang-tidy procps \
            libmicrohttpd-dev flake8
PC_PKGS  := grpc libprotobuf-c libuv jansson inih libsystemd libcrypto libseccomp
# libmicrohttpd serves /metrics (daemon/metrics.c). Optional: where pkg-config does not find it,
# graphd still builds, and refuses to start with a non-empty metrics_listen.
ifneq ($(shell pkg-config --exists libmicrohttpd 2>/dev/null && echo yes),)
PC_PKGS  += libmicrohttpd
MHD_DEFS := -DGD_HAVE_MHD
endif

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
# XPU family (graph_runtime/family_xpu.cpp): when that torch has XPU (torch.version.xpu), its
# ATen/xpu headers, libtorch_xpu, and the SYCL headers its XPU headers include (beside torch's, or
# SYCL_INC). Never compiled yet: no XPU libtorch has been reachable (docs/XPU.md).
SYCL_INC     ?= $(patsubst %/sycl/,%,$(firstword $(dir $(wildcard $(TORCH_DIR)/include/sycl/sycl.hpp /opt/intel/oneapi/compiler/latest/include/sycl/sycl.hpp))))
TORCH_XPU    := $(if $(SYCL_INC),$(shell $(PYTHON) -c 'import os,torch;d=os.path.dirname(torch.__file__);print("yes" if getattr(torch.version,"xpu",None) and os.path.isdir(d+"/include/ATen/xpu") and os.path.exists(d+"/lib/libtorch_xpu.so") else "")' 2>/dev/null))
ifneq ($(TORCH_XPU),)
TORCH_CFLAGS += -DGR_HAVE_XPU -isystem $(SYCL_INC)
TORCH_LIBS   += -ltorch_xpu -lc10_xpu
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
               -DGRAPHD_VERSION='"$(VERSION)"' $(MHD_DEFS) $(INCLUDES) $(PC_CFLAGS) $(SANFLAGS) $(CFLAGS)
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
ifeq ($(TORCH_XPU),)
GR_CXXSRC  := $(filter-out graph_runtime/family_xpu.cpp,$(GR_CXXSRC))
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

.PHONY: all deps deps-check test unit integration python-test asan demo install uninstall format lint bench clean \
        help cuda-check
MAN_PAGES := $(BUILD)/man/graphd.8 $(BUILD)/man/graphd.conf.5 $(BUILD)/man/graphctl.1
all: $(BUILD)/graphd $(BUILD)/graphd-executor $(SOCLI) $(BUILD)/graphctl $(MAN_PAGES) $(UNIT_BIN) $(INTEG_BIN) $(BENCH_BIN) \
     $(BUILD)/bench/eacces_log.so $(ZE_DRV) $(ZE_DRV_BAD) $(ZE_TEST)

help:
	@echo "make deps      install the Debian packages graphd needs (root)"
	@echo "make           build everything into $(BUILD)/"
	@echo "make test      run every test (unit, integration, python)"
	@echo "make asan      the same tests under AddressSanitizer + UBSan (build-asan/)"
	@echo "make demo      build, start a daemon on the CPU device, show it working"
	@echo "make install   install under PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)"
	@echo "make uninstall remove exactly what make install installed there"
	@echo "make format / make lint / make bench / make clean"
	@echo "make cuda-check CUDA_HEADERS=dir   compile-check the CUDA family without a GPU (below)"

# `make test` and `make asan` only check the packages (deps-check never installs anything);
# `make deps` (and `make demo`, the newcomer's first command) installs what is missing.
deps-check:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then echo "missing Debian packages:$$missing; run 'make deps' (as root) first" >&2; exit 1; fi

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
# The Level Zero tests share tests/ze_driver/ze_test_util.c (loader modes, roles, fd passing).
ZE_UTIL := $(BUILD)/obj/tests/ze_driver/ze_test_util.o
$(BUILD)/tests/unit/test_ze_layer $(BUILD)/tests/unit/test_client_xpu: $(ZE_UTIL)
$(BUILD)/tests/integration/test_xpu $(BUILD)/tests/integration/test_xpu_client: $(ZE_UTIL)

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
$(ZE_TEST): $(BUILD)/obj/tests/ze_driver/test_ze_loader.o $(ZE_UTIL) | $(ZE_DRV) $(ZE_DRV_BAD)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $(filter %.o,$^) -lze_loader $(LDLIBS_ALL) -lcmocka

test: deps-check
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/run_tests.sh

asan: deps-check
	@$(MAKE) --no-print-directory BUILD=build-asan SAN=1 CFLAGS="-O1 -g" CXXFLAGS="-O1 -g" all
	@BUILD=build-asan PYTHON=$(PYTHON) SAN=1 tests/run_tests.sh

demo: deps
	@echo "== building graphd (make -j$(NPROC) all; log in $(BUILD)/make.log)"
	@mkdir -p $(BUILD) && $(MAKE) --no-print-directory -j$(NPROC) all >$(BUILD)/make.log 2>&1 || \
	  { tail -30 $(BUILD)/make.log; echo "demo: the build failed (whole log: $(BUILD)/make.log)" >&2; exit 1; }
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/demo.sh

bench: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) bench/run.sh

# Man pages from the programs' own --help (the settings table), so they cannot drift.
$(MAN_PAGES) &: docs/man/mkman.py $(BUILD)/graphd $(BUILD)/graphctl VERSION
	$(call say,MAN,$(BUILD)/man)$(PYTHON) docs/man/mkman.py $(BUILD) $(BUILD)/man $(VERSION)

# make install / make uninstall. install records every file it writes, as installed, in
# $(PREFIX)/share/graphd/installed-files; uninstall removes exactly those (and the directories
# that are then empty), so a config file that was already there is never touched.
LIBDIR    ?= $(PREFIX)/lib
SONAME    := libgraphd.so.0
SOREAL    := libgraphd.so.$(VERSION)
MANIFEST  := $(PREFIX)/share/graphd/installed-files
INSTALL_DOCS := README.md LICENSE $(wildcard docs/*.md) client/python/README.md
$(BUILD)/graphd.pc: Makefile VERSION
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$${prefix}/include' '' \
	  'Name: graphd' 'Description: client library of graphd, graph capture and replay as a service' \
	  'Version: $(VERSION)' 'Requires.private: grpc libprotobuf-c jansson' \
	  'Libs: -L$${libdir} -lgraphd' 'Cflags: -I$${includedir}' > $@
install: $(BUILD)/graphd $(BUILD)/graphd-executor $(SOCLI) $(BUILD)/graphctl $(BUILD)/graphd.pc $(MAN_PAGES)
	@set -e; d='$(DESTDIR)'; m=$$(mktemp); \
	put() { mode=$$1; src=$$2; dst=$$3; install -D -m $$mode "$$src" "$$d$$dst"; echo "$$dst" >> $$m; }; \
	put 755 $(BUILD)/graphd $(PREFIX)/sbin/graphd; \
	put 755 $(BUILD)/graphd-executor $(PREFIX)/libexec/graphd/graphd-executor; \
	put 755 $(BUILD)/graphctl $(PREFIX)/bin/graphctl; \
	strip --strip-unneeded "$$d$(PREFIX)/sbin/graphd" "$$d$(PREFIX)/libexec/graphd/graphd-executor" \
	  "$$d$(PREFIX)/bin/graphctl"; \
	put 644 $(SOCLI) $(LIBDIR)/$(SOREAL); strip --strip-unneeded "$$d$(LIBDIR)/$(SOREAL)"; \
	ln -sfn $(SOREAL) "$$d$(LIBDIR)/$(SONAME)"; echo $(LIBDIR)/$(SONAME) >> $$m; \
	ln -sfn $(SONAME) "$$d$(LIBDIR)/libgraphd.so"; echo $(LIBDIR)/libgraphd.so >> $$m; \
	put 644 $(BUILD)/graphd.pc $(LIBDIR)/pkgconfig/graphd.pc; \
	put 644 client/c/graphd.h $(PREFIX)/include/graphd.h; \
	put 644 proto/graphd_frame.h $(PREFIX)/include/graphd_frame.h; \
	for f in $(INSTALL_DOCS); do put 644 $$f $(PREFIX)/share/doc/graphd/$$f; done; \
	for f in $(MAN_PAGES); do put 644 $$f $(PREFIX)/share/man/man$${f##*.}/$${f##*/}; done; \
	if [ ! -e "$$d/etc/graphd/graphd.conf" ]; then put 644 deploy/systemd/graphd.conf /etc/graphd/graphd.conf; fi; \
	sed -e 's|@SBINDIR@|$(PREFIX)/sbin|' -e 's|@DOCDIR@|$(PREFIX)/share/doc/graphd|' \
	  deploy/systemd/graphd.service > $$m.unit; \
	put 644 $$m.unit /lib/systemd/system/graphd.service; rm -f $$m.unit; \
	put 644 deploy/systemd/graphd.socket /lib/systemd/system/graphd.socket; \
	put 644 deploy/systemd/graphd-sysusers.conf /usr/lib/sysusers.d/graphd.conf; \
	echo $(MANIFEST) >> $$m; install -D -m 644 $$m "$$d$(MANIFEST)"; rm -f $$m; \
	echo "installed $$(wc -l < "$$d$(MANIFEST)") files under $${d:-/} (list: $(MANIFEST))"
	$(if $(DESTDIR),,ldconfig)

uninstall:
	@set -e; d='$(DESTDIR)'; m="$$d$(MANIFEST)"; \
	[ -f "$$m" ] || { echo "uninstall: $$m not found: nothing installed under PREFIX=$(PREFIX)" >&2; exit 1; }; \
	n=0; while read -r f; do rm -f "$$d$$f"; n=$$((n + 1)); \
	  dir=$$(dirname "$$d$$f"); while [ "$$dir" != "$${d:-/}" ] && [ "$$dir" != / ] && rmdir "$$dir" 2>/dev/null; do \
	    dir=$$(dirname "$$dir"); done; \
	done < "$$m"; echo "removed $$n files"
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
	flake8 client/python tests/python bench docs/man
	@if [ -d "$(CUDA_HEADERS)/torch_include" ]; then \
	  echo "  TIDY   graph_runtime/family_cuda.cpp (CUDA_HEADERS=$(CUDA_HEADERS))"; \
	  clang-tidy --quiet graph_runtime/family_cuda.cpp -- -std=c++17 -DGR_HAVE_CUDA $(INCLUDES) \
	    -isystem $(CUDA_HEADERS)/torch_include -isystem $(CUDA_HEADERS)/torch_include/torch/csrc/api/include \
	    -isystem $(CUDA_HEADERS)/cuda_include; \
	else echo "  SKIP   clang-tidy of graph_runtime/family_cuda.cpp: set CUDA_HEADERS (see make cuda-check)"; fi

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

# Objects made on the way to a test or bench binary are kept (make would delete them as
# intermediate files, so that every later build compiled them again).
.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
