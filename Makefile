# amibake / fleet. `make test` and `make demo` install what they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages: sshd for the local cloud's sandboxes, sudo and passwd for its cloud-init
# emulation, curl for IMDS calls inside sandboxes, shellcheck for rendered scripts, xz for
# artifacts. Every local-cloud instance runs on this machine's CPU, whatever its family: a
# cross compiler builds the other architecture's families (arm64's on an x86_64 machine, and
# the other way round) and QEMU's user-mode emulator runs what they built (and what this CPU
# lacks the instructions for). python3-psutil is the system python3 fleet's monitor runs under
# on an instance, and chromium renders fleet's HTML report in its test. uidmap (newuidmap) maps
# a plain user's subordinate ids into the local cloud's user namespace: without root, sshd's
# privilege separation and ec2-user need more ids than the user's own. cmake builds the CMake
# projects of `amibake recipe new` (a local instance's tools are this machine's).
# docker-registry is the local cloud's ECR registry (amibake/local/registry.py); skopeo pushes and
# pulls images without a Docker daemon, umoci builds the tests' image and unpacks it on a sandbox,
# busybox-static is the POSIX shell inside that image.
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null)
CROSS_PACKAGES := $(if $(filter arm64,$(DEB_ARCH)),gcc-x86-64-linux-gnu libc6-dev-amd64-cross,gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
# apt-get waits for another apt-get (unattended upgrades on a fresh machine, a second checkout's
# make) to let go of dpkg's lock instead of failing at once (CI failed so, 2026-11-28)
APT := apt-get -o DPkg::Lock::Timeout=600
APT_PACKAGES := openssh-server sudo passwd curl shellcheck xz-utils util-linux uidmap python3-psutil \
	chromium qemu-user-static cmake docker-registry skopeo umoci busybox-static $(CROSS_PACKAGES)

.PHONY: install system-packages deb-src zstd-source lz4-source gzip-source cmark-source prices test lint demo bench ci clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f '$${db:Status-Abbrev}' $$p 2>/dev/null | grep -q '^ii' || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "make: missing Debian packages:$$missing; install them, then run make again: sudo apt-get install$$missing" >&2; \
	  exit 2; fi; \
	echo "installing Debian packages:$$missing"; \
	$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends $$missing >/dev/null

# zstd's source without internet: Debian's orig tarball of the release the recipe accepts, by
# package name, checked against the recipe's sha256 by `amibake source add`. Best effort: the
# zstd test says plainly when the source is not there.
# apt-get source needs deb-src lines: added once (as root) beside the deb ones, in either of the
# two forms Debian uses.
deb-src:
	@if [ "$$(id -u)" = 0 ] && ! grep -rqs 'deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then \
	  if [ -f /etc/apt/sources.list.d/debian.sources ]; then \
	    sed 's/^Types: deb$$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
	      > /etc/apt/sources.list.d/amibake-src.sources; \
	  elif [ -f /etc/apt/sources.list ]; then \
	    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/amibake-src.list; \
	  fi; \
	  $(APT) update -qq; fi

# $(call apt_source,SOURCE PACKAGE): its files into $$dir, of the newest version a mirror serves:
# the security archive may list a version whose files it does not serve (zstd's
# 1.5.4+dfsg2-5+deb12u1 answered 404 on 2026-12-01), while the release's, with the same orig
# tarball, is served.
apt_source = for v in $$(apt-cache showsrc $(1) 2>/dev/null | sed -n 's/^Version: //p' | sort -rV); do \
	  (cd $$dir && $(APT) source --download-only -qq $(1)=$$v >/dev/null 2>&1) && break; done
zstd-source: install deb-src
	@if $(BIN)/amibake source has zstd >/dev/null 2>&1; then exit 0; fi; \
	dir=$$(mktemp -d) && $(call apt_source,zstd); \
	$(BIN)/amibake source add $$dir/libzstd_1.5.4+dfsg2.orig.tar.xz; rm -rf $$dir; \
	$(BIN)/amibake source has zstd || echo "zstd source not available: the zstd build test will say so"

# lz4's source: the real project tests/test_source_recipes.py builds through `amibake recipe new
# --from DIR` (a user's tree, not a shipped recipe). Debian's orig tarball by package name, put in
# the source cache under its sha256 when it is the one the test names. Best effort, as
# zstd-source: the test says plainly when it is not there.
LZ4_ORIG := lz4_1.9.4.orig.tar.gz
LZ4_SHA256 := 0b0e3aa07c8c063ddf40b082bdf7e37a1562bda40a0ff5272957f3e987e0e54b
lz4-source: install deb-src
	@cache=$$($(BIN)/python -c 'from amibake.sources import cache_dir; print(cache_dir())'); \
	if [ -f "$$cache/$(LZ4_SHA256)" ]; then exit 0; fi; \
	dir=$$(mktemp -d) && $(call apt_source,lz4); \
	if [ "$$(sha256sum < $$dir/$(LZ4_ORIG) 2>/dev/null | cut -d' ' -f1)" = $(LZ4_SHA256) ]; then \
	  cp $$dir/$(LZ4_ORIG) "$$cache/$(LZ4_SHA256)"; \
	else echo "lz4 source not available: the lz4 test of recipe new will say so"; fi; rm -rf $$dir

# Real projects of each other build system tests/test_real_trees.py builds through `amibake
# recipe new` as a user's tree: gzip (autotools: GNU's release tarball, configure ready) and
# cmark (CMake). Debian's orig tarballs, put in the source cache under their sha256 when they
# are the ones the test names; best effort, as lz4-source: the test says plainly when not there.
# $(call debian_orig,SOURCE PACKAGE,ORIG TARBALL,SHA256)
define debian_orig
	@cache=$$($(BIN)/python -c 'from amibake.sources import cache_dir; print(cache_dir())'); \
	if [ -f "$$cache/$(3)" ]; then exit 0; fi; \
	dir=$$(mktemp -d) && $(call apt_source,$(1)); \
	if [ "$$(sha256sum < $$dir/$(2) 2>/dev/null | cut -d' ' -f1)" = $(3) ]; then \
	  mkdir -p "$$cache" && cp $$dir/$(2) "$$cache/$(3)"; \
	else echo "$(1) source not available: its test in tests/test_real_trees.py will say so"; fi; \
	rm -rf $$dir
endef
gzip-source: install deb-src
	$(call debian_orig,gzip,gzip_1.12.orig.tar.xz,ce5e03e519f637e1f814011ace35c4f87b33c0bbabeec35baf5fbd3479e91956)
cmark-source: install deb-src
	$(call debian_orig,cmark,cmark_0.30.2.orig.tar.gz,6c7d2bcaea1433d977d8fed0b55b71c9d045a7cdf616e3cd2dce9007da753db3)

# The EC2 price snapshot fleet and amibake ls use (amibake/catalog/prices_us-east-1.json): the
# shared reference table, and the families it leaves out that public tables of runs use
# (amibake/catalog/sources/README.md), from the same source and commit.
PRICE_TABLE ?= ../shared/data/aws_prices_us-east-1.csv
MORE_PRICES = amibake/catalog/sources/aws_prices_more_families_us-east-1.csv
prices: install
	$(BIN)/python -m fleet.prices build $(PRICE_TABLE) $(MORE_PRICES) --date 2026-11-22 \
	  --source "SkyPilot catalog catalogs/v7/aws/vms.csv, skypilot-org/skypilot-catalog at commit 001367d22a0033fac286a8c71aeac7109e431bcb"

# The suite, then its end-to-end runs (build, bake, batch, bench, tune, gc: marked e2e) against
# the local cloud answering as AWS does (eventual consistency, fleet errors, spot reclaims, ...)
# at fixed seeds. They ran twice, without faults too, until the suite neared 20 minutes on two
# cores (15 + 6); their no-fault paths are the rest of the suite's.
# TEST_WORKERS pytest-xdist workers, a test file each at a time (a module's fixtures built once),
# each worker with a local cloud of its own (tests/conftest.py). The suite mostly waits (on
# sshd, builds in sandboxes, the local cloud's AWS-like delays): run one at a time it kept
# 0.6 of one core busy. On two cores, 1351 tests without e2e (2026-12-02, each run alone):
# 16:11 with two workers, 10:56 with three (126% CPU), 10:32 with four (each test slower, 1.25x
# the test time in all); the e2e stage 4:48 with two, 4:12 with three. Three it is.
TEST_WORKERS ?= 3
FAULT_SEEDS ?= 11
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
test: install zstd-source lz4-source gzip-source cmark-source
	$(PYTEST) --durations=15 -m "not e2e"
	@for seed in $(FAULT_SEEDS); do \
	  echo "end-to-end tests under --faults aws, seed $$seed"; \
	  AMIBAKE_LOCAL_FAULTS=aws AMIBAKE_LOCAL_FAULTS_SEED=$$seed $(PYTEST) -m e2e || exit 1; done

lint: install
	$(BIN)/ruff check amibake fleet tests benchmarks
	$(BIN)/ruff format --check amibake fleet tests benchmarks
	$(BIN)/mypy

# The main job on the local cloud: show the plan, build the kernels recipe for c7i (AVX-512),
# this machine's best family (HOST_FAMILY: asked at run time, so its smoke test runs natively,
# whichever CPU this is) and a family of the other architecture (cross-compiled, its smoke test
# run under QEMU), bake them into one AMI per architecture with a boot test, register Batch on
# them, tear Batch down, tune the kernels' run-time parameters, rank the tuned and generic
# kernels builds on two sizes of this machine's family with fleet (report and plan), list what
# is alive (amibake ls: the baked images are kept, nothing temporary is), and end with the
# bench's answer in one line.
HOST_FAMILY = $(shell $(BIN)/amibake families --host --first)
# the other architecture's best family under QEMU: on an arm64 machine c7i's AVX-512, which
# QEMU does not emulate, left its smoke test unrun
OTHER_FAMILY = $(shell $(BIN)/amibake families --host --first --architecture \
  $(if $(filter arm64,$(DEB_ARCH)),x86_64,arm64))
DEMO_FAMILIES = $(subst $(space),$(comma),$(sort c7i $(HOST_FAMILY) $(OTHER_FAMILY)))
space := $(subst ,, )
comma := ,

demo: install
	@test -n "$(HOST_FAMILY)" || { echo "make demo: no family's build runs on this machine (amibake families --host)" >&2; exit 2; }
	$(BIN)/amibake families --compiler gcc@12.2
	$(BIN)/amibake families --host
	$(BIN)/amibake build --cloud local --family c7i --recipe kernels --dry-run
	$(BIN)/amibake build --cloud local --family $(DEMO_FAMILIES) --recipe kernels --yes
	$(BIN)/amibake bake --cloud local --family $(DEMO_FAMILIES) --keep 1 --yes
	$(BIN)/amibake batch up --cloud local --from-bake
	$(BIN)/amibake batch status --cloud local
	$(BIN)/amibake batch down --cloud local
	$(BIN)/fleet tune examples/kernels.tune.toml --cloud local --trials 4 --yes
	$(BIN)/fleet report last
	$(BIN)/fleet tune compare --replay benchmarks/data/kernels_space.csv --algorithms tpe,random \
	  --seeds 10 --budget 22
	AMIBAKE_CLOUD=local $(BIN)/python -m tests.container.image demo/work:v1
	$(BIN)/fleet bench examples/container.bench.toml --cloud local --yes
	$(BIN)/fleet bench --cloud local --yes --types $(HOST_FAMILY).large,$(HOST_FAMILY).xlarge --recipe kernels \
	  --builds tuned,generic --replicates 3 --warmups 1 --args "--size 2"
	$(BIN)/fleet report last
	$(BIN)/fleet plan last --work 1e6 --deadline 1h --budget 1
	$(BIN)/fleet status
	$(BIN)/amibake ls --cloud local
	$(BIN)/amibake gc --cloud local --dry-run
	$(BIN)/amibake local down
	@echo; $(BIN)/fleet report last --no-html | tail -n 1

bench: install
	$(BIN)/python -m benchmarks

ci: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
