# ckpt-ownership: build, lint and test entry points.
#
# PySpark (pipeline/: the storage audit, run by make demo and make test) needs Java 17:
#   apt-get install openjdk-17-jre-headless      (Debian/Ubuntu)
#   brew install openjdk@17                      (macOS)

PY ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The editable install maps only the packages that exist when it runs, so a new top-level
# package (e.g. spec/ or refimpl/ appearing) re-runs it.
PKG_INITS := $(wildcard spec/__init__.py refimpl/__init__.py fastimpl/__init__.py \
                        pipeline/__init__.py conformance/__init__.py ckpt/__init__.py \
                        model_tests/__init__.py bench/__init__.py)

# Hypothesis profile for tests/conftest.py (default, dev, ci, long); unset means "default".
# Passed through from the environment or the command line: make test HYPOTHESIS_PROFILE=long
export HYPOTHESIS_PROFILE

# Bytecode: every Python process a target starts (pytest's workers, the subprocesses and
# Spark's Python workers the tests start, the demo's) compiles a module once into
# .venv/pycache and reads it from there after, even where the environment says not to write
# bytecode (PYTHONDONTWRITEBYTECODE=1, as in some CI sandboxes). Without a cache, each of
# them compiled pyspark, pyarrow, moto and this tree anew: 1.6 s more per process that
# imports the stack, and 163 s instead of 118 s for the subprocess-heavy test files
# (test_tm_process, test_process_soak, test_audit_permissions, test_stream_failures).
# The tree stays free of __pycache__ folders. A prefix of your own is kept.
PYTHONPYCACHEPREFIX ?= $(abspath $(VENV))/pycache
export PYTHONPYCACHEPREFIX
export PYTHONDONTWRITEBYTECODE :=

.PHONY: all test test-tools lint docs demo verify bench bench-stream bench-stream-large bench-rescale bench-peers mutants mutate mutate-resume mutate-results wheel-check clean check-python check-java fixtures-flink fixtures-spark conformance-flink
.DEFAULT_GOAL := test

all: test

check-python:
	@command -v "$(PY)" >/dev/null 2>&1 || { \
	  echo "error: Python interpreter '$(PY)' not found; install Python 3.11+ or set PY=/path/to/python3.11" >&2; exit 1; }
	@"$(PY)" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "error: Python 3.11+ is required, but $(PY) is $$("$(PY)" --version 2>&1); set PY=/path/to/python3.11" >&2; exit 1; }

# Spark starts a JVM: say what to install instead of failing deep inside PySpark.
check-java:
	@JAVA="$${JAVA_HOME:+$$JAVA_HOME/bin/}java"; \
	command -v "$$JAVA" >/dev/null 2>&1 || { \
	  echo "error: Java 17 is required by PySpark (pipeline/) and no java was found." >&2; \
	  echo "  Debian/Ubuntu: apt-get install openjdk-17-jre-headless" >&2; \
	  echo "  macOS:         brew install openjdk@17" >&2; \
	  echo "  or set JAVA_HOME to a Java 17 installation." >&2; exit 1; }; \
	"$$JAVA" -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])[."]' || { \
	  echo "error: PySpark 4 needs Java 17 or newer; found: $$("$$JAVA" -version 2>&1 | head -1)" >&2; \
	  echo "  Debian/Ubuntu: apt-get install openjdk-17-jre-headless" >&2; exit 1; }

# --no-compile: a fresh clone's install does not byte-compile every module of every
# dependency (pyspark's alone are thousands); what runs is compiled when first imported,
# into PYTHONPYCACHEPREFIX (above), where the compiled files pip would write are not read.
$(STAMP): pyproject.toml $(PKG_INITS)
	@$(MAKE) --no-print-directory check-python
	test -x $(BIN)/python || "$(PY)" -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install --no-compile -e '.[test,spark]'
	touch $@

# Every Python folder: the product (what the wheel ships), the proof tools, the benchmarks,
# the examples and the tests.
LINTED := spec refimpl fastimpl pipeline conformance ckpt model_tests bench examples tests \
          docs/hooks.py

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy

# pytest-xdist workers: one per core and one more by default (PYTEST_WORKERS=0 runs in one
# process). The tests wait on JVMs, subprocesses and servers: with one worker a core, the
# cores of a two-core machine stood idle 7.5% of a ci run; with one more, 1.7%, and the
# run took 537 s instead of 594.
PYTEST_WORKERS ?= $(shell echo $$(( $$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) + 1 )))

