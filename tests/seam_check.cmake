# The seam between the engine and its front ends, checked (ctest: seam_check):
#  - the bindings (python/src) and the command line (tools/, with the `stoker bench` harness)
#    include no header of src/: they see the installed headers only, include/stoker/ (the stable API)
#    and include/stoker/frontend/ (what front ends need beyond it, unstable);
#  - the shipped `stoker` command links no test code (LINKS: the link libraries of the stoker
#    target and of the libraries of ours it links, written at generation time).
# Run as: cmake -DROOT=<source dir> [-DLINKS=<file>] -P tests/seam_check.cmake
if(NOT ROOT)
  message(FATAL_ERROR "seam_check: pass -DROOT=<the source directory>")
endif()

set(problems "")
file(GLOB_RECURSE front_end_files RELATIVE "${ROOT}"
  "${ROOT}/python/src/*.cc" "${ROOT}/python/src/*.h"
  "${ROOT}/tools/*.cc" "${ROOT}/tools/*.h")
if(NOT front_end_files)
  message(FATAL_ERROR "seam_check: no front-end sources under ${ROOT}")
endif()
foreach(file IN LISTS front_end_files)
  file(STRINGS "${ROOT}/${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*$" "\\1" header
      "${line}")
    if(EXISTS "${ROOT}/src/${header}" AND NOT IS_DIRECTORY "${ROOT}/src/${header}")
      list(APPEND problems "${file} includes \"${header}\", an internal header (src/${header})")
    endif()
    if(header MATCHES "^support/")
      list(APPEND problems "${file} includes \"${header}\", test code (tests/${header})")
    endif()
  endforeach()
endforeach()

if(LINKS)
  file(READ "${LINKS}" links)
  if(links MATCHES "stoker_test_support|GTest")
    list(APPEND problems "the stoker command links test code: ${links}")
  endif()
endif()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "seam_check: front ends must use installed headers and no test code "
    "(declare what they need in include/stoker/frontend/):\n  ${text}")
endif()
list(LENGTH front_end_files n)
message(STATUS "seam_check: ${n} front-end files include installed headers only")
