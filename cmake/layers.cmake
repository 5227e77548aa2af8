# The layer order of DESIGN.md §1, as the build sees it.
#
# Each folder src/<layer>/ is one static library hs_<layer> that links only
# the library of the layer before it, so it can call only the layers above it
# in this list. Its public header is include/hypershard/<layer>.h; its other
# headers are private to the folder.
#
# hs_check_layers() reads the #include lines of every layer's sources and
# public header and rejects, naming file, line and both layers:
#   - "hypershard/X.h" where X comes later in HS_LAYERS than the file's layer
#     (an upward include), or X is not a layer;
#   - "<folder>/..." where <folder> is another layer (a private header of
#     another folder), and any private include in a public header;
#   - any include path with "..";
#   - <mpi.h> outside comm/ (HS_MPI_INCLUDERS): the other layers reach MPI
#     through include/hypershard/comm.h;
#   - a folder under src/ that is not in HS_LAYERS.
# bench/*.c and bench/*.h belong to the cli layer (they are linked into the
# hypershard executable). tests/ is not checked: a test may reach into the
# private headers of the layer it tests.
#
# This file is read both by CMakeLists.txt (configure time, and the build's
# hs_layer_check target) and by cmake/check_layers.cmake (ctest, by hand:
# cmake -DHS_ROOT=. -P cmake/check_layers.cmake).

set(HS_LAYERS base tensor device comm mesh config model optim parallel fsdp ckpt data train cli)

# The files that may include <mpi.h> (regexes on the path): comm/, and the
# benchmarks, whose baselines are MPI's own collectives (bench comm) and
# whose idle ranks wait in MPI_Ibarrier (bench fsdp). The commands in
# src/cli/ start and end MPI through comm.h (hs_comm_boot).
set(HS_MPI_INCLUDERS "^src/comm/" "^bench/[^/]*\\.c$")

# The files of one layer, relative to `root`.
function(hs_layer_files root layer out)
  file(GLOB files RELATIVE ${root} ${root}/src/${layer}/*.c ${root}/src/${layer}/*.h)
  if(EXISTS ${root}/include/hypershard/${layer}.h)
    list(APPEND files include/hypershard/${layer}.h)
  endif()
  if(layer STREQUAL "cli")
    file(GLOB bench RELATIVE ${root} ${root}/bench/*.c ${root}/bench/*.h)
    list(APPEND files ${bench})
  endif()
  list(SORT files)
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

# Sets `out` to the list of violations in the tree at `root` (empty: none).
function(hs_check_layers root out)
  set(problems "")

  file(GLOB entries RELATIVE ${root}/src ${root}/src/*)
  foreach(d IN LISTS entries)
    if(IS_DIRECTORY ${root}/src/${d} AND NOT d IN_LIST HS_LAYERS)
      list(APPEND problems "src/${d}/: not a layer, add it to HS_LAYERS in cmake/layers.cmake (and DESIGN.md §1)")
    endif()
  endforeach()

  foreach(layer IN LISTS HS_LAYERS)
    list(FIND HS_LAYERS ${layer} li)
    hs_layer_files(${root} ${layer} files)
    foreach(f IN LISTS files)
      set(public OFF)
      if(f MATCHES "^include/")
        set(public ON)
      endif()
      file(READ ${root}/${f} text)
      # One list element per line; characters that would upset a CMake list
      # cannot be part of an include we look at.
      string(REPLACE "\\" "/" text "${text}")
      string(REPLACE ";" " " text "${text}")
      string(REPLACE "[" "(" text "${text}")
      string(REPLACE "]" ")" text "${text}")
      string(REPLACE "\n" ";" lines "${text}")
      set(n 0)
      foreach(line IN LISTS lines)
        math(EXPR n "${n} + 1")
        if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
          continue()
        endif()
        set(form "${CMAKE_MATCH_1}")
        set(inc "${CMAKE_MATCH_2}")
        set(at "${f}:${n}")
        if(inc STREQUAL "mpi.h")
          set(allowed OFF)
          foreach(re IN LISTS HS_MPI_INCLUDERS)
            if(f MATCHES "${re}")
              set(allowed ON)
            endif()
          endforeach()
          if(NOT allowed)
            list(APPEND problems "${at}: layer ${layer} includes <mpi.h>: only comm/ talks to MPI, use include/hypershard/comm.h")
          endif()
          continue()
        endif()
        if(inc MATCHES "(^|/)\\.\\.(/|$)")
          list(APPEND problems "${at}: \"${inc}\" climbs out of its folder, include \"hypershard/X.h\" or \"${layer}/...\"")
          continue()
        endif()
        # In a public header "comm.h" is its sibling include/hypershard/comm.h.
        if(public AND form STREQUAL "\"" AND NOT inc MATCHES "/" AND EXISTS ${root}/include/hypershard/${inc})
          set(inc "hypershard/${inc}")
        endif()
        if(inc MATCHES "^hypershard/([^/]+)\\.h$")
          set(other "${CMAKE_MATCH_1}")
          list(FIND HS_LAYERS "${other}" oi)
          if(oi LESS 0)
            list(APPEND problems "${at}: \"${inc}\" is no layer's public header")
          elseif(oi GREATER li)
            list(APPEND problems "${at}: layer ${layer} includes \"${inc}\" of layer ${other}, which comes after ${layer} in the layer order (a layer may use only the layers above it)")
          endif()
        elseif(inc MATCHES "^([^/]+)/")
          set(other "${CMAKE_MATCH_1}")
          if(NOT other IN_LIST HS_LAYERS)
            continue()
          endif()
          if(public)
            list(APPEND problems "${at}: public header includes private header \"${inc}\" of layer ${other}")
          elseif(NOT other STREQUAL layer)
            list(FIND HS_LAYERS "${other}" oi)
            if(oi GREATER li)
              set(why "a private header of layer ${other}, which comes after ${layer} in the layer order")
            else()
              set(why "a private header of layer ${other} (use include/hypershard/${other}.h)")
            endif()
            list(APPEND problems "${at}: layer ${layer} includes \"${inc}\", ${why}")
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()

  set(${out} "${problems}" PARENT_SCOPE)
endfunction()

# Fails (FATAL_ERROR) with one line per violation.
function(hs_require_layers root)
  hs_check_layers(${root} problems)
  if(problems)
    list(LENGTH problems count)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "layer order violated (${count}):\n  ${text}\n"
                        "See DESIGN.md §1 and cmake/layers.cmake.")
  endif()
endfunction()
