# The build keeps the layer order of DESIGN.md §1 (cmake/layers.cmake).
#
#   1. The repository's own sources pass the include check.
#   2. A copy of them with one violation planted at a time fails it, naming
#      the file, the line and both layers: upward public includes (from a
#      source and from a public header), another folder's private header
#      (higher and lower layer, "..", a public header including a private
#      one, from a benchmark source or header), a folder outside the order,
#      and <mpi.h> outside comm/ (layer_order_cases.txt).
#   3. A layer's include roots resolve its own private headers and not
#      another folder's: "fsdp/param.h" does not compile in the model layer.
#
# Run by ctest with -DHS_SRC=<source> -DHS_BUILD=<build> -DHS_CC=<compiler>.
cmake_minimum_required(VERSION 3.20)
set(check ${HS_SRC}/cmake/check_layers.cmake)
set(failures 0)

function(fail what)
  message(SEND_ERROR "${what}")
  math(EXPR n "${failures} + 1")
  set(failures ${n} PARENT_SCOPE)
endfunction()

# 1. the tree as it is
execute_process(COMMAND ${CMAKE_COMMAND} -DHS_ROOT=${HS_SRC} -P ${check}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  fail("the source tree breaks the layer order:\n${err}")
endif()

# 2. planted violations, one at a time, each on a fresh copy
set(fixture ${HS_BUILD}/layer-order-fixture)

function(expect_rejected name edit_file edit_text regex)
  file(REMOVE_RECURSE ${fixture})
  file(MAKE_DIRECTORY ${fixture})
  file(COPY ${HS_SRC}/src ${HS_SRC}/include ${HS_SRC}/bench ${HS_SRC}/cmake DESTINATION ${fixture})
  file(APPEND ${fixture}/${edit_file} "${edit_text}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -DHS_ROOT=${fixture} -P ${fixture}/cmake/check_layers.cmake
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 0)
    fail("${name}: accepted")
  elseif(NOT err MATCHES "${regex}")
    fail("${name}: rejected, but the message does not match '${regex}':\n${err}")
  else()
    message(STATUS "rejected as expected: ${name}")
  endif()
  set(failures ${failures} PARENT_SCOPE)
endfunction()

file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/layer_order_cases.txt cases REGEX "^[^#]")
if(NOT cases)
  fail("layer_order_cases.txt holds no case")
endif()
foreach(c IN LISTS cases)
  string(REPLACE " | " ";" row "${c}")
  list(GET row 0 name)
  list(GET row 1 edit_file)
  list(GET row 2 edit_text)
  list(GET row 3 regex)
  expect_rejected("${name}" ${edit_file} "${edit_text}" "${regex}")
endforeach()
file(REMOVE_RECURSE ${fixture})

# 3. the include roots of one library
set(probe ${HS_BUILD}/layer-order-probe.c)
function(compile_in layer header out_rc out_err)
  file(WRITE ${probe} "#include \"${header}\"\nint hs_probe;\n")
  execute_process(COMMAND ${HS_CC} -std=c11 -D_GNU_SOURCE -fsyntax-only -I${HS_SRC}/include
                          -I${HS_BUILD}/layer-include/${layer} ${probe}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_err} "${err}" PARENT_SCOPE)
endfunction()
compile_in(model model/layers.h rc err)
if(NOT rc EQUAL 0)
  fail("the model layer cannot include its own model/layers.h:\n${err}")
endif()
compile_in(model fsdp/param.h rc err)
if(rc EQUAL 0)
  fail("the model layer can include fsdp/param.h")
elseif(NOT err MATCHES "fsdp/param.h")
  fail("fsdp/param.h failed in the model layer for another reason:\n${err}")
endif()
file(REMOVE ${probe})

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} layer-order check(s) failed")
endif()
