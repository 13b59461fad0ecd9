# Writes, one per line, the clang-14 commands that run the thread-safety
# analysis over the store's sources: each compile command of
# compile_commands.json under cachestore/src, as a syntax-only clang run
# whose thread-safety warnings are errors. deploy/check-thread-safety.sh
# runs them.
#
#   cmake -DBUILD_DIR=build -DOUT=<file> -P cmake/ThreadSafetyCommands.cmake
cmake_minimum_required(VERSION 3.25)
file(READ "${BUILD_DIR}/compile_commands.json" db)
string(JSON count LENGTH "${db}")
math(EXPR last "${count} - 1")
set(lines "")
foreach(i RANGE ${last})
  string(JSON file GET "${db}" ${i} file)
  if(NOT file MATCHES "/cachestore/src/.*\\.cc$")
    continue()
  endif()
  if(ONLY AND NOT file MATCHES "${ONLY}")  # -DONLY=<regex>: a subset, while fixing
    continue()
  endif()
  string(JSON command GET "${db}" ${i} command)
  string(JSON dir GET "${db}" ${i} directory)
  # The compiler (behind ccache) becomes clang; no object, no deps file.
  string(REGEX REPLACE "^[^ ]*ccache +" "" command "${command}")
  string(REGEX REPLACE "^[^ ]+" "clang++-14" command "${command}")
  string(REGEX REPLACE " -o [^ ]+" "" command "${command}")
  string(REGEX REPLACE " -MD| -MT [^ ]+| -MF [^ ]+" "" command "${command}")
  string(REGEX REPLACE " -Werror( |$)" " " command "${command}")
  string(APPEND lines "cd ${dir} && ${command} -fsyntax-only -Wno-unknown-warning-option -Wthread-safety -Werror=thread-safety\n")
endforeach()
file(WRITE "${OUT}" "${lines}")
