# Parquet through Apache Arrow's C++ library (src/source/parquet.cc, include/stoker/parquet.h):
# optional. Found as an installed Arrow (find_package(Parquet), e.g. Apache's libparquet-dev
# packages), else as the C++ library and headers a `pyarrow` wheel carries, from the Python
# named by STOKER_ARROW_PYTHON (pyarrow.get_include(), get_library_dirs(); the unversioned
# library names made by pyarrow.create_library_symlinks()). Without either, stoker builds
# without stoker::ParquetDataset (STOKER_PARQUET=ON makes that an error).
#
# Sets STOKER_HAVE_PARQUET and, when true, the target stoker_parquet.
# Off in the Python wheel (scikit-build-core sets SKBUILD): its `stoker` command would
# otherwise depend on whichever Arrow the build machine has (docs/formats.md).
if(SKBUILD)
  set(_stoker_parquet_default OFF)
else()
  set(_stoker_parquet_default AUTO)
endif()
set(STOKER_PARQUET "${_stoker_parquet_default}" CACHE STRING
  "Build stoker::ParquetDataset (Arrow C++): AUTO, ON or OFF")
set_property(CACHE STOKER_PARQUET PROPERTY STRINGS AUTO ON OFF)
set(STOKER_ARROW_PYTHON "" CACHE FILEPATH
  "A Python whose pyarrow wheel provides Arrow C++ (when no installed Arrow is found)")

set(STOKER_HAVE_PARQUET OFF)
if(NOT STOKER_PARQUET STREQUAL "OFF")
  set(_stoker_parquet_lib "")
  find_package(Parquet CONFIG QUIET)
  if(Parquet_FOUND AND TARGET Parquet::parquet_shared)
    set(_stoker_parquet_lib Parquet::parquet_shared)
    message(STATUS "stoker: Parquet from Arrow C++ ${ARROW_VERSION} (installed)")
  elseif(STOKER_ARROW_PYTHON)
    execute_process(
      COMMAND "${STOKER_ARROW_PYTHON}" -c
        "import pyarrow as pa; pa.create_library_symlinks(); print(pa.__version__); print(pa.get_include()); print(';'.join(pa.get_library_dirs()))"
      OUTPUT_VARIABLE _stoker_pyarrow OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_VARIABLE _stoker_pyarrow_error RESULT_VARIABLE _stoker_pyarrow_rc)
    if(_stoker_pyarrow_rc EQUAL 0)
      string(REPLACE "\n" ";" _stoker_pyarrow "${_stoker_pyarrow}")
      list(GET _stoker_pyarrow 0 _stoker_pyarrow_version)
      list(GET _stoker_pyarrow 1 _stoker_arrow_include)
      list(SUBLIST _stoker_pyarrow 2 -1 _stoker_arrow_libdirs)
      find_library(STOKER_ARROW_LIBRARY arrow PATHS ${_stoker_arrow_libdirs} NO_DEFAULT_PATH)
      find_library(STOKER_PARQUET_LIBRARY parquet PATHS ${_stoker_arrow_libdirs} NO_DEFAULT_PATH)
      if(STOKER_ARROW_LIBRARY AND STOKER_PARQUET_LIBRARY)
        add_library(stoker_arrow_pyarrow INTERFACE)
        # SYSTEM: Arrow's headers are not held to our warnings.
        target_include_directories(stoker_arrow_pyarrow SYSTEM INTERFACE "${_stoker_arrow_include}")
        target_link_libraries(stoker_arrow_pyarrow INTERFACE "${STOKER_PARQUET_LIBRARY}"
          "${STOKER_ARROW_LIBRARY}")
        # The programs find the wheel's libraries where they are (its directory as RUNPATH).
        string(REPLACE ";" ":" _stoker_arrow_rpath "${_stoker_arrow_libdirs}")
        target_link_options(stoker_arrow_pyarrow INTERFACE "-Wl,-rpath,${_stoker_arrow_rpath}")
        set(_stoker_parquet_lib stoker_arrow_pyarrow)
        message(STATUS "stoker: Parquet from the Arrow C++ of pyarrow ${_stoker_pyarrow_version} (${_stoker_arrow_libdirs})")
      endif()
    else()
      message(STATUS "stoker: no pyarrow in ${STOKER_ARROW_PYTHON}: ${_stoker_pyarrow_error}")
    endif()
  endif()
  if(_stoker_parquet_lib)
    set(STOKER_HAVE_PARQUET ON)
    add_library(stoker_parquet STATIC src/source/parquet.cc)
    add_library(stoker::parquet ALIAS stoker_parquet)
    target_include_directories(stoker_parquet
      PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
    # PUBLIC: the programs that link stoker_parquet need Arrow's libraries (and their run
    # path); include/stoker/parquet.h itself includes no Arrow header.
    target_link_libraries(stoker_parquet PUBLIC stoker_image ${_stoker_parquet_lib}
      PRIVATE stoker_flags)
    set_target_properties(stoker_parquet PROPERTIES POSITION_INDEPENDENT_CODE ON)
  elseif(STOKER_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "STOKER_PARQUET=ON: no Arrow C++ found (install Arrow's libparquet-dev, "
      "or set STOKER_ARROW_PYTHON to a Python with pyarrow)")
  else()
    message(STATUS "stoker: no Arrow C++ found: building without stoker::ParquetDataset "
      "(set STOKER_ARROW_PYTHON to a Python with pyarrow)")
  endif()
endif()
