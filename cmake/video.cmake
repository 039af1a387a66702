# Video clips through FFmpeg's libraries (src/source/video.cc, include/stoker/video.h): optional.
# Found with pkg-config (Debian: libavformat-dev libavcodec-dev libavutil-dev libswscale-dev,
# installed by the set-up scripts). Without them, stoker builds without stoker::VideoClips
# (STOKER_VIDEO=ON makes that an error).
#
# Sets STOKER_HAVE_VIDEO and, when true, the target stoker_video.
set(STOKER_VIDEO AUTO CACHE STRING "Build stoker::VideoClips (FFmpeg's libraries): AUTO, ON or OFF")
set_property(CACHE STOKER_VIDEO PROPERTY STRINGS AUTO ON OFF)

set(STOKER_HAVE_VIDEO OFF)
if(NOT STOKER_VIDEO STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(STOKER_FFMPEG QUIET IMPORTED_TARGET
      libavformat libavcodec libavutil libswscale)
  endif()
  if(STOKER_FFMPEG_FOUND)
    set(STOKER_HAVE_VIDEO ON)
    message(STATUS "stoker: video clips through FFmpeg (libavformat ${STOKER_FFMPEG_libavformat_VERSION}, libavcodec ${STOKER_FFMPEG_libavcodec_VERSION})")
    add_library(stoker_video STATIC src/source/video.cc)
    add_library(stoker::video ALIAS stoker_video)
    target_include_directories(stoker_video
      PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
    # PUBLIC: programs that link stoker_video need FFmpeg's libraries; include/stoker/video.h
    # itself includes no FFmpeg header.
    target_link_libraries(stoker_video PUBLIC stoker_image PkgConfig::STOKER_FFMPEG
      PRIVATE stoker_flags)
    set_target_properties(stoker_video PROPERTIES POSITION_INDEPENDENT_CODE ON)
  elseif(STOKER_VIDEO STREQUAL "ON")
    message(FATAL_ERROR "STOKER_VIDEO=ON: FFmpeg's libraries not found with pkg-config "
      "(apt install libavformat-dev libavcodec-dev libavutil-dev libswscale-dev)")
  else()
    message(STATUS "stoker: no FFmpeg development libraries found: building without "
      "stoker::VideoClips")
  endif()
endif()
