# The C++ package, included from the top-level CMakeLists.txt when STOKER_INSTALL is on.
# libstoker.a and libstoker.so hold the objects of stoker_core, stoker_image and stoker_io
# (nothing is compiled twice); libjpeg, libpng, xxHash, libcurl and pugixml stay private (the public headers include only
# the standard library).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_stoker_objects $<TARGET_OBJECTS:stoker_core> $<TARGET_OBJECTS:stoker_image>
  $<TARGET_OBJECTS:stoker_io>)
add_library(stoker_shared SHARED ${_stoker_objects})
add_library(stoker_static STATIC ${_stoker_objects})
add_library(stoker::stoker ALIAS stoker_shared)
add_library(stoker::stoker_static ALIAS stoker_static)
set_target_properties(stoker_shared PROPERTIES OUTPUT_NAME stoker EXPORT_NAME stoker
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
set_target_properties(stoker_static PROPERTIES OUTPUT_NAME stoker EXPORT_NAME stoker_static)
foreach(_target stoker_shared stoker_static)
  target_include_directories(${_target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${_target} PUBLIC Threads::Threads
    PRIVATE JPEG::JPEG PNG::PNG ${XXHASH_LIBRARY} CURL::libcurl pugixml::pugixml
    ${CMAKE_DL_LIBS})
endforeach()

install(TARGETS stoker_shared stoker_static EXPORT stokerTargets
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/stoker TYPE INCLUDE)

set(_stoker_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/stoker)
install(EXPORT stokerTargets NAMESPACE stoker:: DESTINATION ${_stoker_cmake_dir})
configure_package_config_file(cmake/stokerConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/stokerConfig.cmake INSTALL_DESTINATION ${_stoker_cmake_dir})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/stokerConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/stokerConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/stokerConfigVersion.cmake DESTINATION ${_stoker_cmake_dir})

# Relocatable like the CMake files: the prefix is found from where stoker.pc lies, so an
# install with `cmake --install build --prefix DIR` is right wherever DIR is.
file(RELATIVE_PATH STOKER_PC_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" STOKER_PC_PREFIX "${STOKER_PC_PREFIX}")
set(STOKER_PC_LIBS_PRIVATE "-pthread")
foreach(_lib ${CMAKE_DL_LIBS})
  string(APPEND STOKER_PC_LIBS_PRIVATE " -l${_lib}")
endforeach()
configure_file(cmake/stoker.pc.in ${CMAKE_CURRENT_BINARY_DIR}/stoker.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/stoker.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
