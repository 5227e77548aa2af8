# Test registration. Nothing here names individual tests: a file's place and
# its annotations decide how it runs, so adding a test never edits this file.
#
#   tests/unit/test_*.c   cmocka executable, one process            label unit
#   tests/mpi/test_*.c    run under mpiexec once per rank count in  label mpi
#                         a line "HS_MPI_RANKS: 1 2 4" in the file
#   tests/cli/test_*.sh   bash script; sees HS_BIN, HS_SRC, HS_BUILD, label cli
#                         MPIEXEC; "HS_MPI_RANKS: n" sets its process count
#   tests/build/test_*.cmake  cmake -P script on the build          label unit
#                         itself; sees HS_SRC, HS_BUILD, HS_CC
#
# Test executables link every layer (hscore) and see src/ whole: a test may
# include the private headers of the layer it tests.
#
# "HS_TEST_TIMEOUT: s" in any test file overrides the default timeout.
# "HS_TEST_DEVICES: cpu cuda" in a unit test runs it once per listed
# backend this build compiles (cuda with HS_CUDA), the backend's name its
# argument: the first keeps the test's name, the others add ".<backend>";
# exit 77 is a skip (a backend compiled in whose hardware is absent). A
# test none of whose backends the build compiles is not registered
# ("HS_TEST_DEVICES: cuda" in a build without it).
# "HS_TEST_TIERS: avx2" in a unit or cli test runs it once more per listed
# CPU tier, as ".<tier>" with HS_CPU_ISA (and oneDNN's ONEDNN_MAX_CPU_ISA)
# capping the code paths at that tier, label "tier" besides its own: the
# parity-critical tests hold on the lowest tier the build targets on any
# machine (a cli test skips, exit 77, where the CPU has nothing above it).
# A word gemm16_<engine> there runs it with HS_CPU_GEMM16=<engine> instead
# (native, widened: the 16-bit GEMM engine the CPU would not pick itself).
# "HS_TEST_SERIAL" in a test file runs it with nothing else beside it
# (ctest -j): for tests that time the machine, whose ratios other tests'
# load would decide.
# The MPI settings travel in the environment, never as launcher flags, so the
# commands stay portable to other MPI implementations. pml ob1 is the one
# Open MPI picks here anyway (over the self and vader BTLs); naming it spares
# every rank of every test the probing of libfabric, PSM and UCX. With
# odls_base_sigkill_timeout 0, mpiexec ends the ranks left when one exits
# non-zero at once rather than 2 s later (the refusal tests' exit 2); every
# rank that fails says so itself before it exits.

pkg_check_modules(CMOCKA IMPORTED_TARGET cmocka)

set(HS_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_pml=ob1
  OMPI_MCA_btl=self,vader
  OMPI_MCA_hwloc_base_binding_policy=none
  OMPI_MCA_odls_base_sigkill_timeout=0
  OMP_NUM_THREADS=1
  HS_BIN=$<TARGET_FILE:hypershard>
  HS_SRC=${CMAKE_SOURCE_DIR}
  HS_BUILD=${CMAKE_BINARY_DIR}
  MPIEXEC=${MPIEXEC_EXECUTABLE})
# Each test's Open MPI session directories under a tree of its own: jobs
# of tests that ctest runs side by side otherwise share
# /tmp/ompi.HOST.UID, which the first to finish removes while another is
# creating its job directory in it ("A call to mkdir was unable to create
# the desired directory", an MPI_Init failure).
set(HS_MPI_SESSIONS ${CMAKE_BINARY_DIR}/mpi-sessions)

# The words (matching `pattern`) after "KEY:" on `file`'s first KEY line.
function(hs_test_annotation_words file key pattern out)
  file(STRINGS ${file} lines REGEX "${key}:")
  set(words "")
  if(lines)
    list(GET lines 0 first)
    string(REGEX REPLACE ".*${key}:" "" rest "${first}")
    string(REGEX MATCHALL "${pattern}" words "${rest}")
  endif()
  set(${out} "${words}" PARENT_SCOPE)
endfunction()

function(hs_test_annotations file out_ranks out_timeout)
  hs_test_annotation_words(${file} HS_MPI_RANKS "[0-9]+" ranks)
  hs_test_annotation_words(${file} HS_TEST_TIMEOUT "[0-9]+" timeout)
  if(NOT timeout)
    set(timeout 120)
  endif()
  list(GET timeout 0 timeout)
  set(${out_ranks} "${ranks}" PARENT_SCOPE)
  set(${out_timeout} "${timeout}" PARENT_SCOPE)
endfunction()

# The backends of `file`'s HS_TEST_DEVICES line that this build compiles.
function(hs_test_devices file out)
  hs_test_annotation_words(${file} HS_TEST_DEVICES "[a-z]+" listed)
  set(devices "")
  foreach(dev ${listed})
    if(HS_CUDA OR NOT dev STREQUAL "cuda")
      list(APPEND devices ${dev})
    endif()
  endforeach()
  set(${out} "${devices}" PARENT_SCOPE)
endfunction()

