# The compute seam (docs/device.md): above device/ and tensor/, the layers
# that compute on tensors (src/model, src/optim, src/fsdp, src/parallel)
# reach tensor memory and kernels through a device's tables, not by
# themselves. A line of theirs breaks the seam when it calls
#   memcpy / memset / memmove,
#   a tensor/ kernel (hs_gemm_ex, hs_sgemm, hs_convert, hs_axpy_f32, ...), or
#   an element helper of device.h (hs_ld, hs_st, hs_expf, hs_row_max,
#   hs_round_f32, ...), the mark of an element loop.
# A memset of one object (memset(p, 0, sizeof *p) or sizeof(type)) zeroes a
# descriptor, never tensor data, and is not counted.
#
#   1. The tree passes: a file with such a line is on the list below, with
#      the reason it cannot move yet, and every file on the list still has
#      one (an entry that is no longer needed fails, so the list shrinks).
#   2. Planted in a copy of the tree, a memcpy and a memset over an array
#      in model/linear.c, a tensor/ call in optim/adamw.c and an element
#      loop in parallel/style.c are each refused, naming the file and the
#      line.
#
# Run by ctest with -DHS_SRC=<source> -DHS_BUILD=<build> -DHS_CC=<compiler>.
cmake_minimum_required(VERSION 3.20)

# file | why it still reaches memory or kernels itself (empty today: a file
# goes here only with the reason it cannot move yet)
set(allowed
)

set(pattern_mem "(^|[^A-Za-z0-9_])(memcpy|memset|memmove)[ ]*\\(")
set(pattern_one_object "(^|[^A-Za-z0-9_])memset[ ]*\\([^,]+,[ ]*0[ ]*,[ ]*sizeof[ ]*(\\*[ ]*[A-Za-z_][A-Za-z0-9_]*|\\([A-Za-z_][A-Za-z0-9_ ]*\\))[ ]*\\)")
set(pattern_tensor "(^|[^A-Za-z0-9_])hs_(gemm_ex|gemm_cached|sgemm|convert|convert_scaled_f32|fill_f32|axpy_f32|scale_f32|add_f32|add_to_zero_f32|sumsq_f32)[ ]*\\(")
set(pattern_elem "(^|[^A-Za-z0-9_])hs_(ld|st|acc|expf|row_max|row_sum|row_dot|row_dot_ld|round_f32|round_to)[ ]*\\(")

set(failures 0)
function(fail what)
  message(SEND_ERROR "${what}")
  math(EXPR n "${failures} + 1")
  set(failures ${n} PARENT_SCOPE)
endfunction()

# seam_check(ROOT OUT): OUT gets one line per offending line of a file not
# on the list, "file:line: what", and one per list entry with no hit.
function(seam_check root out)
  set(report "")
  set(listed "")
  foreach(entry IN LISTS allowed)
    string(REGEX REPLACE "\\|.*" "" f "${entry}")
    list(APPEND listed "${f}")
  endforeach()
  set(hit_files "")
  file(GLOB files ${root}/src/model/*.c ${root}/src/optim/*.c ${root}/src/fsdp/*.c
                  ${root}/src/parallel/*.c)
  foreach(path IN LISTS files)
    file(RELATIVE_PATH rel ${root} ${path})
    file(READ ${path} text)
    string(REPLACE ";" "<semicolon>" text "${text}")
    string(REPLACE "\n" ";" lines "${text}")
    set(n 0)
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      set(what "")
      if(line MATCHES "${pattern_one_object}")
        # one object: a descriptor, not tensor data
      elseif(line MATCHES "${pattern_mem}")
        set(what "${CMAKE_MATCH_2} over memory")
      elseif(line MATCHES "${pattern_tensor}")
        set(what "calls tensor/ directly (hs_${CMAKE_MATCH_2})")
      elseif(line MATCHES "${pattern_elem}")
        set(what "an element loop (hs_${CMAKE_MATCH_2})")
      endif()
      if(what)
        list(APPEND hit_files "${rel}")
        list(FIND listed "${rel}" at)
        if(at LESS 0)
          string(APPEND report "${rel}:${n}: ${what} above the device seam\n")
        endif()
      endif()
    endforeach()
  endforeach()
  foreach(f IN LISTS listed)
    list(FIND hit_files "${f}" at)
    if(at LESS 0)
      string(APPEND report "${f}: on the allowed list but reaches no memory or kernel itself: drop it\n")
    endif()
  endforeach()
  set(${out} "${report}" PARENT_SCOPE)
endfunction()

# 1. the tree as it is
seam_check(${HS_SRC} report)
if(report)
  fail("the device seam is broken:\n${report}")
endif()

# 2. planted breaks, one at a time, each on a fresh copy
set(fixture ${HS_BUILD}/device-seam-fixture)
function(expect_refused name file line regex)
  file(REMOVE_RECURSE ${fixture})
  file(MAKE_DIRECTORY ${fixture}/src)
  file(COPY ${HS_SRC}/src/model ${HS_SRC}/src/optim ${HS_SRC}/src/fsdp ${HS_SRC}/src/parallel
       DESTINATION ${fixture}/src)
  file(APPEND ${fixture}/${file} "${line}\n")
  seam_check(${fixture} report)
  if(NOT report)
    fail("${name}: accepted")
  elseif(NOT report MATCHES "${regex}")
    fail("${name}: refused, but the report does not match '${regex}':\n${report}")
  else()
    message(STATUS "refused as expected: ${name}")
  endif()
  set(failures ${failures} PARENT_SCOPE)
endfunction()
expect_refused("a memcpy in the model" src/model/linear.c
               "static void cp(void *d, const void *s) { memcpy(d, s, 4); }"
               "src/model/linear.c:[0-9]+: memcpy over memory")
expect_refused("a memset over an array of objects in the model" src/model/linear.c
               "static void z(float *p, int n) { memset(p, 0, n * sizeof *p); }"
               "src/model/linear.c:[0-9]+: memset over memory")
expect_refused("a tensor/ call in the optimizer" src/optim/adamw.c
               "static void sc(float *x) { hs_scale_f32(x, 2.0f, 1); }"
               "src/optim/adamw.c:[0-9]+: calls tensor/ directly \\(hs_scale_f32\\)")
expect_refused("an element loop in parallel/" src/parallel/style.c
               "static float ld0(const void *p) { return hs_ld(p, HS_DTYPE_F32, 0); }"
               "src/parallel/style.c:[0-9]+: an element loop \\(hs_ld\\)")
file(REMOVE_RECURSE ${fixture})

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} device-seam check(s) failed")
endif()