# --dist worksteal: a worker that runs out of tests takes half of another's queue, so the
# run does not end on one core behind a long Spark test. Each worker starts its own
# SparkSession (tests/conftest.py: spark) when it first runs a Spark test.
# --durations: every run names its 25 slowest tests. The product's tests only: the tests of
# the project's tools (marker "tooling", tests/conftest.py) are make test-tools.
test: $(STAMP) check-java
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy
	HYPOTHESIS_PROFILE="$${HYPOTHESIS_PROFILE:-default}" $(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=25 -m "not tooling"

# The tests of the tools (the mutant zoo, the mutation run's bookkeeping, traceability, TLA+
# syntax and TLC, the wheel, the docs). CI runs them after make test.
test-tools: $(STAMP) check-java
	HYPOTHESIS_PROFILE="$${HYPOTHESIS_PROFILE:-default}" $(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=10 -m tooling

# The documentation site (mkdocs.yml, material theme) into site/: mkdocs build --strict, so
# a broken link or a page left out of the nav fails it. docs/hooks.py makes, in memory at
# every build, the pages that live outside docs/ (README, CONFORMANCE.md, spec/SPEC.md,
# tla/README.md, bench/README.md), the ckpt command reference from the commands themselves
# and the benchmark tables from bench/results.json: nothing generated is committed.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# The streaming word count on Spark (local[2,4]: a killed task is retried) in each merging
# mode, with one worker kill and one rescale, then the invariants, the storage audit and
# the comparison with a batch computation; prints the figures next to Flink 2.3's
# (pipeline/stream/demo.py; options: DEMO_ARGS, see $(BIN)/python -m pipeline.stream.demo
# --help). About three minutes. DEMO=scripted runs the scripted job of before instead: a
# simulated job on local files in each mode, written on the public API, every invariant
# checked on the real files (examples/scripted_job, python -m examples.scripted_job
# --help), then the Spark audit of every checkpoint directory it wrote
# (pipeline/demo_audit.py). DEMO_DIR keeps the files.
DEMO_DIR ?= .demo
demo: $(STAMP) check-java
	rm -rf $(DEMO_DIR)
ifeq ($(DEMO),scripted)
	$(BIN)/python -m examples.scripted_job --base $(DEMO_DIR)
	$(BIN)/python -m pipeline.demo_audit $(DEMO_DIR)
else
	$(BIN)/python -m pipeline.stream.demo --dir $(DEMO_DIR) $(DEMO_ARGS)
endif

# Every static and symbolic check (model_tests/verify.py): mypy --strict, CrossHair on the
# contracts and diffbehavior fastimpl vs refimpl ("no counterexample found within limits",
# never "proved"), every TLA+ model checked by TLC with its recorded state count (TLC is
# found at $$TLA2TOOLS_JAR, .cache/ or ../shared/tools/, see model_tests/tlc.py; without it
# the output says NOT RUN and that nothing was model-checked), the exhaustive search of the
# model at two small bounds, and every must-fail twin. 15-25 minutes on two cores, 8-12 of
# them the TLA+ soak (VERIFY_ARGS=--no-soak leaves it out). TWIN=name searches with one
# must-fail twin instead (exits non-zero: the search catches it): make verify TWIN=flink-38347
verify: $(STAMP)
	$(BIN)/python -m model_tests.verify $(if $(TWIN),--twin $(TWIN),) $(VERIFY_ARGS)

# Benchmarks: fastimpl's four figures (issue 3, about a minute) and the storage audit's
# throughput, Spark local[2] against one Python process on 1e4, 1e5 and 1e6 files (issue 6,
# about 15 minutes, most of it at 1e6). Each figure is a median of repeated runs and a ratio
# against a baseline measured in the same run. Prints a table and writes
# bench/results.json (see bench/README.md). No timed assertion: a missed goal is reported,
# not failed. BENCH_ARGS passes options, e.g. BENCH_ARGS=--quick or
# BENCH_ARGS="--only write,small,subsume,memory".
bench: $(STAMP) check-java
	$(BIN)/python -m bench $(BENCH_ARGS)

# The streaming job against Spark's own state store (issue 35): ckpt stream (ACROSS), the
# same job with checkpointing off, and groupBy(window, word).count() on Spark's RocksDB
# state store with its changelog off and on, interleaved at 1e3 to 1e6 rows per batch on
# local[2]. Prints records per second, files and bytes per batch counted on storage, and
# the ratios with their goals; writes bench/stream_results.json. About 15 minutes;
# BENCH_STREAM_ARGS=--quick for a smoke run (1e3 and 1e4 rows, one round).
bench-stream: $(STAMP) $(VENV)/.bench check-java
	$(BIN)/python -m bench.stream_scale $(BENCH_STREAM_ARGS)

# Large state (issue 35): ckpt stream (ACROSS, parallelism 4, local[2,4]) on a state that
# only grows (uniform words, 1 s windows that never close) to 1 GiB of live RocksDB
# state, then a worker killed before its snapshot and a rescale to 2. Per checkpoint, by
# listing storage: bytes written, state bytes held, µs per record; the cost per record of
# the first tenth against the last (goal: within 1.5x) and each restore's seconds. Writes
# bench/stream_large_results.json, which bench-stream's goals read. About 30 minutes;
# BENCH_STREAM_LARGE_ARGS=--quick for a smoke run (10 MiB of state, a minute).
bench-stream-large: $(STAMP) check-java
	$(BIN)/python -m bench.stream_large $(BENCH_STREAM_LARGE_ARGS)

# A rescale's restore (snapshot.restore_key_groups) against the key-by-key copy it replaced:
# 8e6 keys of the job's shape in 4 and 2 checkpointed RocksDBs, rescaled 4 -> 2 and 2 -> 4,
# interleaved A B A B over 3 rounds; prints the medians and their ratio (bench/README.md,
# figure 8, "Rescale restore"). No Spark; about two minutes. BENCH_RESCALE_ARGS passes
# options, e.g. BENCH_RESCALE_ARGS="--keys 2.4e7 --rounds 5" (the reference run, 7 minutes).
bench-rescale: $(STAMP)
	$(BIN)/python -m bench.rescale_restore $(BENCH_RESCALE_ARGS)

# The bench extra (matplotlib, for bench-stream's plot): installed only for the benchmarks.
$(VENV)/.bench: $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -e '.[bench]'
	touch $@

# The mutant zoo (model_tests/mutants.py): fastimpl with one seeded bug at a time (a Flink
# bug of the brief, or a classic mistake), run against the conformance corpus until a case
# fails, and against the lockstep tests on memory:// in a pytest subprocess. Prints which
# case and step killed each mutant and whether the lockstep tests did too; exits non-zero if
# any mutant survives the corpus. A few minutes on two cores. MUTANTS_ARGS passes options,
# e.g. MUTANTS_ARGS="--only flink-38347" or MUTANTS_ARGS="--lockstep-examples 0".
mutants: $(STAMP)
	$(BIN)/python -m model_tests.mutants $(MUTANTS_ARGS)

# The mutation run (issue 14; not part of make test or CI): mutmut, from PyPI, mutates
# fastimpl/metadata.py, fastimpl/recovery.py, fastimpl/shared_registry.py and the functions
# of the catalog, the coordinator, the TM, the engine and the working state that decide
# ownership, claims, zombie deferrals and directory deletes (MUTATE_FUNCS), one
# mutant at a time in a copy of the tree (mutants/), and runs on each the fast tests of
# those areas that call the mutated function ([tool.mutmut] in pyproject.toml). Unlike the
# mutant zoo above (hand-written seeded bugs), these are machine-made mutants. Results are
# kept in mutants/; make mutate-results lists the survivors
# (model_tests/mutation_survivors.md says what became of each). make mutate runs every
# mutant of MUTATE_FUNCS again, whatever verdict it has (mutmut re-runs each mutant it is
# named; only a run with no names resumes): to go on with a stopped run, make mutate-resume
# names only the mutants of MUTATE_FUNCS still without a verdict
# (model_tests/mutmut_pending.py, which also lists each one's verdict). The whole
# selection takes hours on two cores: a killed mutant stops at its first failing test,
# but a surviving one runs every test that reaches it (about a minute for recovery.py's,
# up to four for the coordinator's). Narrow a run to what changed, e.g.
# MUTATE_FUNCS="fastimpl.recovery.*" (recovery.py alone: about an hour).
MUTATE_CATALOG := _protected _record_delete _waits_for _defer delete_file _prunable_parents \
                  delete_dir retry_deletes _run_deferred owners _refuse_delete _foreign \
                  _unrecorded_under _delete_known_only
# The coordinator's ownership functions, by the part that holds each (fastimpl/coordinator.py
# only delegates to them).
MUTATE_LIFECYCLE := take_over_files receive_ack kept_elsewhere abort complete
MUTATE_RETENTION := register delete_unused subsume referenced collect_dirs load_completed \
                  may_claim paths_of id_clash
MUTATE_FAILOVER := attempt_stopped restart withdraw_acks
MUTATE_RESTORE := restore _claim _check_claim
# The restore's guards that read its source (R70, R77): spec/refusals.py's order, these predicates.
MUTATE_RESTORE_CHECKS := source_retained max_parallelism_same
# Working state (issue 18): what a TM's databases may delete (R102) and what the
# coordinator takes over, keeps or collects (R103, R104), gives the user (R91) or opens in
# place (R105).
MUTATE_DATABASES := track release drop drop_pins handed_over snapshot
MUTATE_SHARED_WORKING := take referred in_use needed collect give_to_user open_databases
MUTATE_FUNCS ?= fastimpl.metadata.* fastimpl.recovery.* fastimpl.shared_registry.* \
                $(foreach f,$(MUTATE_CATALOG),fastimpl.catalog.xǁCatalogǁ$(f)__mutmut_*) \
                $(foreach f,$(MUTATE_LIFECYCLE),fastimpl.checkpoint_lifecycle.xǁCheckpointLifecycleǁ$(f)__mutmut_*) \
                $(foreach f,$(MUTATE_RETENTION),fastimpl.retention.xǁRetentionǁ$(f)__mutmut_*) \
                $(foreach f,$(MUTATE_FAILOVER),fastimpl.failover.xǁFailoverǁ$(f)__mutmut_*) \
                fastimpl.job_end.xǁJobEndǁend_job__mutmut_* \
                $(foreach f,$(MUTATE_RESTORE),fastimpl.restore_planning.xǁRestorePlannerǁ$(f)__mutmut_*) \
                $(foreach f,$(MUTATE_RESTORE_CHECKS),fastimpl.restore_planning.xǁRestoreChecksǁ$(f)__mutmut_*) \
                fastimpl.working.x_is_working_path__mutmut_* fastimpl.working.x_overlaps__mutmut_* \
                $(foreach f,$(MUTATE_DATABASES),fastimpl.working.xǁDatabasesǁ$(f)__mutmut_*) \
                $(foreach f,$(MUTATE_SHARED_WORKING),fastimpl.working.xǁSharedWorkingǁ$(f)__mutmut_*) \
                fastimpl.tm_files.xǁTmFilesǁ_release_dirs__mutmut_* \
                fastimpl.engine.xǁInProcessEngineǁ_writer_checks__mutmut_* \
                fastimpl.guards.xǁCoordinatorGuardsǁacting_checks__mutmut_*
# MUTATE_TESTS=metadata (opt-in; model_tests/mutation_survivors.md, metadata.py): for a run of
# metadata.py's mutants, run on each only the decoder's and validator's own tests
# (test_metadata, test_hostile_metadata, test_bad_input, test_moved_base). With the whole
# selection, every test that reads a _metadata reaches the decoder, so each mutant ran the
# conformance corpus too: 2-5 minutes a mutant, against under a minute. The other files of
# [tool.mutmut] are left out with pytest's --deselect (PYTEST_ADDOPTS), in the test map
# mutmut builds too. Such a run's survivors must still be tried against the left-out tests
# by hand. mutmut does not see the narrowing (its config is unchanged), so a mutants/ made
# with one selection would silently keep its verdicts under the other: mutants/NARROWED_TESTS
# marks a narrowed one, and each kind of run refuses the other's mutants/ (delete it first).
# MUTATE_CHILDREN sets mutmut's --max-children.
MUTATE_TESTS ?=
MUTATE_CHILDREN ?= 2
MUTATE_LEAVE_OUT_metadata := tests/test_conformance.py tests/test_api.py tests/test_recovery.py \
                  tests/test_zombie_dirs.py tests/test_job_identity.py \
                  tests/test_directory_deletes.py tests/test_max_parallelism.py \
                  tests/test_shared_registry.py tests/test_tm_working.py
MUTATE_LEAVE_OUT = $(if $(MUTATE_TESTS),$(or $(MUTATE_LEAVE_OUT_$(MUTATE_TESTS)),$(error \
                    MUTATE_TESTS=$(MUTATE_TESTS) is not a narrowed selection; the one there is: metadata)))
# FULL_CORPUS=1: test_conformance runs the random corpus cases in process too (CI leaves them
# to the lockstep), as the recorded verdicts were reached with them.
mutate: $(STAMP)
	@test -x $(BIN)/mutmut || { echo "error: mutmut is missing; install it with" \
	  "$(BIN)/python -m pip install -e '.[test,spark,mutate]'" >&2; exit 1; }
	@marked="$$(cat mutants/NARROWED_TESTS 2>/dev/null)"; \
	if [ -e mutants/mutmut-stats.json ] && [ "$$marked" != "$(MUTATE_TESTS)" ]; then \
	  echo "error: mutants/ was made with the test selection '$${marked:-all of [tool.mutmut]}'," \
	    "this run asks for '$(or $(MUTATE_TESTS),all of [tool.mutmut])'; its verdicts and test map" \
	    "would be kept under the wrong tests: delete mutants/ first" >&2; exit 1; fi
	$(if $(MUTATE_TESTS),mkdir -p mutants && echo $(MUTATE_TESTS) > mutants/NARROWED_TESTS)
	HYPOTHESIS_PROFILE=ci FULL_CORPUS=1 $(if $(MUTATE_TESTS),PYTEST_ADDOPTS="$(foreach t,$(MUTATE_LEAVE_OUT),--deselect $(t))") \
	  $(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) $(foreach f,$(MUTATE_FUNCS),'$(f)')

mutate-resume: $(STAMP)
	@test -x $(BIN)/mutmut || { echo "error: mutmut is missing; install it with" \
	  "$(BIN)/python -m pip install -e '.[test,spark,mutate]'" >&2; exit 1; }
	@names="$$($(BIN)/python -m model_tests.mutmut_pending $(foreach f,$(MUTATE_FUNCS),'$(f)'))" || exit 1; \
	if [ -z "$$names" ]; then echo "every mutant of MUTATE_FUNCS has a verdict: nothing to resume"; exit 0; fi; \
	$(MAKE) --no-print-directory mutate MUTATE_FUNCS="$$names"

mutate-results:
	$(BIN)/mutmut results

# The wheel on its own (model_tests/wheel_check.py, issue 16): build it, install it with its
# dependencies from the index in a fresh venv, and run the installed `ckpt conformance
# --impl fastimpl` on the whole corpus from a folder outside the repository; the wheel must
# hold the corpus and schema and none of model_tests, bench or tests. The test suite runs
# the same check without downloading (tests/test_wheel.py: --deps here).
wheel-check: $(STAMP)
	$(BIN)/python -m model_tests.wheel_check

# Regenerate tests/fixtures/flink (issue 33; not part of make test or CI): real Flink 2.3.0
# checkpoints written by pyflink's local MiniCluster in seven scenarios, and each one's
# truth.json from Flink's own loader (tests/fixtures/regen_flink.py, README there). Its own
# venv, since apache-flink pins versions the main one does not share. About ten minutes,
# one JVM at a time. FIXTURES_ARGS passes options, e.g. FIXTURES_ARGS="--only clean-cancel".
FLINK_VENV := .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed
$(FLINK_STAMP):
	@$(MAKE) --no-print-directory check-python check-java
	test -x $(FLINK_VENV)/bin/python || "$(PY)" -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install 'apache-flink==2.3.0'
	touch $@

fixtures-flink: $(FLINK_STAMP)
	$(FLINK_VENV)/bin/python tests/fixtures/regen_flink.py $(FIXTURES_ARGS)

# The FLIP-306 table (issue 35; not part of make test or CI): files and bytes per checkpoint
# of one word count on Flink 2.3 (pyflink's MiniCluster in .venv-flink, file merging none,
# within and across at 32 MB and 1 MB), on ckpt stream in each merging mode and on Spark's
# RocksDB state store (changelog off and on), counted by listing storage in one run
# (bench/peers.py, bench/README.md). Prints the table and writes bench/peers_results.json.
# A few minutes at the defaults (1e4 rows per checkpoint, 8 checkpoints), one JVM at a time;
# BENCH_PEERS_ARGS passes options, e.g. BENCH_PEERS_ARGS="--rows 1e3 --systems flink".
bench-peers: $(STAMP) $(FLINK_STAMP) check-java
	$(BIN)/python -m bench.peers --flink-python $(FLINK_VENV)/bin/python $(BENCH_PEERS_ARGS)

# The conformance suite against Flink 2.3's own FileMergingSnapshotManager (issue 37; not
# part of make test or CI): the corpus cases in the task-manager profile's reach and live
# mode in both merging modes, driven call by call through pyflink's py4j gateway (one JVM),
# in .venv-flink with this project installed into it. Writes docs/flink-divergences.md and
# a reproduction script per Flink bug under docs/flink-repros/. About nine minutes on two cores.
# FLINK_CONFORMANCE_ARGS passes options, e.g. FLINK_CONFORMANCE_ARGS="--live 0 --cases 'r6*'".
FLINK_PROJECT := $(FLINK_VENV)/.project
$(FLINK_PROJECT): $(FLINK_STAMP) pyproject.toml $(PKG_INITS)
	$(FLINK_VENV)/bin/python -m pip install -e .
	touch $@

conformance-flink: $(FLINK_PROJECT)
	$(FLINK_VENV)/bin/python -m conformance.flink.report $(FLINK_CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) $(FLINK_VENV) mutants site .demo .mypy_cache .ruff_cache .pytest_cache .hypothesis .crosshair build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The Spark fixtures of issue 33 (tests/fixtures/spark/*): real checkpointLocations written by
# small queries on Spark's RocksDB state store, and truth.json from Spark's own classes
# (py4j). A few minutes, one JVM at a time; not part of make test (the tests read the
# committed files). FIXTURES=<scenario ...> regenerates some; --truth-only keeps the files.
fixtures-spark: $(STAMP) check-java
	$(BIN)/python tests/fixtures/regen_spark.py $(FIXTURES)
