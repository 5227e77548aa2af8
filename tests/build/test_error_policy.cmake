# The error policy (docs/errors.md): a failure is returned as a status up to
# the command, and a run ends in one place (hs_comm_abort). A line of src/
# or bench/ breaks it when it
#   calls hs_oom (the print-and-exit route this policy removed), or
#   ends the process itself: exit, _exit, _Exit, abort, quick_exit.
#
#   1. The tree passes: a file with such a line is on the list below with
#      its reason, and every file on the list still has one (an entry that
#      is no longer needed fails, so the list shrinks).
#   2. Planted in a copy of the tree, an hs_oom call in optim/optim.c and an
#      exit in fsdp/unit.c are each refused, naming the file and the line.
#
# Run by ctest with -DHS_SRC=<source> -DHS_BUILD=<build> -DHS_CC=<compiler>.
cmake_minimum_required(VERSION 3.20)

# file | kind | why it may
set(allowed
  "src/base/error.c|exit|hs_panic aborts on a broken invariant"
  "src/comm/comm.c|exit|hs_comm_abort: the one function that ends a run"
  "src/comm/watchdog.c|exit|the watchdog ends its rank when hs_comm_abort on another rank says so"
  "src/train/stop.c|exit|a second SIGINT / SIGTERM ends the run at once, as documented"
  "src/ckpt/save.c|exit|HS_CKPT_TEST_KILL_AFTER_BYTES: the tests' crash in the middle of a save"
  "src/cli/launch_job.c|exit|the launcher's forked child ends when mpiexec cannot be executed"
)

set(pattern_oom "(^|[^A-Za-z0-9_])hs_oom[ ]*\\(")
set(pattern_exit "(^|[^A-Za-z0-9_])(exit|_exit|_Exit|abort|quick_exit)[ ]*\\(")

set(failures 0)
function(fail what)
  message(SEND_ERROR "${what}")
  math(EXPR n "${failures} + 1")
  set(failures ${n} PARENT_SCOPE)
endfunction()

# policy_check(ROOT OUT): OUT gets one line per offending line of a file
# not on the list for that kind, "file:line: what", and one per list entry
# with no hit.
function(policy_check root out)
  set(report "")
  set(hits "")
  file(GLOB_RECURSE files ${root}/src/*.c ${root}/src/*.h ${root}/bench/*.c ${root}/bench/*.h)
  foreach(path IN LISTS files)
    file(RELATIVE_PATH rel ${root} ${path})
    file(READ ${path} text)
    string(REPLACE ";" "<semicolon>" text "${text}")
    string(REPLACE "\n" ";" lines "${text}")
    set(n 0)
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      string(REGEX REPLACE "//.*" "" code "${line}")
      string(REGEX REPLACE "^[ ]*\\*.*" "" code "${code}")
      string(REGEX REPLACE "^[ ]*/\\*.*" "" code "${code}")
      set(kind "")
      if(code MATCHES "${pattern_oom}")
        set(kind oom)
        set(what "calls hs_oom; return HS_ERR_OOM (hs_error_oom, hs_pool_oom, hs_device_oom)")
      elseif(code MATCHES "${pattern_exit}")
        set(kind exit)
        set(what "ends the process; return a status, or hs_comm_abort where none can be returned")
      endif()
      if(kind STREQUAL "")
        continue()
      endif()
      list(FIND allowed_keys "${rel}|${kind}" at)
      if(at LESS 0)
        string(APPEND report "${rel}:${n}: ${what}\n")
      else()
        list(APPEND hits "${rel}|${kind}")
      endif()
    endforeach()
  endforeach()
  foreach(key IN LISTS allowed_keys)
    list(FIND hits "${key}" at)
    if(at LESS 0)
      string(APPEND report "${key}: on the list but no longer needs to be; remove it\n")
    endif()
  endforeach()
  set(${out} "${report}" PARENT_SCOPE)
endfunction()

set(allowed_keys "")
foreach(entry IN LISTS allowed)
  string(REGEX MATCH "^[^|]*\\|[^|]*" key "${entry}")
  list(APPEND allowed_keys "${key}")
endforeach()

# 1. The tree.
policy_check(${HS_SRC} report)
if(NOT report STREQUAL "")
  fail("the error policy (docs/errors.md) is broken:\n${report}")
endif()

# 2. Planted breaks are found.
set(copy ${HS_BUILD}/error_policy_tree)
file(REMOVE_RECURSE ${copy})
file(COPY ${HS_SRC}/src ${HS_SRC}/bench DESTINATION ${copy})
file(APPEND ${copy}/src/optim/optim.c "\nstatic void planted_oom(void) { hs_oom(\"planted\"); }\n")
file(APPEND ${copy}/src/fsdp/unit.c "\nstatic void planted_exit(void) { exit(1); }\n")
policy_check(${copy} report)
foreach(want "src/optim/optim.c:[0-9]+: calls hs_oom" "src/fsdp/unit.c:[0-9]+: ends the process")
  if(NOT report MATCHES "${want}")
    fail("a planted break was not found: expected '${want}' in:\n${report}")
  endif()
endforeach()
file(REMOVE_RECURSE ${copy})

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} error policy check(s) failed")
endif()
message(STATUS "error policy: no hs_oom or process exit outside the listed files")