# hs_test_add_tiers(FILE TEST LABEL COMMAND...): TEST once more per tier of
# FILE, with the properties `test` has and the tier's environment.
function(hs_test_add_tiers file test label timeout np)
  hs_test_annotation_words(${file} HS_TEST_TIERS "[a-z0-9_]+" tiers)
  foreach(tier ${tiers})
    string(TOUPPER ${tier} onednn)
    if(tier STREQUAL "avx512")
      set(onednn AVX512_CORE)
    elseif(tier STREQUAL "avx512_bf16")
      set(onednn AVX512_CORE_BF16)
    elseif(tier STREQUAL "amx")
      set(onednn AVX512_CORE_AMX)
    endif()
    set(env "HS_CPU_ISA=${tier};ONEDNN_MAX_CPU_ISA=${onednn}")
    if(tier MATCHES "^gemm16_(.+)$") # the 16-bit GEMM engine, not a tier: HS_CPU_GEMM16
      set(env "HS_CPU_GEMM16=${CMAKE_MATCH_1}")
    endif()
    add_test(NAME ${test}.${tier} COMMAND ${ARGN})
    set_tests_properties(${test}.${tier} PROPERTIES LABELS "${label};tier" TIMEOUT ${timeout}
                         SKIP_RETURN_CODE 77 PROCESSORS ${np}
                         ENVIRONMENT "${HS_TEST_ENV};${env};OMPI_MCA_orte_tmpdir_base=${HS_MPI_SESSIONS}/${test}.${tier}")
    hs_test_serial(${file} ${test}.${tier})
  endforeach()
endfunction()

# RUN_SERIAL for the tests of `file` when it says HS_TEST_SERIAL.
function(hs_test_serial file)
  file(STRINGS ${file} sl REGEX "HS_TEST_SERIAL")
  if(sl)
    set_tests_properties(${ARGN} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

if(CMOCKA_FOUND)
  file(GLOB HS_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/test_*.c)
  foreach(src ${HS_UNIT_TESTS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE hscore PkgConfig::CMOCKA)
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src)
    hs_test_annotations(${src} ranks timeout)
    hs_test_devices(${src} devices)
    # a test listing backends runs once per listed backend this build
    # compiles, and not at all when it compiles none of them
    hs_test_annotation_words(${src} HS_TEST_DEVICES "[a-z]+" listed)
    if(NOT listed)
      add_test(NAME unit.${name} COMMAND ${name})
      set_tests_properties(unit.${name} PROPERTIES LABELS unit TIMEOUT ${timeout}
                           ENVIRONMENT "${HS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${HS_MPI_SESSIONS}/unit.${name}")
      hs_test_add_tiers(${src} unit.${name} unit ${timeout} 1 ${name})
    endif()
    foreach(dev ${devices})
      set(test unit.${name}.${dev})
      list(GET devices 0 first)
      if(dev STREQUAL first)
        set(test unit.${name})
      endif()
      add_test(NAME ${test} COMMAND ${name} ${dev})
      set_tests_properties(${test} PROPERTIES LABELS unit TIMEOUT ${timeout} SKIP_RETURN_CODE 77
                           ENVIRONMENT "${HS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${HS_MPI_SESSIONS}/${test}")
    endforeach()
  endforeach()
endif()

file(GLOB HS_MPI_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi/test_*.c)
foreach(src ${HS_MPI_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE hscore)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  hs_test_annotations(${src} ranks timeout)
  if(NOT ranks)
    set(ranks 2)
  endif()
  foreach(n ${ranks})
    add_test(NAME mpi.${name}.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} $<TARGET_FILE:${name}>)
    set_tests_properties(mpi.${name}.np${n} PROPERTIES LABELS mpi TIMEOUT ${timeout}
                         PROCESSORS ${n}
                         ENVIRONMENT "${HS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${HS_MPI_SESSIONS}/mpi.${name}.np${n}")
    hs_test_serial(${src} mpi.${name}.np${n})
  endforeach()
endforeach()

# tests/gpu/test_*.sh are the same kind of script, labelled gpu: they need an
# NVIDIA GPU and the cuda backend, and skip (exit 77) without them.
foreach(kind cli gpu)
  file(GLOB scripts CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${kind}/test_*.sh)
  foreach(src ${scripts})
    get_filename_component(name ${src} NAME_WE)
    hs_test_annotations(${src} ranks timeout)
    set(np 1)
    if(ranks)
      list(GET ranks 0 np)
    endif()
    add_test(NAME ${kind}.${name} COMMAND bash ${src})
    set_tests_properties(${kind}.${name} PROPERTIES LABELS ${kind} TIMEOUT ${timeout}
                         SKIP_RETURN_CODE 77 PROCESSORS ${np}
                         ENVIRONMENT "${HS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${HS_MPI_SESSIONS}/${kind}.${name}")
    hs_test_serial(${src} ${kind}.${name})
    hs_test_add_tiers(${src} ${kind}.${name} ${kind} ${timeout} ${np} bash ${src})
  endforeach()
endforeach()

file(GLOB HS_BUILD_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/build/test_*.cmake)
foreach(src ${HS_BUILD_TESTS})
  get_filename_component(name ${src} NAME_WE)
  hs_test_annotations(${src} ranks timeout)
  add_test(NAME build.${name}
           COMMAND ${CMAKE_COMMAND} -DHS_SRC=${CMAKE_SOURCE_DIR} -DHS_BUILD=${CMAKE_BINARY_DIR}
                   -DHS_CC=${CMAKE_C_COMPILER} -P ${src})
  set_tests_properties(build.${name} PROPERTIES LABELS unit TIMEOUT ${timeout})
endforeach()

if(HS_FUZZ)
  # The libraries are instrumented too, so the fuzzer sees coverage inside them.
  foreach(lib IN LISTS HS_LAYER_LIBS)
    target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link,address,undefined)
  endforeach()
  file(GLOB HS_FUZZERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c)
  foreach(src ${HS_FUZZERS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${name} PRIVATE hscore)
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  endforeach()
endif()
